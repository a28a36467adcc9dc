//! The kernels' PTX, compiled ahead from `kernels/*.cu` by `scripts/cuda-ptx.sh` (NVRTC
//! 12.9, sm_90) and committed, so that a machine running Tessera needs only the driver
//! (`libcuda.so.1`), which compiles the PTX for its GPU when a module is loaded. CI
//! recompiles the sources and fails if the committed PTX differs (`cuda-ptx.sh --check`).

/// Each module's name and PTX text.
pub const MODULES: [(&str, &str); 3] = [
    ("attention", include_str!("../ptx/attention.ptx")),
    ("matmul", include_str!("../ptx/matmul.ptx")),
    ("ops", include_str!("../ptx/ops.ptx")),
];

/// The kernels (`.entry` functions) a PTX text defines, in order.
pub fn entry_points(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|rest| rest.split(['(', ' ']).next().unwrap_or(rest))
        .collect()
}

/// The `.target` a PTX text was compiled for (`sm_90`).
pub fn target(ptx: &str) -> Option<&str> {
    ptx.lines()
        .find_map(|l| l.trim().strip_prefix(".target "))
        .map(str::trim)
}

/// The module holding kernel `name`, if any does.
pub fn module_of(name: &str) -> Option<&'static str> {
    MODULES
        .iter()
        .find(|(_, ptx)| entry_points(ptx).contains(&name))
        .map(|(m, _)| *m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_targets_sm_90_and_defines_kernels() {
        for (name, ptx) in MODULES {
            assert_eq!(target(ptx), Some("sm_90"), "{name}");
            assert!(!entry_points(ptx).is_empty(), "{name}");
            // NUL-free: the driver reads the text as a C string.
            assert!(!ptx.contains('\0'), "{name}");
        }
    }

    #[test]
    fn every_kernel_the_forward_launches_is_embedded() {
        for k in crate::kernels::ALL {
            assert!(
                module_of(k).is_some(),
                "kernel {k} is not in the embedded PTX"
            );
        }
        for f in crate::formats::FORMATS {
            for k in [f.matmul, f.embed] {
                assert!(
                    module_of(k).is_some(),
                    "kernel {k} is not in the embedded PTX"
                );
            }
        }
        assert_eq!(module_of("no_such_kernel"), None);
    }

    #[test]
    fn entry_points_are_read_off_the_text() {
        let ptx = ".version 8.8\n.target sm_90\n.visible .entry foo(\n.param .u64 a\n)\n\
                   .visible .entry bar_Q4_K(\n";
        assert_eq!(entry_points(ptx), ["foo", "bar_Q4_K"]);
        assert_eq!(target(ptx), Some("sm_90"));
    }
}
