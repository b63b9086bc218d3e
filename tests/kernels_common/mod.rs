//! Helpers shared by the kernels_* integration tests.
#![allow(dead_code)]

use mlx_backend::ops::{quantize, random, Quantized};
use mlx_backend::{Array, Dtype};

/// Fresh normal(loc, scale) data in `dtype` from an explicit seed.
pub fn normal(shape: &[i32], dtype: Dtype, loc: f32, scale: f32, seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal(shape, dtype, loc, scale, Some(&key)).unwrap()
}

/// Uniform ints in `[0, hi)` as uint32.
pub fn indices(shape: &[i32], hi: u32, seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::uniform(0.0, hi as f32, shape, Dtype::F32, Some(&key))
        .unwrap()
        .floor()
        .unwrap()
        .astype(Dtype::U32)
        .unwrap()
}

/// Largest `|got - want| / (|want| + atol)` over all elements.
pub fn max_rel_err(got: &Array, want: &Array, atol: f32) -> f32 {
    let g = got.to_f32_vec().unwrap();
    let w = want.to_f32_vec().unwrap();
    assert_eq!(g.len(), w.len());
    g.iter()
        .zip(&w)
        .map(|(g, w)| {
            assert!(g.is_finite(), "non-finite output {g}");
            (g - w).abs() / (w.abs() + atol)
        })
        .fold(0.0, f32::max)
}

/// Relative error of the whole tensor: ‖got − want‖ / ‖want‖.
pub fn norm_rel_err(got: &Array, want: &Array) -> f64 {
    let g = got.to_f32_vec().unwrap();
    let w = want.to_f32_vec().unwrap();
    assert_eq!(g.len(), w.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (g, w) in g.iter().zip(&w) {
        assert!(g.is_finite(), "non-finite output {g}");
        num += ((g - w) as f64).powi(2);
        den += (*w as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

pub fn bits(a: &Array) -> Vec<u32> {
    a.to_f32_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Random weights `[..lead, n, k]` (normal, scale 0.05) in `dtype`, quantized.
pub fn quantized_weights(
    lead: &[i32],
    n: i32,
    k: i32,
    dtype: Dtype,
    bits: i32,
    group: i32,
    seed: u64,
) -> Quantized {
    let shape: Vec<i32> = lead.iter().copied().chain([n, k]).collect();
    quantize(&normal(&shape, dtype, 0.0, 0.05, seed), group, bits).unwrap()
}

/// The same quantized weights with f32 scales and biases.
pub fn upcast(q: &Quantized) -> Quantized {
    Quantized {
        scales: q.scales.astype(Dtype::F32).unwrap(),
        biases: q.biases.astype(Dtype::F32).unwrap(),
        ..q.clone()
    }
}
