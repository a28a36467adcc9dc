// Weight formats as stored, decoded 32 weights at a time into registers.
//
// Each format is a struct with the weights and bytes of one storage block and a `load`
// that writes chunk `c` (32 consecutive weights) of the block at `b` into `w`; plain floats
// count 32 weights a block. Layouts and
// arithmetic mirror the CPU's reference decoders exactly (crates/core/src/blocks.rs and
// crates/core/src/ggml_quants.rs, themselves bitwise ggml's): every product and difference
// is rounded on its own (__fmul_rn, __fsub_rn, __fadd_rn), never fused, so a weight decodes
// to the same f32 on both sides. Only sums of products may differ in order.
#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;

// IEEE half bits to f32 (exact).
__device__ __forceinline__ float f16_at(const u8* p) {
    u16 h = (u16)p[0] | ((u16)p[1] << 8);
    float f;
    // cvt.f32.f16 is exact; inline so that NVRTC needs no cuda_fp16.h.
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

// Plain floats are read as blocks of 32 (rows must hold whole blocks).
struct F32 {
    static constexpr int WEIGHTS = 32, BYTES = 128;
    __device__ static void load(const u8* b, int, float* w) {
        const float* p = reinterpret_cast<const float*>(b);
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = p[i];
    }
};

struct F16 {
    static constexpr int WEIGHTS = 32, BYTES = 64;
    __device__ static void load(const u8* b, int, float* w) {
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = f16_at(b + 2 * i);
    }
};

struct BF16 {
    static constexpr int WEIGHTS = 32, BYTES = 64;
    __device__ static void load(const u8* b, int, float* w) {
#pragma unroll
        for (int i = 0; i < 32; i++) {
            u32 bits = ((u32)b[2 * i] | ((u32)b[2 * i + 1] << 8)) << 16;
            w[i] = __uint_as_float(bits);
        }
    }
};

// block_q8_0 { half d; i8 qs[32]; }: w = d * q.
struct Q8_0 {
    static constexpr int WEIGHTS = 32, BYTES = 34;
    __device__ static void load(const u8* b, int, float* w) {
        float d = f16_at(b);
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = __fmul_rn(d, (float)(i8)b[2 + i]);
    }
};

// block_q4_0 { half d; u8 qs[16]; }: w = (q - 8) * d; low nibbles weights 0..16.
struct Q4_0 {
    static constexpr int WEIGHTS = 32, BYTES = 18;
    __device__ static void load(const u8* b, int, float* w) {
        float d = f16_at(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            u8 q = b[2 + j];
            w[j] = __fmul_rn((float)((int)(q & 15) - 8), d);
            w[j + 16] = __fmul_rn((float)((int)(q >> 4) - 8), d);
        }
    }
};

// block_q4_1 { half d; half m; u8 qs[16]; }: w = q * d + m.
struct Q4_1 {
    static constexpr int WEIGHTS = 32, BYTES = 20;
    __device__ static void load(const u8* b, int, float* w) {
        float d = f16_at(b), m = f16_at(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            u8 q = b[4 + j];
            w[j] = __fadd_rn(__fmul_rn((float)(q & 15), d), m);
            w[j + 16] = __fadd_rn(__fmul_rn((float)(q >> 4), d), m);
        }
    }
};

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..8).
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// block_q4_K { half d; half dmin; u8 scales[12]; u8 qs[128]; }:
// w = (d * sc) * q - (dmin * m) per 32 weights.
struct Q4_K {
    static constexpr int WEIGHTS = 256, BYTES = 144;
    __device__ static void load(const u8* b, int c, float* w) {
        float d = f16_at(b), dmin = f16_at(b + 2);
        int sc, m;
        scale_min_k4(c, b + 4, &sc, &m);
        float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
        const u8* q = b + 16 + 32 * (c / 2);
        int shift = (c & 1) * 4;
#pragma unroll
        for (int l = 0; l < 32; l++)
            w[l] = __fsub_rn(__fmul_rn(d1, (float)((q[l] >> shift) & 15)), m1);
    }
};

// block_q5_K { half d; half dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }:
// as Q4_K with a fifth bit per weight, bit c of qh[l].
struct Q5_K {
    static constexpr int WEIGHTS = 256, BYTES = 176;
    __device__ static void load(const u8* b, int c, float* w) {
        float d = f16_at(b), dmin = f16_at(b + 2);
        int sc, m;
        scale_min_k4(c, b + 4, &sc, &m);
        float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
        const u8* qh = b + 16;
        const u8* ql = b + 48 + 32 * (c / 2);
        int shift = (c & 1) * 4;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = ((ql[l] >> shift) & 15) + (((qh[l] >> c) & 1) << 4);
            w[l] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
        }
    }
};

// block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; half d; }:
// w = (d * sc) * (q - 32) per 16 weights. Chunk c is quarter r = c % 4 of half n = c / 4.
struct Q6_K {
    static constexpr int WEIGHTS = 256, BYTES = 210;
    __device__ static void load(const u8* b, int c, float* w) {
        float d = f16_at(b + 208);
        int n = c / 4, r = c % 4;
        const u8* ql = b + 64 * n + (r & 1) * 32;
        const u8* qh = b + 128 + 32 * n;
        const i8* sc = (const i8*)(b + 192 + 8 * n);
        int lshift = (r >> 1) * 4, hshift = 2 * r;
        float ds0 = __fmul_rn(d, (float)sc[2 * r]), ds1 = __fmul_rn(d, (float)sc[2 * r + 1]);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = (((ql[l] >> lshift) & 15) | (((qh[l] >> hshift) & 3) << 4)) - 32;
            w[l] = __fmul_rn(l < 16 ? ds0 : ds1, (float)q);
        }
    }
};
