//! Custom kernels against MLX's built-in op or the fallback graph, on the
//! CPU, at decode and prefill shapes; plus the machine's read bandwidth.
//!
//! `cargo bench --bench kernels` prints criterion's timings and a summary
//! table (median µs per call, achieved GB/s vs. read bandwidth, speedup).
//! `KERNELS_BENCH_FILTER=quantized_matmul` keeps the cases whose name
//! contains the string. A second table times the quantized kernels with
//! int8 against exact activations (`int8_activations`).

use criterion::{criterion_group, criterion_main, Criterion};
use mlx_backend::kernels::{
    gate_qmv_silu_mul, gather_gate_qmv_silu_mul, moe_combine, quantized_matmul, registry, rms_norm,
    Kernel,
};
use mlx_backend::ops::{quantize, random, Quantized};
use mlx_backend::{Array, Dtype};
use std::time::{Duration, Instant};

mod int8_activations;

const DTYPE: Dtype = Dtype::BF16;

fn normal(shape: &[i32], loc: f32, scale: f32, seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    let a = random::normal(shape, DTYPE, loc, scale, Some(&key)).unwrap();
    a.eval().unwrap();
    a
}

fn quantized(lead: &[i32], n: i32, k: i32, group: i32, seed: u64) -> Quantized {
    let shape: Vec<i32> = lead.iter().copied().chain([n, k]).collect();
    let q = quantize(&normal(&shape, 0.0, 0.05, seed), group, 4).unwrap();
    mlx_backend::eval(&[&q.weight, &q.scales, &q.biases]).unwrap();
    q
}

/// One benchmark case: the kernel and the MLX path, each building and
/// evaluating the op once per call.
struct Case {
    name: String,
    /// Bytes the op must move at least once (inputs read + outputs written).
    bytes: f64,
    kernel: Box<dyn Fn()>,
    mlx: Box<dyn Fn()>,
}

/// Runs `op` with `kernel` switched on or off (the fallback is MLX's path).
fn with_kernel(kernel: Kernel, on: bool, op: impl Fn() -> Array + 'static) -> Box<dyn Fn()> {
    Box::new(move || {
        registry::set_enabled(kernel, on);
        op().eval().unwrap();
    })
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let sz = DTYPE.size() as f64;
    for (rows, hidden) in [(1, 576), (1, 4096), (4096, 4096)] {
        let x = normal(&[rows, hidden], 0.0, 1.0, 1);
        let w = normal(&[hidden], 1.0, 0.1, 2);
        let (x2, w2) = (x.clone(), w.clone());
        cases.push(Case {
            name: format!("rms_norm {rows}x{hidden}"),
            bytes: (2 * rows * hidden + hidden) as f64 * sz,
            kernel: with_kernel(Kernel::RmsNorm, true, move || {
                rms_norm(&x, &w, 1e-5).unwrap()
            }),
            mlx: Box::new(move || x2.rms_norm_mlx(Some(&w2), 1e-5).unwrap().eval().unwrap()),
        });
    }
    for shape in [[1, 1, 4, 2048], [1, 268, 4, 2048]] {
        let y = normal(&shape, 0.0, 1.0, 3);
        let s = normal(&shape[..3], 0.0, 1.0, 4);
        let (y2, s2) = (y.clone(), s.clone());
        let elems = (shape.iter().product::<i32>()) as f64;
        let (top_k, hidden) = (shape[2] as f64, shape[3] as f64);
        cases.push(Case {
            name: format!("moe_combine {shape:?}"),
            // y read, scores read, out written.
            bytes: (elems + elems / hidden + elems / top_k) * sz,
            kernel: with_kernel(Kernel::MoeCombine, true, move || {
                moe_combine(&y, &s).unwrap()
            }),
            mlx: with_kernel(Kernel::MoeCombine, false, move || {
                moe_combine(&y2, &s2).unwrap()
            }),
        });
    }
    for (k, n, group) in [(576, 1536, 32), (4096, 14336, 64)] {
        let x = normal(&[1, k], 0.0, 1.0, 5);
        let gate = quantized(&[], n, k, group, 6);
        let up = quantized(&[], n, k, group, 7);
        let (x2, gate2, up2) = (x.clone(), gate.clone(), up.clone());
        let weights = 2.0 * (n as f64 * k as f64 * 0.5 + 2.0 * (n * k / group) as f64 * sz);
        cases.push(Case {
            name: format!("gate_qmv_silu_mul 1x{k}->{n} g{group} q4"),
            bytes: weights + (k + n) as f64 * sz,
            kernel: with_kernel(Kernel::GateQmvSiluMul, true, move || {
                gate_qmv_silu_mul(&x, &gate, &up).unwrap()
            }),
            mlx: with_kernel(Kernel::GateQmvSiluMul, false, move || {
                gate_qmv_silu_mul(&x2, &gate2, &up2).unwrap()
            }),
        });
    }
    {
        let (e, top_k, k, n, group) = (60, 4, 2048, 1408, 64);
        let x = normal(&[1, k], 0.0, 1.0, 8);
        let idx = Array::from_slice(&[3u32, 17, 42, 59], &[1, top_k]).unwrap();
        let gate = quantized(&[e], n, k, group, 9);
        let up = quantized(&[e], n, k, group, 10);
        let (x2, idx2, gate2, up2) = (x.clone(), idx.clone(), gate.clone(), up.clone());
        let per_expert = 2.0 * (n as f64 * k as f64 * 0.5 + 2.0 * (n * k / group) as f64 * sz);
        cases.push(Case {
            name: format!("gather_gate_qmv E{e} top{top_k} {k}->{n} g{group} q4"),
            bytes: top_k as f64 * per_expert,
            kernel: with_kernel(Kernel::GateQmvSiluMul, true, move || {
                gather_gate_qmv_silu_mul(&x, &idx, &gate, &up).unwrap()
            }),
            mlx: with_kernel(Kernel::GateQmvSiluMul, false, move || {
                gather_gate_qmv_silu_mul(&x2, &idx2, &gate2, &up2).unwrap()
            }),
        });
    }
    quantized_matmul_cases(&mut cases);
    let filter = std::env::var("KERNELS_BENCH_FILTER").unwrap_or_default();
    cases.retain(|c| c.name.contains(&filter));
    cases
}

/// The default model's projections (SmolLM2-135M: hidden 576, MLP 1536,
/// tied 8-bit 49152-row head), in f32: the dtype the model runs fastest in.
fn quantized_matmul_cases(cases: &mut Vec<Case>) {
    for (m, k, n, bits) in [
        (1, 576, 576, 4),
        (1, 576, 1536, 4),
        (1, 1536, 576, 4),
        (1, 576, 49152, 8),
        (128, 576, 1536, 4),
    ] {
        let key = random::key(11).unwrap();
        let x = random::normal(&[m, k], Dtype::F32, 0.0, 1.0, Some(&key)).unwrap();
        let w = random::normal(&[n, k], Dtype::F32, 0.0, 0.05, Some(&key)).unwrap();
        let q = quantize(&w, 32, bits).unwrap();
        mlx_backend::eval(&[&x, &q.weight, &q.scales, &q.biases]).unwrap();
        let (x2, q2) = (x.clone(), q.clone());
        let weights = (n * k) as f64 * bits as f64 / 8.0 + 2.0 * (n * k / 32) as f64 * 4.0;
        cases.push(Case {
            name: format!("quantized_matmul {m}x{k}->{n} g32 q{bits} f32"),
            bytes: weights + ((m * k + m * n) * 4) as f64,
            kernel: with_kernel(Kernel::QuantizedMatmul, true, move || {
                quantized_matmul(&x, &q).unwrap()
            }),
            mlx: with_kernel(Kernel::QuantizedMatmul, false, move || {
                quantized_matmul(&x2, &q2).unwrap()
            }),
        });
    }
}

/// Median seconds per call over ~`budget` of calls (at least 5).
fn median_secs(f: &dyn Fn(), budget: Duration) -> f64 {
    f();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed() < budget && times.len() < 2000) {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    times[times.len() / 2]
}

/// Sum with 16 independent lanes, so the loop vectorises and is bound by
/// memory, not by the latency of one chain of adds.
fn sum_lanes(c: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    for v in c.chunks_exact(16) {
        for i in 0..16 {
            acc[i] += v[i];
        }
    }
    acc.iter().sum()
}

/// Read bandwidth: summing a 256 MB f32 buffer with 2 threads, best of 5.
fn read_bandwidth_gbs() -> f64 {
    let buf: Vec<f32> = (0..64 << 20).map(|i| (i % 7) as f32).collect();
    let half = buf.len() / 2;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let total: f32 = std::thread::scope(|s| {
            let parts: Vec<_> = buf
                .chunks(half)
                .map(|c| s.spawn(move || sum_lanes(c)))
                .collect();
            parts.into_iter().map(|p| p.join().unwrap()).sum()
        });
        std::hint::black_box(total);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (buf.len() * 4) as f64 / best / 1e9
}

fn bench(c: &mut Criterion) {
    let cases = cases();
    let mut group = c.benchmark_group("kernels");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800));
    for case in &cases {
        group.bench_function(format!("{} / kernel", case.name), |b| {
            b.iter(|| (case.kernel)())
        });
        group.bench_function(format!("{} / mlx", case.name), |b| b.iter(|| (case.mlx)()));
    }
    group.finish();

    let bw = read_bandwidth_gbs();
    println!("\nread bandwidth (256 MB f32 sum, 2 threads): {bw:.1} GB/s; dtype {DTYPE}");
    println!(
        "| case | kernel µs | MLX µs | speedup | kernel GB/s | % of read BW |\n|---|---:|---:|---:|---:|---:|"
    );
    for case in &cases {
        let budget = Duration::from_millis(700);
        let tk = median_secs(&*case.kernel, budget);
        let tm = median_secs(&*case.mlx, budget);
        let gbs = case.bytes / tk / 1e9;
        println!(
            "| {} | {:.1} | {:.1} | {:.2}x | {:.1} | {:.0}% |",
            case.name,
            tk * 1e6,
            tm * 1e6,
            tm / tk,
            gbs,
            100.0 * gbs / bw
        );
    }
    for k in Kernel::ALL {
        registry::set_enabled(k, true);
    }
    int8_activations::table(
        &std::env::var("KERNELS_BENCH_FILTER").unwrap_or_default(),
        median_secs,
    );
    decode_overhead();
}

/// Median µs of `n` timed calls of `f`, each timed alone.
fn median_us(n: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    times[n / 2]
}

/// Where a decode-sized call's time goes: building the graph (Rust → C++ →
/// Primitive) without evaluating it, evaluating graphs built beforehand,
/// and, as MLX's floor, evaluating a one-node graph (`abs`).
fn decode_overhead() {
    const N: usize = 2000;
    let x = normal(&[1, 576], 0.0, 1.0, 11);
    let w = normal(&[576], 1.0, 0.1, 12);
    let build_kernel = || rms_norm(&x, &w, 1e-5).unwrap();
    let build_mlx = || x.rms_norm_mlx(Some(&w), 1e-5).unwrap();
    let build_abs = || x.abs().unwrap();
    let eval_prebuilt = |make: &dyn Fn() -> Array| {
        let graphs: Vec<Array> = (0..N).map(|_| make()).collect();
        let mut it = graphs.iter();
        median_us(N, || it.next().unwrap().eval().unwrap())
    };
    println!("\nrms_norm 1x576, where the time goes (median µs per call, {N} calls):");
    println!("| path | build only | eval only (pre-built) | build + eval |\n|---|---:|---:|---:|");
    let rows: [(&str, &dyn Fn() -> Array); 3] = [
        ("kernel", &build_kernel),
        ("MLX fast::rms_norm", &build_mlx),
        ("one-node MLX op (abs)", &build_abs),
    ];
    for (name, make) in rows {
        make().eval().unwrap();
        let build = median_us(N, || drop(make()));
        let eval = eval_prebuilt(make);
        let both = median_us(N, || make().eval().unwrap());
        println!("| {name} | {build:.2} | {eval:.2} | {both:.2} |");
    }

    // Inside one larger graph (as in a decode step) the per-eval cost is
    // shared: a chain of CHAIN norms, evaluated once, per norm.
    const CHAIN: usize = 64;
    let chain = |op: &dyn Fn(&Array) -> Array| {
        median_us(51, || {
            let mut y = x.clone();
            for _ in 0..CHAIN {
                y = op(&y);
            }
            y.eval().unwrap();
        }) / CHAIN as f64
    };
    let kernel = chain(&|y| rms_norm(y, &w, 1e-5).unwrap());
    let mlx = chain(&|y| y.rms_norm_mlx(Some(&w), 1e-5).unwrap());
    println!(
        "\nrms_norm 1x576 inside a {CHAIN}-norm chain evaluated once: kernel {kernel:.2} µs, \
         MLX {mlx:.2} µs per norm ({:.1}x)",
        mlx / kernel
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
