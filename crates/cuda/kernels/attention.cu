// Causal grouped-query attention over the paged KV cache (crates/model/src/kv.rs's layout:
// per layer [block][slot][kv_dim] f32, K and V apart), the exact path's arithmetic up to
// the order of sums: out = softmax(scale * q . K[0..=pos]) . V[0..=pos], keys read through
// the row's block table.
//
// attention_hd<D>: one warp per (row, query head), each lane holding D / 32 of the head's
// dimensions; keys walked in order with an online softmax (running max, f32). Launch:
// block (32, 4), grid (ceil(rows * n_heads / 4)).
#include "dequant.cuh"

template <int D>
__device__ __forceinline__ void attention_body(
    const float* __restrict__ qkv, int qkv_stride, const float* __restrict__ kc,
    const float* __restrict__ vc, float* __restrict__ out, const u32* __restrict__ positions,
    const u32* __restrict__ row_table, const u32* __restrict__ tables, int n_heads, int group,
    int kv_dim, int block_size, float scale, int rows) {
    constexpr int E = D / 32;
    const int item = blockIdx.x * blockDim.y + threadIdx.y;
    if (item >= rows * n_heads) return;
    const int r = item / n_heads, h = item % n_heads, lane = threadIdx.x;
    const int kvh = h / group;
    const float* q = qkv + (size_t)r * qkv_stride + h * D;
    float qv[E], acc[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        qv[e] = q[lane + 32 * e];
        acc[e] = 0.f;
    }
    const u32* table = tables + row_table[r];
    const int n = (int)positions[r] + 1;
    float mx = __int_as_float(0xff800000), l = 0.f;
    for (int p = 0; p < n; p++) {
        const size_t off =
            ((size_t)table[p / block_size] * block_size + p % block_size) * kv_dim + kvh * D;
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < E; e++) s += qv[e] * kc[off + lane + 32 * e];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        s *= scale;
        const float m2 = fmaxf(mx, s);
        const float corr = expf(mx - m2), ps = expf(s - m2);
        l = l * corr + ps;
#pragma unroll
        for (int e = 0; e < E; e++) acc[e] = acc[e] * corr + ps * vc[off + lane + 32 * e];
        mx = m2;
    }
    float* o = out + (size_t)r * n_heads * D + h * D;
    const float inv = 1.f / l;
#pragma unroll
    for (int e = 0; e < E; e++) o[lane + 32 * e] = acc[e] * inv;
}

#define HEAD_DIM(D)                                                                         \
    extern "C" __global__ void __launch_bounds__(128) attention_hd##D(                      \
        const float* qkv, int qkv_stride, const float* kc, const float* vc, float* out,     \
        const u32* positions, const u32* row_table, const u32* tables, int n_heads,         \
        int group, int kv_dim, int block_size, float scale, int rows) {                     \
        attention_body<D>(qkv, qkv_stride, kc, vc, out, positions, row_table, tables,       \
                          n_heads, group, kv_dim, block_size, scale, rows);                 \
    }

HEAD_DIM(32)
HEAD_DIM(64)
HEAD_DIM(96)
HEAD_DIM(128)
HEAD_DIM(256)
