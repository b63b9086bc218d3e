//! Greedy picks on the host (`sampler::greedy_rows`) against MLX's CPU
//! argmax of the same logits (evaluated and read back), at the default
//! model's vocabulary: `cargo bench --bench sampler`.

use criterion::{criterion_group, criterion_main, Criterion};
use mlx_backend::runner::sampler::greedy_rows;
use mlx_backend::Array;
use std::hint::black_box;

const VOCAB: usize = 49152;

/// Logits in (-8, 8) from a xorshift stream (fresh values, no ties planted).
fn logits(rows: usize) -> Vec<f32> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..rows * VOCAB)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 8.0
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    for rows in [1usize, 8] {
        let host = logits(rows);
        let array = Array::from_slice(&host, &[rows as i32, VOCAB as i32]).unwrap();
        array.eval().unwrap();
        let mlx = || -> Vec<u32> {
            let ids = array.argmax(-1, false).unwrap();
            ids.to_vec::<u32>().unwrap()
        };
        // The same picks, or the comparison means nothing.
        assert_eq!(greedy_rows(&host, VOCAB), mlx());
        let mut group = c.benchmark_group(format!("greedy {rows}x{VOCAB}"));
        group.bench_function("greedy_rows", |b| {
            b.iter(|| greedy_rows(black_box(&host), VOCAB))
        });
        group.bench_function("mlx argmax", |b| b.iter(mlx));
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
