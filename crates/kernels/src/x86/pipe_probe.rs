//! A developer's probe (an ignored test, no kernel uses it): which vector operations issue
//! beside AVX-512 FMAs on this CPU, and which take the FMAs' pipe slots. Each line times a
//! register-only loop (no memory but an L1-resident broadcast operand) of independent
//! operations and prints nanoseconds per iteration beside the FMA-only loop, so a kernel's
//! operation mix can be judged before it is written. Q4_1's decode
//! (`avx512_decode::subnormal_q4_1`) is built on what it shows on Zen 4: a shift and an AND
//! issue beside the FMAs, the magic exponent's ternary-logic op does not. That mix (per 8
//! weight vectors 16 FMAs, 8 ANDs, 7 shifts) runs at the FMAs' bound in registers, and
//! GFNI's affine op takes FMA slots (1.5x), so no decode of fewer FMA-pipe operations exists.
//!
//! `cargo test --release -p tessera-kernels --lib pipe_probe -- --ignored --nocapture`

#[cfg(test)]
mod tests {
    use std::arch::asm;
    use std::time::Instant;

    /// Times `$body` (an asm template over zmm0..zmm18; zmm16..zmm18 hold small normal
    /// floats, `[{q} ..]` is 384 readable bytes) repeated; best of 5 runs.
    macro_rules! probe {
        ($name:expr, $base:expr, $body:expr) => {{
            let iters = 2_000_000u64;
            let vals = [1.5f32, 0.75];
            let buf = [0.5f32; 96];
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                // SAFETY: only the vector registers declared as clobbered are written; the
                // memory read is `vals` (through `p`) and `buf` (through `q`, at most 96
                // bytes from its start).
                unsafe {
                    asm!(
                        "vbroadcastss zmm16, [{p}]",
                        "vbroadcastss zmm17, [{p} + 4]",
                        "vbroadcastss zmm18, [{p} + 4]",
                        "kxnorq k1, k1, k1",
                        "/* {q} */",
                        "2:",
                        $body,
                        "dec {n}",
                        "jnz 2b",
                        n = inout(reg) iters => _,
                        p = in(reg) vals.as_ptr(),
                        q = in(reg) buf.as_ptr(),
                        out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                        out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                        out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                        out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                        out("zmm16") _, out("zmm17") _, out("zmm18") _, out("k1") _,
                        options(nostack, readonly),
                    );
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            let ns = best / iters as f64 * 1e9;
            let base: f64 = $base;
            let ratio = if base > 0.0 { format!("{:5.2}x the 8 FMAs", ns / base) } else { String::new() };
            println!("{:58} {:6.3} ns/iter  {ratio}", $name, ns);
            ns
        }};
    }

    /// Eight independent zmm FMAs (a macro: asm templates are literals).
    macro_rules! fma8 {
        () => {
            concat!(
                "vfmadd231ps zmm0, zmm16, zmm17\nvfmadd231ps zmm1, zmm16, zmm17\n",
                "vfmadd231ps zmm2, zmm16, zmm17\nvfmadd231ps zmm3, zmm16, zmm17\n",
                "vfmadd231ps zmm4, zmm16, zmm17\nvfmadd231ps zmm5, zmm16, zmm17\n",
                "vfmadd231ps zmm6, zmm16, zmm17\nvfmadd231ps zmm7, zmm16, zmm17\n"
            )
        };
    }

    /// Eight FMAs with four `$op zmmN, $args` (N = 8..12, each its own destination)
    /// between them.
    macro_rules! beside {
        ($op:literal, $args:literal) => {
            concat!(
                "vfmadd231ps zmm0, zmm16, zmm17\n",
                $op,
                " zmm8, ",
                $args,
                "\n",
                "vfmadd231ps zmm1, zmm16, zmm17\nvfmadd231ps zmm2, zmm16, zmm17\n",
                $op,
                " zmm9, ",
                $args,
                "\n",
                "vfmadd231ps zmm3, zmm16, zmm17\nvfmadd231ps zmm4, zmm16, zmm17\n",
                $op,
                " zmm10, ",
                $args,
                "\n",
                "vfmadd231ps zmm5, zmm16, zmm17\nvfmadd231ps zmm6, zmm16, zmm17\n",
                $op,
                " zmm11, ",
                $args,
                "\n",
                "vfmadd231ps zmm7, zmm16, zmm17\n"
            )
        };
    }

    #[test]
    #[ignore = "a developer's probe: prints timings"]
    fn pipe_probe() {
        let cpu = [
            std::arch::is_x86_feature_detected!("avx512f"),
            std::arch::is_x86_feature_detected!("avx512vl"),
            std::arch::is_x86_feature_detected!("avx512bw"),
        ];
        if !cpu.iter().all(|&f| f) {
            println!("no AVX-512: nothing to probe");
            return;
        }
        let base = probe!("8 FMA", 0.0, fma8!());
        // Beside 8 FMAs: 4 of one other operation (each writes its own register).
        probe!(
            "8 FMA + 4 vpternlogd",
            base,
            beside!("vpternlogd", "zmm18, zmm17, 0xEC")
        );
        probe!("8 FMA + 4 vpandd", base, beside!("vpandd", "zmm18, zmm17"));
        probe!("8 FMA + 4 vpslld", base, beside!("vpslld", "zmm18, 4"));
        probe!(
            "8 FMA + 4 vpermps",
            base,
            beside!("vpermps", "zmm18, zmm17")
        );
        probe!(
            "8 FMA + 4 vbroadcastss zmm, m32",
            base,
            beside!("vbroadcastss", "[{q}]")
        );
        probe!("8 FMA + 2 vinserti64x4 zmm, m256", base, concat!(
            "vfmadd231ps zmm0, zmm16, zmm17\nvinserti64x4 zmm8, zmm18, [{q} + 64], 1\nvfmadd231ps zmm1, zmm16, zmm17\n",
            "vfmadd231ps zmm2, zmm16, zmm17\nvfmadd231ps zmm3, zmm16, zmm17\n",
            "vfmadd231ps zmm4, zmm16, zmm17\nvinserti64x4 zmm9, zmm18, [{q} + 64], 1\nvfmadd231ps zmm5, zmm16, zmm17\n",
            "vfmadd231ps zmm6, zmm16, zmm17\nvfmadd231ps zmm7, zmm16, zmm17\n"));
        // The M = 1 stream kernel's mix per 4 weight vectors: 4 decode FMAs, 4 dot FMAs
        // (activation broadcast from memory), and the decode's integer operations.
        probe!("Q4_1 M = 1, magic exponent: + 4 vpternlogd + 2 shifts", base, concat!(
            "vfmadd231ps zmm0, zmm16, zmm17\nvfmadd231ps zmm4, zmm18, dword ptr [{q}]{{1to16}}\nvpternlogd zmm8, zmm18, zmm17, 0xEC\nvpslld zmm12, zmm18, 4\n",
            "vfmadd231ps zmm1, zmm16, zmm17\nvfmadd231ps zmm5, zmm18, dword ptr [{q} + 4]{{1to16}}\nvpternlogd zmm9, zmm18, zmm17, 0xEC\n",
            "vfmadd231ps zmm2, zmm16, zmm17\nvfmadd231ps zmm6, zmm18, dword ptr [{q} + 8]{{1to16}}\nvpternlogd zmm10, zmm18, zmm17, 0xEC\nvpslld zmm13, zmm18, 4\n",
            "vfmadd231ps zmm3, zmm16, zmm17\nvfmadd231ps zmm7, zmm18, dword ptr [{q} + 12]{{1to16}}\nvpternlogd zmm11, zmm18, zmm17, 0xEC\n"));
        probe!("Q4_1 M = 1, low field: + 4 vpandd + 4 shifts", base, concat!(
            "vfmadd231ps zmm0, zmm16, zmm17\nvfmadd231ps zmm4, zmm18, dword ptr [{q}]{{1to16}}\nvpandd zmm8, zmm18, zmm17\nvpslld zmm12, zmm18, 4\n",
            "vfmadd231ps zmm1, zmm16, zmm17\nvfmadd231ps zmm5, zmm18, dword ptr [{q} + 4]{{1to16}}\nvpandd zmm9, zmm18, zmm17\nvpslld zmm13, zmm18, 4\n",
            "vfmadd231ps zmm2, zmm16, zmm17\nvfmadd231ps zmm6, zmm18, dword ptr [{q} + 8]{{1to16}}\nvpandd zmm10, zmm18, zmm17\nvpslld zmm14, zmm18, 4\n",
            "vfmadd231ps zmm3, zmm16, zmm17\nvfmadd231ps zmm7, zmm18, dword ptr [{q} + 12]{{1to16}}\nvpandd zmm11, zmm18, zmm17\nvpslld zmm15, zmm18, 4\n"));
        // The low field's mix per 8 weight vectors (16 FMAs, so against twice the 8 FMAs):
        // 7 shifts and 8 ANDs.
        probe!("Q4_1 M = 1 x8, low field: + 8 vpandd + 7 shifts", 2.0 * base, concat!(
            "vfmadd231ps zmm0, zmm16, zmm17\nvfmadd231ps zmm4, zmm18, dword ptr [{q}]{{1to16}}\nvpandd zmm8, zmm18, zmm17\nvpslld zmm12, zmm18, 4\n",
            "vfmadd231ps zmm1, zmm16, zmm17\nvfmadd231ps zmm5, zmm18, dword ptr [{q} + 4]{{1to16}}\nvpandd zmm9, zmm18, zmm17\nvpslld zmm13, zmm18, 4\n",
            "vfmadd231ps zmm2, zmm16, zmm17\nvfmadd231ps zmm6, zmm18, dword ptr [{q} + 8]{{1to16}}\nvpandd zmm10, zmm18, zmm17\nvpslld zmm14, zmm18, 4\n",
            "vfmadd231ps zmm3, zmm16, zmm17\nvfmadd231ps zmm7, zmm18, dword ptr [{q} + 12]{{1to16}}\nvpandd zmm11, zmm18, zmm17\nvpslld zmm15, zmm18, 4\n",
            "vfmadd231ps zmm0, zmm16, zmm17\nvfmadd231ps zmm4, zmm18, dword ptr [{q} + 16]{{1to16}}\nvpandd zmm8, zmm18, zmm17\nvpslld zmm12, zmm18, 4\n",
            "vfmadd231ps zmm1, zmm16, zmm17\nvfmadd231ps zmm5, zmm18, dword ptr [{q} + 20]{{1to16}}\nvpandd zmm9, zmm18, zmm17\nvpslld zmm13, zmm18, 4\n",
            "vfmadd231ps zmm2, zmm16, zmm17\nvfmadd231ps zmm6, zmm18, dword ptr [{q} + 24]{{1to16}}\nvpandd zmm10, zmm18, zmm17\nvpslld zmm14, zmm18, 4\n",
            "vfmadd231ps zmm3, zmm16, zmm17\nvfmadd231ps zmm7, zmm18, dword ptr [{q} + 28]{{1to16}}\nvpandd zmm11, zmm18, zmm17\n"));
        // GFNI's byte-wise affine map (one op could move a nibble and clear the rest of
        // its byte): on Zen 4 it runs 1.5x the 8 FMAs' time, as it takes their pipes.
        if std::arch::is_x86_feature_detected!("gfni") {
            probe!(
                "8 FMA + 4 vgf2p8affineqb",
                base,
                beside!("vgf2p8affineqb", "zmm18, zmm17, 0")
            );
            probe!(
                "8 FMA + 4 vgf2p8affineqb {k}{z}",
                base,
                concat!(
            "vfmadd231ps zmm0, zmm16, zmm17\nvgf2p8affineqb zmm8 {{k1}}{{z}}, zmm18, zmm17, 0\n",
            "vfmadd231ps zmm1, zmm16, zmm17\nvfmadd231ps zmm2, zmm16, zmm17\n",
            "vgf2p8affineqb zmm9 {{k1}}{{z}}, zmm18, zmm17, 0\n",
            "vfmadd231ps zmm3, zmm16, zmm17\nvfmadd231ps zmm4, zmm16, zmm17\n",
            "vgf2p8affineqb zmm10 {{k1}}{{z}}, zmm18, zmm17, 0\n",
            "vfmadd231ps zmm5, zmm16, zmm17\nvfmadd231ps zmm6, zmm16, zmm17\n",
            "vgf2p8affineqb zmm11 {{k1}}{{z}}, zmm18, zmm17, 0\n",
            "vfmadd231ps zmm7, zmm16, zmm17\n")
            );
            // The GFNI form of the low field's mix above: per 8 weight vectors 3 shifts, 4 ANDs and 4
            // masked affine ops (against twice the 8 FMAs).
            probe!("Q4_1 M = 1 x8, GFNI: + 4 vpandd + 4 affine {k}{z} + 3 shifts", 2.0 * base, concat!(
            "vfmadd231ps zmm0, zmm16, zmm17\nvfmadd231ps zmm4, zmm18, dword ptr [{q}]{{1to16}}\nvpandd zmm8, zmm18, zmm17\nvpslld zmm12, zmm18, 8\n",
            "vfmadd231ps zmm1, zmm16, zmm17\nvfmadd231ps zmm5, zmm18, dword ptr [{q} + 4]{{1to16}}\nvgf2p8affineqb zmm9 {{k1}}{{z}}, zmm18, zmm17, 0\n",
            "vfmadd231ps zmm2, zmm16, zmm17\nvfmadd231ps zmm6, zmm18, dword ptr [{q} + 8]{{1to16}}\nvpandd zmm10, zmm18, zmm17\nvpslld zmm13, zmm18, 16\n",
            "vfmadd231ps zmm3, zmm16, zmm17\nvfmadd231ps zmm7, zmm18, dword ptr [{q} + 12]{{1to16}}\nvgf2p8affineqb zmm11 {{k1}}{{z}}, zmm18, zmm17, 0\n",
            "vfmadd231ps zmm0, zmm16, zmm17\nvfmadd231ps zmm4, zmm18, dword ptr [{q} + 16]{{1to16}}\nvpandd zmm8, zmm18, zmm17\nvpsrld zmm14, zmm18, 8\n",
            "vfmadd231ps zmm1, zmm16, zmm17\nvfmadd231ps zmm5, zmm18, dword ptr [{q} + 20]{{1to16}}\nvgf2p8affineqb zmm9 {{k1}}{{z}}, zmm18, zmm17, 0\n",
            "vfmadd231ps zmm2, zmm16, zmm17\nvfmadd231ps zmm6, zmm18, dword ptr [{q} + 24]{{1to16}}\nvpandd zmm10, zmm18, zmm17\n",
            "vfmadd231ps zmm3, zmm16, zmm17\nvfmadd231ps zmm7, zmm18, dword ptr [{q} + 28]{{1to16}}\nvgf2p8affineqb zmm11 {{k1}}{{z}}, zmm18, zmm17, 0\n"));
        }
        probe!("Q4_1 M = 1, low field + 1 vinserti64x4 zmm, m256", base, concat!(
            "vinserti64x4 zmm14, zmm18, [{q} + 64], 1\n",
            "vfmadd231ps zmm0, zmm16, zmm17\nvfmadd231ps zmm4, zmm18, dword ptr [{q}]{{1to16}}\nvpandd zmm8, zmm18, zmm17\nvpslld zmm12, zmm18, 4\n",
            "vfmadd231ps zmm1, zmm16, zmm17\nvfmadd231ps zmm5, zmm18, dword ptr [{q} + 4]{{1to16}}\nvpandd zmm9, zmm18, zmm17\nvpslld zmm13, zmm18, 4\n",
            "vfmadd231ps zmm2, zmm16, zmm17\nvfmadd231ps zmm6, zmm18, dword ptr [{q} + 8]{{1to16}}\nvpandd zmm10, zmm18, zmm17\nvpslld zmm12, zmm18, 4\n",
            "vfmadd231ps zmm3, zmm16, zmm17\nvfmadd231ps zmm7, zmm18, dword ptr [{q} + 12]{{1to16}}\nvpandd zmm11, zmm18, zmm17\nvpslld zmm15, zmm18, 4\n"));
    }
}
