//! Reductions, arg-reductions, partitions, scans, sorting and softmax
//! against f64 references over the host copy.

use crate::common::*;
use mlx_backend::{Array, Dtype};

const SHAPE: [i32; 3] = [3, 4, 5];

/// Reduce `data` of `shape` over `axes` with `f` applied to each lane's values.
fn reduce_ref(
    data: &[f32],
    shape: &[usize],
    axes: &[usize],
    f: impl Fn(&[f64]) -> f64,
) -> Vec<f64> {
    let out_shape: Vec<usize> = (0..shape.len())
        .map(|i| if axes.contains(&i) { 1 } else { shape[i] })
        .collect();
    let mut lanes: Vec<Vec<f64>> = vec![Vec::new(); out_shape.iter().product()];
    for (flat, &v) in data.iter().enumerate() {
        let mut idx = unravel(flat, shape);
        for &a in axes {
            idx[a] = 0;
        }
        lanes[ravel(&idx, &out_shape)].push(v as f64);
    }
    lanes.iter().map(|l| f(l)).collect()
}

type ReduceOp = fn(&Array, &[i32], bool) -> Result<Array, mlx_backend::OpError>;

fn check_reduce(name: &str, op: ReduceOp, f: fn(&[f64]) -> f64, lo: f64, hi: f64, tol: f64) {
    let mut rng = Rng::new(name.len() as u64 * 37 + 3);
    let (x, a) = rng.array_in(&SHAPE, lo, hi);
    let shape = dims(&SHAPE);
    for axes in [&[0i32][..], &[1], &[2], &[0, 2], &[-1], &[]] {
        let pos: Vec<usize> = if axes.is_empty() {
            vec![0, 1, 2]
        } else {
            axes.iter().map(|&a| a.rem_euclid(3) as usize).collect()
        };
        let expected = reduce_ref(&x, &shape, &pos, f);
        let kept = op(&a, axes, true).unwrap();
        let kept_shape: Vec<i32> = (0..3)
            .map(|i| if pos.contains(&i) { 1 } else { SHAPE[i] })
            .collect();
        assert_eq!(kept.shape(), kept_shape, "{name} keepdims shape");
        assert_close(&f32s(&kept), &expected, tol, tol, name);
        let dropped = op(&a, axes, false).unwrap();
        assert_eq!(dropped.ndim(), 3 - pos.len(), "{name} rank");
        assert_close(&f32s(&dropped), &expected, tol, tol, name);
    }
}

#[test]
fn reductions() {
    check_reduce("sum", Array::sum, |l| l.iter().sum(), -1.0, 1.0, 1e-5);
    check_reduce(
        "mean",
        Array::mean,
        |l| l.iter().sum::<f64>() / l.len() as f64,
        -1.0,
        1.0,
        1e-6,
    );
    check_reduce(
        "max",
        Array::max,
        |l| l.iter().cloned().fold(f64::MIN, f64::max),
        -1.0,
        1.0,
        0.0,
    );
    check_reduce(
        "min",
        Array::min,
        |l| l.iter().cloned().fold(f64::MAX, f64::min),
        -1.0,
        1.0,
        0.0,
    );
    check_reduce("prod", Array::prod, |l| l.iter().product(), 0.5, 1.5, 1e-5);
    check_reduce(
        "logsumexp",
        Array::logsumexp,
        |l| {
            let m = l.iter().cloned().fold(f64::MIN, f64::max);
            m + l.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
        },
        -10.0,
        10.0,
        1e-5,
    );
}

/// Rows of the last axis of a `[rows, n]` view.
fn rows(x: &[f32], n: usize) -> impl Iterator<Item = &[f32]> {
    x.chunks(n)
}

fn argbest(row: &[f32], better: fn(f32, f32) -> bool) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if better(v, row[best]) {
            best = i;
        }
    }
    best as u32
}

#[test]
fn argmax_argmin() {
    let mut rng = Rng::new(31);
    let (x, a) = rng.array(&[6, 9]);
    let amax = a.argmax(-1, false).unwrap();
    assert_eq!(amax.dtype(), Dtype::U32);
    let expected: Vec<u32> = rows(&x, 9).map(|r| argbest(r, |v, b| v > b)).collect();
    assert_eq!(u32s(&amax), expected);
    let expected: Vec<u32> = rows(&x, 9).map(|r| argbest(r, |v, b| v < b)).collect();
    assert_eq!(u32s(&a.argmin(1, false).unwrap()), expected);
    // Along axis 0, keeping the axis.
    let col = a.argmax(0, true).unwrap();
    assert_eq!(col.shape(), vec![1, 9]);
    let expected: Vec<u32> = (0..9)
        .map(|c| {
            argbest(&(0..6).map(|r| x[r * 9 + c]).collect::<Vec<_>>(), |v, b| {
                v > b
            })
        })
        .collect();
    assert_eq!(u32s(&col), expected);
}

#[test]
fn argpartition_partitions() {
    let mut rng = Rng::new(32);
    let n = 17;
    let (x, a) = rng.array(&[5, n as i32]);
    for kth in [0, 3, 8, 16] {
        let p = u32s(&a.argpartition(kth, -1).unwrap());
        for (r, row) in rows(&x, n).enumerate() {
            let idx = &p[r * n..(r + 1) * n];
            let mut seen = idx.to_vec();
            seen.sort();
            assert_eq!(seen, (0..n as u32).collect::<Vec<_>>(), "a permutation");
            let mut sorted = row.to_vec();
            sorted.sort_by(f32::total_cmp);
            let pivot = row[idx[kth as usize] as usize];
            assert_eq!(
                pivot, sorted[kth as usize],
                "kth element in its sorted place"
            );
            for (j, &i) in idx.iter().enumerate() {
                let v = row[i as usize];
                if j < kth as usize {
                    assert!(v <= pivot, "left of kth is not larger");
                } else {
                    assert!(v >= pivot, "right of kth is not smaller");
                }
            }
        }
    }
}

#[test]
fn topk_is_the_largest_set() {
    let mut rng = Rng::new(33);
    let n = 20;
    let (x, a) = rng.array(&[4, n as i32]);
    for k in [1, 5, 20] {
        let t = a.topk(k, -1).unwrap();
        assert_eq!(t.shape(), vec![4, k]);
        let got = f32s(&t);
        for (r, row) in rows(&x, n).enumerate() {
            let mut expected = row.to_vec();
            expected.sort_by(|a, b| b.total_cmp(a));
            expected.truncate(k as usize);
            expected.sort_by(f32::total_cmp);
            let mut set = got[r * k as usize..(r + 1) * k as usize].to_vec();
            set.sort_by(f32::total_cmp);
            assert_eq!(set, expected, "row {r}, k {k}");
        }
    }
}

#[test]
fn cumsum_variants() {
    let mut rng = Rng::new(34);
    let (x, a) = rng.array(&[3, 6]);
    for (reverse, inclusive) in [(false, true), (false, false), (true, true), (true, false)] {
        let c = a.cumsum(1, reverse, inclusive).unwrap();
        let expected: Vec<f64> = rows(&x, 6)
            .flat_map(|row| {
                (0..6)
                    .map(|j| {
                        let range: Vec<usize> = match (reverse, inclusive) {
                            (false, true) => (0..=j).collect(),
                            (false, false) => (0..j).collect(),
                            (true, true) => (j..6).collect(),
                            (true, false) => (j + 1..6).collect(),
                        };
                        range.iter().map(|&i| row[i] as f64).sum()
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_close(&f32s(&c), &expected, 1e-6, 1e-6, "cumsum");
    }
    let down = a.cumsum(0, false, true).unwrap();
    let expected: Vec<f64> = (0..18)
        .map(|i| (0..=i / 6).map(|r| x[r * 6 + i % 6] as f64).sum())
        .collect();
    assert_close(&f32s(&down), &expected, 1e-6, 1e-6, "cumsum axis 0");
}

#[test]
fn sort_and_argsort() {
    let mut rng = Rng::new(35);
    let n = 11;
    let (x, a) = rng.array(&[4, n as i32]);
    let sorted = f32s(&a.sort(-1).unwrap());
    let order = u32s(&a.argsort(-1).unwrap());
    for (r, row) in rows(&x, n).enumerate() {
        let mut expected = row.to_vec();
        expected.sort_by(f32::total_cmp);
        assert_eq!(&sorted[r * n..(r + 1) * n], &expected[..]);
        let via_order: Vec<f32> = order[r * n..(r + 1) * n]
            .iter()
            .map(|&i| row[i as usize])
            .collect();
        assert_eq!(via_order, expected, "argsort orders the row");
    }
    let cols = f32s(&a.sort(0).unwrap());
    for c in 0..n {
        let mut expected: Vec<f32> = (0..4).map(|r| x[r * n + c]).collect();
        expected.sort_by(f32::total_cmp);
        let got: Vec<f32> = (0..4).map(|r| cols[r * n + c]).collect();
        assert_eq!(got, expected, "sort along axis 0");
    }
}

#[test]
fn softmax_rows() {
    let mut rng = Rng::new(36);
    let (x, a) = rng.array_in(&[5, 13], -8.0, 8.0);
    let expected: Vec<f64> = rows(&x, 13).flat_map(|r| softmax(&to_f64(r))).collect();
    assert_close(
        &f32s(&a.softmax(&[-1], false).unwrap()),
        &expected,
        1e-6,
        1e-5,
        "softmax",
    );
    assert_close(
        &f32s(&a.softmax(&[1], true).unwrap()),
        &expected,
        1e-6,
        1e-5,
        "precise softmax",
    );
    // Over both axes at once: one distribution over all 65 values.
    let all = softmax(&to_f64(&x));
    assert_close(
        &f32s(&a.softmax(&[0, 1], false).unwrap()),
        &all,
        1e-7,
        1e-5,
        "softmax over all",
    );
    // Large logits do not overflow.
    let big = arr(&[1000.0f32, 999.0, 998.0], &[3]);
    let expected = softmax(&[1000.0, 999.0, 998.0]);
    assert_close(
        &f32s(&big.softmax(&[0], false).unwrap()),
        &expected,
        1e-6,
        1e-5,
        "stable softmax",
    );
    // f16 input with precise accumulation.
    let h = a.astype(Dtype::F16).unwrap();
    let hx: Vec<f64> = f32s(&h).iter().map(|&v| v as f64).collect();
    let expected: Vec<f64> = hx.chunks(13).flat_map(softmax).collect();
    assert_close(
        &f32s(&h.softmax(&[-1], true).unwrap()),
        &expected,
        1e-3,
        1e-2,
        "f16 softmax",
    );
}
