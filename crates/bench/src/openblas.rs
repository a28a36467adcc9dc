//! OpenBLAS `cblas_sgemm`, loaded at run time so the benchmark builds and runs without it.

use std::os::raw::c_int;

use libloading::Library;

type SgemmFn = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    f32,
    *const f32,
    c_int,
    *const f32,
    c_int,
    f32,
    *mut f32,
    c_int,
);
type SetThreadsFn = unsafe extern "C" fn(c_int);

const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;

/// Library names tried in order.
pub const CANDIDATES: [&str; 4] = [
    "libopenblas.so.0",
    "libopenblas.so",
    "libblas.so.3",
    "libcblas.so.3",
];

/// How to get the library when it is missing.
pub const INSTALL_HINT: &str = "apt-get install libopenblas0-pthread";

pub struct OpenBlas {
    sgemm: SgemmFn,
    /// Which file was loaded.
    pub name: &'static str,
    /// Whether `openblas_set_num_threads` was found (a reference BLAS has none).
    pub threads_set: bool,
    _lib: Library,
}

/// OpenBLAS's environment variable for how long its idle threads spin before they sleep:
/// 2^N cycles, N from 4 to 30, read once when the library loads.
const THREAD_TIMEOUT_VAR: &str = "OPENBLAS_THREAD_TIMEOUT";

/// Unless the user set it, the shortest spin (2^4 cycles), so OpenBLAS's threads sleep as
/// soon as a call returns. With the default (2^28 cycles, ~0.1 s) the contender that `bench
/// gemm` times right after OpenBLAS lost more than half of its speed, even after a 300 ms
/// pause (Emerald Rapids Xeon, 2 units: 512 × 576 × 576 f32 ran 58 GFLOP/s in those rounds
/// against 143 when timed apart; with the short spin 139 against 134). OpenBLAS's own figures
/// did not drop (192-201 GFLOP/s at M = 512, against 133-203 with the default).
fn quiet_idle_threads() {
    if std::env::var_os(THREAD_TIMEOUT_VAR).is_none() {
        // Before the library loads (it reads the variable then); nothing else in the
        // process reads the environment meanwhile.
        std::env::set_var(THREAD_TIMEOUT_VAR, "4");
    }
}

impl OpenBlas {
    /// Loads the first available library and sets its thread count; `None` if none loads or
    /// none has `cblas_sgemm`.
    pub fn load(threads: usize) -> Option<Self> {
        quiet_idle_threads();
        for name in CANDIDATES {
            // SAFETY: loading a system BLAS runs its initialisers, which have no
            // preconditions on us.
            let Ok(lib) = (unsafe { Library::new(name) }) else {
                continue;
            };
            // SAFETY: the symbol has the standard CBLAS signature.
            let Ok(sgemm) = (unsafe { lib.get::<SgemmFn>(b"cblas_sgemm\0") }) else {
                continue;
            };
            let sgemm = *sgemm;
            // SAFETY: OpenBLAS's `void openblas_set_num_threads(int)`.
            let threads_set =
                match unsafe { lib.get::<SetThreadsFn>(b"openblas_set_num_threads\0") } {
                    Ok(f) => {
                        unsafe { f(threads.max(1) as c_int) };
                        true
                    }
                    Err(_) => false,
                };
            return Some(OpenBlas {
                sgemm,
                name,
                threads_set,
                _lib: lib,
            });
        }
        None
    }

    /// `c[m, n] = a[m, k] · b[n, k]ᵀ`, all row-major.
    pub fn sgemm_abt(&self, a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
        assert!(a.len() >= m * k && b.len() >= n * k && c.len() >= m * n);
        let (mi, ki, ni) = (m as c_int, k as c_int, n as c_int);
        // SAFETY: the slices hold the extents checked above; lda = ldb = k, ldc = n.
        unsafe {
            (self.sgemm)(
                ROW_MAJOR,
                NO_TRANS,
                TRANS,
                mi,
                ni,
                ki,
                1.0,
                a.as_ptr(),
                ki,
                b.as_ptr(),
                ki,
                0.0,
                c.as_mut_ptr(),
                ni,
            )
        }
    }
}
