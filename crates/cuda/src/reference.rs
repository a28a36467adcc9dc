//! Naive host twins of every kernel, the definitions the GPU tests hold the kernels to:
//! weights decoded by the CPU's own decoder (`tessera_core::tensor::dequantize_row`), sums
//! in f64, softmax written out. Slow and plain on purpose.

use tessera_core::DType;

/// `y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n])`, W `[n, k]` stored as `dtype`.
pub fn matmul(
    dtype: DType,
    w: &[u8],
    x: &[f32],
    m: usize,
    k: usize,
    n: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let row_bytes = dtype.row_bytes(k).expect("whole blocks");
    let mut wrow = vec![0f32; k];
    let mut y = vec![0f32; m * n];
    for j in 0..n {
        tessera_core::tensor::dequantize_row(
            dtype,
            &w[j * row_bytes..(j + 1) * row_bytes],
            &mut wrow,
        );
        for i in 0..m {
            let s: f64 = (0..k).map(|t| x[i * k + t] as f64 * wrow[t] as f64).sum();
            y[i * n + j] = s as f32 + bias.map_or(0.0, |b| b[j]);
        }
    }
    y
}

/// Rows `tokens` of W `[vocab, k]` stored as `dtype`, decoded.
pub fn embed(dtype: DType, w: &[u8], tokens: &[u32], k: usize) -> Vec<f32> {
    let row_bytes = dtype.row_bytes(k).expect("whole blocks");
    let mut out = vec![0f32; tokens.len() * k];
    for (t, row) in tokens.iter().zip(out.chunks_exact_mut(k)) {
        let r = *t as usize;
        tessera_core::tensor::dequantize_row(dtype, &w[r * row_bytes..(r + 1) * row_bytes], row);
    }
    out
}

/// RMSNorm of each `h`-wide row: `x / sqrt(mean(x²) + eps) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, h: usize) -> Vec<f32> {
    x.chunks_exact(h)
        .flat_map(|r| {
            let ms = r.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / h as f64;
            let s = 1.0 / (ms + eps as f64).sqrt();
            r.iter()
                .zip(w)
                .map(move |(&v, &w)| (v as f64 * s * w as f64) as f32)
        })
        .collect()
}

/// `g / (1 + exp(-g)) * u` for each row `[g | u]` of `2 * ff` values.
pub fn silu_mul(gu: &[f32], ff: usize) -> Vec<f32> {
    gu.chunks_exact(2 * ff)
        .flat_map(|r| {
            (0..ff).map(move |i| {
                let g = r[i] as f64;
                (g / (1.0 + (-g).exp()) * r[ff + i] as f64) as f32
            })
        })
        .collect()
}

/// Where one attention row reads: its position and its sequence's block table.
pub struct AttnRow<'a> {
    pub pos: usize,
    pub table: &'a [u32],
}

/// Causal grouped-query attention of each row's `n_heads` query heads (`q`, rows
/// `q_stride` apart) over keys `0..=pos` of the paged cache `k`/`v` (`[block][slot][kv_dim]`):
/// `softmax(scale · q·K) · V`, in f64.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    q_stride: usize,
    rows: &[AttnRow],
    k: &[f32],
    v: &[f32],
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    scale: f32,
) -> Vec<f32> {
    let kv_dim = n_kv_heads * head_dim;
    let group = n_heads / n_kv_heads;
    let mut out = vec![0f32; rows.len() * n_heads * head_dim];
    for (r, row) in rows.iter().enumerate() {
        for h in 0..n_heads {
            let qh = &q[r * q_stride + h * head_dim..][..head_dim];
            let off = |p: usize| {
                (row.table[p / block_size] as usize * block_size + p % block_size) * kv_dim
                    + (h / group) * head_dim
            };
            let scores: Vec<f64> = (0..=row.pos)
                .map(|p| {
                    let kp = &k[off(p)..][..head_dim];
                    qh.iter()
                        .zip(kp)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            let o = &mut out[(r * n_heads + h) * head_dim..][..head_dim];
            for (d, od) in o.iter_mut().enumerate() {
                *od = (0..=row.pos)
                    .map(|p| e[p] / z * v[off(p) + d] as f64)
                    .sum::<f64>() as f32;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::tensor::quantize_row;

    /// The references agree with the CPU path's own kernels (which the engine's tests hold
    /// to transformers), so holding the GPU to them holds it to the CPU.
    #[test]
    fn references_agree_with_the_cpu_kernels() {
        let (k, n) = (256, 3);
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 97.0)
            .collect();
        let x: Vec<f32> = (0..2 * k)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 31.0)
            .collect();
        for dt in [DType::F32, DType::Q8_0, DType::Q4_K, DType::Q6_K] {
            let bytes: Vec<u8> = w
                .chunks_exact(k)
                .flat_map(|r| quantize_row(dt, r))
                .collect();
            let y = matmul(dt, &bytes, &x, 2, k, n, Some(&[1.0, 0.0, -1.0]));
            let mut wr = vec![0f32; k];
            tessera_core::tensor::dequantize_row(dt, &bytes[..dt.row_bytes(k).unwrap()], &mut wr);
            let dot: f32 = x[..k].iter().zip(&wr).map(|(a, b)| a * b).sum();
            assert!(
                (y[0] - (dot + 1.0)).abs() < 1e-4,
                "{dt}: {} vs {}",
                y[0],
                dot + 1.0
            );
            assert_eq!(embed(dt, &bytes, &[0], k), wr);
        }
        let h = 8;
        let xs: Vec<f32> = (0..2 * h).map(|i| i as f32 - 4.5).collect();
        let wn = vec![0.5f32; h];
        let mut cpu = vec![0f32; h];
        tessera_kernels::ops::rms_norm(&xs[h..], &wn, 1e-5, &mut cpu);
        let r = rms_norm(&xs, &wn, 1e-5, h);
        assert!(r[h..].iter().zip(&cpu).all(|(a, b)| (a - b).abs() < 1e-6));
        let gu = [1.0f32, -2.0, 3.0, 0.5];
        let mut cpu = [0f32; 2];
        tessera_kernels::ops::swiglu_into(&gu[..2], &gu[2..], &mut cpu);
        let s = silu_mul(&gu, 2);
        assert!(
            s.iter().zip(&cpu).all(|(a, b)| (a - b).abs() < 1e-6),
            "{s:?} {cpu:?}"
        );
    }

    #[test]
    fn attention_of_one_key_is_its_value() {
        // One KV head of 2, block size 2, the row's key in block 1 slot 0.
        let k = [0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0];
        let v = [0.0, 0.0, 0.0, 0.0, 3.0, -4.0, 0.0, 0.0];
        let rows = [AttnRow {
            pos: 0,
            table: &[1],
        }];
        let out = attention(&[0.5, 0.5, 7.0, 7.0], 4, &rows, &k, &v, 2, 1, 2, 2, 0.7);
        assert_eq!(out, [3.0, -4.0, 3.0, -4.0]);
    }
}
