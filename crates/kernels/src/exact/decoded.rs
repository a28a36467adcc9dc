//! The stream kernel on the ggml types (Q5_x, the K-quants, IQ4_x) wherever AVX2 runs: each
//! register tile walks K in chunks of [`CHUNK`] weights, decodes its rows' chunk to their
//! exact f32 values in an L1 buffer (`x86::ggml_decode`, SIMD), and runs the f32 tile's K
//! loop over it with the accumulators carried from chunk to chunk. The chunks cut K on
//! multiples of 8, so each element meets the same FMAs in the same order as in the panel
//! kernel: the same bits (see the crate's numerics contract).

use std::cell::RefCell;

use tessera_core::DType;

use crate::aligned::AlignedF32;
use crate::gemm::GemmWeight;
use crate::isa::Isa;

/// Weights of a row decoded at a time: two super-blocks, or sixteen 32-weight blocks (a
/// tile's rows then lie 2 KiB apart in the buffer: 4 KiB would alias in L1).
pub(crate) const CHUNK: usize = 512;

thread_local! {
    static CHUNKS: RefCell<AlignedF32> = const { RefCell::new(AlignedF32::new()) };
}

/// One stream tile: activation rows `i0..i0 + mr` (rows of `k`) with weight rows
/// `j0..j0 + nr`, as `[a * nr + b]`. `mr × nr` is one of `super::stream_tile_for`'s tiles.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stream_tile(
    isa: Isa,
    dtype: DType,
    mr: usize,
    nr: usize,
    x: &[f32],
    k: usize,
    i0: usize,
    w: &GemmWeight,
    j0: usize,
) -> [f32; 16] {
    assert!(isa == Isa::Avx2Fma && mr * nr <= 16 && (i0 + mr) * k <= x.len());
    assert!(k.is_multiple_of(dtype.block_len()) && k.is_multiple_of(8));
    CHUNKS.with(|c| {
        let mut buf = c.borrow_mut();
        buf.grow(nr * CHUNK);
        let mut v = [0f32; 16];
        macro_rules! run {
            ($MR:literal, $NR:literal) => {{
                let xp: [*const f32; $MR] = std::array::from_fn(|a| x[(i0 + a) * k..].as_ptr());
                // SAFETY: AVX2+FMA checked above via `isa`; each activation row holds `k`
                // values, `buf` holds NR chunks, and the weight rows are whole blocks of K.
                let r = unsafe { tile::<$MR, $NR>(isa, dtype, xp, w, j0, k, &mut buf) };
                for a in 0..$MR {
                    for b in 0..$NR {
                        v[a * $NR + b] = r[a][b];
                    }
                }
            }};
        }
        match (mr, nr) {
            (1, 8) => run!(1, 8),
            (1, 4) => run!(1, 4),
            (1, 2) => run!(1, 2),
            (1, 1) => run!(1, 1),
            (2, 2) => run!(2, 2),
            (2, 1) => run!(2, 1),
            (3, 2) => run!(3, 2),
            (3, 1) => run!(3, 1),
            (4, 1) => run!(4, 1),
            _ => unreachable!("stream tile {mr}x{nr} (see stream_tile_for)"),
        }
        v
    })
}

/// # Safety
/// AVX2 and FMA available; `x[a]` valid for `k` reads; `buf.len() >= NR * CHUNK`; weight
/// rows `j0..j0 + NR` exist and hold `k` weights of `dtype` (a multiple of its block and of 8).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const MR: usize, const NR: usize>(
    isa: Isa,
    dtype: DType,
    x: [*const f32; MR],
    w: &GemmWeight,
    j0: usize,
    k: usize,
    buf: &mut [f32],
) -> [[f32; NR]; MR] {
    use crate::x86::avx2::{hsum, tile_f32_acc};
    use std::arch::x86_64::*;
    let (bl, bb) = (dtype.block_len(), dtype.block_bytes());
    let rows: [&[u8]; NR] = std::array::from_fn(|b| w.row(j0 + b));
    // The next tile's rows (adjacent in memory) requested into L2 while this one runs: the
    // rows are read in pieces that jump between them, which the hardware prefetchers follow
    // poorly from DRAM.
    let next = w.stored_rows(j0 + NR..j0 + 2 * NR).unwrap_or(&[]);
    let chunks = k.div_ceil(CHUNK);
    // The next tile's lines, an equal share with each chunk (not all at once, which would
    // queue them ahead of this tile's own misses).
    let share = next.len().div_ceil(64).div_ceil(chunks) * 64;
    let mut acc = [[_mm256_setzero_ps(); NR]; MR];
    let mut c0 = 0;
    while c0 < k {
        let len = CHUNK.min(k - c0);
        let at = (c0 / CHUNK) * share;
        for line in next
            .get(at..(at + share).min(next.len()))
            .unwrap_or(&[])
            .chunks(64)
        {
            _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast());
        }
        for (b, row) in rows.iter().enumerate() {
            let dst = &mut buf[b * CHUNK..b * CHUNK + len];
            crate::gemm::dequantize(isa, dtype, &row[c0 / bl * bb..(c0 + len) / bl * bb], dst);
        }
        let xs: [*const f32; MR] = std::array::from_fn(|a| x[a].add(c0));
        let ws: [*const f32; NR] = std::array::from_fn(|b| buf[b * CHUNK..].as_ptr());
        tile_f32_acc::<MR, NR>(xs, ws, len, &mut acc);
        c0 += len;
    }
    let mut out = [[0f32; NR]; MR];
    for a in 0..MR {
        for b in 0..NR {
            out[a][b] = hsum(acc[a][b]);
        }
    }
    out
}
