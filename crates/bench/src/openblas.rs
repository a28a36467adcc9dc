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

impl OpenBlas {
    /// Loads the first available library and sets its thread count; `None` if none loads or
    /// none has `cblas_sgemm`.
    pub fn load(threads: usize) -> Option<Self> {
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
