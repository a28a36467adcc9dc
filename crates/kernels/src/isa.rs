//! Run-time instruction-set selection.
//!
//! Detected once (`is_x86_feature_detected!`); `TESSERA_ISA=generic` forces the portable
//! kernels (tests use it to compare paths).

use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Generic,
    /// x86-64 with AVX2, FMA and F16C (Haswell, Zen and later).
    Avx2Fma,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return Isa::Avx2Fma;
            }
        }
        Isa::Generic
    }

    /// The instruction set kernels use in this process.
    pub fn active() -> Isa {
        static ACTIVE: OnceLock<Isa> = OnceLock::new();
        *ACTIVE.get_or_init(|| match std::env::var("TESSERA_ISA").as_deref() {
            Ok("generic") => Isa::Generic,
            _ => Isa::detect(),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Generic => "generic",
            Isa::Avx2Fma => "avx2+fma",
        }
    }
}
