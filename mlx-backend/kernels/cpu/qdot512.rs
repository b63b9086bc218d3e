//! AVX-512 dot products of MLX affine-quantized weight rows with f32 x rows,
//! register-blocked: each unpacked weight vector feeds up to 8 x rows and
//! each x vector up to 4 weight rows, so one kernel serves decode (1 row),
//! batched decode and prefill (many rows) alike.
//!
//! x comes in block order with 16 lanes ([`PreparedX`] built where
//! [`available`]): one 512-bit load of 16 packed words lines up with 16
//! consecutive f32 of x. A 4-bit value becomes f32 through one shift and one
//! `vpermps` from the table `0.0..=15.0` (the permute reads only the low four
//! bits, so no mask); an 8-bit value through one byte shuffle and a convert.
//! Per block the partial sums are scaled per lane; the biases contribute
//! `Σ bias · (sum of x over the group)`, sixteen groups per FMA into the
//! same accumulators. The short final block of a row is read through masks.

use std::ops::Range;

use super::quant::{PreparedX, QView};
use super::simd::Element;

/// x rows per task when many x rows are split over threads (each task
/// reads all of W once).
const X_CHUNK: usize = 16;
/// Output columns per task when one x row is split over threads.
const COL_CHUNK: usize = 16;

/// How a row-major `out [m, n]` is cut into chunks for [`dot_rows`] (one
/// per task when split over threads): one x row by output columns, several
/// by x rows, each chunk against all of W. Unsplit, one chunk holds it all,
/// so the kernel's register blocks see every x row.
#[derive(Clone, Copy)]
pub(crate) struct RowMajorChunks {
    m: usize,
    n: usize,
    /// Elements of `out` per chunk.
    pub(crate) len: usize,
}

impl RowMajorChunks {
    pub(crate) fn new(m: usize, n: usize, parallel: bool) -> Self {
        let len = match (m, parallel) {
            (_, false) => m * n,
            (1, true) => COL_CHUNK,
            (_, true) => X_CHUNK.min(m.div_ceil(2)) * n,
        };
        RowMajorChunks { m, n, len }
    }

    /// `dot_rows`' x rows, weight rows and strides for chunk `c` of `size`
    /// elements.
    pub(crate) fn part(&self, c: usize, size: usize) -> (Range<usize>, Range<usize>, OutStrides) {
        let first = c * self.len;
        if self.m == 1 {
            let strides = OutStrides {
                x_stride: 0,
                w_stride: 1,
            };
            (0..1, first..first + size, strides)
        } else {
            let strides = OutStrides {
                x_stride: self.n,
                w_stride: 1,
            };
            let row = first / self.n;
            (row..row + size / self.n, 0..self.n, strides)
        }
    }
}

/// Weight rows converted per pass (their scales and biases widened once and
/// reused for every chunk of x rows).
const TILE: usize = 16;

/// True when the AVX-512 bodies may run (std caches the CPUID probe).
#[inline]
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Where [`dot_rows`] writes: `out[i * x_stride + j * w_stride]` holds x row
/// `xrows.start + i` against weight row `rows.start + j`.
#[derive(Clone, Copy)]
pub(crate) struct OutStrides {
    pub(crate) x_stride: usize,
    pub(crate) w_stride: usize,
}

/// `Σ_k x[i][k] · W[r][k]` (scales and biases applied) for every prepared x
/// row `i` in `xrows` and weight row `r` in `rows`.
///
/// # Panics
/// When `px` was not prepared with 16 lanes for `w`'s layout, `rows` leaves
/// the matrix, or `out` is too short for the strides.
pub(crate) fn dot_rows<P: Element>(
    px: &PreparedX,
    xrows: Range<usize>,
    w: &QView<P>,
    rows: Range<usize>,
    out: &mut [f32],
    strides: OutStrides,
) {
    let lay = &w.lay;
    assert!(
        available(),
        "qdot512::dot_rows needs AVX-512F and AVX-512BW"
    );
    assert_eq!(px.lanes, 16, "x must be prepared with 16 lanes");
    assert_eq!(px.perm.len(), px.rows * lay.k);
    assert_eq!(px.group_sums.len(), px.rows * lay.groups_per_row);
    assert!(xrows.end <= px.rows);
    assert!(rows.end <= w.w.len() / lay.words_per_row);
    if !xrows.is_empty() && !rows.is_empty() {
        let last = (xrows.len() - 1) * strides.x_stride + (rows.len() - 1) * strides.w_stride;
        assert!(last < out.len(), "output too short");
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU features were detected; the asserts above bound every access.
    unsafe {
        if lay.bits == 4 {
            x86::drive::<P, 4>(px, xrows, w, rows, out, strides)
        } else {
            x86::drive::<P, 8>(px, xrows, w, rows, out, strides)
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{OutStrides, PreparedX, QView, TILE};
    use crate::kernels::cpu::quant::Layout;
    use crate::kernels::cpu::simd::Element;
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Software prefetch distance in bytes for the weight rows.
    const PREFETCH: usize = 4096;

    /// Walks tiles of weight rows and, inside each, chunks of x rows; the
    /// register block (x rows × weight rows) shrinks with the rows left.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn drive<P: Element, const BITS: u32>(
        px: &PreparedX,
        xrows: Range<usize>,
        w: &QView<P>,
        rows: Range<usize>,
        out: &mut [f32],
        st: OutStrides,
    ) {
        let mut t0 = rows.start;
        while t0 < rows.end {
            let tile = t0..rows.end.min(t0 + TILE);
            let mut i = xrows.start;
            while i < xrows.end {
                let left = xrows.end - i;
                // SAFETY (each arm): the caller checked the bounds of x, W and out.
                i += unsafe {
                    match left {
                        8.. => block::<P, BITS, 8, 1>(px, w, &tile, i, &xrows, rows.start, out, st),
                        4..=7 => {
                            block::<P, BITS, 4, 2>(px, w, &tile, i, &xrows, rows.start, out, st)
                        }
                        2 | 3 => {
                            block::<P, BITS, 2, 2>(px, w, &tile, i, &xrows, rows.start, out, st)
                        }
                        _ => block::<P, BITS, 1, 4>(px, w, &tile, i, &xrows, rows.start, out, st),
                    }
                };
            }
            t0 = tile.end;
        }
    }

    /// x rows `i0..i0 + MR` against every weight row of `tile`, `NR` weight
    /// rows at a time (a short remainder one at a time). Returns MR.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn block<P: Element, const BITS: u32, const MR: usize, const NR: usize>(
        px: &PreparedX,
        w: &QView<P>,
        tile: &Range<usize>,
        i0: usize,
        xrows: &Range<usize>,
        first: usize,
        out: &mut [f32],
        st: OutStrides,
    ) -> usize {
        let (k, groups) = (w.lay.k, w.lay.groups_per_row);
        let x: [&[f32]; MR] = std::array::from_fn(|i| &px.perm[(i0 + i) * k..][..k]);
        let gs: [&[f32]; MR] =
            std::array::from_fn(|i| &px.group_sums[(i0 + i) * groups..][..groups]);
        let i0 = i0 - xrows.start;
        let mut r = tile.start;
        while r < tile.end {
            // SAFETY (both): `x` and `gs` hold whole rows; the caller bounded W and out.
            r += if tile.end - r >= NR {
                unsafe { weight_rows::<P, BITS, MR, NR>(w, r, x, gs, i0, first, out, st) }
            } else {
                unsafe { weight_rows::<P, BITS, MR, 1>(w, r, x, gs, i0, first, out, st) }
            };
        }
        MR
    }

    /// Weight rows `r..r + NR` against the MR x rows, stored at output x
    /// row `i0` on. Returns NR.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn weight_rows<P: Element, const BITS: u32, const MR: usize, const NR: usize>(
        w: &QView<P>,
        r: usize,
        x: [&[f32]; MR],
        gs: [&[f32]; MR],
        i0: usize,
        first: usize,
        out: &mut [f32],
        st: OutStrides,
    ) -> usize {
        let words = w.lay.words_per_row;
        let wr: [&[u32]; NR] = std::array::from_fn(|n| &w.w[(r + n) * words..][..words]);
        let pr: [(&[P], &[P]); NR] = std::array::from_fn(|n| {
            let row = w.row(r + n);
            (row.scales, row.biases)
        });
        // SAFETY: the slices above hold whole rows of W and of its params.
        let d = unsafe { kernel::<P, BITS, MR, NR>(&w.lay, wr, pr, x, gs) };
        for (i, row) in d.iter().enumerate() {
            for (n, v) in row.iter().enumerate() {
                out[(i0 + i) * st.x_stride + (r + n - first) * st.w_stride] = *v;
            }
        }
        NR
    }

    /// Value `v` of each of the 16 words, as f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn unpack<const BITS: u32>(w: __m512i, v: usize, table: __m512) -> __m512 {
        if BITS == 4 {
            let shifted = _mm512_srlv_epi32(w, _mm512_set1_epi32(4 * v as i32));
            // vpermps reads the low four bits of each index: no mask needed.
            _mm512_permutexvar_ps(shifted, table)
        } else {
            // Byte v of each word to byte 0, the other bytes zeroed (index -1).
            let v = v as i32;
            let pick = (-256i32) | v;
            let idx = _mm512_set4_epi32(pick + 12, pick + 8, pick + 4, pick);
            _mm512_cvtepi32_ps(_mm512_shuffle_epi8(w, idx))
        }
    }

    /// Up to 16 parameters (scales or biases, in their own dtype) from `src`
    /// as f32; lanes outside `mask` read nothing and are zero.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn load_params<P: Element>(src: *const P, mask: __mmask16) -> __m512 {
        use std::any::TypeId;
        // SAFETY (all): the caller's mask keeps the loads inside `src`'s slice.
        if TypeId::of::<P>() == TypeId::of::<f32>() {
            unsafe { _mm512_maskz_loadu_ps(mask, src.cast()) }
        } else {
            let halves = unsafe { _mm256_maskz_loadu_epi16(mask, src.cast()) };
            if TypeId::of::<P>() == TypeId::of::<half::f16>() {
                _mm512_cvtph_ps(halves)
            } else {
                // bf16: the upper half of an f32.
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(halves)))
            }
        }
    }

    /// 16 lanes of per-group parameters from `src[g0..g0 + groups]`, lane j
    /// taking its word's group.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn lane_params<P: Element>(
        src: &[P],
        g0: usize,
        gmask: __mmask16,
        lane_group: __m512i,
    ) -> __m512 {
        // SAFETY: the caller's mask keeps the load inside `src`.
        let v = unsafe { load_params(src.as_ptr().add(g0), gmask) };
        _mm512_permutexvar_ps(lane_group, v)
    }

    /// One block of 16 (or `lanes`) words of every weight row, added into
    /// `acc` scaled per lane.
    ///
    /// # Safety
    /// The masks must keep every load inside its row (all ones for a whole block).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn block_step<P: Element, const BITS: u32, const MR: usize, const NR: usize>(
        w: &[&[u32]; NR],
        params: &[(&[P], &[P]); NR],
        x: &[&[f32]; MR],
        b0: usize,
        lanes: usize,
        mask: __mmask16,
        g0: usize,
        gmask: __mmask16,
        lane_group: __m512i,
        table: __m512,
        acc: &mut [[__m512; NR]; MR],
    ) {
        let vpw = (32 / BITS) as usize;
        let zero = _mm512_setzero_ps();
        let xbase = b0 * vpw;
        let mut wv = [_mm512_setzero_si512(); NR];
        for n in 0..NR {
            // SAFETY (all loads below): the caller's masks bound them.
            wv[n] = unsafe { _mm512_maskz_loadu_epi32(mask, w[n].as_ptr().add(b0).cast()) };
            // Rows stream from memory: ask for the bytes PREFETCH ahead (a
            // hint, never a fault, even past the end).
            let ahead = w[n]
                .as_ptr()
                .wrapping_add(b0)
                .cast::<i8>()
                .wrapping_add(PREFETCH);
            _mm_prefetch::<_MM_HINT_T0>(ahead);
        }
        let mut p = [[zero; NR]; MR];
        let mut q = [zero; NR];
        for v in 0..vpw {
            for n in 0..NR {
                q[n] = unpack::<BITS>(wv[n], v, table);
            }
            for i in 0..MR {
                let at = xbase + v * lanes;
                let xv = unsafe { _mm512_maskz_loadu_ps(mask, x[i].as_ptr().add(at)) };
                for n in 0..NR {
                    p[i][n] = _mm512_fmadd_ps(q[n], xv, p[i][n]);
                }
            }
        }
        for n in 0..NR {
            for src in [params[n].0, params[n].1] {
                let ahead = src
                    .as_ptr()
                    .wrapping_add(g0)
                    .cast::<i8>()
                    .wrapping_add(PREFETCH / 4);
                _mm_prefetch::<_MM_HINT_T0>(ahead);
            }
            let sv = unsafe { lane_params(params[n].0, g0, gmask, lane_group) };
            for i in 0..MR {
                acc[i][n] = _mm512_fmadd_ps(p[i][n], sv, acc[i][n]);
            }
        }
    }

    /// The dot products of MR x rows with NR weight rows. No closures in
    /// here: they would not inherit the target features once inlined into
    /// std's helpers.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn kernel<P: Element, const BITS: u32, const MR: usize, const NR: usize>(
        lay: &Layout,
        w: [&[u32]; NR],
        params: [(&[P], &[P]); NR],
        x: [&[f32]; MR],
        group_sums: [&[f32]; MR],
    ) -> [[f32; NR]; MR] {
        let words = lay.words_per_row;
        let log2 = lay.words_per_group_log2;
        // Lane j's group, relative to the block's first group.
        let lane_group = _mm512_srlv_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(log2 as i32),
        );
        let table = _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        );
        let zero = _mm512_setzero_ps();
        let mut acc = [[zero; NR]; MR];
        // Whole blocks with constant masks (plain loads once inlined), then
        // the short final block, if any.
        let full = words / 16;
        let groups_per_block = (16 >> log2).max(1);
        let gmask_full: __mmask16 = (1 << groups_per_block) - 1;
        for b in 0..full {
            let b0 = 16 * b;
            // SAFETY: whole blocks lie inside every row.
            unsafe {
                block_step::<P, BITS, MR, NR>(
                    &w,
                    &params,
                    &x,
                    b0,
                    16,
                    0xffff,
                    b0 >> log2,
                    gmask_full,
                    lane_group,
                    table,
                    &mut acc,
                )
            };
        }
        let b0 = 16 * full;
        if b0 < words {
            let lanes = words - b0;
            let g0 = b0 >> log2;
            let groups = ((b0 + lanes - 1) >> log2) - g0 + 1;
            // SAFETY: the masks keep each load inside its row.
            unsafe {
                block_step::<P, BITS, MR, NR>(
                    &w,
                    &params,
                    &x,
                    b0,
                    lanes,
                    (1 << lanes) - 1,
                    g0,
                    (1 << groups) - 1,
                    lane_group,
                    table,
                    &mut acc,
                )
            };
        }
        // Biases: Σ bias·(sum of x over the group), sixteen groups at a time
        // into the same accumulators (every lane is summed at the end).
        let groups = lay.groups_per_row;
        let mut g = 0;
        while g < groups {
            let left = (groups - g).min(16);
            let gmask: __mmask16 = if left == 16 { 0xffff } else { (1 << left) - 1 };
            for n in 0..NR {
                let z = unsafe { load_params(params[n].1.as_ptr().add(g), gmask) };
                for i in 0..MR {
                    let sums =
                        unsafe { _mm512_maskz_loadu_ps(gmask, group_sums[i].as_ptr().add(g)) };
                    acc[i][n] = _mm512_fmadd_ps(sums, z, acc[i][n]);
                }
            }
            g += left;
        }
        let mut d = [[0.0f32; NR]; MR];
        for i in 0..MR {
            for n in 0..NR {
                d[i][n] = _mm512_reduce_add_ps(acc[i][n]);
            }
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::quant::Layout;
    use crate::kernels::cpu::simd::test_util::Rng;

    /// `W[r][c]` of an MLX affine matrix, in f64.
    fn weight<P: Element>(w: &QView<P>, r: usize, c: usize) -> f64 {
        let lay = &w.lay;
        let vpw = lay.vals_per_word;
        let word = w.w[r * lay.words_per_row + c / vpw];
        let q = (word >> (lay.bits as usize * (c % vpw))) & ((1 << lay.bits) - 1);
        let g = r * lay.groups_per_row + c / lay.group_size;
        w.scales[g].to_f32() as f64 * q as f64 + w.biases[g].to_f32() as f64
    }

    /// A random `[n, k]` matrix (packed words, scales, biases) and `m` x rows.
    #[allow(clippy::type_complexity)]
    fn random<P: Element>(
        rng: &mut Rng,
        (m, n, k): (usize, usize, usize),
        lay: &Layout,
    ) -> (Vec<u32>, Vec<P>, Vec<P>, Vec<f32>) {
        let max_q = ((1u32 << lay.bits) - 1) as f32;
        let groups = n * lay.groups_per_row;
        (
            (0..n * lay.words_per_row).map(|_| rng.next_u32()).collect(),
            rng.elems(groups, 0.3 / max_q),
            rng.elems(groups, 0.15),
            rng.elems(m * k, 1.0),
        )
    }

    fn case<P: Element>(rng: &mut Rng, m: usize, n: usize, k: usize, bits: u32, group: usize) {
        let lay = Layout::new(bits, group, n, k).unwrap();
        let (w, s, b, x) = random::<P>(rng, (m, n, k), &lay);
        let wv = QView::new("w", &w, &s, &b, lay, 1).unwrap();
        let px = PreparedX::new(x.chunks_exact(k), &lay);
        // A sub-range of x rows and of weight rows, written transposed
        // into a poisoned buffer with a padded stride.
        let (xr, wr) = (m / 3..m, 1..n);
        let stride = xr.len() + 3;
        let mut out = vec![f32::NAN; wr.len() * stride];
        let st = OutStrides {
            x_stride: 1,
            w_stride: stride,
        };
        dot_rows(&px, xr.clone(), &wv, wr.clone(), &mut out, st);
        for (i, xi) in xr.clone().enumerate() {
            for (j, r) in wr.clone().enumerate() {
                let (mut want, mut mag) = (0.0f64, 0.0f64);
                for c in 0..k {
                    let t = x[xi * k + c] as f64 * weight(&wv, r, c);
                    want += t;
                    mag += t.abs();
                }
                let got = out[i + j * stride] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * mag,
                    "m={m} n={n} k={k} bits={bits} group={group} x row {xi} w row {r}: {got} vs {want}"
                );
            }
        }
        // The padding between strides stays untouched.
        for j in 0..wr.len() {
            assert!(out[j * stride + xr.len()..][..3].iter().all(|v| v.is_nan()));
        }
    }

    #[test]
    fn matches_f64_reference() {
        if !available() {
            return;
        }
        let mut rng = Rng::new(0x512);
        // m covers every register block (8, 4, 2, 1 x rows); n leaves
        // remainders of the 4- and 2-row weight blocks; k = 576 leaves a
        // half block (4-bit), k = 96 only a short block.
        for (m, n, k, bits, group) in [
            (1, 23, 576, 4, 32),
            (3, 9, 576, 8, 32),
            (17, 18, 576, 4, 64),
            (12, 7, 256, 8, 128),
            (6, 5, 96, 4, 32),
            (2, 33, 1536, 4, 128),
        ] {
            case::<f32>(&mut rng, m, n, k, bits, group);
            case::<half::f16>(&mut rng, m, n, k, bits, group);
            case::<half::bf16>(&mut rng, m, n, k, bits, group);
        }
    }

    /// Single-thread speed at the default model's shapes (f16 scales and
    /// biases, as loaded), against the previous AVX2 body (two weight rows
    /// per pass, one x row):
    /// `cargo test --release --lib qdot512::tests::speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn speed() {
        if !available() {
            return;
        }
        let mut rng = Rng::new(5);
        for (what, m, n, k, bits) in [
            ("q/o proj", 1, 576, 576, 4),
            ("k/v proj", 1, 192, 576, 4),
            ("gate/up", 1, 1536, 576, 4),
            ("down", 1, 576, 1536, 4),
            ("lm_head", 1, 49152, 576, 8),
            ("gate/up x8", 8, 1536, 576, 4),
            ("gate/up x64", 64, 1536, 576, 4),
        ] {
            let lay = Layout::new(bits, 32, n, k).unwrap();
            let (w, s, b, x) = random::<half::f16>(&mut rng, (m, n, k), &lay);
            let wv = QView::new("w", &w, &s, &b, lay, 1).unwrap();
            let px = PreparedX::new(x.chunks_exact(k), &lay);
            let mut out = vec![0.0f32; m * n];
            let st = OutStrides {
                x_stride: n,
                w_stride: 1,
            };
            let reps = (2e8 as usize / (m * n * k)).max(3);
            let t = std::time::Instant::now();
            for _ in 0..reps {
                dot_rows(&px, 0..m, &wv, 0..n, &mut out, st);
            }
            let secs = t.elapsed().as_secs_f64() / reps as f64;
            let px8 = PreparedX::with_lanes(x.chunks_exact(k).take(1), &lay, 8);
            let t = std::time::Instant::now();
            let mut sink = 0.0;
            for _ in 0..reps * m {
                for r in (0..n).step_by(2) {
                    let (a, b) = crate::kernels::cpu::quant::qdot2_scaled(
                        &wv.row(r),
                        &wv.row(r + 1),
                        &px8.perm,
                        &lay,
                        true,
                    );
                    sink += a + b;
                }
            }
            let old = t.elapsed().as_secs_f64() / reps as f64;
            let bytes = (w.len() * 4 + (s.len() + b.len()) * 2) as f64;
            println!(
                "{what:12} m={m:2} n={n:5} k={k:4} {bits}-bit: {:8.1} us, {:5.1} GMAC/s, \
                 {:5.1} GB/s of weights+params; AVX2 two-row body {:5.1} GMAC/s ({sink:.0e})",
                secs * 1e6,
                (m * n * k) as f64 / secs / 1e9,
                bytes / secs / 1e9,
                (m * n * k) as f64 / old / 1e9,
            );
        }
    }
}
