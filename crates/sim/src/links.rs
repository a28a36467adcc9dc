//! Link presets for `tessera simulate`, and what a ring all-reduce over one costs.

use tessera_parallel::link::CommCost;

/// A link between ranks: one-way latency and per-direction bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    pub name: &'static str,
    pub latency_us: f64,
    pub gbytes_per_s: f64,
}

/// The presets, by the names `tessera simulate --link` takes.
pub const PRESETS: [(&str, Link); 5] = [
    // NVLink 4 (H100 SXM): 450 GB/s per direction; NCCL's small-message latency.
    (
        "nvlink",
        Link {
            name: "NVLink",
            latency_us: 3.0,
            gbytes_per_s: 450.0,
        },
    ),
    // PCIe 4.0 x16: 32 GB/s raw, ~25 effective.
    (
        "pcie4",
        Link {
            name: "PCIe 4.0 x16",
            latency_us: 5.0,
            gbytes_per_s: 25.0,
        },
    ),
    (
        "100gbe",
        Link {
            name: "100 GbE",
            latency_us: 10.0,
            gbytes_per_s: 12.0,
        },
    ),
    (
        "10gbe",
        Link {
            name: "10 GbE",
            latency_us: 25.0,
            gbytes_per_s: 1.2,
        },
    ),
    (
        "1gbe",
        Link {
            name: "1 GbE",
            latency_us: 50.0,
            gbytes_per_s: 0.12,
        },
    ),
];

impl Link {
    pub fn preset(name: &str) -> Option<Link> {
        let n = name.to_ascii_lowercase();
        PRESETS.iter().find(|(k, _)| *k == n).map(|(_, l)| *l)
    }

    /// A ring all-reduce over `ranks` ranks (reduce-scatter then all-gather): 2(R−1) steps,
    /// each one latency and 1/R of the buffer.
    pub fn ring_all_reduce(&self, ranks: usize) -> CommCost {
        if ranks <= 1 {
            return CommCost::FREE;
        }
        let steps = 2.0 * (ranks - 1) as f64;
        CommCost {
            latency_s: steps * self.latency_us * 1e-6,
            secs_per_byte: steps / ranks as f64 * 1e-9 / self.gbytes_per_s,
            points: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_moves_two_buffers_minus_a_share() {
        let l = Link::preset("10GbE").unwrap();
        let c = l.ring_all_reduce(8);
        let bytes = 1 << 30;
        let expect = 14.0 * 25e-6 + 2.0 * 7.0 / 8.0 * bytes as f64 / 1.2e9;
        assert!((c.secs(bytes) - expect).abs() < 1e-9);
        assert_eq!(l.ring_all_reduce(1), CommCost::FREE);
        assert!(Link::preset("token-ring").is_none());
    }
}
