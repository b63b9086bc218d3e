//! [`RunnerHandle`]: a runner on a thread of its own (MLX streams and arrays
//! belong to the thread that made them), reachable from any thread. It is
//! `Send + Sync + Clone`, offers blocking and async `forward`, returns errors
//! as values, and turns a panic on the runner's thread into an error: a
//! caller never hangs.
//!
//! Shutdown order: when the last clone of a handle is dropped, the command
//! channel closes, the runner thread leaves its loop and drops the runner
//! (its model, KV caches and every MLX array it holds), and the dropping
//! thread joins it. So no MLX array outlives the handles: a process that
//! returns from `main` after dropping its handles never frees arrays on
//! the runner thread while MLX's static allocator and scheduler are being
//! destroyed (that race corrupted the heap at exit).

use super::batch::{ForwardBatch, ForwardOutput, RequestId};
use super::error::RunnerError;
use super::metrics::RunnerMetrics;
use super::{ModelRunner, RunnerInfo};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread;

/// Delivers one result; if dropped unused (the runner thread is gone), it
/// delivers `Stopped`, so no caller ever waits forever.
type Deliver<T> = Box<dyn FnOnce(Result<T, RunnerError>) + Send>;

struct Reply<T> {
    deliver: Option<Deliver<T>>,
}

impl<T> Reply<T> {
    fn new(f: impl FnOnce(Result<T, RunnerError>) + Send + 'static) -> Self {
        Reply {
            deliver: Some(Box::new(f)),
        }
    }

    fn send(mut self, r: Result<T, RunnerError>) {
        if let Some(f) = self.deliver.take() {
            f(r);
        }
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        if let Some(f) = self.deliver.take() {
            f(Err(RunnerError::Stopped));
        }
    }
}

enum Command {
    Forward(ForwardBatch, Reply<ForwardOutput>),
    Release(Vec<RequestId>),
    Info(Reply<RunnerInfo>),
    Metrics(Reply<RunnerMetrics>),
    CopyPrefix(RequestId, RequestId, usize, Reply<()>),
}

#[derive(Clone)]
/// A `Send + Sync + Clone` handle to a runner on a thread of its own.
///
/// MLX streams belong to the thread that made them, so the runner lives on
/// one thread and every call is a message to it. Dropping the last handle
/// stops the thread and joins it.
pub struct RunnerHandle {
    // Declared before `_thread`: the last handle closes its sender first, so
    // the runner thread's loop ends before `RunnerThread::drop` joins it.
    commands: mpsc::Sender<Command>,
    _thread: Arc<RunnerThread>,
    /// What `info` said last, for [`ModelRunner::info`] once the thread is gone.
    last_info: Arc<Mutex<Option<RunnerInfo>>>,
}

/// The runner thread, joined when the last handle goes.
struct RunnerThread {
    join: Option<thread::JoinHandle<()>>,
}

impl Drop for RunnerThread {
    fn drop(&mut self) {
        let Some(join) = self.join.take() else { return };
        // A handle dropped on the runner thread itself (a runner that keeps
        // a handle to itself) cannot wait for its own thread: that thread
        // ends right after this drop anyway.
        if join.thread().id() == thread::current().id() {
            return;
        }
        // The runner thread catches panics of the runner's calls; a panic
        // in the runner's own drop is reported, not re-raised in this drop.
        if let Err(p) = join.join() {
            eprintln!(
                "mlx-backend: the runner thread panicked while shutting down: {}",
                panic_message(p)
            );
        }
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl RunnerHandle {
    /// Start a thread, build the runner there with `make`, and serve it.
    /// Returns once the runner is built (or failed to build).
    pub fn spawn<R, F>(make: F) -> Result<RunnerHandle, RunnerError>
    where
        R: ModelRunner + 'static,
        F: FnOnce() -> Result<R, RunnerError> + Send + 'static,
    {
        let (commands, inbox) = mpsc::channel::<Command>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), RunnerError>>();
        let join = thread::Builder::new()
            .name("mlx-runner".into())
            .spawn(move || {
                let runner = match catch_unwind(AssertUnwindSafe(make)) {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                    Err(p) => {
                        let _ = ready_tx.send(Err(RunnerError::Panicked(panic_message(p))));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                serve(runner, inbox);
            })
            .map_err(|e| {
                RunnerError::Panicked(format!("could not start the runner thread: {e}"))
            })?;
        let thread = Arc::new(RunnerThread { join: Some(join) });
        // On a build failure `thread` is dropped here, which joins the
        // thread that has already returned.
        ready_rx.recv().map_err(|_| RunnerError::Stopped)??;
        Ok(RunnerHandle {
            commands,
            _thread: thread,
            last_info: Arc::new(Mutex::new(None)),
        })
    }

    fn call<T: Send + 'static>(
        &self,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<T, RunnerError> {
        let (tx, rx) = mpsc::channel();
        let reply = Reply::new(move |r| {
            let _ = tx.send(r);
        });
        self.commands
            .send(make(reply))
            .map_err(|_| RunnerError::Stopped)?;
        rx.recv().map_err(|_| RunnerError::Stopped)?
    }

    /// Run one batch, blocking until it is done.
    pub fn forward(&self, batch: ForwardBatch) -> Result<ForwardOutput, RunnerError> {
        self.call(|reply| Command::Forward(batch, reply))
    }

    /// Run one batch; the future resolves when the runner thread is done.
    pub fn forward_async(&self, batch: ForwardBatch) -> ForwardFuture {
        let shared = Arc::new(Mutex::new(Slot::default()));
        let producer = Arc::clone(&shared);
        let reply = Reply::new(move |r| {
            let mut slot = producer.lock().unwrap_or_else(|p| p.into_inner());
            slot.value = Some(r);
            if let Some(w) = slot.waker.take() {
                w.wake();
            }
        });
        // A failed send drops the command, and with it the reply: `Stopped`.
        let _ = self.commands.send(Command::Forward(batch, reply));
        ForwardFuture { shared }
    }

    /// Frees the KV state of `ids` (unknown ids are ignored).
    pub fn release(&self, ids: &[RequestId]) {
        let _ = self.commands.send(Command::Release(ids.to_vec()));
    }

    /// What the runner serves.
    pub fn info(&self) -> Result<RunnerInfo, RunnerError> {
        self.call(Command::Info)
    }

    /// The runner's counters now.
    pub fn metrics(&self) -> Result<RunnerMetrics, RunnerError> {
        self.call(Command::Metrics)
    }

    /// [`ModelRunner::copy_prefix`] on the runner thread, blocking.
    pub fn copy_prefix(
        &self,
        from: RequestId,
        to: RequestId,
        tokens: usize,
    ) -> Result<(), RunnerError> {
        self.call(|reply| Command::CopyPrefix(from, to, tokens, reply))
    }
}

/// A handle is a runner too, so an engine generic over [`ModelRunner`]
/// drives a runner on its own thread or one on another thread alike. The
/// infallible calls answer what they can once the runner thread is gone:
/// `info` what it said last, `metrics` zeros.
impl ModelRunner for RunnerHandle {
    fn info(&self) -> RunnerInfo {
        match RunnerHandle::info(self) {
            Ok(info) => {
                *self.last_info.lock().unwrap_or_else(|p| p.into_inner()) = Some(info.clone());
                info
            }
            Err(_) => self
                .last_info
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or_else(|| RunnerInfo {
                    architecture: String::new(),
                    vocab_size: 0,
                    eos_token_ids: Vec::new(),
                    max_context: 0,
                    kv_capacity_tokens: 0,
                    dtype: crate::Dtype::F32,
                    device: crate::Device::Cpu,
                    fused_kernels: Vec::new(),
                }),
        }
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, RunnerError> {
        RunnerHandle::forward(self, batch.clone())
    }

    fn release(&mut self, ids: &[RequestId]) {
        RunnerHandle::release(self, ids)
    }

    fn metrics(&self) -> RunnerMetrics {
        RunnerHandle::metrics(self).unwrap_or_default()
    }

    fn copy_prefix(
        &mut self,
        from: RequestId,
        to: RequestId,
        tokens: usize,
    ) -> Result<(), RunnerError> {
        RunnerHandle::copy_prefix(self, from, to, tokens)
    }
}

fn serve<R: ModelRunner>(mut runner: R, inbox: mpsc::Receiver<Command>) {
    while let Ok(command) = inbox.recv() {
        match command {
            Command::Forward(batch, reply) => {
                let r = catch_unwind(AssertUnwindSafe(|| runner.forward(&batch)));
                let failed = r.is_err();
                reply.send(r.unwrap_or_else(|p| Err(RunnerError::Panicked(panic_message(p)))));
                if failed {
                    // The runner's state is unknown after a panic: stop serving,
                    // so every later call gets `Stopped` rather than a guess.
                    return;
                }
            }
            Command::Release(ids) => runner.release(&ids),
            Command::Info(reply) => reply.send(Ok(runner.info())),
            Command::Metrics(reply) => reply.send(Ok(runner.metrics())),
            Command::CopyPrefix(from, to, tokens, reply) => {
                let r = catch_unwind(AssertUnwindSafe(|| runner.copy_prefix(from, to, tokens)));
                let failed = r.is_err();
                reply.send(r.unwrap_or_else(|p| Err(RunnerError::Panicked(panic_message(p)))));
                if failed {
                    return;
                }
            }
        }
    }
}

#[derive(Default)]
struct Slot {
    value: Option<Result<ForwardOutput, RunnerError>>,
    waker: Option<Waker>,
}

/// The result of [`RunnerHandle::forward_async`].
pub struct ForwardFuture {
    shared: Arc<Mutex<Slot>>,
}

impl Future for ForwardFuture {
    type Output = Result<ForwardOutput, RunnerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        match slot.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
