//! SGLang's bench_one_batch on this backend, side by side with its peers.
//!
//! Prefill tokens/s at the given input lengths, decode tokens/s at the given
//! batch sizes (from the median step latency), peak memory; then the same
//! workloads through mlx-lm and llama.cpp (benches/peers/bench_peers.py, run
//! with the cached venvs of scripts/oracle-venv.sh and
//! scripts/llama-cpp-venv.sh when they exist) on the same GGUF, printed with
//! ratios.
//!
//! ```sh
//! cargo run --release --example bench_one_batch -- --prefill 32,256,512 --decode-batch 1,4,8,16 [--activations exact|int16|int8]
//! ```

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, ValueEnum};
use mlx_backend::kernels::{ActivationPrecision, Backend};
use mlx_backend::model::synthetic::{synthetic_folder, SyntheticShape, SyntheticWeights};
use mlx_backend::model::{fetch, LoadOptions};
use mlx_backend::runner::{
    ForwardBatch, ForwardMode, ForwardOutput, MlxModelRunner, ModelRunner, RequestInput,
    RunnerConfig, SamplingParams,
};
use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// SGLang's bench_one_batch on this backend, side by side with mlx-lm and
/// llama.cpp.
#[derive(Parser)]
#[command(name = "bench_one_batch")]
struct Args {
    /// A GGUF file or an `org/name` hub id (default: the default model,
    /// fetched if missing).
    #[arg(long, value_name = "PATH", conflicts_with = "synthetic")]
    model: Option<String>,
    /// A published model shape with seeded random weights instead
    /// (`mlx_backend::model::synthetic`): smollm2-135m, qwen3-0.6b,
    /// qwen1.5-moe-a2.7b or qwen3-30b-a3b. Written once under the cache's
    /// `synthetic/` folder; the mlx-lm peer loads the same folder.
    #[arg(long, value_name = "NAME")]
    synthetic: Option<SyntheticShape>,
    /// The synthetic checkpoint's weights: 4-bit groups of 64, or bf16.
    #[arg(long, value_enum, default_value = "q4")]
    synthetic_weights: SyntheticKind,
    /// Prompt lengths to prefill, each >= 1.
    #[arg(
        long,
        value_name = "N,N,..",
        value_delimiter = ',',
        value_parser = at_least_one,
        default_value = "32,256,1024"
    )]
    prefill: Vec<usize>,
    /// Decode batch sizes, each >= 1.
    #[arg(
        long,
        value_name = "B,B,..",
        value_delimiter = ',',
        value_parser = at_least_one,
        default_value = "1,4,16"
    )]
    decode_batch: Vec<usize>,
    /// Decode steps per batch size (>= 1).
    #[arg(long, value_name = "N", value_parser = at_least_one, default_value_t = 16)]
    decode_steps: usize,
    /// Timed runs of each workload after one warm-up (>= 1); the median is
    /// reported.
    #[arg(long, value_name = "N", value_parser = at_least_one, default_value_t = 3)]
    repeats: usize,
    /// Threads for our kernels' CPU team and for the peers (>= 1).
    #[arg(long, value_name = "N", value_parser = at_least_one, default_value_t = 2)]
    threads: usize,
    /// Run this backend and llama.cpp alternately this many times (>= 1).
    ///
    /// Each workload's median over the rounds is reported, and as the ratio
    /// vs llama.cpp the median of each round's own ratio (mlx-lm runs once):
    /// on a VM whose speed drifts by minutes, one run each can fall in
    /// different phases.
    #[arg(long, value_name = "N", value_parser = at_least_one, default_value_t = 1)]
    rounds: usize,
    /// Skip mlx-lm and llama.cpp.
    #[arg(long)]
    no_peers: bool,
    /// The quantized kernels' activation precision (default: the device's,
    /// `LoadOptions::for_device`).
    /// (`exact`, `int16` or `int8`).
    #[arg(long)]
    activations: Option<ActivationPrecision>,
    /// Sleep this long before each timed decode step, as after a server's
    /// idle time between requests (needs --no-peers).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    idle_ms: u64,
}

/// `--synthetic-weights`.
#[derive(Clone, Copy, ValueEnum)]
enum SyntheticKind {
    Q4,
    Bf16,
}

impl From<SyntheticKind> for SyntheticWeights {
    fn from(k: SyntheticKind) -> Self {
        match k {
            SyntheticKind::Q4 => SyntheticWeights::Quantized {
                group_size: 64,
                bits: 4,
            },
            SyntheticKind::Bf16 => SyntheticWeights::Bf16,
        }
    }
}

/// A count that must be at least 1 (one item of a comma list, or a whole
/// value).
fn at_least_one(s: &str) -> Result<usize, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty value (valid range: 1 and up)".into());
    }
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1 (valid range: 1 and up)".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "`{s}` is not a whole number (valid range: 1 and up)"
        )),
    }
}

fn parse_args() -> Args {
    let a = Args::parse();
    if a.idle_ms > 0 && !a.no_peers {
        Args::command()
            .error(
                ErrorKind::MissingRequiredArgument,
                "--idle-ms times our steps only: add --no-peers",
            )
            .exit();
    }
    a
}

/// The same pseudo-random ids for every engine run by this binary.
fn random_ids(seed: u64, n: usize) -> Vec<u32> {
    let mut s = seed.wrapping_mul(6364136223846793005) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (3 + s % 48997) as u32
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[derive(Default)]
struct Results {
    prefill: Vec<(usize, f64)>,
    decode: Vec<(usize, f64)>,
    peak_memory: f64,
}

impl Results {
    /// Each workload's median tok/s over `rounds` (the first round's
    /// workloads), and the largest peak memory.
    fn median_of(rounds: &[Results]) -> Option<Results> {
        let first = rounds.first()?;
        let pick = |key: usize, rows: fn(&Results) -> &Vec<(usize, f64)>| {
            let values = rounds
                .iter()
                .filter_map(|r| rows(r).iter().find(|x| x.0 == key).map(|x| x.1))
                .collect();
            (key, median(values))
        };
        Some(Results {
            prefill: first
                .prefill
                .iter()
                .map(|x| pick(x.0, |r| &r.prefill))
                .collect(),
            decode: first
                .decode
                .iter()
                .map(|x| pick(x.0, |r| &r.decode))
                .collect(),
            peak_memory: rounds.iter().map(|r| r.peak_memory).fold(0.0, f64::max),
        })
    }

    /// Each workload's median over the rounds of `ours / peer` within the
    /// round: the two ran a few seconds apart, so a drift of the VM's speed
    /// over minutes cancels in each round's ratio (a ratio of medians can
    /// pair a fast phase of one with a slow phase of the other).
    fn paired_ratios(ours: &[Results], peer: &[Results]) -> Option<Results> {
        let pairs: Vec<Results> = ours
            .iter()
            .zip(peer)
            .map(|(o, p)| {
                let ratio = |mine: &Vec<(usize, f64)>, theirs: &Vec<(usize, f64)>| {
                    mine.iter()
                        .filter_map(|&(k, v)| {
                            let t = theirs.iter().find(|x| x.0 == k)?.1;
                            (t > 0.0).then_some((k, v / t))
                        })
                        .collect()
                };
                Results {
                    prefill: ratio(&o.prefill, &p.prefill),
                    decode: ratio(&o.decode, &p.decode),
                    peak_memory: 0.0,
                }
            })
            .collect();
        Results::median_of(&pairs)
    }
}

/// GPU bodies' enqueue counters summed over kernels: (enqueues, host ns).
fn enqueue_stats() -> (u64, u64) {
    let snap = mlx_backend::kernels::registry::snapshot_on(Backend::gpu());
    snap.kernels.iter().fold((0, 0), |(n, ns), (_, s)| {
        (n + s.gpu_enqueues, ns + s.gpu_enqueue_ns)
    })
}

/// Sums of a decode run's per-step parts.
#[derive(Default)]
struct StepParts {
    steps: u32,
    build: f64,
    eval: f64,
    read: f64,
    enqueues: u64,
    enqueue_ns: u64,
}

impl StepParts {
    fn add(&mut self, out: &ForwardOutput, before: (u64, u64), after: (u64, u64)) {
        self.steps += 1;
        self.build += out.build_time.as_secs_f64();
        self.eval += (out.forward_time - out.build_time).as_secs_f64();
        self.read += out.sample_time.as_secs_f64();
        self.enqueues += after.0 - before.0;
        self.enqueue_ns += after.1 - before.1;
    }

    /// Mean per step: build, eval (GPU enqueue inside it), read, in ms.
    fn summary(&self) -> String {
        let n = f64::from(self.steps.max(1));
        let mut s = format!(
            "mean build {:.3} / eval {:.3} / read {:.3} ms",
            self.build * 1e3 / n,
            self.eval * 1e3 / n,
            self.read * 1e3 / n
        );
        if self.enqueues > 0 {
            s += &format!(
                " (GPU bodies: {:.1} per step, enqueue {:.3} ms)",
                self.enqueues as f64 / n,
                self.enqueue_ns as f64 * 1e-6 / n
            );
        }
        s
    }
}

fn bench_ours(runner: &mut MlxModelRunner, a: &Args) -> Result<Results, Box<dyn Error>> {
    let mut r = Results::default();
    let mut next_id = 0u64;
    let mut id = || {
        next_id += 1;
        next_id
    };
    mlx_backend::memory::reset_peak_memory();
    for &n in &a.prefill {
        let mut samples = Vec::new();
        for rep in 0..=a.repeats {
            let rid = id();
            let req = RequestInput::prompt(
                rid,
                random_ids(n as u64 + rep as u64, n),
                SamplingParams::greedy(),
            );
            let t = Instant::now();
            runner
                .forward(&ForwardBatch::new(ForwardMode::Extend, vec![req]))
                .map_err(|e| format!("prefill of {n} tokens: {e}"))?;
            if rep > 0 {
                samples.push(t.elapsed().as_secs_f64());
            }
            runner.release(&[rid]);
        }
        let s = median(samples);
        eprintln!("ours prefill {n}: {:.3} s ({:.1} tok/s)", s, n as f64 / s);
        r.prefill.push((n, n as f64 / s));
    }
    for &b in &a.decode_batch {
        let ids: Vec<u64> = (0..b).map(|_| id()).collect();
        let reqs = ids
            .iter()
            .enumerate()
            .map(|(i, &rid)| {
                RequestInput::prompt(
                    rid,
                    random_ids(1000 + i as u64, 32),
                    SamplingParams::greedy(),
                )
            })
            .collect();
        let out = runner
            .forward(&ForwardBatch::new(ForwardMode::Extend, reqs))
            .map_err(|e| format!("prefill for decode batch {b}: {e}"))?;
        let mut last = sampled(&out)?;
        let mut samples = Vec::new();
        // Where a step's time goes: the graph build, the evaluation (of
        // which a fused GPU body's kernel enqueue is host time), the read.
        let mut parts = StepParts::default();
        for step in 0..a.decode_steps + 1 {
            let reqs = ids
                .iter()
                .zip(&last)
                .map(|(&rid, &t)| RequestInput::decode(rid, t, 32 + step, SamplingParams::greedy()))
                .collect();
            if a.idle_ms > 0 {
                std::thread::sleep(std::time::Duration::from_millis(a.idle_ms));
            }
            let before = enqueue_stats();
            let t = Instant::now();
            let out = runner
                .forward(&ForwardBatch::new(ForwardMode::Decode, reqs))
                .map_err(|e| format!("decode batch {b}: {e}"))?;
            if step > 0 {
                samples.push(t.elapsed().as_secs_f64());
                parts.add(&out, before, enqueue_stats());
            }
            last = sampled(&out)?;
        }
        runner.release(&ids);
        let s = median(samples);
        let after = match a.idle_ms {
            0 => String::new(),
            ms => format!(", each after {ms} ms idle"),
        };
        eprintln!(
            "ours decode batch {b}: {:.2} ms/step ({:.1} tok/s){after}; {}",
            s * 1e3,
            b as f64 / s,
            parts.summary()
        );
        r.decode.push((b, b as f64 / s));
    }
    r.peak_memory = mlx_backend::memory::peak_memory() as f64;
    Ok(r)
}

/// Each request's sampled token.
fn sampled(out: &ForwardOutput) -> Result<Vec<u32>, String> {
    out.outputs
        .iter()
        .map(|o| {
            o.next_token
                .ok_or_else(|| format!("request {} sampled no token", o.id))
        })
        .collect()
}

fn venv_python(name: &str) -> Option<PathBuf> {
    let p = fetch::cache_dir().join(name).join("bin/python");
    p.is_file().then_some(p)
}

fn bench_peer(engine: &str, python: &Path, model: &Path, a: &Args) -> Option<Results> {
    let join = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers/bench_peers.py");
    eprintln!("running {engine} ...");
    let out = Command::new(python)
        .arg(script)
        .args(["--engine", engine])
        .arg(if model.is_dir() {
            "--hf-folder"
        } else {
            "--gguf"
        })
        .arg(model)
        .args([
            "--device",
            if mlx_backend::Stream::current().device() == mlx_backend::Device::Cpu {
                "cpu"
            } else {
                "gpu"
            },
        ])
        .args([
            "--prefill",
            &join(&a.prefill),
            "--decode-batch",
            &join(&a.decode_batch),
        ])
        .args([
            "--decode-steps",
            &a.decode_steps.to_string(),
            "--repeats",
            &a.repeats.to_string(),
        ])
        .args(["--threads", &a.threads.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("{engine} failed; left out");
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let rows = |key: &str, size: &str| -> Vec<(usize, f64)> {
        v[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| {
                        (
                            r[size].as_u64().unwrap_or(0) as usize,
                            r["tok_per_s"].as_f64().unwrap_or(0.0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    Some(Results {
        prefill: rows("prefill", "tokens"),
        decode: rows("decode", "batch"),
        peak_memory: v["peak_memory_bytes"].as_f64().unwrap_or(0.0),
    })
}

/// The SIMD features the kernels choose from at run time.
#[cfg(target_arch = "x86_64")]
fn cpu_flags() -> Vec<&'static str> {
    [
        ("avx2", std::arch::is_x86_feature_detected!("avx2")),
        ("fma", std::arch::is_x86_feature_detected!("fma")),
        ("f16c", std::arch::is_x86_feature_detected!("f16c")),
        ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
        ("avx512bw", std::arch::is_x86_feature_detected!("avx512bw")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect()
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_flags() -> Vec<&'static str> {
    vec![std::env::consts::ARCH]
}

fn main() {
    let a = parse_args();
    if let Err(e) = run(&a) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(a: &Args) -> Result<(), Box<dyn Error>> {
    let with_peers = !a.no_peers;
    let path = match a.synthetic {
        Some(shape) => {
            let root = fetch::cache_dir().join("synthetic");
            std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
            let t = Instant::now();
            let dir = synthetic_folder(&root, shape, a.synthetic_weights.into(), 0)
                .map_err(|e| format!("synthetic {shape}: {e}"))?;
            eprintln!(
                "synthetic {shape}: {} ({:.1} s)",
                dir.display(),
                t.elapsed().as_secs_f64()
            );
            dir
        }
        None => fetch::resolve(a.model.as_deref()).map_err(|e| format!("model: {e}"))?,
    };
    // Our kernels' CPU team takes as many threads as the peers (read when
    // the team starts, on the first kernel call).
    std::env::set_var("MLX_BACKEND_THREADS", a.threads.to_string());
    let mut options = LoadOptions::for_device(mlx_backend::Stream::current().device());
    if let Some(activations) = a.activations {
        options.activations = activations;
    }
    let mut runner = MlxModelRunner::load(&path, &options, RunnerConfig::default())?;
    let gguf = path.extension().is_some_and(|e| e == "gguf");
    let python = |venv: &str| {
        let py = venv_python(venv);
        if py.is_none() {
            eprintln!(
                "no venv at {}/{venv}; run scripts/ to create it",
                fetch::cache_dir().display()
            );
        }
        py
    };
    let llama = (with_peers && gguf)
        .then(|| python("llama-cpp-venv"))
        .flatten();
    let (mut ours_rounds, mut llama_rounds) = (Vec::new(), Vec::new());
    for round in 0..a.rounds {
        if a.rounds > 1 {
            eprintln!("round {} of {}", round + 1, a.rounds);
        }
        ours_rounds.push(bench_ours(&mut runner, a)?);
        if let Some(r) = llama
            .as_ref()
            .and_then(|py| bench_peer("llama_cpp", py, &path, a))
        {
            llama_rounds.push(r);
        }
    }
    if a.rounds > 1 {
        // Each round's ratios, to show the spread the medians hide.
        for (i, (o, l)) in ours_rounds.iter().zip(&llama_rounds).enumerate() {
            let ratios: Vec<String> =
                o.prefill
                    .iter()
                    .map(|&(n, v)| {
                        (
                            format!("prefill {n}"),
                            v,
                            l.prefill.iter().find(|x| x.0 == n),
                        )
                    })
                    .chain(o.decode.iter().map(|&(b, v)| {
                        (format!("batch {b}"), v, l.decode.iter().find(|x| x.0 == b))
                    }))
                    .filter_map(|(label, v, peer)| Some(format!("{label} {:.2}x", v / peer?.1)))
                    .collect();
            eprintln!("round {}: vs llama.cpp: {}", i + 1, ratios.join(", "));
        }
    }
    // With several rounds, the llama.cpp ratios are medians of each round's
    // own ratio.
    let paired = (a.rounds > 1)
        .then(|| Results::paired_ratios(&ours_rounds, &llama_rounds))
        .flatten();
    let ours = Results::median_of(&ours_rounds).ok_or("no round ran")?;
    let mut peers: Vec<(&str, Results)> = Vec::new();
    if let Some(r) = Results::median_of(&llama_rounds) {
        peers.push(("llama_cpp", r));
    }
    if with_peers {
        if let Some(r) = python("oracle-venv").and_then(|py| bench_peer("mlx_lm", &py, &path, a)) {
            peers.push(("mlx_lm", r));
        }
    }
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let flags = cpu_flags();
    println!(
        "\nmodel: {}\nmachine: {} ({} cores; {}), threads {}, activations {}{}\n",
        path.display(),
        cpu,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        flags.join(" "),
        a.threads,
        options.activations,
        if a.rounds > 1 {
            format!(
                ", medians of {} alternating rounds (ratios vs llama.cpp: median of each \
                 round's ratio; mlx-lm: one run)",
                a.rounds
            )
        } else {
            String::new()
        }
    );
    let mut header = String::from("| workload | mlx-backend |");
    let mut rule = String::from("| --- | --- |");
    for (name, _) in &peers {
        header.push_str(&format!(" {name} | ratio vs {name} |"));
        rule.push_str(" --- | --- |");
    }
    println!("{header}\n{rule}");
    let row = |label: String, ours_v: f64, pick: &dyn Fn(&Results) -> Option<f64>| {
        let mut line = format!("| {label} | {ours_v:.1} tok/s |");
        for (name, r) in &peers {
            let ratio = match (&paired, *name) {
                (Some(p), "llama_cpp") => pick(p),
                _ => pick(r).filter(|&v| v > 0.0).map(|v| ours_v / v),
            };
            match (pick(r), ratio) {
                (Some(v), Some(ratio)) if v > 0.0 => {
                    line.push_str(&format!(" {v:.1} tok/s | {ratio:.2}x |"))
                }
                _ => line.push_str(" - | - |"),
            }
        }
        println!("{line}");
    };
    for &(n, v) in &ours.prefill {
        row(format!("prefill {n}"), v, &|r: &Results| {
            r.prefill.iter().find(|x| x.0 == n).map(|x| x.1)
        });
    }
    for &(b, v) in &ours.decode {
        row(format!("decode batch {b}"), v, &|r: &Results| {
            r.decode.iter().find(|x| x.0 == b).map(|x| x.1)
        });
    }
    let mut mem = format!("| peak memory | {:.0} MB |", ours.peak_memory / 1e6);
    for (_, r) in &peers {
        mem.push_str(&format!(" {:.0} MB | |", r.peak_memory / 1e6));
    }
    println!("{mem}");
    Ok(())
}
