//! Int16 x against affine-quantized weights with **one weight row per
//! lane**: a 512-bit vector holds the same packed word of 16 weight rows,
//! and each x pair it meets is broadcast. For 4 or more x rows on AVX-512
//! VNNI this replaces [`super::blocked::avx512`]'s int16 body, whose lanes are 16
//! words of one weight row.
//!
//! Why: there, every block of 16 words ends with a per-lane epilogue for
//! each (x row, weight row) pair (convert the int32 sums, scale by x's
//! per-word scales and W's per-group scales), and the 4-bit unpack is
//! shared by at most 4 x rows: about three other instructions per
//! `vpdpwssd`, which is what bounds it (43 GMAC/s at 8 rows on a Zen 4
//! core whose `vpdpwssd` peak is ~200). Here a lane keeps one weight row
//! for a whole group, so the int32 sums run over the group and the
//! epilogue comes once per (group, x row) for 16 weight rows; a word's
//! unpack serves every x row of the call.
//!
//! The price is that x carries **one scale per group** (`max|x over the
//! group| / 32767`, [`GroupInt16Rows`]) instead of one per word, so the
//! same int16 precision class is a little coarser for small values that
//! share a group with a large one, and W's words and params are
//! transposed per 16-row tile in registers (4 shuffle rounds per 16
//! words) into an L1 scratch that every x row then reads.
//!
//! On CPUs with AVX2 but no AVX-512 the same scheme runs on 256-bit
//! vectors ([`avx2`]: 8 weight rows per vector, `vpmaddwd` + `vpaddd`).

use std::ops::Range;

use super::layout::OutStrides;
use super::layout::{Layout, QView};
use super::simd::Element;

/// x rows from which [`PreparedX`](super::prepare::PreparedX) takes this
/// kernel instead of the per-word one, by the body that runs: 4 on
/// AVX-512 VNNI (at 2 rows the per-tile transposes outweigh what it
/// saves), 8 on AVX2, where at 4 rows it ran 0.82–0.91× the per-word
/// kernel (`dot_rows` in `benches/cpu_kernels.rs`, three shapes, three runs) and at 8 about even.
pub(crate) fn min_rows() -> usize {
    match Body::best() {
        Some(Body::Avx2) => 8,
        _ => 4,
    }
}

/// Whether int16 x of [`min_rows`]+ rows takes this kernel: one of its
/// bodies runs ([`Body::best`]) and `MLX_BACKEND_ROW_LANES` is not
/// `0`/`off`/`false` (read once).
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !super::isa::switched_off("MLX_BACKEND_ROW_LANES") && Body::best().is_some())
}

/// The kernel's bodies: 16 weight rows per vector with `vpdpwssd`, or 8
/// with `vpmaddwd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    Avx512Vnni,
    Avx2,
}

impl Body {
    /// The widest body this CPU runs, if any (the AVX2 one also needs the
    /// AVX2 int16 kernel's switch on, [`super::isa::avx2_int16_available`]).
    pub(crate) fn best() -> Option<Body> {
        Body::available().last().copied()
    }

    /// [`Body::best`], for callers that were handed x of this kernel.
    fn required() -> Body {
        Body::best().expect("int16 x of one scale per group needs AVX2 or AVX-512 VNNI")
    }

    /// Every body this CPU runs, narrowest first (probed once; tests run each).
    pub(crate) fn available() -> &'static [Body] {
        static BODIES: std::sync::OnceLock<Vec<Body>> = std::sync::OnceLock::new();
        BODIES.get_or_init(|| {
            let mut bodies = Vec::new();
            if super::isa::avx2_int16_available() {
                bodies.push(Body::Avx2);
            }
            if super::isa::avx512_int16_available() {
                bodies.push(Body::Avx512Vnni);
            }
            bodies
        })
    }
}

/// x rows rounded to int16 with one scale per group of W's quantisation:
/// `x ≈ scale · q`, `scale = max|x over the group| / 32767`, each value off
/// by at most `scale / 2`. A NaN in a group makes its scale NaN; a zero or
/// infinite largest |x| rounds the group to zeros (with an infinite scale
/// the products are then NaN, as with exact x).
///
/// Per row, the pairs in word order: word `w`'s pair `p` (values `p` and
/// `p + vals_per_word / 2` of the word, low and high int16 of an i32) at
/// `w · vals_per_word / 2 + p`, matching the unpack of a packed word by
/// one shift and one mask.
pub(crate) struct GroupInt16Rows {
    pairs: Vec<i32>,
    scales: Vec<f32>,
    row_pairs: usize,
    groups: usize,
}

impl GroupInt16Rows {
    pub(crate) fn new(lay: &Layout) -> Self {
        GroupInt16Rows {
            pairs: Vec::new(),
            scales: Vec::new(),
            row_pairs: lay.k / 2,
            groups: lay.groups_per_row,
        }
    }

    /// Appends one row of x in natural order (`lay.k` values), rounded
    /// by the best body's code (both round alike).
    ///
    /// # Panics
    /// Without a body ([`Body::best`]), or when `x` is not one row long.
    pub(crate) fn push(&mut self, x: &[f32], lay: &Layout) {
        self.push_with(Body::required(), x, lay);
    }

    /// [`Self::push`] through `body`'s code.
    pub(crate) fn push_with(&mut self, body: Body, x: &[f32], lay: &Layout) {
        assert!(
            Body::available().contains(&body),
            "{body:?} does not run here"
        );
        assert_eq!(x.len(), lay.k);
        let (p0, s0) = (self.pairs.len(), self.scales.len());
        self.pairs.resize(p0 + self.row_pairs, 0);
        self.scales.resize(s0 + self.groups, 0.0);
        let (pairs, scales) = (&mut self.pairs[p0..], &mut self.scales[s0..]);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the body's features were detected; the slices are the row's exact sizes.
        unsafe {
            match body {
                Body::Avx512Vnni => x86::quantize_row(x, lay, pairs, scales),
                Body::Avx2 => avx2::quantize_row(x, lay, pairs, scales),
            }
        };
    }

    fn row(&self, i: usize) -> (&[i32], &[f32]) {
        (
            &self.pairs[i * self.row_pairs..][..self.row_pairs],
            &self.scales[i * self.groups..][..self.groups],
        )
    }

    pub(crate) fn rows(&self) -> usize {
        self.scales.len() / self.groups.max(1)
    }
}

/// `Σ_k x[i][k] · W[r][k]` for x rows `xrows` of `x` (`group_sums`: exact
/// Σx per group, for the biases) and weight rows `rows` of `w`, into `out`
/// at `strides` (as [`super::dispatch::dot_rows`]).
///
/// # Panics
/// Without a body ([`Body::best`]), when `x` was prepared for another `k`,
/// `rows` leaves the matrix or `out` is too short.
pub(crate) fn dot_rows<P: Element>(
    x: &GroupInt16Rows,
    group_sums: &[f32],
    xrows: Range<usize>,
    w: &QView<P>,
    rows: Range<usize>,
    out: &mut [f32],
    strides: OutStrides,
) {
    dot_rows_with(
        Body::required(),
        x,
        group_sums,
        xrows,
        w,
        rows,
        out,
        strides,
    )
}

/// [`dot_rows`] through `body`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dot_rows_with<P: Element>(
    body: Body,
    x: &GroupInt16Rows,
    group_sums: &[f32],
    xrows: Range<usize>,
    w: &QView<P>,
    rows: Range<usize>,
    out: &mut [f32],
    strides: OutStrides,
) {
    let lay = &w.lay;
    assert!(
        Body::available().contains(&body),
        "{body:?} does not run here"
    );
    assert_eq!(x.row_pairs, lay.k / 2);
    assert_eq!(x.groups, lay.groups_per_row);
    assert!(group_sums.len() >= xrows.end * lay.groups_per_row);
    if !strides.check(&xrows, x.rows(), w, &rows, out.len()) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the features were detected; the asserts above bound every access.
    unsafe {
        match (body, lay.bits) {
            (Body::Avx512Vnni, 4) => {
                x86::drive::<P, 4>(x, group_sums, xrows, w, rows, out, strides)
            }
            (Body::Avx512Vnni, _) => {
                x86::drive::<P, 8>(x, group_sums, xrows, w, rows, out, strides)
            }
            (Body::Avx2, 4) => avx2::drive::<P, 4>(x, group_sums, xrows, w, rows, out, strides),
            (Body::Avx2, _) => avx2::drive::<P, 8>(x, group_sums, xrows, w, rows, out, strides),
        }
    }
}

/// Lines of the background regions hinted per group of a pass: with the
/// next tile's own few, a handful of prefetches per 16+ `vpdpwssd`.
const BACKGROUND_PER_GROUP: usize = 8;

/// Regions this thread will read soon (a decoder block's KV rows, read by
/// the attention after the q/k/v projections), prefetched a few lines per
/// group while this kernel computes on the same thread: spread so, the
/// hints do not crowd out the kernel's own loads, as one burst would.
#[cfg(target_arch = "x86_64")]
type Background = x86::Prefetch<Vec<(*const i8, usize)>>;

#[cfg(target_arch = "x86_64")]
thread_local! {
    static BACKGROUND: std::cell::Cell<Background> =
        std::cell::Cell::new(x86::Prefetch::new(Vec::new()));
}

/// Sets the regions (`(start, bytes)`) this thread's next calls prefetch
/// in the background; replaces any left from before. Hints only: the
/// memory is never read through them.
pub(crate) fn prefetch_in_background(regions: Vec<(*const u8, usize)>) {
    #[cfg(target_arch = "x86_64")]
    BACKGROUND.set(x86::Prefetch::new(
        regions.into_iter().map(|(p, n)| (p.cast(), n)).collect(),
    ));
}

/// Drops what is left of this thread's background regions.
pub(crate) fn stop_background_prefetch() {
    prefetch_in_background(Vec::new());
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Background, GroupInt16Rows, OutStrides, QView, BACKGROUND_PER_GROUP};
    use crate::kernels::cpu::layout::INT16_MAX;
    use crate::kernels::cpu::simd::Element;
    use crate::kernels::cpu::unpack::avx512::{dpwssd_bcst, int16_field, load_params};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// One row of x (natural order) to [`GroupInt16Rows`]' pairs and
    /// per-group scales: 16 values (2 words of 4-bit W, 4 of 8-bit) per
    /// vector, rounded to int32, narrowed to int16 and put in pair order by
    /// one 16-bit permute.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn quantize_row(
        x: &[f32],
        lay: &crate::kernels::cpu::layout::Layout,
        pairs: &mut [i32],
        scales: &mut [f32],
    ) {
        let group = lay.group_size;
        // Within each word, value p next to value p + vals_per_word / 2.
        let order = if lay.bits == 4 {
            _mm256_setr_epi16(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15)
        } else {
            _mm256_setr_epi16(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15)
        };
        let max_q = _mm512_set1_ps(INT16_MAX);
        for (g, chunk) in x.chunks_exact(group).enumerate() {
            let (mut max, mut nan) = (_mm512_setzero_ps(), 0 as __mmask16);
            for v in chunk.chunks_exact(16) {
                // SAFETY: 16 values.
                let xv = unsafe { _mm512_loadu_ps(v.as_ptr()) };
                nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(xv, xv);
                max = _mm512_max_ps(max, _mm512_abs_ps(xv));
            }
            let m = _mm512_reduce_max_ps(max);
            let usable = nan == 0 && m > 0.0 && m.is_finite();
            scales[g] = if nan != 0 { f32::NAN } else { m / INT16_MAX };
            let inv = if usable {
                _mm512_div_ps(max_q, _mm512_set1_ps(m))
            } else {
                _mm512_setzero_ps()
            };
            for (c, v) in chunk.chunks_exact(16).enumerate() {
                // SAFETY: 16 values in, 8 pairs out inside the group's pairs.
                unsafe {
                    let xv = _mm512_loadu_ps(v.as_ptr());
                    let q = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(xv, inv)));
                    let at = (g * group + c * 16) / 2;
                    let out = _mm256_permutexvar_epi16(order, q);
                    _mm256_storeu_si256(pairs.as_mut_ptr().add(at).cast(), out);
                }
            }
        }
    }

    /// x rows per pass over a tile (accumulators and results in registers).
    const MR: usize = 8;

    /// 16 rows of 16 i32 to 16 columns (column j: element j of every row).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
        let mut t = [_mm512_setzero_si512(); 16];
        for k in 0..8 {
            t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
            t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
        }
        // u[4a + c]: 128-bit lane L holds column 4L + c of rows 4a..4a + 4.
        let mut u = [_mm512_setzero_si512(); 16];
        for a in 0..4 {
            let (lo, hi) = (t[4 * a], t[4 * a + 1]);
            let (lo2, hi2) = (t[4 * a + 2], t[4 * a + 3]);
            u[4 * a] = _mm512_unpacklo_epi64(lo, lo2);
            u[4 * a + 1] = _mm512_unpackhi_epi64(lo, lo2);
            u[4 * a + 2] = _mm512_unpacklo_epi64(hi, hi2);
            u[4 * a + 3] = _mm512_unpackhi_epi64(hi, hi2);
        }
        let mut out = [_mm512_setzero_si512(); 16];
        for c in 0..4 {
            let (a, b, cc, d) = (u[c], u[4 + c], u[8 + c], u[12 + c]);
            let v0 = _mm512_shuffle_i32x4::<0x44>(a, b);
            let v1 = _mm512_shuffle_i32x4::<0xEE>(a, b);
            let v2 = _mm512_shuffle_i32x4::<0x44>(cc, d);
            let v3 = _mm512_shuffle_i32x4::<0xEE>(cc, d);
            out[c] = _mm512_shuffle_i32x4::<0x88>(v0, v2);
            out[4 + c] = _mm512_shuffle_i32x4::<0xDD>(v0, v2);
            out[8 + c] = _mm512_shuffle_i32x4::<0x88>(v1, v3);
            out[12 + c] = _mm512_shuffle_i32x4::<0xDD>(v1, v3);
        }
        out
    }

    /// Mask of the first `n` (≤ 16) lanes.
    #[inline]
    fn lanes(n: usize) -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    /// Columns `0..len` of the 16 rows `row(j)` (each `len` long), in
    /// chunks of 16, transposed into `dst[c]` (lane j = row j's column c).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn transpose_rows(
        len: usize,
        load: impl Fn(usize, usize, __mmask16) -> __m512i,
        dst: &mut [__m512i],
    ) {
        for c0 in (0..len).step_by(16) {
            let mask = lanes(len - c0);
            let rows: [__m512i; 16] = std::array::from_fn(|j| load(j, c0, mask));
            let cols = transpose16(rows);
            for (d, c) in dst[c0..].iter_mut().zip(cols) {
                *d = c;
            }
        }
    }

    /// `len` elements from `start` as a byte region.
    pub(super) fn region<T>(start: *const T, len: usize) -> (*const i8, usize) {
        (start.cast(), len * std::mem::size_of::<T>())
    }

    /// The cache lines of a few regions, handed out as prefetch hints a
    /// share at a time.
    pub(super) struct Prefetch<R> {
        pub(super) regions: R,
        /// Next (region, byte offset).
        at: (usize, usize),
    }

    impl<R: AsRef<[(*const i8, usize)]>> Prefetch<R> {
        pub(super) fn new(regions: R) -> Self {
            Prefetch {
                regions,
                at: (0, 0),
            }
        }

        pub(super) fn lines(&self) -> usize {
            self.regions.as_ref().iter().map(|r| r.1.div_ceil(64)).sum()
        }

        /// Hints for the next `n` lines.
        #[inline]
        pub(super) fn issue(&mut self, mut n: usize) {
            let regions = self.regions.as_ref();
            while n > 0 && self.at.0 < regions.len() {
                let (start, bytes) = regions[self.at.0];
                if self.at.1 >= bytes {
                    self.at = (self.at.0 + 1, 0);
                    continue;
                }
                // SAFETY: a prefetch is a hint and never faults.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(self.at.1)) };
                self.at.1 += 64;
                n -= 1;
            }
        }
    }

    /// [`drive`]'s per-tile buffers, kept per thread between calls.
    #[derive(Default)]
    struct TileScratch {
        words: Vec<__m512i>,
        scales: Vec<__m512>,
        biases: Vec<__m512>,
    }

    thread_local! {
        static TILE_SCRATCH: std::cell::Cell<TileScratch> =
            std::cell::Cell::new(TileScratch::default());
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
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
        let mut background = super::BACKGROUND.replace(Prefetch::new(Vec::new()));
        // The tile's words, scales and biases, one vector per column: the
        // thread's buffers from its earlier calls (each tile overwrites
        // every column it reads), not three allocations per call.
        let mut scratch = TILE_SCRATCH.take();
        scratch.words.resize(words, _mm512_setzero_si512());
        scratch.scales.resize(groups, _mm512_setzero_ps());
        scratch.biases.resize(groups, _mm512_setzero_ps());
        let TileScratch {
            words: wt,
            scales,
            biases,
        } = &mut scratch;
        let (wt, scales, biases) = (
            &mut wt[..words],
            &mut scales[..groups],
            &mut biases[..groups],
        );
        let mut t0 = rows.start;
        while t0 < rows.end {
            let n = (rows.end - t0).min(16);
            // Rows past the matrix's share repeat the last one; their
            // lanes are never stored.
            let row = |j: usize| t0 + j.min(n - 1);
            // W streams from memory: the first pass over this tile asks for
            // the next tile's lines, a few per group (a burst of them would
            // fill the miss buffers and stall the loads of this one).
            let next = (t0 + 16).min(rows.end);
            let ahead = (rows.end - next).min(16);
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
            // SAFETY (loads): `mask` keeps each load inside its row.
            unsafe {
                transpose_rows(
                    words,
                    |j, c0, mask| {
                        let p = w.w.as_ptr().add(row(j) * words + c0);
                        _mm512_maskz_loadu_epi32(mask, p.cast())
                    },
                    &mut *wt,
                );
                for (src, dst) in [(w.scales, &mut *scales), (w.biases, &mut *biases)] {
                    // f32 bits through the integer transpose.
                    let dst: &mut [__m512i] =
                        std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast(), groups);
                    transpose_rows(
                        groups,
                        |j, c0, mask| {
                            let p = src.as_ptr().add(row(j) * groups + c0);
                            _mm512_castps_si512(load_params(p, mask))
                        },
                        dst,
                    );
                }
            }
            let store = lanes(n);
            let mut i = xrows.start;
            while i < xrows.end {
                let mr = (xrows.end - i).min(MR);
                // SAFETY: the caller bounded x, W and out; `i..i + mr` are x rows.
                let tile = Tile {
                    words: wt,
                    scales,
                    biases,
                };
                let pf = (&mut prefetch, &mut background);
                let res = unsafe {
                    match mr {
                        8 => pass::<BITS, 8>(x, group_sums, i, &tile, lay, pf),
                        7 => pass::<BITS, 7>(x, group_sums, i, &tile, lay, pf),
                        6 => pass::<BITS, 6>(x, group_sums, i, &tile, lay, pf),
                        5 => pass::<BITS, 5>(x, group_sums, i, &tile, lay, pf),
                        4 => pass::<BITS, 4>(x, group_sums, i, &tile, lay, pf),
                        3 => pass::<BITS, 3>(x, group_sums, i, &tile, lay, pf),
                        2 => pass::<BITS, 2>(x, group_sums, i, &tile, lay, pf),
                        _ => pass::<BITS, 1>(x, group_sums, i, &tile, lay, pf),
                    }
                };
                for (di, v) in res.iter().take(mr).enumerate() {
                    let base =
                        (i + di - xrows.start) * st.x_stride + (t0 - rows.start) * st.w_stride;
                    if st.w_stride == 1 {
                        // SAFETY: the caller checked that the last element fits.
                        unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(base), store, *v) };
                    } else {
                        let mut lanes_out = [0.0f32; 16];
                        // SAFETY: 16 f32 into a 16-f32 array.
                        unsafe { _mm512_storeu_ps(lanes_out.as_mut_ptr(), *v) };
                        for (j, val) in lanes_out.iter().take(n).enumerate() {
                            out[base + j * st.w_stride] = *val;
                        }
                    }
                }
                i += mr;
            }
            t0 += n;
        }
        super::BACKGROUND.set(background);
        TILE_SCRATCH.set(scratch);
    }

    /// One tile of 16 weight rows, transposed: per word, per group.
    struct Tile<'t> {
        words: &'t [__m512i],
        scales: &'t [__m512],
        biases: &'t [__m512],
    }

    /// x rows `i0..i0 + R` against `tile`, issuing `prefetch`'s hints over
    /// its groups: lane j of result `i` is x row `i0 + i` against
    /// the tile's weight row j. Returns [`MR`] vectors, the first R used.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pass<const BITS: u32, const R: usize>(
        x: &GroupInt16Rows,
        group_sums: &[f32],
        i0: usize,
        tile: &Tile,
        lay: &crate::kernels::cpu::layout::Layout,
        (prefetch, background): (&mut Prefetch<[(*const i8, usize); 3]>, &mut Background),
    ) -> [__m512; MR] {
        let (wt, scales, biases) = (tile.words, tile.scales, tile.biases);
        let half = (16 / BITS) as usize;
        let groups = lay.groups_per_row;
        let per_group = prefetch.lines().div_ceil(groups.max(1));
        let words_per_group = lay.group_size / lay.vals_per_word;
        let rows: [(&[i32], &[f32]); R] = std::array::from_fn(|i| x.row(i0 + i));
        let sums: [&[f32]; R] = std::array::from_fn(|i| &group_sums[(i0 + i) * groups..][..groups]);
        let mut res = [_mm512_setzero_ps(); MR];
        for g in 0..groups {
            prefetch.issue(per_group);
            background.issue(BACKGROUND_PER_GROUP);
            let mut acc = [_mm512_setzero_si512(); R];
            let first = g * words_per_group;
            for (wi, &word) in wt.iter().enumerate().skip(first).take(words_per_group) {
                for p in 0..half {
                    let q = int16_field::<BITS>(word, p);
                    for i in 0..R {
                        // In bounds: word wi < words_per_row, p < half.
                        let pair = rows[i].0.as_ptr().add(wi * half + p);
                        acc[i] = dpwssd_bcst(acc[i], q, pair);
                    }
                }
            }
            let (s, b) = (scales[g], biases[g]);
            for i in 0..R {
                let d = _mm512_set1_ps(*rows[i].1.get_unchecked(g));
                let t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[i]), d);
                res[i] = _mm512_fmadd_ps(t, s, res[i]);
                let sum = _mm512_set1_ps(*sums[i].get_unchecked(g));
                res[i] = _mm512_fmadd_ps(b, sum, res[i]);
            }
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_util::Rng;
    use crate::kernels::cpu::test_util::{random, weight};

    /// `x [m, k]` rounded for the kernel by `body`'s code, and its exact
    /// group sums.
    fn prepare(body: Body, x: &[f32], lay: &Layout) -> (GroupInt16Rows, Vec<f32>) {
        let mut x16 = GroupInt16Rows::new(lay);
        let mut sums = Vec::new();
        for row in x.chunks_exact(lay.k) {
            x16.push_with(body, row, lay);
            sums.extend(
                row.chunks_exact(lay.group_size)
                    .map(|g| g.iter().sum::<f32>()),
            );
        }
        (x16, sums)
    }

    /// Each body against an f64 reference of the same rounded x (so the
    /// only differences are f32 accumulation), over tile remainders (16
    /// and 8 rows), x-row passes of every width, both strides and every
    /// params dtype; where both bodies run, they round x alike.
    #[test]
    fn matches_f64_reference_of_rounded_x() {
        let bodies = Body::available();
        if let [a, b] = *bodies {
            let mut rng = Rng::new(0xab);
            for (k, bits, group) in [(576, 4, 32), (256, 8, 64), (384, 4, 128)] {
                let lay = Layout::new(bits, group, 1, k).unwrap();
                let x: Vec<f32> = rng.elems(3 * k, 1.0);
                let (xa, _) = prepare(a, &x, &lay);
                let (xb, _) = prepare(b, &x, &lay);
                assert_eq!(xa.pairs, xb.pairs);
                assert!(xa
                    .scales
                    .iter()
                    .zip(&xb.scales)
                    .all(|(p, q)| p.to_bits() == q.to_bits()));
            }
        }
        let mut rng = Rng::new(0x1616);
        for (m, n, k, bits, group) in [
            (4, 16, 576, 4, 32),
            (9, 37, 576, 4, 32),
            (13, 5, 256, 8, 64),
            (8, 33, 1536, 4, 128),
            (5, 20, 512, 8, 128),
            (17, 18, 128, 4, 64),
            (3, 7, 96, 4, 32),
        ] {
            for &body in bodies {
                case::<f32>(body, &mut rng, (m, n, k), bits, group);
                case::<half::f16>(body, &mut rng, (m, n, k), bits, group);
                case::<half::bf16>(body, &mut rng, (m, n, k), bits, group);
            }
        }
    }

    fn case<P: Element>(
        body: Body,
        rng: &mut Rng,
        (m, n, k): (usize, usize, usize),
        bits: u32,
        group: usize,
    ) {
        let lay = Layout::new(bits, group, n, k).unwrap();
        let (w, s, b, x) = random::<P>(rng, (m, n, k), &lay);
        let wv = QView::new("w", &w, &s, &b, lay, 1).unwrap();
        let (x16, sums) = prepare(body, &x, &lay);
        // The rounded x, back in f32, and its distance from x.
        let rounded: Vec<f64> = (0..m * k)
            .map(|e| {
                let (i, c) = (e / k, e % k);
                let (pairs, scales) = x16.row(i);
                let (word, v) = (c / lay.vals_per_word, c % lay.vals_per_word);
                let half = lay.vals_per_word / 2;
                let pair = pairs[word * half + v % half];
                let q = if v < half {
                    pair as i16
                } else {
                    (pair >> 16) as i16
                };
                q as f64 * scales[c / group] as f64
            })
            .collect();
        for (e, (r, v)) in rounded.iter().zip(&x).enumerate() {
            let (i, c) = (e / k, e % k);
            let g = &x[i * k + c / group * group..][..group];
            let step = g.iter().fold(0.0f32, |a, v| a.max(v.abs())) as f64 / 32767.0;
            // Half a step, plus the f32 rounding of x · (32767 / max).
            assert!(
                (r - *v as f64).abs() <= step * 0.51,
                "x[{i}][{c}]: {r} vs {v}"
            );
        }
        for (strides, xr, wr) in [((n, 1), 0..m, 0..n), ((1, m + 3), 1..m, 3..n)] {
            let st = OutStrides {
                x_stride: strides.0,
                w_stride: strides.1,
            };
            let mut out = vec![f32::NAN; m * n + (m + 3) * n];
            dot_rows_with(body, &x16, &sums, xr.clone(), &wv, wr.clone(), &mut out, st);
            for (i, xi) in xr.clone().enumerate() {
                for (j, r) in wr.clone().enumerate() {
                    let (mut want, mut mag) = (0.0f64, 0.0f64);
                    for c in 0..k {
                        // The bias term uses exact x (the group sums).
                        let gi = r * lay.groups_per_row + c / group;
                        let bias = b[gi].to_f32() as f64;
                        let t = rounded[xi * k + c] * (weight(&wv, r, c) - bias)
                            + x[xi * k + c] as f64 * bias;
                        want += t;
                        mag += t.abs();
                    }
                    let got = out[i * st.x_stride + j * st.w_stride] as f64;
                    assert!(
                        (got - want).abs() <= 2e-6 * mag + 1e-6,
                        "{body:?} m={m} n={n} k={k} bits={bits} group={group} x {xi} w {r}: \
                         {got} vs {want}"
                    );
                }
            }
        }
    }

    /// NaN in a group of x makes that row's outputs NaN, and only those.
    #[test]
    fn nan_propagates_per_row() {
        for &body in Body::available() {
            let mut rng = Rng::new(7);
            let (m, n, k) = (5, 20, 576);
            let lay = Layout::new(4, 32, n, k).unwrap();
            let (w, s, b, mut x) = random::<f32>(&mut rng, (m, n, k), &lay);
            x[2 * k + 100] = f32::NAN;
            let wv = QView::new("w", &w, &s, &b, lay, 1).unwrap();
            let (x16, sums) = prepare(body, &x, &lay);
            let mut out = vec![0.0f32; m * n];
            let st = OutStrides {
                x_stride: n,
                w_stride: 1,
            };
            dot_rows_with(body, &x16, &sums, 0..m, &wv, 0..n, &mut out, st);
            for (i, row) in out.chunks_exact(n).enumerate() {
                assert!(
                    row.iter().all(|v| v.is_nan() == (i == 2)),
                    "{body:?} row {i}"
                );
            }
        }
    }
}
