//! The latency of one `all_sum` over the group in the environment, for the
//! sizes a decode step all-reduces (one token's hidden state), as the
//! tensor-parallel runner issues them: built, evaluated, waited for.
//!
//! ```sh
//! cargo run --release --example launch -- -n 2 -- allsum_latency --sizes 576,1024,4096
//! ```
//!
//! Rank 0 prints one line per size: elements, bytes, median and p90 in
//! microseconds over `--iters` calls (after `--warmup` calls).

use clap::Parser;
use mlx_backend::distributed::Group;
use mlx_backend::{Array, Device};
use std::time::Instant;

/// Measure all_sum latency over the distributed group of the environment.
#[derive(Parser, Debug)]
#[command(name = "allsum_latency")]
struct Args {
    /// Elements (f32) per all_sum, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [576, 1024, 4096])]
    sizes: Vec<usize>,
    /// Timed calls per size.
    #[arg(long, default_value_t = 200)]
    iters: usize,
    /// Untimed calls per size first.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        mlx_backend::distributed::exit_process(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    Device::Cpu.set_default()?;
    let group = Group::from_env()?;
    if group.rank() == 0 {
        println!(
            "ranks={} (elements, bytes, median us, p90 us)",
            group.size()
        );
    }
    for &n in &args.sizes {
        let x = Array::from_slice(&vec![1.0f32; n], &[n as i32])?;
        let mut times = Vec::with_capacity(args.iters);
        for i in 0..args.warmup + args.iters {
            let t = Instant::now();
            let y = group.all_sum(&x)?;
            y.eval()?;
            if i >= args.warmup {
                times.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        times.sort_by(f64::total_cmp);
        if group.rank() == 0 {
            let median = times[times.len() / 2];
            let p90 = times[times.len() * 9 / 10];
            println!("{n}\t{}\t{median:.1}\t{p90:.1}", n * 4);
        }
    }
    Ok(())
}
