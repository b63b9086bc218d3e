//! `ModelRunner::copy_prefix`: a request started from another request's
//! cached prefix generates what it generates when it prefills everything.

mod common;

use mlx_backend::engine::ModelBundle;
use mlx_backend::model::LoadOptions;
use mlx_backend::runner::{
    ForwardBatch, ForwardMode, MlxModelRunner, ModelRunner, RequestInput, RunnerConfig,
    RunnerError, SamplingParams,
};
use mlx_backend::Device;

fn greedy() -> SamplingParams {
    SamplingParams::greedy()
}

/// Prefill `prompt[start..]` for `id` (which holds `start` tokens), then
/// decode to `n` tokens; returns them.
fn continue_greedy(
    r: &mut MlxModelRunner,
    id: u64,
    prompt: &[u32],
    start: usize,
    n: usize,
) -> Vec<u32> {
    let out = r
        .forward(&ForwardBatch::new(
            ForwardMode::Extend,
            vec![RequestInput::chunk(
                id,
                prompt[start..].to_vec(),
                start,
                true,
                greedy(),
            )],
        ))
        .unwrap();
    let mut t = vec![out.outputs[0].next_token.unwrap()];
    while t.len() < n {
        let d = RequestInput::decode(id, *t.last().unwrap(), prompt.len() + t.len() - 1, greedy());
        let out = r
            .forward(&ForwardBatch::new(ForwardMode::Decode, vec![d]))
            .unwrap();
        t.push(out.outputs[0].next_token.unwrap());
    }
    t
}

#[test]
fn a_copied_prefix_generates_what_a_full_prefill_does() {
    let Some(path) = common::runs::cached_default_model() else {
        return;
    };
    let b = ModelBundle::load(
        &path,
        &LoadOptions::for_device(Device::Cpu),
        RunnerConfig::default(),
    )
    .unwrap();
    let mut r = b.runner;
    let tok = b.tokenizer;
    let a = tok
        .encode(
            "The quick brown fox jumps over the lazy dog. Then it runs into the forest and",
            true,
        )
        .unwrap();
    let c = tok
        .encode(
            "The quick brown fox jumps over the lazy dog. Then it sleeps under a tree because",
            true,
        )
        .unwrap();
    let shared = a.iter().zip(&c).take_while(|(x, y)| x == y).count();
    assert!(shared > 8);
    // References: each prompt alone.
    let want_a = continue_greedy(&mut r, 1, &a, 0, 12);
    let want_c = continue_greedy(&mut r, 2, &c, 0, 12);
    r.release(&[2]);
    // From a running donor that has decoded past its prompt (fused decode
    // wrote its buffers since), and from a finished one.
    r.copy_prefix(1, 3, shared).unwrap();
    assert_eq!(r.metrics().active_requests, 2);
    assert_eq!(continue_greedy(&mut r, 3, &c, shared, 12), want_c);
    // The donor is unchanged.
    let d = RequestInput::decode(1, want_a[11], a.len() + 11, greedy());
    r.forward(&ForwardBatch::new(ForwardMode::Decode, vec![d]))
        .unwrap();
    r.copy_prefix(1, 4, a.len() - 1).unwrap();
    assert_eq!(continue_greedy(&mut r, 4, &a, a.len() - 1, 12), want_a);
    // Errors change nothing.
    assert!(matches!(
        r.copy_prefix(77, 5, 3),
        Err(RunnerError::UnknownRequest(77))
    ));
    assert!(matches!(
        r.copy_prefix(1, 3, 3),
        Err(RunnerError::DuplicateRequest(3))
    ));
    assert!(matches!(
        r.copy_prefix(1, 5, 10_000),
        Err(RunnerError::CachedMismatch { .. })
    ));
    r.release(&[1, 3, 4]);
    assert_eq!(r.metrics().active_requests, 0);
}

#[test]
fn copies_between_batched_decodes_change_no_row() {
    let Some(path) = common::runs::cached_default_model() else {
        return;
    };
    // Shared prefixes, then whole prompts shared (a one-token last chunk).
    for same_prompts in [false, true] {
        copies_between_batched_decodes(&path, same_prompts);
    }
}

fn copies_between_batched_decodes(path: &std::path::Path, same_prompts: bool) {
    let b = ModelBundle::load(
        path,
        &LoadOptions::for_device(Device::Cpu),
        RunnerConfig::default(),
    )
    .unwrap();
    let mut r = b.runner;
    let tok = b.tokenizer;
    let prompts: Vec<Vec<u32>> = [
        "The quick brown fox jumps over the lazy dog. Then it runs into the forest and",
        "The quick brown fox jumps over the lazy dog. Then it sleeps under a tree because",
        "Once upon a time, in a small village by the sea, there lived an old",
        "Once upon a time, in a small village by the sea, there was a baker who",
    ]
    .iter()
    .map(|t| tok.encode(t, true).unwrap())
    .collect();
    let mut prompts = prompts;
    if same_prompts {
        prompts[1] = prompts[0].clone();
        prompts[3] = prompts[2].clone();
    }
    let n = 10;
    let want: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            let t = continue_greedy(&mut r, 100 + i as u64, &prompts[i], 0, n);
            r.release(&[100 + i as u64]);
            t
        })
        .collect();
    // Rows 0 and 2 prefill and decode together; rows 1 and 3 start from
    // copies of their prefixes while those decode.
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); 4];
    let mut held = [0usize; 4];
    let out = r
        .forward(&ForwardBatch::new(
            ForwardMode::Extend,
            [0, 2]
                .iter()
                .map(|&i| RequestInput::prompt(i as u64, prompts[i].clone(), greedy()))
                .collect(),
        ))
        .unwrap();
    for (o, &i) in out.outputs.iter().zip(&[0usize, 2]) {
        got[i].push(o.next_token.unwrap());
        held[i] = prompts[i].len();
    }
    let mut started = false;
    for _step in 0..n + 2 {
        let mut inputs = Vec::new();
        for i in 0..4 {
            if held[i] > 0 && got[i].len() < n {
                inputs.push(RequestInput::decode(
                    i as u64,
                    *got[i].last().unwrap(),
                    held[i],
                    greedy(),
                ));
            }
        }
        if !started {
            started = true;
            for (i, donor) in [(1usize, 0u64), (3, 2)] {
                let shared = prompts[i]
                    .iter()
                    .zip(&prompts[donor as usize])
                    .take_while(|(x, y)| x == y)
                    .count()
                    .min(prompts[i].len() - 1);
                r.copy_prefix(donor, i as u64, shared).unwrap();
                inputs.push(RequestInput::chunk(
                    i as u64,
                    prompts[i][shared..].to_vec(),
                    shared,
                    true,
                    greedy(),
                ));
            }
        }
        if inputs.is_empty() {
            break;
        }
        let out = r
            .forward(&ForwardBatch::new(ForwardMode::Mixed, inputs))
            .unwrap();
        for o in out.outputs {
            let i = o.id as usize;
            held[i] = if got[i].is_empty() {
                prompts[i].len()
            } else {
                held[i] + 1
            };
            got[i].push(o.next_token.unwrap());
        }
    }
    for i in 0..4 {
        assert_eq!(got[i], want[i], "row {i}");
    }
}

#[test]
fn a_one_token_chunk_that_is_not_the_last() {
    let Some(path) = common::runs::cached_default_model() else {
        return;
    };
    let b = ModelBundle::load(
        &path,
        &LoadOptions::for_device(Device::Cpu),
        RunnerConfig::default(),
    )
    .unwrap();
    let mut r = b.runner;
    let p = b
        .tokenizer
        .encode(
            "Once upon a time, in a small village by the sea, there lived an old",
            true,
        )
        .unwrap();
    let want = continue_greedy(&mut r, 1, &p, 0, 6);
    r.release(&[1]);
    for (id, split) in [(2u64, 10usize), (3, 0)] {
        // [0, split) as one chunk (none when 0), then one token, then the rest.
        if split > 0 {
            r.forward(&ForwardBatch::new(
                ForwardMode::Extend,
                vec![RequestInput::chunk(
                    id,
                    p[..split].to_vec(),
                    0,
                    false,
                    greedy(),
                )],
            ))
            .unwrap();
        }
        r.forward(&ForwardBatch::new(
            ForwardMode::Extend,
            vec![RequestInput::chunk(
                id,
                p[split..split + 1].to_vec(),
                split,
                false,
                greedy(),
            )],
        ))
        .unwrap();
        let got = continue_greedy(&mut r, id, &p, split + 1, 6);
        assert_eq!(got, want, "split at {split}");
    }
}
