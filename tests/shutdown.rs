//! Orderly shutdown: dropping the last [`RunnerHandle`] stops and joins the
//! runner thread, so the runner and every MLX array it holds are gone when
//! the drop returns (and so before a process's exit runs MLX's static
//! destructors).

use mlx_backend::model::LoadOptions;
use mlx_backend::runner::{
    ForwardBatch, ForwardMode, ForwardOutput, MlxModelRunner, ModelRunner, RequestId, RequestInput,
    RunnerConfig, RunnerError, RunnerHandle, RunnerInfo, RunnerMetrics, SamplingParams,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

/// A real runner whose drop is slow and observable.
struct SlowToDrop {
    inner: MlxModelRunner,
    dropped: Arc<AtomicBool>,
}

impl Drop for SlowToDrop {
    fn drop(&mut self) {
        std::thread::sleep(Duration::from_millis(200));
        self.dropped.store(true, Ordering::SeqCst);
    }
}

impl ModelRunner for SlowToDrop {
    fn info(&self) -> RunnerInfo {
        self.inner.info()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<ForwardOutput, RunnerError> {
        self.inner.forward(batch)
    }
    fn release(&mut self, ids: &[RequestId]) {
        self.inner.release(ids)
    }
    fn metrics(&self) -> RunnerMetrics {
        self.inner.metrics()
    }
}

#[test]
fn dropping_the_last_handle_joins_the_runner_thread() {
    let folder = common::tiny::tiny_llama_folder(21, true);
    let path = folder.path().to_path_buf();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&dropped);
    let handle = RunnerHandle::spawn(move || {
        Ok(SlowToDrop {
            inner: MlxModelRunner::load(&path, &LoadOptions::default(), RunnerConfig::default())?,
            dropped: flag,
        })
    })
    .unwrap();
    let clone = handle.clone();
    let out = clone
        .forward(ForwardBatch::new(
            ForwardMode::Extend,
            vec![RequestInput::prompt(
                1,
                vec![1, 2, 3],
                SamplingParams::greedy(),
            )],
        ))
        .unwrap();
    assert!(out.outputs[0].next_token.is_some());
    drop(handle);
    // Another handle is alive: the runner must still serve.
    assert!(!dropped.load(Ordering::SeqCst));
    clone.info().unwrap();
    drop(clone);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the runner outlived its last handle"
    );
}
