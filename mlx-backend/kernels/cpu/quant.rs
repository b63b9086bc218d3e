//! MLX affine quantisation on the CPU, shared by the quantized kernels:
//! the validated geometry, row views, x prepared in "block order", and the
//! AVX2 dot/dequantize bodies with their scalar counterparts.
//!
//! `W[n,k] = scale * q + bias` per group of `group_size` columns; q packed
//! lowest bits first into u32 words. x is rearranged once per call into
//! block order so that one 256-bit load of 8 packed words lines up with 8
//! consecutive f32 of x: within a block of 8 words, value `v` of word `j` is
//! stored at `v * lanes + j` (lanes = 8, or fewer in a short final block).

use super::error::{check_len, KernelError};
use super::simd::Element;

// Int8-activation dot products (`ActivationPrecision::Int8`): prepare x rows
// once (`Q8Activations`), then dot a row with weight rows `r..r + n` of a
// `QView` (`int8_dot_rows`) or all rows with a few weight rows (`int8_dot_tile`).
pub(crate) use super::int8::{
    dot_rows as int8_dot_rows, dot_tile as int8_dot_tile, Int8Tier, Q8Activations,
};

/// One quantized `[N, K]` matrix in MLX affine layout.
#[derive(Clone, Copy, Debug)]
pub struct QuantMatrix<'a, T> {
    /// `[N, K * bits / 32]` packed values, lowest bits first.
    pub w: &'a [u32],
    /// `[N, K / group_size]`.
    pub scales: &'a [T],
    /// `[N, K / group_size]`.
    pub biases: &'a [T],
    pub bits: u32,
    pub group_size: usize,
}

impl<'a, T> QuantMatrix<'a, T> {
    /// Output rows `first..first + count` of this `[n, k]` matrix, as a
    /// matrix of their own (panics outside the matrix).
    pub(crate) fn rows(&self, k: usize, first: usize, count: usize) -> QuantMatrix<'a, T> {
        let words = k * self.bits as usize / 32;
        let groups = k / self.group_size;
        QuantMatrix {
            w: &self.w[first * words..][..count * words],
            scales: &self.scales[first * groups..][..count * groups],
            biases: &self.biases[first * groups..][..count * groups],
            bits: self.bits,
            group_size: self.group_size,
        }
    }
}

/// Validated quantisation geometry of one `[n, k]` matrix (or a stack of them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) bits: u32,
    pub(crate) group_size: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) vals_per_word: usize,
    pub(crate) words_per_row: usize,
    pub(crate) groups_per_row: usize,
    /// log2(words per group): groups are powers of two, so a shift suffices.
    pub(crate) words_per_group_log2: u32,
}

impl Layout {
    pub(crate) fn new(
        bits: u32,
        group_size: usize,
        n: usize,
        k: usize,
    ) -> Result<Self, KernelError> {
        if !matches!(bits, 4 | 8) {
            return Err(KernelError::Unsupported(format!(
                "bits = {bits}, expected 4 or 8"
            )));
        }
        if !matches!(group_size, 32 | 64 | 128) {
            return Err(KernelError::Unsupported(format!(
                "group_size = {group_size}, expected 32, 64 or 128"
            )));
        }
        if k == 0 || !k.is_multiple_of(group_size) {
            return Err(KernelError::Shape(format!(
                "k = {k} must be a positive multiple of group_size {group_size}"
            )));
        }
        let vals_per_word = (32 / bits) as usize;
        Ok(Layout {
            bits,
            group_size,
            n,
            k,
            vals_per_word,
            words_per_row: k / vals_per_word,
            groups_per_row: k / group_size,
            words_per_group_log2: (group_size / vals_per_word).trailing_zeros(),
        })
    }

    fn mask(&self) -> u32 {
        (1u32 << self.bits) - 1
    }

    fn group_of_word(&self, word: usize) -> usize {
        word >> self.words_per_group_log2
    }
}

/// A validated stack of `mats` quantized matrices.
#[derive(Clone, Copy)]
pub(crate) struct QView<'a, T> {
    pub(crate) w: &'a [u32],
    pub(crate) scales: &'a [T],
    pub(crate) biases: &'a [T],
    pub(crate) lay: Layout,
}

/// One output row's weights.
#[derive(Clone, Copy)]
pub(crate) struct QRow<'a, T> {
    pub(crate) w: &'a [u32],
    pub(crate) scales: &'a [T],
    pub(crate) biases: &'a [T],
}

impl<'a, T: Element> QView<'a, T> {
    pub(crate) fn new(
        name: &str,
        w: &'a [u32],
        scales: &'a [T],
        biases: &'a [T],
        lay: Layout,
        mats: usize,
    ) -> Result<Self, KernelError> {
        let rows = mats.checked_mul(lay.n);
        check_len(
            &format!("{name}.w"),
            w.len(),
            rows.and_then(|r| r.checked_mul(lay.words_per_row)),
        )?;
        let group_len = rows.and_then(|r| r.checked_mul(lay.groups_per_row));
        check_len(&format!("{name}.scales"), scales.len(), group_len)?;
        check_len(&format!("{name}.biases"), biases.len(), group_len)?;
        Ok(QView {
            w,
            scales,
            biases,
            lay,
        })
    }

    pub(crate) fn expert(&self, e: usize) -> Self {
        let (n, wpr, gpr) = (self.lay.n, self.lay.words_per_row, self.lay.groups_per_row);
        QView {
            w: &self.w[e * n * wpr..][..n * wpr],
            scales: &self.scales[e * n * gpr..][..n * gpr],
            biases: &self.biases[e * n * gpr..][..n * gpr],
            lay: self.lay,
        }
    }

    // Called per weight row inside the kernels' loops (2% of a decode step
    // as an out-of-line call).
    #[inline(always)]
    pub(crate) fn row(&self, r: usize) -> QRow<'a, T> {
        let (wpr, gpr) = (self.lay.words_per_row, self.lay.groups_per_row);
        QRow {
            w: &self.w[r * wpr..][..wpr],
            scales: &self.scales[r * gpr..][..gpr],
            biases: &self.biases[r * gpr..][..gpr],
        }
    }
}

/// x rows converted to f32 in block order, plus per-group sums of x
/// (the bias contribution is `bias * sum(x over the group)`); or, for
/// `ActivationPrecision::Int16` on the AVX-512 VNNI or AVX2 kernel, x as
/// int16 pairs.
pub(crate) struct PreparedX {
    /// f32 x in block order (empty when `int16` holds x).
    pub(crate) perm: Vec<f32>,
    /// `perm`'s value `v` of each word scaled by `2^(-bits·v)` (the last
    /// value of a word unscaled), for [`super::qdot256`]'s exact body, which
    /// then masks each weight field in place instead of shifting it down:
    /// `(q·2^(bits·v)) · (x·2^(-bits·v))` is the same product exactly. Set
    /// only where that kernel reads `perm` and no scaled value would lose
    /// bits (every nonzero |x| at least 2^-100).
    pub(crate) prescaled: bool,
    pub(crate) group_sums: Vec<f32>,
    pub(crate) rows: usize,
    /// Words per block: 16 for [`super::qdot512`], 8 for [`super::qdot256`]
    /// and the portable bodies here.
    pub(crate) lanes: usize,
    /// x quantized to int16 per word of W (see [`super::qdot512::Int16Rows`]).
    pub(crate) int16: Option<super::qdot512::Int16Rows>,
    /// Int16 x with one scale per group, for [`super::row_lanes`] (4 or
    /// more rows on AVX-512 VNNI); `perm` and `int16` are then empty.
    pub(crate) group16: Option<super::row_lanes::GroupInt16Rows>,
    /// bf16 x exactly, for `vdpbf16ps` against 4-bit W (see
    /// [`super::qdot512::Bf16Rows`]): exact-mode calls whose x is bf16;
    /// `perm` is then empty.
    pub(crate) bf16: Option<super::qdot512::Bf16Rows>,
    /// Int16-class x as AMX tiles (bf16 hi + lo; see [`super::amx`]), for
    /// [`super::amx::MIN_ROWS`] or more rows where AMX runs; `perm` and
    /// `int16` are then empty.
    pub(crate) amx: Option<super::amx::AmxX>,
}

impl PreparedX {
    /// Block order for the widest kernel this CPU runs; `int16` asks for
    /// int16 x where that kernel has it (AVX-512 VNNI, AVX2), exact f32
    /// otherwise.
    pub(crate) fn new<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
        int16: bool,
    ) -> Self {
        Self::with_amx(rows, lay, int16, true)
    }

    /// As [`PreparedX::new`]; `amx` false keeps int16 x off the AMX tiles
    /// (the AVX-512 VNNI kernels then serve every row count).
    pub(crate) fn with_amx<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
        int16: bool,
        amx: bool,
    ) -> Self {
        Self::with_kernels(rows, lay, int16, amx, super::row_lanes::enabled())
    }

    /// As [`PreparedX::with_amx`]; `row_lanes` false keeps int16 x of 4+
    /// rows on the per-word kernel instead of [`super::row_lanes`].
    pub(crate) fn with_kernels<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
        int16: bool,
        amx: bool,
        row_lanes: bool,
    ) -> Self {
        let lanes = if super::qdot512::available() { 16 } else { 8 };
        if int16 && amx && super::amx::available() {
            let mut natural = Vec::new();
            let mut count = 0;
            for row in rows {
                let start = natural.len();
                natural.resize(start + lay.k, 0.0);
                T::load_f32(row, &mut natural[start..]);
                count += 1;
            }
            if count >= super::amx::MIN_ROWS {
                let group_sums: Vec<f32> = group_sums(&natural, lay.group_size).collect();
                let tiles = super::amx::AmxX::new(&natural, count, &group_sums, lay);
                return PreparedX {
                    perm: Vec::new(),
                    prescaled: false,
                    group_sums,
                    rows: count,
                    lanes,
                    int16: None,
                    group16: None,
                    bf16: None,
                    amx: Some(tiles),
                };
            }
            let int16 = int16_kernel(lanes);
            return Self::build(
                natural.chunks_exact(lay.k),
                lay,
                lanes,
                int16,
                row_lanes,
                true,
            );
        }
        let int16 = int16 && int16_kernel(lanes);
        Self::build(rows, lay, lanes, int16, row_lanes, true)
    }

    /// x in blocks of `lanes` words, f32 or (`int16`, where that lane
    /// count's kernel has it) int16 per word.
    #[cfg(test)]
    pub(crate) fn with_lanes<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
        lanes: usize,
        int16: bool,
    ) -> Self {
        Self::build(rows, lay, lanes, int16 && int16_kernel(lanes), false, false)
    }

    /// x in 8-word blocks, exact, scaled for [`super::qdot256`]'s exact
    /// body where it runs and x allows ([`PreparedX::prescaled`]).
    #[cfg(test)]
    pub(crate) fn prescaled_with_lanes<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
    ) -> Self {
        Self::build(rows, lay, 8, false, false, true)
    }

    fn build<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
        lanes: usize,
        int16: bool,
        row_lanes: bool,
        prescale: bool,
    ) -> Self {
        let k = lay.k;
        let vpw = lay.vals_per_word;
        let mut natural = vec![0.0f32; k];
        let (mut perm, mut group_sums, mut count) = (Vec::new(), Vec::new(), 0);
        let row_lanes = row_lanes && int16 && rows.len() >= super::row_lanes::min_rows();
        let mut g16 = row_lanes.then(|| super::row_lanes::GroupInt16Rows::new(lay));
        let mut x16 = (int16 && !row_lanes).then(|| super::qdot512::Int16Rows::new(lay, lanes));
        // bf16 x is exact as bf16 pairs: the widened f32 only adds zeros.
        let bf16 = !int16
            && lanes == 16
            && lay.bits == 4
            && std::any::TypeId::of::<T>() == std::any::TypeId::of::<half::bf16>()
            && super::qdot512::bf16_available();
        let mut xb = bf16.then(|| super::qdot512::Bf16Rows::new(lay));
        let mut prescaled = prescale && lanes == 8 && !int16 && super::qdot256::available();
        let mut blocked = Vec::new();
        for row in rows {
            T::load_f32(row, &mut natural);
            group_sums.extend(self::group_sums(&natural, lay.group_size));
            if let Some(g16) = &mut g16 {
                g16.push(&natural, lay);
            } else if x16.is_some() || xb.is_some() {
                // Block order in scratch, then rounded to int16 or paired as bf16.
                blocked.resize(k, 0.0);
                to_block_order(&natural, &mut blocked, vpw, lanes);
                if let Some(x16) = &mut x16 {
                    x16.push(&blocked);
                } else if let Some(xb) = &mut xb {
                    xb.push(&blocked);
                }
            } else {
                let start = perm.len();
                perm.resize(start + k, 0.0);
                to_block_order(&natural, &mut perm[start..], vpw, lanes);
                if prescaled && natural.iter().any(|x| *x != 0.0 && x.abs() < TINY) {
                    // Scaling back the rows before is exact: none held a tiny value.
                    scale_by_field(&mut perm[..start], lay, lanes, false);
                    prescaled = false;
                }
                if prescaled {
                    scale_by_field(&mut perm[start..], lay, lanes, true);
                }
            }
            count += 1;
        }
        PreparedX {
            perm,
            prescaled,
            group_sums,
            rows: count,
            lanes,
            int16: x16,
            group16: g16,
            bf16: xb,
            amx: None,
        }
    }
}

/// Whether the blocked kernel for x in blocks of `lanes` words takes int16 x.
fn int16_kernel(lanes: usize) -> bool {
    if lanes == 16 {
        super::qdot512::int16_available()
    } else {
        super::qdot256::int16_available()
    }
}

/// Σx over each group of `group` values (the biases' term).
fn group_sums(x: &[f32], group: usize) -> impl Iterator<Item = f32> + '_ {
    x.chunks_exact(group).map(|g| g.iter().sum::<f32>())
}

/// The smallest nonzero |x| that [`PreparedX::prescaled`] scales: times
/// 2^-24 (4-bit value 6) it stays a normal f32, so the scaling is exact.
const TINY: f32 = 7.888_609e-31; // 2^-100

/// Scales block-ordered x rows of `k` values (`lanes`-word blocks,
/// value-major) for [`PreparedX::prescaled`]: value `v` of each word by
/// `2^(-bits·v)` (`down`) or back by `2^(bits·v)`; the last value of a
/// word stays.
fn scale_by_field(dst: &mut [f32], lay: &Layout, lanes: usize, down: bool) {
    let (vals_per_word, bits) = (lay.vals_per_word, lay.bits);
    let block = lanes * vals_per_word;
    let factor = |v: usize| {
        let e = (bits as usize * v) as i32;
        if down {
            2f32.powi(-e)
        } else {
            2f32.powi(e)
        }
    };
    // At most 8 values per word (4 bits); the last one stays unscaled.
    let factors: [f32; 8] = std::array::from_fn(factor);
    for d in dst.chunks_mut(lay.k).flat_map(|row| row.chunks_mut(block)) {
        let lanes = d.len() / vals_per_word;
        for (v, f) in factors.iter().enumerate().take(vals_per_word - 1).skip(1) {
            d[v * lanes..][..lanes].iter_mut().for_each(|x| *x *= f);
        }
    }
}

fn to_block_order(src: &[f32], dst: &mut [f32], vals_per_word: usize, lanes: usize) {
    let block = lanes * vals_per_word;
    for (s, d) in src.chunks(block).zip(dst.chunks_mut(block)) {
        let lanes = s.len() / vals_per_word;
        for j in 0..lanes {
            for v in 0..vals_per_word {
                d[v * lanes + j] = s[j * vals_per_word + v];
            }
        }
    }
}

/// Writes transposed `tmp` (`[n][m]`) into rows `dst_row(r)` of `out` (`[.., n]`).
pub(crate) fn scatter_rows<T: Element>(
    tmp: &[T],
    out: &mut [T],
    m: usize,
    n: usize,
    dst_row: impl Fn(usize) -> usize,
) {
    for (j, col) in tmp.chunks_exact(m).enumerate() {
        for (r, &v) in col.iter().enumerate() {
            out[dst_row(r) * n + j] = v;
        }
    }
}

/// `(Σ scale·(x·q))` of two rows with one x (biases excluded, see [`bias_term`]).
pub(crate) fn qdot2_scaled<T: Element>(
    g: &QRow<T>,
    u: &QRow<T>,
    xp: &[f32],
    lay: &Layout,
    avx: bool,
) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: `avx` comes from runtime detection of AVX2, FMA and F16C.
        return unsafe {
            if lay.bits == 4 {
                x86::qdot2::<T, 4>(g, u, xp, lay)
            } else {
                x86::qdot2::<T, 8>(g, u, xp, lay)
            }
        };
    }
    let _ = avx;
    (qdot_scalar(g, xp, lay, 0), qdot_scalar(u, xp, lay, 0))
}

/// `Σ bias · (sum of x over the group)`: the bias part of a row's dot product.
/// `avx`: eight groups at a time (F16C widens f16 biases).
pub(crate) fn bias_term<T: Element>(biases: &[T], sums: &[f32], avx: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: `avx` comes from runtime detection of AVX2, FMA and F16C.
        return unsafe { x86::bias_term(biases, sums) };
    }
    let _ = avx;
    biases.iter().zip(sums).map(|(b, s)| b.to_f32() * s).sum()
}

/// `Σ scale * (x·q)` over the blocks from `first_block` on (no bias).
fn qdot_scalar<T: Element>(row: &QRow<T>, xp: &[f32], lay: &Layout, first_block: usize) -> f32 {
    let (vpw, mask, bits) = (lay.vals_per_word, lay.mask(), lay.bits as usize);
    let words = &row.w[first_block * 8..];
    let xs = &xp[first_block * 8 * vpw..];
    let mut acc = 0.0f32;
    for (b, (wb, xb)) in words.chunks(8).zip(xs.chunks(8 * vpw)).enumerate() {
        let lanes = wb.len();
        for (j, &word) in wb.iter().enumerate() {
            let mut d = 0.0f32;
            for v in 0..vpw {
                d += xb[v * lanes + j] * ((word >> (bits * v)) & mask) as f32;
            }
            let group = lay.group_of_word((first_block + b) * 8 + j);
            acc += row.scales[group].to_f32() * d;
        }
    }
    acc
}

/// Dequantizes one weight row to f32 in block order.
pub(crate) fn dequant<T: Element>(row: &QRow<T>, lay: &Layout, dst: &mut [f32], avx: bool) {
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: `avx` comes from runtime detection of AVX2, FMA and F16C.
        return unsafe {
            if lay.bits == 4 {
                x86::dequant::<T, 4>(row, lay, dst)
            } else {
                x86::dequant::<T, 8>(row, lay, dst)
            }
        };
    }
    let _ = avx;
    dequant_scalar(row, lay, 0, dst);
}

fn dequant_scalar<T: Element>(row: &QRow<T>, lay: &Layout, first_block: usize, dst: &mut [f32]) {
    let (vpw, mask, bits) = (lay.vals_per_word, lay.mask(), lay.bits as usize);
    let words = &row.w[first_block * 8..];
    let out = &mut dst[first_block * 8 * vpw..];
    for (b, (wb, ob)) in words.chunks(8).zip(out.chunks_mut(8 * vpw)).enumerate() {
        let lanes = wb.len();
        for (j, &word) in wb.iter().enumerate() {
            let group = lay.group_of_word((first_block + b) * 8 + j);
            let (s, z) = (row.scales[group].to_f32(), row.biases[group].to_f32());
            for v in 0..vpw {
                ob[v * lanes + j] = s * ((word >> (bits * v)) & mask) as f32 + z;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{dequant_scalar, qdot_scalar, Layout, QRow};
    use crate::kernels::cpu::simd::{avx2::hsum, Element};
    use std::arch::x86_64::*;

    /// Per-lane group parameter for block `b`: a block of 8 words spans at
    /// most two groups (4-bit, group 32), split between lanes 3 and 4.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn lane_params<T: Element>(params: &[T], lay: &Layout, b: usize) -> __m256 {
        let (g0, g1) = (lay.group_of_word(b * 8), lay.group_of_word(b * 8 + 7));
        if g0 == g1 {
            // SAFETY: this function's target features include F16C.
            _mm256_set1_ps(unsafe { T::widen1(params[g0]) })
        } else {
            // A block spans at most two groups: g1 = g0 + 1.
            let pair = &params[g0..g0 + 2];
            // SAFETY: `pair` holds 2 elements; the target features include F16C.
            let v = unsafe { T::widen2(pair.as_ptr()) };
            let idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), idx)
        }
    }

    /// [`super::bias_term`], eight groups per FMA.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn bias_term<T: Element>(biases: &[T], sums: &[f32]) -> f32 {
        let n = biases.len().min(sums.len());
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` bounds both loads.
            acc = unsafe {
                _mm256_fmadd_ps(
                    T::load8(biases.as_ptr().add(i)),
                    _mm256_loadu_ps(sums.as_ptr().add(i)),
                    acc,
                )
            };
            i += 8;
        }
        let mut total = hsum(acc);
        for (b, s) in biases[i..n].iter().zip(&sums[i..n]) {
            // SAFETY: this function's target features include F16C.
            total += unsafe { T::widen1(*b) } * s;
        }
        total
    }

    /// Unpacked value `v` of each of the 8 words, as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn unpack<const BITS: u32>(w: __m256i, v: usize) -> __m256 {
        let shift = _mm256_set1_epi32((BITS as usize * v) as i32);
        let mask = _mm256_set1_epi32(((1u32 << BITS) - 1) as i32);
        _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, shift), mask))
    }

    /// # Safety
    /// Needs AVX2, FMA and F16C; `xp` must hold `lay.k` values and rows `lay.words_per_row` words.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn qdot2<T: Element, const BITS: u32>(
        g: &QRow<T>,
        u: &QRow<T>,
        xp: &[f32],
        lay: &Layout,
    ) -> (f32, f32) {
        let vpw = (32 / BITS) as usize;
        let full = lay.words_per_row / 8;
        assert!(g.w.len() >= full * 8 && u.w.len() >= full * 8 && xp.len() >= full * 8 * vpw);
        let (mut acc_g, mut acc_u) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for b in 0..full {
            // SAFETY: the assert above bounds every block's loads.
            let (wg, wu, xb) = unsafe {
                (
                    _mm256_loadu_si256(g.w.as_ptr().add(b * 8).cast()),
                    _mm256_loadu_si256(u.w.as_ptr().add(b * 8).cast()),
                    xp.as_ptr().add(b * 8 * vpw),
                )
            };
            // Two partial sums per projection hide FMA latency.
            let mut pg = [_mm256_setzero_ps(); 2];
            let mut pu = [_mm256_setzero_ps(); 2];
            for v in 0..vpw {
                // SAFETY: v < vpw keeps the load inside this block of xp.
                let x = unsafe { _mm256_loadu_ps(xb.add(8 * v)) };
                pg[v & 1] = _mm256_fmadd_ps(unpack::<BITS>(wg, v), x, pg[v & 1]);
                pu[v & 1] = _mm256_fmadd_ps(unpack::<BITS>(wu, v), x, pu[v & 1]);
            }
            let sg = lane_params(g.scales, lay, b);
            let su = lane_params(u.scales, lay, b);
            acc_g = _mm256_fmadd_ps(_mm256_add_ps(pg[0], pg[1]), sg, acc_g);
            acc_u = _mm256_fmadd_ps(_mm256_add_ps(pu[0], pu[1]), su, acc_u);
        }
        (
            hsum(acc_g) + qdot_scalar(g, xp, lay, full),
            hsum(acc_u) + qdot_scalar(u, xp, lay, full),
        )
    }

    /// # Safety
    /// Needs AVX2, FMA and F16C; `dst` must hold `lay.k` values and the row `lay.words_per_row` words.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dequant<T: Element, const BITS: u32>(
        row: &QRow<T>,
        lay: &Layout,
        dst: &mut [f32],
    ) {
        let vpw = (32 / BITS) as usize;
        let full = lay.words_per_row / 8;
        assert!(row.w.len() >= full * 8 && dst.len() >= full * 8 * vpw);
        for b in 0..full {
            // SAFETY: the assert above bounds the load.
            let w = unsafe { _mm256_loadu_si256(row.w.as_ptr().add(b * 8).cast()) };
            let s = lane_params(row.scales, lay, b);
            let z = lane_params(row.biases, lay, b);
            for v in 0..vpw {
                let val = _mm256_fmadd_ps(unpack::<BITS>(w, v), s, z);
                // SAFETY: the assert above bounds the store.
                unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add((b * vpw + v) * 8), val) };
            }
        }
        dequant_scalar(row, lay, full, dst);
    }
}
