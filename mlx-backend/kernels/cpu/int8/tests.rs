//! The int8 dot products against (a) an independent scalar reference that
//! quantizes x the same way and dots the dequantized weights with the
//! dequantized x in f64 (integer sums are exact: tight bound) and (b) the
//! exact f64 dot product with x itself (loose bound), for every tier this
//! CPU has.

use super::*;
use crate::kernels::cpu::test_util::Rng;
use half::{bf16, f16};

struct Weights<P> {
    w: Vec<u32>,
    scales: Vec<P>,
    biases: Vec<P>,
    lay: Layout,
}

impl<P: Element> Weights<P> {
    fn random(rng: &mut Rng, n: usize, k: usize, bits: u32, group: usize) -> Self {
        let lay = Layout::new(bits, group, n, k).unwrap();
        let max_q = ((1u32 << bits) - 1) as f32;
        Weights {
            w: (0..n * lay.words_per_row).map(|_| rng.next_u32()).collect(),
            scales: rng.elems(n * lay.groups_per_row, 0.3 / max_q),
            biases: rng.elems(n * lay.groups_per_row, 0.15),
            lay,
        }
    }
    fn view(&self) -> QView<'_, P> {
        QView::new("w", &self.w, &self.scales, &self.biases, self.lay, 1).unwrap()
    }
    fn q(&self, row: usize, col: usize) -> u32 {
        let bits = self.lay.bits as usize;
        let word = self.w[row * self.lay.words_per_row + col * bits / 32];
        (word >> (bits * (col % (32 / bits)))) & ((1 << bits) - 1)
    }
    fn group(&self, row: usize, col: usize) -> usize {
        row * self.lay.groups_per_row + col / self.lay.group_size
    }
}

/// x quantized per block in natural order, written independently of the kernel.
fn reference_q8(x: &[f32]) -> (Vec<i32>, Vec<f32>) {
    let (mut q, mut d) = (Vec::new(), Vec::new());
    for block in x.chunks(BLOCK) {
        let amax = block.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
        let db = amax / 127.0;
        let inv = if db == 0.0 { 0.0 } else { 1.0 / db };
        q.extend(block.iter().map(|v| (v * inv).round_ties_even() as i32));
        d.push(db);
    }
    (q, d)
}

/// `(value, Σ|terms|)` of the int8 dot product of `x` with weight row `row`.
fn reference_int8<P: Element>(w: &Weights<P>, row: usize, x: &[f32]) -> (f64, f64) {
    let (q, d) = reference_q8(x);
    let (mut value, mut size) = (0.0f64, 0.0f64);
    for (b, db) in d.iter().enumerate() {
        let isum: i64 = (b * BLOCK..(b + 1) * BLOCK)
            .map(|c| w.q(row, c) as i64 * q[c] as i64)
            .sum();
        let scale = w.scales[w.group(row, b * BLOCK)].to_f32() as f64;
        let t = scale * *db as f64 * isum as f64;
        value += t;
        size += t.abs();
    }
    // The bias meets the dequantized x too: Σ bias·d·q over each group.
    let per_block = w.lay.group_size / BLOCK;
    for (g, qs) in q.chunks(w.lay.group_size).enumerate() {
        let sum: f64 = qs
            .chunks(BLOCK)
            .zip(&d[g * per_block..])
            .map(|(qb, &db)| db as f64 * qb.iter().sum::<i32>() as f64)
            .sum();
        let t = w.biases[w.group(row, g * w.lay.group_size)].to_f32() as f64 * sum;
        value += t;
        size += t.abs();
    }
    (value, size)
}

/// `(value, Σ|w·x|)` of the exact dot product with the dequantized row.
fn reference_exact<P: Element>(w: &Weights<P>, row: usize, x: &[f32]) -> (f64, f64) {
    let (mut value, mut size) = (0.0f64, 0.0f64);
    for (c, &xv) in x.iter().enumerate() {
        let gi = w.group(row, c);
        let wv = w.scales[gi].to_f32() as f64 * w.q(row, c) as f64 + w.biases[gi].to_f32() as f64;
        value += wv * xv as f64;
        size += (wv * xv as f64).abs();
    }
    (value, size)
}

/// Checks `got[r][i]` (weight row r, x row i) against both references.
fn check<P: Element>(w: &Weights<P>, xs: &[Vec<f32>], got: &[f32], what: &str) {
    let m = xs.len();
    for (idx, &g) in got.iter().enumerate() {
        let (r, i) = (idx / m, idx % m);
        let (want, size) = reference_int8(w, r, &xs[i]);
        assert!(
            (g as f64 - want).abs() <= 1e-5 * size + 1e-6,
            "{what}: row {r}, x {i}: got {g}, int8 reference {want}"
        );
        let (exact, size) = reference_exact(w, r, &xs[i]);
        assert!(
            (g as f64 - exact).abs() <= 2e-2 * size,
            "{what}: row {r}, x {i}: got {g}, exact {exact} (Σ|w·x| {size})"
        );
    }
}

fn case<T: Element, P: Element>(
    rng: &mut Rng,
    m: usize,
    n: usize,
    k: usize,
    bits: u32,
    group: usize,
) {
    let w = Weights::<P>::random(rng, n, k, bits, group);
    let xs: Vec<Vec<T>> = (0..m).map(|_| rng.elems(k, 1.0)).collect();
    let xf: Vec<Vec<f32>> = xs
        .iter()
        .map(|r| r.iter().map(|v| v.to_f32()).collect())
        .collect();
    let prepared = Q8Activations::prepare(xs.iter().map(|r| &r[..]), &w.lay);
    for tier in Int8Tier::available() {
        let what = format!("{tier:?} m={m} n={n} k={k} bits={bits} group={group}");
        // One x row at a time, against every weight row (the matvec API).
        let mut by_row = vec![f32::NAN; n * m];
        for i in 0..m {
            let mut out = vec![f32::NAN; n];
            dot_rows(prepared.row(i), &w.view(), 0, &mut out, tier).unwrap();
            for (r, v) in out.iter().enumerate() {
                by_row[r * m + i] = *v;
            }
        }
        check(&w, &xf, &by_row, &format!("dot_rows {what}"));
        // Every x row against a range of weight rows (the GEMM tile).
        let first = n / 3;
        let rows = n - first;
        let mut tile = vec![f32::NAN; rows * m];
        dot_tile(&prepared, &w.view(), first, &mut tile, tier).unwrap();
        for (j, chunk) in tile.chunks(m).enumerate() {
            assert_eq!(chunk, &by_row[(first + j) * m..][..m], "dot_tile {what}");
        }
    }
}

#[test]
fn every_tier_matches_the_references() {
    let mut rng = Rng::new(0x1e78_0001);
    for bits in [4, 8] {
        for group in [32, 64, 128] {
            // k = 384 is not a multiple of 256; 9 rows is odd.
            case::<f32, f32>(&mut rng, 3, 9, 384, bits, group);
        }
        // An odd block count (4-bit: a trailing half chunk).
        case::<f32, f32>(&mut rng, 5, 7, 96, bits, 32);
        case::<f32, f32>(&mut rng, 1, 13, 224, bits, 32);
        case::<f32, f32>(&mut rng, 2, 5, 320, bits, 64);
        // The default model's shapes.
        case::<f32, f32>(&mut rng, 4, 11, 576, bits, 32);
    }
}

#[test]
fn half_scales_and_half_x() {
    let mut rng = Rng::new(0x1e78_0002);
    for bits in [4, 8] {
        case::<f32, f16>(&mut rng, 3, 7, 256, bits, 32);
        case::<f32, bf16>(&mut rng, 2, 5, 192, bits, 64);
        case::<bf16, bf16>(&mut rng, 3, 7, 384, bits, 128);
        case::<f16, f16>(&mut rng, 1, 9, 96, bits, 32);
    }
}

/// Largest weights against x at ±127: the AVX2 tier's i16 pair sums would
/// saturate if 8-bit weights were not split into nibbles.
#[test]
fn extreme_values_do_not_saturate() {
    for bits in [4, 8] {
        let (n, k) = (3, 128);
        let lay = Layout::new(bits, 32, n, k).unwrap();
        let w = Weights::<f32> {
            w: vec![u32::MAX; n * lay.words_per_row],
            scales: vec![1.0; n * lay.groups_per_row],
            biases: vec![0.5; n * lay.groups_per_row],
            lay,
        };
        for sign in [1.0f32, -1.0] {
            let x = vec![sign; k];
            let prepared = Q8Activations::prepare(std::iter::once(&x[..]), &lay);
            let max_q = ((1u32 << bits) - 1) as f32;
            let want = sign * k as f32 * (max_q + 0.5);
            for tier in Int8Tier::available() {
                let mut out = vec![f32::NAN; n];
                dot_rows(prepared.row(0), &w.view(), 0, &mut out, tier).unwrap();
                for v in out {
                    assert!(
                        (v - want).abs() <= 1e-5 * want.abs(),
                        "{tier:?} bits={bits}: {v} vs {want}"
                    );
                }
            }
        }
    }
}

/// The AVX2 and scalar quantizers agree bit for bit, ties (x/d = n + 0.5)
/// rounding to even, and zero blocks giving d = 0.
#[test]
fn quantizers_agree_and_round_ties_to_even() {
    let mut rng = Rng::new(5);
    let mut blocks: Vec<[f32; BLOCK]> = (0..50)
        .map(|_| std::array::from_fn(|_| rng.elem::<f32>(3.0)))
        .collect();
    // d = 1: every value n + 0.5 is a tie.
    blocks.push(std::array::from_fn(|i| {
        if i == 0 {
            -127.0
        } else {
            i as f32 - 15.5
        }
    }));
    blocks.push([0.0; BLOCK]);
    for x in &blocks {
        let (mut a, mut b) = ([0i8; BLOCK], [0i8; BLOCK]);
        let scalar = quantize_block(x, &mut a, false);
        let simd = quantize_block(x, &mut b, crate::kernels::cpu::isa::has_avx2_f16c());
        assert_eq!(scalar, simd);
        assert_eq!(a, b);
        let (q, d) = reference_q8(x);
        assert_eq!(d[0], scalar.0);
        assert_eq!(q, a.iter().map(|&v| v as i32).collect::<Vec<_>>());
    }
    let tie = &blocks[50];
    let (mut q, _) = ([0i8; BLOCK], 0);
    quantize_block(tie, &mut q, crate::kernels::cpu::isa::has_avx2_f16c());
    assert_eq!(&q[1..5], &[-14, -14, -12, -12]);
}

#[test]
fn rejects_mismatched_layouts_and_rows() {
    let mut rng = Rng::new(3);
    let w = Weights::<f32>::random(&mut rng, 4, 128, 4, 32);
    let x: Vec<f32> = rng.elems(128, 1.0);
    let other = Layout::new(8, 32, 4, 128).unwrap();
    let wrong = Q8Activations::prepare(std::iter::once(&x[..]), &other);
    let mut out = vec![0.0f32; 4];
    let tier = Int8Tier::best();
    assert!(matches!(
        dot_rows(wrong.row(0), &w.view(), 0, &mut out, tier),
        Err(KernelError::Shape(_))
    ));
    assert!(dot_tile(&wrong, &w.view(), 0, &mut out, tier).is_err());
    let right = Q8Activations::prepare(std::iter::once(&x[..]), &w.lay);
    assert!(dot_rows(right.row(0), &w.view(), 0, &mut out, tier).is_ok());
    assert!(matches!(
        dot_rows(right.row(0), &w.view(), 1, &mut out, tier),
        Err(KernelError::IndexOutOfRange(_))
    ));
    assert!(dot_tile(&right, &w.view(), 2, &mut out[..3], tier).is_err());
}

#[test]
fn prepare_into_reuses_buffers_and_zero_blocks_quantize_to_zero() {
    let mut rng = Rng::new(4);
    let lay = Layout::new(4, 32, 1, 96).unwrap();
    let mut x: Vec<f32> = rng.elems(96, 1.0);
    x[32..64].fill(0.0);
    let mut a = Q8Activations::prepare(std::iter::once(&x[..]), &lay);
    let first: Vec<i8> = a.row(0).q.to_vec();
    let y: Vec<f32> = rng.elems(2 * 96, 1.0);
    a.prepare_into(y.chunks(96), &lay);
    assert_eq!(a.rows(), 2);
    a.prepare_into(std::iter::once(&x[..]), &lay);
    assert_eq!(a.row(0).q, &first[..]);
    // Block 1 sits in chunk 0, second half: its d is 0 and its values are 0.
    assert_eq!(&a.row(0).lane_d[4..8], &[0.0; 4]);
}
