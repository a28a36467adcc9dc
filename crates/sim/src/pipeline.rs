//! The pipelined forward's schedule, simulated: one compute resource runs every stage of
//! every sub-batch in the forward's order, one communication resource runs every all-reduce
//! first-in first-out, and stage k + 1 of a sub-batch waits for the reduction of its stage k.
//!
//! The order mirrors `LlamaModel::forward_pipelined`: for each layer, the attention stage of
//! sub-batches 0..S (each waiting for its previous MLP sum), then the MLP stage of 0..S (each
//! waiting for its attention sum); each stage's output is handed to the communication
//! resource as soon as it is computed.

/// What one sub-batch costs: each stage's compute on one rank and the all-reduce of its
/// output (seconds), and how much of that all-reduce's time it takes from the compute
/// resource (a communication thread summing on the core the rank computes on).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SubCost {
    pub attn: f64,
    pub mlp: f64,
    pub reduce: f64,
    pub reduce_cpu: f64,
}

/// A step's predicted times (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepEstimate {
    /// The whole step, pipelined.
    pub step: f64,
    /// Compute alone (every stage, embedding and head, nothing waited for).
    pub compute: f64,
    /// Communication alone (every all-reduce and the logits gather, back to back).
    pub comm: f64,
}

impl StepEstimate {
    /// The share of communication hidden relative to running the same step with nothing
    /// overlapped (`step == compute + comm`): 1 when the step takes its compute time alone.
    pub fn hidden(&self) -> f64 {
        if self.comm <= 0.0 {
            return 0.0;
        }
        ((self.compute + self.comm - self.step) / self.comm).clamp(0.0, 1.0)
    }
}

/// The time of `layers` layers over sub-batches costing `subs`, after a prologue of `pre`
/// (compute) + `pre_comm` (a blocking reduction) and before an epilogue of `post` +
/// `post_comm`, neither overlapped.
pub fn pipelined(
    layers: usize,
    subs: &[SubCost],
    pre: f64,
    pre_comm: f64,
    post: f64,
    post_comm: f64,
) -> StepEstimate {
    let start = pre + pre_comm;
    let mut compute_free = start;
    let mut comm_free = start;
    let mut landed = vec![start; subs.len()];
    for _ in 0..layers {
        for stage in 0..2 {
            for (i, s) in subs.iter().enumerate() {
                let work = if stage == 0 { s.attn } else { s.mlp };
                let begin = compute_free.max(landed[i]);
                compute_free = begin + work;
                let sent = comm_free.max(compute_free);
                comm_free = sent + s.reduce;
                landed[i] = comm_free;
                // The reduction's own CPU time delays whatever the compute resource does next.
                compute_free += s.reduce_cpu;
            }
        }
    }
    let end = landed.iter().copied().fold(compute_free, f64::max);
    let per_layer_compute: f64 = subs.iter().map(|s| s.attn + s.mlp).sum();
    let per_layer_comm: f64 = subs.iter().map(|s| 2.0 * s.reduce).sum();
    StepEstimate {
        step: end + post + post_comm,
        compute: pre + post + layers as f64 * per_layer_compute,
        comm: pre_comm + post_comm + layers as f64 * per_layer_comm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sub(attn: f64, mlp: f64, reduce: f64) -> SubCost {
        SubCost {
            attn,
            mlp,
            reduce,
            reduce_cpu: 0.0,
        }
    }

    #[test]
    fn reductions_that_take_the_compute_core_hide_nothing() {
        let free = pipelined(4, &[sub(2.0, 2.0, 1.0); 2], 0.0, 0.0, 0.0, 0.0);
        let busy = SubCost {
            reduce_cpu: 1.0,
            ..sub(2.0, 2.0, 1.0)
        };
        let shared = pipelined(4, &[busy; 2], 0.0, 0.0, 0.0, 0.0);
        assert!(shared.step > free.step);
        // Every reduction's time lands on the compute resource: compute + comm in all.
        assert!(
            (shared.step - (shared.compute + shared.comm)).abs() < 1e-9,
            "{shared:?}"
        );
        // One sub-batch waits for its sums anyway: sharing changes nothing there.
        let one = |s| pipelined(3, &[s], 0.0, 0.0, 0.0, 0.0).step;
        assert_eq!(one(sub(2.0, 2.0, 1.0)), one(busy));
    }

    #[test]
    fn one_sub_batch_exposes_every_reduction() {
        let e = pipelined(3, &[sub(2.0, 3.0, 1.0)], 0.5, 0.25, 0.5, 0.25);
        assert_eq!(e.step, 0.75 + 3.0 * (2.0 + 1.0 + 3.0 + 1.0) + 0.75);
        assert_eq!(e.compute, 1.0 + 15.0);
        assert_eq!(e.comm, 0.5 + 6.0);
        assert_eq!(e.hidden(), 0.0);
    }

    #[test]
    fn two_sub_batches_hide_reductions_shorter_than_the_other_sub_batch() {
        // Each reduction (1) is shorter than the other sub-batch's stage (2): only the last
        // reduction is exposed.
        let e = pipelined(4, &[sub(2.0, 2.0, 1.0); 2], 0.0, 0.0, 0.0, 0.0);
        assert_eq!(e.compute, 32.0);
        assert_eq!(e.step, 33.0);
        assert!((e.hidden() - 15.0 / 16.0).abs() < 1e-12);
    }

    #[test]
    fn communication_bound_steps_take_their_communication_time() {
        let e = pipelined(2, &[sub(0.1, 0.1, 5.0); 2], 0.0, 0.0, 0.0, 0.0);
        assert!((e.step - (0.1 + 8.0 * 5.0)).abs() < 1e-9, "{e:?}");
    }

    proptest! {
        #[test]
        fn the_step_lies_between_its_bounds(
            layers in 1usize..6,
            subs in proptest::collection::vec((0.0f64..3.0, 0.0f64..3.0, 0.0f64..3.0), 1..5),
        ) {
            let subs: Vec<SubCost> = subs.into_iter().map(|(a, m, r)| sub(a, m, r)).collect();
            let e = pipelined(layers, &subs, 0.1, 0.2, 0.3, 0.4);
            let eps = 1e-9;
            prop_assert!(e.step + eps >= e.compute.max(e.comm));
            prop_assert!(e.step <= e.compute + e.comm + eps);
            prop_assert!((0.0..=1.0).contains(&e.hidden()));
        }
    }
}
