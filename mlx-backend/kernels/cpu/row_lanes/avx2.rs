//! The AVX2 body of [`super`]: a 256-bit vector holds the same packed word
//! of 8 weight rows, each x pair it meets is broadcast, and `vpmaddwd` +
//! `vpaddd` add 16 multiply-adds into the lanes' int32 sums, which run over
//! a whole group. Per group and x row one epilogue (convert, x's scale, W's
//! scales, the bias term) serves 8 weight rows; a word's unpack (a shift
//! and a mask per pair) serves every x row of the pass. W's words, scales
//! and biases are transposed per 8-row tile (8×8 transposes of 32-bit
//! lanes) into an L1 scratch.

use super::x86::{region, Prefetch};
use super::{GroupInt16Rows, OutStrides, QView};
use crate::kernels::cpu::layout::Layout;
use crate::kernels::cpu::layout::INT16_MAX;
use crate::kernels::cpu::simd::Element;
use crate::kernels::cpu::unpack::avx2::int16_field;
use std::arch::x86_64::*;
use std::ops::Range;

/// One row of x (natural order) to [`GroupInt16Rows`]' pairs and per-group
/// scales, with the AVX-512 body's arithmetic: per group the largest |x|
/// sets the scale, 8 values (one word of 4-bit W, two of 8-bit) are
/// rounded per vector and paired (value p with p + vals_per_word / 2).
///
/// # Safety
/// Needs AVX2; `x` holds `lay.k` values, `pairs` `lay.k / 2`, `scales`
/// `lay.groups_per_row`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_row(x: &[f32], lay: &Layout, pairs: &mut [i32], scales: &mut [f32]) {
    let group = lay.group_size;
    assert!(x.len() == lay.k && pairs.len() == lay.k / 2 && scales.len() == lay.groups_per_row);
    // Low halves: values p of each word; high halves: values p + vpw / 2.
    let order = if lay.bits == 4 {
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
    } else {
        _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7)
    };
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let low = _mm_set1_epi32(0xffff);
    for (g, chunk) in x.chunks_exact(group).enumerate() {
        let (mut max, mut nan) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for v in chunk.chunks_exact(8) {
            // SAFETY: 8 values.
            let xv = unsafe { _mm256_loadu_ps(v.as_ptr()) };
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(xv, xv));
            max = _mm256_max_ps(max, _mm256_and_ps(xv, abs));
        }
        let mut lanes = [0.0f32; 8];
        // SAFETY: 8 f32 into an 8-f32 array.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), max) };
        let m = lanes.iter().fold(0.0f32, |a, &v| a.max(v));
        let any_nan = _mm256_movemask_ps(nan) != 0;
        let usable = !any_nan && m > 0.0 && m.is_finite();
        scales[g] = if any_nan { f32::NAN } else { m / INT16_MAX };
        let inv = if usable {
            _mm256_div_ps(_mm256_set1_ps(INT16_MAX), _mm256_set1_ps(m))
        } else {
            _mm256_setzero_ps()
        };
        for (c, v) in chunk.chunks_exact(8).enumerate() {
            // SAFETY: 8 values in, 4 pairs out inside the group's pairs.
            unsafe {
                let q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v.as_ptr()), inv));
                let q = _mm256_permutevar8x32_epi32(q, order);
                let (lo, hi) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
                let pair = _mm_or_si128(_mm_and_si128(lo, low), _mm_slli_epi32::<16>(hi));
                let at = (g * group + c * 8) / 2;
                _mm_storeu_si128(pairs.as_mut_ptr().add(at).cast(), pair);
            }
        }
    }
}

/// x rows per pass over a tile.
const MR: usize = 8;

/// 8 rows of 8 i32 to 8 columns (column j: element j of every row).
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    let mut t = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        t[2 * k] = _mm256_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    // u[4a + c]: 128-bit lane L holds column 4L + c of rows 4a..4a + 4.
    let mut u = [_mm256_setzero_si256(); 8];
    for a in 0..2 {
        let (lo, hi) = (t[4 * a], t[4 * a + 1]);
        let (lo2, hi2) = (t[4 * a + 2], t[4 * a + 3]);
        u[4 * a] = _mm256_unpacklo_epi64(lo, lo2);
        u[4 * a + 1] = _mm256_unpackhi_epi64(lo, lo2);
        u[4 * a + 2] = _mm256_unpacklo_epi64(hi, hi2);
        u[4 * a + 3] = _mm256_unpackhi_epi64(hi, hi2);
    }
    let mut out = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        out[c] = _mm256_permute2x128_si256::<0x20>(u[c], u[4 + c]);
        out[4 + c] = _mm256_permute2x128_si256::<0x31>(u[c], u[4 + c]);
    }
    out
}

/// Columns `0..len` of 8 rows (`rows[j]` each `len` 32-bit values, as
/// `load` reads `n ≤ 8` of them with zeros above), transposed into
/// `dst[c]` (lane j = row j's column c). A plain function and a `fn`
/// pointer-free loader: closures here were not inlined (a call per load).
///
/// # Safety
/// Needs AVX2 (and F16C for params); each `rows[j]` must hold `len` values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose_rows<T: Load32>(rows: [*const T; 8], len: usize, dst: &mut [__m256i]) {
    for c0 in (0..len).step_by(8) {
        let n = (len - c0).min(8);
        // SAFETY: columns c0..c0 + n of each row are readable.
        let cols: [__m256i; 8] = std::array::from_fn(|j| unsafe { T::load(rows[j].add(c0), n) });
        for (d, c) in dst[c0..].iter_mut().zip(transpose8(cols)) {
            *d = c;
        }
    }
}

/// A 32-bit lane's source: packed words as they are, params widened to
/// f32 bits.
trait Load32: Sized {
    /// `n` (≤ 8) values from `p`, zero above.
    ///
    /// # Safety
    /// Needs AVX2 and F16C; `p..p + n` must be readable.
    unsafe fn load(p: *const Self, n: usize) -> __m256i;
}

impl Load32 for u32 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const u32, n: usize) -> __m256i {
        // SAFETY: as the trait's.
        unsafe { load_u32s(p, n) }
    }
}

/// Params (scales, biases) of element type `P`.
#[repr(transparent)]
struct Param<P>(P);

impl<P: Element> Load32 for Param<P> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const Self, n: usize) -> __m256i {
        // SAFETY: as the trait's; `Param<P>` is `P`.
        unsafe { load_params(p.cast::<P>(), n) }
    }
}

/// `n` (≤ 8) u32 from `p`, zero above: a plain load for 8.
///
/// # Safety
/// `p..p + n` must be readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_u32s(p: *const u32, n: usize) -> __m256i {
    if n == 8 {
        // SAFETY: 8 readable values.
        unsafe { _mm256_loadu_si256(p.cast()) }
    } else {
        let mut v = [0u32; 8];
        // SAFETY: n readable values.
        unsafe { std::ptr::copy_nonoverlapping(p, v.as_mut_ptr(), n) };
        // SAFETY: 8 values in the array.
        unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
    }
}

/// `n` (≤ 8) params from `p` widened to f32 bits, zero above.
///
/// # Safety
/// `p..p + n` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_params<P: Element>(p: *const P, n: usize) -> __m256i {
    if n == 8 {
        // SAFETY: 8 readable values.
        _mm256_castps_si256(unsafe { P::load8(p) })
    } else {
        let mut v = [0.0f32; 8];
        for (j, d) in v.iter_mut().enumerate().take(n) {
            // SAFETY: j < n readable values; the features include F16C.
            *d = unsafe { P::widen1(*p.add(j)) };
        }
        // SAFETY: 8 values in the array.
        unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
    }
}

/// [`drive`]'s per-tile buffers and its x rows interleaved per pass,
/// kept per thread between calls.
#[derive(Default)]
struct TileScratch {
    words: Vec<__m256i>,
    scales: Vec<__m256>,
    biases: Vec<__m256>,
    x: PassX,
}

/// x rows `i0..i0 + R` of a pass interleaved, so that the R values a pass
/// needs together are adjacent and one base register addresses them all:
/// pair `j` of row `i` at `j · R + i`, its group `g`'s scale and Σx at
/// `g · R + i`. With the rows apart (one pointer each) a pass at 8 rows ran
/// out of registers and reloaded a row's pointer from the stack before
/// each broadcast, a second load per `vpmaddwd`.
#[derive(Default)]
struct PassX {
    pairs: Vec<i32>,
    scales: Vec<f32>,
    sums: Vec<f32>,
    /// Pairs and groups per x row, as `fill` last saw them.
    row_pairs: usize,
    groups: usize,
}

impl PassX {
    /// Every pass of `xrows` (blocks of [`MR`] rows, the last shorter), one
    /// after another: block `b` starts at `b · MR` rows' worth of entries.
    fn fill(&mut self, x: &GroupInt16Rows, group_sums: &[f32], xrows: Range<usize>) {
        let (row_pairs, groups) = (x.row_pairs, x.groups);
        (self.row_pairs, self.groups) = (row_pairs, groups);
        let rows = xrows.len();
        self.pairs.resize(rows * row_pairs, 0);
        self.scales.resize(rows * groups, 0.0);
        self.sums.resize(rows * groups, 0.0);
        let mut i0 = xrows.start;
        while i0 < xrows.end {
            let r = (xrows.end - i0).min(MR);
            let b = i0 - xrows.start;
            let pairs = &mut self.pairs[b * row_pairs..][..r * row_pairs];
            let scales = &mut self.scales[b * groups..][..r * groups];
            let sums = &mut self.sums[b * groups..][..r * groups];
            for i in 0..r {
                let (row, row_scales) = x.row(i0 + i);
                interleave(pairs, i, r, row);
                interleave(scales, i, r, row_scales);
                interleave(sums, i, r, &group_sums[(i0 + i) * groups..][..groups]);
            }
            i0 += r;
        }
    }

    /// The pass of rows `b..b + r` (offsets into the filled `xrows`).
    fn block(&self, b: usize, r: usize) -> PassRows<'_> {
        let (row_pairs, groups) = (self.row_pairs, self.groups);
        PassRows {
            pairs: &self.pairs[b * row_pairs..][..r * row_pairs],
            scales: &self.scales[b * groups..][..r * groups],
            sums: &self.sums[b * groups..][..r * groups],
        }
    }
}

/// Row `i`'s values into `dst` at `i`, `i + r`, `i + 2r`, …
fn interleave<T: Copy>(dst: &mut [T], i: usize, r: usize, row: &[T]) {
    for (d, &v) in dst[i..].iter_mut().step_by(r).zip(row) {
        *d = v;
    }
}

/// One pass's x, interleaved as [`PassX`] lays it out.
struct PassRows<'a> {
    pairs: &'a [i32],
    scales: &'a [f32],
    sums: &'a [f32],
}

thread_local! {
    static TILE_SCRATCH: std::cell::Cell<TileScratch> =
        std::cell::Cell::new(TileScratch::default());
}

/// [`super::dot_rows`] on AVX2.
///
/// # Safety
/// Needs AVX2, FMA and F16C; the caller checked the bounds of x, W and out.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn drive<P: Element, const BITS: u32>(
    x: &GroupInt16Rows,
    group_sums: &[f32],
    xrows: Range<usize>,
    w: &QView<P>,
    rows: Range<usize>,
    out: &mut [f32],
    st: OutStrides,
) {
    let lay = &w.lay;
    let (words, groups) = (lay.words_per_row, lay.groups_per_row);
    let mut scratch = TILE_SCRATCH.take();
    scratch.words.resize(words, _mm256_setzero_si256());
    scratch.scales.resize(groups, _mm256_setzero_ps());
    scratch.biases.resize(groups, _mm256_setzero_ps());
    scratch.x.fill(x, group_sums, xrows.clone());
    let TileScratch {
        words: wt,
        scales,
        biases,
        x: px,
    } = &mut scratch;
    let px = &*px;
    let (wt, scales, biases) = (
        &mut wt[..words],
        &mut scales[..groups],
        &mut biases[..groups],
    );
    let mut t0 = rows.start;
    while t0 < rows.end {
        let n = (rows.end - t0).min(8);
        // Rows past the share repeat the last one; their lanes are never stored.
        let row = |j: usize| t0 + j.min(n - 1);
        // The next tile's lines, a few per group of the first pass.
        let next = (t0 + 8).min(rows.end);
        let ahead = (rows.end - next).min(8);
        let mut prefetch = Prefetch::new([
            region(w.w.as_ptr().wrapping_add(next * words), ahead * words),
            region(
                w.scales.as_ptr().wrapping_add(next * groups),
                ahead * groups,
            ),
            region(
                w.biases.as_ptr().wrapping_add(next * groups),
                ahead * groups,
            ),
        ]);
        // SAFETY (transposes): row(j) < rows.end lies inside W and its params.
        unsafe {
            let word_rows = std::array::from_fn(|j| w.w.as_ptr().add(row(j) * words));
            transpose_rows::<u32>(word_rows, words, &mut *wt);
            for (src, dst) in [(w.scales, &mut *scales), (w.biases, &mut *biases)] {
                // f32 bits through the integer transpose, `groups` vectors.
                let dst: &mut [__m256i] =
                    std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast(), groups);
                let param_rows =
                    std::array::from_fn(|j| src.as_ptr().add(row(j) * groups).cast::<Param<P>>());
                transpose_rows::<Param<P>>(param_rows, groups, dst);
            }
        }
        let tile = Tile {
            words: wt,
            scales,
            biases,
        };
        let mut i = xrows.start;
        while i < xrows.end {
            let mr = (xrows.end - i).min(MR);
            let pf = &mut prefetch;
            let xs = px.block(i - xrows.start, mr);
            // SAFETY: the pass holds mr whole rows; the tile holds whole rows.
            let res = unsafe {
                match mr {
                    8 => pass::<BITS, 8>(&xs, &tile, lay, pf),
                    7 => pass::<BITS, 7>(&xs, &tile, lay, pf),
                    6 => pass::<BITS, 6>(&xs, &tile, lay, pf),
                    5 => pass::<BITS, 5>(&xs, &tile, lay, pf),
                    4 => pass::<BITS, 4>(&xs, &tile, lay, pf),
                    3 => pass::<BITS, 3>(&xs, &tile, lay, pf),
                    2 => pass::<BITS, 2>(&xs, &tile, lay, pf),
                    _ => pass::<BITS, 1>(&xs, &tile, lay, pf),
                }
            };
            for (di, v) in res.iter().take(mr).enumerate() {
                let base = (i + di - xrows.start) * st.x_stride + (t0 - rows.start) * st.w_stride;
                if st.w_stride == 1 && n == 8 {
                    // SAFETY: the caller checked that the last element fits.
                    unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(base), *v) };
                } else {
                    let mut lanes_out = [0.0f32; 8];
                    // SAFETY: 8 f32 into an 8-f32 array.
                    unsafe { _mm256_storeu_ps(lanes_out.as_mut_ptr(), *v) };
                    for (j, val) in lanes_out.iter().take(n).enumerate() {
                        out[base + j * st.w_stride] = *val;
                    }
                }
            }
            i += mr;
        }
        t0 += n;
    }
    TILE_SCRATCH.set(scratch);
}

/// One tile of 8 weight rows, transposed: per word, per group.
struct Tile<'t> {
    words: &'t [__m256i],
    scales: &'t [__m256],
    biases: &'t [__m256],
}

/// The R x rows of `xs` against `tile`, issuing `prefetch`'s hints over its
/// groups: lane j of result `i` is the pass's x row `i` against the tile's
/// weight row j. Returns [`MR`] vectors, the first R used. Unlike the AVX-512
/// body this one does not drain the thread's background regions
/// ([`super::prefetch_in_background`]): on a Zen 3 with a 512 KB L2 the
/// decode block's KV rows prefetched during its q/k/v projections made
/// that stage ~20% slower (230–250 → 180–200 µs per block at batch 8)
/// and the attention no faster.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pass<const BITS: u32, const R: usize>(
    xs: &PassRows,
    tile: &Tile,
    lay: &Layout,
    prefetch: &mut Prefetch<[(*const i8, usize); 3]>,
) -> [__m256; MR] {
    let (wt, scales, biases) = (tile.words, tile.scales, tile.biases);
    let half = (16 / BITS) as usize;
    let groups = lay.groups_per_row;
    let per_group = prefetch.lines().div_ceil(groups.max(1));
    let words_per_group = lay.group_size / lay.vals_per_word;
    debug_assert!(xs.pairs.len() == R * lay.k / 2 && xs.scales.len() == R * groups);
    let mut res = [_mm256_setzero_ps(); MR];
    for g in 0..groups {
        prefetch.issue(per_group);
        let mut acc = [_mm256_setzero_si256(); R];
        let first = g * words_per_group;
        for (wi, &word) in wt.iter().enumerate().skip(first).take(words_per_group) {
            for p in 0..half {
                let q = int16_field::<BITS>(word, p);
                let at = (wi * half + p) * R;
                for (i, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: word wi < words_per_row and p < half: inside the pass's pairs.
                    let pair = unsafe { *xs.pairs.get_unchecked(at + i) };
                    let xv = _mm256_set1_epi32(pair);
                    *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(q, xv));
                }
            }
        }
        let (s, b) = (scales[g], biases[g]);
        for i in 0..R {
            // SAFETY: g < groups: inside the pass's scales and sums.
            let (d, sum) = unsafe {
                (
                    *xs.scales.get_unchecked(g * R + i),
                    *xs.sums.get_unchecked(g * R + i),
                )
            };
            let t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[i]), _mm256_set1_ps(d));
            res[i] = _mm256_fmadd_ps(t, s, res[i]);
            res[i] = _mm256_fmadd_ps(b, _mm256_set1_ps(sum), res[i]);
        }
    }
    res
}
