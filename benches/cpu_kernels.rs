//! The CPU kernel bodies alone (no MLX), at the default model's shapes:
//! `cargo bench --bench cpu_kernels` (`--features testing`; criterion's
//! filter selects cases, e.g. `-- dot_rows`). The bodies run on the CPU
//! team (`MLX_BACKEND_THREADS`) except `dot_rows`, which is one thread.
//!
//! * `quantized_matmul`: the full CPU body by activation precision.
//! * `gate_qmv_silu_mul`: the fused gate/up body, one row.
//! * `dot_rows`: the chosen dot-product body by how x was prepared:
//!   exact, int16 per word, int16 per group (`row_lanes`) and AMX tiles;
//!   and the 8-lane (AVX2) bodies, which an AVX-512 CPU runs here too.
//! * `attend`: the decoder layer's attention over one KV head.
//! * `arithmetic_peak`: the core's ceiling to read the kernels' GMAC/s
//!   against: ten independent register-only chains of FMAs (512-bit with
//!   AVX-512, else 256-bit) and of `vpdpwssd` (AVX-512 VNNI), one thread.
//! * `weight_sweep`: the default model's batch-1 weights from memory (30
//!   blocks of q, k, v, o, gate, up, down, 4-bit g32, and the 8-bit head,
//!   ~98 MB, more than any L3), one int16 x row against each matrix in turn
//!   on the team, beside a plain two-thread read of as many bytes: the gap is
//!   what the kernels' access pattern costs.
//! * `gather_from_memory`: the expert-indexed gate (E=60, top-4, 2048 →
//!   1408, 4-bit g64) with its experts read from memory (a 64 MB buffer is
//!   read between calls) and from cache (back to back).
//! * `bf16_x`: bf16 x (the bf16 dot-product instructions where the CPU has
//!   them) against f32 x of the same values, one thread's share.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::bf16;
use mlx_backend::kernels::test_hooks::cpu::{self, Precision, PreparedRows, QuantWeights};

fn x_rows(m: usize, k: usize) -> Vec<f32> {
    (0..m * k)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect()
}

fn quantized_matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("quantized_matmul");
    g.sample_size(10).measurement_time(Duration::from_secs(2));
    for (m, k, n, bits) in [
        (1, 576, 576, 4),
        (1, 576, 1536, 4),
        (1, 1536, 576, 4),
        (1, 576, 49152, 8),
        (128, 576, 1536, 4),
    ] {
        let w = QuantWeights::random(1, n, k, bits, 32);
        let x = x_rows(m, k);
        let mut out = vec![0.0f32; m * n];
        g.throughput(Throughput::Bytes(w.bytes() as u64));
        for p in [Precision::Exact, Precision::Int16, Precision::Int8] {
            let id = BenchmarkId::new(format!("{p:?}"), format!("{m}x{k}->{n} {bits}-bit"));
            g.bench_function(id, |b| {
                b.iter(|| cpu::quantized_matmul(black_box(&x), &w, &mut out, m, p))
            });
        }
    }
    g.finish();
}

fn gate_qmv_silu_mul(c: &mut Criterion) {
    let mut g = c.benchmark_group("gate_qmv_silu_mul");
    g.sample_size(10).measurement_time(Duration::from_secs(2));
    for (n, k, group) in [(1536, 576, 32), (14336, 4096, 64)] {
        let gate = QuantWeights::random(1, n, k, 4, group);
        let up = QuantWeights::random(2, n, k, 4, group);
        let x = x_rows(1, k);
        let mut out = vec![0.0f32; n];
        g.throughput(Throughput::Bytes((gate.bytes() + up.bytes()) as u64));
        g.bench_function(format!("{k}->{n} g{group} 4-bit"), |b| {
            b.iter(|| cpu::gate_qmv_silu_mul(black_box(&x), &gate, &up, &mut out, 1))
        });
    }
    g.finish();
}

fn dot_rows(c: &mut Criterion) {
    if !PreparedRows::available() {
        return;
    }
    let mut g = c.benchmark_group("dot_rows");
    g.sample_size(10).measurement_time(Duration::from_secs(2));
    for (m, n, k, bits) in [
        (1, 1536, 576, 4),
        (1, 576, 1536, 4),
        (4, 1536, 576, 4),
        (8, 1536, 576, 4),
        (16, 1536, 576, 4),
        (64, 1536, 576, 4),
        (128, 1536, 576, 4),
        (1, 49152, 576, 8),
    ] {
        let w = QuantWeights::random(3, n, k, bits, 32);
        let x = x_rows(m, k);
        let mut out = vec![0.0f32; m * n];
        g.throughput(Throughput::Elements((m * n * k) as u64));
        for (name, int16, amx, row_lanes) in [
            ("exact", false, false, false),
            ("int16 per word", true, false, false),
            ("int16 per group", true, false, true),
            ("int16 amx", true, true, true),
        ] {
            let px = PreparedRows::new(&x, &w, int16, amx, row_lanes);
            let id = BenchmarkId::new(name, format!("m={m} n={n} k={k} {bits}-bit"));
            g.bench_function(id, |b| b.iter(|| px.dot_rows(&w, black_box(&mut out))));
        }
        // The 8-lane (AVX2) bodies, also on CPUs that prepare 16 lanes.
        for (name, int16) in [("exact 8 lanes", false), ("int16 per word 8 lanes", true)] {
            let Some(px) = PreparedRows::for_width(&x, &w, 8, int16) else {
                continue;
            };
            let id = BenchmarkId::new(name, format!("m={m} n={n} k={k} {bits}-bit"));
            g.bench_function(id, |b| b.iter(|| px.dot_rows(&w, black_box(&mut out))));
        }
    }
    g.finish();
}

fn attend(c: &mut Criterion) {
    let mut g = c.benchmark_group("attend");
    g.sample_size(10).measurement_time(Duration::from_secs(2));
    let (d, heads) = (64, 3);
    for s in [32usize, 82, 256, 1024] {
        let q = x_rows(heads, d);
        let keys = x_rows(s, d);
        let values: Vec<f32> = keys.iter().rev().copied().collect();
        let mut out = vec![0.0f32; heads * d];
        g.bench_function(format!("S={s} d={d} {heads} heads"), |b| {
            b.iter(|| cpu::attend_heads(black_box(&q), &keys, &values, d, &mut out))
        });
    }
    g.finish();
}

/// Ten independent chains `v = step(v)` kept in registers, `iters` steps
/// each.
macro_rules! chains {
    ($iters:expr, $init:expr, |$v:ident| $step:expr) => {{
        let mut a = [$init; 10];
        for _ in 0..$iters {
            for slot in a.iter_mut() {
                let $v = *slot;
                *slot = $step;
            }
        }
        black_box(a);
    }};
}

#[cfg(target_arch = "x86_64")]
mod peak {
    use super::black_box;
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// 512-bit FMA chains.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma512(iters: usize) {
        let (x, y) = (_mm512_set1_ps(1.000_000_1), _mm512_set1_ps(0.999_999_9));
        chains!(iters, x, |v| _mm512_fmadd_ps(v, x, y));
    }

    /// 256-bit FMA chains.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn fma256(iters: usize) {
        let (x, y) = (_mm256_set1_ps(1.000_000_1), _mm256_set1_ps(0.999_999_9));
        chains!(iters, x, |v| _mm256_fmadd_ps(v, x, y));
    }

    /// `vpdpwssd` chains, as asm: LLVM would fold the intrinsic's constant
    /// pair product and time `vpaddd` instead.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub unsafe fn dpwssd(iters: usize) {
        let (x, y) = (
            _mm512_set1_epi32(0x0003_0005),
            _mm512_set1_epi32(0x0007_0002),
        );
        chains!(iters, x, |v| {
            let mut acc = v;
            asm!("vpdpwssd {acc}, {a}, {b}", acc = inout(zmm_reg) acc, a = in(zmm_reg) x,
                 b = in(zmm_reg) y, options(pure, nomem, nostack));
            acc
        });
    }
}

fn arithmetic_peak(c: &mut Criterion) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut g = c.benchmark_group("arithmetic_peak");
        g.sample_size(10).measurement_time(Duration::from_secs(1));
        let iters = 1_000_000;
        // Throughput in multiply-adds: 16 f32 lanes per 512-bit FMA, 8 per
        // 256-bit one, 32 int16 pairs per vpdpwssd.
        let mut case = |name: &str, macs: u64, run: unsafe fn(usize)| {
            g.throughput(Throughput::Elements(10 * iters as u64 * macs));
            // SAFETY: each loop runs only where its features were detected.
            g.bench_function(name, |b| b.iter(|| unsafe { run(iters) }));
        };
        if is_x86_feature_detected!("avx512f") {
            case("fma 512-bit (f32 MACs)", 16, peak::fma512);
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            case("fma 256-bit (f32 MACs)", 8, peak::fma256);
        }
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni") {
            case("vpdpwssd (int16 MACs)", 32, peak::dpwssd);
        }
        g.finish();
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = c;
}

fn weight_sweep(c: &mut Criterion) {
    let (h, inter) = (576, 1536);
    let block = [
        (576, h),
        (192, h),
        (192, h),
        (h, 576),
        (inter, h),
        (inter, h),
        (h, inter),
    ];
    let mut mats: Vec<QuantWeights> = (0..30u64)
        .flat_map(|b| {
            block
                .iter()
                .enumerate()
                .map(move |(i, &(n, k))| QuantWeights::random(b * 7 + i as u64 + 1, n, k, 4, 32))
        })
        .collect();
    mats.push(QuantWeights::random(1000, 49152, h, 8, 32));
    let bytes: usize = mats.iter().map(QuantWeights::bytes).sum();
    let xs: Vec<Vec<f32>> = mats.iter().map(|w| x_rows(1, w.k())).collect();
    let mut outs: Vec<Vec<f32>> = mats.iter().map(|w| vec![0.0; w.n()]).collect();
    let buf: Vec<f32> = (0..bytes / 4).map(|i| i as f32).collect();
    // Sixteen independent sums: vectorised, bound by the reads.
    let sum = |c: &[f32]| {
        let mut acc = [0.0f32; 16];
        for v in c.chunks_exact(16) {
            (0..16).for_each(|i| acc[i] += v[i]);
        }
        acc.iter().sum::<f32>()
    };
    let mut g = c.benchmark_group("weight_sweep");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function("int16 x, 1 row, 30 blocks + head", |b| {
        b.iter(|| {
            for ((w, x), out) in mats.iter().zip(&xs).zip(outs.iter_mut()) {
                cpu::quantized_matmul(x, w, out, 1, Precision::Int16);
            }
        })
    });
    g.bench_function("plain read, 2 threads", |b| {
        b.iter(|| {
            let half = buf.len() / 2;
            std::thread::scope(|s| {
                let a = s.spawn(|| sum(&buf[..half]));
                black_box(sum(&buf[half..]) + a.join().unwrap())
            })
        })
    });
    g.finish();
}

fn gather_from_memory(c: &mut Criterion) {
    let (e, n, k) = (60, 1408, 2048);
    let gate = QuantWeights::random(1, e * n, k, 4, 64);
    let up = QuantWeights::random(2, e * n, k, 4, 64);
    let x = x_rows(1, k);
    let experts = [3u32, 17, 29, 51];
    let mut out = vec![0.0f32; experts.len() * n];
    let flush: Vec<f32> = (0..16 << 20).map(|i| i as f32).collect();
    let mut g = c.benchmark_group("gather_from_memory");
    g.sample_size(10).measurement_time(Duration::from_secs(2));
    // The four experts' gate and up matrices.
    g.throughput(Throughput::Bytes(
        ((gate.bytes() + up.bytes()) / e * experts.len()) as u64,
    ));
    let one_row = [0u32; 4];
    let mut run = || cpu::gather_gate_qmv_silu_mul(&x, &one_row, &experts, &gate, &up, e, &mut out);
    g.bench_function("E=60 top-4 2048->1408 from memory", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                black_box(flush.chunks_exact(16).fold(0.0f32, |a, c| a + c[3]));
                let t = std::time::Instant::now();
                run();
                total += t.elapsed();
            }
            total
        })
    });
    g.bench_function("E=60 top-4 2048->1408 from cache", |b| b.iter(&mut run));
    g.finish();
}

fn bf16_x(c: &mut Criterion) {
    let mut g = c.benchmark_group("bf16_x");
    g.sample_size(10).measurement_time(Duration::from_secs(2));
    for (m, n, k, group) in [(1, 1408, 2048, 64), (1, 1536, 576, 32), (4, 1408, 2048, 64)] {
        let w = QuantWeights::random(5, n, k, 4, group);
        let xb: Vec<bf16> = x_rows(m, k).into_iter().map(bf16::from_f32).collect();
        let xf: Vec<f32> = xb.iter().map(|v| v.to_f32()).collect();
        let mut ob = vec![bf16::ZERO; m * n];
        let mut of = vec![0.0f32; m * n];
        g.throughput(Throughput::Elements((m * n * k) as u64));
        let shape = format!("{m}x{k}->{n} 4-bit g{group}");
        g.bench_function(BenchmarkId::new("bf16", &shape), |b| {
            b.iter(|| cpu::quantized_matmul_bf16(black_box(&xb), &w, &mut ob, m))
        });
        g.bench_function(BenchmarkId::new("f32", &shape), |b| {
            b.iter(|| cpu::quantized_matmul(black_box(&xf), &w, &mut of, m, Precision::Exact))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    quantized_matmul,
    gate_qmv_silu_mul,
    dot_rows,
    attend,
    arithmetic_peak,
    weight_sweep,
    gather_from_memory,
    bf16_x
);
criterion_main!(benches);
