//! Decode speed of the default model (SmolLM2-135M-Instruct Q4_1 GGUF):
//! prefill 32 tokens, then 32 greedy decode steps, with the fused
//! `decoder_layer` kernel on and off (off: the blocks run op by op, with the
//! other kernels), in the file's dtype and in f32.
//!
//! `cargo bench --bench bench_decode -- [path.gguf] [file|f32|int16|int8] [on|off]`
//! (the optional arguments run one load mode / one kernel setting only:
//! `file` the checkpoint's dtypes, `f32` f32 activations with exact dot
//! products, `int16` / `int8` f32 with int16- / int8-activation dot products).

use anyhow::Context;
use clap::{Parser, ValueEnum};
use mlx_backend::kernels::{registry, ActivationPrecision, Kernel};
use mlx_backend::model::{self, LoadOptions, Logits, Transformer};
use mlx_backend::{Array, Dtype};
use std::path::PathBuf;
use std::time::Instant;

const PREFILL: usize = 32;
const DECODE: usize = 32;

/// Decode speed of a GGUF model with the fused `decoder_layer` kernel on and
/// off, in the file's dtype and in f32.
#[derive(Parser)]
#[command(name = "bench_decode")]
struct Args {
    /// What `cargo bench` passes every bench target; ignored.
    #[arg(long = "bench", hide = true)]
    _bench: bool,
    /// The GGUF file (default:
    /// ~/.cache/mlx-backend/models/SmolLM2-135M-Instruct.Q4_1.gguf).
    path: Option<PathBuf>,
    /// Run one load mode only (default: all): `file` the checkpoint's
    /// dtypes, `f32` f32 activations with exact dot products, `int16` /
    /// `int8` f32 with int16- / int8-activation dot products.
    #[arg(value_enum)]
    mode: Option<Mode>,
    /// Run one `decoder_layer` kernel setting only (default: both).
    #[arg(value_enum)]
    kernel: Option<Switch>,
}

/// A load mode: the dtype and activation precision.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    File,
    F32,
    Int16,
    Int8,
}

/// The `decoder_layer` kernel on or off.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Switch {
    On,
    Off,
}

fn default_path() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/mlx-backend/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn next_token(logits: &Array) -> anyhow::Result<u32> {
    logits
        .argmax(-1, false)?
        .reshape(&[-1])?
        .to_vec::<u32>()?
        .first()
        .copied()
        .context("the model returned no logits")
}

/// (prefill ms, decode ms/token, generated tokens).
fn run(m: &Transformer, prompt: &[u32]) -> anyhow::Result<(f64, f64, Vec<u32>)> {
    let mut caches = m.new_caches(256);
    let t = Instant::now();
    let x = Array::from_slice(prompt, &[1, prompt.len() as i32])?;
    let mut next = next_token(&m.forward(&x, &mut caches, Logits::Last)?)?;
    let prefill = t.elapsed().as_secs_f64() * 1e3;
    let mut out = vec![next];
    let t = Instant::now();
    for _ in 0..DECODE {
        let x = Array::from_slice(&[next], &[1, 1])?;
        next = next_token(&m.forward(&x, &mut caches, Logits::Last)?)?;
        out.push(next);
    }
    let decode = t.elapsed().as_secs_f64() * 1e3 / DECODE as f64;
    Ok((prefill, decode, out))
}

fn main() {
    let args = Args::parse();
    if let Err(e) = bench(&args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn bench(args: &Args) -> anyhow::Result<()> {
    let path = args.path.clone().unwrap_or_else(default_path);
    // A fixed, deterministic prompt of PREFILL token ids.
    let prompt: Vec<u32> = (0..PREFILL as u32).map(|i| 100 + 37 * i).collect();
    for (mode, name, dtype, activations) in [
        (Mode::File, "file", None, ActivationPrecision::Exact),
        (
            Mode::F32,
            "f32",
            Some(Dtype::F32),
            ActivationPrecision::Exact,
        ),
        (
            Mode::Int16,
            "int16",
            Some(Dtype::F32),
            ActivationPrecision::Int16,
        ),
        (
            Mode::Int8,
            "int8",
            Some(Dtype::F32),
            ActivationPrecision::Int8,
        ),
    ] {
        if args.mode.is_some_and(|o| o != mode) {
            continue;
        }
        let opts = LoadOptions {
            dtype,
            activations,
            ..LoadOptions::default()
        };
        let loaded = model::load(&path, &opts)?;
        let m = &loaded.model;
        let mut reference: Option<Vec<u32>> = None;
        for on in [true, false] {
            if args.kernel.is_some_and(|k| (k == Switch::On) != on) {
                continue;
            }
            registry::set_enabled(Kernel::DecoderLayer, on);
            run(m, &prompt)?; // warm up
            let before = registry::snapshot().get(Kernel::DecoderLayer).fused;
            let (prefill, decode, tokens) = run(m, &prompt)?;
            let fused = registry::snapshot().get(Kernel::DecoderLayer).fused - before;
            let same = reference.get_or_insert_with(|| tokens.clone()) == &tokens;
            println!(
                "{name:>4} decoder_layer {:>3}: prefill {PREFILL} {prefill:8.1} ms, \
                 decode {decode:7.1} ms/token ({:5.1} tok/s), fused blocks {fused}, \
                 cache copies {}, tokens same as kernel-on: {same}",
                if on { "on" } else { "off" },
                1e3 / decode,
                mlx_backend::kernels::decoder_layer::cache_copies(),
            );
        }
    }
    registry::set_enabled(Kernel::DecoderLayer, true);
    if let Some(f) = registry::last_failure() {
        println!("kernel failure: {f:?}");
    }
    Ok(())
}
