//! Generate text with the default model (or any supported model), streamed
//! as it is produced, ending with prompt and generation speed and peak
//! memory as mlx-lm prints them.
//!
//! ```sh
//! cargo run --release --example generate -- --prompt "Why is the sky blue?"
//! ```

use mlx_backend::model::{fetch, LoadOptions};
use mlx_backend::runner::{
    ForwardBatch, ForwardMode, MlxModelRunner, ModelRunner, RequestInput, RunnerConfig,
    SamplingParams,
};
use mlx_backend::tokenizer::{self, ChatMessage, IncrementalDetokenizer};
use std::io::Write;
use std::time::Instant;

struct Args {
    model: Option<String>,
    prompt: String,
    system: Option<String>,
    max_tokens: usize,
    sampling: SamplingParams,
    chat_template: bool,
    batch: usize,
    stop: Vec<String>,
}

const USAGE: &str = "usage: generate [--model PATH|ORG/NAME] [--prompt TEXT] [--system TEXT] [--max-tokens N] \
[--temp T] [--top-p P] [--top-k K] [--min-p M] [--seed S] [--stop TEXT]... [--no-chat-template] [--batch N]";

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        model: None,
        prompt: "Hello! Who are you?".into(),
        system: None,
        max_tokens: 256,
        sampling: SamplingParams::default(),
        chat_template: true,
        batch: 1,
        stop: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        let num = |v: String| -> Result<f64, String> {
            v.parse::<f64>()
                .map_err(|_| format!("{flag}: '{v}' is not a number"))
        };
        match flag.as_str() {
            "--model" => a.model = Some(value()?),
            "--prompt" => a.prompt = value()?,
            "--system" => a.system = Some(value()?),
            "--max-tokens" => a.max_tokens = num(value()?)? as usize,
            "--temp" => a.sampling.temperature = num(value()?)? as f32,
            "--top-p" => a.sampling.top_p = num(value()?)? as f32,
            "--top-k" => a.sampling.top_k = num(value()?)? as u32,
            "--min-p" => a.sampling.min_p = num(value()?)? as f32,
            "--seed" => a.sampling.seed = Some(num(value()?)? as u64),
            "--stop" => a.stop.push(value()?),
            "--batch" => a.batch = (num(value()?)? as usize).max(1),
            "--no-chat-template" => a.chat_template = false,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument '{other}'\n{USAGE}")),
        }
    }
    Ok(a)
}

/// One request being generated.
struct Stream {
    tokens: Vec<u32>,
    text: String,
    detok: IncrementalDetokenizer,
    done: bool,
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let path = fetch::resolve(args.model.as_deref())?;
    let (tok, template) = tokenizer::for_model(&path)?;
    let mut runner = MlxModelRunner::load(
        &path,
        &LoadOptions::for_device(mlx_backend::Stream::current().device()),
        RunnerConfig::default(),
    )?;
    let info = runner.info();

    let prompt_text = match (&template, args.chat_template) {
        (Some(t), true) => {
            let mut messages = Vec::new();
            if let Some(s) = &args.system {
                messages.push(ChatMessage::system(s.clone()));
            }
            messages.push(ChatMessage::user(args.prompt.clone()));
            t.render(&messages, true)?
        }
        _ => args.prompt.clone(),
    };
    let prompt = tok.encode_with(&prompt_text, tok.add_bos_token(), true)?;
    let mut eos: Vec<u32> = tok.eos_ids().to_vec();
    eos.extend(&info.eos_token_ids);

    let mut streams: Vec<Stream> = (0..args.batch)
        .map(|_| Stream {
            tokens: Vec::new(),
            text: String::new(),
            detok: tok.detokenizer(true),
            done: false,
        })
        .collect();
    let params = |i: usize| SamplingParams {
        seed: args.sampling.seed.map(|s| s + i as u64),
        ..args.sampling.clone()
    };
    mlx_backend::memory::reset_peak_memory();
    let start = Instant::now();
    let requests = (0..args.batch)
        .map(|i| RequestInput::prompt(i as u64, prompt.clone(), params(i)))
        .collect();
    let first = runner.forward(&ForwardBatch::new(ForwardMode::Extend, requests))?;
    let prompt_secs = start.elapsed().as_secs_f64();
    let gen_start = Instant::now();
    let mut out = std::io::stdout();
    let mut next: Vec<Option<u32>> = first.outputs.iter().map(|o| o.next_token).collect();
    loop {
        for (i, s) in streams.iter_mut().enumerate() {
            let Some(t) = next[i].take() else { continue };
            if s.done {
                continue;
            }
            if eos.contains(&t) {
                s.done = true;
                continue;
            }
            s.tokens.push(t);
            if let Some(piece) = s.detok.push(t)? {
                s.text.push_str(&piece);
                if args.batch == 1 {
                    write!(out, "{piece}")?;
                    out.flush()?;
                }
            }
            if let Some(pos) = args
                .stop
                .iter()
                .filter_map(|stop| s.text.find(stop.as_str()))
                .min()
            {
                s.text.truncate(pos);
                s.done = true;
            }
            if s.tokens.len() >= args.max_tokens {
                s.done = true;
            }
        }
        let live: Vec<usize> = (0..streams.len()).filter(|&i| !streams[i].done).collect();
        if live.is_empty() {
            break;
        }
        let requests = live
            .iter()
            .map(|&i| {
                let s = &streams[i];
                RequestInput::decode(
                    i as u64,
                    *s.tokens.last().expect("a token"),
                    prompt.len() + s.tokens.len() - 1,
                    params(i),
                )
            })
            .collect();
        let step = runner.forward(&ForwardBatch::new(ForwardMode::Decode, requests))?;
        for o in step.outputs {
            next[o.id as usize] = o.next_token;
        }
    }
    let gen_secs = gen_start.elapsed().as_secs_f64();
    for s in &mut streams {
        if let Some(rest) = s.detok.flush()? {
            s.text.push_str(&rest);
            if args.batch == 1 {
                write!(out, "{rest}")?;
            }
        }
    }
    if args.batch > 1 {
        for (i, s) in streams.iter().enumerate() {
            println!("--- [{i}] ---\n{}", s.text);
        }
    }
    let generated: usize = streams.iter().map(|s| s.tokens.len()).sum();
    println!("\n==========");
    println!(
        "Prompt: {} tokens, {:.3} tokens-per-sec",
        prompt.len() * args.batch,
        (prompt.len() * args.batch) as f64 / prompt_secs
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
