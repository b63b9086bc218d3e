//! Builds and evaluates one decode-sized op in a loop, for `perf record`
//! (where the time of an `eval` goes):
//! `cargo run --release --example eval_loop -- rms_norm|combine|abs|mlx_rms_norm [ops] [ops per eval]`.
use mlx_backend::kernels::{moe_combine, rms_norm};
use mlx_backend::ops::random;
use mlx_backend::{Array, Dtype};
use std::time::Instant;

fn normal(shape: &[i32], seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    let a = random::normal(shape, Dtype::BF16, 0.0, 1.0, Some(&key)).unwrap();
    a.eval().unwrap();
    a
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map(String::as_str).unwrap_or("rms_norm");
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    // `HIDDEN=4096` for the larger decode row (default 576).
    let hidden: i32 = std::env::var("HIDDEN")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(576);
    let x = normal(&[1, hidden], 1);
    let w = normal(&[hidden], 2);
    let y = normal(&[1, 1, 4, 2048], 3);
    let s = normal(&[1, 1, 4], 4);
    let op: Box<dyn Fn() -> Array> = match which {
        "rms_norm" => Box::new(|| rms_norm(&x, &w, 1e-5).unwrap()),
        "mlx_rms_norm" => Box::new(|| x.rms_norm_mlx(Some(&w), 1e-5).unwrap()),
        "combine" => Box::new(|| moe_combine(&y, &s).unwrap()),
        "abs" => Box::new(|| x.abs().unwrap()),
        other => panic!("unknown op {other}"),
    };
    let graph: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let t = Instant::now();
    for _ in 0..iters / graph {
        let outs: Vec<Array> = (0..graph).map(|_| op()).collect();
        mlx_backend::eval(&outs.iter().collect::<Vec<_>>()).unwrap();
    }
    println!(
        "{which}: {:.2} µs per call",
        t.elapsed().as_secs_f64() * 1e6 / iters as f64
    );
}
