//! The engine on the default model: every streamed request's greedy output
//! equals the same request run alone through the runner, whatever else runs
//! beside it (continuous batching, chunked prefill, the prefix cache);
//! admission, refusals, stop rules, cancellation and shutdown. Skipped with
//! a note when the default model is not in the cache.

mod common;

use mlx_backend::engine::{
    Engine, EngineConfig, EngineError, Event, FinishReason, GenerateRequest, ModelBundle, Prompt,
};
use mlx_backend::model::LoadOptions;
use mlx_backend::runner::{
    ForwardBatch, ForwardMode, MlxModelRunner, ModelRunner, RequestInput, RunnerConfig,
    RunnerHandle, SamplingParams,
};
use mlx_backend::tokenizer::{ChatMessage, Tokenizer};
use mlx_backend::Device;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn model() -> Option<PathBuf> {
    common::runs::cached_default_model()
}

fn options() -> LoadOptions {
    LoadOptions::for_device(Device::Cpu)
}

fn engine(path: &PathBuf, runner: RunnerConfig, config: EngineConfig) -> Engine {
    Engine::load(path, options(), runner, config).expect("the engine starts")
}

/// Greedy tokens of `prompt` alone (EOS included when reached).
fn solo(r: &mut MlxModelRunner, eos: &[u32], prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    common::runs::solo_greedy(r, 999_999, prompt, max_tokens, eos)
}

fn text_of(tok: &Tokenizer, eos: &[u32], tokens: &[u32]) -> String {
    let body: Vec<u32> = tokens
        .iter()
        .copied()
        .filter(|t| !eos.contains(t))
        .collect();
    tok.decode(&body, true).unwrap()
}

const TOPICS: [&str; 8] = [
    "the moon",
    "rivers",
    "a red bicycle",
    "winter mornings",
    "prime numbers",
    "bread",
    "owls",
    "the sea",
];

fn chat(i: usize) -> Vec<ChatMessage> {
    vec![ChatMessage::user(format!(
        "Write one sentence about {}.",
        TOPICS[i % TOPICS.len()]
    ))]
}

/// The reference: each request alone, through a runner of its own.
struct Reference {
    runner: MlxModelRunner,
    tokenizer: Tokenizer,
    eos: Vec<u32>,
}

impl Reference {
    fn new(path: &PathBuf) -> Reference {
        let b = ModelBundle::load(path, &options(), RunnerConfig::default()).unwrap();
        Reference {
            runner: b.runner,
            tokenizer: b.tokenizer,
            eos: b.eos_token_ids,
        }
    }

    fn run(&mut self, prompt: &[u32], max_tokens: usize) -> (Vec<u32>, String) {
        let t = solo(&mut self.runner, &self.eos, prompt, max_tokens);
        let text = text_of(&self.tokenizer, &self.eos, &t);
        (t, text)
    }

    /// The two most likely next tokens after `prompt` + `prefix`, with
    /// their log-probabilities.
    fn top2(&mut self, prompt: &[u32], prefix: &[u32]) -> [(u32, f32); 2] {
        let mut all = prompt.to_vec();
        all.extend_from_slice(prefix);
        let input = RequestInput::prompt(999_998, all, SamplingParams::greedy()).with_returns(
            mlx_backend::runner::ReturnOptions {
                top_logprobs: 2,
                ..Default::default()
            },
        );
        let out = self
            .runner
            .forward(&ForwardBatch::new(ForwardMode::Extend, vec![input]))
            .unwrap();
        self.runner.release(&[999_998]);
        let t = &out.outputs[0].top_logprobs;
        [t[0], t[1]]
    }

    /// `got` is the greedy output of `prompt`: equal to the solo run
    /// `want`, or equal up to a step where the solo run's two best tokens
    /// are a near tie (batched rows and prompt chunks round differently
    /// from one row alone) and `got` took the other one.
    #[track_caller]
    fn assert_same_greedy(&mut self, what: &str, prompt: &[u32], got: &[u32], want: &[u32]) {
        let Some(k) = got.iter().zip(want).position(|(a, b)| a != b) else {
            assert_eq!(got.len(), want.len(), "{what}: lengths differ");
            return;
        };
        let [(a, la), (b, lb)] = self.top2(prompt, &want[..k]);
        let tie = (la - lb).abs() < 0.05 && [a, b].contains(&got[k]) && [a, b].contains(&want[k]);
        assert!(
            tie,
            "{what}: token {k} differs from the solo run and is no near tie \
             ({a}: {la}, {b}: {lb})\n got: {got:?}\nwant: {want:?}"
        );
        eprintln!("{what}: a near tie at token {k} ({la} vs {lb})");
    }
}

#[test]
fn the_bundle_reads_one_eos_set_for_tokenizer_and_runner() {
    let Some(path) = model() else { return };
    let b = ModelBundle::load(&path, &options(), RunnerConfig::default()).unwrap();
    assert_eq!(b.tokenizer.eos_ids(), b.eos_token_ids.as_slice());
    assert_eq!(b.runner.info().eos_token_ids, b.eos_token_ids);
    // SmolLM2: <|im_end|> is the declared EOS, <|endoftext|> ends text too.
    assert_eq!(b.eos_token_ids, vec![2, 0]);
    assert!(b.chat_template.is_some());
}

#[test]
fn concurrent_streams_each_equal_their_solo_greedy_run() {
    let Some(path) = model() else { return };
    let mut reference = Reference::new(&path);
    // A small prefill budget: prompts are chunked and interleaved with the
    // decodes of requests already running.
    let config = EngineConfig {
        prefill_tokens_per_step: 24,
        ..EngineConfig::default()
    };
    let engine = engine(&path, RunnerConfig::default(), config);
    let n = 12;
    let max_tokens = |i: usize| 8 + (i * 5) % 20;
    // Staggered arrivals from several threads.
    let results: Vec<(usize, Vec<u32>, String, FinishReason, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let engine = engine.clone();
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(40 * (i as u64 % 4)));
                    let req = GenerateRequest::chat(chat(i)).with_max_tokens(max_tokens(i));
                    let c = engine.submit(req).unwrap().collect_all();
                    let f = c.finished.expect("a Finished event");
                    (i, c.tokens, c.text, f.reason, f.usage.completion_tokens)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, tokens, text, reason, completion) in results {
        let prompt = engine.prompt_ids(&Prompt::Chat(chat(i))).unwrap();
        let (want, want_text) = reference.run(&prompt, max_tokens(i));
        assert_eq!(completion, tokens.len());
        assert_eq!(
            text,
            text_of(&reference.tokenizer, &reference.eos, &tokens),
            "request {i}: the streamed text is not its tokens' text"
        );
        reference.assert_same_greedy(&format!("request {i}"), &prompt, &tokens, &want);
        if tokens != want {
            continue;
        }
        assert_eq!(text, want_text, "request {i}");
        let ended_on_eos = reference.eos.contains(want.last().unwrap());
        assert_eq!(
            reason,
            if ended_on_eos {
                FinishReason::Stop
            } else {
                FinishReason::Length
            }
        );
    }
    let m = engine.metrics();
    assert_eq!(m.running_requests, 0);
    assert_eq!(m.waiting_requests, 0);
    assert_eq!(m.kv_request_tokens, 0);
    assert_eq!(m.requests_finished, n as u64);
    // All requests share the template's system prompt.
    assert!(m.prefix_cache_hit_tokens > 0, "{m:?}");
}

#[test]
fn the_prefix_cache_changes_no_greedy_output() {
    let Some(path) = model() else { return };
    let with = engine(&path, RunnerConfig::default(), EngineConfig::default());
    let without = engine(
        &path,
        RunnerConfig::default(),
        EngineConfig {
            prefix_cache: false,
            ..EngineConfig::default()
        },
    );
    // A multi-turn conversation: each turn's prompt holds the previous one.
    let mut messages = vec![ChatMessage::user("Name a color.")];
    for turn in 0..3 {
        let run = |e: &Engine| {
            let c = e
                .submit(GenerateRequest::chat(messages.clone()).with_max_tokens(16))
                .unwrap()
                .collect_all();
            let f = c.finished.unwrap();
            (c.tokens, c.text, f.usage.cached_tokens)
        };
        let (a, text, cached) = run(&with);
        let (b, _, none) = run(&without);
        assert_eq!(a, b, "turn {turn}");
        assert_eq!(none, 0);
        if turn > 0 {
            assert!(cached > 20, "turn {turn}: {cached} cached tokens");
        }
        messages.push(ChatMessage::assistant(text));
        messages.push(ChatMessage::user(format!(
            "And another one, number {turn}?"
        )));
    }
    let m = with.metrics();
    assert!(m.prefix_cache_hit_tokens > 0 && m.kv_prefix_cache_tokens > 0);
    assert_eq!(without.metrics().kv_prefix_cache_tokens, 0);
}

#[test]
fn the_prefix_cache_keeps_at_most_its_entries() {
    let Some(path) = model() else { return };
    let config = EngineConfig {
        prefix_cache_max_entries: 2,
        ..EngineConfig::default()
    };
    let engine = engine(&path, RunnerConfig::default(), config);
    for i in 0..5 {
        // Distinct prompts past the template's shared prefix: no entry
        // covers another.
        let c = engine
            .submit(GenerateRequest::chat(chat(i)).with_max_tokens(4))
            .unwrap()
            .collect_all();
        assert!(c.finished.is_some());
    }
    let m = engine.metrics();
    assert_eq!(m.prefix_cache_entries, 2, "{m:?}");
    assert!(m.kv_prefix_cache_tokens > 0);
}

#[test]
fn a_request_that_can_never_fit_is_refused_alone_and_the_queue_waits_for_kv() {
    let Some(path) = model() else { return };
    let mut reference = Reference::new(&path);
    let runner = RunnerConfig {
        kv_budget_tokens: 160,
        ..RunnerConfig::default()
    };
    let engine = engine(&path, runner, EngineConfig::default());
    let prompt = engine.prompt_ids(&Prompt::Chat(chat(0))).unwrap();
    // Each request reserves prompt + 40 tokens: only one fits at a time.
    let streams: Vec<_> = (0..3)
        .map(|_| {
            engine
                .submit(GenerateRequest::tokens(prompt.clone()).with_max_tokens(40))
                .unwrap()
        })
        .collect();
    let too_big = engine.submit(GenerateRequest::tokens(prompt.clone()).with_max_tokens(150));
    assert!(
        matches!(
            too_big,
            Err(EngineError::ExceedsKvCapacity { capacity: 160, .. })
        ),
        "{too_big:?}"
    );
    let max_context = engine.runner_info().max_context;
    let too_long =
        engine.submit(GenerateRequest::tokens(prompt.clone()).with_max_tokens(max_context));
    assert!(
        matches!(too_long, Err(EngineError::ContextTooLong { .. })),
        "{too_long:?}"
    );
    let (want, _) = reference.run(&prompt, 40);
    for s in streams {
        let c = s.collect_all();
        reference.assert_same_greedy("queued", &prompt, &c.tokens, &want);
    }
    // Bad values are refused with the parameter's name.
    let bad = engine.submit(GenerateRequest::tokens(prompt.clone()).with_sampling(
        SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        },
    ));
    assert!(matches!(
        bad,
        Err(EngineError::InvalidParameter { name: "top_p", .. })
    ));
    let bad = engine.submit(GenerateRequest::tokens(vec![1, 1_000_000]));
    assert!(matches!(bad, Err(EngineError::InvalidToken { .. })));
    let bad = engine.submit(GenerateRequest::tokens(Vec::new()));
    assert!(matches!(bad, Err(EngineError::EmptyPrompt)));
}

#[test]
fn a_full_queue_refuses_new_requests() {
    let Some(path) = model() else { return };
    let config = EngineConfig {
        max_running_requests: 1,
        max_waiting_requests: 2,
        ..EngineConfig::default()
    };
    let engine = engine(&path, RunnerConfig::default(), config);
    let results: Vec<_> = (0..6)
        .map(|i| engine.submit(GenerateRequest::chat(chat(i)).with_max_tokens(48)))
        .collect();
    let full = results
        .iter()
        .filter(|r| matches!(r, Err(EngineError::QueueFull { waiting: 2 })))
        .count();
    assert!(full >= 2, "{full} refusals");
    for s in results.into_iter().flatten() {
        assert!(s.collect_all().finished.is_some());
    }
}

#[test]
fn stop_strings_stop_ids_max_tokens_and_logprobs() {
    let Some(path) = model() else { return };
    let mut reference = Reference::new(&path);
    let engine = engine(&path, RunnerConfig::default(), EngineConfig::default());
    let prompt = engine.prompt_ids(&Prompt::Chat(chat(1))).unwrap();
    let (want, want_text) = reference.run(&prompt, 40);
    // A stop string from the middle of the solo text: the output is the
    // text before it, and no part of it is ever streamed.
    let cut = want_text
        .char_indices()
        .nth(want_text.chars().count() / 2)
        .unwrap()
        .0;
    let stop: String = want_text[cut..].chars().take(4).collect();
    let expected = &want_text[..want_text.find(&stop).unwrap()];
    let mut req = GenerateRequest::tokens(prompt.clone()).with_max_tokens(40);
    req.stop = vec![stop.clone()];
    let c = engine.submit(req).unwrap().collect_all();
    assert_eq!(c.text, expected);
    assert_eq!(c.finished.unwrap().reason, FinishReason::Stop);

    // A stop id: the third token ends it.
    let mut req = GenerateRequest::tokens(prompt.clone()).with_max_tokens(40);
    req.stop_token_ids = vec![want[2]];
    let c = engine.submit(req).unwrap().collect_all();
    assert_eq!(c.tokens, want[..3]);
    assert_eq!(c.finished.unwrap().reason, FinishReason::Stop);

    // max_tokens.
    let c = engine
        .submit(GenerateRequest::tokens(prompt.clone()).with_max_tokens(5))
        .unwrap()
        .collect_all();
    let f = c.finished.unwrap();
    assert_eq!(
        (f.reason, f.usage.completion_tokens),
        (FinishReason::Length, 5)
    );
    assert_eq!(c.tokens, want[..5]);
    assert!(f.time_to_first_token.is_some());

    // Logprobs: the greedy token is the most likely one.
    let mut req = GenerateRequest::tokens(prompt.clone()).with_max_tokens(6);
    req.logprobs = true;
    req.top_logprobs = 3;
    let mut seen = 0;
    for e in engine.submit(req).unwrap() {
        if let Event::Delta { token: Some(t), .. } = e {
            let lp = t.logprob.expect("a logprob");
            assert!(lp <= 0.0);
            assert_eq!(t.top_logprobs.len(), 3);
            assert_eq!(t.top_logprobs[0].0, t.id);
            assert!((t.top_logprobs[0].1 - lp).abs() < 1e-4);
            seen += 1;
        }
    }
    assert_eq!(seen, 6);
}

#[test]
fn cancelling_releases_the_kv_through_a_runner_handle() {
    let Some(path) = model() else { return };
    // The runner on a thread of its own; the engine drives its handle.
    let bundle = ModelBundle::spawn(&path, options(), RunnerConfig::default()).unwrap();
    let probe: RunnerHandle = bundle.runner.clone();
    assert_eq!(
        ModelRunner::info(&probe).eos_token_ids,
        bundle.tokenizer.eos_ids()
    );
    let config = EngineConfig {
        prefix_cache: false,
        ..EngineConfig::default()
    };
    let engine = Engine::start(config, move || Ok(bundle)).unwrap();
    let long = || {
        let mut r = GenerateRequest::chat(chat(2)).with_max_tokens(400);
        r.ignore_eos = true;
        r
    };
    // Dropped mid-stream.
    let mut a = engine.submit(long()).unwrap();
    for _ in 0..3 {
        assert!(matches!(a.recv(), Some(Event::Delta { .. })));
    }
    // Aborted by id: the stream ends with Abort.
    let b = engine.submit(long()).unwrap();
    let b_id = b.id();
    drop(a);
    engine.abort(b_id);
    let f = b.collect_all().finished.unwrap();
    assert_eq!(f.reason, FinishReason::Abort);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = engine.metrics();
        let r = probe.metrics().unwrap();
        if m.running_requests == 0 && m.kv_request_tokens == 0 && r.active_requests == 0 {
            assert_eq!(r.cached_tokens, 0);
            break;
        }
        assert!(Instant::now() < deadline, "KV not released: {m:?} {r:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = engine.render_metrics();
    assert!(
        text.contains("mlx_engine_requests_finished_total{finish_reason=\"abort\"} 2"),
        "{text}"
    );
}

#[test]
fn shutdown_aborts_what_is_in_flight() {
    let Some(path) = model() else { return };
    let engine = engine(&path, RunnerConfig::default(), EngineConfig::default());
    let mut r = GenerateRequest::chat(chat(3)).with_max_tokens(400);
    r.ignore_eos = true;
    let mut s = engine.submit(r).unwrap();
    assert!(matches!(s.recv(), Some(Event::Delta { .. })));
    engine.shutdown();
    let f = s.collect_all().finished.unwrap();
    assert_eq!(f.reason, FinishReason::Abort);
    assert!(matches!(
        engine.submit(GenerateRequest::chat(chat(0))),
        Err(EngineError::ShutDown)
    ));
}

#[test]
fn a_long_prompt_arriving_keeps_running_streams_at_their_pace() {
    let Some(path) = model() else { return };
    let config = EngineConfig {
        prefill_tokens_per_step: 64,
        ..EngineConfig::default()
    };
    let engine = engine(&path, RunnerConfig::default(), config);
    let mut running = GenerateRequest::chat(chat(4)).with_max_tokens(400);
    running.ignore_eos = true;
    let mut stream = engine.submit(running).unwrap();
    for _ in 0..5 {
        assert!(matches!(stream.recv(), Some(Event::Delta { .. })));
    }
    // ~800 prompt tokens: 13 chunks of 64 beside the running decode.
    let long_prompt = |text: &str| -> Vec<u32> {
        let paragraph = engine.tokenizer().encode(text, false).unwrap();
        paragraph.iter().copied().cycle().take(800).collect()
    };
    // One such prompt first, unmeasured: on a fresh GPU, MLX compiles the
    // kernels of a chunk beside a decode row on first use (seconds), which
    // is not the scheduling under test. Other text, so no prefix is reused.
    let warmup = engine
        .submit(
            GenerateRequest::tokens(long_prompt(
                "A warm wind moved the tall grass by the road. ",
            ))
            .with_max_tokens(1),
        )
        .unwrap();
    let warm = std::thread::spawn(move || warmup.collect_all());
    while !warm.is_finished() {
        assert!(matches!(stream.recv(), Some(Event::Delta { .. })));
    }
    warm.join().unwrap().finished.unwrap();
    let long = long_prompt("The river runs past the old mill and under the stone bridge. ");
    let start = Instant::now();
    let long_stream = engine
        .submit(GenerateRequest::tokens(long).with_max_tokens(1))
        .unwrap();
    let prefill = std::thread::spawn(move || {
        let c = long_stream.collect_all();
        c.finished.unwrap().time_to_first_token.unwrap()
    });
    let mut gaps = Vec::new();
    let mut last = Instant::now();
    while !prefill.is_finished() {
        match stream.recv() {
            Some(Event::Delta { .. }) => {
                gaps.push(last.elapsed());
                last = Instant::now();
            }
            other => panic!("the running stream ended: {other:?}"),
        }
    }
    let ttft = prefill.join().unwrap();
    let worst = gaps.iter().max().copied().unwrap_or_default();
    assert!(
        gaps.len() >= 5,
        "{} tokens while the prompt ran",
        gaps.len()
    );
    // Whole, the prompt would stall the stream for its full prefill; in
    // chunks, for about one chunk's time.
    assert!(
        worst * 3 < ttft,
        "worst gap {worst:?} against the prompt's prefill of {ttft:?} ({} gaps, started {:?} ago)",
        gaps.len(),
        start.elapsed()
    );
}
