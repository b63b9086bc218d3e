//! Elementwise arithmetic, comparisons (with broadcasting), activations,
//! astype and contiguous, each against an f64 reference computed here.

use crate::common::*;
use mlx_backend::ops::where_;
use mlx_backend::{Array, Dtype};

type BinaryOp = fn(&Array, &Array) -> Result<Array, mlx_backend::OpError>;

/// Shape pairs that exercise broadcasting from the left, the right and the middle.
const SHAPES: [(&[i32], &[i32]); 4] = [
    (&[2, 3, 4], &[2, 3, 4]),
    (&[2, 3, 4], &[4]),
    (&[2, 1, 4], &[3, 1]),
    (&[5], &[3, 1, 1]),
];

fn check_binary(name: &str, op: BinaryOp, f: fn(f64, f64) -> f64, lo: f64, hi: f64, tol: f64) {
    let mut rng = Rng::new(name.len() as u64 * 7919);
    for (sa, sb) in SHAPES {
        let (a, xa) = rng.array_in(sa, lo, hi);
        let (b, xb) = rng.array_in(sb, lo, hi);
        let out = op(&xa, &xb).unwrap();
        let (expected, shape) = broadcast_binary(&a, &dims(sa), &b, &dims(sb), f);
        assert_eq!(dims(&out.shape()), shape, "{name} shape");
        assert_close(&f32s(&out), &expected, tol, tol, name);
    }
}

#[test]
fn arithmetic_with_broadcasting() {
    check_binary("add", Array::add, |a, b| a + b, -2.0, 2.0, 1e-6);
    check_binary("sub", Array::sub, |a, b| a - b, -2.0, 2.0, 1e-6);
    check_binary("mul", Array::mul, |a, b| a * b, -2.0, 2.0, 1e-6);
    check_binary("div", Array::div, |a, b| a / b, 0.5, 2.0, 1e-6);
    check_binary("pow", Array::pow, f64::powf, 0.1, 2.0, 1e-5);
    check_binary("maximum", Array::maximum, f64::max, -2.0, 2.0, 0.0);
    check_binary("minimum", Array::minimum, f64::min, -2.0, 2.0, 0.0);
    // Python semantics: the result takes the divisor's sign.
    check_binary(
        "remainder",
        Array::remainder,
        |a, b| a - b * (a / b).floor(),
        -3.0,
        3.0,
        1e-5,
    );
    check_binary(
        "floor_divide",
        Array::floor_divide,
        |a, b| (a / b).floor(),
        0.5,
        3.0,
        0.0,
    );
}

fn check_compare(name: &str, op: BinaryOp, f: fn(f64, f64) -> bool) {
    let mut rng = Rng::new(name.len() as u64 * 104_729);
    for (sa, sb) in SHAPES {
        // Few distinct values so that equality actually happens.
        let a: Vec<f32> = (0..numel(sa)).map(|_| rng.below(4) as f32).collect();
        let b: Vec<f32> = (0..numel(sb)).map(|_| rng.below(4) as f32).collect();
        let out = op(&arr(&a, sa), &arr(&b, sb)).unwrap();
        assert_eq!(out.dtype(), Dtype::Bool, "{name} dtype");
        let (expected, shape) =
            broadcast_binary(&a, &dims(sa), &b, &dims(sb), |x, y| f(x, y) as u8 as f64);
        assert_eq!(dims(&out.shape()), shape, "{name} shape");
        let got: Vec<f64> = out
            .to_vec::<bool>()
            .unwrap()
            .iter()
            .map(|&v| v as u8 as f64)
            .collect();
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn comparisons_with_broadcasting() {
    check_compare("eq", Array::eq, |a, b| a == b);
    check_compare("ne", Array::ne, |a, b| a != b);
    check_compare("lt", Array::lt, |a, b| a < b);
    check_compare("le", Array::le, |a, b| a <= b);
    check_compare("gt", Array::gt, |a, b| a > b);
    check_compare("ge", Array::ge, |a, b| a >= b);
}

#[test]
fn logical_ops() {
    let a = [true, false, true, false];
    let b = [true, true, false, false];
    let (xa, xb) = (arr(&a, &[4]), arr(&b, &[4]));
    let and = xa.logical_and(&xb).unwrap().to_vec::<bool>().unwrap();
    let or = xa.logical_or(&xb).unwrap().to_vec::<bool>().unwrap();
    let not = xa.logical_not().unwrap().to_vec::<bool>().unwrap();
    assert_eq!(and, vec![true, false, false, false]);
    assert_eq!(or, vec![true, true, true, false]);
    assert_eq!(not, vec![false, true, false, true]);
    let any = xb.any(&[], false).unwrap().item::<bool>().unwrap();
    let all = xb.all(&[], false).unwrap().item::<bool>().unwrap();
    assert!(any && !all);
}

type UnaryOp = fn(&Array) -> Result<Array, mlx_backend::OpError>;

fn check_unary(name: &str, op: UnaryOp, f: fn(f64) -> f64, lo: f64, hi: f64, tol: f64) {
    let mut rng = Rng::new(name.len() as u64 * 31 + 5);
    let (x, a) = rng.array_in(&[3, 7, 5], lo, hi);
    let out = op(&a).unwrap();
    assert_eq!(out.shape(), vec![3, 7, 5], "{name} shape");
    let expected: Vec<f64> = x.iter().map(|&v| f(v as f64)).collect();
    assert_close(&f32s(&out), &expected, tol, tol, name);
}

#[test]
fn math_functions() {
    check_unary("exp", Array::exp, f64::exp, -4.0, 4.0, 1e-6);
    check_unary("log", Array::log, f64::ln, 0.01, 10.0, 1e-6);
    check_unary("log1p", Array::log1p, f64::ln_1p, -0.9, 10.0, 1e-6);
    check_unary("sqrt", Array::sqrt, f64::sqrt, 0.0, 10.0, 1e-6);
    check_unary("rsqrt", Array::rsqrt, |x| 1.0 / x.sqrt(), 0.01, 10.0, 1e-6);
    check_unary("sin", Array::sin, f64::sin, -6.0, 6.0, 1e-6);
    check_unary("cos", Array::cos, f64::cos, -6.0, 6.0, 1e-6);
    check_unary("tanh", Array::tanh, f64::tanh, -5.0, 5.0, 1e-6);
    check_unary("erf", Array::erf, erf, -3.5, 3.5, 1e-6);
    check_unary("abs", Array::abs, f64::abs, -3.0, 3.0, 0.0);
    check_unary("neg", Array::neg, |x| -x, -3.0, 3.0, 0.0);
    check_unary("square", Array::square, |x| x * x, -3.0, 3.0, 1e-6);
    check_unary("reciprocal", Array::reciprocal, f64::recip, 0.1, 3.0, 1e-6);
    check_unary("floor", Array::floor, f64::floor, -3.0, 3.0, 0.0);
    check_unary("ceil", Array::ceil, f64::ceil, -3.0, 3.0, 0.0);
    check_unary("sign", Array::sign, f64::signum, -3.0, 3.0, 0.0);
    check_unary("round", Array::round, f64::round_ties_even, -9.0, 9.0, 0.0);
    check_unary("stop_gradient", Array::stop_gradient, |x| x, -3.0, 3.0, 0.0);
}

#[test]
fn activations() {
    check_unary("sigmoid", Array::sigmoid, sigmoid, -8.0, 8.0, 1e-6);
    check_unary("silu", Array::silu, |x| x * sigmoid(x), -8.0, 8.0, 1e-6);
    check_unary(
        "gelu",
        Array::gelu,
        |x| x * (1.0 + erf(x / 2f64.sqrt())) / 2.0,
        -5.0,
        5.0,
        1e-6,
    );
}

#[test]
fn round_is_half_to_even() {
    let x = [0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5];
    let got = arr(&x, &[7]).round().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got, vec![0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 4.0]);
}

#[test]
fn clip_and_scalar_ops() {
    let mut rng = Rng::new(11);
    let (x, a) = rng.array_in(&[4, 6], -3.0, 3.0);
    let clip: Vec<f64> = x.iter().map(|&v| (v as f64).clamp(-1.0, 0.5)).collect();
    assert_close(&f32s(&a.clip(-1.0, 0.5).unwrap()), &clip, 0.0, 0.0, "clip");
    let add: Vec<f64> = x.iter().map(|&v| v as f64 + 2.5).collect();
    assert_close(
        &f32s(&a.add_scalar(2.5).unwrap()),
        &add,
        1e-6,
        1e-6,
        "add_scalar",
    );
    let mul: Vec<f64> = x.iter().map(|&v| v as f64 * -1.25).collect();
    assert_close(
        &f32s(&a.mul_scalar(-1.25).unwrap()),
        &mul,
        1e-6,
        1e-6,
        "mul_scalar",
    );
    let ints = arr(&[3i32, -4, 7], &[3]).add_scalar(2.0).unwrap();
    assert_eq!(ints.dtype(), Dtype::I32);
    assert_eq!(ints.to_vec::<i32>().unwrap(), vec![5, -2, 9]);
}

#[test]
fn where_broadcasts() {
    let mut rng = Rng::new(12);
    let cond: Vec<bool> = (0..12).map(|_| rng.below(2) == 1).collect();
    let (x, xa) = rng.array(&[3, 4]);
    let (y, ya) = rng.array(&[4]);
    let out = where_(&arr(&cond, &[3, 4]), &xa, &ya).unwrap();
    let expected: Vec<f64> = (0..12)
        .map(|i| if cond[i] { x[i] } else { y[i % 4] } as f64)
        .collect();
    assert_close(&f32s(&out), &expected, 0.0, 0.0, "where");
}

#[test]
fn astype_between_kinds() {
    let mut rng = Rng::new(13);
    let x = rng.vec(64, -100.0, 100.0);
    let a = arr(&x, &[64]);
    // float -> int truncates toward zero, as a C cast does.
    let ints = a.astype(Dtype::I32).unwrap().to_vec::<i32>().unwrap();
    assert_eq!(ints, x.iter().map(|&v| v as i32).collect::<Vec<_>>());
    // float64 exists on the CPU only (MLX has none on the GPU).
    let doubles = mlx_backend::Device::Cpu
        .default_stream()
        .unwrap()
        .scope(|| a.astype(Dtype::F64).unwrap().to_vec::<f64>().unwrap());
    assert_eq!(doubles, to_f64(&x));
    let bools = a.astype(Dtype::Bool).unwrap().to_vec::<bool>().unwrap();
    assert_eq!(bools, x.iter().map(|&v| v != 0.0).collect::<Vec<_>>());
    let back = arr(&[1u8, 200, 0], &[3]).astype(Dtype::F32).unwrap();
    assert_eq!(back.to_vec::<f32>().unwrap(), vec![1.0, 200.0, 0.0]);
}

#[test]
fn contiguous_materialises_views() {
    let mut rng = Rng::new(14);
    let (x, a) = rng.array(&[3, 5]);
    let t = a.transpose(&[]).unwrap().contiguous().unwrap();
    assert_eq!(t.shape(), vec![5, 3]);
    let expected: Vec<f64> = (0..15).map(|i| x[(i % 3) * 5 + i / 3] as f64).collect();
    assert_close(&f32s(&t), &expected, 0.0, 0.0, "contiguous of transpose");
    let s = a
        .slice(&[0, 1], &[3, 5], &[2, 2])
        .unwrap()
        .contiguous()
        .unwrap();
    let expected = [x[1], x[3], x[11], x[13]].map(|v| v as f64);
    assert_close(
        &f32s(&s),
        &expected,
        0.0,
        0.0,
        "contiguous of strided slice",
    );
}

/// An op's result is pending until it is evaluated; host data never is.
#[test]
fn results_are_pending_until_evaluated() {
    let host = Array::from_slice(&[1.0f32, -2.0, 3.0], &[3]).unwrap();
    assert!(!host.is_pending());
    let y = host.abs().unwrap();
    let z = y.add_scalar(1.0).unwrap();
    assert!(y.is_pending() && z.is_pending());
    z.eval().unwrap();
    assert!(!z.is_pending());
    assert!(!y.is_pending(), "evaluated as z's input");
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
}

/// A dense result is lent as MLX's own buffer, equal to its copy; a view
/// (a transpose) is not lent; the element type must match.
#[test]
fn dense_results_are_lent_without_a_copy() {
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let y = x.mul_scalar(2.0).unwrap();
    let lent = y.host_slice::<f32>().unwrap().expect("dense");
    assert_eq!(lent, y.to_vec::<f32>().unwrap().as_slice());
    assert_eq!(lent, &[2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
    let t = y.transpose(&[1, 0]).unwrap();
    assert!(t.host_slice::<f32>().unwrap().is_none());
    assert_eq!(
        t.to_vec::<f32>().unwrap(),
        vec![2.0, 8.0, 4.0, 10.0, 6.0, 12.0]
    );
    assert!(y.host_slice::<u32>().is_err());
}
