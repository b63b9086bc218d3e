//! The custom kernels' GPU bodies against MLX's built-in ops on the same
//! GPU, side by side in one run: median time per op with `OPS` ops built
//! into one graph and evaluated together (amortized launch cost), achieved
//! GB/s over the bytes each op must move, and that as a share of the
//! device's copy bandwidth (measured first, bytes read plus written).
//!
//! ```sh
//! cargo bench --features cuda --bench gpu_kernels     # on a CUDA machine
//! ```
//! `GPU_BENCH_FILTER=qmv` keeps the cases whose name contains the string
//! (`qmm`: the 512-row prefill projections).
//! Without a GPU it says so and exits.

use mlx_backend::kernels::{
    attention, gate_qmv_silu_mul, gather_gate_qmv_silu_mul, moe_combine, quantized_matmul,
    registry, rms_norm,
};
use mlx_backend::kernels::{Backend, Kernel};
use mlx_backend::ops::{quantize, random, AttentionMask, Quantized};
use mlx_backend::{Array, Device, Dtype};
use std::time::Instant;

/// Ops per evaluated graph.
const OPS: usize = 20;
/// Timed graphs per measurement (the median is reported).
const ROUNDS: usize = 15;
/// Input sets the ops rotate through, so that repeated ops do not all
/// read one copy from L2.
const SETS: usize = 4;

type Op = Box<dyn Fn(usize) -> Array>;

struct Case {
    name: String,
    kernel: Kernel,
    /// Bytes one op must move at least once (inputs read, output written).
    bytes: f64,
    op: Op,
}

fn normal(shape: &[i32], dtype: Dtype, scale: f32, seed: u64) -> Array {
    let key = random::key(seed).expect("key");
    let a = random::normal(shape, dtype, 0.0, scale, Some(&key)).expect("normal");
    a.eval().expect("eval");
    a
}

fn quantized(n: i32, k: i32, bits: i32, group: i32, seed: u64) -> Quantized {
    stacked(&[], n, k, bits, group, seed)
}

/// `lead` matrices `[n, k]` (an expert stack when `lead` is `[E]`), quantized.
fn stacked(lead: &[i32], n: i32, k: i32, bits: i32, group: i32, seed: u64) -> Quantized {
    let shape: Vec<i32> = lead.iter().copied().chain([n, k]).collect();
    let q = quantize(&normal(&shape, Dtype::BF16, 0.05, seed), group, bits).expect("quantize");
    mlx_backend::eval(&[&q.weight, &q.scales, &q.biases]).expect("eval");
    q
}

fn quant_bytes(n: i32, k: i32, bits: i32, group: i32) -> f64 {
    let (n, k) = (n as f64, k as f64);
    n * k * bits as f64 / 8.0 + 2.0 * n * (k / group as f64) * 2.0
}

/// Median seconds per op of `op` over ROUNDS graphs of OPS ops.
fn time_per_op(op: &Op) -> f64 {
    let run = || {
        let outs: Vec<Array> = (0..OPS).map(|i| op(i % SETS)).collect();
        mlx_backend::eval(&outs.iter().collect::<Vec<_>>()).expect("eval");
    };
    run();
    run();
    let mut samples: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed().as_secs_f64() / OPS as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[ROUNDS / 2]
}

/// A device-to-device copy of 1 GiB (read + write counted), GB/s.
fn copy_bandwidth() -> f64 {
    let n = 1 << 28; // f32 elements: 1 GiB
    let x = normal(&[n], Dtype::F32, 1.0, 1);
    let op: Op = Box::new(move |_| x.add_scalar(1.0).expect("add"));
    let t = time_per_op(&op);
    2.0 * 4.0 * n as f64 / t / 1e9
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let bf16 = Dtype::BF16;
    // rms_norm 4096x4096 bf16.
    let xs: Vec<Array> = (0..SETS)
        .map(|i| normal(&[4096, 4096], bf16, 1.0, 10 + i as u64))
        .collect();
    let w = normal(&[4096], bf16, 1.0, 20);
    cases.push(Case {
        name: "rms_norm 4096x4096 bf16".into(),
        kernel: Kernel::RmsNorm,
        bytes: 2.0 * 2.0 * 4096.0 * 4096.0 + 2.0 * 4096.0,
        op: Box::new(move |i| rms_norm(&xs[i], &w, 1e-5).expect("rms_norm")),
    });
    // moe_combine [1, 268, 4, 2048] bf16.
    let ys: Vec<Array> = (0..SETS)
        .map(|i| normal(&[1, 268, 4, 2048], bf16, 1.0, 30 + i as u64))
        .collect();
    let scores = normal(&[1, 268, 4], bf16, 0.5, 40);
    cases.push(Case {
        name: "moe_combine [1,268,4,2048] bf16".into(),
        kernel: Kernel::MoeCombine,
        bytes: 2.0 * (268.0 * 4.0 * 2048.0 + 268.0 * 4.0 + 268.0 * 2048.0),
        op: Box::new(move |i| moe_combine(&ys[i], &scores).expect("moe_combine")),
    });
    // gate+up 4-bit g64, 1 row: 4096 -> 14336.
    let (k, n) = (4096, 14336);
    let gates: Vec<Quantized> = (0..SETS)
        .map(|i| quantized(n, k, 4, 64, 50 + i as u64))
        .collect();
    let ups: Vec<Quantized> = (0..SETS)
        .map(|i| quantized(n, k, 4, 64, 60 + i as u64))
        .collect();
    for rows in [1, 8] {
        let x = normal(&[rows, k], bf16, 1.0, 70);
        let (gates, ups) = (gates.clone(), ups.clone());
        cases.push(Case {
            name: format!("gate_qmv_silu_mul {rows}x{k}->{n} 4-bit g64 bf16"),
            kernel: Kernel::GateQmvSiluMul,
            bytes: 2.0 * quant_bytes(n, k, 4, 64),
            op: Box::new(move |i| gate_qmv_silu_mul(&x, &gates[i], &ups[i]).expect("gate")),
        });
    }
    // Expert-indexed gate+up, Qwen1.5-MoE-A2.7B's experts (E=60, top-4,
    // 2048 -> 1408), one token: the bytes of the 4 chosen experts.
    let (e, k, n, top_k) = (60, 2048, 1408, 4);
    let gates: Vec<Quantized> = (0..2)
        .map(|i| stacked(&[e], n, k, 4, 64, 100 + i as u64))
        .collect();
    let ups: Vec<Quantized> = (0..2)
        .map(|i| stacked(&[e], n, k, 4, 64, 110 + i as u64))
        .collect();
    let x = normal(&[1, k], bf16, 1.0, 120);
    let idx: Vec<Array> = (0..SETS)
        .map(|i| {
            let ids: Vec<u32> = (0..top_k)
                .map(|j| ((i as i32 * 13 + j * 7) % e) as u32)
                .collect();
            Array::from_slice(&ids, &[1, top_k]).expect("indices")
        })
        .collect();
    cases.push(Case {
        name: format!("gather gate E={e} top-{top_k} 1x{k}->{n} 4-bit g64 bf16"),
        kernel: Kernel::GateQmvSiluMul,
        bytes: 2.0 * top_k as f64 * quant_bytes(n, k, 4, 64),
        op: Box::new(move |i| {
            gather_gate_qmv_silu_mul(&x, &idx[i], &gates[i % 2], &ups[i % 2]).expect("gather gate")
        }),
    });
    // Attention: decode (1 query row over a cache) and causal prefill
    // (the tiled kernels), Qwen3-0.6B's heads (16 q, 8 kv, d 128) and
    // SmolLM2-135M's (9 q, 3 kv, d 64); prefill in bf16 and f32 (MLX's f32
    // fallback multiplies in TF32 unless MLX_ENABLE_TF32=0; ours is f32).
    let f32 = Dtype::F32;
    let attention_shapes = [
        ((16, 8, 128), 1, 1024, bf16),
        ((16, 8, 128), 1, 4096, bf16),
        ((16, 8, 128), 512, 512, bf16),
        ((16, 8, 128), 512, 512, f32),
        ((16, 8, 128), 2048, 2048, bf16),
        ((16, 8, 128), 512, 2048, bf16),
        ((9, 3, 64), 512, 512, bf16),
        ((9, 3, 64), 512, 512, f32),
    ];
    for ((hq, hkv, d), l, s_len, dtype) in attention_shapes {
        let q = normal(&[1, hq, l, d], dtype, 1.0, 130);
        let kv: Vec<(Array, Array)> = (0..SETS)
            .map(|i| {
                (
                    normal(&[1, hkv, s_len, d], dtype, 1.0, 140 + i as u64),
                    normal(&[1, hkv, s_len, d], dtype, 1.0, 150 + i as u64),
                )
            })
            .collect();
        let mask = if l > 1 {
            AttentionMask::Causal
        } else {
            AttentionMask::None
        };
        let size = if dtype == f32 { 4.0 } else { 2.0 };
        cases.push(Case {
            name: format!("attention {hq}/{hkv}x{d} L={l} S={s_len} {dtype:?}"),
            kernel: Kernel::Attention,
            bytes: size * (2.0 * (hq * l * d) as f64 + 2.0 * (hkv * s_len * d) as f64),
            op: Box::new(move |i| {
                let scale = 1.0 / (d as f32).sqrt();
                attention(&q, &kv[i].0, &kv[i].1, scale, mask).expect("attention")
            }),
        });
    }
    // Decode projections of SmolLM2-135M and Qwen3-0.6B (4-bit g64; the
    // heads 8-bit), 1 and 8 rows.
    let shapes: [(&str, i32, i32, i32); 8] = [
        ("smollm2 q/o", 576, 576, 4),
        ("smollm2 up", 576, 1536, 4),
        ("smollm2 down", 1536, 576, 4),
        ("smollm2 head", 576, 49152, 8),
        ("qwen3-0.6b q", 1024, 2048, 4),
        ("qwen3-0.6b up", 1024, 3072, 4),
        ("qwen3-0.6b down", 3072, 1024, 4),
        ("qwen3-0.6b head", 1024, 151936, 8),
    ];
    for (label, k, n, bits) in shapes {
        let ws: Vec<Quantized> = (0..SETS)
            .map(|i| quantized(n, k, bits, 64, 80 + i as u64))
            .collect();
        for rows in [1, 2, 4, 8] {
            let x = normal(&[rows, k], bf16, 1.0, 90);
            let ws = ws.clone();
            cases.push(Case {
                name: format!("qmv {label} {rows}x{k}->{n} {bits}-bit"),
                kernel: Kernel::QuantizedMatmul,
                bytes: quant_bytes(n, k, bits, 64) + 2.0 * rows as f64 * (k + n) as f64,
                op: Box::new(move |i| quantized_matmul(&x, &ws[i]).expect("qmv")),
            });
        }
    }
    // Prefill projections (512 rows; the CUDA body's tiled kernels): the
    // same models' q/o, up, down and a narrow (kv-sized) projection, bf16
    // 4-bit g64; f32 x on two of them (the exact-f32 kernel).
    let prefill: [(&str, i32, i32, Dtype); 10] = [
        ("smollm2 q/o", 576, 576, bf16),
        ("smollm2 up", 576, 1536, bf16),
        ("smollm2 down", 1536, 576, bf16),
        ("smollm2 kv", 576, 192, bf16),
        ("qwen3-0.6b o", 1024, 1024, bf16),
        ("qwen3-0.6b up", 1024, 3072, bf16),
        ("qwen3-0.6b down", 3072, 1024, bf16),
        ("qwen3-0.6b q", 1024, 2048, bf16),
        ("smollm2 up", 576, 1536, Dtype::F32),
        ("qwen3-0.6b up", 1024, 3072, Dtype::F32),
    ];
    for (label, k, n, dtype) in prefill {
        let rows = 512;
        let ws: Vec<Quantized> = (0..SETS)
            .map(|i| {
                let q = quantized(n, k, 4, 64, 160 + i as u64);
                if dtype == Dtype::F32 {
                    Quantized {
                        scales: q.scales.astype(Dtype::F32).expect("astype"),
                        biases: q.biases.astype(Dtype::F32).expect("astype"),
                        ..q
                    }
                } else {
                    q
                }
            })
            .collect();
        mlx_backend::eval(
            &ws.iter()
                .flat_map(|q| [&q.scales, &q.biases])
                .collect::<Vec<_>>(),
        )
        .expect("eval");
        let x = normal(&[rows, k], dtype, 1.0, 170);
        let size = if dtype == Dtype::F32 { 4.0 } else { 2.0 };
        cases.push(Case {
            name: format!("qmm {label} {rows}x{k}->{n} 4-bit {dtype}"),
            kernel: Kernel::QuantizedMatmul,
            bytes: quant_bytes(n, k, 4, 64) + size * rows as f64 * (k + n) as f64,
            op: Box::new(move |i| quantized_matmul(&x, &ws[i]).expect("qmm")),
        });
    }
    cases
}

fn main() {
    let Some(gpu) = Device::gpu() else {
        println!("gpu_kernels: this MLX build has no GPU; nothing to measure");
        return;
    };
    gpu.set_default().expect("GPU as default device");
    let filter = std::env::var("GPU_BENCH_FILTER").unwrap_or_default();
    let copy = copy_bandwidth();
    println!("device-to-device copy: {copy:.0} GB/s (read + write)\n");
    println!("| case | ours µs | GB/s | % of copy | MLX µs | GB/s | ours vs MLX | fused |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut timed: Vec<Case> = cases()
        .into_iter()
        .filter(|c| c.name.contains(&filter))
        .collect();
    // The first two cases again at the end: a first case slower than its
    // rerun is the machine warming up, not the kernel.
    let again: Vec<Case> = cases()
        .into_iter()
        .filter(|c| c.name.contains(&filter))
        .take(2)
        .map(|c| Case {
            name: format!("{} (again, last)", c.name),
            ..c
        })
        .collect();
    timed.extend(again);
    for case in timed {
        registry::set_enabled(case.kernel, true);
        let before = registry::stats_on(case.kernel, Backend::current()).fused;
        let ours = time_per_op(&case.op);
        let fused = registry::stats_on(case.kernel, Backend::current()).fused > before;
        registry::set_enabled(case.kernel, false);
        let mlx = time_per_op(&case.op);
        registry::set_enabled(case.kernel, true);
        let gbs = |t: f64| case.bytes / t / 1e9;
        println!(
            "| {} | {:.1} | {:.0} | {:.0}% | {:.1} | {:.0} | {:.2}x | {} |",
            case.name,
            ours * 1e6,
            gbs(ours),
            100.0 * gbs(ours) / copy,
            mlx * 1e6,
            gbs(mlx),
            mlx / ours,
            if fused { "yes" } else { "no (fallback)" }
        );
    }
}
