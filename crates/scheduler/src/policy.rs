//! Ordering rules as pure functions: which waiting request is admitted first, which running
//! one is preempted, and the adapter grouping of a plan.
//!
//! - Admission: by effective priority class, then arrival. The effective class is the class
//!   minus one per `aging_steps` steps waited since arrival, so a low-priority request is
//!   never starved by a stream of urgent ones (it overtakes requests that arrive
//!   `aging_steps * (class difference)` steps after it).
//! - Preemption victim: the running sequence with the least urgent (base) class, latest
//!   admitted among equals (vLLM v1's `max(priority, arrival)` rule). Because the requester is
//!   itself a candidate, a sequence never preempts a more urgent one.
//! - Adapter grouping: a stable partition of the plan into one contiguous run per adapter,
//!   runs ordered by first appearance; inside a run the scheduling order is kept.

/// Effective class of a request of class `priority` that waited `waited` steps.
pub fn effective_priority(priority: i32, waited: u64, aging_steps: u64) -> i64 {
    let credit = waited.checked_div(aging_steps).unwrap_or(0);
    priority as i64 - credit.min(i64::MAX as u64 / 2) as i64
}

/// Admission sort key: smaller goes first.
pub fn admission_key(priority: i32, arrival: u64, waited: u64, aging_steps: u64) -> (i64, u64) {
    (effective_priority(priority, waited, aging_steps), arrival)
}

/// Index of the preemption victim among `(priority, admitted)` pairs.
pub fn victim(candidates: impl IntoIterator<Item = (i32, u64)>) -> Option<usize> {
    candidates
        .into_iter()
        .enumerate()
        .max_by_key(|&(_, key)| key)
        .map(|(i, _)| i)
}

/// Stable reordering of `items` so equal keys are contiguous, groups in order of first
/// appearance.
pub fn group_stable<T, K: PartialEq + Copy>(items: Vec<T>, key: impl Fn(&T) -> K) -> Vec<T> {
    let mut groups: Vec<(K, Vec<T>)> = Vec::new();
    for it in items {
        let k = key(&it);
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, v)) => v.push(it),
            None => groups.push((k, vec![it])),
        }
    }
    groups.into_iter().flat_map(|(_, v)| v).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aging_improves_class_stepwise() {
        assert_eq!(effective_priority(3, 0, 10), 3);
        assert_eq!(effective_priority(3, 9, 10), 3);
        assert_eq!(effective_priority(3, 10, 10), 2);
        assert_eq!(effective_priority(3, 35, 10), 0);
        assert_eq!(effective_priority(3, 1000, 0), 3, "0 disables aging");
        assert!(admission_key(0, 5, 0, 10) < admission_key(1, 1, 0, 10));
        assert!(admission_key(0, 1, 0, 10) < admission_key(0, 5, 0, 10));
        assert!(admission_key(1, 1, 10, 10) < admission_key(0, 5, 0, 10));
    }

    #[test]
    fn victim_is_least_urgent_then_latest() {
        assert_eq!(victim([(0, 1), (2, 0), (2, 3), (1, 9)]), Some(2));
        assert_eq!(victim(Vec::new()), None);
    }

    #[test]
    fn grouping_is_stable() {
        let v = vec![(1, 'a'), (2, 'b'), (1, 'c'), (3, 'd'), (2, 'e')];
        let g = group_stable(v, |x| x.0);
        assert_eq!(g, [(1, 'a'), (1, 'c'), (2, 'b'), (2, 'e'), (3, 'd')]);
    }
}
