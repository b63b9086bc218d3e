//! Tensor parallelism over MLX's distributed layer: every rank of the group
//! in the environment (`mlx.launch`, or [`crate::distributed::launch`])
//! loads its shard of the model ([`crate::model::load_shard`]) and holds
//! its shard of every request's KV. Rank 0 is the engine-facing
//! [`ModelRunner`] ([`TensorParallelRunner`]); every other rank runs
//! [`Follower::follow`], which replays what rank 0 broadcasts before each
//! step (the batch, releases, prefix copies), so all ranks run the same
//! graph and meet in the same all_sums, and validation errors happen on
//! every rank alike.
//!
//! MLX's collectives cannot time out, so liveness is kept outside them:
//! rank 0 runs its runner on a thread of its own and gives each call
//! [`RunnerConfig::peer_timeout`]; a step that does not finish in time
//! fails with [`DistributedError::PeerTimeout`], and the runner refuses
//! every later call ([`DistributedError::GroupLost`]). While idle, rank 0
//! broadcasts a heartbeat every quarter of the timeout; a follower that
//! hears nothing for the timeout exits with [`LEADER_LOST_EXIT_CODE`]. A
//! process whose runner lost its group should end through
//! [`crate::distributed::exit_process`]: a thread may be stuck in the
//! backend, which a normal exit would wait for.

mod protocol;
mod watchdog;

pub use watchdog::LEADER_LOST_EXIT_CODE;

use super::batch::{ForwardBatch, ForwardOutput, RequestId};
use super::error::RunnerError;
use super::metrics::RunnerMetrics;
use super::{MlxModelRunner, ModelRunner, RunnerConfig, RunnerInfo};
use crate::distributed::{DistributedError, Group, ENV_RANK};
use crate::model::LoadOptions;
use protocol::Message;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;
use watchdog::Watchdog;

/// This process's part of a tensor-parallel runner.
pub enum Rank {
    /// Rank 0: serves the engine.
    Leader(Box<TensorParallelRunner>),
    /// Any other rank: call [`Follower::follow`].
    Follower(Box<Follower>),
}

/// Join the group the environment describes and load this rank's shard of
/// the model at `path`. `config.tensor_parallel` must name the group's
/// size. Every rank passes the same path, options and config.
pub fn start(
    path: impl AsRef<Path>,
    options: &LoadOptions,
    config: RunnerConfig,
) -> Result<Rank, RunnerError> {
    let Some(expected) = config.tensor_parallel else {
        return Err(DistributedError::NotConfigured(
            "RunnerConfig::tensor_parallel is None".into(),
        )
        .into());
    };
    let rank = std::env::var(ENV_RANK)
        .map_err(|_| DistributedError::NotConfigured(format!("{ENV_RANK} is not set")))?;
    let rank: usize =
        rank.trim()
            .parse()
            .map_err(|e: std::num::ParseIntError| DistributedError::BadEnv {
                name: ENV_RANK,
                value: rank.clone(),
                reason: e.to_string(),
            })?;
    let path = path.as_ref().to_path_buf();
    if rank == 0 {
        TensorParallelRunner::start(path, options.clone(), config, expected)
            .map(|r| Rank::Leader(Box::new(r)))
    } else {
        Follower::start(&path, options, config, expected).map(|f| Rank::Follower(Box::new(f)))
    }
}

/// Form the group and check its size.
fn join(expected: usize) -> Result<Group, RunnerError> {
    let group = Group::from_env()?;
    if group.size() != expected {
        return Err(DistributedError::SizeMismatch {
            expected,
            actual: group.size(),
        }
        .into());
    }
    Ok(group)
}

enum Command {
    Forward(
        ForwardBatch,
        mpsc::Sender<Result<ForwardOutput, RunnerError>>,
    ),
    Release(Vec<RequestId>),
    CopyPrefix(
        RequestId,
        RequestId,
        usize,
        mpsc::Sender<Result<(), RunnerError>>,
    ),
    Metrics(mpsc::Sender<RunnerMetrics>),
}

/// What the leader thread reports while starting.
enum Startup {
    Joined,
    Loaded(Box<RunnerInfo>),
    Failed(RunnerError),
}

/// Rank 0 of a tensor-parallel group: a [`ModelRunner`] whose every call
/// is broadcast to the followers and then run on this rank's shard.
pub struct TensorParallelRunner {
    commands: Option<mpsc::Sender<Command>>,
    info: RunnerInfo,
    last_metrics: Mutex<RunnerMetrics>,
    timeout: Duration,
    ranks: usize,
    lost: bool,
    worker: Option<thread::JoinHandle<()>>,
    /// Closed when the worker thread ends.
    done: mpsc::Receiver<()>,
}

impl TensorParallelRunner {
    fn start(
        path: PathBuf,
        options: LoadOptions,
        config: RunnerConfig,
        expected: usize,
    ) -> Result<TensorParallelRunner, RunnerError> {
        let timeout = config.peer_timeout;
        let (commands, inbox) = mpsc::channel::<Command>();
        let (status_tx, status) = mpsc::channel::<Startup>();
        let (done_tx, done) = mpsc::channel::<()>();
        let worker = thread::Builder::new()
            .name("mlx-tp-leader".into())
            .spawn(move || {
                let _done = done_tx;
                let group = match join(expected) {
                    Ok(g) => g,
                    Err(e) => {
                        let _ = status_tx.send(Startup::Failed(e));
                        return;
                    }
                };
                let _ = status_tx.send(Startup::Joined);
                let runner = match MlxModelRunner::load_shard(&path, &options, config, &group) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = status_tx.send(Startup::Failed(e));
                        return;
                    }
                };
                let _ = status_tx.send(Startup::Loaded(Box::new(runner.info())));
                lead(&group, runner, inbox, timeout / 4);
            })
            .map_err(|e| {
                RunnerError::Panicked(format!("could not start the leader thread: {e}"))
            })?;
        // Forming the group waits on the peers; loading is this rank's own work.
        let joined = status.recv_timeout(timeout);
        let info = match joined {
            Ok(Startup::Joined) => match status.recv() {
                Ok(Startup::Loaded(info)) => *info,
                Ok(Startup::Failed(e)) => return Err(e),
                Ok(Startup::Joined) | Err(_) => return Err(DistributedError::GroupLost.into()),
            },
            Ok(Startup::Failed(e)) => return Err(e),
            Ok(Startup::Loaded(_)) | Err(RecvTimeoutError::Disconnected) => {
                return Err(DistributedError::GroupLost.into())
            }
            Err(RecvTimeoutError::Timeout) => {
                // The thread is blocked in the backend's connect; left behind.
                return Err(DistributedError::PeerTimeout {
                    timeout,
                    during: "forming the group",
                }
                .into());
            }
        };
        Ok(TensorParallelRunner {
            commands: Some(commands),
            info,
            last_metrics: Mutex::new(RunnerMetrics::default()),
            timeout,
            ranks: expected,
            lost: false,
            worker: Some(worker),
            done,
        })
    }

    /// Report `ids` as the ids that end generation in [`ModelRunner::info`]
    /// (the model's merged with the tokenizer's, as a bundle does).
    pub fn set_eos_token_ids(&mut self, ids: Vec<u32>) {
        self.info.eos_token_ids = ids;
    }

    /// The number of ranks in the group.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Whether a peer was lost: every call now fails, and the process
    /// should end through [`crate::distributed::exit_process`].
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// Send a command and wait for its reply within the peer timeout.
    fn call<T>(
        &mut self,
        during: &'static str,
        make: impl FnOnce(mpsc::Sender<Result<T, RunnerError>>) -> Command,
    ) -> Result<T, RunnerError> {
        if self.lost {
            return Err(DistributedError::GroupLost.into());
        }
        let (tx, rx) = mpsc::channel();
        let sent = self
            .commands
            .as_ref()
            .is_some_and(|c| c.send(make(tx)).is_ok());
        if !sent {
            self.lost = true;
            return Err(DistributedError::GroupLost.into());
        }
        match rx.recv_timeout(self.timeout) {
            Ok(r) => {
                if matches!(r, Err(RunnerError::Distributed(_))) {
                    self.lost = true;
                }
                r
            }
            Err(RecvTimeoutError::Timeout) => {
                self.lost = true;
                Err(DistributedError::PeerTimeout {
                    timeout: self.timeout,
                    during,
                }
                .into())
            }
            Err(RecvTimeoutError::Disconnected) => {
                self.lost = true;
                Err(DistributedError::GroupLost.into())
            }
        }
    }
}

/// The leader thread: every call is broadcast, then run here; while idle,
/// heartbeats. Ends (after telling the followers) when the runner is
/// dropped, or when a broadcast fails.
fn lead(
    group: &Group,
    mut runner: MlxModelRunner,
    inbox: mpsc::Receiver<Command>,
    heartbeat: Duration,
) {
    let broadcast = |m: &Message| -> Result<(), RunnerError> {
        group.broadcast_i32(0, &protocol::encode(m))?;
        Ok(())
    };
    loop {
        let command = match inbox.recv_timeout(heartbeat) {
            Ok(c) => c,
            Err(RecvTimeoutError::Timeout) => {
                if broadcast(&Message::Heartbeat).is_err() {
                    return;
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = broadcast(&Message::Shutdown);
                return;
            }
        };
        match command {
            Command::Forward(batch, reply) => {
                let message = Message::Forward(batch);
                let sent = broadcast(&message);
                let Message::Forward(batch) = message else {
                    unreachable!("built as Forward above")
                };
                let failed = sent.is_err();
                let _ = reply.send(sent.and_then(|()| runner.forward(&batch)));
                if failed {
                    return;
                }
            }
            Command::Release(ids) => {
                let sent = broadcast(&Message::Release(ids.clone()));
                if sent.is_err() {
                    return;
                }
                runner.release(&ids);
            }
            Command::CopyPrefix(from, to, tokens, reply) => {
                let sent = broadcast(&Message::CopyPrefix(from, to, tokens));
                let failed = sent.is_err();
                let _ = reply.send(sent.and_then(|()| runner.copy_prefix(from, to, tokens)));
                if failed {
                    return;
                }
            }
            Command::Metrics(reply) => {
                let _ = reply.send(runner.metrics());
            }
        }
    }
}

impl ModelRunner for TensorParallelRunner {
    fn info(&self) -> RunnerInfo {
        self.info.clone()
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, RunnerError> {
        self.call("running a forward batch", |reply| {
            Command::Forward(batch.clone(), reply)
        })
    }

    fn release(&mut self, ids: &[RequestId]) {
        if self.lost {
            return;
        }
        let sent = self
            .commands
            .as_ref()
            .is_some_and(|c| c.send(Command::Release(ids.to_vec())).is_ok());
        if !sent {
            self.lost = true;
        }
    }

    fn metrics(&self) -> RunnerMetrics {
        let mut last = self.last_metrics.lock().unwrap_or_else(|p| p.into_inner());
        if !self.lost {
            let (tx, rx) = mpsc::channel();
            if let Some(c) = &self.commands {
                if c.send(Command::Metrics(tx)).is_ok() {
                    if let Ok(m) = rx.recv_timeout(self.timeout) {
                        *last = m;
                    }
                }
            }
        }
        last.clone()
    }

    fn copy_prefix(
        &mut self,
        from: RequestId,
        to: RequestId,
        tokens: usize,
    ) -> Result<(), RunnerError> {
        self.call("copying a prefix", |reply| {
            Command::CopyPrefix(from, to, tokens, reply)
        })
    }
}

impl Drop for TensorParallelRunner {
    fn drop(&mut self) {
        // Closing the channel makes the thread tell the followers to stop.
        self.commands = None;
        let Some(worker) = self.worker.take() else {
            return;
        };
        if self.lost {
            // Its thread may be blocked in the backend for good.
            return;
        }
        match self.done.recv_timeout(self.timeout) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                let _ = worker.join();
            }
            Err(RecvTimeoutError::Timeout) => {
                eprintln!("mlx-backend: the tensor-parallel leader thread did not stop in time");
            }
        }
    }
}

/// A rank other than 0: its shard of the model, replaying rank 0's calls.
pub struct Follower {
    group: Group,
    runner: MlxModelRunner,
    timeout: Duration,
    watchdog: Watchdog,
    /// Why the last failed step failed here, for [`Follower::last_error`].
    last_error: Option<RunnerError>,
}

impl Follower {
    fn start(
        path: &Path,
        options: &LoadOptions,
        config: RunnerConfig,
        expected: usize,
    ) -> Result<Follower, RunnerError> {
        let timeout = config.peer_timeout;
        let watchdog = Watchdog::start(timeout);
        let group = join(expected)?;
        // Loading is this rank's own work: no peer to wait for.
        watchdog.pause();
        let runner = MlxModelRunner::load_shard(path, options, config, &group)?;
        // Rank 0 may still be loading its shard when the first message is
        // awaited: the first wait gets a longer limit.
        watchdog.set_limit(timeout.saturating_mul(4));
        Ok(Follower {
            group,
            runner,
            timeout,
            watchdog,
            last_error: None,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// The shard's runner (for its info and metrics).
    pub fn runner(&self) -> &MlxModelRunner {
        &self.runner
    }

    /// The error of the last step that failed on this rank (rank 0 reports
    /// the same one to its caller).
    pub fn last_error(&self) -> Option<&RunnerError> {
        self.last_error.as_ref()
    }

    /// A follower process's whole life, for programs whose ranks other than
    /// 0 do nothing else: [`follow`](Self::follow), then exit with 0 when
    /// rank 0 shut the group down, or print the error and exit with 1.
    pub fn follow_then_exit(mut self) -> ! {
        let code = match self.follow() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: rank {}: {e}", self.rank());
                1
            }
        };
        drop(self);
        std::process::exit(code)
    }

    /// Replay rank 0's calls until it shuts the group down (`Ok`), or a
    /// collective fails (`Err`: end the process through
    /// [`crate::distributed::exit_process`]). If rank 0 is not heard from
    /// for the peer timeout, the process exits with
    /// [`LEADER_LOST_EXIT_CODE`].
    pub fn follow(&mut self) -> Result<(), RunnerError> {
        loop {
            let words = self.group.broadcast_i32(0, &[])?;
            self.watchdog.set_limit(self.timeout);
            let result = match protocol::decode(&words)? {
                Message::Heartbeat => Ok(()),
                Message::Shutdown => return Ok(()),
                Message::Forward(batch) => self.runner.forward(&batch).map(|_| ()),
                Message::Release(ids) => {
                    self.runner.release(&ids);
                    Ok(())
                }
                Message::CopyPrefix(from, to, tokens) => self.runner.copy_prefix(from, to, tokens),
            };
            if let Err(e) = result {
                self.last_error = Some(e);
            }
            self.watchdog.touch();
        }
    }
}
