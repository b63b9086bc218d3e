//! Shape manipulation, slicing, joining and gathers/scatters against
//! index arithmetic done here on the host copy.

use crate::common::*;
use mlx_backend::ops::{concatenate, split, stack};
use mlx_backend::Array;

/// Permute `data` of `shape` by `axes`, as numpy's transpose.
fn permute(data: &[f32], shape: &[usize], axes: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let out_shape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let n = data.len();
    let out = (0..n)
        .map(|flat| {
            let oi = unravel(flat, &out_shape);
            let mut ii = vec![0; shape.len()];
            for (k, &a) in axes.iter().enumerate() {
                ii[a] = oi[k];
            }
            data[ravel(&ii, shape)] as f64
        })
        .collect();
    (out, out_shape)
}

/// `data[start:stop:step]` per axis.
fn slice_ref(
    data: &[f32],
    shape: &[usize],
    start: &[usize],
    stop: &[usize],
    step: &[usize],
) -> Vec<f64> {
    let out_shape: Vec<usize> = (0..shape.len())
        .map(|i| (stop[i] - start[i]).div_ceil(step[i]))
        .collect();
    (0..out_shape.iter().product())
        .map(|flat| {
            let oi = unravel(flat, &out_shape);
            let ii: Vec<usize> = (0..shape.len())
                .map(|i| start[i] + oi[i] * step[i])
                .collect();
            data[ravel(&ii, shape)] as f64
        })
        .collect()
}

#[test]
fn reshape_flatten_and_broadcast_to() {
    let mut rng = Rng::new(21);
    let (x, a) = rng.array(&[2, 3, 4]);
    let expected = to_f64(&x);
    for shape in [&[24][..], &[4, 6], &[2, 12], &[3, 2, 2, 2], &[-1, 8]] {
        let r = a.reshape(shape).unwrap();
        assert_eq!(r.size(), 24);
        assert_close(
            &f32s(&r),
            &expected,
            0.0,
            0.0,
            "reshape keeps row-major order",
        );
    }
    assert_eq!(a.reshape(&[-1, 8]).unwrap().shape(), vec![3, 8]);
    let f = a.flatten(1, 2).unwrap();
    assert_eq!(f.shape(), vec![2, 12]);
    assert_close(&f32s(&f), &expected, 0.0, 0.0, "flatten");

    let (row, r) = rng.array(&[1, 4]);
    let b = r.broadcast_to(&[3, 4]).unwrap();
    let expected: Vec<f64> = (0..12).map(|i| row[i % 4] as f64).collect();
    assert_close(&f32s(&b), &expected, 0.0, 0.0, "broadcast_to");
}

#[test]
fn transpose_any_permutation() {
    let mut rng = Rng::new(22);
    let (x, a) = rng.array(&[2, 3, 4, 5]);
    let shape = [2, 3, 4, 5];
    for axes in [
        [0, 1, 2, 3],
        [3, 2, 1, 0],
        [1, 0, 3, 2],
        [2, 0, 3, 1],
        [0, 3, 1, 2],
    ] {
        let ax: Vec<i32> = axes.iter().map(|&v| v as i32).collect();
        let t = a.transpose(&ax).unwrap();
        let (expected, out_shape) = permute(&x, &shape, &axes);
        assert_eq!(dims(&t.shape()), out_shape);
        assert_close(&f32s(&t), &expected, 0.0, 0.0, "transpose");
    }
    let (expected, _) = permute(&x, &shape, &[3, 2, 1, 0]);
    assert_close(
        &f32s(&a.transpose(&[]).unwrap()),
        &expected,
        0.0,
        0.0,
        "reverse",
    );
    let (expected, _) = permute(&x, &shape, &[0, 1, 3, 2]);
    assert_close(&f32s(&a.t().unwrap()), &expected, 0.0, 0.0, "t()");
}

#[test]
fn squeeze_and_expand_dims() {
    let mut rng = Rng::new(23);
    let (x, a) = rng.array(&[1, 3, 1, 4]);
    let expected = to_f64(&x);
    let all = a.squeeze(&[]).unwrap();
    assert_eq!(all.shape(), vec![3, 4]);
    assert_close(&f32s(&all), &expected, 0.0, 0.0, "squeeze all");
    assert_eq!(a.squeeze(&[2]).unwrap().shape(), vec![1, 3, 4]);
    assert_eq!(a.squeeze(&[0, -2]).unwrap().shape(), vec![3, 4]);
    let e = all.expand_dims(&[0, 2]).unwrap();
    assert_eq!(e.shape(), vec![1, 3, 1, 4]);
    assert_close(&f32s(&e), &expected, 0.0, 0.0, "expand_dims");
    assert_eq!(all.expand_dims(&[-1]).unwrap().shape(), vec![3, 4, 1]);
}

#[test]
fn static_slices() {
    let mut rng = Rng::new(24);
    let (x, a) = rng.array(&[5, 6, 7]);
    let shape = [5, 6, 7];
    let cases: [([usize; 3], [usize; 3], [usize; 3]); 4] = [
        ([0, 0, 0], [5, 6, 7], [1, 1, 1]),
        ([1, 2, 3], [4, 6, 5], [1, 1, 1]),
        ([0, 1, 0], [5, 6, 7], [2, 3, 2]),
        ([4, 5, 6], [5, 6, 7], [1, 1, 1]),
    ];
    for (start, stop, step) in cases {
        let to_i = |v: [usize; 3]| v.map(|d| d as i32);
        let s = a.slice(&to_i(start), &to_i(stop), &to_i(step)).unwrap();
        let expected = slice_ref(&x, &shape, &start, &stop, &step);
        assert_close(&f32s(&s), &expected, 0.0, 0.0, "slice");
    }
    let s = a.slice_axis(1, 2, 4).unwrap();
    assert_eq!(s.shape(), vec![5, 2, 7]);
    let expected = slice_ref(&x, &shape, &[0, 2, 0], &[5, 4, 7], &[1, 1, 1]);
    assert_close(&f32s(&s), &expected, 0.0, 0.0, "slice_axis");
}

/// `data` with `update` written into the box `start..start+update_shape` (step 1).
fn slice_update_ref(
    data: &[f32],
    shape: &[usize],
    update: &[f32],
    update_shape: &[usize],
    start: &[usize],
) -> Vec<f64> {
    let mut out = to_f64(data);
    for (flat, &u) in update.iter().enumerate() {
        let ui = unravel(flat, update_shape);
        let ii: Vec<usize> = ui.iter().zip(start).map(|(a, b)| a + b).collect();
        out[ravel(&ii, shape)] = u as f64;
    }
    out
}

#[test]
fn slice_update_static_and_strided() {
    let mut rng = Rng::new(25);
    let (x, a) = rng.array(&[4, 6]);
    let (u, ua) = rng.array(&[2, 3]);
    let out = a.slice_update(&ua, &[1, 2], &[3, 5], &[]).unwrap();
    let expected = slice_update_ref(&x, &[4, 6], &u, &[2, 3], &[1, 2]);
    assert_close(&f32s(&out), &expected, 0.0, 0.0, "slice_update");
    // The source is unchanged (functional update).
    assert_close(&f32s(&a), &to_f64(&x), 0.0, 0.0, "source untouched");

    let strided = a.slice_update(&ua, &[0, 0], &[4, 6], &[2, 2]).unwrap();
    let mut expected = to_f64(&x);
    for i in 0..2 {
        for j in 0..3 {
            expected[(2 * i) * 6 + 2 * j] = u[i * 3 + j] as f64;
        }
    }
    assert_close(&f32s(&strided), &expected, 0.0, 0.0, "strided slice_update");
}

#[test]
fn dynamic_slices() {
    let mut rng = Rng::new(26);
    let (x, a) = rng.array(&[6, 8]);
    for (r, c) in [(0, 0), (2, 3), (4, 5)] {
        let start = arr(&[r as i32, c as i32], &[2]);
        let s = a.slice_dynamic(&start, &[0, 1], &[2, 3]).unwrap();
        assert_eq!(s.shape(), vec![2, 3]);
        let expected = slice_ref(&x, &[6, 8], &[r, c], &[r + 2, c + 3], &[1, 1]);
        assert_close(&f32s(&s), &expected, 0.0, 0.0, "slice_dynamic");

        let (u, ua) = rng.array(&[2, 3]);
        let out = a.slice_update_dynamic(&ua, &start, &[0, 1]).unwrap();
        let expected = slice_update_ref(&x, &[6, 8], &u, &[2, 3], &[r, c]);
        assert_close(&f32s(&out), &expected, 0.0, 0.0, "slice_update_dynamic");
    }
    // One axis only: a KV-cache style write at a device-side position.
    let pos = Array::scalar(3i32);
    let (u, ua) = rng.array(&[1, 8]);
    let out = a.slice_update_dynamic(&ua, &pos, &[0]).unwrap();
    let expected = slice_update_ref(&x, &[6, 8], &u, &[1, 8], &[3, 0]);
    assert_close(
        &f32s(&out),
        &expected,
        0.0,
        0.0,
        "slice_update_dynamic one axis",
    );
}

#[test]
fn concatenate_stack_split() {
    let mut rng = Rng::new(27);
    let (x, a) = rng.array(&[2, 3]);
    let (y, b) = rng.array(&[2, 2]);
    let c = concatenate(&[&a, &b], 1).unwrap();
    assert_eq!(c.shape(), vec![2, 5]);
    let expected: Vec<f64> = (0..2)
        .flat_map(|i| {
            x[i * 3..i * 3 + 3]
                .iter()
                .chain(&y[i * 2..i * 2 + 2])
                .map(|&v| v as f64)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_close(&f32s(&c), &expected, 0.0, 0.0, "concatenate axis 1");
    let (z, cz) = rng.array(&[1, 3]);
    let c0 = concatenate(&[&a, &cz], 0).unwrap();
    let expected: Vec<f64> = x.iter().chain(&z).map(|&v| v as f64).collect();
    assert_close(&f32s(&c0), &expected, 0.0, 0.0, "concatenate axis 0");

    let (w, aw) = rng.array(&[2, 3]);
    let s = stack(&[&a, &aw], 1).unwrap();
    assert_eq!(s.shape(), vec![2, 2, 3]);
    let expected: Vec<f64> = (0..2)
        .flat_map(|i| {
            x[i * 3..i * 3 + 3]
                .iter()
                .chain(&w[i * 3..i * 3 + 3])
                .map(|&v| v as f64)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_close(&f32s(&s), &expected, 0.0, 0.0, "stack axis 1");

    let (v, av) = rng.array(&[2, 7]);
    let parts = split(&av, &[2, 5], 1).unwrap();
    let widths = [2, 3, 2];
    let starts = [0, 2, 5];
    assert_eq!(parts.len(), 3);
    for (p, (&w, &s0)) in parts.iter().zip(widths.iter().zip(&starts)) {
        assert_eq!(p.shape(), vec![2, w as i32]);
        let expected: Vec<f64> = (0..2)
            .flat_map(|i| {
                v[i * 7 + s0..i * 7 + s0 + w]
                    .iter()
                    .map(|&t| t as f64)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_close(&f32s(p), &expected, 0.0, 0.0, "split");
    }
}

#[test]
fn take_gathers_rows_and_flat() {
    let mut rng = Rng::new(28);
    let (x, a) = rng.array(&[5, 4]);
    let idx: Vec<u32> = (0..7).map(|_| rng.below(5) as u32).collect();
    let rows = a.take(&arr(&idx, &[7]), 0).unwrap();
    assert_eq!(rows.shape(), vec![7, 4]);
    let expected: Vec<f64> = idx
        .iter()
        .flat_map(|&r| {
            x[r as usize * 4..r as usize * 4 + 4]
                .iter()
                .map(|&v| v as f64)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_close(&f32s(&rows), &expected, 0.0, 0.0, "take axis 0");

    let cols: Vec<i32> = vec![3, 0, 3];
    let t = a.take(&arr(&cols, &[3]), 1).unwrap();
    assert_eq!(t.shape(), vec![5, 3]);
    let expected: Vec<f64> = (0..5)
        .flat_map(|i| cols.iter().map(move |&c| (i, c)))
        .map(|(i, c)| x[i * 4 + c as usize] as f64)
        .collect();
    assert_close(&f32s(&t), &expected, 0.0, 0.0, "take axis 1");

    // A 2-d index array: an embedding lookup of [batch, seq] token ids.
    let ids: Vec<u32> = vec![4, 1, 1, 0, 2, 3];
    let e = a.take(&arr(&ids, &[2, 3]), 0).unwrap();
    assert_eq!(e.shape(), vec![2, 3, 4]);
    let expected: Vec<f64> = ids
        .iter()
        .flat_map(|&r| {
            x[r as usize * 4..r as usize * 4 + 4]
                .iter()
                .map(|&v| v as f64)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_close(&f32s(&e), &expected, 0.0, 0.0, "embedding lookup");
}

#[test]
fn take_and_put_along_axis() {
    let mut rng = Rng::new(29);
    let (x, a) = rng.array(&[4, 6]);
    let idx: Vec<u32> = (0..8).map(|_| rng.below(6) as u32).collect();
    let i = arr(&idx, &[4, 2]);
    let g = a.take_along_axis(&i, 1).unwrap();
    assert_eq!(g.shape(), vec![4, 2]);
    let expected: Vec<f64> = (0..8)
        .map(|k| x[(k / 2) * 6 + idx[k] as usize] as f64)
        .collect();
    assert_close(&f32s(&g), &expected, 0.0, 0.0, "take_along_axis");

    // Distinct column per row so the scatter order cannot matter.
    let cols: Vec<u32> = (0..4).map(|_| rng.below(6) as u32).collect();
    let (vals, va) = rng.array(&[4, 1]);
    let p = a.put_along_axis(&arr(&cols, &[4, 1]), &va, 1).unwrap();
    let mut expected = to_f64(&x);
    for r in 0..4 {
        expected[r * 6 + cols[r] as usize] = vals[r] as f64;
    }
    assert_close(&f32s(&p), &expected, 0.0, 0.0, "put_along_axis");

    // Along axis 0 with broadcasting of values.
    let rows: Vec<i32> = vec![2, 0, 3, 1, 1, 2];
    let p0 = a
        .put_along_axis(&arr(&rows, &[1, 6]), &Array::from_f32(9.0), 0)
        .unwrap();
    let mut expected = to_f64(&x);
    for (c, &r) in rows.iter().enumerate() {
        expected[r as usize * 6 + c] = 9.0;
    }
    assert_close(&f32s(&p0), &expected, 0.0, 0.0, "put_along_axis axis 0");
}
