//! Custom kernels against MLX's built-in op or the fallback graph, on the
//! CPU, at decode and prefill shapes; plus the machine's read bandwidth.
//!
//! `cargo bench --bench kernels` prints criterion's timings and a summary
//! table (median µs per call, achieved GB/s vs. read bandwidth, speedup).
//! `KERNELS_BENCH_FILTER=quantized_matmul` keeps the cases whose name
//! contains the string. A second table times the quantized kernels with
//! exact against int16 and int8 activations (`activation_precision`).
//!
//! Two ratios for the decode shapes: an *isolated* call builds one op and
//! evaluates it alone, paying MLX's fixed cost per `eval` (handing the
//! graph to the CPU stream's thread and waiting for it); *in graph*, 64
//! calls are built and evaluated together, as each op sits inside a forward
//! graph, and the time is divided by 64.

use criterion::{criterion_group, criterion_main, Criterion};
use mlx_backend::kernels::{
    gate_qmv_silu_mul, gather_gate_qmv_silu_mul, moe_combine, quantized_matmul, registry, rms_norm,
    Kernel,
};
use mlx_backend::memory;
use mlx_backend::ops::{quantize, random, Quantized};
use mlx_backend::{Array, Dtype};
use std::time::{Duration, Instant};

mod activation_precision;

const DTYPE: Dtype = Dtype::BF16;

/// Ops per graph for the in-graph measurement.
const GRAPH_OPS: usize = 64;

/// MLX's allocator cache limit for the "cache limit raised" rows: large
/// enough to keep a 4096x4096 output for reuse (MLX's CPU default, 32 MiB,
/// is just below a 32 MiB bf16 output plus its header).
const RAISED_CACHE_LIMIT: usize = 1 << 30;

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

type Build = Box<dyn Fn() -> Array>;

/// One benchmark case: builders of the kernel's op and of the MLX path's.
struct Case {
    name: String,
    /// Bytes the op must move at least once (inputs read + outputs written).
    bytes: f64,
    kernel: Build,
    mlx: Build,
    /// A decode shape: also measured in graph.
    decode: bool,
}

/// Builds `op` with `kernel` switched on or off (the fallback is MLX's path).
fn with_kernel(kernel: Kernel, on: bool, op: impl Fn() -> Array + 'static) -> Build {
    Box::new(move || {
        registry::set_enabled(kernel, on);
        op()
    })
}

/// Builds `op` with MLX's allocator cache limit set to `limit` first.
fn with_cache_limit(limit: usize, op: Build) -> Build {
    Box::new(move || {
        memory::set_cache_limit(limit);
        op()
    })
}

/// One call: build the op and evaluate it alone.
fn isolated(build: &Build) -> impl Fn() + '_ {
    move || build().eval().unwrap()
}

/// `GRAPH_OPS` calls built into one graph and evaluated once.
fn in_graph(build: &Build) -> impl Fn() + '_ {
    move || {
        let outs: Vec<Array> = (0..GRAPH_OPS).map(|_| build()).collect();
        mlx_backend::eval(&outs.iter().collect::<Vec<_>>()).unwrap();
    }
}

fn cases(default_cache_limit: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    let sz = DTYPE.size() as f64;
    for (rows, hidden) in [(1, 576), (1, 4096), (4096, 4096)] {
        let x = normal(&[rows, hidden], 0.0, 1.0, 1);
        let w = normal(&[hidden], 1.0, 0.1, 2);
        let kernel = move |x: Array, w: Array| -> Build {
            with_kernel(Kernel::RmsNorm, true, move || {
                rms_norm(&x, &w, 1e-5).unwrap()
            })
        };
        let mlx = |x: Array, w: Array| -> Build {
            Box::new(move || x.rms_norm_mlx(Some(&w), 1e-5).unwrap())
        };
        let name = format!("rms_norm {rows}x{hidden}");
        let bytes = (2 * rows * hidden + hidden) as f64 * sz;
        if rows == 1 {
            cases.push(Case {
                name,
                bytes,
                kernel: kernel(x.clone(), w.clone()),
                mlx: mlx(x, w),
                decode: true,
            });
            continue;
        }
        // A large output is a fresh allocation per call unless MLX's cache
        // may keep it: measured both ways.
        for (label, limit) in [
            ("default cache limit", default_cache_limit),
            ("cache limit 1 GiB", RAISED_CACHE_LIMIT),
        ] {
            cases.push(Case {
                name: format!("{name} ({label})"),
                bytes,
                kernel: with_cache_limit(limit, kernel(x.clone(), w.clone())),
                mlx: with_cache_limit(limit, mlx(x.clone(), w.clone())),
                decode: false,
            });
        }
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
            decode: shape[1] == 1,
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
            decode: false,
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
            decode: false,
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
            decode: false,
        });
    }
}

/// Median seconds per call of `a` and of `b` over ~`budget` of calls (at
/// least 5 each), alternating them so that a change in the machine's load
/// (it is shared) falls on both alike.
fn median_pair(a: &dyn Fn(), b: &dyn Fn(), budget: Duration) -> (f64, f64) {
    a();
    b();
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    let start = Instant::now();
    while ta.len() < 5 || (start.elapsed() < budget && ta.len() < 2000) {
        for (f, times) in [(a, &mut ta), (b, &mut tb)] {
            let t = Instant::now();
            f();
            times.push(t.elapsed().as_secs_f64());
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(|x, y| x.partial_cmp(y).unwrap());
        v[v.len() / 2]
    };
    (median(ta), median(tb))
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
    let default_cache_limit = memory::set_cache_limit(0);
    memory::set_cache_limit(default_cache_limit);
    let cases = cases(default_cache_limit);
    let mut group = c.benchmark_group("kernels");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800));
    for case in &cases {
        let (kernel, mlx) = (isolated(&case.kernel), isolated(&case.mlx));
        group.bench_function(format!("{} / kernel", case.name), |b| b.iter(&kernel));
        group.bench_function(format!("{} / mlx", case.name), |b| b.iter(&mlx));
    }
    group.finish();

    let bw = read_bandwidth_gbs();
    println!("\nread bandwidth (256 MB f32 sum, 2 threads): {bw:.1} GB/s; dtype {DTYPE}");
    println!(
        "isolated: one op built and evaluated per call; in graph: {GRAPH_OPS} ops built, \
         evaluated once, µs per op"
    );
    println!(
        "| case | kernel µs | MLX µs | speedup (isolated) | kernel µs in graph | MLX µs in graph \
         | speedup (in graph) | kernel GB/s | % of read BW |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for case in &cases {
        let budget = Duration::from_millis(1400);
        let (tk, tm) = median_pair(&isolated(&case.kernel), &isolated(&case.mlx), budget);
        let graph = if case.decode {
            let (gk, gm) = median_pair(&in_graph(&case.kernel), &in_graph(&case.mlx), budget);
            let (gk, gm) = (gk / GRAPH_OPS as f64, gm / GRAPH_OPS as f64);
            format!("{:.2} | {:.2} | {:.2}x", gk * 1e6, gm * 1e6, gm / gk)
        } else {
            "– | – | –".to_string()
        };
        let gbs = case.bytes / tk / 1e9;
        println!(
            "| {} | {:.1} | {:.1} | {:.2}x | {graph} | {:.1} | {:.0}% |",
            case.name,
            tk * 1e6,
            tm * 1e6,
            tm / tk,
            gbs,
            100.0 * gbs / bw
        );
    }
    memory::set_cache_limit(default_cache_limit);
    for k in Kernel::ALL {
        registry::set_enabled(k, true);
    }
    activation_precision::table(
        &std::env::var("KERNELS_BENCH_FILTER").unwrap_or_default(),
        median_secs,
    );
    decode_overhead();
}

/// Median seconds per call of `f`, timed alone, repeated for about `budget`.
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
}

criterion_group!(benches, bench);
criterion_main!(benches);
