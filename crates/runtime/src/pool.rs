//! A persistent worker pool with low dispatch overhead.
//!
//! `run(f)` executes `f(unit)` once on each of the pool's units: the calling thread is unit 0,
//! workers 1..n are persistent threads. Workers spin briefly on a generation counter after a
//! job (a decode step issues hundreds of small parallel operations back to back), then park
//! on a condition variable so an idle engine burns no CPU.
//!
//! Invariants: one job at a time (a submit lock serialises callers from different threads);
//! `run` returns only after every unit has finished, so `f` may borrow from the caller's
//! stack; a call from inside a job runs serially on the calling thread (no deadlock); a panic
//! in any unit is re-raised in the caller after all units are done.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Job = dyn Fn(usize) + Sync;

/// A lifetime-erased pointer to the current job. Only dereferenced while `run` is blocked
/// waiting for the job to finish, which keeps the referent alive.
#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the pointee is `Sync` and outlives every use (see `run`).
unsafe impl Send for JobPtr {}

struct Shared {
    generation: AtomicU64,
    job: Mutex<Option<JobPtr>>,
    wake: Condvar,
    pending: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    submit: Mutex<()>,
}

thread_local! {
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// Spin iterations before a worker parks (about tens of microseconds).
const SPIN_LIMIT: u32 = 1 << 14;

impl ThreadPool {
    /// A pool of `units` compute units (the caller plus `units - 1` workers). Workers are
    /// pinned to distinct CPUs of the process's affinity set when there are enough of them
    /// (Linux; `TESSERA_PIN=0` disables), unit `u` on the `u`-th allowed CPU, so unit 0's
    /// CPU stays free for the calling thread.
    pub fn new(units: usize) -> Self {
        let units = units.max(1);
        let pin_targets = allowed_cpus().filter(|c| {
            c.len() >= units && units > 1 && std::env::var("TESSERA_PIN").as_deref() != Ok("0")
        });
        Self::build(units, pin_targets)
    }

    /// A pool of `cpus.len()` units for a rank that owns those CPUs: worker `u` is pinned to
    /// `cpus[u]`, and the calling thread should pin itself to `cpus[0]` ([`pin_current_thread`]).
    /// `TESSERA_PIN=0` disables pinning.
    pub fn on_cpus(cpus: &[usize]) -> Self {
        let pin = (std::env::var("TESSERA_PIN").as_deref() != Ok("0") && !cpus.is_empty())
            .then(|| cpus.to_vec());
        Self::build(cpus.len().max(1), pin)
    }

    fn build(units: usize, pin_targets: Option<Vec<usize>>) -> Self {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            wake: Condvar::new(),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
        });
        let workers = (1..units)
            .map(|unit| {
                let shared = shared.clone();
                let cpu = pin_targets.as_ref().map(|cpus| cpus[unit % cpus.len()]);
                std::thread::Builder::new()
                    .name(format!("tessera-unit-{unit}"))
                    .spawn(move || {
                        if let Some(cpu) = cpu {
                            pin_current_thread(cpu);
                        }
                        worker_loop(&shared, unit)
                    })
                    .expect("spawning a compute thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            submit: Mutex::new(()),
        }
    }

    /// Number of compute units, the calling thread included.
    pub fn units(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(unit)` for every unit in `0..units()` and waits for all of them.
    pub fn run<F: Fn(usize) + Sync>(&self, f: F) {
        if self.workers.is_empty() || IN_JOB.with(|c| c.get()) {
            for u in 0..self.units() {
                f(u);
            }
            return;
        }
        let _guard = self.submit.lock().unwrap_or_else(|e| e.into_inner());
        let job: &(dyn Fn(usize) + Sync + '_) = &f;
        // SAFETY: the pointer is erased to 'static only to cross to the workers; we do not
        // return until `pending` reaches zero, i.e. until no worker touches it any more.
        let ptr = JobPtr(unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(job as *const _)
        });
        self.shared
            .pending
            .store(self.workers.len(), Ordering::SeqCst);
        {
            let mut slot = self.shared.job.lock().unwrap_or_else(|e| e.into_inner());
            *slot = Some(ptr);
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
        }
        self.shared.wake.notify_all();
        IN_JOB.with(|c| c.set(true));
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(0)));
        IN_JOB.with(|c| c.set(false));
        let mut spins = 0u32;
        while self.shared.pending.load(Ordering::Acquire) != 0 {
            if spins < SPIN_LIMIT {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if self.shared.panicked.swap(false, Ordering::SeqCst) {
            panic!("a compute unit panicked");
        }
    }
}

/// CPUs this process may run on.
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> Option<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        Some(
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect(),
        )
    }
}

#[cfg(not(target_os = "linux"))]
pub fn allowed_cpus() -> Option<Vec<usize>> {
    None
}

/// Pins the calling thread to `cpu` (Linux; elsewhere nothing).
#[cfg(target_os = "linux")]
pub fn pin_current_thread(cpu: usize) {
    // SAFETY: as above; failure to pin is harmless (the OS keeps scheduling the thread).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(not(target_os = "linux"))]
pub fn pin_current_thread(_cpu: usize) {}

fn worker_loop(shared: &Shared, unit: usize) {
    IN_JOB.with(|c| c.set(true));
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        while shared.generation.load(Ordering::Acquire) == seen
            && !shared.shutdown.load(Ordering::Acquire)
        {
            if spins < SPIN_LIMIT {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let slot = shared.job.lock().unwrap_or_else(|e| e.into_inner());
            // Re-check under the lock: `run` bumps the generation while holding it.
            if shared.generation.load(Ordering::Acquire) == seen
                && !shared.shutdown.load(Ordering::Acquire)
            {
                drop(shared.wake.wait(slot).unwrap_or_else(|e| e.into_inner()));
            }
        }
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        let job = {
            let slot = shared.job.lock().unwrap_or_else(|e| e.into_inner());
            seen = shared.generation.load(Ordering::Acquire);
            *slot
        };
        if let Some(JobPtr(ptr)) = job {
            // SAFETY: `run` keeps the job alive until `pending` reaches zero below.
            let f = unsafe { &*ptr };
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(unit))).is_err() {
                shared.panicked.store(true, Ordering::SeqCst);
            }
            shared.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let _slot = self.shared.job.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.shutdown.store(true, Ordering::SeqCst);
        }
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_runs_once_per_job() {
        let pool = ThreadPool::new(3);
        for _ in 0..1000 {
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(|u| {
                hits[u].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn nested_runs_are_serial_and_borrowing_works() {
        let pool = ThreadPool::new(2);
        let data = vec![1u64; 100];
        let total = AtomicU64::new(0);
        pool.run(|_| {
            pool.run(|_| {
                total.fetch_add(data.iter().sum::<u64>(), Ordering::Relaxed);
            })
        });
        assert_eq!(total.load(Ordering::Relaxed), 400);
    }

    #[test]
    fn panics_propagate_and_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(|u| assert_ne!(u, 1))
        }));
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        pool.run(|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn workers_exit_on_drop() {
        for _ in 0..50 {
            let pool = ThreadPool::new(4);
            pool.run(|_| {});
            drop(pool);
        }
    }
}
