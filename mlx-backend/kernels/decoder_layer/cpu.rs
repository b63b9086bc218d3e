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

use std::ops::Range;

use crate::dtype::Dtype;
use crate::ffi::{DecoderLayerSpec, StackHead, StackInput};
use crate::kernels::cpu::error::{check_len, KernelError};
use crate::kernels::cpu::layout::QuantMatrix;
use crate::kernels::cpu::simd::Element;
use crate::kernels::cpu::team::{self, SharedSlice};
use crate::kernels::cpu::{run_entry, with_float, FloatKind, XPrecision};
use crate::kernels::gate_qmv_silu_mul::cpu::gate_qmv_silu_mul_with;
use crate::kernels::quantized_matmul::cpu::{quantized_matmul_shared_x, quantized_matmul_with};
use crate::kernels::registry::Kernel;
use crate::kernels::rms_norm::cpu::rms_norm;

use super::attend::attend_heads;

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

    /// Rotates `x` for `position`, with the angles' sines and cosines from
    /// `angles`, recomputed only when the position changes: a row's heads
    /// share it (`sin_cos` per pair and head was half of the cache-append
    /// stage at batch 8).
    fn apply(&self, x: &mut [f32], position: usize, angles: &mut RopeAngles) {
        let dims = self.dims.min(x.len());
        if self.mscale != 1.0 {
            x[..dims].iter_mut().for_each(|v| *v *= self.mscale);
        }
        let half = dims / 2;
        if angles.position != Some(position) {
            let pos = self.scale * position as f32;
            angles.sin_cos.clear();
            angles.sin_cos.extend(
                self.inv_freqs
                    .iter()
                    .take(half)
                    .map(|inv| (pos * inv).sin_cos()),
            );
            angles.position = Some(position);
        }
        for (i, &(sin, cos)) in angles.sin_cos.iter().enumerate().take(half) {
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

/// [`Rope::apply`]'s sines and cosines for the last position it rotated.
#[derive(Default)]
struct RopeAngles {
    position: Option<usize>,
    sin_cos: Vec<(f32, f32)>,
}

/// One row's KV cache, `[heads, capacity, head_dim]`, valid up to `offset`
/// before this step.
pub struct RowCache<'a> {
    pub keys: &'a mut [f32],
    pub values: &'a mut [f32],
    pub capacity: usize,
    pub offset: usize,
}

/// The block's weights; `P` is the scales' element type, `N` the norms'
/// (and q/k/v biases').
pub struct LayerWeights<'a, P, N> {
    pub input_norm: &'a [N],
    pub post_norm: &'a [N],
    /// In [`PROJECTIONS`] order.
    pub proj: [QuantMatrix<'a, P>; 7],
    /// q, k, v biases (Qwen2).
    pub qkv_bias: Option<[&'a [N]; 3]>,
    /// Per-head q and k norm weights (Qwen3).
    pub qk_norm: Option<[&'a [N]; 2]>,
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
    /// How the projections compute with x (exact f32, int16 or int8).
    pub x_precision: XPrecision,
}

/// Column alignment of the members' shares of a projection.
const SHARE_ALIGN: usize = 8;

type Shared = SharedSlice<f32>;

/// Columns `cols` of `src [rows, k] · Wᵀ`, as `[rows][cols.len()]`.
fn project_cols<P: Element>(
    src: &[f32],
    m: &QuantMatrix<P>,
    rows: usize,
    k: usize,
    cols: &Range<usize>,
    xp: XPrecision,
) -> Result<Vec<f32>, KernelError> {
    let mut tmp = vec![0.0f32; rows * cols.len()];
    if !cols.is_empty() {
        let part = m.rows(k, cols.start, cols.len());
        quantized_matmul_with::<f32, P>(src, part, &mut tmp, rows, cols.len(), k, xp)?;
    }
    Ok(tmp)
}

/// Runs the block for `x [rows, hidden]` into `out [rows, hidden]`,
/// appending each row's key and value to `caches[row]`. The stages are
/// shared by the CPU team (see `kernels::cpu::team`): each member takes a
/// share of every projection's output columns, of the (row, kv head) cache
/// appends and of the (row, query head) attentions, with a barrier between
/// stages; the small per-row steps (norms, residuals) every member repeats.
pub(crate) fn decoder_layer<P: Element, N: Element>(
    x: &[f32],
    w: &LayerWeights<P, N>,
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
    if let Some([bq, bk, bv]) = &w.qkv_bias {
        check_len("q bias", bq.len(), Some(nq * d))?;
        check_len("k bias", bk.len(), Some(nkv * d))?;
        check_len("v bias", bv.len(), Some(nkv * d))?;
    }
    if let Some([qn, kn]) = &w.qk_norm {
        check_len("q_norm", qn.len(), Some(d))?;
        check_len("k_norm", kn.len(), Some(d))?;
    }
    let widen = |v: &[N]| -> Vec<f32> { v.iter().map(|x| x.to_f32()).collect() };
    let (norm1, norm2) = (widen(w.input_norm), widen(w.post_norm));
    let qk_norm = w.qk_norm.map(|[a, b]| [widen(a), widen(b)]);
    let bias = w.qkv_bias.map(|[a, b, c]| [widen(a), widen(b), widen(c)]);
    let norm = |src: &[f32], weight: &[f32], n: usize, dim: usize| {
        let mut dst = vec![0.0f32; n * dim];
        rms_norm::<f32>(src, dim, weight, 1, &mut dst, n, dim, g.eps).map(|_| dst)
    };
    let [wq, wk, wv, wo, wg, wu, wd] = &w.proj;
    let inter = g.intermediate;

    let (mut q, mut k, mut v) = (
        vec![0.0f32; rows * nq * d],
        vec![0.0f32; rows * nkv * d],
        vec![0.0f32; rows * nkv * d],
    );
    let (mut attn, mut o, mut act) = (
        vec![0.0f32; rows * nq * d],
        vec![0.0f32; rows * h],
        vec![0.0f32; rows * inter],
    );
    let (q, k, v) = (
        Shared::new(&mut q),
        Shared::new(&mut k),
        Shared::new(&mut v),
    );
    let (attn, o, act) = (
        Shared::new(&mut attn),
        Shared::new(&mut o),
        Shared::new(&mut act),
    );
    let out = Shared::new(out);
    let kv: Vec<(Shared, Shared, usize, usize)> = caches
        .iter_mut()
        .map(|c| {
            (
                Shared::new(c.keys),
                Shared::new(c.values),
                c.capacity,
                c.offset,
            )
        })
        .collect();

    team::run(|m| {
        // SAFETY (every `part`/`all` below): each stage writes only this
        // member's share (`m.share`) of a buffer, and buffers are read whole
        // only after the barrier that ends the stage writing them.

        // The attention stage reads this member's cache rows from memory
        // (the weights streamed through the caches since the last step):
        // the projections' kernel (`row_lanes`, 4+ rows) prefetches them a
        // few lines at a time meanwhile.
        let units = AttentionUnits::new(rows, nq, nkv, m.size);
        let mut heads: Vec<(usize, usize)> = m
            .share(units.count(), 1)
            .map(|unit| {
                let (r, kh, _) = units.unit(unit);
                (r, kh)
            })
            .collect();
        heads.dedup();
        let regions: Vec<(*const u8, usize)> = heads
            .into_iter()
            .flat_map(|(r, kh)| {
                let (keys, values, capacity, pos) = &kv[r];
                let (at, len) = (kh * capacity * d, (pos + 1) * d);
                [keys, values].map(|c| (c.as_ptr().wrapping_add(at).cast(), len * 4))
            })
            .collect();
        crate::kernels::cpu::row_lanes::prefetch_in_background(regions);

        // q, k, v projections of norm1(x).
        let xn = norm(x, &norm1, rows, h)?;
        let targets = [(&q, wq, nq * d), (&k, wk, nkv * d), (&v, wv, nkv * d)];
        let shares = targets.map(|(_, _, n)| m.share(n, SHARE_ALIGN));
        let mut tmps = shares.clone().map(|cols| vec![0.0f32; rows * cols.len()]);
        let mut parts: Vec<_> = targets
            .iter()
            .zip(&shares)
            .zip(tmps.iter_mut())
            .filter(|((_, cols), _)| !cols.is_empty())
            .map(|(((_, mat, _), cols), tmp)| {
                (
                    mat.rows(h, cols.start, cols.len()),
                    tmp.as_mut_slice(),
                    cols.len(),
                )
            })
            .collect();
        quantized_matmul_shared_x(&xn, &mut parts, rows, h, g.x_precision)?;
        for (((buf, _, n), cols), tmp) in targets.iter().zip(&shares).zip(&tmps) {
            unsafe { buf.write_cols(tmp, *n, cols) };
        }
        m.barrier()?;

        // Keys and values of this step: bias, k norm, rope, cache append.
        let (qa, ka, va) = unsafe { (q.all(), k.all(), v.all()) };
        let mut key = vec![0.0f32; d];
        let mut angles = RopeAngles::default();
        for unit in m.share(rows * nkv, 1) {
            let (r, kh) = (unit / nkv, unit % nkv);
            let (keys, values, capacity, pos) = &kv[r];
            let (capacity, pos) = (*capacity, *pos);
            key.copy_from_slice(&ka[unit * d..][..d]);
            let at = (kh * capacity + pos) * d;
            let value = unsafe { values.part(at, d) };
            value.copy_from_slice(&va[unit * d..][..d]);
            if let Some([_, bk, bv]) = &bias {
                key.iter_mut().zip(&bk[kh * d..]).for_each(|(a, b)| *a += b);
                value
                    .iter_mut()
                    .zip(&bv[kh * d..])
                    .for_each(|(a, b)| *a += b);
            }
            if let Some([_, kn]) = &qk_norm {
                key = norm(&key, kn, 1, d)?;
            }
            rope.apply(&mut key, pos, &mut angles);
            unsafe { keys.part(at, d) }.copy_from_slice(&key);
        }
        crate::kernels::cpu::row_lanes::stop_background_prefetch();
        m.barrier()?;

        // Attention of each (row, kv head, group of its query heads).
        let (mut query, mut scores) = (Vec::new(), Vec::new());
        for unit in m.share(units.count(), 1) {
            let (r, kh, qheads) = units.unit(unit);
            let (keys, values, capacity, pos) = &kv[r];
            let (capacity, pos) = (*capacity, *pos);
            let first = r * nq + qheads.start;
            query.clear();
            query.extend_from_slice(&qa[first * d..][..qheads.len() * d]);
            for (qh, head) in qheads.clone().zip(query.chunks_exact_mut(d)) {
                if let Some([bq, _, _]) = &bias {
                    head.iter_mut()
                        .zip(&bq[qh * d..])
                        .for_each(|(a, b)| *a += b);
                }
                if let Some([qn, _]) = &qk_norm {
                    let normed = norm(head, qn, 1, d)?;
                    head.copy_from_slice(&normed);
                }
                rope.apply(head, pos, &mut angles);
            }
            let base = kh * capacity * d;
            let len = (pos + 1) * d;
            let (keys, values) = unsafe { (keys.all(), values.all()) };
            attend_heads(
                &query,
                &keys[base..][..len],
                &values[base..][..len],
                d,
                g.attn_scale,
                &mut scores,
                unsafe { attn.part(first * d, qheads.len() * d) },
            );
        }
        m.barrier()?;

        // o projection.
        let cols = m.share(h, SHARE_ALIGN);
        let tmp = project_cols(
            unsafe { attn.all() },
            wo,
            rows,
            nq * d,
            &cols,
            g.x_precision,
        )?;
        unsafe { o.write_cols(&tmp, h, &cols) };
        m.barrier()?;

        // Residual, norm2, gate/up SwiGLU.
        let hres: Vec<f32> = x
            .iter()
            .zip(unsafe { o.all() })
            .map(|(a, b)| a + b)
            .collect();
        let hn = norm(&hres, &norm2, rows, h)?;
        let cols = m.share(inter, SHARE_ALIGN);
        if !cols.is_empty() {
            let mut tmp = vec![0.0f32; rows * cols.len()];
            gate_qmv_silu_mul_with::<f32, P>(
                &hn,
                wg.rows(h, cols.start, cols.len()),
                wu.rows(h, cols.start, cols.len()),
                &mut tmp,
                rows,
                cols.len(),
                h,
                g.x_precision,
            )?;
            unsafe { act.write_cols(&tmp, inter, &cols) };
        }
        m.barrier()?;

        // down projection + residual, straight into `out`.
        let cols = m.share(h, SHARE_ALIGN);
        let mut tmp = project_cols(unsafe { act.all() }, wd, rows, inter, &cols, g.x_precision)?;
        let width = cols.len();
        if width > 0 {
            for (r, part) in tmp.chunks_exact_mut(width).enumerate() {
                let res = &hres[r * h + cols.start..][..width];
                part.iter_mut().zip(res).for_each(|(a, b)| *a += b);
            }
            unsafe { out.write_cols(&tmp, h, &cols) };
        }
        Ok(())
    })
}

/// The attention stage's units of work: (row, kv head, a group of that
/// head's query heads). A unit's query heads read its keys and values
/// once; the groups are split only as far as needed to give every member
/// two units or more (batch 1 has just `n_kv_heads` whole groups).
struct AttentionUnits {
    rows: usize,
    nkv: usize,
    group: usize,
    parts: usize,
}

impl AttentionUnits {
    fn new(rows: usize, nq: usize, nkv: usize, members: usize) -> Self {
        let group = nq / nkv;
        let parts = (1..=group)
            .find(|p| rows * nkv * p >= 2 * members)
            .unwrap_or(group);
        AttentionUnits {
            rows,
            nkv,
            group,
            parts,
        }
    }

    fn count(&self) -> usize {
        self.rows * self.nkv * self.parts
    }

    /// Unit `u`'s row, kv head and query heads (indices within the row).
    fn unit(&self, u: usize) -> (usize, usize, Range<usize>) {
        let (r, rest) = (u / (self.nkv * self.parts), u % (self.nkv * self.parts));
        let (kh, part) = (rest / self.parts, rest % self.parts);
        let heads = crate::kernels::cpu::team::split(self.group, self.parts, part, 1);
        (
            r,
            kh,
            kh * self.group + heads.start..kh * self.group + heads.end,
        )
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

/// Entry point from C++ (`DecoderStackPrimitive`): block `l` reads the
/// previous block's output (block 0 reads `x`), the last writes `out`.
/// `params` holds each block's `param_counts[l]` buffers in turn: input
/// norm, post norm, `[w, scales, biases]` of each projection in
/// [`PROJECTIONS`] order, then the optional q/k/v biases, q/k norms and
/// rope frequencies. `outputs`: out, then keys and values per block and
/// row (already holding the cached positions; `copied_caches` of them had
/// to be copied rather than reused). `quant` is `(bits, group_size)` per
/// projection and block; `offsets`/`capacities` per block and row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decoder_stack_cpu(
    input: &StackInput,
    embedding: &[usize],
    head: &StackHead,
    head_params: &[usize],
    specs: &[DecoderLayerSpec],
    copied_caches: usize,
    quant: &[i32],
    offsets: &[i32],
    capacities: &[i32],
    x: &[usize],
    params: &[usize],
    param_counts: &[usize],
    outputs: &[usize],
) -> bool {
    CACHE_COPIES.fetch_add(copied_caches as u64, Ordering::Relaxed);
    run_entry(Kernel::DecoderLayer, || {
        let layers = specs.len();
        let Some(first) = specs.first() else {
            return Err(KernelError::Shape("the stack has no blocks".into()));
        };
        let (batch, hidden) = (first.batch, first.hidden);
        if specs.iter().any(|s| s.batch != batch || s.hidden != hidden) {
            return Err(KernelError::Shape(
                "the blocks differ in batch or hidden size".into(),
            ));
        }
        let per_call = layers.checked_mul(batch);
        check_len(
            "quant",
            quant.len(),
            layers.checked_mul(2 * PROJECTIONS.len()),
        )?;
        check_len("offsets", offsets.len(), per_call)?;
        check_len("capacities", capacities.len(), per_call)?;
        check_len("param_counts", param_counts.len(), Some(layers))?;
        let mut first = Buffers { table: x, next: 0 };
        // Looked-up rows of token ids, when the node starts from them.
        let rows_of_tokens;
        let x = if input.tokens {
            let ids: Vec<u32> = match Dtype::from_code(input.tokens_dtype) {
                Some(Dtype::U32) => first.typed::<u32>("tokens")?.to_vec(),
                Some(Dtype::I32) => first
                    .typed::<i32>("tokens")?
                    .iter()
                    .map(|&t| u32::try_from(t).unwrap_or(u32::MAX))
                    .collect(),
                other => return Err(KernelError::Unsupported(format!("token ids of {other:?}"))),
            };
            check_len("tokens", ids.len(), Some(batch))?;
            let pk = FloatKind::from_code(input.params_dtype)?;
            rows_of_tokens = with_float!(pk, P => embed_rows::<P>(input, embedding, &ids, hidden))?;
            rows_of_tokens.as_slice()
        } else {
            first.typed::<f32>("x")?
        };
        let mut outs = Buffers {
            table: outputs,
            next: 0,
        };
        let out = outs.typed_mut::<f32>("out")?;
        // Block outputs between blocks: `carry` holds block l - 1's (and,
        // with a head, the last block's).
        let rows = batch * hidden;
        let (mut carry, mut next) = if layers > 1 || head.head {
            (vec![0.0f32; rows], vec![0.0f32; rows])
        } else {
            (Vec::new(), Vec::new())
        };
        let mut table = params;
        for (l, spec) in specs.iter().enumerate() {
            let count = param_counts[l];
            let (own, rest) = table.split_at_checked(2 * count).ok_or_else(|| {
                KernelError::Shape(format!("block {l}: parameter table too short"))
            })?;
            table = rest;
            let calls = l * batch..(l + 1) * batch;
            let block = Block {
                spec,
                quant: &quant[l * 2 * PROJECTIONS.len()..][..2 * PROJECTIONS.len()],
                offsets: &offsets[calls.clone()],
                capacities: &capacities[calls],
                params: own,
            };
            let src: &[f32] = if l == 0 { x } else { &carry };
            let dst: &mut [f32] = if l + 1 == layers && !head.head {
                &mut *out
            } else {
                &mut next
            };
            let pk = FloatKind::from_code(spec.params_dtype)?;
            let nk = FloatKind::from_code(spec.norms_dtype)?;
            with_float!(pk, P => with_float!(nk, N =>
                run_block::<P, N>(&block, &mut outs, src, dst)))?;
            std::mem::swap(&mut carry, &mut next);
        }
        if head.head {
            let pk = FloatKind::from_code(head.params_dtype)?;
            let nk = FloatKind::from_code(head.norm_dtype)?;
            with_float!(pk, P => with_float!(nk, N =>
                run_head::<P, N>(head, head_params, &carry, batch, hidden, out)))?;
        }
        Ok(())
    })
}

/// The final RMSNorm of rows `h [batch, hidden]` and the quantized head
/// (`params`: norm, w, scales, biases), f32 logits into `out [batch,
/// vocab]`: the model's head, with the head's activation precision.
fn run_head<P: Element, N: Element>(
    head: &StackHead,
    params: &[usize],
    h: &[f32],
    batch: usize,
    hidden: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let mut table = Buffers {
        table: params,
        next: 0,
    };
    let norm: Vec<f32> = table
        .typed::<N>("final norm")?
        .iter()
        .map(|v| v.to_f32())
        .collect();
    check_len("final norm", norm.len(), Some(hidden))?;
    let (bits, group) = (head.bits, head.group_size);
    if bits <= 0 || group <= 0 {
        return Err(KernelError::Unsupported(format!(
            "head: bits {bits}, group_size {group}"
        )));
    }
    let w = QuantMatrix {
        w: table.typed::<u32>("head")?,
        scales: table.typed::<P>("head scales")?,
        biases: table.typed::<P>("head biases")?,
        bits: bits as u32,
        group_size: group as usize,
    };
    let vocab = usize::try_from(head.vocab).unwrap_or(0);
    let mut xn = vec![0.0f32; batch * hidden];
    rms_norm::<f32>(h, hidden, &norm, 1, &mut xn, batch, hidden, head.eps)?;
    // Off the team: the matmul splits the head's rows over it.
    quantized_matmul_with::<f32, P>(
        &xn,
        w,
        out,
        batch,
        vocab,
        hidden,
        XPrecision::from_code(head.activations)?,
    )
}

/// The rows of `ids` in the quantized table `embedding` (w, scales,
/// biases of `[vocab, hidden]`), in f32 and natural order: MLX's
/// dequantize of the taken rows (`scale · q + bias`, the scales widened to
/// f32 first).
fn embed_rows<P: Element>(
    input: &StackInput,
    embedding: &[usize],
    ids: &[u32],
    hidden: usize,
) -> Result<Vec<f32>, KernelError> {
    let (bits, group) = (input.bits, input.group_size);
    if !matches!(bits, 2 | 4 | 8) || group <= 0 || !hidden.is_multiple_of(group as usize) {
        return Err(KernelError::Unsupported(format!(
            "embedding: bits {bits}, group_size {group}, hidden {hidden}"
        )));
    }
    let (bits, group) = (bits as usize, group as usize);
    let vocab = usize::try_from(input.vocab).unwrap_or(0);
    let mut table = Buffers {
        table: embedding,
        next: 0,
    };
    let w = table.typed::<u32>("embedding")?;
    let scales = table.typed::<P>("embedding scales")?;
    let biases = table.typed::<P>("embedding biases")?;
    let (words, groups) = (hidden * bits / 32, hidden / group);
    check_len("embedding", w.len(), vocab.checked_mul(words))?;
    check_len("embedding scales", scales.len(), vocab.checked_mul(groups))?;
    check_len("embedding biases", biases.len(), vocab.checked_mul(groups))?;
    let (per_word, mask) = (32 / bits, (1u32 << bits) - 1);
    let mut out = vec![0.0f32; ids.len() * hidden];
    for (row, &id) in out.chunks_exact_mut(hidden).zip(ids) {
        let t = id as usize;
        if t >= vocab {
            return Err(KernelError::Shape(format!(
                "token id {id} is outside the vocabulary of {vocab}"
            )));
        }
        let (w, s, b) = (
            &w[t * words..][..words],
            &scales[t * groups..][..groups],
            &biases[t * groups..][..groups],
        );
        for (i, v) in row.iter_mut().enumerate() {
            let q = (w[i / per_word] >> (bits * (i % per_word))) & mask;
            let g = i / group;
            *v = s[g].to_f32() * q as f32 + b[g].to_f32();
        }
    }
    Ok(out)
}

/// One block's part of [`decoder_stack_cpu`]'s arguments.
struct Block<'a> {
    spec: &'a DecoderLayerSpec,
    quant: &'a [i32],
    offsets: &'a [i32],
    capacities: &'a [i32],
    params: &'a [usize],
}

/// Runs one block of the stack from `x` into `out`, taking its caches
/// from `outs`.
fn run_block<P: Element, N: Element>(
    block: &Block,
    outs: &mut Buffers,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let Block {
        spec,
        quant,
        offsets,
        capacities,
        params,
    } = *block;
    let mut ins = Buffers {
        table: params,
        next: 0,
    };
    let input_norm = ins.typed::<N>("input_norm")?;
    let post_norm = ins.typed::<N>("post_norm")?;
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
            ins.typed::<N>("q_bias")?,
            ins.typed("k_bias")?,
            ins.typed("v_bias")?,
        ])
    } else {
        None
    };
    let qk_norm = if spec.has_qk_norm {
        Some([ins.typed::<N>("q_norm")?, ins.typed("k_norm")?])
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
        x_precision: XPrecision::from_code(spec.activations)?,
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
