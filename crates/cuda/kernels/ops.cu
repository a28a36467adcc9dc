// The element-wise and row-wise steps of a layer, each the CPU's arithmetic
// (crates/kernels/src/ops.rs, math.rs; crates/model/src/rope.rs) with products and sums
// rounded one at a time where the CPU rounds them so.
#include "dequant.cuh"

// Sum over the block of a double (blockDim.x a multiple of 32, at most 1024).
__device__ double block_sum(double v) {
    __shared__ double part[32];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = 0.0;
    if (warp == 0) {
        v = lane < (int)(blockDim.x / 32) ? part[lane] : 0.0;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    v = part[0];
    __syncthreads();
    return v;
}

// out[r] = x[rows ? rows[r] : r] * scale * w, scale = 1 / sqrt(mean(x^2) + eps), the sum of
// squares in f64 as the CPU's. Launch: block (256), grid (rows).
extern "C" __global__ void __launch_bounds__(256)
    rms_norm(const float* __restrict__ x, const float* __restrict__ w,
             float* __restrict__ out, const u32* __restrict__ rows, int h, float eps) {
    const int r = blockIdx.x;
    const float* xr = x + (size_t)(rows ? rows[r] : r) * h;
    double ss = 0.0;
    for (int i = threadIdx.x; i < h; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    ss = block_sum(ss);
    const float scale = (float)(1.0 / sqrt(ss / (double)h + (double)eps));
    for (int i = threadIdx.x; i < h; i += blockDim.x)
        out[(size_t)r * h + i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

// RoPE on the first `heads` heads of each row of `qkv` (q heads then KV heads):
// angle = f32(pos * inv_freq[i]), cos and sin in f64 rounded to f32, times mscale; pairs
// (2i, 2i + 1) interleaved, or (i, i + half) with neox. Launch: block (128), grid (rows).
extern "C" __global__ void __launch_bounds__(128)
    rope(float* __restrict__ qkv, int stride, int heads, int head_dim,
         const u32* __restrict__ positions, const float* __restrict__ inv_freq, int half,
         float mscale, int neox) {
    const int r = blockIdx.x;
    const float pos = (float)positions[r];
    float* row = qkv + (size_t)r * stride;
    for (int t = threadIdx.x; t < heads * half; t += blockDim.x) {
        const int head = t / half, i = t % half;
        const double angle = (double)__fmul_rn(pos, inv_freq[i]);
        const float c = __fmul_rn((float)cos(angle), mscale);
        const float s = __fmul_rn((float)sin(angle), mscale);
        float* x = row + head * head_dim;
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = x[a], x1 = x[b];
        x[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        x[b] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    }
}

// Stores each row's K and V (kv_dim values each, after q_dim in its qkv row) at element
// offset slots[r] of the layer's K and V buffers. Launch: block (128), grid (rows).
extern "C" __global__ void __launch_bounds__(128)
    kv_write(const float* __restrict__ qkv, int stride, int q_dim, int kv_dim,
             float* __restrict__ k, float* __restrict__ v, const u32* __restrict__ slots) {
    const int r = blockIdx.x;
    const float* row = qkv + (size_t)r * stride + q_dim;
    const size_t off = slots[r];
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        k[off + i] = row[i];
        v[off + i] = row[kv_dim + i];
    }
}

// act[r, i] = g / (1 + exp(-g)) * u for g = gu[r, i], u = gu[r, ff + i] (SwiGLU).
// Launch: block (256), grid (ceil(rows * ff / 256)).
extern "C" __global__ void __launch_bounds__(256)
    silu_mul(const float* __restrict__ gu, float* __restrict__ act, int ff, int rows) {
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)rows * ff) return;
    const size_t r = t / ff, i = t % ff;
    const float g = gu[r * 2 * ff + i], u = gu[r * 2 * ff + ff + i];
    act[t] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.f, expf(-g))), u);
}

// x[i] += d[i]. Launch: block (256), grid (ceil(n / 256)).
extern "C" __global__ void __launch_bounds__(256)
    add_assign(float* __restrict__ x, const float* __restrict__ d, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], d[i]);
}
