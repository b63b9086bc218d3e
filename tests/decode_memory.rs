//! A decode loop allocates nothing that outlives its step: with the fused
//! `decoder_layer` blocks every KV cache buffer is updated in place, so
//! MLX's active memory stays flat from step to step (until a cache fills
//! its capacity and grows). Alone in its binary: active memory is
//! process-wide.

mod common;

use common::tiny::{runner, tokens};
use mlx_backend::kernels::{registry, Kernel};
use mlx_backend::runner::*;

#[test]
fn decode_steps_keep_active_memory_flat() {
    // The claim is about the decoder_layer body, which only the CPU has.
    mlx_backend::Device::Cpu.set_default().unwrap();
    let mut r = runner(6);
    let prompt = tokens(7, 5);
    let step = |r: &mut MlxModelRunner, input: RequestInput| {
        let mode = if input.tokens.len() == 1 && input.cached_tokens > 0 {
            ForwardMode::Decode
        } else {
            ForwardMode::Extend
        };
        r.forward(&ForwardBatch::new(mode, vec![input]))
            .unwrap()
            .outputs[0]
            .next_token
            .unwrap()
    };
    let mut token = step(
        &mut r,
        RequestInput::prompt(1, prompt.clone(), SamplingParams::greedy()),
    );
    let fused_before = registry::snapshot().get(Kernel::DecoderLayer).fused;
    let copies_before = mlx_backend::kernels::decoder_layer::cache_copies();
    let mut active = Vec::new();
    // 5 prompt tokens + 60 steps stay inside the first 256-position block.
    for i in 0..60 {
        let cached = prompt.len() + i;
        token = step(
            &mut r,
            RequestInput::decode(1, token, cached, SamplingParams::greedy()),
        );
        active.push(mlx_backend::memory::active_memory());
    }
    assert!(
        registry::snapshot().get(Kernel::DecoderLayer).fused > fused_before,
        "the decode steps did not use the fused blocks"
    );
    assert_eq!(
        mlx_backend::kernels::decoder_layer::cache_copies(),
        copies_before,
        "a cache was copied instead of updated in place"
    );
    // The first steps may still settle (warm buffers); after that, flat.
    let settled = &active[5..];
    assert!(
        settled.iter().all(|&a| a == settled[0]),
        "active memory changed across decode steps: {settled:?}"
    );
}
