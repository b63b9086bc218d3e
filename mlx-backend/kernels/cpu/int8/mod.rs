//! Int8-activation dot products against MLX affine-quantized weights: the
//! `ActivationPrecision::Int8` mode of the quantized kernels.
//!
//! x is quantized per block of 32 values as llama.cpp's Q8 does:
//! `d = max|x| / 127`, `q = round(x · (1/d))` (ties to even). A row's dot
//! product is then
//! `Σ_blocks scale_g · d_b · Σ q_w·q_x  +  Σ_groups bias_g · Σ_{b in g} d_b · Σ q_x`,
//! the dot product of the dequantized weights with the dequantized x
//! (integer sums exact). The bias term deliberately uses the quantized x
//! too (as llama.cpp's Q8_1 sums do): with exact sums the error would be
//! `Σ (w - bias)·(x - x̂)`, whose weights `scale·q ≥ 0` all share one sign, so
//! the rounding errors add up instead of cancelling; on the default model
//! that doubled the logit error (1.4 against 0.6).
//!
//! Use: [`Q8Activations::prepare`] once per call (or `prepare_into` to reuse
//! buffers), then [`dot_rows`] (one x row against weight rows `first..`)
//! or [`dot_tile`] (every x row against a few weight rows, the prefill
//! GEMM tile). Both return complete dot products, biases included.
//!
//! Prepared layout, per *chunk* (what one 256-bit load of packed weights
//! covers): 4-bit, 64 values (two blocks) stored as `[even values of block
//! 0, of block 1, odd values of block 0, of block 1]`, 16 each, because a
//! weight byte holds an even value in its low nibble and the next odd value
//! in its high nibble; 8-bit, one block in natural order. Each chunk carries
//! 8 per-lane block scales (`lane_d`) that line up with the i32 lanes of the
//! integer dot. A trailing single block (4-bit, odd block count) is padded
//! with zeros to a whole chunk.

mod tier;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;

pub(crate) use tier::Int8Tier;

use super::error::KernelError;
use super::layout::{Layout, QRow, QView};
use super::simd::Element;

/// Values per quantization block of x.
pub(crate) const BLOCK: usize = 32;
/// x rows per pass in [`dot_tile`].
const RX: usize = 2;

/// Values per chunk (one 256-bit load of packed weights).
fn chunk_values(bits: u32) -> usize {
    if bits == 4 {
        2 * BLOCK
    } else {
        BLOCK
    }
}

/// x rows quantized to int8 in chunk order, for one weight layout.
#[derive(Default)]
pub(crate) struct Q8Activations {
    q: Vec<i8>,
    lane_d: Vec<f32>,
    group_sums: Vec<f32>,
    rows: usize,
    bits: u32,
    k: usize,
    group_size: usize,
    scratch: Vec<f32>,
}

/// One prepared x row.
#[derive(Clone, Copy)]
pub(crate) struct Q8Row<'a> {
    pub(crate) q: &'a [i8],
    pub(crate) lane_d: &'a [f32],
    pub(crate) group_sums: &'a [f32],
    /// `(bits, k, group_size)` of the layout it was prepared for.
    prepared_for: (u32, usize, usize),
}

impl Q8Row<'_> {
    /// Refuses weights whose layout differs from the one x was prepared for.
    fn check(&self, lay: &Layout) -> Result<(), KernelError> {
        let (bits, k, group) = self.prepared_for;
        if (bits, k, group) != (lay.bits, lay.k, lay.group_size) {
            return Err(KernelError::Shape(format!(
                "x was prepared for {bits} bits, k = {k}, group {group}; \
                 weights have {} bits, k = {}, group {}",
                lay.bits, lay.k, lay.group_size
            )));
        }
        Ok(())
    }
}

impl Q8Activations {
    /// Quantizes `rows` (each `lay.k` long) for weights of layout `lay`.
    pub(crate) fn prepare<'x, T: Element>(
        rows: impl Iterator<Item = &'x [T]>,
        lay: &Layout,
    ) -> Self {
        let mut a = Q8Activations::default();
        a.prepare_into(rows, lay);
        a
    }

    /// As [`Self::prepare`], reusing this value's buffers.
    pub(crate) fn prepare_into<'x, T: Element>(
        &mut self,
        rows: impl Iterator<Item = &'x [T]>,
        lay: &Layout,
    ) {
        let (k, cv) = (lay.k, chunk_values(lay.bits));
        let chunks = k.div_ceil(cv);
        self.q.clear();
        self.lane_d.clear();
        self.group_sums.clear();
        self.scratch.resize(k, 0.0);
        (self.bits, self.k, self.group_size, self.rows) = (lay.bits, k, lay.group_size, 0);
        for row in rows {
            T::load_f32(row, &mut self.scratch);
            let x = &self.scratch[..k];
            let (q0, d0) = (self.q.len(), self.lane_d.len());
            self.q.resize(q0 + chunks * cv, 0);
            self.lane_d.resize(d0 + chunks * 8, 0.0);
            let blocks_per_group = lay.group_size / BLOCK;
            let (q, lane_d) = (&mut self.q[q0..], &mut self.lane_d[d0..]);
            let sums = &mut self.group_sums;
            let mut group_sum = 0.0f32;
            quantize_row(x, lay.bits, q, lane_d, |b, sum| {
                group_sum += sum;
                if (b + 1) % blocks_per_group == 0 {
                    sums.push(group_sum);
                    group_sum = 0.0;
                }
            });
            self.rows += 1;
        }
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn row(&self, i: usize) -> Q8Row<'_> {
        let cv = chunk_values(self.bits);
        let chunks = self.k.div_ceil(cv);
        let groups = self.k / self.group_size;
        Q8Row {
            q: &self.q[i * chunks * cv..][..chunks * cv],
            lane_d: &self.lane_d[i * chunks * 8..][..chunks * 8],
            group_sums: &self.group_sums[i * groups..][..groups],
            prepared_for: (self.bits, self.k, self.group_size),
        }
    }
}

/// Quantizes one row `x` into chunk order (`q`, `lane_d` zeroed by the
/// caller); `block_sum(b, s)` receives each block's sum of dequantized
/// values, `s = d · Σ q`.
fn quantize_row(
    x: &[f32],
    bits: u32,
    q: &mut [i8],
    lane_d: &mut [f32],
    mut block_sum: impl FnMut(usize, f32),
) {
    let avx = super::isa::has_avx2_f16c();
    let mut qb = [0i8; BLOCK];
    for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
        let xb: &[f32; BLOCK] = xb.try_into().expect("chunks_exact");
        let (d, sum) = quantize_block(xb, &mut qb, avx);
        if bits == 4 {
            let (c, half) = (b / 2, b % 2);
            let base = c * 2 * BLOCK + half * 16;
            for p in 0..16 {
                q[base + p] = qb[2 * p];
                q[base + BLOCK + p] = qb[2 * p + 1];
            }
            lane_d[c * 8 + half * 4..][..4].fill(d);
        } else {
            q[b * BLOCK..][..BLOCK].copy_from_slice(&qb);
            lane_d[b * 8..][..8].fill(d);
        }
        block_sum(b, d * sum as f32);
    }
}

/// llama.cpp's Q8 block: returns `d` and `Σ q`, writes `q = round(x / d)`
/// (ties to even) with `d = max|x| / 127`.
fn quantize_block(x: &[f32; BLOCK], q: &mut [i8; BLOCK], avx: bool) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: `avx` comes from runtime detection of AVX2, FMA and F16C.
        return unsafe { x86::quantize_block(x, q) };
    }
    let _ = avx;
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (o, v) in q.iter_mut().zip(x) {
        *o = (v * id).round_ties_even() as i8;
    }
    (d, q.iter().map(|&v| v as i32).sum())
}

/// Complete dot products (biases included) of prepared x row `x` with weight
/// rows `first..first + out.len()` of `w`: `out[i] = x · w.row(first + i)`.
pub(crate) fn dot_rows<P: Element>(
    x: Q8Row,
    w: &QView<P>,
    first: usize,
    out: &mut [f32],
    tier: Int8Tier,
) -> Result<(), KernelError> {
    x.check(&w.lay)?;
    check_rows(w, first, out.len())?;
    dot_range::<P, 1>(w, first, &[x], out, tier);
    Ok(())
}

/// Complete dot products of every prepared x row with weight rows
/// `first..first + rows` of `w`, into `out` as `[rows][xs.rows()]`.
pub(crate) fn dot_tile<P: Element>(
    xs: &Q8Activations,
    w: &QView<P>,
    first: usize,
    out: &mut [f32],
    tier: Int8Tier,
) -> Result<(), KernelError> {
    let m = xs.rows();
    if m == 0 {
        return Ok(());
    }
    xs.row(0).check(&w.lay)?;
    if !out.len().is_multiple_of(m) {
        return Err(KernelError::Shape(format!(
            "tile output of {} values is not [rows][{m}]",
            out.len()
        )));
    }
    check_rows(w, first, out.len() / m)?;
    let rows: Vec<Q8Row> = (0..m).map(|i| xs.row(i)).collect();
    dot_range::<P, RX>(w, first, &rows, out, tier);
    Ok(())
}

/// [`dot_tile`] on checked arguments: the SIMD body over whole chunks, the
/// scalar one for the rest (everything on the scalar tier).
fn dot_range<P: Element, const NX: usize>(
    w: &QView<P>,
    first: usize,
    xs: &[Q8Row],
    out: &mut [f32],
    tier: Int8Tier,
) {
    let (lay, m) = (&w.lay, xs.len());
    let rows = out.chunks_exact_mut(m).enumerate();
    #[cfg(target_arch = "x86_64")]
    if tier.has_avx2() {
        x86::dot_range::<P, NX>(w, first, xs, out, tier);
        // 4-bit with an odd block count: the trailing block in scalar code.
        let blocks = lay.k / BLOCK;
        if lay.bits == 4 && blocks % 2 == 1 {
            for (j, o) in out.chunks_exact_mut(m).enumerate() {
                let row = w.row(first + j);
                for (o, x) in o.iter_mut().zip(xs) {
                    *o += scalar_scaled(&row, x, lay, blocks - 1);
                }
            }
        }
        return;
    }
    let _ = tier;
    for (j, o) in rows {
        let row = w.row(first + j);
        for (o, x) in o.iter_mut().zip(xs) {
            *o = scalar_scaled(&row, x, lay, 0) + scalar_bias(&row, x);
        }
    }
}

fn check_rows<P>(w: &QView<P>, first: usize, count: usize) -> Result<(), KernelError> {
    let rows = w.w.len() / w.lay.words_per_row.max(1);
    if first.checked_add(count).is_none_or(|end| end > rows) {
        return Err(KernelError::IndexOutOfRange(format!(
            "weight rows {first}..{first}+{count} of {rows}"
        )));
    }
    Ok(())
}

/// `Σ scale · d · Σ q_w·q_x` over blocks `first_block..`, reading the chunk
/// order as the SIMD bodies do.
fn scalar_scaled<P: Element>(w: &QRow<P>, x: &Q8Row, lay: &Layout, first_block: usize) -> f32 {
    let byte = |i: usize| (w.w[i / 4] >> (8 * (i % 4))) as u8;
    let mut acc = 0.0f32;
    for b in first_block..lay.k / BLOCK {
        let mut isum = 0i32;
        let d = if lay.bits == 4 {
            let (c, half) = (b / 2, b % 2);
            let (wb, xb) = (c * BLOCK + half * 16, c * 2 * BLOCK + half * 16);
            for p in 0..16 {
                let v = byte(wb + p);
                isum += (v & 15) as i32 * x.q[xb + p] as i32;
                isum += (v >> 4) as i32 * x.q[xb + BLOCK + p] as i32;
            }
            x.lane_d[c * 8 + half * 4]
        } else {
            for p in 0..BLOCK {
                isum += byte(b * BLOCK + p) as i32 * x.q[b * BLOCK + p] as i32;
            }
            x.lane_d[b * 8]
        };
        let scale = w.scales[b * BLOCK / lay.group_size].to_f32();
        acc += isum as f32 * (d * scale);
    }
    acc
}

/// `Σ bias · (Σ x̂ over the group)`.
fn scalar_bias<P: Element>(w: &QRow<P>, x: &Q8Row) -> f32 {
    w.biases
        .iter()
        .zip(x.group_sums)
        .map(|(b, s)| b.to_f32() * s)
        .sum()
}
