//! attention against a float64 reference computed here, on the views the
//! model feeds it (q a transpose, k/v slices of a longer cache buffer),
//! decode (the CUDA body's row-per-block kernel) and prefill (its tiled
//! kernels) alike.

use crate::kernels_common::{
    assert_fallback_counted, fused_expected, normal, on_each_device, Tally,
};
use mlx_backend::kernels::{
    attention, registry, Backend, FallbackReason, Kernel, CUDA_ATTENTION_MAX_HEAD_DIM,
    METAL_ATTENTION_MAX_ROWS,
};
use mlx_backend::ops::AttentionMask;
use mlx_backend::{Array, Dtype};

/// The GPU bodies' limits: head_dim on CUDA and Metal, and on Metal at
/// most [`METAL_ATTENTION_MAX_ROWS`] query rows; `Ok(())` on the CPU.
fn gpu_limit(q: &Array) -> Result<(), FallbackReason> {
    let backend = Backend::current();
    let gpu = matches!(backend, Backend::Cuda | Backend::Metal);
    if (gpu && q.shape()[3] > CUDA_ATTENTION_MAX_HEAD_DIM)
        || (backend == Backend::Metal && q.shape()[2] > METAL_ATTENTION_MAX_ROWS)
    {
        Err(FallbackReason::UnsupportedShape)
    } else {
        Ok(())
    }
}

/// Evaluates the inputs, then leaves a NaN-filled buffer of the output's
/// size in MLX's buffer cache, where the output's allocation (the next one
/// of that size) finds it: an element a kernel fails to write reads as NaN
/// and fails the comparison instead of passing on stale data.
fn poison_output(inputs: &[&Array], shape: &[i32], dtype: Dtype) {
    for a in inputs {
        a.eval().unwrap();
    }
    Array::full(shape, f64::NAN, dtype).unwrap().eval().unwrap();
}

fn mask_of(causal: bool) -> AttentionMask<'static> {
    if causal {
        AttentionMask::Causal
    } else {
        AttentionMask::None
    }
}

/// `softmax(q·kᵀ·scale)·v` in f64; causal is lower-right aligned.
fn reference(q: &Array, k: &Array, v: &Array, scale: f32, causal: bool) -> Vec<f64> {
    let (qs, ks) = (q.shape(), k.shape());
    let [b, hq, l, d] = [qs[0], qs[1], qs[2], qs[3]].map(|x| x as usize);
    let [hkv, s] = [ks[1], ks[2]].map(|x| x as usize);
    let (q, k, v) = (
        q.to_vec::<f32>().unwrap(),
        k.to_vec::<f32>().unwrap(),
        v.to_vec::<f32>().unwrap(),
    );
    let mut out = vec![0.0f64; b * hq * l * d];
    for bi in 0..b {
        for h in 0..hq {
            let kv = (bi * hkv + h / (hq / hkv)) * s * d;
            for i in 0..l {
                let qr = &q[((bi * hq + h) * l + i) * d..][..d];
                let n = if causal { i + s - l + 1 } else { s };
                let sc: Vec<f64> = (0..n)
                    .map(|j| {
                        let dot: f64 = (0..d)
                            .map(|x| qr[x] as f64 * k[kv + j * d + x] as f64)
                            .sum();
                        dot * scale as f64
                    })
                    .collect();
                let mx = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = p.iter().sum();
                let o = &mut out[((bi * hq + h) * l + i) * d..][..d];
                for (j, pj) in p.iter().enumerate() {
                    for x in 0..d {
                        o[x] += pj / z * v[kv + j * d + x] as f64;
                    }
                }
            }
        }
    }
    out
}

/// q `[B, Hq, L, D]` as the model builds it: a transpose of `[B, L, Hq, D]`;
/// k, v the first `S` rows of a cache buffer longer than S.
fn inputs(hq: i32, hkv: i32, l: i32, s: i32, d: i32, seed: u64) -> (Array, Array, Array) {
    let q = normal(&[1, l, hq, d], Dtype::F32, 0.0, 1.0, seed)
        .transpose(&[0, 2, 1, 3])
        .unwrap();
    let cache = |seed| {
        normal(&[1, hkv, s + 16, d], Dtype::F32, 0.0, 1.0, seed)
            .slice_axis(2, 0, s)
            .unwrap()
    };
    (q, cache(seed + 1), cache(seed + 2))
}

#[test]
fn matches_f64_reference() {
    on_each_device(|_dev| {
        let mut tally = Tally::new(Kernel::Attention);
        let mut seed = 7000;
        for (hq, hkv) in [(9, 3), (4, 4)] {
            // d = 80: column blocks of 4 and 1 registers; d = 40: the path without AVX-512.
            for d in [64, 32, 80, 40] {
                for l in [1, 7, 64, 200] {
                    for prefix in [0, 13] {
                        for causal in [true, false] {
                            let s = l + prefix;
                            let (q, k, v) = inputs(hq, hkv, l, s, d, seed);
                            seed += 3;
                            let scale = 1.0 / (d as f32).sqrt();
                            poison_output(&[&q, &k, &v], &[1, hq, l, d], Dtype::F32);
                            let got = attention(&q, &k, &v, scale, mask_of(causal)).unwrap();
                            tally.record(gpu_limit(&q));
                            assert_eq!(got.shape(), vec![1, hq, l, d]);
                            let want = reference(&q, &k, &v, scale, causal);
                            let got = got.to_vec::<f32>().unwrap();
                            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                                let err = (*g as f64 - w).abs() / w.abs().max(1.0);
                                assert!(
                                    err <= 1e-4,
                                    "hq {hq}/{hkv} d {d} l {l} s {s} causal {causal}: \
                                     index {i}: got {g}, want {w}"
                                );
                            }
                        }
                    }
                }
            }
        }
        tally.check();
    });
}

#[test]
fn agrees_with_mlx_sdpa() {
    on_each_device(|_dev| {
        for (l, s) in [(1, 700), (3, 40), (33, 40)] {
            let (q, k, v) = inputs(9, 3, l, s, 64, 7500 + l as u64);
            for mask in [AttentionMask::Causal, AttentionMask::None] {
                let got = attention(&q, &k, &v, 0.125, mask).unwrap();
                let want = mlx_backend::ops::scaled_dot_product_attention(&q, &k, &v, 0.125, mask)
                    .unwrap();
                assert!(
                    crate::kernels_common::norm_rel_err(&got, &want) < 1e-5,
                    "l {l} s {s}"
                );
            }
        }
    });
}

#[test]
fn ineligible_inputs_fall_back_counted() {
    on_each_device(|_dev| {
        let stats = || registry::stats(Kernel::Attention);
        let (q, k, v) = inputs(4, 2, 3, 9, 32, 7600);
        // f16: the CPU body is f32 only (the CUDA body takes it).
        let [q16, k16, v16] = [&q, &k, &v].map(|a| a.astype(Dtype::F16).unwrap());
        let before = stats();
        let got = attention(&q16, &k16, &v16, 0.2, AttentionMask::Causal).unwrap();
        if Backend::current() == Backend::Cuda {
            assert_eq!(stats().fused, before.fused + 1);
        } else {
            assert_fallback_counted(Kernel::Attention, &before, FallbackReason::UnsupportedDtype);
        }
        assert_eq!(got.dtype(), Dtype::F16);
        let want = reference(&q, &k, &v, 0.2, true);
        let got = got.to_f32_vec().unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 1e-2 * w.abs().max(1.0));
        }
        // An array mask: MLX's op, counted.
        let mask = Array::from_slice(&[true; 9], &[1, 1, 1, 9]).unwrap();
        let before = stats();
        let got = attention(&q, &k, &v, 0.2, AttentionMask::Array(&mask)).unwrap();
        assert_fallback_counted(Kernel::Attention, &before, FallbackReason::UnsupportedMask);
        let want = reference(&q, &k, &v, 0.2, false);
        for (g, w) in got.to_vec::<f32>().unwrap().iter().zip(&want) {
            assert!((*g as f64 - w).abs() <= 1e-4 * w.abs().max(1.0));
        }
        // Causal with more queries than keys: MLX's op, counted.
        let (q, k, v) = inputs(4, 2, 9, 5, 32, 7700);
        let before = stats();
        attention(
            &q,
            &k.slice_axis(2, 0, 5).unwrap(),
            &v,
            0.2,
            AttentionMask::Causal,
        )
        .unwrap();
        assert_fallback_counted(Kernel::Attention, &before, FallbackReason::UnsupportedMask);
    });
}

/// The GPU bodies' half-precision dtypes, long caches, prefill tiles
/// (SmolLM2-135M's 9/3 heads of 64 and Qwen3-0.6B's 16/8 of 128 over 512
/// rows, a chunk of rows behind a cache, uneven row counts), head sizes the
/// prefill kernels pad (96, 40) or copy element by element (36), and k
/// views with a transposed head axis or element stride, against the
/// float64 reference; the CPU builds MLX's op for what its body does not
/// take.
#[test]
fn half_precision_wide_heads_and_strided_views() {
    on_each_device(|_dev| {
        let mut seed = 7900;
        for (dtype, tol) in [(Dtype::F16, 4e-3), (Dtype::BF16, 3e-2), (Dtype::F32, 1e-4)] {
            for (hq, hkv, l, s, d, causal) in [
                (8, 2, 1, 1500, 128, true),
                (4, 4, 37, 37, 256, true),
                (6, 3, 3, 70, 96, true),
                (9, 3, 512, 512, 64, true),
                (16, 8, 512, 512, 128, true),
                (16, 8, 130, 130, 128, false),
                (9, 3, 129, 300, 64, true),
                (4, 2, 70, 89, 96, true),
                (4, 2, 33, 33, 40, false),
                (4, 2, 21, 40, 36, true),
            ] {
                let (q, k, v) = inputs(hq, hkv, l, s, d, seed);
                seed += 3;
                let [qh, kh, vh] = [&q, &k, &v].map(|a| a.astype(dtype).unwrap());
                // The rounded inputs are what the reference sees.
                let [q32, k32, v32] = [&qh, &kh, &vh].map(|a| a.astype(Dtype::F32).unwrap());
                let scale = 1.0 / (d as f32).sqrt();
                let want = reference(&q32, &k32, &v32, scale, causal);
                poison_output(&[&qh, &kh, &vh], &[1, hq, l, d], dtype);
                let before = registry::stats(Kernel::Attention);
                let got = attention(&qh, &kh, &vh, scale, mask_of(causal)).unwrap();
                let fused = registry::stats(Kernel::Attention).fused > before.fused;
                let takes = match Backend::current() {
                    Backend::Cpu => dtype == Dtype::F32,
                    _ => fused_expected(Kernel::Attention) && gpu_limit(&qh).is_ok(),
                };
                assert_eq!(fused, takes, "{dtype:?} d {d}: fused {fused}");
                let got = got.to_f32_vec().unwrap();
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let err = (*g as f64 - w).abs() / w.abs().max(1.0);
                    assert!(
                        err <= tol,
                        "{dtype:?} hq {hq}/{hkv} l {l} s {s} d {d} causal {causal}: \
                         index {i}: got {g}, want {w}"
                    );
                }
            }
            // k with a transposed head axis ([B, S, Hkv, D] stored: dense
            // rows, head stride D) and k with an element stride (a
            // transpose of [.., D, S]), decode and prefill.
            for l in [3, 20] {
                let s = 40;
                let (q, _, v) = inputs(4, 2, l, s, 64, seed);
                let k_heads = normal(&[1, s, 2, 64], Dtype::F32, 0.0, 1.0, seed + 8)
                    .transpose(&[0, 2, 1, 3])
                    .unwrap();
                let k_elems = normal(&[1, 2, 64, s], Dtype::F32, 0.0, 1.0, seed + 9)
                    .transpose(&[0, 1, 3, 2])
                    .unwrap();
                seed += 10;
                for kt in [k_heads, k_elems] {
                    let [qh, kh, vh] = [&q, &kt, &v].map(|a| a.astype(dtype).unwrap());
                    let [q32, k32, v32] = [&qh, &kh, &vh].map(|a| a.astype(Dtype::F32).unwrap());
                    let want = reference(&q32, &k32.contiguous().unwrap(), &v32, 0.125, true);
                    poison_output(&[&qh, &kh, &vh], &[1, 4, l, 64], dtype);
                    let got = attention(&qh, &kh, &vh, 0.125, AttentionMask::Causal).unwrap();
                    for (g, w) in got.to_f32_vec().unwrap().iter().zip(&want) {
                        assert!(
                            (*g as f64 - w).abs() <= tol * w.abs().max(1.0),
                            "{dtype:?} strided k, l {l}: got {g}, want {w}"
                        );
                    }
                }
            }
        }
    });
}

/// Past the CUDA body's widest head (256): MLX's op there, counted. A
/// prefill (more rows than the decode kernel takes) is the CUDA body's.
#[test]
fn shapes_past_the_cuda_body_fall_back_there() {
    on_each_device(|_dev| {
        let (q, k, v) = inputs(2, 1, 3, 5, 320, 8100);
        let before = registry::stats(Kernel::Attention);
        let got = attention(&q, &k, &v, 0.05, AttentionMask::Causal).unwrap();
        if Backend::current() == Backend::Cuda {
            assert_fallback_counted(Kernel::Attention, &before, FallbackReason::UnsupportedShape);
        }
        let want = reference(&q, &k, &v, 0.05, true);
        for (g, w) in got.to_vec::<f32>().unwrap().iter().zip(&want) {
            assert!((*g as f64 - w).abs() <= 1e-4 * w.abs().max(1.0));
        }
        let (q, k, v) = inputs(2, 1, 5, 12, 64, 8200);
        let before = registry::stats(Kernel::Attention);
        let got = attention(&q, &k, &v, 0.125, AttentionMask::Causal).unwrap();
        if fused_expected(Kernel::Attention) {
            assert_eq!(registry::stats(Kernel::Attention).fused, before.fused + 1);
        }
        let want = reference(&q, &k, &v, 0.125, true);
        for (g, w) in got.to_vec::<f32>().unwrap().iter().zip(&want) {
            assert!((*g as f64 - w).abs() <= 1e-4 * w.abs().max(1.0));
        }
    });
}

#[test]
fn rejects_bad_shapes() {
    on_each_device(|_dev| {
        // 4 query heads over 3 kv heads.
        let (q, k, v) = inputs(4, 3, 5, 9, 32, 7800);
        assert!(attention(&q, &k, &v, 0.2, AttentionMask::None).is_err());
        let q3 = normal(&[4, 5, 32], Dtype::F32, 0.0, 1.0, 7801);
        assert!(attention(&q3, &k, &v, 0.2, AttentionMask::None).is_err());
    });
}
