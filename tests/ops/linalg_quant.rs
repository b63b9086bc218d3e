//! Matrix products (batched, broadcast, gathered) and affine quantization.
//! Dequantization is checked against this file's own unpacking of the packed
//! uint32 words; quantized products against `x · dequantized(W)ᵀ` in f64.

use crate::common::*;
use mlx_backend::ops::{quantize, Quantized};
use mlx_backend::Dtype;

/// Batched `a @ b` with NumPy broadcasting of the batch axes, in f64.
fn batched_matmul_ref(a: &[f32], sa: &[usize], b: &[f32], sb: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let n = sb[sb.len() - 1];
    assert_eq!(sb[sb.len() - 2], k);
    let (ba, bb) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
    let batch = broadcast_shapes(ba, bb);
    let nb: usize = batch.iter().product();
    let mut out = Vec::with_capacity(nb * m * n);
    for flat in 0..nb {
        let idx = unravel(flat, &batch);
        let ia = broadcast_source(&idx, ba);
        let ib = broadcast_source(&idx, bb);
        let am = to_f64(&a[ia * m * k..(ia + 1) * m * k]);
        let bm = to_f64(&b[ib * k * n..(ib + 1) * k * n]);
        out.extend(matmul_ref(&am, &bm, m, k, n));
    }
    let mut shape = batch;
    shape.extend([m, n]);
    (out, shape)
}

#[test]
fn matmul_plain_batched_and_broadcast() {
    let mut rng = Rng::new(41);
    let cases: [(&[i32], &[i32]); 5] = [
        (&[3, 7], &[7, 5]),
        (&[1, 64], &[64, 33]),
        (&[2, 3, 4, 5], &[2, 3, 5, 6]),
        (&[4, 5], &[3, 5, 6]),
        (&[2, 1, 4, 5], &[3, 5, 6]),
    ];
    for (sa, sb) in cases {
        let (a, xa) = rng.array(sa);
        let (b, xb) = rng.array(sb);
        let out = xa.matmul(&xb).unwrap();
        let (expected, shape) = batched_matmul_ref(&a, &dims(sa), &b, &dims(sb));
        assert_eq!(dims(&out.shape()), shape, "{sa:?} @ {sb:?}");
        assert_close(&f32s(&out), &expected, 1e-5, 1e-5, "matmul");
    }
    // Transposed (non-contiguous) operands.
    let (a, xa) = rng.array(&[6, 4]);
    let (b, xb) = rng.array(&[5, 6]);
    let out = xa.t().unwrap().matmul(&xb.t().unwrap()).unwrap();
    let at: Vec<f64> = (0..24).map(|i| a[(i % 6) * 4 + i / 6] as f64).collect();
    let bt: Vec<f64> = (0..30).map(|i| b[(i % 5) * 6 + i / 5] as f64).collect();
    assert_close(
        &f32s(&out),
        &matmul_ref(&at, &bt, 4, 6, 5),
        1e-5,
        1e-5,
        "matmul of views",
    );
}

/// Unpack MLX's affine-quantized matrix by hand: `w[n,k] = scale * q + bias`,
/// `q = (word >> (bits * j)) & mask`, element `j` of each word in the low bits first.
fn unpack(q: &Quantized) -> Vec<f64> {
    let words = u32s(&q.weight);
    let scales = f32s(&q.scales);
    let biases = f32s(&q.biases);
    let shape = q.weight.shape();
    let rows: usize = shape[..shape.len() - 1]
        .iter()
        .map(|&d| d as usize)
        .product();
    let per_word = 32 / q.bits as usize;
    let k = *shape.last().unwrap() as usize * per_word;
    let groups = k / q.group_size as usize;
    let mask = (1u32 << q.bits) - 1;
    let mut out = Vec::with_capacity(rows * k);
    for r in 0..rows {
        for c in 0..k {
            let word = words[r * (k / per_word) + c / per_word];
            let j = c % per_word;
            let level = (word >> (q.bits as usize * j)) & mask;
            let g = r * groups + c / q.group_size as usize;
            out.push(scales[g] as f64 * level as f64 + biases[g] as f64);
        }
    }
    out
}

/// Quantize fresh `[.., n, k]` weights; check the packed shapes and the
/// unpacking, and return the host weights, the quantized form and the unpacked values.
fn quantize_checked(
    rng: &mut Rng,
    shape: &[i32],
    group: i32,
    bits: i32,
) -> (Vec<f32>, Quantized, Vec<f64>) {
    let (w, wa) = rng.array(shape);
    let q = quantize(&wa, group, bits).unwrap();
    let k = *shape.last().unwrap();
    let lead = &shape[..shape.len() - 1];
    assert_eq!(q.weight.dtype(), Dtype::U32);
    assert_eq!(q.weight.shape(), [lead, &[k * bits / 32]].concat());
    assert_eq!(q.scales.shape(), [lead, &[k / group]].concat());
    assert_eq!(q.biases.shape(), q.scales.shape());
    let unpacked = unpack(&q);
    let deq = q.dequantize().unwrap();
    assert_eq!(deq.shape(), shape.to_vec());
    assert_close(
        &f32s(&deq),
        &unpacked,
        1e-6,
        1e-6,
        "dequantize vs unpacking",
    );
    // The round trip is within one quantization step of the original (MLX
    // snaps the grid so that zero is exact, so the error can exceed half a step).
    let scales = f32s(&q.scales);
    for (i, (&orig, &back)) in w.iter().zip(&unpacked).enumerate() {
        let step = scales[i / group as usize].abs() as f64;
        assert!(
            (orig as f64 - back).abs() <= step + 1e-5,
            "element {i}: {orig} vs {back}"
        );
    }
    (w, q, unpacked)
}

#[test]
fn quantize_dequantize_matches_unpacking() {
    let mut rng = Rng::new(42);
    for bits in [2, 4, 8] {
        for group in [32, 64, 128] {
            quantize_checked(&mut rng, &[16, 256], group, bits);
        }
    }
    // A stack of matrices (MoE experts).
    quantize_checked(&mut rng, &[3, 8, 64], 32, 4);
}

#[test]
fn quantized_matmul_against_f64() {
    let mut rng = Rng::new(43);
    let (n, k) = (24usize, 128usize);
    for bits in [2, 4, 8] {
        for group in [32, 64] {
            let (_, q, deq) = quantize_checked(&mut rng, &[n as i32, k as i32], group, bits);
            let (x, xa) = rng.array(&[2, 3, k as i32]);
            let out = q.matmul(&xa, true).unwrap();
            assert_eq!(out.shape(), vec![2, 3, n as i32]);
            // x · Wᵀ: transpose the unpacked [n, k] into [k, n].
            let wt: Vec<f64> = (0..k * n).map(|i| deq[(i % n) * k + i / n]).collect();
            let expected = matmul_ref(&to_f64(&x), &wt, 6, k, n);
            assert_close(
                &f32s(&out),
                &expected,
                1e-4,
                1e-4,
                "quantized_matmul transposed",
            );
        }
    }
    // Untransposed: W is [k, n] quantized along n, and x · W.
    let (_, q, deq) = quantize_checked(&mut rng, &[64, 96], 32, 4);
    let (x, xa) = rng.array(&[5, 64]);
    let out = q.matmul(&xa, false).unwrap();
    assert_eq!(out.shape(), vec![5, 96]);
    assert_close(
        &f32s(&out),
        &matmul_ref(&to_f64(&x), &deq, 5, 64, 96),
        1e-4,
        1e-4,
        "quantized_matmul",
    );
}

#[test]
fn gather_qmm_picks_experts() {
    let mut rng = Rng::new(44);
    let (e, n, k) = (4usize, 16usize, 64usize);
    let (_, q, deq) = quantize_checked(&mut rng, &[e as i32, n as i32, k as i32], 32, 4);
    let tokens = 5;
    let (x, xa) = rng.array(&[tokens as i32, 1, k as i32]);
    let experts: Vec<u32> = (0..tokens).map(|_| rng.below(e) as u32).collect();
    let out = q
        .gather_matmul(
            &xa,
            None,
            Some(&arr(&experts, &[tokens as i32])),
            true,
            false,
        )
        .unwrap();
    assert_eq!(out.shape(), vec![tokens as i32, 1, n as i32]);
    let expected: Vec<f64> = (0..tokens)
        .flat_map(|t| {
            let w = &deq[experts[t] as usize * n * k..(experts[t] as usize + 1) * n * k];
            let row = &x[t * k..(t + 1) * k];
            (0..n)
                .map(|j| (0..k).map(|p| row[p] as f64 * w[j * k + p]).sum::<f64>())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_close(&f32s(&out), &expected, 1e-4, 1e-4, "gather_qmm");

    // Gathering the activations too; sorted expert ids.
    let lhs: Vec<u32> = vec![4, 4, 0, 2, 1, 3];
    let rhs: Vec<u32> = vec![0, 1, 1, 2, 3, 3];
    let out = q
        .gather_matmul(
            &xa,
            Some(&arr(&lhs, &[6])),
            Some(&arr(&rhs, &[6])),
            true,
            true,
        )
        .unwrap();
    assert_eq!(out.shape(), vec![6, 1, n as i32]);
    let expected: Vec<f64> = lhs
        .iter()
        .zip(&rhs)
        .flat_map(|(&l, &r)| {
            let w = &deq[r as usize * n * k..(r as usize + 1) * n * k];
            let row = &x[l as usize * k..(l as usize + 1) * k];
            (0..n)
                .map(|j| (0..k).map(|p| row[p] as f64 * w[j * k + p]).sum::<f64>())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_close(
        &f32s(&out),
        &expected,
        1e-4,
        1e-4,
        "gather_qmm with lhs indices",
    );
}

#[test]
fn gather_mm_picks_matrices() {
    // On the CPU stream: MLX 0.32.4's CUDA gather_mm faults ("misaligned
    // address", which leaves the CUDA context unusable) on these small odd
    // shapes (docs/gpu.md); the binding is what is under test here.
    mlx_backend::Device::Cpu
        .default_stream()
        .unwrap()
        .scope(gather_mm_cases);
}

fn gather_mm_cases() {
    let mut rng = Rng::new(45);
    let (e, m, k, n) = (3usize, 2usize, 8usize, 5usize);
    let (a, xa) = rng.array(&[4, m as i32, k as i32]);
    let (b, xb) = rng.array(&[e as i32, k as i32, n as i32]);
    let lhs: Vec<u32> = vec![3, 0, 1, 1, 2];
    let rhs: Vec<u32> = vec![2, 2, 0, 1, 0];
    let out = xa
        .gather_mm(&xb, Some(&arr(&lhs, &[5])), Some(&arr(&rhs, &[5])), false)
        .unwrap();
    assert_eq!(out.shape(), vec![5, m as i32, n as i32]);
    let expected: Vec<f64> = lhs
        .iter()
        .zip(&rhs)
        .flat_map(|(&l, &r)| {
            let am = to_f64(&a[l as usize * m * k..(l as usize + 1) * m * k]);
            let bm = to_f64(&b[r as usize * k * n..(r as usize + 1) * k * n]);
            matmul_ref(&am, &bm, m, k, n)
        })
        .collect();
    assert_close(&f32s(&out), &expected, 1e-5, 1e-5, "gather_mm");

    // Only the right-hand side gathered: one activation matrix per index.
    let (a1, xa1) = rng.array(&[3, m as i32, k as i32]);
    let rhs: Vec<u32> = vec![1, 0, 2];
    let out = xa1
        .gather_mm(&xb, None, Some(&arr(&rhs, &[3])), false)
        .unwrap();
    let expected: Vec<f64> = rhs
        .iter()
        .enumerate()
        .flat_map(|(i, &r)| {
            let am = to_f64(&a1[i * m * k..(i + 1) * m * k]);
            let bm = to_f64(&b[r as usize * k * n..(r as usize + 1) * k * n]);
            matmul_ref(&am, &bm, m, k, n)
        })
        .collect();
    assert_close(&f32s(&out), &expected, 1e-5, 1e-5, "gather_mm rhs only");
}

/// Half-precision x over half-precision scales, with K one group (MLX's
/// CUDA backend picks a kernel of its own for that shape: the op works
/// around its wrong results) and with several groups, batched and not.
#[test]
fn quantized_with_half_activations() {
    let mut rng = Rng::new(46);
    for dtype in [Dtype::BF16, Dtype::F16] {
        for (lead, k, group) in [
            (vec![3], 64, 64),
            (vec![2, 5], 128, 128),
            (vec![3], 256, 64),
        ] {
            let n = 32;
            let (_, wa) = rng.array(&[n, k]);
            let q = quantize(&wa.astype(dtype).unwrap(), group, 4).unwrap();
            assert_eq!(q.scales.dtype(), dtype);
            let deq = unpack(&q);
            let shape: Vec<i32> = lead.iter().copied().chain([k]).collect();
            let rows = lead.iter().product::<i32>() as usize;
            let (_, xa) = rng.array(&shape);
            let xh = xa.astype(dtype).unwrap();
            let xr: Vec<f64> = f32s(&xh).iter().map(|&v| v as f64).collect();
            let out = q.matmul(&xh, true).unwrap();
            assert_eq!(out.dtype(), dtype);
            let (n, k) = (n as usize, k as usize);
            let wt: Vec<f64> = (0..k * n).map(|i| deq[(i % n) * k + i / n]).collect();
            // Whole-output error: MLX's CPU body rounds its partial sums to
            // x's type, so single elements drift by a few bf16 ulps; a
            // wrong kernel is off by the signal itself.
            let want = matmul_ref(&xr, &wt, rows, k, n);
            let got = f32s(&out);
            let (num, den) = got.iter().zip(&want).fold((0.0, 0.0), |(a, b), (&g, &w)| {
                (a + (g as f64 - w).powi(2), b + w * w)
            });
            let err = (num / den).sqrt();
            if std::env::var("SHOW_ERR").is_ok() {
                eprintln!("{dtype} x {shape:?} group {group}: {err:.2e}");
            }
            // MLX's CPU body: ~1.5e-2 in bf16, ~2e-3 in f16 on these shapes.
            let bound = if dtype == Dtype::BF16 { 4e-2 } else { 5e-3 };
            assert!(
                err < bound,
                "{dtype} quantized_matmul x {shape:?} group {group}: norm rel err {err:e}"
            );
        }
    }
}
