//! Kernel variants whose speed depends on the microarchitecture, chosen by measuring them on
//! the CPU at hand.
//!
//! Some kernels have a variant that wins on one core and loses badly on another, with the
//! same results: the low-field decodes of Q4_1 and Q8_0 (`x86::avx512_decode`) feed
//! subnormal floats to the FMAs, free on AMD's Zen 4 and a microcode assist per instruction
//! on Intel's cores (about 90x the FMA's time); 512-bit lanes against the AVX2 kernels'
//! 256-bit ones depend on how a core issues 512-bit operations. Each [`Variant`] has a more
//! portable twin, and the first time Tessera runs on a CPU class it times every variant the
//! CPU supports against its twin ([`qualify`], a fraction of a second) and takes a variant
//! only where it measured faster ([`decide`]). The result is cached per CPU class (vendor,
//! family, model, stepping) and kernel set ([`KERNEL_SET`]) in
//! `<cache>/kernel-variants.json`, beside the tuning cache.
//!
//! `TESSERA_KERNEL_CHECK` steers it: unset or `auto` (the cached result, else measure and
//! cache), `remeasure` (measure again and replace the cached result), `skip` (measure
//! nothing: the cached result if there is one, else no variant, only the portable twins: a
//! variant never runs on a CPU class where it was not measured). `TESSERA_ISA=avx2` or `generic` turns
//! the AVX-512 kernels off, `TESSERA_ISA=avx512` on, whatever was measured. Whichever variant
//! runs, every result is bitwise the same (the kernels' tests check it), so the choice
//! changes speed only.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tessera_core::DType;

#[cfg(target_arch = "x86_64")]
pub mod qualify;

/// Identifies the variant code that measurements were taken of: a cached choice made with an
/// older kernel set is measured again. Change it whenever a variant or its twin changes.
pub const KERNEL_SET: &str = "exact-avx512/2";

/// A kernel variant that runs only where it measured faster than its portable twin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The exact path's AVX-512 kernels (16-row stream tiles, 512-bit packed and
    /// outer-product tiles); twin: the AVX2 kernels over the same records.
    Avx512,
    /// Q4_1's low-field decode (subnormal floats into the FMAs); twin: the general decode
    /// (quants converted to floats, then the reference's FMA).
    LowFieldQ4_1,
    /// Q8_0's low-field decode; twin: the general decode.
    LowFieldQ8_0,
    /// The ggml types' (Q5_x, K-quants, IQ4_x) decode to f32 for the exact path in 512-bit
    /// registers; twin: the AVX2 decode.
    GgmlAvx512,
    /// The fast path's integer dots on the ggml types in 512-bit registers (with VNNI where
    /// the CPU has it); twin: the AVX2 integer dots.
    QkAvx512,
}

impl Variant {
    pub const ALL: [Variant; 5] = [
        Variant::Avx512,
        Variant::LowFieldQ4_1,
        Variant::LowFieldQ8_0,
        Variant::GgmlAvx512,
        Variant::QkAvx512,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Avx512 => "avx512",
            Variant::LowFieldQ4_1 => "q4_1-low-field",
            Variant::LowFieldQ8_0 => "q8_0-low-field",
            Variant::GgmlAvx512 => "ggml-decode-avx512",
            Variant::QkAvx512 => "qk-dot-avx512",
        }
    }

    /// What runs in its place.
    pub fn twin(self) -> &'static str {
        match self {
            Variant::Avx512 => "avx2",
            Variant::LowFieldQ4_1 | Variant::LowFieldQ8_0 => "general decode",
            Variant::GgmlAvx512 => "avx2 decode",
            Variant::QkAvx512 => "avx2 integer dots",
        }
    }

    pub fn from_name(s: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == s)
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VariantSet(u8);

impl VariantSet {
    pub const NONE: VariantSet = VariantSet(0);

    pub fn of(vs: &[Variant]) -> VariantSet {
        VariantSet(vs.iter().fold(0, |b, v| b | v.bit()))
    }

    pub fn has(self, v: Variant) -> bool {
        self.0 & v.bit() != 0
    }

    pub fn with(self, v: Variant, on: bool) -> VariantSet {
        if on {
            VariantSet(self.0 | v.bit())
        } else {
            VariantSet(self.0 & !v.bit())
        }
    }

    pub fn iter(self) -> impl Iterator<Item = Variant> {
        Variant::ALL.into_iter().filter(move |&v| self.has(v))
    }
}

/// One variant timed against its twin on the same work (medians, nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    #[serde(with = "variant_name")]
    pub variant: Variant,
    pub variant_ns: f64,
    pub twin_ns: f64,
}

impl Timing {
    /// Twin time over variant time: above 1 the variant is faster.
    pub fn speedup(&self) -> f64 {
        self.twin_ns / self.variant_ns
    }
}

mod variant_name {
    use super::Variant;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Variant, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Variant, D::Error> {
        let s = String::deserialize(d)?;
        Variant::from_name(&s).ok_or_else(|| serde::de::Error::custom(format!("variant {s:?}")))
    }
}

/// The variants to run: of those `supported`, each that has a timing and measured strictly
/// faster than its twin. A variant without a timing, or one that measured slower or level,
/// is not chosen; nor are the low-field decodes without [`Variant::Avx512`] (they are
/// decodes inside its kernels).
pub fn decide(supported: VariantSet, timings: &[Timing]) -> VariantSet {
    let mut chosen = VariantSet::NONE;
    for v in supported.iter() {
        let faster = timings
            .iter()
            .filter(|t| t.variant == v)
            .all(|t| t.variant_ns.is_finite() && t.variant_ns < t.twin_ns);
        let timed = timings.iter().any(|t| t.variant == v);
        chosen = chosen.with(v, timed && faster);
    }
    if !chosen.has(Variant::Avx512) {
        chosen = chosen
            .with(Variant::LowFieldQ4_1, false)
            .with(Variant::LowFieldQ8_0, false);
    }
    chosen
}

/// A CPU class: what a measured choice is kept for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuClass {
    pub vendor: String,
    pub family: u32,
    pub model: u32,
    pub stepping: u32,
}

impl CpuClass {
    /// This CPU, from CPUID leaves 0 and 1.
    pub fn detect() -> CpuClass {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: CPUID leaves 0 and 1 exist on every x86-64 CPU (`__cpuid` is safe on
            // newer toolchains, unsafe on older ones).
            #[allow(unused_unsafe)]
            let (l0, l1) =
                unsafe { (std::arch::x86_64::__cpuid(0), std::arch::x86_64::__cpuid(1)) };
            let mut v = Vec::with_capacity(12);
            v.extend_from_slice(&l0.ebx.to_le_bytes());
            v.extend_from_slice(&l0.edx.to_le_bytes());
            v.extend_from_slice(&l0.ecx.to_le_bytes());
            let (family, model, stepping) = decode_signature(l1.eax);
            CpuClass {
                vendor: String::from_utf8_lossy(&v).into_owned(),
                family,
                model,
                stepping,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        CpuClass {
            vendor: std::env::consts::ARCH.to_string(),
            family: 0,
            model: 0,
            stepping: 0,
        }
    }

    /// The cache key: `GenuineIntel/6/143/8`.
    pub fn key(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.vendor, self.family, self.model, self.stepping
        )
    }

    pub fn is_amd(&self) -> bool {
        self.vendor == "AuthenticAMD"
    }
}

/// Family, model and stepping from CPUID leaf 1's EAX, with the extended fields as Intel and
/// AMD define them (the extended family adds where the base family is 15; the extended model
/// is the model's high nibble where the family is 6 or 15).
pub fn decode_signature(eax: u32) -> (u32, u32, u32) {
    let stepping = eax & 0xf;
    let base_model = (eax >> 4) & 0xf;
    let base_family = (eax >> 8) & 0xf;
    let ext_model = (eax >> 16) & 0xf;
    let ext_family = (eax >> 20) & 0xff;
    let family = if base_family == 0xf {
        base_family + ext_family
    } else {
        base_family
    };
    let model = if base_family == 0x6 || base_family == 0xf {
        (ext_model << 4) | base_model
    } else {
        base_model
    };
    (family, model, stepping)
}

/// Where the choice came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Timed in this process, taking this many seconds.
    Measured(f64),
    /// Read from the cache (timed by an earlier process on this CPU class).
    Cached,
    /// `TESSERA_KERNEL_CHECK=skip` with nothing cached.
    Unmeasured,
    /// No variant is supported here (no AVX-512, or `TESSERA_ISA` turned it off).
    NotApplicable,
}

/// The choice in force for this process.
#[derive(Debug, Clone)]
pub struct Selection {
    pub class: CpuClass,
    pub supported: VariantSet,
    pub chosen: VariantSet,
    pub timings: Vec<Timing>,
    pub source: Source,
    /// Why the cache could not be read or written, if it could not.
    pub cache_error: Option<String>,
    /// `TESSERA_ISA=avx512` asked for the AVX-512 kernels, whatever they measured.
    pub forced: bool,
}

impl Selection {
    /// The start-up line: which variants run, which were refused and why.
    pub fn summary(&self) -> String {
        let how = match self.source {
            Source::Measured(s) => format!("measured now in {s:.2} s"),
            Source::Cached => "measured earlier, cached".to_string(),
            Source::Unmeasured => "not measured (TESSERA_KERNEL_CHECK=skip)".to_string(),
            Source::NotApplicable => {
                "none apply: no AVX-512 here, or TESSERA_ISA turned it off".to_string()
            }
        };
        let mut parts = Vec::new();
        for v in self.supported.iter() {
            let verdict = match (self.chosen.has(v), self.forced && v == Variant::Avx512) {
                (true, true) => "taken by TESSERA_ISA=avx512",
                (true, false) => "taken",
                (false, _) => "refused",
            };
            match self.timings.iter().find(|t| t.variant == v) {
                Some(t) => parts.push(format!(
                    "{verdict} {} ({:.2}x {})",
                    v.name(),
                    t.speedup(),
                    v.twin()
                )),
                None => parts.push(format!("{verdict} {}", v.name())),
            }
        }
        let list = if parts.is_empty() {
            String::new()
        } else {
            format!(": {}", parts.join(", "))
        };
        format!("kernel variants for {} ({how}){list}", self.class.key())
    }
}

/// The cache file (`<cache>/kernel-variants.json`).
pub fn cache_path() -> PathBuf {
    tessera_core::cache_dir().join("kernel-variants.json")
}

/// One cached choice.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    kernel_set: String,
    timings: Vec<Timing>,
}

type CacheFile = std::collections::BTreeMap<String, Entry>;

fn read_cache(path: &std::path::Path) -> Result<CacheFile, String> {
    read_json(path)
}

fn write_cache(path: &std::path::Path, file: &CacheFile) -> Result<(), String> {
    write_json(path, file)
}

/// A JSON cache file's contents; a missing file is the empty value. Shared by the variant
/// cache and the measured cost profiles (`crate::cost::measured`).
pub(crate) fn read_json<T: serde::de::DeserializeOwned + Default>(
    path: &std::path::Path,
) -> Result<T, String> {
    match std::fs::read_to_string(path) {
        Ok(s) => serde_json::from_str(&s).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Writes a JSON cache file whole (a temporary file renamed over it, so a reader never sees
/// half of one).
pub(crate) fn write_json<T: Serialize>(path: &std::path::Path, value: &T) -> Result<(), String> {
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(err)?;
    }
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    let s = serde_json::to_string_pretty(value).expect("a cache serialises");
    std::fs::write(&tmp, s).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// What `TESSERA_KERNEL_CHECK` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckMode {
    Auto,
    Remeasure,
    Skip,
}

impl CheckMode {
    pub fn parse(v: Option<&str>) -> Result<CheckMode, String> {
        match v.map(str::trim) {
            None | Some("") | Some("auto") => Ok(CheckMode::Auto),
            Some("remeasure") => Ok(CheckMode::Remeasure),
            Some("skip") | Some("off") | Some("0") => Ok(CheckMode::Skip),
            Some(o) => Err(format!(
                "TESSERA_KERNEL_CHECK={o:?} is not one of auto, remeasure, skip"
            )),
        }
    }
}

/// Makes the choice for a CPU class: the cached timings where they are for this class and
/// kernel set (and `mode` is not `Remeasure`), else `measure()` (cached after), or with
/// `Skip` and nothing cached, no variant (never one unmeasured on this class). `cache` is `None` where no file may be
/// read or written.
pub fn select(
    class: CpuClass,
    supported: VariantSet,
    mode: CheckMode,
    cache: Option<&std::path::Path>,
    measure: &mut dyn FnMut() -> Vec<Timing>,
) -> Selection {
    let mut sel = Selection {
        chosen: VariantSet::NONE,
        supported,
        timings: Vec::new(),
        source: Source::NotApplicable,
        cache_error: None,
        forced: false,
        class,
    };
    if supported == VariantSet::NONE {
        return sel;
    }
    let key = sel.class.key();
    let mut file = match cache.map(read_cache) {
        Some(Ok(f)) => f,
        Some(Err(e)) => {
            sel.cache_error = Some(e);
            CacheFile::new()
        }
        None => CacheFile::new(),
    };
    let cached = file
        .get(&key)
        .filter(|e| e.kernel_set == KERNEL_SET)
        // Every supported variant timed, or the entry is of a narrower run: measure again.
        .filter(|e| {
            supported
                .iter()
                .all(|v| e.timings.iter().any(|t| t.variant == v))
        })
        .cloned();
    match (mode, cached) {
        (CheckMode::Auto | CheckMode::Skip, Some(e)) => {
            sel.timings = e.timings;
            sel.source = Source::Cached;
        }
        (CheckMode::Skip, None) => {
            sel.chosen = VariantSet::NONE;
            sel.source = Source::Unmeasured;
            return sel;
        }
        (_, _) => {
            let t = Instant::now();
            sel.timings = measure();
            sel.source = Source::Measured(t.elapsed().as_secs_f64());
            if let Some(path) = cache {
                file.insert(
                    key,
                    Entry {
                        kernel_set: KERNEL_SET.to_string(),
                        timings: sel.timings.clone(),
                    },
                );
                if let Err(e) = write_cache(path, &file) {
                    sel.cache_error = Some(e);
                }
            }
        }
    }
    sel.chosen = decide(supported, &sel.timings);
    sel
}

/// The choice in force in this process, made on first use (see the module's documentation).
pub fn selection() -> &'static Selection {
    static SEL: OnceLock<Selection> = OnceLock::new();
    SEL.get_or_init(|| {
        let (supported, forced) = crate::isa::avx512_request();
        let mode = CheckMode::parse(std::env::var("TESSERA_KERNEL_CHECK").ok().as_deref())
            .unwrap_or_else(|e| {
                eprintln!("warning: {e}; measuring as `auto` does");
                CheckMode::Auto
            });
        let supported_set = if supported {
            VariantSet::of(&Variant::ALL)
        } else {
            VariantSet::NONE
        };
        let path = cache_path();
        let mut sel = select(
            CpuClass::detect(),
            supported_set,
            mode,
            Some(&path),
            &mut measure,
        );
        if forced && supported {
            // `TESSERA_ISA=avx512`: the AVX-512 kernels whatever was measured.
            sel.chosen = sel
                .chosen
                .with(Variant::Avx512, true)
                .with(Variant::GgmlAvx512, true)
                .with(Variant::QkAvx512, true);
            sel.forced = true;
        }
        if let Some(e) = &sel.cache_error {
            eprintln!("warning: kernel variant cache: {e}");
        }
        sel
    })
}

/// Times every variant against its twin on this CPU (nothing where it is not x86-64).
pub fn measure() -> Vec<Timing> {
    #[cfg(target_arch = "x86_64")]
    {
        qualify::qualify()
    }
    #[cfg(not(target_arch = "x86_64"))]
    Vec::new()
}

/// The variants running in this process.
pub fn active() -> VariantSet {
    selection().chosen
}

/// [`override_low_field`]'s setting: 0 none, 1 off, 2 on.
static LOW_FIELD_OVERRIDE: AtomicU8 = AtomicU8::new(0);

/// Runs the low-field decodes (`Some(true)`) or the general ones (`Some(false)`) from now on
/// in this process, whatever was measured; `None` goes back to the measured choice. For the
/// benchmarks and tests that compare the two (results are the same bits either way).
pub fn override_low_field(on: Option<bool>) {
    let v = match on {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    };
    LOW_FIELD_OVERRIDE.store(v, Ordering::Relaxed);
}

/// Whether the AVX-512 kernels decode `dtype`'s fast records by the low field.
pub fn low_field(dtype: DType) -> bool {
    match LOW_FIELD_OVERRIDE.load(Ordering::Relaxed) {
        1 => return false,
        2 => return matches!(dtype, DType::Q4_1 | DType::Q8_0),
        _ => {}
    }
    match dtype {
        DType::Q4_1 => active().has(Variant::LowFieldQ4_1),
        DType::Q8_0 => active().has(Variant::LowFieldQ8_0),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
