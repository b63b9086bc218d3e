//! Tensor parallelism over MLX's ring backend on loopback: real processes,
//! started by `distributed::launch` the way `mlx.launch` starts them. Each
//! rank is this test binary re-run on the `rank_entry` test with
//! `TP_TEST_*` variables saying what to do; rank 0 writes what it saw to a
//! JSON file the parent test compares with the single-process run.
//!
//! * every tiny family (dense and MoE), f32 and 4-bit, on 2 and 3 ranks,
//!   and the default model on 3: the same greedy tokens, logits within
//!   1e-4 (f32);
//! * a model whose heads do not divide gives a typed error before loading;
//! * a killed or a hung (SIGSTOPped) follower makes rank 0 fail with a
//!   typed error within the peer timeout, and no process is left running.

mod common;

use mlx_backend::distributed::launch::{self, LaunchConfig};
use mlx_backend::distributed::{Backend, DistributedError, Group};
use mlx_backend::kernels::{registry, ActivationPrecision, Kernel};
use mlx_backend::model::{LoadOptions, ModelLoadError};
use mlx_backend::ops::QuantSpec;
use mlx_backend::runner::tensor_parallel::{self, Rank, LEADER_LOST_EXIT_CODE};
use mlx_backend::runner::{
    ForwardBatch, ForwardMode, MlxModelRunner, ModelRunner, RequestInput, ReturnOptions,
    RunnerConfig, RunnerError, SamplingParams,
};
use mlx_backend::{io, Array, Device};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One launch at a time: the ring backend's socket threads poll, and
/// several groups at once on a small machine only slow each other down.
static LAUNCHES: Mutex<()> = Mutex::new(());

const VOCAB: usize = 256;
const HIDDEN: usize = 96;
const HEADS: usize = 12;
const KV_HEADS: usize = 6;
const HEAD_DIM: usize = 16;
const INTER: usize = 192;
const EXPERTS: usize = 6;
const MOE_INTER: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Family {
    Llama,
    Qwen2,
    Qwen3,
    Qwen2Moe,
    Qwen3Moe,
}

/// A random tiny model of `family` whose heads, widths and experts split
/// over 2 and 3 ranks (also in 4-bit groups of 32), as an HF folder.
fn tiny_folder(family: Family, seed: u64) -> tempfile::TempDir {
    let tmp = common::temp_dir("tp-tiny");
    let mut rng = common::Rng::new(seed);
    let mut tensors: Vec<(String, Array)> = Vec::new();
    let mut put = |name: String, shape: &[usize], scale: f64, offset: f32| {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|_| rng.uniform(-scale, scale) as f32 + offset)
            .collect();
        let shape: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        tensors.push((name, Array::from_slice(&data, &shape).unwrap()));
    };
    let w = |fan_in: usize| 1.7 / (fan_in as f64).sqrt();
    let (qkv_bias, qk_norm, moe) = match family {
        Family::Llama => (false, false, false),
        Family::Qwen2 => (true, false, false),
        Family::Qwen3 => (false, true, false),
        Family::Qwen2Moe => (true, false, true),
        Family::Qwen3Moe => (false, true, true),
    };
    put(
        "model.embed_tokens.weight".into(),
        &[VOCAB, HIDDEN],
        1.0,
        0.0,
    );
    put("model.norm.weight".into(), &[HIDDEN], 0.1, 1.0);
    let tied = family != Family::Llama && family != Family::Qwen2Moe;
    if !tied {
        put("lm_head.weight".into(), &[VOCAB, HIDDEN], w(HIDDEN), 0.0);
    }
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        for (name, out, inp) in [
            ("q_proj", HEADS * HEAD_DIM, HIDDEN),
            ("k_proj", KV_HEADS * HEAD_DIM, HIDDEN),
            ("v_proj", KV_HEADS * HEAD_DIM, HIDDEN),
            ("o_proj", HIDDEN, HEADS * HEAD_DIM),
        ] {
            put(
                format!("{p}.self_attn.{name}.weight"),
                &[out, inp],
                w(inp),
                0.0,
            );
            if qkv_bias && name != "o_proj" {
                put(format!("{p}.self_attn.{name}.bias"), &[out], 0.2, 0.0);
            }
        }
        if qk_norm {
            put(
                format!("{p}.self_attn.q_norm.weight"),
                &[HEAD_DIM],
                0.1,
                1.0,
            );
            put(
                format!("{p}.self_attn.k_norm.weight"),
                &[HEAD_DIM],
                0.1,
                1.0,
            );
        }
        put(format!("{p}.input_layernorm.weight"), &[HIDDEN], 0.1, 1.0);
        put(
            format!("{p}.post_attention_layernorm.weight"),
            &[HIDDEN],
            0.1,
            1.0,
        );
        // Qwen2-MoE here: layer 0 dense, layer 1 sparse (decoder_sparse_step 2).
        let sparse = moe && (family == Family::Qwen3Moe || l == 1);
        if sparse {
            let sw = format!("{p}.mlp.switch_mlp");
            put(
                format!("{p}.mlp.gate.weight"),
                &[EXPERTS, HIDDEN],
                w(HIDDEN),
                0.0,
            );
            put(
                format!("{sw}.gate_proj.weight"),
                &[EXPERTS, MOE_INTER, HIDDEN],
                w(HIDDEN),
                0.0,
            );
            put(
                format!("{sw}.up_proj.weight"),
                &[EXPERTS, MOE_INTER, HIDDEN],
                w(HIDDEN),
                0.0,
            );
            put(
                format!("{sw}.down_proj.weight"),
                &[EXPERTS, HIDDEN, MOE_INTER],
                w(MOE_INTER),
                0.0,
            );
            if family == Family::Qwen2Moe {
                let se = format!("{p}.mlp.shared_expert");
                put(
                    format!("{se}.gate_proj.weight"),
                    &[INTER, HIDDEN],
                    w(HIDDEN),
                    0.0,
                );
                put(
                    format!("{se}.up_proj.weight"),
                    &[INTER, HIDDEN],
                    w(HIDDEN),
                    0.0,
                );
                put(
                    format!("{se}.down_proj.weight"),
                    &[HIDDEN, INTER],
                    w(INTER),
                    0.0,
                );
                put(
                    format!("{p}.mlp.shared_expert_gate.weight"),
                    &[1, HIDDEN],
                    w(HIDDEN),
                    0.0,
                );
            }
        } else {
            put(
                format!("{p}.mlp.gate_proj.weight"),
                &[INTER, HIDDEN],
                w(HIDDEN),
                0.0,
            );
            put(
                format!("{p}.mlp.up_proj.weight"),
                &[INTER, HIDDEN],
                w(HIDDEN),
                0.0,
            );
            put(
                format!("{p}.mlp.down_proj.weight"),
                &[HIDDEN, INTER],
                w(INTER),
                0.0,
            );
        }
    }
    let refs: Vec<(&str, &Array)> = tensors.iter().map(|(n, a)| (n.as_str(), a)).collect();
    io::save_safetensors(tmp.path().join("model.safetensors"), &refs, &[]).unwrap();
    let model_type = match family {
        Family::Llama => "llama",
        Family::Qwen2 => "qwen2",
        Family::Qwen3 => "qwen3",
        Family::Qwen2Moe => "qwen2_moe",
        Family::Qwen3Moe => "qwen3_moe",
    };
    let config = json!({
        "model_type": model_type,
        "hidden_size": HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "intermediate_size": INTER,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": tied,
        "eos_token_id": 2,
        "num_experts": if moe { EXPERTS } else { 0 },
        "num_experts_per_tok": 2,
        "moe_intermediate_size": MOE_INTER,
        "shared_expert_intermediate_size": if family == Family::Qwen2Moe { INTER } else { 0 },
        "decoder_sparse_step": if family == Family::Qwen2Moe { 2 } else { 1 },
        "mlp_only_layers": [],
        "norm_topk_prob": family == Family::Qwen3Moe,
    });
    std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
    tmp
}

/// Pseudo-random prompt tokens (never the EOS id 2).
fn prompt(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = common::Rng::new(seed);
    (0..n).map(|_| 3 + rng.below(vocab - 3) as u32).collect()
}

/// Every sampled token and its logits, in order.
#[derive(Default, Debug)]
struct Record {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn run_step(
    r: &mut dyn ModelRunner,
    mode: ForwardMode,
    requests: Vec<RequestInput>,
    rec: &mut Record,
) -> Vec<u32> {
    let out = r
        .forward(&ForwardBatch::new(mode, requests))
        .expect("forward");
    let mut sampled = Vec::new();
    for o in out.outputs {
        if let Some(t) = o.next_token {
            rec.tokens.push(t);
            rec.logits.push(o.logits.expect("logits asked for"));
            sampled.push(t);
        }
    }
    sampled
}

/// Two prompts prefilled together and decoded as one ragged batch, one
/// released, a third prefilled in two chunks and decoded with the other.
fn scenario(r: &mut dyn ModelRunner, vocab: usize) -> Record {
    let mut rec = Record::default();
    let logits = ReturnOptions {
        logits: true,
        ..ReturnOptions::default()
    };
    let greedy = SamplingParams::greedy();
    let (a, b, c) = (
        prompt(1, 7, vocab),
        prompt(2, 5, vocab),
        prompt(3, 4, vocab),
    );
    let first = run_step(
        r,
        ForwardMode::Extend,
        vec![
            RequestInput::prompt(1, a.clone(), greedy.clone()).with_returns(logits.clone()),
            RequestInput::prompt(2, b.clone(), greedy.clone()).with_returns(logits.clone()),
        ],
        &mut rec,
    );
    let (mut ta, mut tb) = (vec![first[0]], vec![first[1]]);
    for _ in 0..5 {
        let next = run_step(
            r,
            ForwardMode::Decode,
            vec![
                RequestInput::decode(
                    1,
                    *ta.last().unwrap(),
                    a.len() + ta.len() - 1,
                    greedy.clone(),
                )
                .with_returns(logits.clone()),
                RequestInput::decode(
                    2,
                    *tb.last().unwrap(),
                    b.len() + tb.len() - 1,
                    greedy.clone(),
                )
                .with_returns(logits.clone()),
            ],
            &mut rec,
        );
        ta.push(next[0]);
        tb.push(next[1]);
    }
    r.release(&[1]);
    run_step(
        r,
        ForwardMode::Extend,
        vec![RequestInput::chunk(
            3,
            c[..3].to_vec(),
            0,
            false,
            greedy.clone(),
        )],
        &mut rec,
    );
    let mut tc = run_step(
        r,
        ForwardMode::Extend,
        vec![
            RequestInput::chunk(3, c[3..].to_vec(), 3, true, greedy.clone())
                .with_returns(logits.clone()),
        ],
        &mut rec,
    );
    for _ in 0..3 {
        let next = run_step(
            r,
            ForwardMode::Decode,
            vec![
                RequestInput::decode(
                    2,
                    *tb.last().unwrap(),
                    b.len() + tb.len() - 1,
                    greedy.clone(),
                )
                .with_returns(logits.clone()),
                RequestInput::decode(
                    3,
                    *tc.last().unwrap(),
                    c.len() + tc.len() - 1,
                    greedy.clone(),
                )
                .with_returns(logits.clone()),
            ],
            &mut rec,
        );
        tb.push(next[0]);
        tc.push(next[1]);
    }
    r.release(&[2, 3]);
    rec
}

/// The CPU's load options; `exact` asks the quantized kernels for exact
/// activations instead of int16 ones (rounded in blocks of an input row,
/// which a split row may round differently).
fn options(quantize: bool, exact: bool) -> LoadOptions {
    let mut o = LoadOptions {
        quantize: quantize.then_some(QuantSpec {
            group_size: 32,
            bits: 4,
        }),
        ..LoadOptions::for_device(Device::Cpu)
    };
    if exact {
        o.activations = ActivationPrecision::Exact;
    }
    o
}

// ---- the rank side

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// What a rank does when this binary is re-run as one: the launches below
/// run it (with `--ignored`); on its own it has nothing to do.
#[test]
#[ignore = "a rank's entry point, run by the launches of the other tests"]
fn rank_entry() {
    if let Some(out) = env("TP_TEST_COLLECTIVES") {
        collectives(Path::new(&out));
    }
    let Some(model) = env("TP_TEST_MODEL") else {
        return;
    };
    let out = PathBuf::from(env("TP_TEST_OUT").expect("TP_TEST_OUT"));
    let ranks: usize = env("TP_TEST_RANKS").unwrap().parse().unwrap();
    let quantize = env("TP_TEST_QUANTIZE").is_some();
    let exact = env("TP_TEST_EXACT").is_some();
    let vocab: usize = env("TP_TEST_VOCAB").unwrap().parse().unwrap();
    let timeout = Duration::from_millis(env("TP_TEST_TIMEOUT_MS").unwrap().parse().unwrap());
    let config = RunnerConfig {
        tensor_parallel: Some(ranks),
        peer_timeout: timeout,
        ..RunnerConfig::default()
    };
    let write = |v: Value| std::fs::write(&out, v.to_string()).unwrap();
    let rank = match tensor_parallel::start(&model, &options(quantize, exact), config) {
        Ok(rank) => rank,
        Err(e) => {
            if env("MLX_RANK").as_deref() == Some("0") {
                let kind = match &e {
                    RunnerError::Load(ModelLoadError::NotShardable { what, .. }) => {
                        format!("NotShardable:{what}")
                    }
                    other => format!("other:{other}"),
                };
                write(json!({ "error": kind }));
            }
            mlx_backend::distributed::exit_process(3);
        }
    };
    let mut leader = match rank {
        Rank::Follower(mut f) => {
            let code = if f.follow().is_ok() { 0 } else { 4 };
            mlx_backend::distributed::exit_process(code);
        }
        Rank::Leader(r) => *r,
    };
    let rec = scenario(&mut leader, vocab);
    let mut result = json!({ "tokens": rec.tokens, "logits": rec.logits });
    if let Some(ready) = env("TP_TEST_READY") {
        // Keep stepping until the group fails under us.
        std::fs::write(&ready, "ready").unwrap();
        let p = prompt(9, 4, vocab);
        let greedy = SamplingParams::greedy();
        let mut id = 100;
        let (kind, elapsed) = loop {
            let mut request = RequestInput::prompt(id, p.clone(), greedy.clone());
            let t = Instant::now();
            let r = leader.forward(&ForwardBatch::new(
                ForwardMode::Extend,
                vec![request.clone()],
            ));
            let elapsed = t.elapsed();
            match r {
                Ok(o) => {
                    request = RequestInput::decode(
                        id,
                        o.outputs[0].next_token.unwrap(),
                        4,
                        greedy.clone(),
                    );
                    let t = Instant::now();
                    if let Err(e) =
                        leader.forward(&ForwardBatch::new(ForwardMode::Decode, vec![request]))
                    {
                        break (e, t.elapsed());
                    }
                    leader.release(&[id]);
                    id += 1;
                }
                Err(e) => break (e, elapsed),
            }
        };
        let kind = match &kind {
            RunnerError::Distributed(DistributedError::PeerTimeout { .. }) => "PeerTimeout",
            RunnerError::Distributed(_) => "Distributed",
            _ => "other",
        };
        let after = leader.forward(&ForwardBatch::idle());
        result["failure"] = json!({
            "kind": kind,
            "elapsed_ms": elapsed.as_millis() as u64,
            "then_lost": matches!(after, Err(RunnerError::Distributed(DistributedError::GroupLost))),
        });
        write(result);
        // A thread is stuck in the backend: leave without waiting for it.
        mlx_backend::distributed::exit_process(0);
    }
    write(result);
    drop(leader);
    mlx_backend::distributed::exit_process(0);
}

/// Each collective once over the group: rank 0 writes what it got.
fn collectives(out: &Path) -> ! {
    let group = Group::from_env().unwrap();
    let (rank, size) = (group.rank(), group.size());
    let x = Array::from_slice(&[rank as f32 + 1.0, 10.0], &[1, 2]).unwrap();
    let sum = group.all_sum(&x).unwrap().to_vec::<f32>().unwrap();
    let gathered = group.all_gather(&x).unwrap().to_vec::<f32>().unwrap();
    // A ring of send/recv: to the right, from the left.
    let right = (rank + 1) % size;
    let left = (rank + size - 1) % size;
    let token = Array::from_slice(&[rank as i32 * 7], &[1]).unwrap();
    let (sent, got) = if rank % 2 == 0 {
        let s = group.send(&token, right).unwrap();
        s.eval().unwrap();
        let r = group.recv(&[1], mlx_backend::Dtype::I32, left).unwrap();
        (s, r)
    } else {
        let r = group.recv(&[1], mlx_backend::Dtype::I32, left).unwrap();
        r.eval().unwrap();
        let s = group.send(&token, right).unwrap();
        s.eval().unwrap();
        (s, r)
    };
    drop(sent);
    let from_left = got.to_vec::<i32>().unwrap();
    let words = group.broadcast_i32(0, &[5, -6, 7]).unwrap();
    if rank == 0 {
        let v = json!({
            "size": size, "sum": sum, "gathered": gathered,
            "from_left": from_left, "broadcast": words,
        });
        std::fs::write(out, v.to_string()).unwrap();
    } else {
        assert_eq!(words, vec![5, -6, 7]);
        assert_eq!(from_left, vec![left as i32 * 7]);
    }
    mlx_backend::distributed::exit_process(0);
}

// ---- the parent side

struct Launch {
    model: PathBuf,
    ranks: usize,
    quantize: bool,
    exact: bool,
    vocab: usize,
    timeout: Duration,
    ready: Option<PathBuf>,
}

impl Launch {
    fn new(model: &Path, ranks: usize, quantize: bool, vocab: usize) -> Launch {
        Launch {
            model: model.to_path_buf(),
            ranks,
            quantize,
            exact: false,
            vocab,
            timeout: Duration::from_secs(60),
            ready: None,
        }
    }

    fn config(&self, out: &Path) -> LaunchConfig {
        let exe = std::env::current_exe().unwrap();
        let mut c = LaunchConfig::local(
            self.ranks,
            Backend::Ring,
            exe,
            vec![
                "rank_entry".into(),
                "--exact".into(),
                "--nocapture".into(),
                "--ignored".into(),
                "--test-threads=1".into(),
            ],
        );
        c.grace = self.timeout * 3 + Duration::from_secs(5);
        c.env = vec![
            ("TP_TEST_MODEL".into(), self.model.display().to_string()),
            ("TP_TEST_OUT".into(), out.display().to_string()),
            ("TP_TEST_RANKS".into(), self.ranks.to_string()),
            ("TP_TEST_VOCAB".into(), self.vocab.to_string()),
            (
                "TP_TEST_TIMEOUT_MS".into(),
                self.timeout.as_millis().to_string(),
            ),
        ];
        if self.quantize {
            c.env.push(("TP_TEST_QUANTIZE".into(), "1".into()));
        }
        if self.exact {
            c.env.push(("TP_TEST_EXACT".into(), "1".into()));
        }
        if let Some(r) = &self.ready {
            c.env
                .push(("TP_TEST_READY".into(), r.display().to_string()));
        }
        c
    }

    /// Run to the end; rank 0's JSON and every rank's exit code.
    fn run(&self) -> (Value, Vec<Option<i32>>) {
        let _one = LAUNCHES.lock().unwrap_or_else(|p| p.into_inner());
        let dir = common::temp_dir("tp-out");
        let out = dir.path().join("rank0.json");
        let mut ranks = launch::spawn(&self.config(&out)).unwrap();
        let (_, codes) = ranks.wait_codes().unwrap();
        let text = std::fs::read_to_string(&out)
            .unwrap_or_else(|_| panic!("rank 0 wrote no result (exit codes {codes:?})"));
        (serde_json::from_str(&text).unwrap(), codes)
    }
}

fn single_process(model: &Path, quantize: bool, exact: bool, vocab: usize) -> Record {
    // The fused decode block has no collective inside, so the ranks run
    // the blocks op by op: so does the reference.
    registry::set_enabled(Kernel::DecoderLayer, false);
    let mut r =
        MlxModelRunner::load(model, &options(quantize, exact), RunnerConfig::default()).unwrap();
    scenario(&mut r, vocab)
}

/// The tokens equal and the logits agree within `tol`.
fn assert_same(what: &str, got: &Value, want: &Record, tol: f32) {
    let tokens: Vec<u32> = serde_json::from_value(got["tokens"].clone()).unwrap();
    assert_eq!(tokens, want.tokens, "{what}: greedy tokens");
    let logits: Vec<Vec<f32>> = serde_json::from_value(got["logits"].clone()).unwrap();
    assert_eq!(logits.len(), want.logits.len(), "{what}");
    let mut worst = 0f32;
    for (g, w) in logits.iter().zip(&want.logits) {
        assert_eq!(g.len(), w.len(), "{what}: vocabulary");
        for (a, b) in g.iter().zip(w) {
            worst = worst.max((a - b).abs());
        }
    }
    assert!(worst <= tol, "{what}: logits differ by {worst} > {tol}");
    eprintln!(
        "{what}: {} tokens equal, max |Δlogit| = {worst:.2e}",
        tokens.len()
    );
}

/// f32 and 4-bit (exact activations) on 2 and 3 ranks within 1e-4; 4-bit
/// with the CPU's int16 activations on 2 ranks within 3e-3 (x is rounded
/// in blocks of a row, which a split row rounds differently).
fn check_family(family: Family) {
    let folder = tiny_folder(family, 7 + family as u64);
    for (quantize, exact, ranks, tol) in [
        (false, false, &[2, 3][..], 1e-4),
        (true, true, &[2, 3][..], 1e-4),
        (true, false, &[2][..], 3e-3),
    ] {
        let want = single_process(folder.path(), quantize, exact, VOCAB);
        for &n in ranks {
            let mut launch = Launch::new(folder.path(), n, quantize, VOCAB);
            launch.exact = exact;
            let (got, codes) = launch.run();
            assert!(codes.iter().all(|c| *c == Some(0)), "exit codes {codes:?}");
            let what = format!(
                "{family:?} {} on {n} ranks",
                match (quantize, exact) {
                    (false, _) => "f32",
                    (true, true) => "q4 exact",
                    (true, false) => "q4 int16",
                }
            );
            assert_same(&what, &got, &want, tol);
        }
    }
}

#[test]
fn llama_matches_the_single_process_run() {
    check_family(Family::Llama);
}

#[test]
fn qwen2_matches_the_single_process_run() {
    check_family(Family::Qwen2);
}

#[test]
fn qwen3_matches_the_single_process_run() {
    check_family(Family::Qwen3);
}

#[test]
fn qwen2_moe_matches_the_single_process_run() {
    check_family(Family::Qwen2Moe);
}

#[test]
fn qwen3_moe_matches_the_single_process_run() {
    check_family(Family::Qwen3Moe);
}

/// mlx-community checkpoints stored quantized (llama-q4, and qwen3_moe-q4
/// with its 8-bit router) split along their stored groups.
#[test]
fn stored_4bit_checkpoints_shard_at_group_boundaries() {
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/tiny");
    for name in ["llama-q4", "qwen3_moe-q4"] {
        let path = tiny.join(name);
        let want = single_process(&path, false, true, 256);
        let mut launch = Launch::new(&path, 2, false, 256);
        launch.exact = true;
        let (got, codes) = launch.run();
        assert!(codes.iter().all(|c| *c == Some(0)), "exit codes {codes:?}");
        assert_same(&format!("{name} on 2 ranks"), &got, &want, 1e-4);
    }
}

#[test]
fn the_default_model_on_3_ranks_matches_one_process() {
    let path = mlx_backend::model::fetch::default_model_path();
    if !path.is_file() {
        eprintln!("skipped: the default model is not in the cache");
        return;
    }
    let vocab = 49152;
    for exact in [true, false] {
        let want = single_process(&path, false, exact, vocab);
        let mut launch = Launch::new(&path, 3, false, vocab);
        launch.exact = exact;
        let (got, codes) = launch.run();
        assert!(codes.iter().all(|c| *c == Some(0)), "exit codes {codes:?}");
        // Q4_1 weights, logits of magnitude ~20, 30 layers: with int16
        // activations, x rounded in blocks that a split row changes.
        let (what, tol) = if exact {
            ("default model on 3 ranks, exact activations", 1e-4)
        } else {
            ("default model on 3 ranks, int16 activations", 2e-2)
        };
        assert_same(what, &got, &want, tol);
    }
}

#[test]
fn collectives_over_the_ring_backend() {
    let _one = LAUNCHES.lock().unwrap_or_else(|p| p.into_inner());
    let dir = common::temp_dir("tp-coll");
    let out = dir.path().join("rank0.json");
    let exe = std::env::current_exe().unwrap();
    let mut c = LaunchConfig::local(
        3,
        Backend::Ring,
        exe,
        [
            "rank_entry",
            "--exact",
            "--nocapture",
            "--ignored",
            "--test-threads=1",
        ]
        .map(String::from)
        .to_vec(),
    );
    c.env = vec![("TP_TEST_COLLECTIVES".into(), out.display().to_string())];
    c.grace = Duration::from_secs(60);
    let code = launch::launch(&c).unwrap();
    assert_eq!(code, 0);
    let got: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(got["size"], 3);
    assert_eq!(got["sum"], json!([6.0, 30.0]));
    assert_eq!(got["gathered"], json!([1.0, 10.0, 2.0, 10.0, 3.0, 10.0]));
    assert_eq!(got["from_left"], json!([14]));
    assert_eq!(got["broadcast"], json!([5, -6, 7]));
}

#[test]
fn heads_that_do_not_divide_are_a_typed_error_before_loading() {
    // 6 KV heads over 4 ranks.
    let folder = tiny_folder(Family::Llama, 1);
    let (got, codes) = Launch::new(folder.path(), 4, false, VOCAB).run();
    assert_eq!(
        got["error"].as_str(),
        Some("NotShardable:num_key_value_heads"),
        "{got}"
    );
    assert!(codes.iter().all(|c| *c == Some(3)), "exit codes {codes:?}");
}

/// Rank 1 is stopped (`signal`) once rank 0 is serving; rank 0 must fail
/// with a typed error within the peer timeout, rank 2 must leave on its
/// own (its leader gone), and the launcher must find every rank ended.
fn lose_a_follower(signal: &str) {
    let folder = tiny_folder(Family::Llama, 3);
    let _one = LAUNCHES.lock().unwrap_or_else(|p| p.into_inner());
    let dir = common::temp_dir("tp-fail");
    let out = dir.path().join("rank0.json");
    let ready = dir.path().join("ready");
    let mut l = Launch::new(folder.path(), 3, false, VOCAB);
    l.timeout = Duration::from_secs(3);
    l.ready = Some(ready.clone());
    let mut config = l.config(&out);
    config.grace = Duration::from_secs(20);
    let mut ranks = launch::spawn(&config).unwrap();
    let start = Instant::now();
    while !ready.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "rank 0 never got ready"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = ranks.pid(1).expect("rank 1 runs").to_string();
    let status = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let (_, codes) = ranks.wait_codes().unwrap();
    let mut got: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    got["logits"] = Value::Null;
    let failure = &got["failure"];
    // A killed peer closes its sockets and the ring backend fails the
    // collective at once; a stopped one is caught by the timeout.
    let kind = failure["kind"].as_str().unwrap_or("none");
    assert!(kind == "PeerTimeout" || kind == "Distributed", "{failure}");
    let elapsed = failure["elapsed_ms"].as_u64().unwrap();
    assert!(elapsed <= 3000 + 1000, "rank 0 failed after {elapsed} ms");
    eprintln!("kill {signal}: rank 0 failed with {kind} after {elapsed} ms; exit codes {codes:?}");
    assert_eq!(failure["then_lost"], true);
    assert_eq!(codes[0], Some(0), "rank 0: {codes:?}");
    // Rank 2 leaves on its own: its collective fails once rank 0 is gone
    // (code 4 here), or its watchdog hears nothing more from rank 0.
    assert!(
        matches!(codes[2], Some(4) | Some(LEADER_LOST_EXIT_CODE)),
        "rank 2: {codes:?}"
    );
    for rank in 0..3 {
        assert!(ranks.pid(rank).is_none(), "rank {rank} still runs");
    }
}

#[test]
fn a_killed_rank_fails_rank_0_within_the_timeout() {
    lose_a_follower("-KILL");
}

#[test]
fn a_hung_rank_fails_rank_0_within_the_timeout() {
    lose_a_follower("-STOP");
}
