//! The one admission gate: every sequence the server runs holds a place here from before its
//! prompt is tokenized until its request finishes, fails or is aborted. A request reserves
//! all its places at once (`n` × prompts sequences), so it is admitted whole or not at all.
//! A request that does not fit now is refused with HTTP 503 (`server_overloaded`) and
//! counted in `tessera_requests_rejected_total`; one that could never fit is refused with
//! 400. Every capacity refusal, here or in the engine thread, goes through [`Admission::refuse`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::api::ApiError;
use crate::metrics::Metrics;

pub struct Admission {
    /// Places held: sequences reserved, queued or running.
    held: AtomicUsize,
    /// Most places held at once (`--max-num-seqs` + `--max-waiting`).
    capacity: usize,
    metrics: Arc<Metrics>,
}

/// Places a request holds before its sequences reach the engine; dropping it gives back
/// those not handed over.
pub struct Reservation {
    gate: Arc<Admission>,
    places: usize,
}

impl Admission {
    pub fn new(capacity: usize, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Admission {
            held: AtomicUsize::new(0),
            capacity: capacity.max(1),
            metrics,
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Places held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Reserves `places` sequences (`n` choices of `prompts` prompts), all or none.
    pub fn reserve(self: &Arc<Self>, n: usize, prompts: usize) -> Result<Reservation, ApiError> {
        let places = n.saturating_mul(prompts);
        if places > self.capacity {
            return Err(ApiError::invalid(
                "n",
                format!(
                    "this request asks for {places} sequences (n = {n} for each of {prompts} \
                     prompt(s)); this server runs and queues at most {} at once",
                    self.capacity
                ),
            ));
        }
        let mut held = self.held.load(Ordering::Acquire);
        loop {
            if held + places > self.capacity {
                return Err(self.refuse(format!(
                    "the server is at capacity ({} of {} sequences queued or running; this \
                     request needs {places}); retry later",
                    held, self.capacity
                )));
            }
            match self.held.compare_exchange_weak(
                held,
                held + places,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Ok(Reservation {
                        gate: self.clone(),
                        places,
                    })
                }
                Err(now) => held = now,
            }
        }
    }

    /// The 503 for a request refused for capacity, counted as rejected.
    pub fn refuse(&self, message: impl Into<String>) -> ApiError {
        self.metrics
            .requests_rejected
            .fetch_add(1, Ordering::Relaxed);
        ApiError::new(503, "server_overloaded", message)
    }

    /// Gives back `places` (sequences that finished, failed, were aborted or refused).
    pub fn release(&self, places: usize) {
        if places > 0 {
            self.held.fetch_sub(places, Ordering::AcqRel);
        }
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reservation({} places)", self.places)
    }
}

impl Reservation {
    pub fn places(&self) -> usize {
        self.places
    }

    /// Hands the places over to whoever releases them from now on (the engine thread, one
    /// per sequence as it ends).
    pub fn hand_over(mut self) -> usize {
        std::mem::take(&mut self.places)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.gate.release(self.places);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_whole_requests_and_gives_back_on_drop() {
        let metrics = Arc::new(Metrics::default());
        let gate = Admission::new(10, metrics.clone());
        let a = gate.reserve(3, 2).unwrap();
        assert_eq!((a.places(), gate.held()), (6, 6));
        let e = gate.reserve(5, 1).unwrap_err();
        assert_eq!((e.status, e.kind), (503, "server_overloaded"));
        assert_eq!(metrics.requests_rejected.load(Ordering::Relaxed), 1);
        let b = gate.reserve(4, 1).unwrap();
        drop(a);
        assert_eq!(gate.held(), 4);
        let handed = b.hand_over();
        assert_eq!((handed, gate.held()), (4, 4));
        gate.release(handed);
        assert_eq!(gate.held(), 0);
        // A request larger than the whole capacity can never run: 400, not counted.
        let e = gate.reserve(11, 1).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("n")));
        assert_eq!(metrics.requests_rejected.load(Ordering::Relaxed), 1);
    }
}
