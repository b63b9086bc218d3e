//! Generate text with the default model (or any supported model), streamed
//! as it is produced, ending with prompt and generation speed and peak
//! memory as mlx-lm prints them.
//!
//! ```sh
//! cargo run --release --example generate -- --prompt "Why is the sky blue?"
//! echo "Why is the sky blue?" | cargo run --release --example generate -- --prompt -
//! # Tensor parallelism over 2 local ranks (see docs/distributed.md):
//! cargo run --release --example launch -- -n 2 -- generate --tp 2 --prompt "Hi"
//! ```
//!
//! Exit codes: 0 done, 1 the model or the generation failed, 2 bad arguments.

use clap::Parser;
use mlx_backend::engine::{ModelBundle, TensorParallelPart};
use mlx_backend::kernels::ActivationPrecision;
use mlx_backend::model::{fetch, LoadOptions};
use mlx_backend::runner::{
    ForwardBatch, ForwardMode, ModelRunner, RequestInput, RunnerConfig, SamplingParams,
};
use mlx_backend::tokenizer::{ChatMessage, IncrementalDetokenizer, StopStrings};
use mlx_backend::Device;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Generate text with an LLM on MLX.
#[derive(Parser, Debug)]
#[command(name = "generate", allow_negative_numbers = true)]
struct Args {
    /// A GGUF file, a model folder (config.json + weights) or an `org/name`
    /// hub id; default: SmolLM2-135M-Instruct Q4_1, fetched once into the cache.
    #[arg(long, value_name = "PATH|ORG/NAME")]
    model: Option<String>,
    /// The prompt; `-` reads it from standard input.
    #[arg(
        long,
        default_value = "Hello! Who are you?",
        conflicts_with = "prompt_file"
    )]
    prompt: String,
    /// Read the prompt from a file (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    /// A system message (with the chat template).
    #[arg(long)]
    system: Option<String>,
    /// Most tokens to generate per sequence (0: prompt only).
    #[arg(long, default_value_t = 256, value_parser = whole_number)]
    max_tokens: u32,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0, value_parser = at_least_zero)]
    temp: f32,
    /// Nucleus sampling: keep the smallest set of tokens reaching this probability.
    #[arg(long, default_value_t = 1.0, value_parser = probability_above_zero)]
    top_p: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0, value_parser = whole_number)]
    top_k: u32,
    /// Drop tokens less likely than this times the most likely (0: off).
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    min_p: f32,
    /// Seed for reproducible sampling (sequence i of a batch uses seed + i).
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when this text appears (never printed); repeatable.
    #[arg(long, value_name = "TEXT", value_parser = non_empty)]
    stop: Vec<String>,
    /// Send the prompt as it is, without the model's chat template.
    #[arg(long)]
    no_chat_template: bool,
    /// Generate this many sequences of the same prompt as one batch.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    batch: u32,
    /// Device to run on (default: MLX's default, the GPU when there is one).
    #[arg(long, value_enum)]
    device: Option<DeviceArg>,
    /// The quantized CPU kernels' activations: `exact`, `int16` or `int8`
    /// (default: the device's, `LoadOptions::for_device`).
    #[arg(long)]
    activations: Option<ActivationPrecision>,
    /// Split the model over this many tensor-parallel ranks, the group the
    /// environment describes (start the ranks with the `launch` example).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    tp: Option<u32>,
    /// Under `--tp`: seconds to wait for a peer before failing.
    #[arg(long, default_value_t = 60)]
    peer_timeout_secs: u64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum DeviceArg {
    Cpu,
    Gpu,
}

fn number(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a finite number")),
    }
}

fn whole_number(s: &str) -> Result<u32, String> {
    match s.parse::<i64>() {
        Ok(v) if v < 0 => Err("must be >= 0".into()),
        Ok(v) => u32::try_from(v).map_err(|_| format!("must be <= {}", u32::MAX)),
        Err(_) => Err(format!("'{s}' is not a whole number")),
    }
}

fn at_least_zero(s: &str) -> Result<f32, String> {
    let v = number(s)?;
    if v >= 0.0 {
        Ok(v)
    } else {
        Err("must be >= 0".into())
    }
}

fn probability(s: &str) -> Result<f32, String> {
    let v = number(s)?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err("must be in [0, 1]".into())
    }
}

fn probability_above_zero(s: &str) -> Result<f32, String> {
    let v = number(s)?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err("must be in (0, 1]".into())
    }
}

fn non_empty(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(s.to_string())
    }
}

/// One sequence being generated.
struct Sequence {
    tokens: Vec<u32>,
    text: String,
    detok: IncrementalDetokenizer,
    stops: StopStrings,
    done: bool,
}

impl Sequence {
    /// Takes a sampled token; returns the text that may be shown now.
    fn push(
        &mut self,
        token: u32,
        eos: &[u32],
        max_tokens: usize,
    ) -> Result<String, Box<dyn std::error::Error>> {
        if eos.contains(&token) {
            self.done = true;
            return self.finish();
        }
        self.tokens.push(token);
        let mut shown = String::new();
        if let Some(piece) = self.detok.push(token)? {
            let out = self.stops.push(&piece);
            shown = out.text;
            self.done = out.stopped;
        }
        if !self.done && self.tokens.len() >= max_tokens {
            self.done = true;
            shown.push_str(&self.finish()?);
        }
        self.text.push_str(&shown);
        Ok(shown)
    }

    /// The end of the sequence: what the detokenizer and the stop matcher held back.
    fn finish(&mut self) -> Result<String, Box<dyn std::error::Error>> {
        let mut rest = String::new();
        if !self.stops.stopped() {
            if let Some(tail) = self.detok.flush()? {
                rest = self.stops.push(&tail).text;
            }
            rest.push_str(&self.stops.finish());
        }
        Ok(rest)
    }
}

fn main() {
    // clap prints the message and exits with 2 on bad arguments.
    let args = Args::parse();
    let tp = args.tp.is_some_and(|n| n > 1);
    if let Err(e) = run(args) {
        eprintln!("error: {e}");
        let mut source = e.source();
        while let Some(cause) = source {
            eprintln!("  caused by: {cause}");
            source = cause.source();
        }
        if tp {
            // A thread may be stuck in a collective whose peer is gone.
            mlx_backend::distributed::exit_process(1);
        }
        std::process::exit(1);
    }
}

fn read_prompt(args: &Args) -> Result<String, Box<dyn std::error::Error>> {
    let from_stdin = || -> Result<String, Box<dyn std::error::Error>> {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("reading the prompt from standard input: {e}"))?;
        Ok(text)
    };
    match &args.prompt_file {
        Some(p) if p == Path::new("-") => from_stdin(),
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| format!("reading the prompt file {}: {e}", p.display()).into()),
        None if args.prompt == "-" => from_stdin(),
        None => Ok(args.prompt.clone()),
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let prompt_text = read_prompt(&args)?;
    let device = match args.device {
        None => mlx_backend::Stream::current().device(),
        Some(DeviceArg::Cpu) => Device::Cpu,
        Some(DeviceArg::Gpu) => Device::gpu().ok_or("this MLX build has no GPU")?,
    };
    device.set_default()?;
    let path = fetch::resolve(args.model.as_deref())?;
    // One load: the model first (a bad config.json or an unsupported
    // architecture is the real problem even when the tokenizer is missing
    // too), then the tokenizer and template from the same GGUF read, and
    // one EOS set for both.
    let mut options = LoadOptions::for_device(device);
    if let Some(a) = args.activations {
        options.activations = a;
    }
    let bundle: ModelBundle<Box<dyn ModelRunner>> = match args.tp.filter(|&n| n > 1) {
        None => {
            let bundle = ModelBundle::load(&path, &options, RunnerConfig::default())?;
            let (parts, runner) = bundle.with_runner(());
            parts
                .with_runner(Box::new(runner) as Box<dyn ModelRunner>)
                .0
        }
        Some(n) => {
            let config = RunnerConfig {
                tensor_parallel: Some(n as usize),
                peer_timeout: Duration::from_secs(args.peer_timeout_secs),
                ..RunnerConfig::default()
            };
            match ModelBundle::load_tensor_parallel(&path, &options, config)? {
                TensorParallelPart::Follower(follower) => {
                    // Ranks other than 0 replay rank 0's steps and print nothing.
                    follower.follow_then_exit()
                }
                TensorParallelPart::Leader(bundle) => {
                    let (parts, runner) = (*bundle).with_runner(());
                    parts
                        .with_runner(Box::new(runner) as Box<dyn ModelRunner>)
                        .0
                }
            }
        }
    };
    let ModelBundle {
        mut runner,
        tokenizer: tok,
        chat_template: template,
        eos_token_ids: eos,
    } = bundle;

    let prompt_text = match (&template, args.no_chat_template) {
        (Some(t), false) => {
            let mut messages = Vec::new();
            if let Some(s) = &args.system {
                messages.push(ChatMessage::system(s.clone()));
            }
            messages.push(ChatMessage::user(prompt_text));
            t.render(&messages, true)?
        }
        _ => prompt_text,
    };
    let prompt = tok.encode_with(&prompt_text, tok.add_bos_token(), true)?;
    if prompt.is_empty() {
        return Err("the prompt is empty".into());
    }

    let batch = args.batch as usize;
    let max_tokens = args.max_tokens as usize;
    let mut seqs: Vec<Sequence> = (0..batch)
        .map(|_| Sequence {
            tokens: Vec::new(),
            text: String::new(),
            detok: tok.detokenizer(true),
            stops: StopStrings::new(args.stop.iter().cloned()),
            done: max_tokens == 0,
        })
        .collect();
    let sampling = SamplingParams {
        temperature: args.temp,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        ..SamplingParams::default()
    };
    let params = |i: usize| SamplingParams {
        seed: args.seed.map(|s| s.wrapping_add(i as u64)),
        ..sampling.clone()
    };
    mlx_backend::memory::reset_peak_memory();
    let start = Instant::now();
    let requests = (0..batch)
        .map(|i| RequestInput::prompt(i as u64, prompt.clone(), params(i)))
        .collect();
    let first = runner.forward(&ForwardBatch::new(ForwardMode::Extend, requests))?;
    let prompt_secs = start.elapsed().as_secs_f64();
    let gen_start = Instant::now();
    let mut out = std::io::stdout();
    let mut next: Vec<Option<u32>> = first.outputs.iter().map(|o| o.next_token).collect();
    loop {
        for (i, s) in seqs.iter_mut().enumerate() {
            let Some(t) = next[i].take() else { continue };
            if s.done {
                continue;
            }
            let shown = s.push(t, &eos, max_tokens)?;
            if batch == 1 && !shown.is_empty() {
                write!(out, "{shown}")?;
                out.flush()?;
            }
        }
        let live: Vec<usize> = (0..seqs.len()).filter(|&i| !seqs[i].done).collect();
        if live.is_empty() {
            break;
        }
        let mut requests = Vec::with_capacity(live.len());
        for &i in &live {
            let s = &seqs[i];
            let last = *s
                .tokens
                .last()
                .ok_or("the runner returned no token for a live sequence")?;
            requests.push(RequestInput::decode(
                i as u64,
                last,
                prompt.len() + s.tokens.len() - 1,
                params(i),
            ));
        }
        let step = runner.forward(&ForwardBatch::new(ForwardMode::Decode, requests))?;
        for o in step.outputs {
            if let Some(slot) = next.get_mut(o.id as usize) {
                *slot = o.next_token;
            }
        }
    }
    let gen_secs = gen_start.elapsed().as_secs_f64();
    if batch > 1 {
        for (i, s) in seqs.iter().enumerate() {
            println!("--- [{i}] ---\n{}", s.text);
        }
    }
    let generated: usize = seqs.iter().map(|s| s.tokens.len()).sum();
    println!("\n==========");
    println!(
        "Prompt: {} tokens, {:.3} tokens-per-sec",
        prompt.len() * batch,
        (prompt.len() * batch) as f64 / prompt_secs
    );
    println!(
        "Generation: {} tokens, {:.3} tokens-per-sec",
        generated,
        generated as f64 / gen_secs.max(1e-9)
    );
    println!(
        "Peak memory: {:.3} GB",
        mlx_backend::memory::peak_memory() as f64 / 1e9
    );
    Ok(())
}
