//! Two threads build and evaluate graphs at the same time, each on a stream
//! of its own, and each gets its own right answers.

mod common;

use common::*;
use mlx_backend::ops::quantize;
use mlx_backend::Device;

const ITERATIONS: usize = 300;

/// One iteration: `softmax(x @ w) * 2 + 1` and a quantized product, against f64.
fn iteration(rng: &mut Rng) {
    let (m, k, n) = (4, 32, 8);
    let (x, xa) = rng.array(&[m as i32, k as i32]);
    let (w, wa) = rng.array(&[k as i32, n as i32]);
    let out = xa
        .matmul(&wa)
        .and_then(|y| y.softmax(&[-1], false))
        .and_then(|y| y.mul_scalar(2.0))
        .and_then(|y| y.add_scalar(1.0))
        .unwrap();
    let logits = matmul_ref(&to_f64(&x), &to_f64(&w), m, k, n);
    let expected: Vec<f64> = logits
        .chunks(n)
        .flat_map(softmax)
        .map(|p| p * 2.0 + 1.0)
        .collect();
    assert_close(&f32s(&out), &expected, 1e-5, 1e-5, "softmax(x @ w) * 2 + 1");

    let q = quantize(&wa.t().unwrap(), 32, 8).unwrap();
    let deq = to_f64(&f32s(&q.dequantize().unwrap()));
    let qm = q.matmul(&xa, true).unwrap();
    let wt: Vec<f64> = (0..k * n).map(|i| deq[(i % n) * k + i / n]).collect();
    assert_close(
        &f32s(&qm),
        &matmul_ref(&to_f64(&x), &wt, m, k, n),
        1e-4,
        1e-4,
        "qmm",
    );
}

fn worker(seed: u64) -> usize {
    let stream = Device::Cpu.new_stream().expect("a CPU stream");
    let mut rng = Rng::new(seed);
    stream.scope(|| {
        assert_eq!(mlx_backend::Stream::current(), stream);
        for _ in 0..ITERATIONS {
            iteration(&mut rng);
        }
    });
    stream.synchronize().unwrap();
    stream.index() as usize
}

#[test]
fn two_threads_two_streams() {
    let a = std::thread::spawn(|| worker(91));
    let b = std::thread::spawn(|| worker(92));
    let (sa, sb) = (a.join().unwrap(), b.join().unwrap());
    assert_ne!(sa, sb, "each thread had its own stream");
}

#[test]
fn threads_on_default_streams() {
    let handles: Vec<_> = (0..2)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = Rng::new(100 + t);
                for _ in 0..ITERATIONS / 3 {
                    iteration(&mut rng);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
