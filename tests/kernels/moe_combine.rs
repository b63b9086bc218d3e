//! MoE combine against an f32 sequential-k reference computed here.

use crate::kernels_common::{bits, cuda_moe_limit, normal, on_each_device, Tally};
use mlx_backend::kernels::{moe_combine, Kernel};
use mlx_backend::{bf16, f16, Array, Dtype, Element};

const SHAPES: [&[i32]; 18] = [
    &[1, 8, 2048],
    &[1, 8, 7168],
    &[128, 2, 256],
    &[1, 268, 4, 2048],
    &[2, 3, 5, 4, 96],
    &[1, 1, 1],
    &[1, 1, 4096],
    &[3, 1, 111],
    &[7, 2, 576],
    &[1, 6, 1408],
    &[17, 4, 64],
    &[33, 8, 128],
    &[1, 4, 2048],
    &[4, 4, 3584],
    &[2, 16, 300],
    &[5, 3, 7],
    &[2, 2, 2, 768],
    &[1, 2, 1, 3, 1000],
];

/// Host values of `a` as f32 (exact for every float dtype).
fn host(a: &Array) -> Vec<f32> {
    a.to_f32_vec().unwrap()
}

/// `Y(Σ_k f32(y)·f32(s))`, k ascending, multiply then add, from 0.0.
fn reference(y: &Array, s: &Array) -> Vec<f32> {
    let shape = y.shape();
    let hidden = *shape.last().unwrap() as usize;
    let top_k = shape[shape.len() - 2] as usize;
    let (yv, sv) = (host(y), host(s));
    let rows = sv.len() / top_k;
    let mut out = vec![0.0f32; rows * hidden];
    for r in 0..rows {
        for h in 0..hidden {
            let mut acc = 0.0f32;
            for k in 0..top_k {
                let prod = yv[(r * top_k + k) * hidden + h] * sv[r * top_k + k];
                acc += prod;
            }
            out[r * hidden + h] = acc;
        }
    }
    out
}

/// Distance in units in the last place of `T` between `got` and the f32
/// reference rounded to T.
fn ulps<T: Element + Copy>(
    got: &Array,
    want: &[f32],
    to_t: fn(f32) -> T,
    key: fn(T) -> i64,
) -> i64 {
    let g = got.to_vec::<T>().unwrap();
    g.iter()
        .zip(want)
        .map(|(g, w)| (key(*g) - key(to_t(*w))).abs())
        .max()
        .unwrap_or(0)
}

/// A monotone integer key of a float's bits (negatives mirrored).
fn ordered(bits: i64, sign_bit: i64) -> i64 {
    if bits & sign_bit != 0 {
        -(bits & !sign_bit)
    } else {
        bits
    }
}

fn max_ulps(got: &Array, want: &[f32]) -> i64 {
    match got.dtype() {
        Dtype::F32 => ulps(
            got,
            want,
            |v| v,
            |v: f32| ordered(v.to_bits() as i64, 1 << 31),
        ),
        Dtype::F16 => ulps(got, want, f16::from_f32, |v: f16| {
            ordered(v.to_bits() as i64, 1 << 15)
        }),
        Dtype::BF16 => ulps(got, want, bf16::from_f32, |v: bf16| {
            ordered(v.to_bits() as i64, 1 << 15)
        }),
        other => panic!("unexpected dtype {other}"),
    }
}

#[test]
fn matches_sequential_reference() {
    on_each_device(|_dev| {
        let mut tally = Tally::new(Kernel::MoeCombine);
        let mut seed = 10;
        for shape in SHAPES {
            for y_dtype in [Dtype::F16, Dtype::BF16, Dtype::F32] {
                for s_dtype in [Dtype::F16, Dtype::BF16, Dtype::F32] {
                    seed += 2;
                    let y = normal(shape, y_dtype, 0.0, 2.0, seed);
                    let s = normal(&shape[..shape.len() - 1], s_dtype, 0.0, 1.0, seed + 1);
                    let out = moe_combine(&y, &s).unwrap();
                    tally.record(cuda_moe_limit(&y));
                    let mut want_shape = shape.to_vec();
                    want_shape.remove(shape.len() - 2);
                    assert_eq!(out.shape(), want_shape);
                    assert_eq!(out.dtype(), y_dtype);
                    let err = max_ulps(&out, &reference(&y, &s));
                    let allowed = if s_dtype == Dtype::F32 { 2 } else { 0 };
                    assert!(
                        err <= allowed,
                        "{shape:?} y {y_dtype} scores {s_dtype}: {err} ulps"
                    );
                }
            }
        }
        tally.check();
    });
}

#[test]
fn views_are_made_dense() {
    on_each_device(|_dev| {
        // Transposed scores and sliced y are made dense before the kernel.
        let y = normal(&[6, 4, 512], Dtype::BF16, 0.0, 1.0, 900)
            .slice(&[0, 0, 0], &[6, 4, 512], &[1, 1, 2])
            .unwrap();
        let s = normal(&[4, 6], Dtype::F32, 0.0, 1.0, 901)
            .transpose(&[])
            .unwrap();
        let out = moe_combine(&y, &s).unwrap();
        assert_eq!(max_ulps(&out, &reference(&y, &s)), 0);
    });
}

#[test]
fn vjp_equals_fallback_vjp() {
    on_each_device(|_dev| {
        use mlx_backend::kernels::test_hooks::moe_combine_vjp;
        let y = normal(&[3, 4, 64], Dtype::F32, 0.0, 1.0, 950);
        let s = normal(&[3, 4], Dtype::F32, 0.0, 1.0, 951);
        let ct = normal(&[3, 64], Dtype::F32, 0.0, 1.0, 952);
        let fused = moe_combine_vjp(&y, &s, &ct, true).unwrap();
        let fallback = moe_combine_vjp(&y, &s, &ct, false).unwrap();
        assert_eq!(fused.len(), 2);
        for (a, b) in fused.iter().zip(&fallback) {
            assert_eq!(a.shape(), b.shape());
            assert_eq!(bits(a), bits(b));
        }
    });
}

#[test]
fn contract_violations_are_op_errors() {
    on_each_device(|_dev| {
        let y2 = normal(&[4, 64], Dtype::F32, 0.0, 1.0, 1);
        let e = moe_combine(&y2, &normal(&[4], Dtype::F32, 0.0, 1.0, 2)).unwrap_err();
        assert!(e.message.contains("rank"), "{e}");
        let y = normal(&[2, 4, 64], Dtype::F32, 0.0, 1.0, 3);
        let e = moe_combine(&y, &normal(&[2, 3], Dtype::F32, 0.0, 1.0, 4)).unwrap_err();
        assert!(e.message.contains("scores must have shape"), "{e}");
        let ints = Array::zeros(&[2, 4], Dtype::I32).unwrap();
        assert!(moe_combine(&y, &ints).is_err());
    });
}
