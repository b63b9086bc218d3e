//! A team of threads for kernels made of many short stages (a decode
//! block: ~10–50 µs each). A thread pool would wake a sleeping worker for
//! every split, which costs as much as the stage; here the helpers spin
//! between jobs for a short while (then park), every member runs the same
//! body on its share of each stage, and stages are separated by a spin
//! barrier, as llama.cpp's CPU backend does.
//!
//! One job runs at a time; a caller that finds the team busy (another
//! thread's kernel) runs alone as a team of one. A member that fails or
//! panics aborts the job: the others leave their next barrier with an error.

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::error::KernelError;

/// How long an idle helper spins before it parks.
const SPIN: Duration = Duration::from_millis(2);
/// Largest team (helpers are spawned once, on first use).
const MAX_MEMBERS: usize = 8;

/// What a member sees: its index, the team size and the barrier.
pub(crate) struct Member<'a> {
    pub(crate) id: usize,
    pub(crate) size: usize,
    team: Option<&'a Team>,
}

impl Member<'_> {
    /// Waits until every member reached this point; `Err` if the job was aborted.
    pub(crate) fn barrier(&self) -> Result<(), KernelError> {
        match self.team {
            Some(team) => team.barrier(self.size),
            None => Ok(()),
        }
    }

    /// This member's part of `0..n`, in steps of `align` (the last part takes the rest).
    pub(crate) fn share(&self, n: usize, align: usize) -> Range<usize> {
        split(n, self.size, self.id, align)
    }
}

/// A buffer that team members write in disjoint parts within a stage and
/// read whole only after the barrier that ends it.
pub(crate) struct SharedSlice<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: access follows the stage discipline documented on the methods.
unsafe impl<T: Send> Send for SharedSlice<T> {}
unsafe impl<T: Send> Sync for SharedSlice<T> {}

impl<T> SharedSlice<T> {
    pub(crate) fn new(v: &mut [T]) -> SharedSlice<T> {
        SharedSlice {
            ptr: v.as_mut_ptr(),
            len: v.len(),
        }
    }

    /// # Safety
    /// No other member touches `start..start + len` in this stage.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn part(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start + len <= self.len);
        // SAFETY: in bounds; exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }

    /// Writes `tmp [rows][cols.len()]` into columns `cols` of this
    /// row-major `[rows, n]` buffer.
    ///
    /// # Safety
    /// No other member writes these columns in this stage.
    pub(crate) unsafe fn write_cols(&self, tmp: &[T], n: usize, cols: &Range<usize>)
    where
        T: Copy,
    {
        let w = cols.len();
        if w == 0 {
            return;
        }
        for (r, row) in tmp.chunks_exact(w).enumerate() {
            // SAFETY: the caller owns these columns in this stage.
            unsafe { self.part(r * n + cols.start, w) }.copy_from_slice(row);
        }
    }

    /// The buffer's start, for prefetch hints (never dereferenced here).
    pub(crate) fn as_ptr(&self) -> *const T {
        self.ptr
    }

    /// # Safety
    /// Nobody writes the buffer in this stage.
    pub(crate) unsafe fn all(&self) -> &[T] {
        // SAFETY: as documented.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Part `i` of `parts` of `0..n`, boundaries multiples of `align`.
pub(crate) fn split(n: usize, parts: usize, i: usize, align: usize) -> Range<usize> {
    let align = align.max(1);
    let units = n.div_ceil(align);
    let (lo, hi) = (units * i / parts, units * (i + 1) / parts);
    (lo * align).min(n)..(hi * align).min(n)
}

thread_local! {
    static IN_TEAM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is running a team member's body: kernels called from
/// there stay on their thread instead of splitting again.
pub(crate) fn in_team() -> bool {
    IN_TEAM.with(|c| c.get())
}

/// Runs `f` marked as a team member.
fn as_member<R>(f: impl FnOnce() -> R) -> R {
    IN_TEAM.with(|c| c.set(true));
    let r = f();
    IN_TEAM.with(|c| c.set(false));
    r
}

type Body<'a> = dyn Fn(&Member) -> Result<(), KernelError> + Sync + 'a;

/// A type-erased pointer to the running job's body.
#[derive(Clone, Copy)]
struct JobPtr(*const Body<'static>);
// SAFETY: the body is `Sync` and outlives the job (`run` waits for every
// helper before it returns).
unsafe impl Send for JobPtr {}

struct Team {
    size: usize,
    /// Serialises jobs.
    busy: Mutex<()>,
    /// Bumped to publish a job.
    generation: AtomicU64,
    job: Mutex<Option<JobPtr>>,
    /// Helpers finished with the current job.
    finished: AtomicUsize,
    aborted: AtomicBool,
    error: Mutex<Option<KernelError>>,
    arrived: AtomicUsize,
    barrier_round: AtomicUsize,
    parked: Mutex<usize>,
    wake: Condvar,
}

/// `MLX_BACKEND_THREADS`: the team's size (the caller included), read
/// once when the team starts; unset or not a positive number, the CPU's
/// `available_parallelism()`.
fn threads_from_env() -> Option<usize> {
    std::env::var("MLX_BACKEND_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n >= 1)
}

fn team() -> &'static Team {
    static TEAM: OnceLock<&'static Team> = OnceLock::new();
    TEAM.get_or_init(|| {
        let size = threads_from_env()
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .clamp(1, MAX_MEMBERS);
        let team: &'static Team = Box::leak(Box::new(Team::new(size)));
        for id in 1..size {
            let spawned = std::thread::Builder::new()
                .name(format!("mlx-backend-team-{id}"))
                .spawn(move || team.helper(id));
            if spawned.is_err() {
                // Without all helpers the team cannot meet at barriers.
                return Box::leak(Box::new(Team::new(1)));
            }
        }
        team
    })
}

impl Team {
    fn new(size: usize) -> Team {
        Team {
            size,
            busy: Mutex::new(()),
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            finished: AtomicUsize::new(0),
            aborted: AtomicBool::new(false),
            error: Mutex::new(None),
            arrived: AtomicUsize::new(0),
            barrier_round: AtomicUsize::new(0),
            parked: Mutex::new(0),
            wake: Condvar::new(),
        }
    }

    fn helper(&'static self, id: usize) {
        let mut seen = 0u64;
        loop {
            let generation = self.wait_for_job(seen);
            seen = generation;
            let job = *self.job.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(JobPtr(body)) = job {
                let member = Member {
                    id,
                    size: self.size,
                    team: Some(self),
                };
                // SAFETY: `run` keeps the body alive until `finished` counts us.
                let body = unsafe { &*body };
                let result = catch_unwind(AssertUnwindSafe(|| as_member(|| body(&member))));
                let failure = match result {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e),
                    Err(_) => Some(KernelError::Shape(format!("team member {id} panicked"))),
                };
                if let Some(e) = failure {
                    self.abort(e);
                }
            }
            self.finished.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Spins for a new generation, then parks until one arrives.
    fn wait_for_job(&self, seen: u64) -> u64 {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let g = self.generation.load(Ordering::Acquire);
            if g != seen {
                return g;
            }
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(1024) && start.elapsed() > SPIN {
                break;
            }
        }
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        *parked += 1;
        loop {
            let g = self.generation.load(Ordering::Acquire);
            if g != seen {
                *parked -= 1;
                return g;
            }
            parked = self.wake.wait(parked).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn abort(&self, e: KernelError) {
        let mut slot = self.error.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(e);
        self.aborted.store(true, Ordering::Release);
    }

    fn barrier(&self, size: usize) -> Result<(), KernelError> {
        let round = self.barrier_round.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == size {
            self.arrived.store(0, Ordering::Release);
            self.barrier_round.fetch_add(1, Ordering::AcqRel);
        } else {
            while self.barrier_round.load(Ordering::Acquire) == round {
                if self.aborted.load(Ordering::Acquire) {
                    return Err(self.aborted_error());
                }
                std::hint::spin_loop();
            }
        }
        if self.aborted.load(Ordering::Acquire) {
            return Err(self.aborted_error());
        }
        Ok(())
    }

    fn aborted_error(&self) -> KernelError {
        self.error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| KernelError::Shape("team job aborted".into()))
    }
}

/// Runs `body` on every member of the team (the caller is member 0) and
/// returns the first error any member hit.
pub(crate) fn run<F>(body: F) -> Result<(), KernelError>
where
    F: Fn(&Member) -> Result<(), KernelError> + Sync,
{
    let team = team();
    let alone = |body: &F| {
        as_member(|| {
            body(&Member {
                id: 0,
                size: 1,
                team: None,
            })
        })
    };
    if team.size == 1 {
        return alone(&body);
    }
    let Ok(_guard) = team.busy.try_lock() else {
        return alone(&body);
    };
    let helpers = team.size - 1;
    team.aborted.store(false, Ordering::Release);
    *team.error.lock().unwrap_or_else(|e| e.into_inner()) = None;
    team.finished.store(0, Ordering::Release);
    team.arrived.store(0, Ordering::Release);
    let erased: &Body<'_> = &body;
    // SAFETY: only the lifetime is erased; the helpers drop the reference
    // before `finished` reaches `helpers`, which this function waits for.
    let ptr: *const Body<'static> = unsafe { std::mem::transmute(erased as *const Body<'_>) };
    *team.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(JobPtr(ptr));
    team.generation.fetch_add(1, Ordering::AcqRel);
    if *team.parked.lock().unwrap_or_else(|e| e.into_inner()) > 0 {
        team.wake.notify_all();
    }
    let member = Member {
        id: 0,
        size: team.size,
        team: Some(team),
    };
    let mine = match catch_unwind(AssertUnwindSafe(|| as_member(|| body(&member)))) {
        Ok(r) => r,
        Err(_) => Err(KernelError::Shape("team member 0 panicked".into())),
    };
    if let Err(e) = &mine {
        team.abort(e.clone());
    }
    while team.finished.load(Ordering::Acquire) < helpers {
        std::hint::spin_loop();
    }
    *team.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    match team.error.lock().unwrap_or_else(|e| e.into_inner()).take() {
        Some(e) => Err(e),
        None => mine,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_the_range_in_aligned_parts() {
        for (n, parts, align) in [(576, 2, 2), (7, 2, 2), (1536, 3, 16), (5, 8, 1)] {
            let mut next = 0;
            for i in 0..parts {
                let r = split(n, parts, i, align);
                assert_eq!(r.start, next);
                assert!(r.start.is_multiple_of(align) || r.start == n);
                next = r.end;
            }
            assert_eq!(next, n);
        }
    }

    #[test]
    fn members_meet_at_barriers_and_errors_abort() {
        use std::sync::atomic::AtomicUsize;
        let stage = AtomicUsize::new(0);
        for _ in 0..200 {
            stage.store(0, Ordering::SeqCst);
            run(|m| {
                stage.fetch_add(1, Ordering::SeqCst);
                m.barrier()?;
                // Every member incremented before anyone passed.
                assert!(stage.load(Ordering::SeqCst) >= m.size);
                m.barrier()
            })
            .unwrap();
        }
        let err = run(|m| {
            if m.id == m.size - 1 {
                return Err(KernelError::Shape("member failed".into()));
            }
            m.barrier()?;
            m.barrier()
        })
        .unwrap_err();
        assert!(err.to_string().contains("member failed"), "{err}");
        // Usable afterwards.
        run(|m| m.barrier()).unwrap();
    }
}
