//! `softmax(q·kᵀ·scale)·v`, causal (lower-right aligned) or unmasked, in
//! f32 with an online (flash-style) softmax over key tiles, so the scratch
//! per task is `O(QUERY_BLOCK·D)` whatever S is.
//!
//! Units of work (on the CPU team) are `(batch, head, block of
//! QUERY_BLOCK query rows)`; inside a unit four query rows at a time are
//! scored against each key with one pass over the key (`simd::dot4`), and
//! the values are accumulated with `simd::axpy`.

use crate::kernels::cpu::team;

use crate::kernels::cpu::error::{check_len, KernelError};
use crate::kernels::cpu::simd;
use crate::kernels::cpu::{run_entry, typed, typed_mut, FloatKind};
use crate::kernels::registry::Kernel;

/// Query rows per unit of work.
const QUERY_BLOCK: usize = 32;
/// Keys per online-softmax step.
const KEY_TILE: usize = 64;
/// Below this many multiply-adds threading costs more than it saves.
const PAR_MIN_MACS: usize = 1 << 18;

/// Shape of one attention call: `q [b, hq, l, d]`, `k, v [b, hkv, s, d]`.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub b: usize,
    pub hq: usize,
    pub hkv: usize,
    pub l: usize,
    pub s: usize,
    pub d: usize,
}

/// A `[batch, head, row, d]` input read in place: element strides of batch,
/// head and row (rows themselves dense), as MLX views (the KV cache's
/// slices, a transpose of `[B, L, H, D]`) lay them out.
#[derive(Clone, Copy, Debug)]
pub struct Strided<'a> {
    pub data: &'a [f32],
    pub strides: [usize; 3],
}

impl<'a> Strided<'a> {
    /// A dense `[.., heads, rows, d]` array.
    #[cfg(test)]
    pub fn dense(data: &'a [f32], heads: usize, rows: usize, d: usize) -> Self {
        Strided {
            data,
            strides: [heads * rows * d, rows * d, d],
        }
    }

    /// Fails unless every row `[batch, head, row]` lies inside `data`.
    fn check(
        &self,
        name: &str,
        batch: usize,
        heads: usize,
        rows: usize,
        d: usize,
    ) -> Result<(), KernelError> {
        if batch == 0 || heads == 0 || rows == 0 || d == 0 {
            return Ok(());
        }
        let [sb, sh, sr] = self.strides;
        let last = (batch - 1)
            .checked_mul(sb)
            .zip((heads - 1).checked_mul(sh))
            .zip((rows - 1).checked_mul(sr))
            .and_then(|((a, b), c)| a.checked_add(b)?.checked_add(c)?.checked_add(d));
        match last {
            Some(n) if n <= self.data.len() => Ok(()),
            _ => Err(KernelError::Shape(format!(
                "{name}: [{batch}, {heads}, {rows}, {d}] with strides {:?} exceeds {} elements",
                self.strides,
                self.data.len()
            ))),
        }
    }

    /// Rows `[batch, head, ..]` from their first.
    fn head(&self, batch: usize, head: usize) -> &'a [f32] {
        &self.data[batch * self.strides[0] + head * self.strides[1]..]
    }
}

/// `out [b, hq, l, d]` (dense); causal means query row `i` sees keys
/// `0..=i + s - l`.
pub fn attention(
    q: Strided<'_>,
    k: Strided<'_>,
    v: Strided<'_>,
    out: &mut [f32],
    dims: Dims,
    scale: f32,
    causal: bool,
) -> Result<(), KernelError> {
    let Dims {
        b,
        hq,
        hkv,
        l,
        s,
        d,
    } = dims;
    if hkv == 0 || !hq.is_multiple_of(hkv) {
        return Err(KernelError::Shape(format!(
            "{hq} query heads are not a multiple of {hkv} kv heads"
        )));
    }
    if causal && s < l {
        return Err(KernelError::Unsupported(format!(
            "causal attention with {l} queries over {s} keys"
        )));
    }
    q.check("q", b, hq, l, d)?;
    k.check("k", b, hkv, s, d)?;
    v.check("v", b, hkv, s, d)?;
    let q_len = b.checked_mul(hq).and_then(|n| n.checked_mul(l * d));
    check_len("out", out.len(), q_len)?;
    if out.is_empty() {
        return Ok(());
    }
    if s == 0 {
        return Err(KernelError::Shape("attention over zero keys".into()));
    }
    let group = hq / hkv;
    let task = |bh: usize, blk: usize, dst: &mut [f32]| {
        let (bi, h) = (bh / hq, bh % hq);
        let first = blk * QUERY_BLOCK;
        let qh = q.head(bi, h);
        let qs = q.strides[2];
        block(
            |r| &qh[(first + r) * qs..][..d],
            Rows::new(k, bi, h / group),
            Rows::new(v, bi, h / group),
            dst,
            d,
            scale,
            // How many keys row `first + r` sees.
            |r| {
                if causal {
                    first + r + s - l + 1
                } else {
                    s
                }
            },
        );
    };
    let macs = b * hq * l * s * d;
    if macs > PAR_MIN_MACS && !team::in_team() {
        // Over the CPU team, a (head, query block) per unit: a member's
        // own share is whole heads (with a causal mask later blocks see
        // more keys, and each head has early and late ones alike), and
        // members that finish early take the others' remaining units.
        let blocks = l.div_ceil(QUERY_BLOCK);
        let shared = team::SharedSlice::new(out);
        team::for_units(
            b * hq * blocks,
            || (),
            |unit, _| {
                let (bh, blk) = (unit / blocks, unit % blocks);
                let start = blk * QUERY_BLOCK;
                let rows = QUERY_BLOCK.min(l - start);
                // SAFETY: each unit's rows are written by its member alone.
                let dst = unsafe { shared.part((bh * l + start) * d, rows * d) };
                task(bh, blk, dst);
                Ok(())
            },
        )?;
    } else {
        for (bh, head) in out.chunks_mut(l * d).enumerate() {
            for (blk, dst) in head.chunks_mut(QUERY_BLOCK * d).enumerate() {
                task(bh, blk, dst);
            }
        }
    }
    Ok(())
}

/// The key (or value) rows of one kv head.
#[derive(Clone, Copy)]
struct Rows<'a> {
    data: &'a [f32],
    stride: usize,
}

impl<'a> Rows<'a> {
    fn new(x: Strided<'a>, batch: usize, head: usize) -> Self {
        Rows {
            data: x.head(batch, head),
            stride: x.strides[2],
        }
    }

    fn row(&self, j: usize, d: usize) -> &'a [f32] {
        &self.data[j * self.stride..][..d]
    }
}

/// The query rows `qrow(0..rows)` of one head (rows = `out.len() / d`)
/// against its keys and values; `visible(r)` is how many keys row `r` sees
/// (non-decreasing in r).
fn block<'q>(
    qrow: impl Fn(usize) -> &'q [f32],
    k: Rows<'_>,
    v: Rows<'_>,
    out: &mut [f32],
    d: usize,
    scale: f32,
    visible: impl Fn(usize) -> usize,
) {
    let rows = out.len() / d;
    let mut scores = [[0.0f32; KEY_TILE]; 4];
    let mut acc = vec![0.0f32; 4 * d];
    for r0 in (0..rows).step_by(4) {
        // A short final group repeats its last row; the extra rows are dropped.
        let idx = [0, 1, 2, 3].map(|j| (r0 + j).min(rows - 1));
        let qrows = idx.map(&qrow);
        let lim = idx.map(&visible);
        let mut m = [f32::NEG_INFINITY; 4];
        let mut sum = [0.0f32; 4];
        acc.fill(0.0);
        let end = lim[3];
        for t0 in (0..end).step_by(KEY_TILE) {
            let t1 = (t0 + KEY_TILE).min(end);
            for j in t0..t1 {
                let dots = simd::dot4(k.row(j, d), qrows);
                for (r, dot) in dots.iter().enumerate() {
                    scores[r][j - t0] = dot * scale;
                }
            }
            // Keys row r sees in this tile (non-decreasing in r).
            let seen = [0, 1, 2, 3].map(|r| lim[r].min(t1).saturating_sub(t0));
            for r in 0..4 {
                let n = seen[r];
                // Probabilities past a row's last key stay 0 for `pv4`.
                scores[r][n..seen[3]].fill(0.0);
                if n == 0 {
                    continue;
                }
                let row = &mut scores[r][..n];
                let tile_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let new_m = m[r].max(tile_max);
                let a = &mut acc[r * d..][..d];
                if m[r] != f32::NEG_INFINITY && new_m > m[r] {
                    let corr = (m[r] - new_m).exp();
                    sum[r] *= corr;
                    a.iter_mut().for_each(|x| *x *= corr);
                }
                m[r] = new_m;
                sum[r] += crate::kernels::cpu::vector_math::exp_shifted_sum(row, new_m);
            }
            pv4(&mut acc, &scores, seen[3], v, t0, d);
        }
        for r in 0..(rows - r0).min(4) {
            let inv = 1.0 / sum[r];
            for (o, a) in out[(r0 + r) * d..][..d].iter_mut().zip(&acc[r * d..][..d]) {
                *o = a * inv;
            }
        }
    }
}

/// `acc[r] += Σ_j p[r][j] · V[t0 + j]` for the 4 rows and `j < n`: with
/// AVX-512 and `d` a multiple of 16, each value row is loaded once for the
/// four rows and the accumulators stay in registers over the tile; else
/// one `axpy` per row and key.
fn pv4(acc: &mut [f32], p: &[[f32; KEY_TILE]; 4], n: usize, v: Rows<'_>, t0: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(16) && crate::kernels::cpu::isa::avx512_available() {
        // SAFETY: AVX-512F was detected; `v` holds rows t0..t0 + n of d values.
        return unsafe { x86::pv4(acc, p, n, v, t0, d) };
    }
    for (r, a) in acc.chunks_exact_mut(d).enumerate() {
        for (j, &pj) in p[r][..n].iter().enumerate() {
            simd::axpy(a, pj, v.row(t0 + j, d));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Rows, KEY_TILE};
    use std::arch::x86_64::*;

    /// [`super::pv4`] in column blocks of up to 64 values (4 × 4 registers
    /// of accumulators).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pv4(
        acc: &mut [f32],
        p: &[[f32; KEY_TILE]; 4],
        n: usize,
        v: Rows<'_>,
        t0: usize,
        d: usize,
    ) {
        let mut c0 = 0;
        while c0 < d {
            // SAFETY (each arm): c0 + 16·W ≤ d; `v` holds the rows.
            unsafe {
                c0 += match (d - c0) / 16 {
                    1 => block::<1>(acc, p, n, v, t0, d, c0),
                    2 => block::<2>(acc, p, n, v, t0, d, c0),
                    3 => block::<3>(acc, p, n, v, t0, d, c0),
                    _ => block::<4>(acc, p, n, v, t0, d, c0),
                };
            }
        }
    }

    /// Columns `c0..c0 + 16·W` of the four rows. Returns 16·W.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block<const W: usize>(
        acc: &mut [f32],
        p: &[[f32; KEY_TILE]; 4],
        n: usize,
        v: Rows<'_>,
        t0: usize,
        d: usize,
        c0: usize,
    ) -> usize {
        let mut a = [[_mm512_setzero_ps(); W]; 4];
        for (r, row) in a.iter_mut().enumerate() {
            for (w, reg) in row.iter_mut().enumerate() {
                // SAFETY: r·d + c0 + 16·w + 16 ≤ 4·d.
                *reg = unsafe { _mm512_loadu_ps(acc.as_ptr().add(r * d + c0 + 16 * w)) };
            }
        }
        // j picks a column of the four probability rows and a value row.
        #[allow(clippy::needless_range_loop)]
        for j in 0..n {
            let vr = v.row(t0 + j, d);
            let mut vv = [_mm512_setzero_ps(); W];
            for (w, reg) in vv.iter_mut().enumerate() {
                // SAFETY: c0 + 16·w + 16 ≤ d = vr.len().
                *reg = unsafe { _mm512_loadu_ps(vr.as_ptr().add(c0 + 16 * w)) };
            }
            for (r, row) in a.iter_mut().enumerate() {
                let pr = _mm512_set1_ps(p[r][j]);
                for (reg, vw) in row.iter_mut().zip(&vv) {
                    *reg = _mm512_fmadd_ps(pr, *vw, *reg);
                }
            }
        }
        for (r, row) in a.iter().enumerate() {
            for (w, reg) in row.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm512_storeu_ps(acc.as_mut_ptr().add(r * d + c0 + 16 * w), *reg) };
            }
        }
        16 * W
    }
}

fn input<'a>(data: &'a [u8], strides: &[usize], name: &str) -> Result<Strided<'a>, KernelError> {
    Ok(Strided {
        data: typed(data)?,
        strides: strides.try_into().map_err(|_| {
            KernelError::Shape(format!("{name}: {} strides, expected 3", strides.len()))
        })?,
    })
}

/// Entry point from C++ (`AttentionPrimitive`): f32 inputs read through
/// their batch/head/row strides, dense output.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_cpu(
    dtype: i32,
    q: &[u8],
    q_strides: &[usize],
    k: &[u8],
    k_strides: &[usize],
    v: &[u8],
    v_strides: &[usize],
    out: &mut [u8],
    b: usize,
    hq: usize,
    hkv: usize,
    l: usize,
    s: usize,
    d: usize,
    scale: f32,
    causal: bool,
) -> bool {
    run_entry(Kernel::Attention, || {
        let kind = FloatKind::from_code(dtype)?;
        if kind != FloatKind::F32 {
            return Err(KernelError::Unsupported(format!("attention in {kind:?}")));
        }
        let dims = Dims {
            b,
            hq,
            hkv,
            l,
            s,
            d,
        };
        attention(
            input(q, q_strides, "q")?,
            input(k, k_strides, "k")?,
            input(v, v_strides, "v")?,
            typed_mut(out)?,
            dims,
            scale,
            causal,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_util::Rng;

    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dims: Dims,
        scale: f32,
        causal: bool,
    ) -> Vec<f64> {
        let Dims {
            b,
            hq,
            hkv,
            l,
            s,
            d,
        } = dims;
        let mut out = vec![0.0f64; b * hq * l * d];
        for bi in 0..b {
            for h in 0..hq {
                let kv = (bi * hkv + h / (hq / hkv)) * s * d;
                for i in 0..l {
                    let qr = &q[((bi * hq + h) * l + i) * d..][..d];
                    let n = if causal { i + s - l + 1 } else { s };
                    let sc: Vec<f64> = (0..n)
                        .map(|j| {
                            (0..d)
                                .map(|x| qr[x] as f64 * k[kv + j * d + x] as f64)
                                .sum::<f64>()
                                * scale as f64
                        })
                        .collect();
                    let mx = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let p: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                    let z: f64 = p.iter().sum();
                    let o = &mut out[((bi * hq + h) * l + i) * d..][..d];
                    for (j, pj) in p.iter().enumerate() {
                        for x in 0..d {
                            o[x] += pj / z * v[kv + j * d + x] as f64;
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_reference() {
        let mut rng = Rng::new(0xa77e);
        for (b, hq, hkv, l, s, d) in [
            (1, 4, 4, 1, 1, 64),
            (1, 9, 3, 7, 7, 64),
            (2, 9, 3, 7, 20, 32),
            (1, 4, 4, 70, 200, 64),
            (1, 2, 1, 65, 65, 33),
        ] {
            let dims = Dims {
                b,
                hq,
                hkv,
                l,
                s,
                d,
            };
            let q: Vec<f32> = rng.elems(b * hq * l * d, 1.0);
            let k: Vec<f32> = rng.elems(b * hkv * s * d, 1.0);
            let v: Vec<f32> = rng.elems(b * hkv * s * d, 1.0);
            for causal in [false, true] {
                let mut out = vec![f32::NAN; q.len()];
                let scale = 1.0 / (d as f32).sqrt();
                attention(
                    Strided::dense(&q, hq, l, d),
                    Strided::dense(&k, hkv, s, d),
                    Strided::dense(&v, hkv, s, d),
                    &mut out,
                    dims,
                    scale,
                    causal,
                )
                .unwrap();
                let want = reference(&q, &k, &v, dims, scale, causal);
                for (i, (g, w)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{dims:?} causal={causal}: index {i}: got {g}, want {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn rejects_bad_arguments() {
        let dims = Dims {
            b: 1,
            hq: 3,
            hkv: 2,
            l: 1,
            s: 1,
            d: 4,
        };
        let x = [0.0f32; 12];
        let mut out = vec![0.0f32; 12];
        let dense = |n: usize| Strided::dense(&x[..n], 3, 1, 4);
        // 3 query heads over 2 kv heads.
        assert!(attention(dense(12), dense(8), dense(8), &mut out, dims, 1.0, false).is_err());
        let dims = Dims { hkv: 3, ..dims };
        assert!(attention(dense(12), dense(12), dense(12), &mut out, dims, 1.0, false).is_ok());
        // k too short for its strides.
        assert!(attention(dense(12), dense(11), dense(12), &mut out, dims, 1.0, false).is_err());
        // Causal with more queries than keys.
        let dims = Dims {
            hq: 1,
            hkv: 1,
            l: 2,
            ..dims
        };
        let mut out = vec![0.0f32; 8];
        let q = Strided::dense(&x[..8], 1, 2, 4);
        assert!(attention(q, dense(12), dense(12), &mut out, dims, 1.0, true).is_err());
    }
}
