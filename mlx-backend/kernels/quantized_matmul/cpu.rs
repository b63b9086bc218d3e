//! `y = x·Wᵀ` on an MLX affine-quantized `W [n, k]`, accumulated in f32 and
//! rounded to T once.
//!
//! One x row (decode): weight rows are unpacked in registers two at a time
//! and dotted with x in block order (`rowwise::qdot2_scaled`); the biases
//! contribute `bias · Σx` per group. Several x rows (prefill): a tile of
//! `TILE_N` weight rows is dequantized to f32 once and reused for every x
//! row, four weight rows per pass over x (`simd::dot4`). Both paths split
//! the output rows into tiles over the CPU team when the work is large enough.
//!
//! With int8 activations (`ActivationPrecision::Int8`) x is quantized once
//! per call and both paths use `int8::dot_rows` / `int8_dot_tile`
//! (integer dot products; the prefill tile reuses each unpacked weight
//! chunk across x rows).

use crate::kernels::cpu::dispatch::{self, RowMajorChunks};
use crate::kernels::cpu::error::{check_len, KernelError};
use crate::kernels::cpu::int8::{
    dot_rows as int8_dot_rows, dot_tile as int8_dot_tile, Int8Tier, Q8Activations,
};
use crate::kernels::cpu::isa;
use crate::kernels::cpu::layout::OutStrides;
use crate::kernels::cpu::layout::{Layout, QView};
use crate::kernels::cpu::prepare::PreparedX;
use crate::kernels::cpu::rowwise::{bias_term, dequant, qdot2_scaled, scatter_rows};
use crate::kernels::cpu::simd::{self, Element};
use crate::kernels::cpu::team::{for_units, split, SharedSlice};
use crate::kernels::cpu::{
    for_chunks, run_entry, try_for_chunks, typed, typed_mut, with_float, FloatKind, XPrecision,
};
use crate::kernels::registry::Kernel;

pub use crate::kernels::cpu::layout::QuantMatrix;

/// Below this many multiply-adds threading costs more than it saves.
const PAR_MIN_MACS: usize = 1 << 19;
/// Weight rows per tile (dequantized once in the tiled path).
const TILE_N: usize = 16;
/// Up to this many x rows (decode batches) a threaded call splits W's rows
/// over the CPU team (W read once); more (prefill) split into tiles.
const TEAM_MAX_ROWS: usize = 32;

/// f32 results into T.
fn to_elements<T: Element>(src: &[f32], dst: &mut [T]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = T::from_f32(*s);
    }
}

/// `x` is `[m, k]`, `out` is `[m, n]`, both row-major, of element type
/// `T`; the scales and biases are `P` (T itself, or f16/bf16 with f32 x).
/// Exact (f32) activations.
#[cfg(test)] // the exact form, as the tests call it
pub fn quantized_matmul<T: Element, P: Element>(
    x: &[T],
    w: QuantMatrix<P>,
    out: &mut [T],
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), KernelError> {
    quantized_matmul_with(x, w, out, m, n, k, XPrecision::Exact)
}

/// [`quantized_matmul`] with x in the given precision.
pub(crate) fn quantized_matmul_with<T: Element, P: Element>(
    x: &[T],
    w: QuantMatrix<P>,
    out: &mut [T],
    m: usize,
    n: usize,
    k: usize,
    xp: XPrecision,
) -> Result<(), KernelError> {
    let lay = Layout::new(w.bits, w.group_size, n, k)?;
    let wv = QView::new("w", w.w, w.scales, w.biases, lay, 1)?;
    check_len("x", x.len(), m.checked_mul(k))?;
    check_len("out", out.len(), m.checked_mul(n))?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let parallel = m.saturating_mul(n).saturating_mul(k) > PAR_MIN_MACS
        && !crate::kernels::cpu::team::in_team();
    if m <= TEAM_MAX_ROWS && parallel {
        // Decode rows (the lm_head): the CPU team splits the output rows; a
        // pool would cut them into many small tasks and wake workers, and
        // right after the decode blocks it would share the cores with the
        // team's still-spinning helpers.
        return matmul_on_team(x, w, out, m, n, k, xp);
    }
    if let Some(tier) = xp.int8() {
        return int8_matmul(x, &wv, out, m, parallel, tier);
    }
    let px = PreparedX::new(x.chunks_exact(k), &lay, xp.int16());
    if dispatch::available() {
        // AVX-512 or AVX2: one register-blocked kernel for any number of x
        // rows, `out` written row-major in place.
        let chunks = RowMajorChunks::new(&px, n, parallel);
        let body = |c: usize, chunk: &mut [T], buf: &mut Vec<f32>| {
            buf.resize(chunk.len(), 0.0);
            let (xrows, cols, strides) = chunks.part(c, chunk.len());
            dispatch::dot_rows(&px, xrows, &wv, cols, buf, strides);
            to_elements(buf, chunk);
        };
        for_chunks(out, chunks.len, parallel, Vec::new, body);
    } else if m == 1 {
        for_tiles(
            out,
            TILE_N,
            parallel,
            || (),
            |first, chunk, _| matvec_tile(&px, &wv, first, chunk),
        );
    } else {
        let mut tmp = vec![T::from_f32(0.0); n * m];
        let new_buf = || vec![0.0f32; TILE_N * k];
        for_tiles(
            &mut tmp,
            TILE_N * m,
            parallel,
            new_buf,
            |first, chunk, buf| tiled(&px, &wv, first, chunk, buf),
        );
        scatter_rows(&tmp, out, m, n, |r| r);
    }
    Ok(())
}

/// The int8-activation form of [`quantized_matmul_with`] (arguments checked).
fn int8_matmul<T: Element, P: Element>(
    x: &[T],
    w: &QView<P>,
    out: &mut [T],
    m: usize,
    parallel: bool,
    tier: Int8Tier,
) -> Result<(), KernelError> {
    let (n, k) = (w.lay.n, w.lay.k);
    let xs = Q8Activations::prepare(x.chunks_exact(k), &w.lay);
    let new_buf = || vec![0.0f32; TILE_N * m];
    let to_t = |src: &[f32], dst: &mut [T]| {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = T::from_f32(*s);
        }
    };
    if m == 1 {
        return try_for_tiles(out, TILE_N, parallel, new_buf, |first, chunk, buf| {
            let buf = &mut buf[..chunk.len()];
            int8_dot_rows(xs.row(0), w, first, buf, tier)?;
            to_t(buf, chunk);
            Ok(())
        });
    }
    let mut tmp = vec![T::from_f32(0.0); n * m];
    try_for_tiles(
        &mut tmp,
        TILE_N * m,
        parallel,
        new_buf,
        |first, chunk, buf| {
            let buf = &mut buf[..chunk.len()];
            int8_dot_tile(&xs, w, first, buf, tier)?;
            to_t(buf, chunk);
            Ok(())
        },
    )?;
    scatter_rows(&tmp, out, m, n, |r| r);
    Ok(())
}

/// [`for_tiles`] for bodies that can fail; the first error is returned.
fn try_for_tiles<T: Send, B>(
    dst: &mut [T],
    chunk_len: usize,
    parallel: bool,
    init: impl Fn() -> B + Sync + Send,
    body: impl Fn(usize, &mut [T], &mut B) -> Result<(), KernelError> + Sync + Send,
) -> Result<(), KernelError> {
    try_for_chunks(dst, chunk_len, parallel, init, |c, chunk, buf| {
        body(c * TILE_N, chunk, buf)
    })
}

/// `out_i = x · W_iᵀ` (`[m, n_i]` each) for matrices sharing K, in one
/// thread. Where a blocked kernel runs, all share their (bits,
/// group_size) and x is not int8, x is prepared once for all of them (the
/// q, k and v projections of a decoder block); else each is its own call.
pub(crate) fn quantized_matmul_shared_x<P: Element>(
    x: &[f32],
    parts: &mut [(QuantMatrix<P>, &mut [f32], usize)],
    m: usize,
    k: usize,
    xp: XPrecision,
) -> Result<(), KernelError> {
    let Some((first, _, _)) = parts.first() else {
        return Ok(());
    };
    let (bits, group) = (first.bits, first.group_size);
    let shared = dispatch::available()
        && xp.int8().is_none()
        && parts
            .iter()
            .all(|(w, _, _)| w.bits == bits && w.group_size == group);
    if !shared {
        for (w, out, n) in parts.iter_mut() {
            quantized_matmul_with(x, *w, out, m, *n, k, xp)?;
        }
        return Ok(());
    }
    check_len("x", x.len(), m.checked_mul(k))?;
    let lay = Layout::new(bits, group, 1, k)?;
    let px = PreparedX::new(x.chunks_exact(k), &lay, xp.int16());
    for (w, out, n) in parts.iter_mut() {
        let lay = Layout::new(bits, group, *n, k)?;
        let wv = QView::new("w", w.w, w.scales, w.biases, lay, 1)?;
        check_len("out", out.len(), m.checked_mul(*n))?;
        if m > 0 && *n > 0 {
            let strides = OutStrides {
                x_stride: *n,
                w_stride: 1,
            };
            dispatch::dot_rows(&px, 0..m, &wv, 0..*n, out, strides);
        }
    }
    Ok(())
}

/// `m` x rows against `w` on the CPU team, in [`TEAM_UNITS`] units of W's
/// rows (the output columns) for every x row, so W is read once.
fn matmul_on_team<T: Element, P: Element>(
    x: &[T],
    w: QuantMatrix<P>,
    out: &mut [T],
    m: usize,
    n: usize,
    k: usize,
    xp: XPrecision,
) -> Result<(), KernelError> {
    let dst = SharedSlice::new(out);
    let units = n.div_ceil(TILE_N).min(TEAM_UNITS);
    for_units(units, Vec::new, |unit, tmp| {
        // Never empty: there are at most as many units as tiles.
        let cols = split(n, units, unit, TILE_N);
        let part = w.rows(k, cols.start, cols.len());
        if m == 1 {
            // SAFETY: `cols` is this unit's part of `0..n`; parts are disjoint.
            let out = unsafe { dst.part(cols.start, cols.len()) };
            return quantized_matmul_with(x, part, out, 1, cols.len(), k, xp);
        }
        tmp.resize(m * cols.len(), T::from_f32(0.0));
        quantized_matmul_with(x, part, tmp, m, cols.len(), k, xp)?;
        // SAFETY: columns `cols` of every row are this unit's alone.
        unsafe { dst.write_cols(tmp, n, &cols) };
        Ok(())
    })
}

/// Units of a decode-sized [`matmul_on_team`] call: a few per member, so
/// that a member that starts late (a parked helper) leaves its units to
/// the others, while each unit stays long enough (x is prepared per unit).
const TEAM_UNITS: usize = 8;

/// Runs `body(first_row, chunk, scratch)` over `dst` in chunks of
/// `chunk_len`, chunk `c` starting at output row `c * TILE_N`.
fn for_tiles<T: Send, B>(
    dst: &mut [T],
    chunk_len: usize,
    parallel: bool,
    init: impl Fn() -> B + Sync + Send,
    body: impl Fn(usize, &mut [T], &mut B) + Sync + Send,
) {
    for_chunks(dst, chunk_len, parallel, init, |c, chunk, buf| {
        body(c * TILE_N, chunk, buf)
    });
}

/// Output rows `first..first + dst.len()` for the single x row.
fn matvec_tile<T: Element, P: Element>(px: &PreparedX, w: &QView<P>, first: usize, dst: &mut [T]) {
    let lay = &w.lay;
    let avx = isa::has_avx2_f16c();
    let finish =
        |d: f32, r: usize| T::from_f32(d + bias_term(w.row(r).biases, &px.group_sums, avx));
    let mut pairs = dst.chunks_exact_mut(2);
    let mut r = first;
    for pair in &mut pairs {
        let (a, b) = qdot2_scaled(&w.row(r), &w.row(r + 1), &px.perm, lay, avx);
        pair[0] = finish(a, r);
        pair[1] = finish(b, r + 1);
        r += 2;
    }
    if let [last] = pairs.into_remainder() {
        let row = w.row(r);
        let (a, _) = qdot2_scaled(&row, &row, &px.perm, lay, avx);
        *last = finish(a, r);
    }
}

/// Output rows `first..` (`dst` is `[rows][m]`, transposed) for every x
/// row, from the tile's weight rows dequantized once into `buf`.
fn tiled<T: Element, P: Element>(
    px: &PreparedX,
    w: &QView<P>,
    first: usize,
    dst: &mut [T],
    buf: &mut [f32],
) {
    let (m, k) = (px.rows, w.lay.k);
    let rows = dst.len() / m;
    let avx = isa::has_avx2_f16c();
    for (i, dq) in buf.chunks_exact_mut(k).take(rows).enumerate() {
        dequant(&w.row(first + i), &w.lay, dq, avx);
    }
    for r0 in (0..rows).step_by(4) {
        // A short final group repeats its last row; the extra sums are dropped.
        let idx = [0, 1, 2, 3].map(|j| (r0 + j).min(rows - 1));
        let wrows = idx.map(|r| &buf[r * k..][..k]);
        for (i, xr) in px.perm.chunks_exact(k).enumerate() {
            let d = simd::dot4(xr, wrows);
            for (j, v) in d.iter().enumerate().take(rows - r0) {
                dst[(r0 + j) * m + i] = T::from_f32(*v);
            }
        }
    }
}

/// Entry point from C++ (`QuantizedMatmulPrimitive`); all arrays dense.
/// `dtype` is x's (and out's), `params_dtype` that of scales and biases.
#[allow(clippy::too_many_arguments)]
pub(crate) fn quantized_matmul_cpu(
    dtype: i32,
    params_dtype: i32,
    x: &[u8],
    w: &[u32],
    scales: &[u8],
    biases: &[u8],
    bits: u32,
    group_size: usize,
    out: &mut [u8],
    m: usize,
    n: usize,
    k: usize,
    activations: i32,
) -> bool {
    run_entry(Kernel::QuantizedMatmul, || {
        let xp = XPrecision::from_code(activations)?;
        let (xk, pk) = (
            FloatKind::from_code(dtype)?,
            FloatKind::from_code(params_dtype)?,
        );
        if xk != pk && xk != FloatKind::F32 {
            return Err(KernelError::Unsupported(format!(
                "x {xk:?} with scales {pk:?}: mixed dtypes need f32 x"
            )));
        }
        with_float!(xk, T => with_float!(pk, P => {
            let q = QuantMatrix::<P> {
                w,
                scales: typed(scales)?,
                biases: typed(biases)?,
                bits,
                group_size,
            };
            quantized_matmul_with::<T, P>(typed(x)?, q, typed_mut(out)?, m, n, k, xp)
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_util::{tol_eps, Rng};
    use half::{bf16, f16};

    struct Owned<T> {
        w: Vec<u32>,
        scales: Vec<T>,
        biases: Vec<T>,
        bits: u32,
        group_size: usize,
    }

    impl<T: Element> Owned<T> {
        fn random(rng: &mut Rng, n: usize, k: usize, bits: u32, group_size: usize) -> Self {
            let max_q = ((1u32 << bits) - 1) as f32;
            Owned {
                w: (0..n * k * bits as usize / 32)
                    .map(|_| rng.next_u32())
                    .collect(),
                scales: rng.elems(n * k / group_size, 0.3 / max_q),
                biases: rng.elems(n * k / group_size, 0.15),
                bits,
                group_size,
            }
        }
        fn matrix(&self) -> QuantMatrix<'_, T> {
            QuantMatrix {
                w: &self.w,
                scales: &self.scales,
                biases: &self.biases,
                bits: self.bits,
                group_size: self.group_size,
            }
        }
        /// `W[row, col]` straight from the documented formula.
        fn weight(&self, row: usize, col: usize, k: usize) -> f64 {
            let bits = self.bits as usize;
            let word = self.w[row * k * bits / 32 + col * bits / 32];
            let q = (word >> (bits * (col % (32 / bits)))) & ((1 << bits) - 1);
            let gi = row * (k / self.group_size) + col / self.group_size;
            self.scales[gi].to_f32() as f64 * q as f64 + self.biases[gi].to_f32() as f64
        }
    }

    fn case<T: Element>(rng: &mut Rng, m: usize, n: usize, k: usize, bits: u32, group: usize) {
        case_mixed::<T, T>(rng, m, n, k, bits, group);
    }

    fn case_mixed<T: Element, P: Element>(
        rng: &mut Rng,
        m: usize,
        n: usize,
        k: usize,
        bits: u32,
        group: usize,
    ) {
        let w = Owned::<P>::random(rng, n, k, bits, group);
        let x: Vec<T> = rng.elems(m * k, 1.0);
        let mut out = vec![T::from_f32(f32::NAN); m * n];
        quantized_matmul(&x, w.matrix(), &mut out, m, n, k).unwrap();
        let want: Vec<f64> = (0..m * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                (0..k)
                    .map(|j| x[r * k + j].to_f32() as f64 * w.weight(c, j, k))
                    .sum()
            })
            .collect();
        let typical = want.iter().map(|v| v.abs()).sum::<f64>() / want.len() as f64;
        let eps = tol_eps::<T>() as f64;
        for (i, (g, w)) in out.iter().zip(&want).enumerate() {
            let g = g.to_f32() as f64;
            let tol = eps * w.abs() + 1e-4 * typical;
            assert!(
                (g - w).abs() <= tol,
                "m={m} n={n} k={k} bits={bits} g={group}: index {i}: got {g}, want {w}"
            );
        }
    }

    fn all<T: Element>() {
        let mut rng = Rng::new(0x9a7e_0002);
        for bits in [4, 8] {
            for group in [32, 64, 128] {
                for m in [1, 2, 7] {
                    case::<T>(&mut rng, m, 37, 256, bits, group);
                }
            }
            // k = 96 leaves a short final block for 4-bit, group 32.
            case::<T>(&mut rng, 1, 19, 96, bits, 32);
            case::<T>(&mut rng, 3, 19, 96, bits, 32);
        }
        // Large enough to split over threads: the CPU team (1 and 9 x rows,
        // uneven shares of W's rows; 40 x rows, runs of tiles).
        case::<T>(&mut rng, 1, 1101, 1024, 4, 64);
        case::<T>(&mut rng, 9, 301, 1024, 8, 128);
        case::<T>(&mut rng, 40, 67, 256, 4, 32);
    }

    #[test]
    fn matches_reference_f32() {
        all::<f32>();
    }

    #[test]
    fn matches_reference_f16() {
        all::<f16>();
    }

    #[test]
    fn matches_reference_bf16() {
        all::<bf16>();
    }

    #[test]
    fn f32_x_with_half_scales() {
        let mut rng = Rng::new(0x31);
        for m in [1, 6] {
            case_mixed::<f32, f16>(&mut rng, m, 37, 256, 4, 32);
            case_mixed::<f32, bf16>(&mut rng, m, 37, 256, 8, 64);
        }
    }

    /// One prepared x for several matrices gives each matrix's own result,
    /// bit for bit, in exact and int16 x and for 1, 3, 9 and 70 x rows (the
    /// AVX-512 kernel and both AMX forms where this CPU has them); matrices
    /// quantized differently take separate calls.
    #[test]
    fn shared_x_matches_separate_calls() {
        let mut rng = Rng::new(0x5a7e);
        let k = 192;
        for xp in [XPrecision::Exact, XPrecision::Int16] {
            for m in [1, 3, 9, 70] {
                for quant in [[(4, 32); 3], [(4, 32), (8, 64), (4, 32)]] {
                    let ns = [40, 24, 17];
                    let ws: Vec<Owned<f16>> = quant
                        .iter()
                        .zip(ns)
                        .map(|(&(bits, group), n)| Owned::random(&mut rng, n, k, bits, group))
                        .collect();
                    let x: Vec<f32> = rng.elems(m * k, 1.0);
                    let mut separate: Vec<Vec<f32>> = ns.iter().map(|n| vec![0.0; m * n]).collect();
                    for ((w, out), n) in ws.iter().zip(&mut separate).zip(ns) {
                        quantized_matmul_with(&x, w.matrix(), out, m, n, k, xp).unwrap();
                    }
                    let mut shared: Vec<Vec<f32>> =
                        ns.iter().map(|n| vec![f32::NAN; m * n]).collect();
                    let mut parts: Vec<_> = ws
                        .iter()
                        .zip(shared.iter_mut())
                        .zip(ns)
                        .map(|((w, out), n)| (w.matrix(), out.as_mut_slice(), n))
                        .collect();
                    quantized_matmul_shared_x(&x, &mut parts, m, k, xp).unwrap();
                    assert_eq!(shared, separate, "{xp:?} m={m} {quant:?}");
                }
            }
        }
    }

    #[test]
    fn rejects_bad_arguments() {
        let mut rng = Rng::new(9);
        let (n, k) = (4, 128);
        let q = Owned::<f32>::random(&mut rng, n, k, 4, 64);
        let x: Vec<f32> = rng.elems(2 * k, 1.0);
        let mut out = vec![0.0f32; 2 * n];
        assert!(quantized_matmul(&x, q.matrix(), &mut out, 2, n, k).is_ok());
        assert!(quantized_matmul(&x[1..], q.matrix(), &mut out, 2, n, k).is_err());
        assert!(quantized_matmul(&x, q.matrix(), &mut out[1..], 2, n, k).is_err());
        let bad_bits = QuantMatrix {
            bits: 3,
            ..q.matrix()
        };
        assert!(matches!(
            quantized_matmul(&x, bad_bits, &mut out, 2, n, k),
            Err(KernelError::Unsupported(_))
        ));
        let short = QuantMatrix {
            biases: &q.biases[1..],
            ..q.matrix()
        };
        assert!(quantized_matmul(&x, short, &mut out, 2, n, k).is_err());
        assert!(quantized_matmul(&x[..96], q.matrix(), &mut out[..n], 1, n, 96).is_err());
    }
}
