//! The CPU kernel bodies alone (no MLX), at the default model's shapes:
//! `cargo bench --bench cpu_kernels` (`--features testing`; criterion's
//! filter selects cases, e.g. `-- dot_rows`). The bodies run on the CPU
//! team (`MLX_BACKEND_THREADS`) except `dot_rows`, which is one thread.
//!
//! * `quantized_matmul`: the full CPU body by activation precision.
//! * `gate_qmv_silu_mul`: the fused gate/up body, one row.
//! * `dot_rows`: the chosen dot-product body by how x was prepared:
//!   exact, int16 per word, int16 per group (`row_lanes`) and AMX tiles.
//! * `attend`: the decoder layer's attention over one KV head.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
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

criterion_group!(
    benches,
    quantized_matmul,
    gate_qmv_silu_mul,
    dot_rows,
    attend
);
criterion_main!(benches);
