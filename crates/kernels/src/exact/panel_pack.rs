//! The packed kernels' weight panels: a block of stored (or repacked) weight rows
//! dequantized to their reference f32 values, interleaved `[step][nr][8]` then the tail
//! (`exact::packed` reads them as they are; `exact::outer` transposes them into strips).

use tessera_core::DType;

use super::records;
use crate::gemm::GemmWeight;
use crate::isa::Isa;

/// Dequantizes elements `k0..k1` of weight rows `r0..r0 + live` into `dst` as
/// `[step][nr][8]` then the tail `[nr][len % 8]`; rows `live..nr` are zero.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack(
    isa: Isa,
    dtype: DType,
    w: &GemmWeight,
    r0: usize,
    live: usize,
    nr: usize,
    k0: usize,
    k1: usize,
    dst: &mut [f32],
) {
    let len = k1 - k0;
    assert!(dst.len() == nr * len && k0.is_multiple_of(dtype.block_len().max(32)));
    #[cfg(target_arch = "x86_64")]
    if let (Isa::Avx2Fma, Some(pw)) = (isa, w.packed.as_ref()) {
        // Repacked: read the records (the stored rows' pages were released).
        return records::pack(pw, r0, live, nr, k0, k1, dst);
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma {
        use crate::x86::avx2_exact as ax;
        let row = |b: usize| w.row(r0 + b.min(live - 1)).as_ptr();
        macro_rules! run {
            ($DT:expr, $NR:literal) => {{
                let wp: [*const u8; $NR] = std::array::from_fn(row);
                // SAFETY: AVX2+FMA+F16C checked via `Isa`; the first `live` pointers are
                // stored rows of K elements (the others are only counted, never read); k0 is
                // a multiple of 32 and, for block formats, so is k1 (K and kc are); `dst`
                // holds nr · len values (asserted).
                unsafe { ax::pack_panel::<{ $DT }, $NR>(wp, live, k0, k1, dst.as_mut_ptr()) };
                return;
            }};
        }
        macro_rules! nrs {
            ($DT:expr) => {
                match nr {
                    2 => run!($DT, 2),
                    3 => run!($DT, 3),
                    4 => run!($DT, 4),
                    _ => unreachable!("packed nr {nr}"),
                }
            };
        }
        match dtype {
            DType::F32 => nrs!(ax::F32),
            DType::F16 => nrs!(ax::F16),
            DType::BF16 => nrs!(ax::BF16),
            DType::Q8_0 => nrs!(ax::Q8_0),
            DType::Q4_0 => nrs!(ax::Q4_0),
            DType::Q4_1 => nrs!(ax::Q4_1),
            // The ggml types: the portable packing below, on the SIMD dequantization.
            _ => {}
        }
    }
    let _ = isa;
    let steps = len / 8;
    let tail = len % 8;
    let es_num = dtype.block_bytes();
    let es_den = dtype.block_len();
    let mut buf = vec![0f32; len];
    for b in 0..nr {
        if b < live {
            let row = w.row(r0 + b);
            crate::gemm::dequantize(
                isa,
                dtype,
                &row[k0 * es_num / es_den..k1 * es_num / es_den],
                &mut buf,
            );
        } else {
            buf.fill(0.0);
        }
        for s in 0..steps {
            dst[(s * nr + b) * 8..(s * nr + b) * 8 + 8].copy_from_slice(&buf[8 * s..8 * s + 8]);
        }
        dst[steps * 8 * nr + b * tail..steps * 8 * nr + (b + 1) * tail]
            .copy_from_slice(&buf[steps * 8..]);
    }
}
