//! MLX's fused ops (rms_norm, layer_norm, rope, attention) against plain
//! Rust references, and the seeded random generators' statistics.

use crate::common::*;
use mlx_backend::ops::{random, scaled_dot_product_attention, AttentionMask, RopeOffset};
use mlx_backend::{Array, Dtype};

fn rms_norm_ref(x: &[f32], d: usize, w: Option<&[f32]>, eps: f64) -> Vec<f64> {
    x.chunks(d)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter()
                .enumerate()
                .map(|(i, &v)| v as f64 * inv * w.map_or(1.0, |w| w[i] as f64))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn layer_norm_ref(x: &[f32], d: usize, w: Option<&[f32]>, b: Option<&[f32]>, eps: f64) -> Vec<f64> {
    x.chunks(d)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (var + eps).sqrt();
            row.iter()
                .enumerate()
                .map(|(i, &v)| {
                    (v as f64 - mean) * inv * w.map_or(1.0, |w| w[i] as f64)
                        + b.map_or(0.0, |b| b[i] as f64)
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn rms_norm_against_reference() {
    let mut rng = Rng::new(51);
    let (x, xa) = rng.array_in(&[2, 3, 48], -3.0, 3.0);
    let (w, wa) = rng.array(&[48]);
    let out = xa.rms_norm_mlx(Some(&wa), 1e-5).unwrap();
    assert_close(
        &f32s(&out),
        &rms_norm_ref(&x, 48, Some(&w), 1e-5),
        1e-5,
        1e-5,
        "rms_norm",
    );
    let out = xa.rms_norm_mlx(None, 1e-6).unwrap();
    assert_close(
        &f32s(&out),
        &rms_norm_ref(&x, 48, None, 1e-6),
        1e-5,
        1e-5,
        "rms_norm no weight",
    );
}

#[test]
fn layer_norm_against_reference() {
    let mut rng = Rng::new(52);
    let (x, xa) = rng.array_in(&[4, 40], -2.0, 5.0);
    let (w, wa) = rng.array(&[40]);
    let (b, ba) = rng.array(&[40]);
    let out = xa.layer_norm(Some(&wa), Some(&ba), 1e-5).unwrap();
    let expected = layer_norm_ref(&x, 40, Some(&w), Some(&b), 1e-5);
    assert_close(&f32s(&out), &expected, 1e-5, 1e-5, "layer_norm");
    let out = xa.layer_norm(None, None, 1e-5).unwrap();
    let expected = layer_norm_ref(&x, 40, None, None, 1e-5);
    assert_close(&f32s(&out), &expected, 1e-5, 1e-5, "layer_norm plain");
}

/// RoPE over `[.., L, D]`: the first `dims` features rotate by
/// `(offset + l) * scale * base^(-2i/dims)`; `traditional` pairs (2i, 2i+1),
/// otherwise (i, i + dims/2).
fn rope_ref(
    x: &[f32],
    (l, d): (usize, usize),
    dims: usize,
    traditional: bool,
    (base, scale): (f64, f64),
    offset: usize,
) -> Vec<f64> {
    let mut out = to_f64(x);
    let half = dims / 2;
    for (row_idx, row) in out.chunks_mut(d).enumerate() {
        let pos = (offset + row_idx % l) as f64 * scale;
        for i in 0..half {
            let theta = pos * base.powf(-2.0 * i as f64 / dims as f64);
            let (c, s) = (theta.cos(), theta.sin());
            let (a, b) = if traditional {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (x1, x2) = (row[a], row[b]);
            row[a] = x1 * c - x2 * s;
            row[b] = x1 * s + x2 * c;
        }
    }
    out
}

#[test]
fn rope_traditional_and_not_static_and_dynamic() {
    let mut rng = Rng::new(53);
    let (b, h, l, d) = (2, 3, 5, 16);
    let (x, xa) = rng.array(&[b, h, l, d]);
    for traditional in [false, true] {
        for dims in [16, 8] {
            for offset in [0, 7] {
                let lp = (l as usize, d as usize);
                let expected = rope_ref(&x, lp, dims, traditional, (10000.0, 1.0), offset);
                let what = format!("rope traditional={traditional} dims={dims} offset={offset}");
                let stat = xa
                    .rope(
                        dims as i32,
                        traditional,
                        10000.0,
                        1.0,
                        RopeOffset::Static(offset as i32),
                        None,
                    )
                    .unwrap();
                assert_close(&f32s(&stat), &expected, 1e-5, 1e-5, &what);
                let off = Array::scalar(offset as i32);
                let dynamic = xa
                    .rope(
                        dims as i32,
                        traditional,
                        10000.0,
                        1.0,
                        RopeOffset::Dynamic(&off),
                        None,
                    )
                    .unwrap();
                assert_close(
                    &f32s(&dynamic),
                    &expected,
                    1e-5,
                    1e-5,
                    &format!("{what} dynamic"),
                );
            }
        }
    }
    // A position scale and another base.
    let expected = rope_ref(&x, (l as usize, d as usize), 16, false, (500.0, 0.25), 3);
    let out = xa
        .rope(16, false, 500.0, 0.25, RopeOffset::Static(3), None)
        .unwrap();
    assert_close(&f32s(&out), &expected, 1e-5, 1e-5, "rope scaled");
}

/// Attention over `q [B, Hq, L, D]`, `k, v [B, Hkv, S, D]`; `mask(l, s)` is
/// an additive term (NEG_INFINITY to drop).
fn sdpa_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (b, hq, hkv, l, s, d): (usize, usize, usize, usize, usize, usize),
    scale: f64,
    mask: impl Fn(usize, usize, usize, usize) -> f64,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(b * hq * l * d);
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            let qb = &q[(bi * hq + h) * l * d..];
            let kb = &k[(bi * hkv + kh) * s * d..];
            let vb = &v[(bi * hkv + kh) * s * d..];
            for li in 0..l {
                let scores: Vec<f64> = (0..s)
                    .map(|si| {
                        let dot: f64 = (0..d)
                            .map(|t| qb[li * d + t] as f64 * kb[si * d + t] as f64)
                            .sum();
                        dot * scale + mask(bi, h, li, si)
                    })
                    .collect();
                let p = softmax(&scores);
                for t in 0..d {
                    out.push((0..s).map(|si| p[si] * vb[si * d + t] as f64).sum());
                }
            }
        }
    }
    out
}

#[test]
fn attention_masks_and_gqa() {
    let mut rng = Rng::new(54);
    for (hq, hkv, l, s) in [(4, 4, 6, 6), (4, 2, 3, 7), (6, 2, 1, 9), (8, 1, 5, 5)] {
        let (b, d) = (2, 32);
        let dims = (b, hq, hkv, l, s, d);
        let (q, qa) = rng.array(&[b as i32, hq as i32, l as i32, d as i32]);
        let (k, ka) = rng.array(&[b as i32, hkv as i32, s as i32, d as i32]);
        let (v, va) = rng.array(&[b as i32, hkv as i32, s as i32, d as i32]);
        let scale = 1.0 / (d as f64).sqrt();
        let what = format!("sdpa hq={hq} hkv={hkv} l={l} s={s}");

        let out =
            scaled_dot_product_attention(&qa, &ka, &va, scale as f32, AttentionMask::None).unwrap();
        assert_eq!(out.shape(), vec![b as i32, hq as i32, l as i32, d as i32]);
        let expected = sdpa_ref(&q, &k, &v, dims, scale, |_, _, _, _| 0.0);
        assert_close(
            &f32s(&out),
            &expected,
            1e-5,
            1e-4,
            &format!("{what} no mask"),
        );

        let causal = |_, _, li: usize, si: usize| {
            if si <= li + (s - l) {
                0.0
            } else {
                f64::NEG_INFINITY
            }
        };
        let out = scaled_dot_product_attention(&qa, &ka, &va, scale as f32, AttentionMask::Causal)
            .unwrap();
        let expected = sdpa_ref(&q, &k, &v, dims, scale, causal);
        assert_close(
            &f32s(&out),
            &expected,
            1e-5,
            1e-4,
            &format!("{what} causal"),
        );

        // An additive float mask broadcast over batch and heads.
        let (m, ma) = rng.array_in(&[l as i32, s as i32], -2.0, 2.0);
        let out =
            scaled_dot_product_attention(&qa, &ka, &va, scale as f32, AttentionMask::Array(&ma))
                .unwrap();
        let expected = sdpa_ref(&q, &k, &v, dims, scale, |_, _, li, si| {
            m[li * s + si] as f64
        });
        assert_close(
            &f32s(&out),
            &expected,
            1e-5,
            1e-4,
            &format!("{what} additive mask"),
        );

        // A boolean mask per batch entry (true keeps); key 0 always kept.
        let keep: Vec<bool> = (0..b * l * s)
            .map(|i| i % s == 0 || rng.below(3) > 0)
            .collect();
        let ba = arr(&keep, &[b as i32, 1, l as i32, s as i32]);
        let out =
            scaled_dot_product_attention(&qa, &ka, &va, scale as f32, AttentionMask::Array(&ba))
                .unwrap();
        let expected = sdpa_ref(&q, &k, &v, dims, scale, |bi, _, li, si| {
            if keep[(bi * l + li) * s + si] {
                0.0
            } else {
                f64::NEG_INFINITY
            }
        });
        assert_close(
            &f32s(&out),
            &expected,
            1e-5,
            1e-4,
            &format!("{what} boolean mask"),
        );
    }
}

fn mean_std(x: &[f32]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

const SAMPLES: i32 = 200_000;

#[test]
fn normal_statistics_and_keys() {
    let key = random::key(7).unwrap();
    let x = f32s(&random::normal(&[SAMPLES], Dtype::F32, 0.0, 1.0, Some(&key)).unwrap());
    let (mean, std) = mean_std(&x);
    assert!(mean.abs() < 0.01, "mean {mean}");
    assert!((std - 1.0).abs() < 0.01, "std {std}");
    let y = f32s(&random::normal(&[SAMPLES], Dtype::F32, 3.0, 0.5, Some(&key)).unwrap());
    let (mean, std) = mean_std(&y);
    assert!((mean - 3.0).abs() < 0.01, "shifted mean {mean}");
    assert!((std - 0.5).abs() < 0.01, "scaled std {std}");

    let again = f32s(
        &random::normal(
            &[SAMPLES],
            Dtype::F32,
            0.0,
            1.0,
            Some(&random::key(7).unwrap()),
        )
        .unwrap(),
    );
    assert_eq!(x, again, "same key, same values");
    let other = f32s(
        &random::normal(
            &[SAMPLES],
            Dtype::F32,
            0.0,
            1.0,
            Some(&random::key(8).unwrap()),
        )
        .unwrap(),
    );
    let same = x.iter().zip(&other).filter(|(a, b)| a == b).count();
    assert!(same < 10, "different keys gave {same} equal values");

    let h = random::normal(&[1000], Dtype::BF16, 0.0, 1.0, Some(&key)).unwrap();
    assert_eq!(h.dtype(), Dtype::BF16);
}

#[test]
fn uniform_range_and_moments() {
    let key = random::key(9).unwrap();
    let x = f32s(&random::uniform(-2.0, 3.0, &[SAMPLES], Dtype::F32, Some(&key)).unwrap());
    assert!(
        x.iter().all(|&v| (-2.0..3.0).contains(&v)),
        "out of [-2, 3)"
    );
    let (mean, std) = mean_std(&x);
    assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    assert!((std - 5.0 / 12f64.sqrt()).abs() < 0.02, "std {std}");
    // Every tenth of the range gets its share.
    let mut bins = [0usize; 10];
    for &v in &x {
        bins[((v + 2.0) / 0.5) as usize] += 1;
    }
    for (i, &c) in bins.iter().enumerate() {
        let p = c as f64 / SAMPLES as f64;
        assert!((p - 0.1).abs() < 0.005, "bin {i} has {p}");
    }
    let y = f32s(&random::uniform(-2.0, 3.0, &[SAMPLES], Dtype::F32, Some(&key)).unwrap());
    assert_eq!(x, y, "same key, same values");
}

#[test]
fn categorical_frequencies_follow_softmax() {
    let logits = [0.5f32, -1.0, 2.0, 0.0, 1.0];
    let n = 100_000;
    let rows: Vec<f32> = (0..n).flat_map(|_| logits).collect();
    let key = random::key(10).unwrap();
    let s = random::categorical(&arr(&rows, &[n, 5]), -1, Some(&key)).unwrap();
    assert_eq!(s.shape(), vec![n]);
    let samples = u32s(&s);
    let mut counts = [0usize; 5];
    for &i in &samples {
        counts[i as usize] += 1;
    }
    let p = softmax(&to_f64(&logits));
    for (i, (&c, &pi)) in counts.iter().zip(&p).enumerate() {
        let f = c as f64 / n as f64;
        assert!(
            (f - pi).abs() < 0.01,
            "category {i}: frequency {f}, probability {pi}"
        );
    }
    let again = u32s(&random::categorical(&arr(&rows, &[n, 5]), -1, Some(&key)).unwrap());
    assert_eq!(samples, again, "same key, same samples");
}

#[test]
fn gumbel_moments() {
    let key = random::key(11).unwrap();
    let x = f32s(&random::gumbel(&[SAMPLES], Dtype::F32, Some(&key)).unwrap());
    let (mean, std) = mean_std(&x);
    let euler_gamma = 0.577_215_664_901_532_9;
    let pi_over_sqrt6 = std::f64::consts::PI / 6f64.sqrt();
    assert!((mean - euler_gamma).abs() < 0.02, "mean {mean}");
    assert!((std - pi_over_sqrt6).abs() < 0.02, "std {std}");
}

#[test]
fn split_gives_distinct_reproducible_keys() {
    let key = random::key(12).unwrap();
    let keys = random::split(&key, 4).unwrap();
    assert_eq!(keys.shape(), vec![4, 2]);
    assert_eq!(keys.dtype(), Dtype::U32);
    let words = u32s(&keys);
    let pairs: Vec<&[u32]> = words.chunks(2).collect();
    for i in 0..4 {
        for j in i + 1..4 {
            assert_ne!(pairs[i], pairs[j], "subkeys {i} and {j}");
        }
        assert_ne!(pairs[i], &u32s(&key)[..], "subkey {i} equals the parent");
    }
    assert_eq!(
        words,
        u32s(&random::split(&key, 4).unwrap()),
        "split is deterministic"
    );
    // Subkeys drive different streams.
    let k0 = keys
        .slice(&[0, 0], &[1, 2], &[])
        .unwrap()
        .reshape(&[2])
        .unwrap();
    let k1 = keys
        .slice(&[1, 0], &[2, 2], &[])
        .unwrap()
        .reshape(&[2])
        .unwrap();
    let a = f32s(&random::normal(&[64], Dtype::F32, 0.0, 1.0, Some(&k0)).unwrap());
    let b = f32s(&random::normal(&[64], Dtype::F32, 0.0, 1.0, Some(&k1)).unwrap());
    assert_ne!(a, b);
}

#[test]
fn global_seed_is_reproducible() {
    random::seed(99);
    let a = f32s(&random::uniform(0.0, 1.0, &[32], Dtype::F32, None).unwrap());
    random::seed(99);
    let b = f32s(&random::uniform(0.0, 1.0, &[32], Dtype::F32, None).unwrap());
    assert_eq!(a, b);
}
