//! The fan-out engine's own I/O threads.
//!
//! Fan-out is off the produce hot path (SPEC §5.1): its blocking work (reading parent
//! batches, committing child partitions, advancing cursor files) runs here, on a few threads
//! of its own at a lower CPU priority, instead of on the blocking pool that produce commits
//! use. When the machine is busy, producers get the CPU first and fan-out copies fewer,
//! fuller batches; when it is not, fan-out runs at full speed.

use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::Mutex;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The nice value of the I/O threads (0 is the process's own; higher runs later).
pub const NICE: i32 = 10;

/// A small pool of lower-priority threads for blocking fan-out work.
pub struct IoThreads {
    tx: Mutex<mpsc::Sender<Job>>,
}

impl IoThreads {
    /// Starts `n` threads (at least one) at nice [`NICE`]. They end when the pool is dropped.
    pub fn start(n: usize) -> std::io::Result<Arc<Self>> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..n.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("narad-child-{i}"))
                .spawn(move || {
                    lower_priority();
                    loop {
                        // The lock is held only while waiting for the next job.
                        let job = rx.lock().recv();
                        let Ok(job) = job else { return };
                        // A panicking job drops its answer (the caller sees `JobLost`); the
                        // thread goes on serving the others.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })?;
        }
        Ok(Arc::new(IoThreads { tx: Mutex::new(tx) }))
    }

    /// Runs `f` on an I/O thread and returns its result. A job that panics surfaces as a
    /// `JobLost` error.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, JobLost> {
        let (done, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = done.send(f());
        });
        self.tx.lock().send(job).map_err(|_| JobLost)?;
        rx.await.map_err(|_| JobLost)
    }
}

/// A job that never returned (its thread panicked, or the pool is gone).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("fan-out I/O job lost (its thread stopped)")]
pub struct JobLost;

/// Lowers the calling thread's CPU priority (Linux: nice is per thread). Failure only
/// costs priority, so it is logged and ignored.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain syscalls on the calling thread's own id.
        let rc = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, NICE)
        };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "cannot lower the fan-out threads' priority");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_off_the_runtime_at_lower_priority() {
        let io = IoThreads::start(2).unwrap();
        let (name, nice) = io
            .run(|| {
                let name = std::thread::current().name().map(str::to_owned);
                // SAFETY: reads the calling thread's nice value.
                let nice = unsafe {
                    let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                    libc::getpriority(libc::PRIO_PROCESS, tid)
                };
                (name, nice)
            })
            .await
            .unwrap();
        assert!(name.unwrap().starts_with("narad-child-"));
        assert_eq!(nice, NICE);
        let sum: u64 = futures::future::join_all((0..50u64).map(|i| io.run(move || i)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .sum();
        assert_eq!(sum, (0..50u64).sum::<u64>());
    }

    #[tokio::test]
    async fn a_panicking_job_is_reported_and_the_pool_goes_on() {
        let io = IoThreads::start(1).unwrap();
        assert!(io.run(|| panic!("boom")).await.is_err());
        assert_eq!(io.run(|| 7).await.unwrap(), 7);
    }
}
