//! AVX-512 dot products of MLX affine-quantized weight rows with f32 x rows,
//! register-blocked: each unpacked weight vector feeds up to 4 x rows and
//! each x vector up to 4 weight rows (4×2 blocks ran 25 → 32 GMAC/s at 8
//! and 64 rows in exact mode against the 8×1 blocks they replaced; int16
//! the same), so one kernel serves decode (1 row), batched decode and
//! prefill (many rows) alike.
//!
//! x comes in block order with 16 lanes ([`PreparedX`] built where
//! [`available`]): one 512-bit load of 16 packed words lines up with 16
//! consecutive f32 of x. A 4-bit value becomes f32 through one shift and one
//! `vpermps` from the table `0.0..=15.0` (the permute reads only the low four
//! bits, so no mask); an 8-bit value through one byte shuffle and a convert.
//! Per block the partial sums are scaled per lane; the biases contribute
//! `Σ bias · (sum of x over the group)`, sixteen groups per FMA into the
//! same accumulators. The short final block of a row is read through masks.
//!
//! With int16 x ([`Int16Rows`], `ActivationPrecision::Int16`, AVX-512 VNNI)
//! each word's values are rounded to int16 against the word's own largest
//! |x| and meet the weights in pairs through `vpdpwssd` (32 multiply-adds
//! per instruction against the FMA's 16; a 4-bit pair is one shift and one
//! mask); per block the int32 sums become f32 times the words' x scales,
//! then the same per-lane weight scales and bias term as exact x.
//!
//! With bf16 x against 4-bit W in exact mode ([`Bf16Rows`], AVX-512 BF16)
//! the pairs are bf16 and meet the weights through `vdpbf16ps` (32
//! multiply-adds into f32 per instruction, the products exact): a 4-bit
//! value q becomes the bf16 of `128 + q` by one shift and one
//! `vpternlogd` (`0x4300 | q`: 128's exponent with q as the mantissa), and
//! `128 · Σx` over each word comes off the word's sum before W's scales.
//! The exact f32 body spends a shift, a `vpermps` and an FMA per 16
//! multiply-adds, which bounds it on Zen 4's double-pumped 512-bit units.

use std::ops::Range;

use super::quant::{PreparedX, QView};
use super::simd::Element;

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
        let per_task = match &px.amx {
            Some(ax) if ax.dequantized() => m.div_ceil(2).next_multiple_of(super::amx::X_ROWS),
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

/// Weight rows per pass over the chunks of x rows (so a tile's rows stay
/// in cache while every x row meets them).
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

/// True when the int16-x kernel may run (`vpdpwssd`).
#[inline]
pub(crate) fn int16_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        available() && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Largest |int16| a value of x is rounded to.
pub(crate) const INT16_MAX: f32 = 32767.0;

/// x rows rounded to int16, one scale per word of W (the 8 values a 4-bit
/// word holds, the 4 of an 8-bit one): `x ≈ scale · q` with
/// `scale = max|x over the word| / 32767`, so each value is off by at most
/// `scale / 2` (~1.5e-5 of the word's largest |x|).
///
/// Block order as [`PreparedX`]'s (16 lanes for this kernel, 8 for
/// [`super::qdot256`]'s), but in pairs: for the block of words
/// `b0..b0 + lanes` and pair `p` (values `p` and `p + vals_per_word / 2` of
/// each word, low and high int16 of an i32), lane j sits at
/// `b0 · pairs + p · lanes + j`; the scales at `b0 + j`.
pub(crate) struct Int16Rows {
    pairs: Vec<i32>,
    scales: Vec<f32>,
    vals_per_word: usize,
    /// i32 pairs and scales per row.
    row_pairs: usize,
    row_words: usize,
    /// Words per block: 16 ([`available`]) or 8 ([`super::qdot256`]).
    lanes: usize,
}

impl Int16Rows {
    /// No rows yet, for x against weights of layout `lay`, in blocks of
    /// `lanes` words (16 or 8).
    pub(crate) fn new(lay: &super::quant::Layout, lanes: usize) -> Self {
        assert!(
            lanes == 16 || lanes == 8,
            "int16 x in blocks of 16 or 8 words"
        );
        Int16Rows {
            pairs: Vec::new(),
            scales: Vec::new(),
            vals_per_word: lay.vals_per_word,
            row_pairs: lay.words_per_row * lay.vals_per_word / 2,
            row_words: lay.words_per_row,
            lanes,
        }
    }

    /// Appends one row of x given in f32 block order with this value's
    /// lanes (as [`PreparedX`] holds exact x).
    ///
    /// # Panics
    /// Without the kernel for these lanes (AVX-512 VNNI for 16, AVX2 for
    /// 8), or when `x` is not one row long.
    pub(crate) fn push(&mut self, x: &[f32]) {
        assert_eq!(x.len(), self.row_words * self.vals_per_word);
        let (p0, s0) = (self.pairs.len(), self.scales.len());
        self.pairs.resize(p0 + self.row_pairs, 0);
        self.scales.resize(s0 + self.row_words, 0.0);
        let (pairs, scales) = (&mut self.pairs[p0..], &mut self.scales[s0..]);
        if self.lanes == 16 {
            assert!(int16_available(), "int16 x needs AVX-512 VNNI");
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 was detected; the slices are the row's exact sizes.
            unsafe {
                x86::quantize_row(x, self.vals_per_word, pairs, scales)
            };
        } else {
            assert!(
                super::qdot256::int16_available(),
                "int16 x in 8 lanes needs the AVX2 int16 kernel"
            );
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2 was detected; the slices are the row's exact sizes.
            unsafe {
                super::qdot256::x86::quantize_row(x, self.vals_per_word, pairs, scales)
            };
        }
    }

    /// Checks that these are `rows` rows prepared for `lay` in blocks of `lanes`.
    pub(crate) fn check(&self, rows: usize, lay: &super::quant::Layout, lanes: usize) {
        assert_eq!(self.lanes, lanes, "int16 x prepared for another kernel");
        assert_eq!(self.row_words, lay.words_per_row);
        assert_eq!(self.pairs.len(), rows * self.row_pairs);
    }

    pub(crate) fn row(&self, i: usize) -> (&[i32], &[f32]) {
        (
            &self.pairs[i * self.row_pairs..][..self.row_pairs],
            &self.scales[i * self.row_words..][..self.row_words],
        )
    }
}

/// True when bf16 x may meet 4-bit W through `vdpbf16ps` ([`Bf16Rows`]):
/// AVX-512 BF16 runs and `MLX_BACKEND_BF16_DOT` is not `0`/`off`/`false`
/// (read once).
pub(crate) fn bf16_available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            available()
                && is_x86_feature_detected!("avx512bf16")
                && !super::switched_off("MLX_BACKEND_BF16_DOT")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// bf16 x rows (exact: the values x already had) as [`Int16Rows`]'
/// pairs, for 4-bit W: lane j of pair p of a block holds values p and
/// p + 4 of word j as the low and high bf16 of a u32, and each word has
/// `128 · Σx` over its 8 values (f32), the offset the kernel's `128 + q`
/// weights add.
pub(crate) struct Bf16Rows {
    pairs: Vec<u32>,
    offsets: Vec<f32>,
    row_words: usize,
}

impl Bf16Rows {
    pub(crate) fn new(lay: &super::quant::Layout) -> Self {
        assert_eq!(lay.bits, 4, "bf16 pairs serve 4-bit weights");
        Bf16Rows {
            pairs: Vec::new(),
            offsets: Vec::new(),
            row_words: lay.words_per_row,
        }
    }

    /// Appends one row given in f32 block order with 16 lanes, every value
    /// a bf16 widened to f32 (its low 16 bits zero, so the pairs are exact).
    pub(crate) fn push(&mut self, x: &[f32]) {
        let words = self.row_words;
        assert_eq!(x.len(), words * 8);
        let bf16 = |v: f32| v.to_bits() >> 16;
        for b0 in (0..words).step_by(16) {
            let lanes = (words - b0).min(16);
            let block = &x[b0 * 8..][..lanes * 8];
            for p in 0..4 {
                self.pairs.extend(
                    (0..lanes).map(|j| {
                        bf16(block[p * lanes + j]) | bf16(block[(p + 4) * lanes + j]) << 16
                    }),
                );
            }
            self.offsets.extend(
                (0..lanes).map(|j| 128.0 * (0..8).map(|v| block[v * lanes + j]).sum::<f32>()),
            );
        }
    }

    fn row(&self, i: usize) -> (&[u32], &[f32]) {
        let w = self.row_words;
        (
            &self.pairs[i * 4 * w..][..4 * w],
            &self.offsets[i * w..][..w],
        )
    }
}

/// Where [`dot_rows`] writes: `out[i * x_stride + j * w_stride]` holds x row
/// `xrows.start + i` against weight row `rows.start + j`.
#[derive(Clone, Copy)]
pub(crate) struct OutStrides {
    pub(crate) x_stride: usize,
    pub(crate) w_stride: usize,
}

impl OutStrides {
    /// A `dot_rows` call's ranges: `xrows` inside the `x_rows` prepared x
    /// rows, `rows` inside `w`, and `out` (`out_len`) long enough for both
    /// at these strides. False when there is nothing to compute.
    ///
    /// # Panics
    /// When a range leaves its matrix or `out` is too short.
    pub(crate) fn check<P>(
        &self,
        xrows: &Range<usize>,
        x_rows: usize,
        w: &QView<P>,
        rows: &Range<usize>,
        out_len: usize,
    ) -> bool {
        assert!(xrows.end <= x_rows);
        assert!(rows.end <= w.w.len() / w.lay.words_per_row);
        if xrows.is_empty() || rows.is_empty() {
            return false;
        }
        let last = (xrows.len() - 1) * self.x_stride + (rows.len() - 1) * self.w_stride;
        assert!(last < out_len, "output too short");
        true
    }
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
    assert_eq!(px.group_sums.len(), px.rows * lay.groups_per_row);
    if !strides.check(&xrows, px.rows, w, &rows, out.len()) {
        return;
    }
    if let Some(ax) = &px.amx {
        return super::amx::dot_rows(ax, xrows, w, rows, out, strides);
    }
    if let Some(g16) = &px.group16 {
        return super::row_lanes::dot_rows(g16, &px.group_sums, xrows, w, rows, out, strides);
    }
    if let Some(xb) = &px.bf16 {
        assert!(
            bf16_available() && lay.bits == 4,
            "bf16 pairs need AVX-512 BF16 and 4-bit W"
        );
        assert_eq!(xb.row_words, lay.words_per_row);
        assert_eq!(xb.offsets.len(), px.rows * xb.row_words);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU features were detected; the asserts bound every access.
        unsafe {
            x86::bf16::drive::<P, x86::Bf16Row, 4>(px, xrows, w, rows, out, strides)
        };
        return;
    }
    match &px.int16 {
        None => assert_eq!(px.perm.len(), px.rows * lay.k),
        Some(x16) => {
            assert!(int16_available(), "int16 x needs AVX-512 VNNI");
            x16.check(px.rows, lay, 16);
        }
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU features were detected; the asserts above bound every access.
    unsafe {
        use x86::I16Row;
        match (px.int16.is_some(), lay.bits) {
            (false, 4) => x86::exact::drive::<P, &[f32], 4>(px, xrows, w, rows, out, strides),
            (false, _) => x86::exact::drive::<P, &[f32], 8>(px, xrows, w, rows, out, strides),
            (true, 4) => x86::vnni::drive::<P, I16Row, 4>(px, xrows, w, rows, out, strides),
            (true, _) => x86::vnni::drive::<P, I16Row, 8>(px, xrows, w, rows, out, strides),
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{OutStrides, PreparedX, QView, TILE};
    use crate::kernels::cpu::quant::Layout;
    use crate::kernels::cpu::simd::{prefetch_lines, Element};
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// Software prefetch distance in bytes for the weight rows.
    const PREFETCH: usize = 4096;

    /// One prepared x row as the kernel reads it: f32 in block order, or
    /// int16 pairs with per-word scales.
    pub(super) trait XRow<'x>: Copy {
        fn row(px: &'x PreparedX, i: usize, k: usize) -> Self;

        /// Per-lane sums `Σ_v x · q` of one block (words `b0..b0 + lanes`,
        /// `mask` their lanes) for MR x rows and NR packed weight vectors,
        /// in f32 and before W's scales.
        ///
        /// # Safety
        /// The CPU must have the implementation's target features; `mask`
        /// must keep the x loads inside the rows.
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize>(
            x: &[Self; MR],
            wv: &[__m512i; NR],
            b0: usize,
            lanes: usize,
            mask: __mmask16,
        ) -> [[__m512; NR]; MR];
    }

    impl<'x> XRow<'x> for &'x [f32] {
        fn row(px: &'x PreparedX, i: usize, k: usize) -> Self {
            &px.perm[i * k..][..k]
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize>(
            x: &[Self; MR],
            wv: &[__m512i; NR],
            b0: usize,
            lanes: usize,
            mask: __mmask16,
        ) -> [[__m512; NR]; MR] {
            let vpw = (32 / BITS) as usize;
            let xbase = b0 * vpw;
            let table = nibble_values();
            let zero = _mm512_setzero_ps();
            let mut p = [[zero; NR]; MR];
            let mut q = [zero; NR];
            for v in 0..vpw {
                for n in 0..NR {
                    q[n] = unpack::<BITS>(wv[n], v, table);
                }
                for i in 0..MR {
                    let at = xbase + v * lanes;
                    // SAFETY: the caller's mask bounds the load.
                    let xv = unsafe { _mm512_maskz_loadu_ps(mask, x[i].as_ptr().add(at)) };
                    for n in 0..NR {
                        p[i][n] = _mm512_fmadd_ps(q[n], xv, p[i][n]);
                    }
                }
            }
            p
        }
    }

    /// An int16 x row: pairs and per-word scales ([`super::Int16Rows`]).
    #[derive(Clone, Copy)]
    pub(super) struct I16Row<'x> {
        pairs: &'x [i32],
        scales: &'x [f32],
    }

    impl<'x> XRow<'x> for I16Row<'x> {
        fn row(px: &'x PreparedX, i: usize, _k: usize) -> Self {
            let (pairs, scales) = px.int16.as_ref().expect("int16 x").row(i);
            I16Row { pairs, scales }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize>(
            x: &[Self; MR],
            wv: &[__m512i; NR],
            b0: usize,
            lanes: usize,
            mask: __mmask16,
        ) -> [[__m512; NR]; MR] {
            let half = (16 / BITS) as usize;
            let mut s = [[_mm512_setzero_si512(); NR]; MR];
            for p in 0..half {
                // Values p and p + half of each word in the low and high int16.
                let q: [__m512i; NR] = std::array::from_fn(|n| int16_field::<BITS>(wv[n], p));
                for i in 0..MR {
                    let at = b0 * half + p * lanes;
                    // SAFETY: the caller's mask bounds the load.
                    let xv = unsafe { _mm512_maskz_loadu_epi32(mask, x[i].pairs.as_ptr().add(at)) };
                    for n in 0..NR {
                        s[i][n] = dpwssd(s[i][n], q[n], xv);
                    }
                }
            }
            let mut out = [[_mm512_setzero_ps(); NR]; MR];
            for i in 0..MR {
                // SAFETY: as above.
                let d = unsafe { _mm512_maskz_loadu_ps(mask, x[i].scales.as_ptr().add(b0)) };
                for n in 0..NR {
                    out[i][n] = _mm512_mul_ps(_mm512_cvtepi32_ps(s[i][n]), d);
                }
            }
            out
        }
    }

    /// A bf16 x row: pairs and per-word offsets ([`super::Bf16Rows`]).
    #[derive(Clone, Copy)]
    pub(super) struct Bf16Row<'x> {
        pairs: &'x [u32],
        offsets: &'x [f32],
    }

    impl<'x> XRow<'x> for Bf16Row<'x> {
        fn row(px: &'x PreparedX, i: usize, _k: usize) -> Self {
            let (pairs, offsets) = px.bf16.as_ref().expect("bf16 x").row(i);
            Bf16Row { pairs, offsets }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
        unsafe fn partial<const BITS: u32, const MR: usize, const NR: usize>(
            x: &[Self; MR],
            wv: &[__m512i; NR],
            b0: usize,
            lanes: usize,
            mask: __mmask16,
        ) -> [[__m512; NR]; MR] {
            debug_assert_eq!(BITS, 4);
            let field = _mm512_set1_epi32(0x000F_000F);
            let exponent = _mm512_set1_epi32(0x4300_4300);
            let mut s = [[_mm512_setzero_ps(); NR]; MR];
            for p in 0..4 {
                let shift = _mm512_set1_epi32(4 * p as i32);
                // (w >> 4p) & 0x000F000F | 0x43004300: bf16 128 + q, twice.
                let q: [__m512i; NR] = std::array::from_fn(|n| {
                    _mm512_ternarylogic_epi32::<0xEA>(
                        _mm512_srlv_epi32(wv[n], shift),
                        field,
                        exponent,
                    )
                });
                for i in 0..MR {
                    let at = b0 * 4 + p * lanes;
                    // SAFETY: the caller's mask bounds the load.
                    let xv = unsafe {
                        _mm512_maskz_loadu_epi32(mask, x[i].pairs.as_ptr().add(at).cast())
                    };
                    for n in 0..NR {
                        s[i][n] = dpbf16(s[i][n], q[n], xv);
                    }
                }
            }
            for i in 0..MR {
                // SAFETY: as above.
                let o = unsafe { _mm512_maskz_loadu_ps(mask, x[i].offsets.as_ptr().add(b0)) };
                for v in s[i].iter_mut() {
                    *v = _mm512_sub_ps(*v, o);
                }
            }
            s
        }
    }

    /// `acc + a · b` over bf16 pairs into f32 (`vdpbf16ps`), written out as
    /// `dpwssd` is.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(crate) fn dpbf16(acc: __m512, a: __m512i, b: __m512i) -> __m512 {
        let mut acc = acc;
        // SAFETY: register operands only; the features are enabled here.
        unsafe {
            std::arch::asm!(
                "vdpbf16ps {acc}, {a}, {b}",
                acc = inout(zmm_reg) acc,
                a = in(zmm_reg) a,
                b = in(zmm_reg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }

    /// Field `p` of each 16-bit half of packed `BITS`-bit words as int16
    /// lanes (values `p` and `p + 16 / BITS` of each 32-bit word: the
    /// int16 pairs `vpdpwssd` takes). The top field of a half needs no
    /// mask: a 16-bit shift leaves nothing above it, one instruction where
    /// the middle fields take a shift and a mask (LLVM does not find this
    /// for 4-bit words: one of seven unpack instructions per word).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(crate) fn int16_field<const BITS: u32>(w: __m512i, p: usize) -> __m512i {
        let field = _mm512_set1_epi32(if BITS == 4 { 0x000F_000F } else { 0x00FF_00FF });
        match (BITS, p) {
            (4, 3) => _mm512_srli_epi16::<12>(w),
            (8, 1) => _mm512_srli_epi16::<8>(w),
            (_, 0) => _mm512_and_si512(w, field),
            _ => _mm512_and_si512(
                _mm512_srlv_epi32(w, _mm512_set1_epi32((BITS as usize * p) as i32)),
                field,
            ),
        }
    }

    /// `acc + a · b` by int16 pairs (`vpdpwssd`), written out: LLVM turns
    /// the intrinsic into `vpmaddwd` + `vpaddd` for the generic x86-64
    /// target, twice the instructions in the kernels' inner loops.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(crate) fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        let mut acc = acc;
        // SAFETY: register operands only; the features are enabled here.
        unsafe {
            std::arch::asm!(
                "vpdpwssd {acc}, {a}, {b}",
                acc = inout(zmm_reg) acc,
                a = in(zmm_reg) a,
                b = in(zmm_reg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }

    /// [`dpwssd`] with `b` one i32 pair broadcast from `pair` (a
    /// `{1to16}` memory operand).
    ///
    /// # Safety
    /// `pair` must point at a readable i32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(crate) unsafe fn dpwssd_bcst(acc: __m512i, a: __m512i, pair: *const i32) -> __m512i {
        let mut acc = acc;
        // SAFETY: the caller's pointer is readable.
        unsafe {
            std::arch::asm!(
                "vpdpwssd {acc}, {a}, dword ptr [{p}]{{1to16}}",
                acc = inout(zmm_reg) acc,
                a = in(zmm_reg) a,
                p = in(reg) pair,
                options(pure, readonly, nostack, preserves_flags)
            );
        }
        acc
    }

    /// `0.0..=15.0`, the table [`unpack`] reads 4-bit values through.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn nibble_values() -> __m512 {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        )
    }

    /// Lane j's group within a block of 16 words, for groups of
    /// `2^log2` words (the index [`lane_params`] permutes by).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn lane_groups(log2: u32) -> __m512i {
        _mm512_srlv_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(log2 as i32),
        )
    }

    /// Value `v` of each of the 16 words, as f32 (`table`: [`nibble_values`]).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(crate) fn unpack<const BITS: u32>(w: __m512i, v: usize, table: __m512) -> __m512 {
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
    pub(crate) unsafe fn load_params<P: Element>(src: *const P, mask: __mmask16) -> __m512 {
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
    pub(crate) unsafe fn lane_params<P: Element>(
        src: &[P],
        g0: usize,
        gmask: __mmask16,
        lane_group: __m512i,
    ) -> __m512 {
        // SAFETY: the caller's mask keeps the load inside `src`.
        let v = unsafe { load_params(src.as_ptr().add(g0), gmask) };
        _mm512_permutexvar_ps(lane_group, v)
    }

    /// One row of x in f32 block order (16 lanes, `vpw` values per word) to
    /// int16 pairs and per-word scales ([`super::Int16Rows`]'s layout): per
    /// block, lane j's largest |x| over its word's values sets the scale;
    /// NaN in a word makes its scale NaN, and a zero or non-finite largest
    /// |x| rounds the word to zeros.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn quantize_row(
        x: &[f32],
        vpw: usize,
        pairs: &mut [i32],
        scales: &mut [f32],
    ) {
        let half = vpw / 2;
        let words = scales.len();
        let max_q = _mm512_set1_ps(super::INT16_MAX);
        let low = _mm512_set1_epi32(0xffff);
        for b0 in (0..words).step_by(16) {
            let lanes = (words - b0).min(16);
            let mask: __mmask16 = if lanes == 16 {
                0xffff
            } else {
                (1 << lanes) - 1
            };
            let base = b0 * vpw;
            // SAFETY (loads and stores): the mask keeps lanes..16 out; the
            // block holds vpw · lanes values, half · lanes pairs.
            let load =
                |v: usize| unsafe { _mm512_maskz_loadu_ps(mask, x.as_ptr().add(base + v * lanes)) };
            let (mut max, mut nan) = (_mm512_setzero_ps(), 0 as __mmask16);
            for v in 0..vpw {
                let xv = load(v);
                nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(xv, xv);
                max = _mm512_max_ps(max, _mm512_abs_ps(xv));
            }
            let finite = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(max, _mm512_setzero_ps())
                & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(max, _mm512_set1_ps(f32::INFINITY))
                & !nan;
            let inv = _mm512_maskz_div_ps(finite, max_q, max);
            let scale =
                _mm512_mask_mov_ps(_mm512_div_ps(max, max_q), nan, _mm512_set1_ps(f32::NAN));
            unsafe { _mm512_mask_storeu_ps(scales.as_mut_ptr().add(b0), mask, scale) };
            for p in 0..half {
                let lo = _mm512_cvtps_epi32(_mm512_mul_ps(load(p), inv));
                let hi = _mm512_cvtps_epi32(_mm512_mul_ps(load(p + half), inv));
                let pair = _mm512_or_si512(_mm512_and_si512(lo, low), _mm512_slli_epi32::<16>(hi));
                let at = b0 * half + p * lanes;
                unsafe { _mm512_mask_storeu_epi32(pairs.as_mut_ptr().add(at).cast(), mask, pair) };
            }
        }
    }

    /// The register-blocked walk, compiled once per target-feature set so
    /// that every body inlines: `exact` for f32 x, `vnni` for int16 x.
    macro_rules! chain {
        ($features:literal, $name:ident) => {
            pub(super) mod $name {
                use super::*;

                /// Walks tiles of weight rows and, inside each, chunks of x rows; the
                /// register block (x rows × weight rows) shrinks with the rows left.
                #[target_feature(enable = $features)]
                pub(crate) unsafe fn drive<'x, P: Element, X: XRow<'x>, const BITS: u32>(
                    px: &'x PreparedX,
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
                                    4.. => block::<P, X, BITS, 4, 2>(
                                        px, w, &tile, i, &xrows, rows.start, out, st,
                                    ),
                                    2 | 3 => block::<P, X, BITS, 2, 2>(
                                        px, w, &tile, i, &xrows, rows.start, out, st,
                                    ),
                                    _ => block::<P, X, BITS, 1, 4>(
                                        px, w, &tile, i, &xrows, rows.start, out, st,
                                    ),
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
                #[target_feature(enable = $features)]
                unsafe fn block<
                    'x,
                    P: Element,
                    X: XRow<'x>,
                    const BITS: u32,
                    const MR: usize,
                    const NR: usize,
                >(
                    px: &'x PreparedX,
                    w: &QView<P>,
                    tile: &Range<usize>,
                    i0: usize,
                    xrows: &Range<usize>,
                    first: usize,
                    out: &mut [f32],
                    st: OutStrides,
                ) -> usize {
                    let groups = w.lay.groups_per_row;
                    let x: [X; MR] = std::array::from_fn(|i| X::row(px, i0 + i, w.lay.k));
                    let gs: [&[f32]; MR] =
                        std::array::from_fn(|i| &px.group_sums[(i0 + i) * groups..][..groups]);
                    let i0 = i0 - xrows.start;
                    let mut r = tile.start;
                    while r < tile.end {
                        // SAFETY (both): `x` and `gs` hold whole rows; the caller bounded W and out.
                        r += if tile.end - r >= NR {
                            unsafe {
                                weight_rows::<P, X, BITS, MR, NR>(w, r, x, gs, i0, first, out, st)
                            }
                        } else {
                            unsafe {
                                weight_rows::<P, X, BITS, MR, 1>(w, r, x, gs, i0, first, out, st)
                            }
                        };
                    }
                    MR
                }

                /// Weight rows `r..r + NR` against the MR x rows, stored at output x
                /// row `i0` on. Returns NR.
                #[allow(clippy::too_many_arguments)]
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn weight_rows<
                    'x,
                    P: Element,
                    X: XRow<'x>,
                    const BITS: u32,
                    const MR: usize,
                    const NR: usize,
                >(
                    w: &QView<P>,
                    r: usize,
                    x: [X; MR],
                    gs: [&[f32]; MR],
                    i0: usize,
                    first: usize,
                    out: &mut [f32],
                    st: OutStrides,
                ) -> usize {
                    let words = w.lay.words_per_row;
                    let wr: [&[u32]; NR] =
                        std::array::from_fn(|n| &w.w[(r + n) * words..][..words]);
                    let pr: [(&[P], &[P]); NR] = std::array::from_fn(|n| {
                        let row = w.row(r + n);
                        (row.scales, row.biases)
                    });
                    // SAFETY: the slices above hold whole rows of W and of its params.
                    let d = unsafe { kernel::<P, X, BITS, MR, NR>(&w.lay, wr, pr, x, gs) };
                    for (i, row) in d.iter().enumerate() {
                        for (n, v) in row.iter().enumerate() {
                            out[(i0 + i) * st.x_stride + (r + n - first) * st.w_stride] = *v;
                        }
                    }
                    NR
                }

                /// One block of 16 (or `lanes`) words of every weight row, added into
                /// `acc` scaled per lane by W's scales.
                ///
                /// # Safety
                /// The masks must keep every load inside its row (all ones for a whole block).
                #[allow(clippy::too_many_arguments)]
                #[inline]
                #[target_feature(enable = $features)]
                unsafe fn block_step<
                    'x,
                    P: Element,
                    X: XRow<'x>,
                    const BITS: u32,
                    const MR: usize,
                    const NR: usize,
                >(
                    w: &[&[u32]; NR],
                    params: &[(&[P], &[P]); NR],
                    x: &[X; MR],
                    b0: usize,
                    lanes: usize,
                    mask: __mmask16,
                    g0: usize,
                    gmask: __mmask16,
                    lane_group: __m512i,
                    acc: &mut [[__m512; NR]; MR],
                ) {
                    let mut wv = [_mm512_setzero_si512(); NR];
                    for n in 0..NR {
                        // SAFETY (all loads below): the caller's masks bound them.
                        wv[n] =
                            unsafe { _mm512_maskz_loadu_epi32(mask, w[n].as_ptr().add(b0).cast()) };
                    }
                    // SAFETY: the caller's masks bound the x loads.
                    let p = unsafe { X::partial::<BITS, MR, NR>(x, &wv, b0, lanes, mask) };
                    for n in 0..NR {
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
                #[target_feature(enable = $features)]
                unsafe fn kernel<
                    'x,
                    P: Element,
                    X: XRow<'x>,
                    const BITS: u32,
                    const MR: usize,
                    const NR: usize,
                >(
                    lay: &Layout,
                    w: [&[u32]; NR],
                    params: [(&[P], &[P]); NR],
                    x: [X; MR],
                    group_sums: [&[f32]; MR],
                ) -> [[f32; NR]; MR] {
                    let words = lay.words_per_row;
                    let log2 = lay.words_per_group_log2;
                    // Lane j's group, relative to the block's first group.
                    let lane_group = lane_groups(log2);
                    let zero = _mm512_setzero_ps();
                    let mut acc = [[zero; NR]; MR];
                    // Whole blocks with constant masks (plain loads once inlined), then
                    // the short final block, if any.
                    let full = words / 16;
                    let groups_per_block = (16 >> log2).max(1);
                    let gmask_full: __mmask16 = (1 << groups_per_block) - 1;
                    // Rows stream from memory, and the NR rows are adjacent: the
                    // hints run PREFETCH past the end of the NR rows as one region
                    // (into the next register block's rows), a share of the
                    // region's bytes per whole block. Per-row hints PREFETCH past
                    // each row's own position ran only ~1 KB ahead of the region
                    // with 768-byte rows, and the batch-1 sweep of the default
                    // model's matrices took ~8 ms against ~6–7 now on a Zen 4
                    // (`tests::sweep_from_memory`). Hints never fault, even past
                    // the end.
                    let region = NR * words * 4;
                    let per_block = region.div_ceil(full.max(1));
                    let ahead = w[0].as_ptr().cast::<i8>().wrapping_add(region + PREFETCH);
                    // The rows' scales and biases are adjacent too: their region,
                    // PREFETCH / 4 past its end, once per call (a few lines; the
                    // per-block hints of each row's params were 8 per block at
                    // NR = 4, mostly for lines already asked for).
                    let params_region = NR * lay.groups_per_row * std::mem::size_of::<P>();
                    for src in [params[0].0, params[0].1] {
                        let at = src.as_ptr().cast::<i8>();
                        prefetch_lines(
                            at.wrapping_add(params_region + PREFETCH / 4),
                            params_region,
                        );
                    }
                    // (`row_lanes`' `Prefetch`, which drips a list of regions, in
                    // place of these two loops made the sweep ~25% slower.)
                    for b in 0..full {
                        let b0 = 16 * b;
                        prefetch_lines(ahead.wrapping_add(b * per_block), per_block);
                        // SAFETY: whole blocks lie inside every row.
                        unsafe {
                            block_step::<P, X, BITS, MR, NR>(
                                &w,
                                &params,
                                &x,
                                b0,
                                16,
                                0xffff,
                                b0 >> log2,
                                gmask_full,
                                lane_group,
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
                            block_step::<P, X, BITS, MR, NR>(
                                &w,
                                &params,
                                &x,
                                b0,
                                lanes,
                                (1 << lanes) - 1,
                                g0,
                                (1 << groups) - 1,
                                lane_group,
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
                                let sums = unsafe {
                                    _mm512_maskz_loadu_ps(gmask, group_sums[i].as_ptr().add(g))
                                };
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
        };
    }
    chain!("avx512f,avx512bw,avx512vl", exact);
    chain!("avx512f,avx512bw,avx512vl,avx512vnni", vnni);
    chain!("avx512f,avx512bw,avx512vl,avx512bf16", bf16);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernels::cpu::quant::Layout;
    use crate::kernels::cpu::simd::test_util::Rng;

    /// `W[r][c]` of an MLX affine matrix, in f64.
    pub(crate) fn weight<P: Element>(w: &QView<P>, r: usize, c: usize) -> f64 {
        let lay = &w.lay;
        let vpw = lay.vals_per_word;
        let word = w.w[r * lay.words_per_row + c / vpw];
        let q = (word >> (lay.bits as usize * (c % vpw))) & ((1 << lay.bits) - 1);
        let g = r * lay.groups_per_row + c / lay.group_size;
        w.scales[g].to_f32() as f64 * q as f64 + w.biases[g].to_f32() as f64
    }

    /// A random `[n, k]` matrix (packed words, scales, biases) and `m` x rows.
    #[allow(clippy::type_complexity)]
    pub(crate) fn random<P: Element>(
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
        let tiles = int16 && amx && m >= super::super::amx::MIN_ROWS;
        assert_eq!(px.amx.is_some(), tiles);
        // Int16 x of 4+ rows off the tiles: one scale per group (row_lanes).
        let per_group = int16
            && !tiles
            && m >= super::super::row_lanes::min_rows()
            && super::super::row_lanes::enabled();
        assert_eq!(px.int16.is_some(), int16 && !tiles && !per_group);
        assert_eq!(px.group16.is_some(), per_group);
        let unit = if per_group { group } else { lay.vals_per_word };
        let what = format!("m={m} n={n} k={k} bits={bits} group={group} int16={int16} amx={amx}");
        check_against_f64(&x, &wv, int16.then_some(unit), &what, |xr, wr, out, st| {
            dot_rows(&px, xr, &wv, wr, out, st)
        });
    }

    /// Runs `dot(x rows, weight rows, out, strides)` over a sub-range of
    /// `x`'s rows (`[m, k]`) and of `w`'s, written transposed into a
    /// poisoned buffer with a padded stride, and checks it against an f64
    /// reference: within f32 rounding (1e-5 of Σ|x·W|) plus, for x rounded
    /// to int16 with one scale per `rounding_unit` values, half a step
    /// (`max|x over the unit| / 32767 / 2`) per value; the padding stays
    /// untouched.
    pub(crate) fn check_against_f64<P: Element>(
        x: &[f32],
        wv: &QView<P>,
        rounding_unit: Option<usize>,
        what: &str,
        dot: impl Fn(Range<usize>, Range<usize>, &mut [f32], OutStrides),
    ) {
        let (n, k) = (wv.lay.n, wv.lay.k);
        let m = x.len() / k;
        let half_step = |xi: usize, c: usize| -> f64 {
            let Some(unit) = rounding_unit else {
                return 0.0;
            };
            let values = &x[xi * k + c / unit * unit..][..unit];
            values.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64)) / 32767.0 / 2.0
        };
        let (xr, wr) = (m / 3..m, 1..n);
        let stride = xr.len() + 3;
        let mut out = vec![f32::NAN; wr.len() * stride];
        let st = OutStrides {
            x_stride: 1,
            w_stride: stride,
        };
        dot(xr.clone(), wr.clone(), &mut out, st);
        for (i, xi) in xr.clone().enumerate() {
            for (j, r) in wr.clone().enumerate() {
                let (mut want, mut mag, mut rounding) = (0.0f64, 0.0f64, 0.0f64);
                for c in 0..k {
                    let wc = weight(wv, r, c);
                    let t = x[xi * k + c] as f64 * wc;
                    want += t;
                    mag += t.abs();
                    rounding += wc.abs() * half_step(xi, c);
                }
                let got = out[i + j * stride] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * mag + rounding,
                    "{what} x row {xi} w row {r}: {got} vs {want}"
                );
            }
        }
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
                    (true, false) => int16_available(),
                    (true, true) => super::super::amx::available(),
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
        if !bf16_available() {
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
            assert!(px.bf16.is_some() && px.perm.is_empty());
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
        if !int16_available() {
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

    /// The core's arithmetic ceiling, to read the kernel's GMAC/s against:
    /// ten independent register-only chains of 512-bit FMAs and of
    /// `vpdpwssd`, one thread.
    /// `cargo test --release --lib qdot512::tests::arithmetic_peak -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn arithmetic_peak() {
        if !int16_available() {
            return;
        }
        // SAFETY: AVX-512 F and VNNI were detected above.
        let (fma, dp) = unsafe { peak_loops(100_000_000) };
        println!(
            "512-bit FMA {:.2} G/s ({:.0} GMAC/s f32); vpdpwssd {:.2} G/s ({:.0} GMAC/s int16)",
            fma,
            fma * 16.0,
            dp,
            dp * 32.0
        );
    }

    /// Instructions per second (in G) of each loop.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn peak_loops(iters: usize) -> (f64, f64) {
        use std::arch::x86_64::*;
        let (x, y) = (_mm512_set1_ps(1.000_000_1), _mm512_set1_ps(0.999_999_9));
        let fma = chains(iters, x, |v| _mm512_fmadd_ps(v, x, y));
        let (xi, yi) = (
            _mm512_set1_epi32(0x0003_0005),
            _mm512_set1_epi32(0x0007_0002),
        );
        // `x86::dpwssd`, not the intrinsic: LLVM would fold the constant
        // pair product and time `vpaddd` instead.
        let dp = chains(iters, xi, |v| x86::dpwssd(v, xi, yi));
        (fma, dp)
    }

    /// G steps per second of ten independent chains `v = step(v)`, kept in
    /// registers (inlined into the caller, whose target features `step` has).
    #[inline(always)]
    fn chains<V: Copy>(iters: usize, init: V, step: impl Fn(V) -> V) -> f64 {
        let mut a = [init; 10];
        let t = std::time::Instant::now();
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = step(*v);
            }
        }
        let rate = (iters * 10) as f64 / t.elapsed().as_secs_f64() / 1e9;
        std::hint::black_box(a);
        rate
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
        speed_table(
            |x, lay, int16| PreparedX::new(x.chunks_exact(lay.k), lay, int16),
            int16_available(),
        );
    }

    /// Prints, per shape of the default model, the blocked kernel's speed
    /// (`qdot::dot_rows`) on x as `prepare(x, layout, int16)` lays it out,
    /// exact and (where `int16`) int16, weights in cache, beside the AVX2
    /// two-row body that preceded both kernels.
    pub(crate) fn speed_table(prepare: impl Fn(&[f32], &Layout, bool) -> PreparedX, int16: bool) {
        let mut rng = Rng::new(5);
        for (what, m, n, k, bits) in [
            ("q/o proj", 1, 576, 576, 4),
            ("k/v proj", 1, 192, 576, 4),
            ("gate/up", 1, 1536, 576, 4),
            ("down", 1, 576, 1536, 4),
            ("lm_head", 1, 49152, 576, 8),
            ("gate/up x2", 2, 1536, 576, 4),
            ("gate/up x4", 4, 1536, 576, 4),
            ("gate/up x8", 8, 1536, 576, 4),
            ("down x8", 8, 576, 1536, 4),
            ("gate/up x64", 64, 1536, 576, 4),
        ] {
            let lay = Layout::new(bits, 32, n, k).unwrap();
            let (w, s, b, x) = random::<half::f16>(&mut rng, (m, n, k), &lay);
            let wv = QView::new("w", &w, &s, &b, lay, 1).unwrap();
            let mut out = vec![0.0f32; m * n];
            let st = OutStrides {
                x_stride: n,
                w_stride: 1,
            };
            let reps = (2e8 as usize / (m * n * k)).max(3);
            let timed = |int16: bool, out: &mut [f32]| {
                let px = prepare(&x, &lay, int16);
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    crate::kernels::cpu::qdot::dot_rows(&px, 0..m, &wv, 0..n, out, st);
                }
                t.elapsed().as_secs_f64() / reps as f64
            };
            let secs = timed(false, &mut out);
            let secs16 = timed(int16, &mut out);
            let px8 = PreparedX::with_lanes(x.chunks_exact(k).take(1), &lay, 8, false);
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
            let mac = (m * n * k) as f64;
            println!(
                "{what:12} m={m:2} n={n:5} k={k:4} {bits}-bit: exact {:8.1} us {:5.1} GMAC/s; \
                 int16 {:8.1} us {:5.1} GMAC/s {:5.1} GB/s; two-row body {:5.1} GMAC/s ({sink:.0e})",
                secs * 1e6,
                mac / secs / 1e9,
                secs16 * 1e6,
                mac / secs16 / 1e9,
                bytes / secs16 / 1e9,
                mac / old / 1e9,
            );
        }
    }

    /// The default model's batch-1 weight sweep from memory (on whichever
    /// blocked kernel this CPU runs, `qdot512` or `qdot256`): 30 blocks of
    /// (q, k, v, o, gate, up, down) at their shapes (4-bit, group 32, f16
    /// params) and the 8-bit lm_head, ~98 MB, far more than the L3; one
    /// int16 x row against each matrix in turn, the team splitting each
    /// matrix's rows as `decoder_layer` does, a barrier after each. Prints
    /// GB/s of weights+params beside a plain 2-thread read of a buffer of the
    /// same size, so the gap is what the kernel's access pattern costs.
    /// `cargo test --release --lib qdot512::tests::sweep_from_memory -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn sweep_from_memory() {
        use crate::kernels::cpu::team;
        if !crate::kernels::cpu::qdot::available() {
            return;
        }
        let mut rng = Rng::new(9);
        // x rows (`SWEEP_ROWS`, default 1: a batch-1 step; 4+ take row_lanes).
        let m: usize = std::env::var("SWEEP_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let (h, inter) = (576, 1536);
        let shapes = [
            (576, h),
            (192, h),
            (192, h),
            (h, 576),
            (inter, h),
            (inter, h),
            (h, inter),
        ];
        let mut mats = Vec::new();
        for _ in 0..30 {
            for &(n, k) in &shapes {
                let lay = Layout::new(4, 32, n, k).unwrap();
                mats.push((lay, random::<half::f16>(&mut rng, (m, n, k), &lay)));
            }
        }
        let lay = Layout::new(8, 32, 49152, h).unwrap();
        mats.push((lay, random::<half::f16>(&mut rng, (m, 49152, h), &lay)));
        let macs: usize = mats.iter().map(|(lay, _)| m * lay.n * lay.k).sum();
        let bytes: usize = mats
            .iter()
            .map(|(_, (w, s, b, _))| w.len() * 4 + (s.len() + b.len()) * 2)
            .sum();
        let prepared: Vec<PreparedX> = mats
            .iter()
            .map(|(lay, (_, _, _, x))| PreparedX::new(x.chunks_exact(lay.k), lay, true))
            .collect();
        let mut outs: Vec<Vec<f32>> = mats.iter().map(|(lay, _)| vec![0.0; m * lay.n]).collect();
        let outs: Vec<team::SharedSlice<f32>> =
            outs.iter_mut().map(|o| team::SharedSlice::new(o)).collect();
        let sweep = || {
            team::run(|member| {
                for (((lay, (w, s, b, _)), px), out) in mats.iter().zip(&prepared).zip(&outs) {
                    let wv = QView::new("w", w, s, b, *lay, 1).unwrap();
                    let rows = member.share(lay.n, 8);
                    // Member i's columns, one row of x after another.
                    let part = unsafe { out.part(rows.start * m, rows.len() * m) };
                    let st = OutStrides {
                        x_stride: rows.len(),
                        w_stride: 1,
                    };
                    crate::kernels::cpu::qdot::dot_rows(px, 0..m, &wv, rows, part, st);
                    member.barrier()?;
                }
                Ok(())
            })
            .unwrap()
        };
        let buf: Vec<f32> = (0..bytes / 4).map(|i| i as f32).collect();
        // Sixteen independent sums: vectorised, bound by the reads.
        let sum = |c: &[f32]| {
            let mut acc = [0.0f32; 16];
            for v in c.chunks_exact(16) {
                (0..16).for_each(|i| acc[i] += v[i]);
            }
            acc.iter().sum::<f32>()
        };
        let read = || {
            let half = buf.len() / 2;
            std::thread::scope(|s| {
                let a = s.spawn(|| sum(&buf[..half]));
                sum(&buf[half..]) + a.join().unwrap()
            })
        };
        sweep();
        for _ in 0..5 {
            let t = std::time::Instant::now();
            for _ in 0..5 {
                sweep();
            }
            let kernel = t.elapsed().as_secs_f64() / 5.0;
            let t = std::time::Instant::now();
            let sink = read();
            let plain = t.elapsed().as_secs_f64();
            println!(
                "sweep {:.1} MB, {m} x rows: kernel {:.2} ms ({:.1} GB/s, {:.1} GMAC/s), \
                 plain read {:.2} ms ({:.1} GB/s) ({sink:.0e})",
                bytes as f64 / 1e6,
                kernel * 1e3,
                bytes as f64 / kernel / 1e9,
                macs as f64 / kernel / 1e9,
                plain * 1e3,
                bytes as f64 / plain / 1e9
            );
        }
    }

    /// bf16 x through `vdpbf16ps` against the exact f32 body on the same
    /// values, one thread, weights in cache (bf16 params):
    /// `cargo test --release --lib qdot512::tests::bf16_speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn bf16_speed() {
        if !bf16_available() {
            return;
        }
        let mut rng = Rng::new(5);
        for (m, n, k, g) in [(1, 1408, 2048, 64), (1, 1536, 576, 32), (4, 1408, 2048, 64)] {
            let lay = Layout::new(4, g, n, k).unwrap();
            let (w, s, b, x) = random::<half::bf16>(&mut rng, (m, n, k), &lay);
            let xb: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
            let xf: Vec<f32> = xb.iter().map(|v| v.to_f32()).collect();
            let wv = QView::new("w", &w, &s, &b, lay, 1).unwrap();
            let mut out = vec![0.0f32; m * n];
            let st = OutStrides {
                x_stride: n,
                w_stride: 1,
            };
            let reps = 2000;
            let pb = PreparedX::new(xb.chunks_exact(k), &lay, false);
            let pf = PreparedX::new(xf.chunks_exact(k), &lay, false);
            assert!(pb.bf16.is_some() && pf.bf16.is_none());
            for _ in 0..3 {
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    dot_rows(&pb, 0..m, &wv, 0..n, &mut out, st);
                }
                let tb = t.elapsed().as_secs_f64() / reps as f64;
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    dot_rows(&pf, 0..m, &wv, 0..n, &mut out, st);
                }
                let tf = t.elapsed().as_secs_f64() / reps as f64;
                let mac = (m * n * k) as f64;
                println!(
                    "m={m} n={n} k={k}: bf16 {:.1} GMAC/s, exact f32 {:.1} GMAC/s",
                    mac / tb / 1e9,
                    mac / tf / 1e9
                );
            }
        }
    }
}
