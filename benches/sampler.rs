//! Greedy picks on the host (`sampler::greedy_rows`) against MLX's CPU
//! argmax of the same logits (evaluated and read back), at the default
//! model's vocabulary: `cargo bench --bench sampler`.

use criterion::{criterion_group, criterion_main, Criterion};
use mlx_backend::ops::random;
use mlx_backend::runner::sampler::greedy_rows;
use mlx_backend::{Array, Dtype};
use std::hint::black_box;

const VOCAB: usize = 49152;

/// Fresh normal logits (scale 4) from MLX's generator, read back.
fn logits(rows: usize, seed: u64) -> Vec<f32> {
    let key = random::key(seed).unwrap();
    let shape = [rows as i32, VOCAB as i32];
    let a = random::normal(&shape, Dtype::F32, 0.0, 4.0, Some(&key)).unwrap();
    a.to_vec::<f32>().unwrap()
}

fn bench(c: &mut Criterion) {
    for rows in [1usize, 8] {
        let host = logits(rows, rows as u64);
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
