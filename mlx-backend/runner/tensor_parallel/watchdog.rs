//! A follower's watchdog: MLX's collectives have no timeout (a ring rank
//! whose peer died waits on its socket forever), so a thread watches the
//! time since rank 0 was last heard from and ends the process when it
//! passes the limit, rather than leave it hanging.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The exit code of a follower whose leader vanished (`EX_TEMPFAIL`).
pub const LEADER_LOST_EXIT_CODE: i32 = 75;

struct Shared {
    start: Instant,
    /// Milliseconds since `start` of the last sign of life.
    last: AtomicU64,
    /// The limit in milliseconds now.
    limit: AtomicU64,
    stop: AtomicBool,
}

/// Ends the process with [`LEADER_LOST_EXIT_CODE`] once [`Watchdog::touch`]
/// has not been called for the current limit; stopped when dropped.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Watchdog {
    pub(crate) fn start(limit: Duration) -> Watchdog {
        let shared = Arc::new(Shared {
            start: Instant::now(),
            last: AtomicU64::new(0),
            limit: AtomicU64::new(limit.as_millis() as u64),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let poll = (limit / 20).clamp(Duration::from_millis(5), Duration::from_millis(200));
        let thread = thread::Builder::new()
            .name("mlx-tp-watchdog".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Acquire) {
                    thread::sleep(poll);
                    let now = s.start.elapsed().as_millis() as u64;
                    let idle = now.saturating_sub(s.last.load(Ordering::Acquire));
                    if idle > s.limit.load(Ordering::Acquire) && !s.stop.load(Ordering::Acquire) {
                        eprintln!(
                            "mlx-backend: tensor-parallel rank 0 has not been heard from for \
                             {idle} ms; exiting"
                        );
                        crate::distributed::exit_process(LEADER_LOST_EXIT_CODE);
                    }
                }
            })
            .ok();
        Watchdog { shared, thread }
    }

    /// A sign of life: the limit starts again from now.
    pub(crate) fn touch(&self) {
        let now = self.shared.start.elapsed().as_millis() as u64;
        self.shared.last.store(now, Ordering::Release);
    }

    /// No limit until the next [`Watchdog::set_limit`].
    pub(crate) fn pause(&self) {
        self.shared.limit.store(u64::MAX, Ordering::Release);
    }

    /// Change the limit (and touch).
    pub(crate) fn set_limit(&self, limit: Duration) {
        self.shared
            .limit
            .store(limit.as_millis() as u64, Ordering::Release);
        self.touch();
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
