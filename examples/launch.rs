//! Start the ranks of a tensor-parallel group on this machine, as
//! `mlx.launch` does for local hosts: every rank runs the same program with
//! `MLX_RANK` and, for the ring backend, `MLX_HOSTFILE` (a generated list of
//! loopback addresses) in its environment.
//!
//! ```sh
//! cargo run --release --example launch -- -n 2 --backend ring -- generate --tp 2 --prompt "Hi"
//! ```
//!
//! The program is an example name (resolved next to this binary) or a
//! path. Only rank 0's standard output is shown unless `--all-output`.
//! Exit codes: 0 every rank succeeded, else the first failing rank's code
//! (128 + signal when killed), 1 when a rank could not be started, 2 bad
//! arguments.

use clap::Parser;
use mlx_backend::distributed::launch::{self, LaunchConfig};
use mlx_backend::distributed::Backend;
use std::path::PathBuf;
use std::time::Duration;

/// Launch local ranks of an MLX distributed program.
#[derive(Parser, Debug)]
#[command(name = "launch", trailing_var_arg = true)]
struct Args {
    /// Ranks (processes) to start.
    #[arg(short = 'n', long = "ranks", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    ranks: u32,
    /// The distributed backend (ring runs anywhere; nccl needs one GPU per rank).
    #[arg(long, default_value = "ring")]
    backend: String,
    /// `mlx.launch`'s hosts file (JSON list of {"ssh", "ips"}); local hosts only.
    #[arg(long, value_name = "FILE")]
    hostfile: Option<PathBuf>,
    /// Show every rank's standard output, not only rank 0's.
    #[arg(long)]
    all_output: bool,
    /// Seconds the other ranks get to finish once one fails or rank 0 exits.
    #[arg(long, default_value_t = 30)]
    grace_secs: u64,
    /// The program and its arguments (after `--`).
    #[arg(required = true, num_args = 1.., allow_hyphen_values = true)]
    command: Vec<String>,
}

fn main() {
    let args = Args::parse();
    match run(args) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = std::error::Error::source(&*e);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            std::process::exit(1);
        }
    }
}

/// An example's name resolves to the binary next to this one.
fn program(name: &str) -> PathBuf {
    let given = PathBuf::from(name);
    if given.components().count() > 1 || given.is_file() {
        return given;
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(name)))
        .filter(|p| p.is_file())
        .unwrap_or(given)
}

fn run(args: Args) -> Result<i32, Box<dyn std::error::Error>> {
    let backend: Backend = args.backend.parse()?;
    let mut command = args.command.into_iter();
    let name = command.next().ok_or("no program given")?;
    let mut config = LaunchConfig::local(
        args.ranks as usize,
        backend,
        program(&name),
        command.collect(),
    );
    config.all_stdout = args.all_output;
    config.grace = Duration::from_secs(args.grace_secs);
    if let Some(path) = &args.hostfile {
        config.hosts = Some(launch::read_hosts(path)?);
    }
    Ok(launch::launch(&config)?)
}
