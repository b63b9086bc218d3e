//! Shared helpers for the integration tests: a seeded xorshift generator for
//! fresh inputs, row-major index arithmetic for plain-Rust references, and
//! tolerance checks. Nothing here calls MLX except to build input arrays.

#![allow(dead_code)]

use mlx_backend::{Array, Element};

/// xorshift64*: small, seeded, good enough for test inputs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// An index in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `n` f32 values uniform in [lo, hi).
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi) as f32).collect()
    }

    /// `n` values in [-1, 1) shaped `shape`, as an f32 array, with the host copy.
    pub fn array(&mut self, shape: &[i32]) -> (Vec<f32>, Array) {
        self.array_in(shape, -1.0, 1.0)
    }

    pub fn array_in(&mut self, shape: &[i32], lo: f64, hi: f64) -> (Vec<f32>, Array) {
        let data = self.vec(numel(shape), lo, hi);
        let a = arr(&data, shape);
        (data, a)
    }
}

pub fn numel(shape: &[i32]) -> usize {
    shape.iter().map(|&d| d as usize).product()
}

/// An array from host data (panics on a length mismatch: a test bug).
pub fn arr<T: Element>(data: &[T], shape: &[i32]) -> Array {
    Array::from_slice(data, shape).expect("host data matches shape")
}

pub fn f32s(a: &Array) -> Vec<f32> {
    a.to_f32_vec().expect("array evaluates")
}

pub fn u32s(a: &Array) -> Vec<u32> {
    a.to_vec::<u32>().expect("array is uint32")
}

pub fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Row-major strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

pub fn dims(shape: &[i32]) -> Vec<usize> {
    shape.iter().map(|&d| d as usize).collect()
}

/// The multi-index of flat position `flat` in `shape`.
pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for i in (0..shape.len()).rev() {
        idx[i] = flat % shape[i];
        flat /= shape[i];
    }
    idx
}

pub fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(strides(shape)).map(|(i, s)| i * s).sum()
}

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = if i + a.len() >= n {
                a[i + a.len() - n]
            } else {
                1
            };
            let db = if i + b.len() >= n {
                b[i + b.len() - n]
            } else {
                1
            };
            assert!(da == db || da == 1 || db == 1, "shapes do not broadcast");
            da.max(db)
        })
        .collect()
}

/// The flat position in an operand of `shape` read by output index `out_idx` under broadcasting.
pub fn broadcast_source(out_idx: &[usize], shape: &[usize]) -> usize {
    let skip = out_idx.len() - shape.len();
    let idx: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if d == 1 { 0 } else { out_idx[skip + i] })
        .collect();
    ravel(&idx, shape)
}

/// `f(a, b)` elementwise with broadcasting, in f64; returns values and shape.
pub fn broadcast_binary(
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> (Vec<f64>, Vec<usize>) {
    let out_shape = broadcast_shapes(a_shape, b_shape);
    let n: usize = out_shape.iter().product();
    let out = (0..n)
        .map(|flat| {
            let idx = unravel(flat, &out_shape);
            let x = a[broadcast_source(&idx, a_shape)] as f64;
            let y = b[broadcast_source(&idx, b_shape)] as f64;
            f(x, y)
        })
        .collect();
    (out, out_shape)
}

/// Assert `|actual - expected| <= atol + rtol * |expected|` everywhere.
#[track_caller]
pub fn assert_close(actual: &[f32], expected: &[f64], atol: f64, rtol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let a = a as f64;
        let ok = (a - e).abs() <= atol + rtol * e.abs() || (a.is_nan() && e.is_nan());
        assert!(ok, "{what}: element {i}: got {a}, expected {e}");
    }
}

/// The erf function in f64 (Maclaurin series; accurate to ~1e-12 for |x| <= 4).
pub fn erf(x: f64) -> f64 {
    if x.abs() > 4.0 {
        return x.signum();
    }
    let mut term = x;
    let mut sum = x;
    for n in 1..200 {
        term *= -x * x / n as f64;
        let add = term / (2 * n + 1) as f64;
        sum += add;
        if add.abs() < 1e-17 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Softmax of one row, in f64.
pub fn softmax(row: &[f64]) -> Vec<f64> {
    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = row.iter().map(|x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// Dense `a[m,k] @ b[k,n]` in f64.
pub fn matmul_ref(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    out
}

/// A fresh empty directory under the system temp dir, unique per call, named
/// `mlx-backend-test-<tag>-XXXXXX`. It is removed when the returned guard
/// drops, so keep it alive for as long as the test uses the folder (use
/// `.path()` where a path is needed); unwinding from a failed assertion drops
/// it too.
pub fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("mlx-backend-test-{tag}-"))
        .tempdir()
        .expect("create temp dir")
}

/// After an error, the process must still compute: a small sum checked exactly.
#[track_caller]
pub fn assert_still_works() {
    let a = arr(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    let b = arr(&[10.0f32, 20.0], &[2]);
    let c = a.add(&b).and_then(|c| c.matmul(&a)).expect("ops build");
    assert_eq!(
        c.to_vec::<f32>().expect("evaluates"),
        vec![77.0, 110.0, 85.0, 122.0]
    );
}

pub mod runs;
pub mod tiny;

/// MLX's active memory once the default device's queued work has finished:
/// on a GPU, the buffers a kernel read are released by the stream's
/// completion handlers, after `eval` has returned.
pub fn settled_active_memory() -> usize {
    mlx_backend::Device::default_device()
        .default_stream()
        .and_then(|s| s.synchronize())
        .expect("synchronize the default stream");
    mlx_backend::memory::active_memory()
}
