//! Create/compute/eval/drop cycles, and dropped unevaluated graphs, leave
//! MLX's active memory at its baseline. One test per concern, run one at a
//! time (active memory is process-wide).

mod common;

use common::*;
use mlx_backend::ops::{quantize, random};
use mlx_backend::{Array, Dtype};
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

const CYCLES: usize = 10_000;

/// Build a small graph from fresh host data: a matmul, a softmax, a
/// reduction, a quantized product and a random draw; return what to eval.
fn build(rng: &mut Rng, i: usize) -> (Array, Array) {
    let (_, a) = rng.array(&[8, 32]);
    let (_, w) = rng.array(&[16, 32]);
    let h = a
        .matmul(&w.t().unwrap())
        .unwrap()
        .softmax(&[-1], false)
        .unwrap();
    let q = quantize(&w, 32, 4).unwrap();
    let qm = q.matmul(&a, true).unwrap().sum(&[], false).unwrap();
    let key = random::key(i as u64).unwrap();
    let noise = random::normal(&[4], Dtype::F32, 0.0, 1.0, Some(&key)).unwrap();
    (h.add(&qm).unwrap(), noise)
}

fn cycle(rng: &mut Rng, i: usize) {
    let (out, noise) = build(rng, i);
    mlx_backend::eval(&[&out, &noise]).unwrap();
    assert_eq!(out.shape(), vec![8, 16]);
    let s = out.sum(&[], false).unwrap().item::<f32>().unwrap();
    assert!(s.is_finite());
}

#[test]
fn evaluated_cycles_do_not_leak() {
    let _guard = SERIAL.lock().unwrap();
    let mut rng = Rng::new(81);
    cycle(&mut rng, 0);
    let baseline = settled_active_memory();
    // The measure sees live arrays.
    let held = rng.array(&[1024]).1.exp().unwrap();
    held.eval().unwrap();
    assert!(settled_active_memory() >= baseline + 4096);
    drop(held);
    assert_eq!(settled_active_memory(), baseline);
    for i in 1..=CYCLES {
        cycle(&mut rng, i);
    }
    assert_eq!(settled_active_memory(), baseline, "after {CYCLES} cycles");
}

#[test]
fn dropped_unevaluated_graphs_do_not_leak() {
    let _guard = SERIAL.lock().unwrap();
    let mut rng = Rng::new(82);
    cycle(&mut rng, 0);
    let baseline = settled_active_memory();
    for i in 1..=CYCLES {
        let (out, noise) = build(&mut rng, i);
        // Half the time evaluate part of the graph, then drop the rest unevaluated.
        if i % 2 == 0 {
            noise.eval().unwrap();
        }
        drop((out, noise));
    }
    assert_eq!(
        settled_active_memory(),
        baseline,
        "after {CYCLES} dropped graphs"
    );
}

#[test]
fn failed_ops_and_evals_do_not_leak() {
    let _guard = SERIAL.lock().unwrap();
    let mut rng = Rng::new(83);
    cycle(&mut rng, 0);
    let baseline = settled_active_memory();
    for _ in 0..1000 {
        let (_, a) = rng.array(&[4, 8]);
        assert!(a.matmul(&a).is_err());
        assert!(a.reshape(&[3, 3]).is_err());
        let huge = Array::zeros(&[1 << 20, 1 << 21], Dtype::F32).unwrap();
        assert!(huge
            .add(&a.sum(&[], false).unwrap())
            .unwrap()
            .eval()
            .is_err());
    }
    assert_eq!(settled_active_memory(), baseline, "after failed calls");
}
