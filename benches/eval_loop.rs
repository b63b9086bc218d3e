//! Builds and evaluates one decode-sized op in a loop, for `perf record`
//! (where the time of an `eval` goes):
//! `cargo bench --bench eval_loop -- [rms_norm|combine|abs|mlx_rms_norm] [ops] [ops per eval] [--hidden N]`.
use clap::{Parser, ValueEnum};
use mlx_backend::kernels::{moe_combine, rms_norm};
use mlx_backend::ops::random;
use mlx_backend::{Array, Dtype, OpError};
use std::error::Error;
use std::time::Instant;

/// Builds and evaluates one decode-sized op in a loop, for `perf record`.
#[derive(Parser)]
#[command(name = "eval_loop")]
struct Args {
    /// What `cargo bench` passes every bench target; ignored.
    #[arg(long = "bench", hide = true)]
    _bench: bool,
    /// The op to build.
    #[arg(value_enum, default_value_t = Op::RmsNorm)]
    op: Op,
    /// Ops to build and evaluate in all (>= 1).
    #[arg(value_name = "OPS", value_parser = at_least_one, default_value_t = 100_000)]
    iters: usize,
    /// Ops built per `eval` call (>= 1).
    #[arg(value_name = "OPS_PER_EVAL", value_parser = at_least_one, default_value_t = 1)]
    graph: usize,
    /// The row width (>= 1; 4096 for the larger decode row).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..), default_value_t = 576)]
    hidden: i32,
}

#[derive(Clone, Copy, ValueEnum)]
#[value(rename_all = "snake_case")]
enum Op {
    RmsNorm,
    Combine,
    Abs,
    MlxRmsNorm,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::RmsNorm => "rms_norm",
            Op::Combine => "combine",
            Op::Abs => "abs",
            Op::MlxRmsNorm => "mlx_rms_norm",
        }
    }
}

/// A count that must be at least 1.
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

fn normal(shape: &[i32], seed: u64) -> Result<Array, Box<dyn Error>> {
    let key = random::key(seed)?;
    let a = random::normal(shape, Dtype::BF16, 0.0, 1.0, Some(&key))?;
    a.eval()?;
    Ok(a)
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    let (iters, graph, hidden) = (args.iters, args.graph, args.hidden);
    let x = normal(&[1, hidden], 1)?;
    let w = normal(&[hidden], 2)?;
    let y = normal(&[1, 1, 4, 2048], 3)?;
    let s = normal(&[1, 1, 4], 4)?;
    let op: Box<dyn Fn() -> Result<Array, OpError>> = match args.op {
        Op::RmsNorm => Box::new(|| rms_norm(&x, &w, 1e-5)),
        Op::MlxRmsNorm => Box::new(|| x.rms_norm_mlx(Some(&w), 1e-5)),
        Op::Combine => Box::new(|| moe_combine(&y, &s)),
        Op::Abs => Box::new(|| x.abs()),
    };
    let t = Instant::now();
    for _ in 0..iters / graph {
        let outs = (0..graph)
            .map(|_| op())
            .collect::<Result<Vec<Array>, _>>()?;
        mlx_backend::eval(&outs.iter().collect::<Vec<_>>())?;
    }
    println!(
        "{}: {:.2} µs per call",
        args.op.name(),
        t.elapsed().as_secs_f64() * 1e6 / iters as f64
    );
    Ok(())
}
