//! A request's event channel: the scheduler thread sends, the caller
//! receives blocking (`recv`, `Iterator`) or async (`next`, `poll_next`,
//! no runtime needed). Dropping the receiving end cancels the request: the
//! scheduler sees the flag at its next step and releases the request's KV.

use super::request::{Event, Finished};
use crate::runner::RequestId;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

#[derive(Default)]
struct State {
    events: VecDeque<Event>,
    /// The sender is gone: no more events will come.
    closed: bool,
    waker: Option<Waker>,
}

#[derive(Default)]
struct Channel {
    state: Mutex<State>,
    ready: Condvar,
    cancelled: AtomicBool,
}

impl Channel {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The scheduler's end.
pub(crate) struct EventSender {
    channel: Arc<Channel>,
}

impl EventSender {
    pub fn send(&self, event: Event) {
        let mut s = self.channel.lock();
        s.events.push_back(event);
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        drop(s);
        self.channel.ready.notify_all();
    }

    /// The receiver was dropped or the request aborted.
    pub fn cancelled(&self) -> bool {
        self.channel.cancelled.load(Ordering::Acquire)
    }

    pub fn cancel(&self) {
        self.channel.cancelled.store(true, Ordering::Release);
    }
}

impl Drop for EventSender {
    fn drop(&mut self) {
        let mut s = self.channel.lock();
        s.closed = true;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        drop(s);
        self.channel.ready.notify_all();
    }
}

pub(crate) fn channel(id: RequestId, prompt_tokens: usize) -> (EventSender, EventStream) {
    let channel = Arc::new(Channel::default());
    (
        EventSender {
            channel: Arc::clone(&channel),
        },
        EventStream {
            id,
            prompt_tokens,
            channel,
            done: false,
        },
    )
}

/// The events of one request. See the module docs.
pub struct EventStream {
    id: RequestId,
    prompt_tokens: usize,
    channel: Arc<Channel>,
    done: bool,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("id", &self.id)
            .field("prompt_tokens", &self.prompt_tokens)
            .finish()
    }
}

impl EventStream {
    /// The request's id (for [`Engine::abort`](super::Engine::abort)).
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// Tokens in the prompt as the engine tokenized it.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    fn take(&mut self, s: &mut State) -> Option<Option<Event>> {
        if let Some(e) = s.events.pop_front() {
            if matches!(e, Event::Finished(_)) {
                self.done = true;
            }
            return Some(Some(e));
        }
        (s.closed || self.done).then_some(None)
    }

    /// The next event, blocking; None after `Finished`.
    pub fn recv(&mut self) -> Option<Event> {
        let channel = Arc::clone(&self.channel);
        let mut s = channel.lock();
        loop {
            if let Some(r) = self.take(&mut s) {
                return r;
            }
            s = channel.ready.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// [`recv`](Self::recv) waiting at most `timeout`: `Timeout` when
    /// nothing came, `Disconnected` after `Finished`.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Event, RecvTimeoutError> {
        let channel = Arc::clone(&self.channel);
        let deadline = std::time::Instant::now() + timeout;
        let mut s = channel.lock();
        loop {
            if let Some(r) = self.take(&mut s) {
                return r.ok_or(RecvTimeoutError::Disconnected);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(RecvTimeoutError::Timeout);
            }
            s = channel
                .ready
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The next event, for async callers; None after `Finished`.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let channel = Arc::clone(&self.channel);
        let mut s = channel.lock();
        match self.take(&mut s) {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// The next event, awaited; None after `Finished`.
    pub async fn next_event(&mut self) -> Option<Event> {
        poll_fn(|cx| self.poll_next(cx)).await
    }

    /// Cancel the request; `Finished` with `Abort` follows.
    pub fn abort(&self) {
        self.channel.cancelled.store(true, Ordering::Release);
    }

    /// Block until the end: the whole text, the sampled tokens and how it
    /// ended.
    pub fn collect_all(mut self) -> Collected {
        let mut c = Collected::default();
        while let Some(e) = self.recv() {
            match e {
                Event::Delta { text, token } => {
                    c.text.push_str(&text);
                    c.tokens.extend(token.map(|t| t.id));
                }
                Event::Finished(f) => c.finished = Some(f),
            }
        }
        c
    }
}

/// What [`EventStream::collect_all`] gathers.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    /// The whole generated text.
    pub text: String,
    /// Every sampled token id.
    pub tokens: Vec<u32>,
    /// None only when the engine went away without a word (it never does).
    pub finished: Option<Finished>,
}

impl Iterator for EventStream {
    type Item = Event;
    fn next(&mut self) -> Option<Event> {
        self.recv()
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        if !self.done {
            self.channel.cancelled.store(true, Ordering::Release);
        }
    }
}
