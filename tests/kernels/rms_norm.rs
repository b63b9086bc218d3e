//! RMSNorm kernel against a higher-precision reference (MLX fast::rms_norm
//! in f32 on the f32-upcast input), over the grid, ranks 2–4,
//! views, the residual form and the vjp.

use crate::kernels_common::{bits, max_rel_err, normal, on_each_device, Tally};
use mlx_backend::kernels::{rms_norm, rms_norm_residual, Kernel};
use mlx_backend::{Array, Dtype};

const EPS: f32 = 1e-5;

fn tolerance(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::F16 => 1e-3,
        Dtype::BF16 => 2e-2,
        _ => 1e-4,
    }
}

/// The f32 reference for x (any layout) and w.
fn reference(x: &Array, w: &Array) -> Array {
    x.astype(Dtype::F32)
        .unwrap()
        .rms_norm_mlx(Some(&w.astype(Dtype::F32).unwrap()), EPS)
        .unwrap()
}

/// Relative error with a floor well below the outputs' typical size (~1),
/// so f16 subnormal outputs do not dominate.
fn check(got: &Array, want: &Array, dtype: Dtype, what: &str) {
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let err = max_rel_err(got, want, 1e-2);
    assert!(
        err <= tolerance(dtype),
        "{what}: max relative error {err:e}"
    );
}

#[test]
fn grid_rows_by_hidden_by_dtype() {
    on_each_device(|_dev| {
        let mut tally = Tally::new(Kernel::RmsNorm);
        let mut seed = 1;
        for dtype in [Dtype::F16, Dtype::BF16, Dtype::F32] {
            for rows in [1, 19, 99, 989] {
                for hidden in [111, 500, 1024, 3072, 3584, 4096, 8192, 16384] {
                    seed += 2;
                    let x = normal(&[rows, hidden], dtype, 0.0, 1.0, seed);
                    let w = normal(&[hidden], dtype, 1.0, 0.25, seed + 1);
                    let got = rms_norm(&x, &w, EPS).unwrap();
                    tally.record(Ok(()));
                    check(
                        &got,
                        &reference(&x, &w),
                        dtype,
                        &format!("{dtype} {rows}x{hidden}"),
                    );
                }
            }
        }
        // All 96 cases ran the backend's fused kernel, not the fallback (or,
        // without a body there, counted NoKernelForDevice).
        assert_eq!(tally.builds(), 96);
        tally.check();
    });
}

#[test]
fn ranks_two_to_four() {
    on_each_device(|_dev| {
        for (i, shape) in [vec![7, 300], vec![3, 5, 256], vec![2, 3, 4, 130]]
            .into_iter()
            .enumerate()
        {
            for dtype in [Dtype::F16, Dtype::BF16, Dtype::F32] {
                let hidden = *shape.last().unwrap();
                let x = normal(&shape, dtype, 0.0, 2.0, 100 + i as u64);
                let w = normal(&[hidden], dtype, 1.0, 0.3, 200 + i as u64);
                let got = rms_norm(&x, &w, EPS).unwrap();
                check(&got, &reference(&x, &w), dtype, &format!("{shape:?}"));
            }
        }
    });
}

#[test]
fn views_are_never_read_as_dense() {
    on_each_device(|_dev| {
        for dtype in [Dtype::F16, Dtype::BF16, Dtype::F32] {
            // Transposed x: [hidden, rows] viewed as [rows, hidden].
            let base = normal(&[384, 21], dtype, 0.0, 1.0, 300);
            let xt = base.transpose(&[]).unwrap();
            let w = normal(&[384], dtype, 1.0, 0.2, 301);
            check(
                &rms_norm(&xt, &w, EPS).unwrap(),
                &reference(&xt, &w),
                dtype,
                "transposed",
            );
            // Sliced x: every other row, columns 5..5+256.
            let big = normal(&[40, 300], dtype, 0.0, 1.0, 302);
            let xs = big.slice(&[0, 5], &[40, 261], &[2, 1]).unwrap();
            let w2 = normal(&[256], dtype, 1.0, 0.2, 303);
            check(
                &rms_norm(&xs, &w2, EPS).unwrap(),
                &reference(&xs, &w2),
                dtype,
                "sliced",
            );
            // Strided weight (every other element) and a broadcast weight.
            let wbig = normal(&[512], dtype, 1.0, 0.2, 304);
            let ws = wbig.slice(&[0], &[512], &[2]).unwrap();
            let x = normal(&[9, 256], dtype, 0.0, 1.0, 305);
            check(
                &rms_norm(&x, &ws, EPS).unwrap(),
                &reference(&x, &ws),
                dtype,
                "strided weight",
            );
            let wb = Array::full(&[1], 1.5, dtype)
                .unwrap()
                .broadcast_to(&[256])
                .unwrap();
            check(
                &rms_norm(&x, &wb, EPS).unwrap(),
                &reference(&x, &wb),
                dtype,
                "broadcast weight",
            );
        }
    });
}

#[test]
fn residual_variant() {
    on_each_device(|_dev| {
        for dtype in [Dtype::F16, Dtype::BF16, Dtype::F32] {
            for (rows, hidden) in [(1, 576), (19, 4096), (99, 111)] {
                let x = normal(&[rows, hidden], dtype, 0.0, 1.0, 400 + rows as u64);
                let r = normal(&[rows, hidden], dtype, 0.0, 1.0, 500 + rows as u64);
                let w = normal(&[hidden], dtype, 1.0, 0.2, 600);
                let (normed, sum) = rms_norm_residual(&x, &r, &w, EPS).unwrap();
                // The sum is exactly MLX's add; the norm is of that rounded sum.
                let want_sum = x.add(&r).unwrap();
                assert_eq!(bits(&sum), bits(&want_sum), "{dtype} residual sum");
                check(
                    &normed,
                    &reference(&want_sum, &w),
                    dtype,
                    &format!("{dtype} residual {rows}x{hidden}"),
                );
            }
            // Views for the residual too.
            let x = normal(&[256, 12], dtype, 0.0, 1.0, 700)
                .transpose(&[])
                .unwrap();
            let r = normal(&[12, 512], dtype, 0.0, 1.0, 701)
                .slice(&[0, 0], &[12, 512], &[1, 2])
                .unwrap();
            let w = normal(&[256], dtype, 1.0, 0.2, 702);
            let (normed, sum) = rms_norm_residual(&x, &r, &w, EPS).unwrap();
            let want_sum = x.add(&r).unwrap();
            assert_eq!(bits(&sum), bits(&want_sum), "{dtype} residual sum of views");
            check(&normed, &reference(&want_sum, &w), dtype, "residual views");
        }
    });
}

#[test]
fn vjp_equals_fallback_vjp() {
    on_each_device(|_dev| {
        use mlx_backend::kernels::test_hooks::rms_norm_vjp;
        let x = normal(&[5, 3, 96], Dtype::F32, 0.0, 1.0, 800);
        let r = normal(&[5, 3, 96], Dtype::F32, 0.0, 1.0, 801);
        let w = normal(&[96], Dtype::F32, 1.0, 0.2, 802);
        let ct = normal(&[5, 3, 96], Dtype::F32, 0.0, 1.0, 803);
        let ct2 = normal(&[5, 3, 96], Dtype::F32, 0.0, 1.0, 804);
        let fused = rms_norm_vjp(&[&x, &w], &[&ct], EPS, true).unwrap();
        let fallback = rms_norm_vjp(&[&x, &w], &[&ct], EPS, false).unwrap();
        assert_eq!(fused.len(), 2);
        for (a, b) in fused.iter().zip(&fallback) {
            assert_eq!(a.shape(), b.shape());
            assert_eq!(bits(a), bits(b), "rms_norm vjp");
        }
        let fused = rms_norm_vjp(&[&x, &r, &w], &[&ct, &ct2], EPS, true).unwrap();
        let fallback = rms_norm_vjp(&[&x, &r, &w], &[&ct, &ct2], EPS, false).unwrap();
        assert_eq!(fused.len(), 3);
        for (a, b) in fused.iter().zip(&fallback) {
            assert_eq!(bits(a), bits(b), "rms_norm_residual vjp");
        }
    });
}

#[test]
fn contract_violations_are_op_errors() {
    on_each_device(|_dev| {
        let x = normal(&[4, 64], Dtype::F32, 0.0, 1.0, 900);
        let w = normal(&[63], Dtype::F32, 1.0, 0.1, 901);
        let e = rms_norm(&x, &w, EPS).unwrap_err();
        assert!(e.message.contains("weight"), "{e}");
        let w2 = normal(&[2, 64], Dtype::F32, 1.0, 0.1, 902);
        assert!(rms_norm(&x, &w2, EPS).is_err());
        let r = normal(&[4, 32], Dtype::F32, 0.0, 1.0, 903);
        let e =
            rms_norm_residual(&x, &r, &normal(&[64], Dtype::F32, 1.0, 0.1, 904), EPS).unwrap_err();
        assert!(e.message.contains("residual"), "{e}");
    });
}
