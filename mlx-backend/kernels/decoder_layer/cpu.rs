//! One pre-norm decoder block for single-token decode rows, in f32:
//!
//! ```text
//! h   = x + o_proj(attention(rope(q), cache ⊕ rope(k), cache ⊕ v))
//! out = h + down(silu(gate(norm2(h))) * up(norm2(h)))
//! ```
//! with `q, k, v = (q|k|v)_proj(norm1(x)) (+ bias) (→ per-head q/k norm)`.
//!
//! Every stage reuses the other kernels' bodies (RMSNorm, the quantized
//! matvec, the fused gate/up projection); what this kernel adds is rope,
//! the cache append and a single-query attention, and doing the whole
//! block in one MLX node, so the per-op dispatch cost is paid once per layer
//! instead of ~60 times. Row `b` of the batch has its own cache (written in
//! place at its own offset), so a ragged decode batch needs no padding.

use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::ffi::DecoderLayerSpec;
use crate::kernels::cpu::error::{check_len, KernelError};
use crate::kernels::cpu::int8::{dot_rows, Int8Tier, Q8Activations};
use crate::kernels::cpu::quant::{Layout, QView, QuantMatrix};
use crate::kernels::cpu::simd::{self, Element};
use crate::kernels::cpu::{run_entry, with_float, FloatKind};
use crate::kernels::gate_qmv_silu_mul::cpu::gate_qmv_silu_mul_with;
use crate::kernels::quantized_matmul::cpu::quantized_matmul_with;
use crate::kernels::registry::Kernel;
use crate::kernels::rms_norm::cpu::rms_norm;
use crate::kernels::ActivationPrecision;

/// The projections, in the order of their `(bits, group_size)` pairs and
/// of their `[w, scales, biases]` inputs.
pub(crate) const PROJECTIONS: [&str; 7] = ["q", "k", "v", "o", "gate", "up", "down"];

/// Rotary embedding of one head vector (MLX's `fast::rope` semantics).
pub struct Rope<'a> {
    pub dims: usize,
    pub traditional: bool,
    /// `1 / freq` per rotated pair: from `base` or from explicit frequencies.
    pub inv_freqs: &'a [f32],
    pub scale: f32,
    /// YaRN's factor on the rotated features (1 otherwise).
    pub mscale: f32,
}

impl Rope<'_> {
    /// MLX's default frequencies, `base^(-i / (dims/2))`.
    pub fn inv_freqs_from_base(base: f32, dims: usize) -> Vec<f32> {
        let half = dims / 2;
        let step = base.ln() / half as f32;
        (0..half).map(|i| (-(i as f32) * step).exp()).collect()
    }

    fn apply(&self, x: &mut [f32], position: usize) {
        let dims = self.dims.min(x.len());
        if self.mscale != 1.0 {
            x[..dims].iter_mut().for_each(|v| *v *= self.mscale);
        }
        let half = dims / 2;
        let pos = self.scale * position as f32;
        for (i, inv) in self.inv_freqs.iter().enumerate().take(half) {
            let (sin, cos) = (pos * inv).sin_cos();
            let (a, b) = if self.traditional {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (x1, x2) = (x[a], x[b]);
            x[a] = x1 * cos - x2 * sin;
            x[b] = x1 * sin + x2 * cos;
        }
    }
}

/// One row's KV cache, `[heads, capacity, head_dim]`, valid up to `offset`
/// before this step.
pub struct RowCache<'a> {
    pub keys: &'a mut [f32],
    pub values: &'a mut [f32],
    pub capacity: usize,
    pub offset: usize,
}

/// The block's weights; `P` is the scales' and norms' element type.
pub struct LayerWeights<'a, P> {
    pub input_norm: &'a [P],
    pub post_norm: &'a [P],
    /// In [`PROJECTIONS`] order.
    pub proj: [QuantMatrix<'a, P>; 7],
    /// q, k, v biases (Qwen2).
    pub qkv_bias: Option<[&'a [P]; 3]>,
    /// Per-head q and k norm weights (Qwen3).
    pub qk_norm: Option<[&'a [P]; 2]>,
}

/// The block's geometry.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub hidden: usize,
    pub intermediate: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub eps: f32,
    pub attn_scale: f32,
    /// Int8 activations on this tier for the projections; `None`: exact f32.
    pub int8: Option<Int8Tier>,
}

/// Below this many multiply-adds a single-row projection stays on one thread.
const SPLIT_MIN_MACS: usize = 1 << 16;

/// `src [rows, k] · Wᵀ → [rows, n]`. A single row is split in two halves of
/// output rows over the pool (the caller runs inside a rayon scope, so the
/// split costs a local push, not a wake-up from outside the pool).
fn project<P: Element>(
    src: &[f32],
    m: &QuantMatrix<P>,
    rows: usize,
    n: usize,
    k: usize,
    int8: Option<Int8Tier>,
) -> Result<Vec<f32>, KernelError> {
    let mut dst = vec![0.0f32; rows * n];
    if rows != 1 || n < 4 || n * k < SPLIT_MIN_MACS {
        quantized_matmul_with::<f32, P>(src, *m, &mut dst, rows, n, k, int8)?;
        return Ok(dst);
    }
    let lay = Layout::new(m.bits, m.group_size, n, k)?;
    let view = QView::new("w", m.w, m.scales, m.biases, lay, 1)?;
    let half = (n / 2) & !1;
    let (lo, hi) = dst.split_at_mut(half);
    match int8 {
        Some(tier) => {
            let x = Q8Activations::prepare(std::iter::once(src), &lay);
            let (a, b) = rayon::join(
                || dot_rows(x.row(0), &view, 0, lo, tier),
                || dot_rows(x.row(0), &view, half, hi, tier),
            );
            a.and(b)?;
        }
        None => {
            let part = |first: usize, out: &mut [f32]| {
                let rows = rows_of(m, k, first, out.len());
                quantized_matmul_with::<f32, P>(src, rows, out, 1, out.len(), k, None)
            };
            let (a, b) = rayon::join(|| part(0, lo), || part(half, hi));
            a.and(b)?;
        }
    }
    Ok(dst)
}

/// Output rows `first..first + count` of `m` (K = `k`) as a matrix of their own.
fn rows_of<'a, P>(
    m: &QuantMatrix<'a, P>,
    k: usize,
    first: usize,
    count: usize,
) -> QuantMatrix<'a, P> {
    let words = k * m.bits as usize / 32;
    let groups = k / m.group_size;
    QuantMatrix {
        w: &m.w[first * words..][..count * words],
        scales: &m.scales[first * groups..][..count * groups],
        biases: &m.biases[first * groups..][..count * groups],
        bits: m.bits,
        group_size: m.group_size,
    }
}

/// Runs the block for `x [rows, hidden]` into `out [rows, hidden]`,
/// appending each row's key and value to `caches[row]`.
pub fn decoder_layer<P: Element>(
    x: &[f32],
    w: &LayerWeights<P>,
    g: &Geometry,
    rope: &Rope,
    caches: &mut [RowCache],
    out: &mut [f32],
) -> Result<(), KernelError> {
    // Inside a scope the block runs on a pool thread, so every split below
    // is a cheap local one.
    rayon::scope(|_| decoder_layer_body(x, w, g, rope, caches, out))
}

fn decoder_layer_body<P: Element>(
    x: &[f32],
    w: &LayerWeights<P>,
    g: &Geometry,
    rope: &Rope,
    caches: &mut [RowCache],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let rows = caches.len();
    let (h, d) = (g.hidden, g.head_dim);
    let (nq, nkv) = (g.n_heads, g.n_kv_heads);
    if nkv == 0 || !nq.is_multiple_of(nkv) || d == 0 || !rope.dims.is_multiple_of(2) {
        return Err(KernelError::Shape(format!(
            "{nq} query heads, {nkv} kv heads, head_dim {d}, rope dims {}",
            rope.dims
        )));
    }
    check_len("x", x.len(), rows.checked_mul(h))?;
    check_len("out", out.len(), rows.checked_mul(h))?;
    for (r, c) in caches.iter().enumerate() {
        let len = nkv.checked_mul(c.capacity).and_then(|v| v.checked_mul(d));
        check_len(&format!("keys[{r}]"), c.keys.len(), len)?;
        check_len(&format!("values[{r}]"), c.values.len(), len)?;
        if c.offset >= c.capacity {
            return Err(KernelError::Shape(format!(
                "cache {r}: offset {} leaves no room in capacity {}",
                c.offset, c.capacity
            )));
        }
    }
    let norm = |src: &[f32], weight: &[P], dst: &mut [f32], n: usize, dim: usize| {
        let wf: Vec<f32> = weight.iter().map(|v| v.to_f32()).collect();
        rms_norm::<f32>(src, dim, &wf, 1, dst, n, dim, g.eps)
    };
    let project =
        |src: &[f32], m: &QuantMatrix<P>, n: usize, k: usize| project(src, m, rows, n, k, g.int8);

    // Attention half.
    let mut xn = vec![0.0f32; rows * h];
    norm(x, w.input_norm, &mut xn, rows, h)?;
    let [wq, wk, wv, wo, wg, wu, wd] = &w.proj;
    let mut q = project(&xn, wq, nq * d, h)?;
    let mut k = project(&xn, wk, nkv * d, h)?;
    let mut v = project(&xn, wv, nkv * d, h)?;
    if let Some([bq, bk, bv]) = &w.qkv_bias {
        for (t, b) in [(&mut q, bq), (&mut k, bk), (&mut v, bv)] {
            let n = t.len() / rows;
            check_len("qkv bias", b.len(), Some(n))?;
            for row in t.chunks_exact_mut(n) {
                row.iter_mut()
                    .zip(b.iter())
                    .for_each(|(a, b)| *a += b.to_f32());
            }
        }
    }
    if let Some([qn, kn]) = &w.qk_norm {
        check_len("q_norm", qn.len(), Some(d))?;
        check_len("k_norm", kn.len(), Some(d))?;
        let qs = q.clone();
        norm(&qs, qn, &mut q, rows * nq, d)?;
        let ks = k.clone();
        norm(&ks, kn, &mut k, rows * nkv, d)?;
    }
    for (r, cache) in caches.iter_mut().enumerate() {
        let pos = cache.offset;
        for head in q[r * nq * d..][..nq * d].chunks_exact_mut(d) {
            rope.apply(head, pos);
        }
        for kh in 0..nkv {
            let key = &mut k[(r * nkv + kh) * d..][..d];
            rope.apply(key, pos);
            let at = (kh * cache.capacity + pos) * d;
            cache.keys[at..at + d].copy_from_slice(key);
            cache.values[at..at + d].copy_from_slice(&v[(r * nkv + kh) * d..][..d]);
        }
    }
    // One task per (row, query head) once the scores are worth a split.
    let mut attn = vec![0.0f32; rows * nq * d];
    let caches: &[RowCache] = caches;
    let head = |i: usize, out: &mut [f32], scores: &mut Vec<f32>| {
        let (r, qh) = (i / nq, i % nq);
        let cache = &caches[r];
        let base = qh / (nq / nkv) * cache.capacity * d;
        let len = (cache.offset + 1) * d;
        attend(
            &q[i * d..][..d],
            &cache.keys[base..][..len],
            &cache.values[base..][..len],
            g.attn_scale,
            scores,
            out,
        );
    };
    let work: usize = caches.iter().map(|c| (c.offset + 1) * nq * d).sum();
    if work >= SPLIT_MIN_MACS {
        attn.par_chunks_mut(d)
            .enumerate()
            .for_each_init(Vec::new, |scores, (i, out)| head(i, out, scores));
    } else {
        let mut scores = Vec::new();
        for (i, out) in attn.chunks_mut(d).enumerate() {
            head(i, out, &mut scores);
        }
    }
    let o = project(&attn, wo, h, nq * d)?;
    let hres: Vec<f32> = x.iter().zip(&o).map(|(a, b)| a + b).collect();

    // MLP half.
    let mut hn = vec![0.0f32; rows * h];
    norm(&hres, w.post_norm, &mut hn, rows, h)?;
    let mut act = vec![0.0f32; rows * g.intermediate];
    gate_qmv_silu_mul_with::<f32, P>(&hn, *wg, *wu, &mut act, rows, g.intermediate, h, g.int8)?;
    let down = project(&act, wd, h, g.intermediate)?;
    for ((o, a), b) in out.iter_mut().zip(&hres).zip(&down) {
        *o = a + b;
    }
    Ok(())
}

/// `softmax(scale·q·Kᵀ)·V` for one query over `keys, values [S, d]`.
fn attend(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let d = q.len();
    scores.clear();
    let rows: Vec<&[f32]> = keys.chunks_exact(d).collect();
    for quad in rows.chunks(4) {
        // A short final group repeats its last key; the extra sums are dropped.
        let w = [0, 1, 2, 3].map(|j| quad[j.min(quad.len() - 1)]);
        let s = simd::dot4(q, w);
        scores.extend(s.iter().take(quad.len()).map(|v| scale * v));
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    out.iter_mut().for_each(|o| *o = 0.0);
    for (p, v) in scores.iter().zip(values.chunks_exact(d)) {
        simd::axpy(out, p / sum, v);
    }
}

/// A buffer table from C++: `(address, bytes)` pairs of MLX buffers.
struct Buffers<'a> {
    table: &'a [usize],
    next: usize,
}

impl<'a> Buffers<'a> {
    fn bytes(&mut self, name: &str) -> Result<(usize, usize), KernelError> {
        let pair = self
            .table
            .get(2 * self.next..2 * self.next + 2)
            .ok_or_else(|| KernelError::Shape(format!("buffer table ends before {name}")))?;
        self.next += 1;
        Ok((pair[0], pair[1]))
    }

    fn typed<T>(&mut self, name: &str) -> Result<&'a [T], KernelError> {
        let (addr, len) = self.bytes(name)?;
        let (size, align) = (std::mem::size_of::<T>(), std::mem::align_of::<T>());
        if !len.is_multiple_of(size) || !addr.is_multiple_of(align) || (addr == 0 && len > 0) {
            return Err(KernelError::Shape(format!("{name}: misaligned buffer")));
        }
        if len == 0 {
            return Ok(&[]);
        }
        // SAFETY: C++ passes the (address, length) of a live MLX buffer that
        // outlives this call and that no output aliases (donated caches
        // appear only as outputs); every element type here accepts any bits.
        Ok(unsafe { std::slice::from_raw_parts(addr as *const T, len / size) })
    }

    fn typed_mut<T>(&mut self, name: &str) -> Result<&'a mut [T], KernelError> {
        let (addr, len) = self.bytes(name)?;
        let (size, align) = (std::mem::size_of::<T>(), std::mem::align_of::<T>());
        if !len.is_multiple_of(size) || !addr.is_multiple_of(align) || addr == 0 {
            return Err(KernelError::Shape(format!("{name}: misaligned output")));
        }
        // SAFETY: as in `typed`; each output buffer is distinct from every
        // other buffer in the tables, so the borrow is exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(addr as *mut T, len / size) })
    }
}

/// Cache arrays the Primitive had to copy because something else held them.
static CACHE_COPIES: AtomicU64 = AtomicU64::new(0);

/// Caches (keys or values arrays) copied instead of updated in place, since
/// the process started: stays flat in a decode loop that keeps no extra
/// reference to its caches.
pub fn cache_copies() -> u64 {
    CACHE_COPIES.load(Ordering::Relaxed)
}

/// Entry point from C++ (`DecoderLayerPrimitive`). `inputs` holds the
/// `(address, bytes)` of: x, input norm, post norm, `[w, scales, biases]`
/// of each projection in [`PROJECTIONS`] order, then the optional q/k/v
/// biases, q/k norms and rope frequencies. `outputs`: out, then keys and
/// values of each row (already holding the cached positions; `copied_caches`
/// of them had to be copied rather than reused). `quant` is
/// `(bits, group_size)` per projection; `offsets`/`capacities` per row.
pub(crate) fn decoder_layer_cpu(
    spec: &DecoderLayerSpec,
    copied_caches: usize,
    quant: &[i32],
    offsets: &[i32],
    capacities: &[i32],
    inputs: &[usize],
    outputs: &[usize],
) -> bool {
    CACHE_COPIES.fetch_add(copied_caches as u64, Ordering::Relaxed);
    run_entry(Kernel::DecoderLayer, || {
        let pk = FloatKind::from_code(spec.params_dtype)?;
        with_float!(pk, P => run::<P>(spec, quant, offsets, capacities, inputs, outputs))
    })
}

fn run<P: Element>(
    spec: &DecoderLayerSpec,
    quant: &[i32],
    offsets: &[i32],
    capacities: &[i32],
    inputs: &[usize],
    outputs: &[usize],
) -> Result<(), KernelError> {
    check_len("quant", quant.len(), Some(2 * PROJECTIONS.len()))?;
    check_len("offsets", offsets.len(), Some(spec.batch))?;
    check_len("capacities", capacities.len(), Some(spec.batch))?;
    let mut ins = Buffers {
        table: inputs,
        next: 0,
    };
    let x = ins.typed::<f32>("x")?;
    let input_norm = ins.typed::<P>("input_norm")?;
    let post_norm = ins.typed::<P>("post_norm")?;
    let mut proj = Vec::with_capacity(PROJECTIONS.len());
    for (i, name) in PROJECTIONS.iter().enumerate() {
        let (bits, group) = (quant[2 * i], quant[2 * i + 1]);
        if bits <= 0 || group <= 0 {
            return Err(KernelError::Unsupported(format!(
                "{name}: bits {bits}, group_size {group}"
            )));
        }
        proj.push(QuantMatrix {
            w: ins.typed::<u32>(name)?,
            scales: ins.typed::<P>(name)?,
            biases: ins.typed::<P>(name)?,
            bits: bits as u32,
            group_size: group as usize,
        });
    }
    let proj: [QuantMatrix<P>; 7] = proj
        .try_into()
        .map_err(|_| KernelError::Shape("projection count".into()))?;
    let qkv_bias = if spec.has_qkv_bias {
        Some([
            ins.typed::<P>("q_bias")?,
            ins.typed("k_bias")?,
            ins.typed("v_bias")?,
        ])
    } else {
        None
    };
    let qk_norm = if spec.has_qk_norm {
        Some([ins.typed::<P>("q_norm")?, ins.typed("k_norm")?])
    } else {
        None
    };
    let inv_freqs = if spec.has_freqs {
        let freqs = ins.typed::<f32>("freqs")?;
        freqs.iter().map(|f| 1.0 / f).collect()
    } else {
        Rope::inv_freqs_from_base(spec.rope_base, spec.rope_dims)
    };
    check_len(
        "rope frequencies",
        inv_freqs.len(),
        Some(spec.rope_dims / 2),
    )?;
    let rope = Rope {
        dims: spec.rope_dims,
        traditional: spec.rope_traditional,
        inv_freqs: &inv_freqs,
        scale: spec.rope_scale,
        mscale: spec.rope_mscale,
    };
    let mut outs = Buffers {
        table: outputs,
        next: 0,
    };
    let out = outs.typed_mut::<f32>("out")?;
    let mut caches = Vec::with_capacity(spec.batch);
    for r in 0..spec.batch {
        let (offset, capacity) = (offsets[r], capacities[r]);
        if offset < 0 || capacity < 0 {
            return Err(KernelError::Shape(format!(
                "row {r}: offset {offset}, capacity {capacity}"
            )));
        }
        caches.push(RowCache {
            keys: outs.typed_mut::<f32>("keys")?,
            values: outs.typed_mut::<f32>("values")?,
            capacity: capacity as usize,
            offset: offset as usize,
        });
    }
    let geometry = Geometry {
        hidden: spec.hidden,
        intermediate: spec.intermediate,
        n_heads: spec.n_heads,
        n_kv_heads: spec.n_kv_heads,
        head_dim: spec.head_dim,
        eps: spec.eps,
        attn_scale: spec.attn_scale,
        int8: match ActivationPrecision::from_code(spec.activations) {
            Some(ActivationPrecision::Exact) => None,
            Some(ActivationPrecision::Int8) => Some(Int8Tier::best()),
            None => {
                return Err(KernelError::Unsupported(format!(
                    "activation precision code {}",
                    spec.activations
                )))
            }
        },
    };
    let weights = LayerWeights {
        input_norm,
        post_norm,
        proj,
        qkv_bias,
        qk_norm,
    };
    decoder_layer(x, &weights, &geometry, &rope, &mut caches, out)
}
