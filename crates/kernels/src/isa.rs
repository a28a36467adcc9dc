//! Run-time instruction-set selection.
//!
//! Detected once (`is_x86_feature_detected!`). `TESSERA_ISA` overrides the choice, so tests
//! and CI can run every path on one machine: `generic` forces the portable kernels, `avx2`
//! the AVX2+FMA kernels without the AVX-512 ones, `avx512` adds the exact path's AVX-512
//! kernels ([`avx512_exact`]) whatever they measured. Unset, the AVX-512 kernels run where
//! the CPU has them and they measured faster than the AVX2 ones ([`crate::variants`]). A
//! value the CPU cannot honour, or an unknown one, falls back to the best detected set with
//! a warning.
//!
//! AVX-512 is an extension of [`Isa::Avx2Fma`], not a separate [`Isa`]: every kernel keeps
//! its AVX2 form, and only the exact family's small-M kernel has an AVX-512 one, with the
//! same arithmetic (each 256-bit half of a 512-bit accumulator is one element's 8 lanes).

use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Generic,
    /// x86-64 with AVX2, FMA and F16C (Haswell, Zen and later).
    Avx2Fma,
}

/// What `TESSERA_ISA` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsaRequest {
    /// Unset: the best the CPU supports.
    Auto,
    Generic,
    Avx2,
    Avx512,
}

impl IsaRequest {
    /// Parses a `TESSERA_ISA` value (`None` when unset); an error names the valid values.
    pub fn parse(v: Option<&str>) -> Result<IsaRequest, String> {
        match v.map(str::trim) {
            None | Some("") => Ok(IsaRequest::Auto),
            Some("generic") => Ok(IsaRequest::Generic),
            Some("avx2") => Ok(IsaRequest::Avx2),
            Some("avx512") => Ok(IsaRequest::Avx512),
            Some(other) => Err(format!(
                "TESSERA_ISA={other:?} is not one of generic, avx2, avx512"
            )),
        }
    }
}

/// The instruction sets a CPU has, as far as the kernels care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuFeatures {
    pub avx2_fma: bool,
    /// AVX-512 F, BW, DQ and VL (Skylake-SP, Ice Lake, Sapphire Rapids, Zen 4 and later).
    pub avx512: bool,
}

impl CpuFeatures {
    pub fn detect() -> CpuFeatures {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2_fma = has!("avx2") && has!("fma") && has!("f16c");
            let avx512 = avx2_fma
                && has!("avx512f")
                && has!("avx512bw")
                && has!("avx512dq")
                && has!("avx512vl");
            CpuFeatures { avx2_fma, avx512 }
        }
        #[cfg(not(target_arch = "x86_64"))]
        CpuFeatures {
            avx2_fma: false,
            avx512: false,
        }
    }
}

/// The choice for a request on a CPU: the ISA, whether the AVX-512 exact kernels run, and a
/// warning when the request could not be honoured.
pub fn resolve(req: IsaRequest, cpu: CpuFeatures) -> (Isa, bool, Option<String>) {
    let best = if cpu.avx2_fma {
        Isa::Avx2Fma
    } else {
        Isa::Generic
    };
    match req {
        IsaRequest::Auto => (best, cpu.avx512, None),
        IsaRequest::Generic => (Isa::Generic, false, None),
        IsaRequest::Avx2 if cpu.avx2_fma => (Isa::Avx2Fma, false, None),
        IsaRequest::Avx512 if cpu.avx512 => (Isa::Avx2Fma, true, None),
        IsaRequest::Avx2 | IsaRequest::Avx512 => (
            best,
            false,
            Some(format!(
                "TESSERA_ISA asks for {req:?} but this CPU lacks it; using {}",
                best.name_plain()
            )),
        ),
    }
}

/// The ISA, whether the AVX-512 exact kernels may run, and whether `TESSERA_ISA=avx512`
/// asked for them by name.
fn selection() -> (Isa, bool, bool) {
    static SEL: OnceLock<(Isa, bool, bool)> = OnceLock::new();
    *SEL.get_or_init(|| {
        let raw = std::env::var("TESSERA_ISA").ok();
        let cpu = CpuFeatures::detect();
        let req = IsaRequest::parse(raw.as_deref()).unwrap_or_else(|e| {
            eprintln!("warning: {e}; using the detected instruction set");
            IsaRequest::Auto
        });
        let (isa, avx512, warning) = resolve(req, cpu);
        if let Some(w) = warning {
            eprintln!("warning: {w}");
        }
        (isa, avx512, avx512 && req == IsaRequest::Avx512)
    })
}

/// Whether the AVX-512 exact kernels may run here (the CPU has AVX-512 F/BW/DQ/VL and
/// `TESSERA_ISA` asks for neither `avx2` nor `generic`), and whether `TESSERA_ISA=avx512`
/// asked for them by name. Whether they do run is [`crate::variants`]' measured choice.
pub fn avx512_request() -> (bool, bool) {
    let (_, allowed, forced) = selection();
    (allowed, forced)
}

/// Whether the CPU is AMD's (the vendor string of CPUID leaf 0): its AVX-512 (Zen 4) runs
/// 512-bit operations on 256-bit units, so its built-in cost profile differs from Intel's.
pub fn cpu_is_amd() -> bool {
    crate::variants::CpuClass::detect().is_amd()
}

/// Whether the exact family's AVX-512 kernels run in this process: they may
/// ([`avx512_request`]) and they measured faster than the AVX2 kernels on this CPU class
/// ([`crate::variants`], or `TESSERA_ISA=avx512` asked for them). Implies
/// `Isa::active() == Isa::Avx2Fma`.
pub fn avx512_exact() -> bool {
    selection().1 && crate::variants::active().has(crate::variants::Variant::Avx512)
}

/// Whether the ggml types' exact-path decode runs on AVX-512 in this process (allowed, and
/// measured faster than its AVX2 twin: [`crate::variants::Variant::GgmlAvx512`]).
pub fn avx512_ggml_decode() -> bool {
    selection().1 && crate::variants::active().has(crate::variants::Variant::GgmlAvx512)
}

/// Whether the fast path's integer dots on the ggml types run on AVX-512 in this process
/// ([`crate::variants::Variant::QkAvx512`]).
pub fn avx512_qk() -> bool {
    selection().1 && crate::variants::active().has(crate::variants::Variant::QkAvx512)
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        resolve(IsaRequest::Auto, CpuFeatures::detect()).0
    }

    /// The instruction set kernels use in this process.
    pub fn active() -> Isa {
        selection().0
    }

    fn name_plain(self) -> &'static str {
        match self {
            Isa::Generic => "generic",
            Isa::Avx2Fma => "avx2+fma",
        }
    }

    /// Its name; for the active AVX2 set, with `+avx512` when the AVX-512 kernels run too.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx2Fma if self == Isa::active() && avx512_exact() => "avx2+fma+avx512",
            _ => self.name_plain(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_bad_values_are_errors() {
        assert_eq!(IsaRequest::parse(None), Ok(IsaRequest::Auto));
        assert_eq!(IsaRequest::parse(Some("")), Ok(IsaRequest::Auto));
        assert_eq!(IsaRequest::parse(Some("generic")), Ok(IsaRequest::Generic));
        assert_eq!(IsaRequest::parse(Some("avx2")), Ok(IsaRequest::Avx2));
        assert_eq!(IsaRequest::parse(Some(" avx512 ")), Ok(IsaRequest::Avx512));
        let e = IsaRequest::parse(Some("sse9")).unwrap_err();
        assert!(e.contains("sse9") && e.contains("avx2"), "{e}");
    }

    #[test]
    fn requests_resolve_against_the_cpu() {
        let full = CpuFeatures {
            avx2_fma: true,
            avx512: true,
        };
        let avx2 = CpuFeatures {
            avx2_fma: true,
            avx512: false,
        };
        let none = CpuFeatures {
            avx2_fma: false,
            avx512: false,
        };
        assert_eq!(resolve(IsaRequest::Auto, full), (Isa::Avx2Fma, true, None));
        assert_eq!(resolve(IsaRequest::Avx2, full), (Isa::Avx2Fma, false, None));
        assert_eq!(
            resolve(IsaRequest::Generic, full),
            (Isa::Generic, false, None)
        );
        assert_eq!(resolve(IsaRequest::Auto, avx2), (Isa::Avx2Fma, false, None));
        let (isa, on, warn) = resolve(IsaRequest::Avx512, avx2);
        assert_eq!((isa, on), (Isa::Avx2Fma, false));
        assert!(warn.unwrap().contains("lacks"));
        let (isa, on, warn) = resolve(IsaRequest::Avx2, none);
        assert_eq!((isa, on), (Isa::Generic, false));
        assert!(warn.is_some());
        assert_eq!(resolve(IsaRequest::Auto, none), (Isa::Generic, false, None));
    }
}
