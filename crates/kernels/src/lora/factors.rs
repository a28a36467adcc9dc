//! The element types LoRA factors are held in ([`FactorView`]) and the shrink's dot tile on
//! halves, bitwise [`crate::dot_tile`] on their f32 values.

use std::ops::Range;

use half::{bf16, f16};

use super::Ahead;
use crate::Isa;

/// A factor's values as held: f32, or halves the kernels convert to f32 as they load them.
#[derive(Debug, Clone, Copy)]
pub enum FactorView<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

impl FactorView<'_> {
    pub fn len(&self) -> usize {
        match self {
            FactorView::F32(v) => v.len(),
            FactorView::F16(v) => v.len(),
            FactorView::BF16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first byte of the values and their size in bytes.
    pub fn byte_span(&self) -> (*const u8, usize) {
        match self {
            FactorView::F32(v) => (v.as_ptr().cast(), std::mem::size_of_val(*v)),
            FactorView::F16(v) => (v.as_ptr().cast(), std::mem::size_of_val(*v)),
            FactorView::BF16(v) => (v.as_ptr().cast(), std::mem::size_of_val(*v)),
        }
    }

    /// The first byte of values `elems` and their size in bytes (`elems` within the view).
    pub fn byte_range(&self, elems: Range<usize>) -> (*const u8, usize) {
        assert!(
            elems.start <= elems.end && elems.end <= self.len(),
            "byte_range: past the view"
        );
        let (p, b) = (self.byte_span().0, self.elem_bytes());
        // SAFETY: `elems.start <= len`, so the offset stays within (or one past) the slice.
        (unsafe { p.add(elems.start * b) }, elems.len() * b)
    }

    /// Bytes of one value: 4, or 2 for halves.
    pub fn elem_bytes(&self) -> usize {
        match self {
            FactorView::F32(_) => 4,
            FactorView::F16(_) | FactorView::BF16(_) => 2,
        }
    }

    /// Value `i` as f32 (exact).
    pub fn get(&self, i: usize) -> f32 {
        match self {
            FactorView::F32(v) => v[i],
            FactorView::F16(v) => v[i].to_f32(),
            FactorView::BF16(v) => v[i].to_f32(),
        }
    }
}

impl<'a> From<&'a [f32]> for FactorView<'a> {
    fn from(v: &'a [f32]) -> Self {
        FactorView::F32(v)
    }
}

impl<'a> From<&'a [f16]> for FactorView<'a> {
    fn from(v: &'a [f16]) -> Self {
        FactorView::F16(v)
    }
}

impl<'a> From<&'a [bf16]> for FactorView<'a> {
    fn from(v: &'a [bf16]) -> Self {
        FactorView::BF16(v)
    }
}

/// What a factor's element is, for the SIMD loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ElemKind {
    F32,
    F16,
    BF16,
}

/// An element type factors are held in; its values convert to f32 exactly.
///
/// # Safety
/// `KIND` names the type's layout (f32, IEEE binary16 bits, bfloat16 bits): the SIMD loads
/// read the type's memory as that. Implemented for exactly f32, `half::f16` and
/// `half::bf16` (both `repr(transparent)` over their u16 bits).
pub(crate) unsafe trait Elem: Copy + Into<f32> + Send + Sync + 'static {
    const KIND: ElemKind;

    /// `put(i, j, dot(xs[i], ws[j]))` for up to 4 × 4 rows of equal length: each element
    /// the crate's canonical dot product ([`crate::dot`]) of x with the converted row.
    /// Reports the bytes of `ws` it reads to `ahead`.
    fn dot_tile(
        xs: &[&[f32]],
        ws: &[&[Self]],
        put: &mut dyn FnMut(usize, usize, f32),
        ahead: &mut Ahead,
    );
}

// SAFETY: f32 is f32.
unsafe impl Elem for f32 {
    const KIND: ElemKind = ElemKind::F32;
    fn dot_tile(
        xs: &[&[f32]],
        ws: &[&[f32]],
        put: &mut dyn FnMut(usize, usize, f32),
        ahead: &mut Ahead,
    ) {
        ahead.consume(ws.iter().map(|w| 4 * w.len()).sum());
        crate::dot_tile(xs, ws, put)
    }
}

// SAFETY: `half::f16` is `repr(transparent)` over its IEEE binary16 bits.
unsafe impl Elem for f16 {
    const KIND: ElemKind = ElemKind::F16;
    fn dot_tile(
        xs: &[&[f32]],
        ws: &[&[f16]],
        put: &mut dyn FnMut(usize, usize, f32),
        ahead: &mut Ahead,
    ) {
        half_dot_tile(xs, ws, put, ahead)
    }
}

// SAFETY: `half::bf16` is `repr(transparent)` over its bfloat16 bits.
unsafe impl Elem for bf16 {
    const KIND: ElemKind = ElemKind::BF16;
    fn dot_tile(
        xs: &[&[f32]],
        ws: &[&[bf16]],
        put: &mut dyn FnMut(usize, usize, f32),
        ahead: &mut Ahead,
    ) {
        half_dot_tile(xs, ws, put, ahead)
    }
}

/// [`crate::dot_tile`] with halves for the weight rows: the same arithmetic, bit for bit, on
/// the converted values (AVX2: `tile_f32`'s FMA lanes, lane tree and tail; portable:
/// `generic::dot_f32`'s).
fn half_dot_tile<W: Elem>(
    xs: &[&[f32]],
    ws: &[&[W]],
    put: &mut dyn FnMut(usize, usize, f32),
    ahead: &mut Ahead,
) {
    let k = xs.first().map_or(0, |x| x.len());
    let (mr, nr) = (xs.len(), ws.len());
    assert!(mr <= 4 && nr <= 4, "dot_tile takes at most 4 x 4 rows");
    assert!(
        xs.iter().all(|r| r.len() == k) && ws.iter().all(|r| r.len() == k),
        "dot_tile rows differ in length"
    );
    #[cfg(target_arch = "x86_64")]
    if Isa::active() == Isa::Avx2Fma {
        macro_rules! run {
            ($MR:literal, $NR:literal) => {{
                let xp: [*const f32; $MR] = std::array::from_fn(|a| xs[a].as_ptr());
                let wp: [*const W; $NR] = std::array::from_fn(|b| ws[b].as_ptr());
                // SAFETY: AVX2+FMA+F16C checked via `Isa`; every row holds `k` values.
                let r =
                    unsafe { crate::x86::lora_avx2::shrink_tile::<$MR, $NR, W>(xp, wp, k, ahead) };
                for a in 0..$MR {
                    for b in 0..$NR {
                        put(a, b, r[a][b]);
                    }
                }
            }};
        }
        match (mr, nr) {
            (1, 1) => run!(1, 1),
            (1, 2) => run!(1, 2),
            (1, 3) => run!(1, 3),
            (1, 4) => run!(1, 4),
            (2, 1) => run!(2, 1),
            (2, 2) => run!(2, 2),
            (2, 3) => run!(2, 3),
            (2, 4) => run!(2, 4),
            (3, 1) => run!(3, 1),
            (3, 2) => run!(3, 2),
            (3, 3) => run!(3, 3),
            (3, 4) => run!(3, 4),
            (4, 1) => run!(4, 1),
            (4, 2) => run!(4, 2),
            (4, 3) => run!(4, 3),
            (4, 4) => run!(4, 4),
            _ => {} // an empty tile
        }
        return;
    }
    ahead.consume(nr * k * std::mem::size_of::<W>());
    for a in 0..mr {
        for b in 0..nr {
            put(a, b, crate::generic::dot_f32_as(xs[a], ws[b]));
        }
    }
}
