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
//!
//! A parked helper can take milliseconds to wake on a VM (~3 ms after a
//! 50 ms pause here: the hypervisor has to run its halted vCPU again), so
//! no job waits for one: jobs without barriers go through [`for_units`],
//! whose caller does not wait for a helper that has not started by the
//! time the units ran out, and a job with barriers ([`run`]) that finds a
//! helper parked wakes it and runs alone; the next jobs find it spinning.

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::error::KernelError;

/// How long an idle helper spins (yielding now and then) before it parks.
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

    /// Whether a member failed: the job's remaining work is moot.
    fn aborted(&self) -> bool {
        self.team
            .is_some_and(|team| team.aborted.load(Ordering::Acquire))
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
    /// Who joined the current job: its generation (high 32 bits), a
    /// closed flag ([`CLOSED`]) and the helpers that joined (low bits). A
    /// helper runs a job only if it joins it before the caller closes it.
    entry: AtomicU64,
    job: Mutex<Option<JobPtr>>,
    /// Helpers finished with the current job.
    finished: AtomicUsize,
    aborted: AtomicBool,
    error: Mutex<Option<KernelError>>,
    arrived: AtomicUsize,
    barrier_round: AtomicUsize,
    parked: Mutex<usize>,
    wake: Condvar,
    /// The CPU each helper last spun on (`-1`: unknown or parked), so
    /// that a job with barriers never puts two members on one CPU.
    helper_cpus: [AtomicI32; MAX_MEMBERS],
    /// A job holds the team (`busy`): helpers not in it keep spinning until
    /// it ends, so that the next job has them. A job that found a helper
    /// parked or on its CPU runs alone, and one longer than [`SPIN`] would
    /// otherwise outlast the helper's spin: every job after it would find
    /// the helper parked again and run alone too (a step at single-thread
    /// speed until a pause let the helper go).
    job_in_flight: AtomicBool,
}

/// One turn of a wait: a spin, and every 1024th a yield (`sched_yield`,
/// which returns at once when nothing else is runnable), so that a thread
/// the scheduler put on this CPU can run (a waiter that never yields
/// keeps it off for a scheduler slice).
fn spin_politely(spins: &mut u32) {
    std::hint::spin_loop();
    *spins = spins.wrapping_add(1);
    if spins.is_multiple_of(1024) {
        std::thread::yield_now();
    }
}

/// The CPU this thread runs on (`-1` where unknown).
fn current_cpu() -> i32 {
    #[cfg(target_os = "linux")]
    // SAFETY: no arguments; reads the calling thread's CPU.
    unsafe {
        libc::sched_getcpu()
    }
    #[cfg(not(target_os = "linux"))]
    -1
}

/// [`Team::entry`]'s flag: the job takes no more helpers.
const CLOSED: u64 = 1 << 31;

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
            entry: AtomicU64::new(0),
            job: Mutex::new(None),
            finished: AtomicUsize::new(0),
            aborted: AtomicBool::new(false),
            error: Mutex::new(None),
            arrived: AtomicUsize::new(0),
            barrier_round: AtomicUsize::new(0),
            parked: Mutex::new(0),
            wake: Condvar::new(),
            helper_cpus: std::array::from_fn(|_| AtomicI32::new(-1)),
            job_in_flight: AtomicBool::new(false),
        }
    }

    fn helper(&'static self, id: usize) {
        let mut seen = 0u64;
        loop {
            let generation = self.wait_for_job(id, seen);
            seen = generation;
            if !self.join(generation) {
                // Closed before this helper woke: the caller did its work.
                continue;
            }
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

    /// Spins for a new generation, then parks until woken: by a job, or
    /// by a caller that found this helper parked and ran its job alone
    /// (see [`run_job`]); then spins again.
    fn wait_for_job(&self, id: usize, seen: u64) -> u64 {
        loop {
            if let Some(g) = self.spin_for_job(id, seen) {
                return g;
            }
            let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
            let g = self.generation.load(Ordering::Acquire);
            if g != seen {
                return g;
            }
            // A parked helper holds no CPU: a caller that last saw it on
            // its own CPU must wake it, not run alone until it migrates.
            self.helper_cpus[id].store(-1, Ordering::Relaxed);
            *parked += 1;
            parked = self.wake.wait(parked).unwrap_or_else(|e| e.into_inner());
            *parked -= 1;
        }
    }

    /// A new generation within [`SPIN`], if one comes.
    fn spin_for_job(&self, id: usize, seen: u64) -> Option<u64> {
        let mut start = Instant::now();
        let mut spins = 0u32;
        self.helper_cpus[id].store(current_cpu(), Ordering::Relaxed);
        loop {
            let g = self.generation.load(Ordering::Acquire);
            if g != seen {
                return Some(g);
            }
            // Yields now and then: a thread that woke on this core (the
            // one waiting for the kernel's result, typically) waited a
            // scheduler tick, ~2 ms, for a helper that spun on regardless
            // (`kernels` bench, after MLX's call).
            spin_politely(&mut spins);
            if spins.is_multiple_of(1024) {
                if self.job_in_flight.load(Ordering::Relaxed) {
                    start = Instant::now();
                } else if start.elapsed() > SPIN {
                    return None;
                }
                self.helper_cpus[id].store(current_cpu(), Ordering::Relaxed);
            }
        }
    }

    /// Whether a helper last spun on the caller's CPU.
    fn shares_a_cpu_with_a_helper(&self) -> bool {
        let cpu = current_cpu();
        cpu >= 0
            && self.helper_cpus[1..self.size]
                .iter()
                .any(|c| c.load(Ordering::Relaxed) == cpu)
    }

    /// Joins job `generation` unless it is closed (or already replaced).
    fn join(&self, generation: u64) -> bool {
        let mut entry = self.entry.load(Ordering::Acquire);
        loop {
            if entry >> 32 != generation & 0xffff_ffff || entry & CLOSED != 0 {
                return false;
            }
            match self.entry.compare_exchange_weak(
                entry,
                entry + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => entry = now,
            }
        }
    }

    /// Takes no more helpers into the current job; returns how many joined.
    fn close(&self) -> usize {
        (self.entry.fetch_or(CLOSED, Ordering::AcqRel) & (CLOSED - 1)) as usize
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
            let mut spins = 0u32;
            while self.barrier_round.load(Ordering::Acquire) == round {
                if self.aborted.load(Ordering::Acquire) {
                    return Err(self.aborted_error());
                }
                spin_politely(&mut spins);
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
/// returns the first error any member hit. Every helper takes part, so
/// the body may meet at [`Member::barrier`]; if one is parked, the caller
/// wakes the helpers and runs `body` alone (as a team of one).
pub(crate) fn run<F>(body: F) -> Result<(), KernelError>
where
    F: Fn(&Member) -> Result<(), KernelError> + Sync,
{
    run_job(team(), body, Helpers::All)
}

/// Sets [`Team::job_in_flight`] while it lives (a panic in the job
/// included); made by the caller that holds `busy`.
struct JobInFlight<'t>(&'t Team);

impl<'t> JobInFlight<'t> {
    fn new(team: &'t Team) -> Self {
        team.job_in_flight.store(true, Ordering::Relaxed);
        JobInFlight(team)
    }
}

impl Drop for JobInFlight<'_> {
    fn drop(&mut self) {
        self.0.job_in_flight.store(false, Ordering::Relaxed);
    }
}

/// Whether a job waits for every helper.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Helpers {
    /// Each one runs the body (barriers allowed).
    All,
    /// Only those that start before the caller's body returns.
    Started,
}

fn run_job<F>(team: &Team, body: F, helpers: Helpers) -> Result<(), KernelError>
where
    F: Fn(&Member) -> Result<(), KernelError> + Sync,
{
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
    let _in_flight = JobInFlight::new(team);
    if helpers == Helpers::All && team.shares_a_cpu_with_a_helper() {
        // Two members on one CPU would take turns at every barrier, a
        // scheduler slice each (a helper just woken on this CPU, before
        // the scheduler moved one of them): alone is faster. The helper
        // spins on meanwhile (yielding, see `job_in_flight`), so that the
        // scheduler moves it to the idle CPU.
        return alone(&body);
    }
    let parked = *team.parked.lock().unwrap_or_else(|e| e.into_inner());
    if parked > 0 {
        team.wake.notify_all();
        if helpers == Helpers::All {
            // A parked helper can take milliseconds to start (see the
            // module's doc), and a job with barriers would wait for it:
            // this one runs alone, the woken helpers join the next ones.
            return alone(&body);
        }
    }
    team.aborted.store(false, Ordering::Release);
    *team.error.lock().unwrap_or_else(|e| e.into_inner()) = None;
    team.finished.store(0, Ordering::Release);
    team.arrived.store(0, Ordering::Release);
    let erased: &Body<'_> = &body;
    // SAFETY: only the lifetime is erased; the helpers that join drop the
    // reference before `finished` counts them, which this function waits
    // for, and the others never read it.
    let ptr: *const Body<'static> = unsafe { std::mem::transmute(erased as *const Body<'_>) };
    *team.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(JobPtr(ptr));
    // Only the caller holding `busy` publishes, so this is the next one.
    let generation = team.generation.load(Ordering::Acquire) + 1;
    team.entry
        .store((generation & 0xffff_ffff) << 32, Ordering::Release);
    team.generation.store(generation, Ordering::Release);
    if *team.parked.lock().unwrap_or_else(|e| e.into_inner()) > 0 {
        // Parked since the check above.
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
    let joined = match helpers {
        Helpers::All => team.size - 1,
        Helpers::Started => team.close(),
    };
    let mut spins = 0u32;
    while team.finished.load(Ordering::Acquire) < joined {
        spin_politely(&mut spins);
    }
    *team.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    match team.error.lock().unwrap_or_else(|e| e.into_inner()).take() {
        Some(e) => Err(e),
        None => mine,
    }
}

/// Runs `body(unit, scratch)` once for every unit of `0..count` on the
/// team and returns the first error. Each member starts on its own
/// contiguous share (`split`) and then takes what is left of the others'
/// (from their front, a unit at a time), so a late or slow member's units
/// are done by the others; a helper that has not started when the caller
/// runs out of units is not waited for. `init` makes a member's scratch
/// when it takes its first unit. Units run in no fixed order or thread:
/// each must write only its own part of any output.
pub(crate) fn for_units<B>(
    count: usize,
    init: impl Fn() -> B + Sync,
    body: impl Fn(usize, &mut B) -> Result<(), KernelError> + Sync,
) -> Result<(), KernelError> {
    units_on(team(), count, init, body)
}

fn units_on<B>(
    team: &Team,
    count: usize,
    init: impl Fn() -> B + Sync,
    body: impl Fn(usize, &mut B) -> Result<(), KernelError> + Sync,
) -> Result<(), KernelError> {
    let size = team.size;
    let shares: Vec<Range<usize>> = (0..size).map(|i| split(count, size, i, 1)).collect();
    let next: Vec<AtomicUsize> = shares.iter().map(|s| AtomicUsize::new(s.start)).collect();
    run_job(
        team,
        |m| {
            let mut scratch = None;
            // Its own share first, then the others' in turn (a member
            // alone, as a team of one, walks them all).
            for owner in (0..size).map(|turn| (m.id + turn) % size) {
                loop {
                    if m.aborted() {
                        return Ok(());
                    }
                    let unit = next[owner].fetch_add(1, Ordering::AcqRel);
                    if unit >= shares[owner].end {
                        break;
                    }
                    body(unit, scratch.get_or_insert_with(&init))?;
                }
            }
            Ok(())
        },
        Helpers::Started,
    )
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
    fn every_unit_runs_once_and_errors_stop_the_rest() {
        use std::sync::atomic::AtomicU32;
        for count in [0, 1, 2, 7, 64, 1000] {
            let runs: Vec<AtomicU32> = (0..count).map(|_| AtomicU32::new(0)).collect();
            let inits = AtomicUsize::new(0);
            for_units(
                count,
                || inits.fetch_add(1, Ordering::SeqCst),
                |u, _| {
                    runs[u].fetch_add(1, Ordering::SeqCst);
                    Ok(())
                },
            )
            .unwrap();
            assert!(
                runs.iter().all(|r| r.load(Ordering::SeqCst) == 1),
                "{count}"
            );
            // One scratch per member that took a unit.
            assert!(inits.load(Ordering::SeqCst) <= team().size.min(count));
        }
        let done = AtomicUsize::new(0);
        let err = for_units(
            10_000,
            || (),
            |u, _| {
                if u == 3 {
                    return Err(KernelError::Shape("unit 3 failed".into()));
                }
                done.fetch_add(1, Ordering::SeqCst);
                Ok(())
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("unit 3 failed"), "{err}");
        // Usable afterwards, barriers included.
        run(|m| m.barrier()).unwrap();
        for_units(4, || (), |_, _| Ok(())).unwrap();
    }

    /// A job of units completes without a helper that never starts (as a
    /// parked helper on a VM can take milliseconds to), and a helper that
    /// wakes after the job closed skips it and joins the next.
    #[test]
    fn units_do_not_wait_for_a_helper_that_has_not_started() {
        let team: &'static Team = Box::leak(Box::new(Team::new(2)));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runs: Vec<AtomicUsize> = (0..50).map(|_| AtomicUsize::new(0)).collect();
            units_on(
                team,
                50,
                || (),
                |u, _| {
                    runs[u].fetch_add(1, Ordering::SeqCst);
                    Ok(())
                },
            )
            .unwrap();
            let once = runs.iter().all(|r| r.load(Ordering::SeqCst) == 1);
            tx.send(once).unwrap();
        });
        let once = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the caller waited for a helper that never started");
        assert!(once);
        // The helper starts now: it sees the closed job, skips it (it would
        // otherwise count itself finished and run a dangling body) and
        // meets the caller in a later job's barrier. Caller and helper on
        // CPUs of their own (on one, the caller would run alone).
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cpus < 2 || !pin_to(0) {
            return;
        }
        std::thread::spawn(move || {
            pin_to(1);
            team.helper(1)
        });
        // A job runs alone, by design, while the helper is parked (on a
        // loaded machine it can park, after `SPIN`, before the caller gets
        // the CPU back); the caller wakes it and a later job meets it.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let met = AtomicUsize::new(0);
            run_job(
                team,
                |m| {
                    met.fetch_add(1, Ordering::SeqCst);
                    m.barrier()
                },
                Helpers::All,
            )
            .unwrap();
            if met.load(Ordering::SeqCst) == 2 {
                // Only this job's run counts: the skipped one did not.
                assert_eq!(team.finished.load(Ordering::SeqCst), 1);
                return;
            }
            assert_eq!(met.load(Ordering::SeqCst), 1);
            assert!(Instant::now() < deadline, "the helper never joined a job");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Pins this thread to `cpu`; false where that fails (or off Linux).
    fn pin_to(cpu: usize) -> bool {
        #[cfg(target_os = "linux")]
        // SAFETY: a zeroed cpu_set_t is an empty set; the call takes its size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// A job with barriers does not wait for a parked helper: it runs
    /// alone (here the "parked" helper never existed, so waiting for it
    /// would never end).
    #[test]
    fn a_job_with_barriers_runs_alone_when_a_helper_is_parked() {
        let team: &'static Team = Box::leak(Box::new(Team::new(2)));
        *team.parked.lock().unwrap() = 1;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let sizes = Mutex::new(Vec::new());
            let done = run_job(
                team,
                |m| {
                    sizes.lock().unwrap().push(m.size);
                    m.barrier()?;
                    m.barrier()
                },
                Helpers::All,
            );
            tx.send((done.is_ok(), sizes.into_inner().unwrap()))
                .unwrap();
        });
        let (ok, sizes) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the job waited for a parked helper");
        assert!(ok);
        assert_eq!(sizes, [1]);
    }

    /// A helper keeps spinning past [`SPIN`] while a job holds the team
    /// (else it parks behind a long job that runs alone, and the next job
    /// finds it parked and runs alone too), and parks once that job is over.
    #[test]
    fn a_helper_spins_on_while_a_job_runs_alone() {
        let team: &'static Team = Box::leak(Box::new(Team::new(2)));
        let guard = JobInFlight::new(team);
        let spinner = std::thread::spawn(move || team.spin_for_job(1, 0));
        std::thread::sleep(SPIN * 4);
        assert!(!spinner.is_finished(), "the helper stopped spinning");
        drop(guard);
        let started = Instant::now();
        assert_eq!(spinner.join().unwrap(), None);
        assert!(started.elapsed() < Duration::from_secs(5));
        // A parked helper holds no CPU.
        let waiter = std::thread::spawn(move || team.wait_for_job(1, 0));
        let deadline = Instant::now() + Duration::from_secs(20);
        while *team.parked.lock().unwrap() == 0 {
            assert!(Instant::now() < deadline, "the helper never parked");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(team.helper_cpus[1].load(Ordering::SeqCst), -1);
        team.generation.store(1, Ordering::SeqCst);
        {
            let _lock = team.parked.lock().unwrap();
            team.wake.notify_all();
        }
        assert_eq!(waiter.join().unwrap(), 1);
    }

    /// A job with barriers runs alone when a helper last spun on the
    /// caller's CPU (here a helper that never existed: waiting for it
    /// would never end).
    #[test]
    #[cfg(target_os = "linux")]
    fn a_job_with_barriers_runs_alone_beside_a_helper_on_its_cpu() {
        let team: &'static Team = Box::leak(Box::new(Team::new(2)));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Pinned, so that the CPU it reads stays its CPU.
            let pinned = pin_to(current_cpu().max(0) as usize);
            team.helper_cpus[1].store(current_cpu(), Ordering::SeqCst);
            let sizes = Mutex::new(Vec::new());
            let done = run_job(
                team,
                |m| {
                    sizes.lock().unwrap().push(m.size);
                    m.barrier()
                },
                Helpers::All,
            );
            tx.send((pinned, done.is_ok(), sizes.into_inner().unwrap()))
                .unwrap();
        });
        let (pinned, ok, sizes) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the job waited for a helper on the caller's CPU");
        assert!(pinned && ok);
        assert_eq!(sizes, [1]);
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
