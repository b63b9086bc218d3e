//! The ModelRunner contract on a tiny random Llama.

mod common;

use common::tiny::{load_tiny, runner, tokens};
use mlx_backend::runner::*;
use std::collections::HashMap;

/// Greedy generation of one request alone: prompt in one chunk, then decode.
fn solo(r: &mut MlxModelRunner, id: RequestId, prompt: &[u32], n: usize) -> Vec<u32> {
    common::runs::solo_greedy(r, id, prompt, n, &[])
}

/// Greedy generation of all `prompts` together: one Extend batch, then
/// Decode batches of every row (ids 0..n), `n` tokens each.
fn batched(r: &mut MlxModelRunner, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let reqs = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| RequestInput::prompt(i as u64, p.clone(), SamplingParams::greedy()))
        .collect();
    let out = r
        .forward(&ForwardBatch::new(ForwardMode::Extend, reqs))
        .unwrap();
    let mut got: Vec<Vec<u32>> = out
        .outputs
        .iter()
        .map(|o| vec![o.next_token.unwrap()])
        .collect();
    for _ in 1..n {
        let reqs = got
            .iter()
            .enumerate()
            .map(|(i, g)| {
                RequestInput::decode(
                    i as u64,
                    *g.last().unwrap(),
                    prompts[i].len() + g.len() - 1,
                    SamplingParams::greedy(),
                )
            })
            .collect();
        let out = r
            .forward(&ForwardBatch::new(ForwardMode::Decode, reqs))
            .unwrap();
        for (g, o) in got.iter_mut().zip(&out.outputs) {
            g.push(o.next_token.unwrap());
        }
    }
    got
}

#[test]
fn batched_decode_equals_sequential_for_ragged_lengths() {
    let mut r = runner(1);
    for b in [1usize, 3, 8] {
        let prompts: Vec<Vec<u32>> = (0..b).map(|i| tokens(100 + i as u64, 3 + 5 * i)).collect();
        let expected: Vec<Vec<u32>> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| solo(&mut r, 1000 + i as u64, p, 6))
            .collect();
        let got = batched(&mut r, &prompts, 6);
        assert_eq!(got, expected, "batch {b}");
        r.release(&(0..b as u64).collect::<Vec<_>>());
    }
}

#[test]
fn batched_decode_logits_equal_single_row_logits_bit_for_bit() {
    // Exact activations (the tiny model's LoadOptions) are batch-invariant:
    // nine rows reach the batched paths of every kernel (row_lanes from 8
    // rows on AVX2 under int16, the 4-row register blocks), yet each row's
    // logits equal its logits alone, so a server's greedy answers do not
    // depend on what else is in the batch.
    let mut r = runner(2);
    let prompts: Vec<Vec<u32>> = (0..9)
        .map(|i| tokens(7 + i, 2 + (5 * i as usize) % 13))
        .collect();
    let logits_of = |r: &mut MlxModelRunner, batch: Vec<RequestInput>| -> Vec<Vec<f32>> {
        let batch = batch
            .into_iter()
            .map(|i| {
                i.with_returns(ReturnOptions {
                    logits: true,
                    ..Default::default()
                })
            })
            .collect();
        r.forward(&ForwardBatch::new(ForwardMode::Decode, batch))
            .unwrap()
            .outputs
            .into_iter()
            .map(|o| o.logits.unwrap())
            .collect()
    };
    for (i, p) in prompts.iter().enumerate() {
        r.forward(&ForwardBatch::new(
            ForwardMode::Extend,
            vec![RequestInput::prompt(
                i as u64,
                p.clone(),
                SamplingParams::greedy(),
            )],
        ))
        .unwrap();
    }
    let batched = logits_of(
        &mut r,
        (0..prompts.len())
            .map(|i| RequestInput::decode(i as u64, 5, prompts[i].len(), SamplingParams::greedy()))
            .collect(),
    );
    r.release(&(0..prompts.len() as u64).collect::<Vec<_>>());
    for (i, p) in prompts.iter().enumerate() {
        r.forward(&ForwardBatch::new(
            ForwardMode::Extend,
            vec![RequestInput::prompt(9, p.clone(), SamplingParams::greedy())],
        ))
        .unwrap();
        let single = logits_of(
            &mut r,
            vec![RequestInput::decode(
                9,
                5,
                p.len(),
                SamplingParams::greedy(),
            )],
        );
        r.release(&[9]);
        let differ = batched[i]
            .iter()
            .zip(&single[0])
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ, 0,
            "row {i}: {differ} logits differ from the row alone"
        );
    }
}

#[test]
fn chunked_prefill_equals_one_shot() {
    let mut r = runner(3);
    let prompt = tokens(42, 70);
    let expected = solo(&mut r, 1, &prompt, 5);
    for chunk in [1usize, 7, 64] {
        let id = 10 + chunk as u64;
        let mut cached = 0;
        let mut first = None;
        while cached < prompt.len() {
            let end = (cached + chunk).min(prompt.len());
            let last = end == prompt.len();
            let req = RequestInput::chunk(
                id,
                prompt[cached..end].to_vec(),
                cached,
                last,
                SamplingParams::greedy(),
            );
            let out = r
                .forward(&ForwardBatch::new(ForwardMode::Extend, vec![req]))
                .unwrap();
            assert_eq!(
                out.outputs[0].next_token.is_some(),
                last,
                "only the last chunk samples"
            );
            first = out.outputs[0].next_token;
            cached = end;
        }
        let mut got = vec![first.unwrap()];
        while got.len() < 5 {
            let d = RequestInput::decode(
                id,
                *got.last().unwrap(),
                prompt.len() + got.len() - 1,
                SamplingParams::greedy(),
            );
            got.push(
                r.forward(&ForwardBatch::new(ForwardMode::Decode, vec![d]))
                    .unwrap()
                    .outputs[0]
                    .next_token
                    .unwrap(),
            );
        }
        assert_eq!(got, expected, "chunk {chunk}");
        r.release(&[id]);
    }
}

#[test]
fn mixed_batches_serve_prefill_chunks_and_decodes_together() {
    let mut r = runner(4);
    let (pa, pb) = (tokens(1, 9), tokens(2, 20));
    let ea = solo(&mut r, 100, &pa, 10);
    let eb = solo(&mut r, 101, &pb, 3);
    let first_a = r
        .forward(&ForwardBatch::new(
            ForwardMode::Extend,
            vec![RequestInput::prompt(
                1,
                pa.clone(),
                SamplingParams::greedy(),
            )],
        ))
        .unwrap()
        .outputs[0]
        .next_token
        .unwrap();
    let mut ga = vec![first_a];
    let mut gb = Vec::new();
    let mut b_cached = 0;
    // a decodes while b prefills in chunks of 8 in the same Mixed batches.
    while gb.len() < 3 {
        let mut reqs = vec![RequestInput::decode(
            1,
            *ga.last().unwrap(),
            pa.len() + ga.len() - 1,
            SamplingParams::greedy(),
        )];
        if b_cached < pb.len() {
            let end = (b_cached + 8).min(pb.len());
            reqs.push(RequestInput::chunk(
                2,
                pb[b_cached..end].to_vec(),
                b_cached,
                end == pb.len(),
                SamplingParams::greedy(),
            ));
            b_cached = end;
        } else {
            reqs.push(RequestInput::decode(
                2,
                *gb.last().unwrap(),
                pb.len() + gb.len() - 1,
                SamplingParams::greedy(),
            ));
        }
        let out = r
            .forward(&ForwardBatch::new(ForwardMode::Mixed, reqs))
            .unwrap();
        ga.push(out.outputs[0].next_token.unwrap());
        if let Some(t) = out.outputs[1].next_token {
            gb.push(t);
        }
    }
    assert_eq!(ga[..], ea[..ga.len()]);
    assert_eq!(gb, eb);
}

#[test]
fn the_same_seed_gives_the_same_tokens() {
    let mut r = runner(6);
    let params = |seed| SamplingParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.95,
        min_p: 0.02,
        repetition_penalty: 1.1,
        presence_penalty: 0.2,
        frequency_penalty: 0.1,
        logit_bias: vec![(7, 0.5)],
        seed: Some(seed),
    };
    let run = |r: &mut MlxModelRunner, id: u64, seed: u64| -> Vec<u32> {
        let p = tokens(77, 6);
        let mut out = vec![r
            .forward(&ForwardBatch::new(
                ForwardMode::Extend,
                vec![RequestInput::prompt(id, p.clone(), params(seed))],
            ))
            .unwrap()
            .outputs[0]
            .next_token
            .unwrap()];
        for _ in 0..15 {
            let d = RequestInput::decode(
                id,
                *out.last().unwrap(),
                p.len() + out.len() - 1,
                params(seed),
            );
            out.push(
                r.forward(&ForwardBatch::new(ForwardMode::Decode, vec![d]))
                    .unwrap()
                    .outputs[0]
                    .next_token
                    .unwrap(),
            );
        }
        r.release(&[id]);
        out
    };
    let a = run(&mut r, 1, 1234);
    let b = run(&mut r, 2, 1234);
    let c = run(&mut r, 3, 999);
    assert_eq!(a, b);
    assert_ne!(a, c, "different seeds should give different samples");
}

#[test]
fn sampling_transforms_behave() {
    let mut r = runner(7);
    let p = tokens(5, 5);
    let step = |r: &mut MlxModelRunner, params: SamplingParams, returns: ReturnOptions| {
        let out = r
            .forward(&ForwardBatch::new(
                ForwardMode::Extend,
                vec![RequestInput::prompt(1, p.clone(), params).with_returns(returns)],
            ))
            .unwrap();
        r.release(&[1]);
        out.outputs.into_iter().next().unwrap()
    };
    let all = ReturnOptions {
        logprob: true,
        top_logprobs: 5,
        logits: true,
    };
    let greedy = step(&mut r, SamplingParams::greedy(), all.clone());
    let logits = greedy.logits.clone().unwrap();
    let argmax = (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .unwrap() as u32;
    assert_eq!(greedy.next_token, Some(argmax));
    // logprob = logit - logsumexp(logits), computed here in f64.
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + logits
        .iter()
        .map(|&l| (l as f64 - m).exp())
        .sum::<f64>()
        .ln();
    assert!((greedy.logprob.unwrap() as f64 - (logits[argmax as usize] as f64 - lse)).abs() < 1e-4);
    assert_eq!(greedy.top_logprobs.len(), 5);
    assert_eq!(greedy.top_logprobs[0].0, argmax);
    assert!(greedy.top_logprobs.windows(2).all(|w| w[0].1 >= w[1].1));
    // top_k = 1 at any temperature is greedy.
    for seed in 0..5 {
        let t = step(
            &mut r,
            SamplingParams {
                temperature: 1.5,
                top_k: 1,
                seed: Some(seed),
                ..Default::default()
            },
            ReturnOptions::default(),
        );
        assert_eq!(t.next_token, Some(argmax));
    }
    // A huge logit bias forces a token; a huge repetition penalty avoids seen ones.
    let forced = step(
        &mut r,
        SamplingParams {
            logit_bias: vec![(11, 1e4)],
            ..Default::default()
        },
        ReturnOptions::default(),
    );
    assert_eq!(forced.next_token, Some(11));
    let avoid = step(
        &mut r,
        SamplingParams {
            presence_penalty: 1e4,
            ..Default::default()
        },
        ReturnOptions::default(),
    );
    assert!(!p.contains(&avoid.next_token.unwrap()));
    // top_p tiny keeps only the most likely token; min_p = 1 likewise.
    for params in [
        SamplingParams {
            temperature: 1.0,
            top_p: 1e-6,
            seed: Some(3),
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            min_p: 1.0,
            seed: Some(4),
            ..Default::default()
        },
    ] {
        assert_eq!(
            step(&mut r, params, ReturnOptions::default()).next_token,
            Some(argmax)
        );
    }
}

#[test]
fn bad_batches_give_typed_errors_and_others_keep_being_served() {
    let mut r = runner(8);
    let p = tokens(3, 6);
    let expected = solo(&mut r, 50, &p, 4);
    let first = r
        .forward(&ForwardBatch::new(
            ForwardMode::Extend,
            vec![RequestInput::prompt(1, p.clone(), SamplingParams::greedy())],
        ))
        .unwrap()
        .outputs[0]
        .next_token
        .unwrap();
    let good = |t: u32, cached: usize| RequestInput::decode(1, t, cached, SamplingParams::greedy());
    let vocab = r.info().vocab_size as u32;
    type Check = fn(&RunnerError) -> bool;
    let bad: Vec<(ForwardBatch, Check)> = vec![
        (
            ForwardBatch::new(
                ForwardMode::Decode,
                vec![
                    good(first, p.len()),
                    RequestInput::decode(99, 1, 3, SamplingParams::greedy()),
                ],
            ),
            |e| matches!(e, RunnerError::UnknownRequest(99)),
        ),
        (
            ForwardBatch::new(
                ForwardMode::Decode,
                vec![good(first, p.len()), good(first, p.len())],
            ),
            |e| matches!(e, RunnerError::DuplicateRequest(1)),
        ),
        (
            ForwardBatch::new(ForwardMode::Decode, vec![good(vocab, p.len())]),
            |e| matches!(e, RunnerError::InvalidToken { .. }),
        ),
        (
            ForwardBatch::new(ForwardMode::Decode, vec![good(first, p.len() + 3)]),
            |e| matches!(e, RunnerError::CachedMismatch { .. }),
        ),
        (
            ForwardBatch::new(
                ForwardMode::Extend,
                vec![RequestInput::prompt(
                    2,
                    tokens(1, 600),
                    SamplingParams::greedy(),
                )],
            ),
            |e| matches!(e, RunnerError::ContextTooLong { .. }),
        ),
        (
            ForwardBatch::new(
                ForwardMode::Extend,
                vec![RequestInput::prompt(3, vec![], SamplingParams::greedy())],
            ),
            |e| matches!(e, RunnerError::EmptyTokens(3)),
        ),
        (
            ForwardBatch::new(
                ForwardMode::Decode,
                vec![RequestInput {
                    tokens: vec![1, 2],
                    ..good(first, p.len())
                }],
            ),
            |e| matches!(e, RunnerError::BadDecode { .. }),
        ),
        (
            ForwardBatch::new(
                ForwardMode::Decode,
                vec![RequestInput {
                    sampling: SamplingParams {
                        top_p: 0.0,
                        ..Default::default()
                    },
                    ..good(first, p.len())
                }],
            ),
            |e| matches!(e, RunnerError::BadSampling { .. }),
        ),
    ];
    for (batch, check) in bad {
        let err = r.forward(&batch).unwrap_err();
        assert!(check(&err), "unexpected error {err}");
        assert!(!err.to_string().is_empty());
    }
    // Request 1 is intact and continues exactly as it would have.
    let mut got = vec![first];
    while got.len() < 4 {
        got.push(
            r.forward(&ForwardBatch::new(
                ForwardMode::Decode,
                vec![good(*got.last().unwrap(), p.len() + got.len() - 1)],
            ))
            .unwrap()
            .outputs[0]
                .next_token
                .unwrap(),
        );
    }
    assert_eq!(got, expected);
}

#[test]
fn kv_budget_is_enforced_without_losing_state() {
    let mut r = MlxModelRunner::new(
        load_tiny(9, true),
        RunnerConfig {
            kv_budget_tokens: 40,
            ..Default::default()
        },
    );
    r.forward(&ForwardBatch::new(
        ForwardMode::Extend,
        vec![RequestInput::prompt(
            1,
            tokens(1, 30),
            SamplingParams::greedy(),
        )],
    ))
    .unwrap();
    let err = r
        .forward(&ForwardBatch::new(
            ForwardMode::Extend,
            vec![RequestInput::prompt(
                2,
                tokens(2, 20),
                SamplingParams::greedy(),
            )],
        ))
        .unwrap_err();
    assert!(
        matches!(
            err,
            RunnerError::KvBudgetExceeded {
                needed: 20,
                available: 10,
                budget: 40
            }
        ),
        "{err}"
    );
    r.release(&[1]);
    r.forward(&ForwardBatch::new(
        ForwardMode::Extend,
        vec![RequestInput::prompt(
            2,
            tokens(2, 20),
            SamplingParams::greedy(),
        )],
    ))
    .unwrap();
    assert_eq!(r.metrics().cached_tokens, 20);
}

#[test]
fn stale_requests_are_released_when_configured() {
    let mut r = MlxModelRunner::new(
        load_tiny(10, true),
        RunnerConfig {
            release_missing_on_decode: true,
            ..Default::default()
        },
    );
    let reqs = (1..=2)
        .map(|i| RequestInput::prompt(i, tokens(i, 4), SamplingParams::greedy()))
        .collect();
    let out = r
        .forward(&ForwardBatch::new(ForwardMode::Extend, reqs))
        .unwrap();
    let t = out.outputs[0].next_token.unwrap();
    r.forward(&ForwardBatch::new(
        ForwardMode::Decode,
        vec![RequestInput::decode(1, t, 4, SamplingParams::greedy())],
    ))
    .unwrap();
    assert_eq!(r.metrics().active_requests, 1);
    let err = r
        .forward(&ForwardBatch::new(
            ForwardMode::Decode,
            vec![RequestInput::decode(2, t, 4, SamplingParams::greedy())],
        ))
        .unwrap_err();
    assert!(matches!(err, RunnerError::UnknownRequest(2)));
}

#[test]
fn engine_continuous_batching_through_the_handle_from_many_threads() {
    let folder = common::tiny::tiny_llama_folder(11, true);
    let f2 = folder.path().to_path_buf();
    let handle = RunnerHandle::spawn(move || {
        MlxModelRunner::load(
            &f2,
            &mlx_backend::model::LoadOptions::default(),
            RunnerConfig::default(),
        )
    })
    .unwrap();
    // Expected: each request's solo greedy output, from a separate runner.
    let mut solo_runner =
        MlxModelRunner::load(folder.path(), &Default::default(), RunnerConfig::default()).unwrap();
    let requests: Vec<(u64, Vec<u32>, usize)> = (0..20)
        .map(|i| {
            (
                i,
                tokens(500 + i, 2 + (i as usize * 7) % 23),
                2 + (i as usize * 5) % 9,
            )
        })
        .collect();
    let expected: HashMap<u64, Vec<u32>> = requests
        .iter()
        .map(|(id, p, n)| (*id, solo(&mut solo_runner, *id, p, *n)))
        .collect();

    // The engine: a scheduler thread batches whatever has arrived; clients submit over time.
    let (submit, inbox) =
        std::sync::mpsc::channel::<(u64, Vec<u32>, usize, std::sync::mpsc::Sender<Vec<u32>>)>();
    let engine_handle = handle.clone();
    let engine = std::thread::spawn(move || {
        struct Running {
            prompt_len: usize,
            want: usize,
            out: Vec<u32>,
            reply: std::sync::mpsc::Sender<Vec<u32>>,
        }
        let mut running: HashMap<u64, Running> = HashMap::new();
        let mut done = 0;
        while done < 20 {
            let mut new = Vec::new();
            while let Ok(r) = inbox.try_recv() {
                new.push(r);
            }
            if new.is_empty() && running.is_empty() {
                let r = inbox.recv().unwrap();
                new.push(r);
            }
            let mut reqs: Vec<RequestInput> = running
                .iter()
                .map(|(id, r)| {
                    RequestInput::decode(
                        *id,
                        *r.out.last().unwrap(),
                        r.prompt_len + r.out.len() - 1,
                        SamplingParams::greedy(),
                    )
                })
                .collect();
            for (id, p, want, reply) in new {
                reqs.push(RequestInput::prompt(
                    id,
                    p.clone(),
                    SamplingParams::greedy(),
                ));
                running.insert(
                    id,
                    Running {
                        prompt_len: p.len(),
                        want,
                        out: Vec::new(),
                        reply,
                    },
                );
            }
            let out = engine_handle
                .forward(ForwardBatch::new(ForwardMode::Mixed, reqs))
                .unwrap();
            for o in out.outputs {
                let r = running.get_mut(&o.id).unwrap();
                r.out.push(o.next_token.unwrap());
                if r.out.len() == r.want {
                    let r = running.remove(&o.id).unwrap();
                    engine_handle.release(&[o.id]);
                    r.reply.send(r.out).unwrap();
                    done += 1;
                }
            }
        }
    });
    let clients: Vec<_> = requests
        .chunks(5)
        .map(|chunk| {
            let chunk = chunk.to_vec();
            let submit = submit.clone();
            std::thread::spawn(move || {
                let mut results = Vec::new();
                for (id, p, n) in chunk {
                    std::thread::sleep(std::time::Duration::from_millis(3 * (id % 4)));
                    let (tx, rx) = std::sync::mpsc::channel();
                    submit.send((id, p, n, tx)).unwrap();
                    results.push((id, rx));
                }
                results
                    .into_iter()
                    .map(|(id, rx)| (id, rx.recv().unwrap()))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for c in clients {
        for (id, out) in c.join().unwrap() {
            assert_eq!(out, expected[&id], "request {id}");
        }
    }
    engine.join().unwrap();
    assert_eq!(handle.metrics().unwrap().active_requests, 0);
}

#[test]
fn handle_reports_errors_and_async_forward_works() {
    let folder = common::tiny::tiny_llama_folder(12, true);
    let path = folder.path().to_path_buf();
    let handle = RunnerHandle::spawn(move || {
        MlxModelRunner::load(&path, &Default::default(), RunnerConfig::default())
    })
    .unwrap();
    let err = handle
        .forward(ForwardBatch::new(
            ForwardMode::Decode,
            vec![RequestInput::decode(1, 1, 1, SamplingParams::greedy())],
        ))
        .unwrap_err();
    assert!(matches!(err, RunnerError::UnknownRequest(1)));
    let fut = handle.forward_async(ForwardBatch::new(
        ForwardMode::Extend,
        vec![RequestInput::prompt(
            1,
            tokens(1, 5),
            SamplingParams::greedy(),
        )],
    ));
    let out = block_on(fut).unwrap();
    assert!(out.outputs[0].next_token.is_some());
    let bad = RunnerHandle::spawn(|| -> Result<MlxModelRunner, RunnerError> {
        panic!("boom while loading")
    });
    assert!(matches!(bad, Err(RunnerError::Panicked(m)) if m.contains("boom")));
}

/// A minimal executor for the async API (no runtime dependency).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct ThreadWaker(std::thread::Thread);
    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}

#[test]
fn info_and_metrics_report_the_model_kernels_and_counts() {
    let mut r = runner(13);
    let info = r.info();
    assert_eq!(info.architecture, "llama");
    assert_eq!(info.vocab_size, common::tiny::VOCAB as usize);
    assert_eq!(info.eos_token_ids, vec![2]);
    assert_eq!(info.max_context, 512);
    assert_eq!(
        info.kv_capacity_tokens,
        RunnerConfig::default().kv_budget_tokens
    );
    assert!(
        info.fused_kernels
            .contains(&mlx_backend::kernels::Kernel::RmsNorm),
        "{:?}",
        info.fused_kernels
    );
    let before = r
        .metrics()
        .kernels
        .get(mlx_backend::kernels::Kernel::RmsNorm)
        .fused;
    let p = tokens(4, 9);
    let t = r
        .forward(&ForwardBatch::new(
            ForwardMode::Extend,
            vec![RequestInput::prompt(1, p.clone(), SamplingParams::greedy())],
        ))
        .unwrap()
        .outputs[0]
        .next_token
        .unwrap();
    r.forward(&ForwardBatch::new(
        ForwardMode::Decode,
        vec![RequestInput::decode(
            1,
            t,
            p.len(),
            SamplingParams::greedy(),
        )],
    ))
    .unwrap();
    let m = r.metrics();
    assert_eq!(
        (m.forwards, m.tokens_prefilled, m.tokens_decoded),
        (2, 9, 1)
    );
    assert_eq!((m.active_requests, m.cached_tokens), (1, 10));
    assert!(m.kernels.get(mlx_backend::kernels::Kernel::RmsNorm).fused > before);
    assert!(m.forward_time >= m.last_forward_time);
}

#[test]
fn batched_decode_with_length_dependent_rope_equals_sequential() {
    // Dynamic NTK RoPE: each row's base depends on its own length (here the
    // context is 8, so the rows cross it at different steps).
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reference/tiny/llama_rope_dynamic-f32");
    let mut r = MlxModelRunner::load(&dir, &Default::default(), RunnerConfig::default()).unwrap();
    let prompts: Vec<Vec<u32>> = [3usize, 6, 9]
        .iter()
        .map(|&n| (0..n as u32).map(|i| 5 + i * 17 % 200).collect())
        .collect();
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| solo(&mut r, 100 + i as u64, p, 6))
        .collect();
    let got = batched(&mut r, &prompts, 6);
    assert_eq!(got, expected);
}

/// A decode batch of plain greedy rows takes one argmax over the block's
/// logits: each row's token is still the argmax of its own logits, as when
/// the row returns its logits (which takes the per-row path).
#[test]
fn greedy_decode_block_picks_each_rows_argmax() {
    let mut r = runner(2);
    let prompts = [tokens(17, 5), tokens(18, 9), tokens(19, 3)];
    let step = |r: &mut MlxModelRunner, returns: ReturnOptions| {
        for (i, p) in prompts.iter().enumerate() {
            let input = RequestInput::prompt(i as u64, p.clone(), SamplingParams::greedy());
            r.forward(&ForwardBatch::new(ForwardMode::Extend, vec![input]))
                .unwrap();
        }
        let batch = (0..3)
            .map(|i| {
                RequestInput::decode(i as u64, 5, prompts[i].len(), SamplingParams::greedy())
                    .with_returns(returns.clone())
            })
            .collect();
        let out = r
            .forward(&ForwardBatch::new(ForwardMode::Decode, batch))
            .unwrap()
            .outputs;
        r.release(&[0, 1, 2]);
        out
    };
    let plain = step(&mut r, ReturnOptions::default());
    let with_logits = step(
        &mut r,
        ReturnOptions {
            logits: true,
            ..Default::default()
        },
    );
    for (a, b) in plain.iter().zip(&with_logits) {
        let logits = b.logits.as_ref().unwrap();
        let argmax = (0..logits.len())
            .reduce(|best, j| if logits[j] > logits[best] { j } else { best })
            .unwrap() as u32;
        assert_eq!(b.next_token, Some(argmax));
        assert_eq!(a.next_token, Some(argmax), "row {}", a.id);
    }
}
