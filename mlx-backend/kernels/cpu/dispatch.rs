//! The one choice of quantized dot-product body, by how x was prepared
//! ([`PreparedX`]): x on AMX tiles → [`super::amx`]; int16 x with one
//! scale per group (4+ rows) → [`super::row_lanes`]; otherwise the
//! register-blocked body for x's block width, [`blocked::avx512`] (16
//! words) or [`blocked::avx2`] (8). Callers prepare x once and call
//! [`dot_rows`], cutting the output with [`RowMajorChunks`] when they split
//! it over the CPU team.

use std::ops::Range;

use super::blocked;
use super::layout::{OutStrides, QView};
use super::prepare::{PreparedX, XForm};
use super::simd::Element;

/// True when one of the blocked bodies runs on this CPU (otherwise the
/// portable bodies in [`super::rowwise`] serve).
#[inline]
pub(crate) fn available() -> bool {
    super::isa::avx512_available() || super::isa::avx2_available()
}

/// `Σ_k x[i][k] · W[r][k]` (scales and biases applied) for every prepared x
/// row `i` in `xrows` and weight row `r` in `rows`: `out[i * x_stride +
/// j * w_stride]` holds x row `xrows.start + i` against weight row
/// `rows.start + j`.
///
/// # Panics
/// As the chosen body's `dot_rows`: no blocked body, x prepared for another
/// layout, rows outside the matrix, `out` too short.
#[inline]
pub(crate) fn dot_rows<P: Element>(
    px: &PreparedX,
    xrows: Range<usize>,
    w: &QView<P>,
    rows: Range<usize>,
    out: &mut [f32],
    strides: OutStrides,
) {
    match &px.form {
        XForm::GroupInt16(g16) => {
            super::row_lanes::dot_rows(g16, &px.group_sums, xrows, w, rows, out, strides)
        }
        XForm::Amx(ax) => {
            // AMX tiles are prepared only where AVX-512 runs (16 lanes).
            assert!(
                super::isa::avx512_available(),
                "x on AMX tiles needs AVX-512F and AVX-512BW"
            );
            assert_eq!(px.lanes, 16, "x must be prepared with 16 lanes");
            assert_eq!(px.group_sums.len(), px.rows * w.lay.groups_per_row);
            if strides.check(&xrows, px.rows, w, &rows, out.len()) {
                super::amx::dot_rows(ax, xrows, w, rows, out, strides)
            }
        }
        _ if px.lanes == 16 => blocked::avx512::dot_rows(px, xrows, w, rows, out, strides),
        _ => blocked::avx2::dot_rows(px, xrows, w, rows, out, strides),
    }
}

/// x rows per task when many x rows are split over threads (each task
/// reads all of W once); x on AMX tiles in the dequantized form takes half
/// the rows per task instead, since each task dequantizes all of W.
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
    /// Chunks of `out [px.rows, n]`.
    pub(crate) fn new(px: &PreparedX, n: usize, parallel: bool) -> Self {
        let m = px.rows;
        let per_task = match &px.form {
            XForm::Amx(ax) if ax.dequantized() => {
                m.div_ceil(2).next_multiple_of(super::amx::X_ROWS)
            }
            _ => X_CHUNK.min(m.div_ceil(2)),
        };
        let len = match (m, parallel) {
            (_, false) => m * n,
            (1, true) => COL_CHUNK,
            (_, true) => per_task * n,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::isa;
    use crate::kernels::cpu::layout::Layout;
    use crate::kernels::cpu::test_util::{check_against_f64, random, weight, Rng};

    /// `dot_rows` against an f64 reference. Exact x: within f32 rounding
    /// (1e-5 of Σ|x·W|). Int16 x: also within the rounding of x, at most
    /// half a step (`max|x over the word| / 32767`, or over the group for
    /// `row_lanes` at 4+ rows) per value; on the AMX tiles (`amx`, two or
    /// more rows), `row_lanes` or the VNNI kernel.
    fn case<P: Element>(
        rng: &mut Rng,
        (m, n, k): (usize, usize, usize),
        bits: u32,
        group: usize,
        (int16, amx): (bool, bool),
    ) {
        let lay = Layout::new(bits, group, n, k).unwrap();
        let (w, s, b, x) = random::<P>(rng, (m, n, k), &lay);
        let wv = QView::new("w", &w, &s, &b, lay, 1).unwrap();
        let px = PreparedX::with_amx(x.chunks_exact(k), &lay, int16, amx);
        let tiles = int16 && amx && m >= crate::kernels::cpu::amx::MIN_ROWS;
        assert_eq!(matches!(px.form, XForm::Amx(_)), tiles);
        // Int16 x of 4+ rows off the tiles: one scale per group (row_lanes).
        let per_group = int16
            && !tiles
            && m >= crate::kernels::cpu::row_lanes::min_rows()
            && crate::kernels::cpu::row_lanes::enabled();
        assert_eq!(px.int16().is_some(), int16 && !tiles && !per_group);
        assert_eq!(matches!(px.form, XForm::GroupInt16(_)), per_group);
        let unit = if per_group { group } else { lay.vals_per_word };
        let what = format!("m={m} n={n} k={k} bits={bits} group={group} int16={int16} amx={amx}");
        check_against_f64(&x, &wv, int16.then_some(unit), &what, |xr, wr, out, st| {
            dot_rows(&px, xr, &wv, wr, out, st)
        });
    }

    #[test]
    fn matches_f64_reference() {
        if !isa::avx512_available() {
            return;
        }
        let mut rng = Rng::new(0x512);
        // m covers every register block (4, 2, 1 x rows, and the 4-row
        // block repeated) and both AMX forms; n leaves
        // remainders of the 4- and 2-row weight blocks; k = 576 leaves a
        // half block (4-bit), k = 96 only a short block.
        for (m, n, k, bits, group) in [
            (1, 23, 576, 4, 32),
            (3, 9, 576, 8, 32),
            (17, 18, 576, 4, 64),
            (12, 7, 256, 8, 128),
            (6, 5, 96, 4, 32),
            (2, 33, 1536, 4, 128),
            // 8+ rows on AMX's grouped form, a short final chunk of K.
            (9, 5, 96, 4, 32),
            // 64+ rows: AMX's dequantized form (pairs of x chunks and a
            // single one; a short last block).
            (70, 9, 576, 4, 32),
            (66, 5, 256, 8, 64),
        ] {
            for mode in [(false, false), (true, false), (true, true)] {
                let usable = match mode {
                    (false, _) => true,
                    (true, false) => isa::avx512_int16_available(),
                    (true, true) => crate::kernels::cpu::amx::available(),
                };
                if !usable {
                    continue;
                }
                case::<f32>(&mut rng, (m, n, k), bits, group, mode);
                case::<half::f16>(&mut rng, (m, n, k), bits, group, mode);
                case::<half::bf16>(&mut rng, (m, n, k), bits, group, mode);
            }
        }
    }

    /// bf16 x against 4-bit W through `vdpbf16ps` (exact mode): within f32
    /// rounding of the f64 dot of the same bf16 values, counted on the
    /// `128 + q` magnitudes the kernel sums before taking the offset off;
    /// every register block, a short final block, f32/f16/bf16 params, a
    /// strided sub-range of rows; NaN in x reaches its row only.
    #[test]
    fn bf16_x_matches_f64_reference() {
        if !isa::avx512_bf16_available() {
            return;
        }
        let mut rng = Rng::new(0xbf16);
        for (m, n, k, group) in [
            (1, 23, 576, 32),
            (3, 9, 576, 64),
            (6, 5, 96, 32),
            (9, 33, 1536, 128),
        ] {
            bf16_case::<f32>(&mut rng, (m, n, k), group);
            bf16_case::<half::f16>(&mut rng, (m, n, k), group);
            bf16_case::<half::bf16>(&mut rng, (m, n, k), group);
        }
    }

    fn bf16_case<P: Element>(rng: &mut Rng, (m, n, k): (usize, usize, usize), group: usize) {
        let lay = Layout::new(4, group, n, k).unwrap();
        let (w, s, b, x) = random::<P>(rng, (m, n, k), &lay);
        let mut x: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let wv = QView::new("w", &w, &s, &b, lay, 1).unwrap();
        let run = |x: &[half::bf16]| {
            let px = PreparedX::new(x.chunks_exact(k), &lay, false);
            assert!(px.bf16().is_some() && px.perm.is_empty());
            let (xr, wr) = (m / 3..m, 1..n);
            let stride = xr.len() + 3;
            let mut out = vec![f32::NAN; wr.len() * stride];
            let st = OutStrides {
                x_stride: 1,
                w_stride: stride,
            };
            dot_rows(&px, xr, &wv, wr, &mut out, st);
            (out, stride)
        };
        let (out, stride) = run(&x);
        for (i, xi) in (m / 3..m).enumerate() {
            for (j, r) in (1..n).enumerate() {
                let (mut want, mut mag) = (0.0f64, 0.0f64);
                for c in 0..k {
                    let xv = x[xi * k + c].to_f32() as f64;
                    let wc = weight(&wv, r, c);
                    want += xv * wc;
                    let g = r * lay.groups_per_row + c / group;
                    let q = (wc - wv.biases[g].to_f32() as f64) / wv.scales[g].to_f32() as f64;
                    mag +=
                        (xv * wc).abs() + (xv * (128.0 + q) * wv.scales[g].to_f32() as f64).abs();
                }
                let got = out[i + j * stride] as f64;
                assert!(
                    (got - want).abs() <= 1e-6 * mag,
                    "m={m} n={n} k={k} group={group} x row {xi} w row {r}: {got} vs {want}"
                );
            }
            assert!(out[(n - 2) * stride + (m - m / 3)..]
                .iter()
                .all(|v| v.is_nan()));
        }
        let row = m - 1;
        x[row * k + k / 2] = half::bf16::NAN;
        let (out, stride) = run(&x);
        let i = row - m / 3;
        for j in 0..n - 1 {
            assert!(out[i + j * stride].is_nan());
            if i > 0 {
                assert!(out[j * stride].is_finite());
            }
        }
    }

    /// Int16 x is not exact: the rounding the reference allows is real and
    /// far below Int8's (a check that the bound above is not vacuous), and
    /// NaN in x reaches the output.
    #[test]
    fn int16_rounding_is_small_but_present() {
        if !isa::avx512_int16_available() {
            return;
        }
        let mut rng = Rng::new(0x16);
        let (m, n, k) = (3, 40, 576);
        let lay = Layout::new(4, 32, n, k).unwrap();
        let (w, s, b, mut x) = random::<f32>(&mut rng, (m, n, k), &lay);
        let wv = QView::new("w", &w, &s, &b, lay, 1).unwrap();
        let st = OutStrides {
            x_stride: n,
            w_stride: 1,
        };
        let run = |x: &[f32], int16: bool| {
            let px = PreparedX::new(x.chunks_exact(k), &lay, int16);
            let mut out = vec![f32::NAN; m * n];
            dot_rows(&px, 0..m, &wv, 0..n, &mut out, st);
            out
        };
        let (exact, rounded) = (run(&x, false), run(&x, true));
        let rel = exact
            .iter()
            .zip(&rounded)
            .map(|(e, r)| ((e - r) / e.abs().max(1.0)).abs())
            .fold(0.0f32, f32::max);
        assert!(rel > 0.0 && rel < 1e-4, "int16 relative error {rel}");
        x[k + 17] = f32::NAN;
        let out = run(&x, true);
        assert!(out[n..2 * n].iter().all(|v| v.is_nan()));
        assert!(out[..n].iter().chain(&out[2 * n..]).all(|v| v.is_finite()));
    }
}
