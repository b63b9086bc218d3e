//! Int16 and int8 against exact activations in the quantized kernels, at the default
//! model's shapes (SmolLM2-135M: hidden 576, KV 192, MLP 1536, tied 8-bit
//! 49152-row head; group 32, f32 activations as `LoadOptions::for_device(Cpu)`
//! loads it), decode (1 row) and prefill (512 rows). The modes are timed
//! in the same run, alternating, and each figure is the median of the
//! per-round medians.

use mlx_backend::kernels::{
    gate_qmv_silu_mul_with, gather_gate_qmv_silu_mul_with, quantized_matmul_with,
    ActivationPrecision,
};
use mlx_backend::ops::{quantize, random, Quantized};
use mlx_backend::{Array, Dtype};
use std::time::Duration;

type Op = Box<dyn Fn(ActivationPrecision) -> Array>;

struct Case {
    name: String,
    /// Packed weights + f32 scales and biases, read once per call.
    weight_bytes: f64,
    op: Op,
}

fn f32_normal(shape: &[i32], scale: f32, seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    let a = random::normal(shape, Dtype::F32, 0.0, scale, Some(&key)).unwrap();
    a.eval().unwrap();
    a
}

fn weights(lead: &[i32], n: i32, k: i32, bits: i32, seed: u64) -> (Quantized, f64) {
    let shape: Vec<i32> = lead.iter().copied().chain([n, k]).collect();
    let q = quantize(&f32_normal(&shape, 0.05, seed), 32, bits).unwrap();
    mlx_backend::eval(&[&q.weight, &q.scales, &q.biases]).unwrap();
    let mats = lead.iter().product::<i32>() as f64;
    let per = n as f64 * k as f64 * bits as f64 / 8.0 + 2.0 * (n * k / 32) as f64 * 4.0;
    (q, mats * per)
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (m, k, n, bits) in [
        (1, 576, 576, 4),
        (1, 576, 192, 4),
        (1, 576, 1536, 4),
        (1, 1536, 576, 4),
        (1, 576, 49152, 8),
        (512, 576, 576, 4),
        (512, 576, 1536, 4),
        (512, 1536, 576, 4),
    ] {
        let x = f32_normal(&[m, k], 1.0, 21);
        let (w, weight_bytes) = weights(&[], n, k, bits, 22);
        cases.push(Case {
            name: format!("quantized_matmul {m}x{k}->{n} g32 q{bits}"),
            weight_bytes,
            op: Box::new(move |a| quantized_matmul_with(&x, &w, a).unwrap()),
        });
    }
    for m in [1, 512] {
        let (k, n) = (576, 1536);
        let x = f32_normal(&[m, k], 1.0, 23);
        let (gate, bytes) = weights(&[], n, k, 4, 24);
        let (up, _) = weights(&[], n, k, 4, 25);
        cases.push(Case {
            name: format!("gate_qmv_silu_mul {m}x{k}->{n} g32 q4"),
            weight_bytes: 2.0 * bytes,
            op: Box::new(move |a| gate_qmv_silu_mul_with(&x, &gate, &up, a).unwrap()),
        });
    }
    {
        let (e, top_k, k, n) = (60, 4, 2048, 1408);
        let x = f32_normal(&[1, k], 1.0, 26);
        let idx = Array::from_slice(&[3u32, 17, 42, 59], &[1, top_k]).unwrap();
        let (gate, bytes) = weights(&[e], n, k, 4, 27);
        let (up, _) = weights(&[e], n, k, 4, 28);
        cases.push(Case {
            name: format!("gather_gate_qmv E{e} top{top_k} {k}->{n} g32 q4"),
            weight_bytes: 2.0 * bytes * top_k as f64 / e as f64,
            op: Box::new(move |a| gather_gate_qmv_silu_mul_with(&x, &idx, &gate, &up, a).unwrap()),
        });
    }
    cases
}

/// The modes, exact first (the speedups are against it).
const MODES: [ActivationPrecision; 3] = [
    ActivationPrecision::Exact,
    ActivationPrecision::Int16,
    ActivationPrecision::Int8,
];

/// Prints the exact / int16 / int8 table for the cases whose name contains `filter`.
pub fn table(filter: &str, median_secs: fn(&dyn Fn(), Duration) -> f64) {
    let cases: Vec<Case> = cases()
        .into_iter()
        .filter(|c| c.name.contains(filter))
        .collect();
    if cases.is_empty() {
        return;
    }
    println!(
        "\nexact vs int16 vs int8 activations (f32, CPU kernels; median µs per call, 3 alternating rounds)"
    );
    println!(
        "| case | exact µs | int16 µs | int8 µs | int16 speedup | int8 speedup | exact GB/s | int16 GB/s | int8 GB/s |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for case in &cases {
        let mut times: [Vec<f64>; 3] = Default::default();
        for _ in 0..3 {
            for (i, a) in MODES.into_iter().enumerate() {
                let run = || (case.op)(a).eval().unwrap();
                times[i].push(median_secs(&run, Duration::from_millis(400)));
            }
        }
        let [exact, int16, int8] = times.map(|mut t| {
            t.sort_by(|a, b| a.total_cmp(b));
            t[1]
        });
        let gbs = |t: f64| case.weight_bytes / t / 1e9;
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.2}x | {:.2}x | {:.1} | {:.1} | {:.1} |",
            case.name,
            exact * 1e6,
            int16 * 1e6,
            int8 * 1e6,
            exact / int16,
            exact / int8,
            gbs(exact),
            gbs(int16),
            gbs(int8)
        );
    }
}
