// Matrix products with weights in their stored format, and embedding lookups.
//
// matmul_<FMT>: y[m * ldy + n] = sum_k x[m * ldx + k] * W[n, k] (+ bias[n]) for m < M and
// n < N, W row-major [N, K] in FMT (each row K / WEIGHTS blocks). One warp per output
// column n, MT activation rows per pass: each lane decodes 32 weights of its chunk into
// registers once and dots them with the MT rows, f32 accumulation, then a warp sum. The
// decode of a step (M <= 8) reads every weight once; larger M re-reads the weights per
// MT rows (correct, not yet a prefill kernel). Launch: block (32, WARPS), grid
// (ceil(N / WARPS), ceil(M / MT)).
//
// embed_<FMT>: x[m * K ..] = row tokens[m] of W, decoded (times scale when it is not 1).
// Launch: block (128), grid (M).
#include "dequant.cuh"

#define MT 8
#define WARPS 4

template <class F>
__device__ __forceinline__ void matmul_body(const u8* __restrict__ w,
                                            const float* __restrict__ x,
                                            float* __restrict__ y,
                                            const float* __restrict__ bias, int K, int N,
                                            int M, int ldx, int ldy) {
    const int n = blockIdx.x * WARPS + threadIdx.y;
    const int lane = threadIdx.x;
    const int m0 = blockIdx.y * MT;
    if (n >= N) return;
    constexpr int CH = F::WEIGHTS / 32;
    const u8* row = w + (size_t)n * (size_t)(K / F::WEIGHTS) * F::BYTES;
    const int chunks = K / 32;
    float acc[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i] = 0.f;
    const int mc = min(MT, M - m0);
    float wv[32];
    for (int c = lane; c < chunks; c += 32) {
        F::load(row + (size_t)(c / CH) * F::BYTES, c % CH, wv);
#pragma unroll
        for (int i = 0; i < MT; i++) {
            if (i < mc) {
                const float4* xp =
                    reinterpret_cast<const float4*>(x + (size_t)(m0 + i) * ldx + 32 * c);
                float s = 0.f;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    float4 v = xp[j];
                    s += wv[4 * j] * v.x + wv[4 * j + 1] * v.y + wv[4 * j + 2] * v.z +
                         wv[4 * j + 3] * v.w;
                }
                acc[i] += s;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MT; i++) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], off);
    }
    if (lane == 0) {
        const float b = bias ? bias[n] : 0.f;
#pragma unroll
        for (int i = 0; i < MT; i++)
            if (m0 + i < M) y[(size_t)(m0 + i) * ldy + n] = acc[i] + b;
    }
}

template <class F>
__device__ __forceinline__ void embed_body(const u8* __restrict__ w,
                                           const u32* __restrict__ tokens,
                                           float* __restrict__ x, int K, float scale) {
    constexpr int CH = F::WEIGHTS / 32;
    const int m = blockIdx.x;
    const u8* row = w + (size_t)tokens[m] * (size_t)(K / F::WEIGHTS) * F::BYTES;
    float* out = x + (size_t)m * K;
    float wv[32];
    for (int c = threadIdx.x; c < K / 32; c += blockDim.x) {
        F::load(row + (size_t)(c / CH) * F::BYTES, c % CH, wv);
#pragma unroll
        for (int i = 0; i < 32; i++) out[32 * c + i] = scale != 1.f ? wv[i] * scale : wv[i];
    }
}

#define FORMAT(F)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * WARPS)                               \
        matmul_##F(const u8* w, const float* x, float* y, const float* bias, int K, int N, \
                   int M, int ldx, int ldy) {                                              \
        matmul_body<F>(w, x, y, bias, K, N, M, ldx, ldy);                                  \
    }                                                                                      \
    extern "C" __global__ void __launch_bounds__(128)                                      \
        embed_##F(const u8* w, const u32* tokens, float* x, int K, float scale) {          \
        embed_body<F>(w, tokens, x, K, scale);                                             \
    }

FORMAT(F32)
FORMAT(F16)
FORMAT(BF16)
FORMAT(Q8_0)
FORMAT(Q4_0)
FORMAT(Q4_1)
FORMAT(Q4_K)
FORMAT(Q5_K)
FORMAT(Q6_K)
