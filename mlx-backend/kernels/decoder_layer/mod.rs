//! decoder_layer: one whole pre-norm decoder block for decode rows, as a
//! single MLX node:
//!
//! ```text
//! h   = x + o_proj(attention(rope(q), keys ⊕ rope(k), values ⊕ v))
//! out = h + down_proj(silu(gate_proj(norm2(h))) * up_proj(norm2(h)))
//! q, k, v = (q|k|v)_proj(norm1(x)) (+ bias), then per-head q/k RMSNorm
//! ```
//!
//! Contract: `x [B, 1, H]` float (one new token per row); RMSNorm weights
//! `[H]`; seven affine-quantized projections (q, k, v, o, gate, up, down)
//! of matching shapes; optional q/k/v biases (Qwen2) and per-head q/k norm
//! weights `[head_dim]` (Qwen3); RoPE as MLX's `fast::rope` (`dims` even,
//! ≤ head_dim; a base or explicit frequencies; YaRN's `mscale` on the
//! rotated features); per row `b` a KV cache `keys, values [1, H_kv,
//! capacity, head_dim]` in x's dtype and an `offset < capacity`. The row's
//! new key and value are written at `offset` and it attends to positions
//! `0..=offset`. Returns `out [B, 1, H]` and each row's updated cache
//! (same shape; the input buffer is reused when nothing else holds it,
//! so keep no other reference to a cache you pass in).
//!
//! Eligibility for the CPU kernel: a CPU stream; f32 x and caches; norms,
//! biases, scales and biases of the projections in one float dtype; 4 or
//! 8 bits. Otherwise the op builds the same block from MLX's ops
//! (`fast::rms_norm`, `quantized_matmul`, `fast::rope`, `slice_update`,
//! `fast::scaled_dot_product_attention`), which is also the graph the
//! Primitive's vjp/jvp/vmap differentiate.

pub(crate) mod attend;
mod bridge;
pub(crate) mod cpu;

pub use cpu::cache_copies;

use super::build::build;
use super::registry::{self, FallbackReason, Kernel};
use super::ActivationPrecision;
use super::{has_body, Backend, QuantSpec, WarmupSpec};
use crate::array::{list, unlist, Array};
use crate::dtype::Dtype;
use crate::error::OpError;
use crate::ffi;
use crate::ops::{stream, Quantized};

/// Most caches (keys and values arrays) one node takes: see
/// [`DecoderStack::forward`].
const MAX_NODE_CACHES: usize = 64;

/// Rotary embedding parameters, as `Array::rope` takes them.
#[derive(Clone, Copy)]
pub struct RopeSpec<'a> {
    /// Leading features of each head that are rotated.
    pub dims: i32,
    /// Interleaved pairs (llama.cpp's GGUF layout) rather than halves.
    pub traditional: bool,
    /// Ignored when `freqs` is given.
    pub base: f32,
    /// Position scale (1 / the linear RoPE factor).
    pub scale: f32,
    /// Multiplies the rotated features first (YaRN); 1 otherwise.
    pub mscale: f32,
    /// Explicit frequencies `[dims / 2]` (f32), e.g. llama3 or YaRN scaling.
    pub freqs: Option<&'a Array>,
}

/// One block's weights and geometry.
pub struct DecoderLayer<'a> {
    /// The attention RMSNorm weight.
    pub input_norm: &'a Array,
    /// The MLP RMSNorm weight.
    pub post_norm: &'a Array,
    /// Both norms' epsilon.
    pub eps: f32,
    /// q, k, v, o, gate, up, down.
    pub projections: [&'a Quantized; 7],
    /// Biases of q, k and v (Qwen2).
    pub qkv_bias: Option<[&'a Array; 3]>,
    /// Per-head RMSNorm weights of q and k (Qwen3).
    pub qk_norm: Option<[&'a Array; 2]>,
    /// Query heads.
    pub n_heads: i32,
    /// Key/value heads (GQA: divides `n_heads`).
    pub n_kv_heads: i32,
    /// Features per head.
    pub head_dim: i32,
    /// The attention scores' scale, usually `1 / sqrt(head_dim)`.
    pub attn_scale: f32,
    /// The rotary embedding of q and k.
    pub rope: RopeSpec<'a>,
    /// How the kernel's projections treat their input (see
    /// [`ActivationPrecision`]); no effect on the fallback graph.
    pub activations: ActivationPrecision,
}

impl DecoderLayer<'_> {
    /// The norm weights and q/k/v biases, which share one dtype.
    fn norm_params(&self) -> Vec<&Array> {
        let mut all = vec![self.input_norm, self.post_norm];
        all.extend(self.qkv_bias.iter().flatten());
        all.extend(self.qk_norm.iter().flatten());
        all
    }

    /// The projections' scales and biases, which share one dtype.
    fn quant_params(&self) -> Vec<&Array> {
        self.projections
            .iter()
            .flat_map(|p| [&p.scales, &p.biases])
            .collect()
    }

    /// The Primitive's parameter inputs, in the kernel's order.
    fn params(&self) -> Vec<&Array> {
        let mut all = vec![self.input_norm, self.post_norm];
        for p in self.projections {
            all.extend([&p.weight, &p.scales, &p.biases]);
        }
        all.extend(self.qkv_bias.iter().flatten());
        all.extend(self.qk_norm.iter().flatten());
        all.extend(self.rope.freqs);
        all
    }
}

/// Whether the current stream's kernel takes activations of `x_dtype`
/// (and caches of the same dtype) with these weights.
pub fn eligibility(x_dtype: Dtype, layer: &DecoderLayer) -> Result<(), FallbackReason> {
    weights_eligibility(layer)?;
    activation_eligibility(x_dtype, &[layer_dtypes(layer)], layer.head_dim)
}

/// A block's (or the head's) norm-group and scales dtypes, which the
/// activations must hold without widening on a GPU (see
/// [`activation_eligibility`]).
#[derive(Clone, Copy, Debug)]
struct ParamDtypes {
    norms: Dtype,
    scales: Dtype,
}

fn layer_dtypes(layer: &DecoderLayer) -> ParamDtypes {
    ParamDtypes {
        norms: layer.input_norm.dtype(),
        scales: layer.projections[0].scales.dtype(),
    }
}

/// The stream and x's side of [`eligibility`]. The CPU kernel takes f32
/// activations (any scales). The CUDA body takes f32, f16 or bf16 when the
/// unfused graph would keep that dtype throughout: f32 activations with
/// any parameters, half activations only with norms and scales of their
/// own dtype (f32 norms would widen every activation after the first norm).
fn activation_eligibility(
    x_dtype: Dtype,
    params: &[ParamDtypes],
    max_head_dim: i32,
) -> Result<(), FallbackReason> {
    let backend = Backend::current();
    if !has_body(Kernel::DecoderLayer, backend) {
        return Err(FallbackReason::NoKernelForDevice);
    }
    match backend {
        Backend::Cpu if x_dtype != Dtype::F32 => Err(FallbackReason::UnsupportedDtype),
        Backend::Cpu => Ok(()),
        _ if !matches!(x_dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) => {
            Err(FallbackReason::UnsupportedDtype)
        }
        _ if x_dtype != Dtype::F32
            && params
                .iter()
                .any(|p| p.norms != x_dtype || p.scales != x_dtype) =>
        {
            Err(FallbackReason::UnsupportedDtype)
        }
        _ if max_head_dim > super::CUDA_ATTENTION_MAX_HEAD_DIM => {
            Err(FallbackReason::UnsupportedShape)
        }
        _ => Ok(()),
    }
}

/// The weights' side of [`eligibility`].
fn weights_eligibility(layer: &DecoderLayer) -> Result<(), FallbackReason> {
    let float = |d: Dtype| matches!(d, Dtype::F32 | Dtype::F16 | Dtype::BF16);
    let shared = |all: Vec<&Array>| {
        let d = all[0].dtype();
        (float(d) && all.iter().all(|a| a.dtype() == d)).then_some(d)
    };
    // Norms and scales may differ (f32 norms with f16 scales: the GGUF
    // layout with f32 activations); within each group one dtype.
    if shared(layer.norm_params()).is_none()
        || shared(layer.quant_params()).is_none()
        || layer.rope.freqs.is_some_and(|f| f.dtype() != Dtype::F32)
    {
        return Err(FallbackReason::UnsupportedDtype);
    }
    // The kernel's bit widths and group sizes; gate and up run as one
    // fused pair and must share them.
    let [.., gate, up, _] = &layer.projections;
    if layer
        .projections
        .iter()
        .any(|p| !matches!(p.bits, 4 | 8) || !matches!(p.group_size, 32 | 64 | 128))
        || (gate.bits, gate.group_size) != (up.bits, up.group_size)
    {
        return Err(FallbackReason::UnsupportedQuantization);
    }
    Ok(())
}

/// Runs the block for `x [B, 1, H]`; `caches[b]` and `offsets[b]` are row
/// `b`'s keys, values and cached length. Returns `out [B, 1, H]` and the
/// updated `(keys, values)` of every row. (A stack of one block: a decode
/// loop that runs many blocks keeps a [`DecoderStack`].)
#[allow(clippy::type_complexity)]
pub fn decoder_layer(
    x: &Array,
    layer: &DecoderLayer,
    caches: &[(&Array, &Array)],
    offsets: &[i32],
) -> Result<(Array, Vec<(Array, Array)>), OpError> {
    DecoderStack::new(std::slice::from_ref(layer))?.forward(x, caches, offsets)
}

/// Decoder blocks prepared once for decode steps: each block's weights are
/// checked, evaluated and held by the stack, and a step runs consecutive
/// blocks as one MLX node whose only inputs are x and the caches (every
/// block in one node at batch 1; fewer per node as the batch grows, see
/// [`DecoderStack::forward`]). (With each block's
/// 24+ weight arrays as graph inputs and a node per block, building and
/// walking the graph took about a fifth of a small model's decode step on
/// CPU, before the first block could start.) The weights are constants of
/// the node: vjp/jvp/vmap (through the same blocks built from MLX's ops)
/// differentiate with respect to x and the caches only.
pub struct DecoderStack {
    inner: cxx::UniquePtr<ffi::DecoderStack>,
    /// The weights' eligibility for the CPU kernel (all blocks).
    weights: Result<(), FallbackReason>,
    /// Per block: `(n_kv_heads, head_dim)`, the shape of its caches.
    kv_shapes: Vec<(i32, i32)>,
    /// Per block, then the head's once set: the parameters' dtypes.
    param_dtypes: Vec<ParamDtypes>,
    /// The token embedding table's eligibility, once one is set.
    embedding: Option<Result<(), FallbackReason>>,
    /// The final norm and head's eligibility, once they are set.
    head: Option<Result<(), FallbackReason>>,
    /// Caches are written in their own buffers where they allow it (see
    /// [`DecoderStack::writing_caches_in_place`]).
    in_place: bool,
}

impl DecoderStack {
    /// Prepares `layers` (in order; block `l`'s output is block `l + 1`'s
    /// input): checks each block's contract and evaluates its weights.
    pub fn new(layers: &[DecoderLayer]) -> Result<DecoderStack, OpError> {
        let err = |m: String| OpError::new("decoder_layer", m);
        let first = layers
            .first()
            .ok_or_else(|| err("a stack needs one block or more".into()))?;
        let hidden = first.input_norm.dim(0)?;
        let mut inner = ffi::new_decoder_stack();
        let mut weights = Ok(());
        let mut kv_shapes = Vec::with_capacity(layers.len());
        let mut param_dtypes = Vec::with_capacity(layers.len() + 1);
        for (l, layer) in layers.iter().enumerate() {
            if layer.input_norm.dim(0)? != hidden {
                return Err(err(format!(
                    "block {l}: hidden size differs from block 0's"
                )));
            }
            let spec = ffi::DecoderLayerSpec {
                batch: 0,
                hidden: hidden.max(0) as usize,
                intermediate: layer.projections[4].weight.dim(0)?.max(0) as usize,
                n_heads: layer.n_heads.max(0) as usize,
                n_kv_heads: layer.n_kv_heads.max(0) as usize,
                head_dim: layer.head_dim.max(0) as usize,
                eps: layer.eps,
                attn_scale: layer.attn_scale,
                rope_dims: layer.rope.dims.max(0) as usize,
                rope_traditional: layer.rope.traditional,
                rope_base: layer.rope.base,
                rope_scale: layer.rope.scale,
                rope_mscale: layer.rope.mscale,
                has_freqs: layer.rope.freqs.is_some(),
                has_qkv_bias: layer.qkv_bias.is_some(),
                has_qk_norm: layer.qk_norm.is_some(),
                activations: layer.activations.code(),
                params_dtype: 0,
                norms_dtype: 0,
            };
            let quant: Vec<i32> = layer
                .projections
                .iter()
                .flat_map(|p| [p.bits, p.group_size])
                .collect();
            ffi::decoder_stack_push(inner.pin_mut(), &list(&layer.params()), &spec, &quant)
                .map_err(OpError::from_cxx("decoder_layer"))?;
            if weights.is_ok() {
                weights = weights_eligibility(layer);
            }
            kv_shapes.push((layer.n_kv_heads, layer.head_dim));
            param_dtypes.push(layer_dtypes(layer));
        }
        Ok(DecoderStack {
            inner,
            weights,
            kv_shapes,
            param_dtypes,
            embedding: None,
            head: None,
            in_place: false,
        })
    }

    /// Lets the fused node write each row's new key and value straight
    /// into the caches it is given, when every one of them allows it
    /// ([`DecoderStack::caches_writable_in_place`]): the node's only output
    /// is then `out`, all blocks of a step are one node at any batch size,
    /// and `forward` returns the given cache arrays themselves, which hold
    /// the new token once `out` has been evaluated. Only position `offset`
    /// of each row is written, which the caller has not counted as cached:
    /// a node that fails leaves every counted position as it was.
    ///
    /// Without it (or when a cache does not allow it, or on the fallback
    /// path) the node returns updated caches as new arrays, as MLX's ops
    /// do. For a caller that owns its caches and evaluates `out` with them
    /// each step, as the model's decode loop does: a node's outputs each
    /// get MLX's list of their siblings, so a node over 64+ caches cost
    /// milliseconds per step, and evaluating the caches themselves ~0.1 ms
    /// per node.
    pub fn writing_caches_in_place(mut self) -> DecoderStack {
        self.in_place = true;
        self
    }

    /// Whether the node may write `caches` in place: each evaluated,
    /// dense, row-contiguous, and holding its buffer alone (no view,
    /// slice or other cache shares it, so nothing else sees the write).
    pub fn caches_writable_in_place(caches: &[(&Array, &Array)]) -> bool {
        // On a GPU stream, MLX holds the buffers a finished evaluation
        // read until its completion handler runs, a little after the
        // results are ready: waiting for the stream (idle by now, so
        // cheap) lets them go, or every step would see its caches shared.
        if Backend::current() != Backend::Cpu && ffi::synchronize(stream()).is_err() {
            return false;
        }
        // One call per array and no list of them: at batch 16 a list of
        // the step's 960 caches took ~0.2 ms to build.
        let mut buffers = Vec::with_capacity(2 * caches.len());
        for (k, v) in caches {
            for c in [k, v] {
                match ffi::cache_buffer_in_place(c.inner()) {
                    0 => return false,
                    at => buffers.push(at),
                }
            }
        }
        buffers.sort_unstable();
        buffers.windows(2).all(|w| w[0] != w[1])
    }

    /// Ends the stack with the final RMSNorm (`norm [hidden]`, `eps`) and
    /// the quantized head `head` (`[vocab, hidden]`, x in `activations`'
    /// precision): the node that runs the last block then outputs f32
    /// logits `[B, 1, vocab]` instead of x, as the model's own head gives
    /// them (norm, then the quantized matmul on f32 x), without a norm and
    /// a matmul node of their own.
    pub fn with_head(
        mut self,
        norm: &Array,
        eps: f32,
        head: &Quantized,
        activations: ActivationPrecision,
    ) -> Result<DecoderStack, OpError> {
        ffi::decoder_stack_set_head(
            self.inner.pin_mut(),
            &list(&[norm, &head.weight, &head.scales, &head.biases]),
            eps,
            head.bits,
            head.group_size,
            activations.code(),
        )
        .map_err(OpError::from_cxx("decoder_layer"))?;
        let float = |d: Dtype| matches!(d, Dtype::F32 | Dtype::F16 | Dtype::BF16);
        self.param_dtypes.push(ParamDtypes {
            norms: norm.dtype(),
            scales: head.scales.dtype(),
        });
        self.head = Some(
            if !float(norm.dtype())
                || !float(head.scales.dtype())
                || head.biases.dtype() != head.scales.dtype()
            {
                Err(FallbackReason::UnsupportedDtype)
            } else if !matches!(head.bits, 4 | 8) || !matches!(head.group_size, 32 | 64 | 128) {
                Err(FallbackReason::UnsupportedQuantization)
            } else {
                Ok(())
            },
        );
        Ok(self)
    }

    /// Whether [`DecoderStack::with_head`] set a head: `forward` and
    /// `forward_tokens` then return logits.
    pub fn has_head(&self) -> bool {
        self.head.is_some()
    }

    /// Puts the lookup of token ids in the quantized table `table`
    /// (`[vocab, hidden]`) in front of the blocks, for
    /// [`DecoderStack::forward_tokens`]: rows as the model's own lookup
    /// gives them (taken, then dequantized in f32), one node instead of a
    /// take and dequantize per step.
    pub fn with_embedding(mut self, table: &Quantized) -> Result<DecoderStack, OpError> {
        ffi::decoder_stack_set_embedding(
            self.inner.pin_mut(),
            &list(&[&table.weight, &table.scales, &table.biases]),
            table.bits,
            table.group_size,
        )
        .map_err(OpError::from_cxx("decoder_layer"))?;
        let float = matches!(table.scales.dtype(), Dtype::F32 | Dtype::F16 | Dtype::BF16);
        self.embedding = Some(if !float || table.biases.dtype() != table.scales.dtype() {
            Err(FallbackReason::UnsupportedDtype)
        } else if !matches!(table.bits, 4 | 8) {
            Err(FallbackReason::UnsupportedQuantization)
        } else {
            Ok(())
        });
        Ok(self)
    }

    /// Whether [`DecoderStack::with_embedding`] set a table.
    pub fn has_embedding(&self) -> bool {
        self.embedding.is_some()
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.kv_shapes.len()
    }

    /// Always false: a stack has one block or more.
    pub fn is_empty(&self) -> bool {
        self.kv_shapes.is_empty()
    }

    /// Block `l`'s `(n_kv_heads, head_dim)`.
    pub fn kv_shape(&self, l: usize) -> Option<(i32, i32)> {
        self.kv_shapes.get(l).copied()
    }

    /// Whether the current stream's kernel takes activations of `x_dtype`
    /// with these weights (and head).
    pub fn eligibility(&self, x_dtype: Dtype) -> Result<(), FallbackReason> {
        self.weights?;
        let head_dim = self.kv_shapes.iter().map(|s| s.1).max().unwrap_or(0);
        activation_eligibility(x_dtype, &self.param_dtypes, head_dim)?;
        self.head.unwrap_or(Ok(()))
    }

    /// Runs every block for `x [B, 1, H]`. `caches` and `offsets` are
    /// block-major: entry `l * B + b` is row `b`'s keys and values in block
    /// `l` and its cached length. Returns `out [B, 1, H]` (f32 logits `[B,
    /// 1, vocab]` with a head) and the updated caches in the same order.
    /// The registry counts each node built (one per step at batch 1).
    #[allow(clippy::type_complexity)]
    pub fn forward(
        &self,
        x: &Array,
        caches: &[(&Array, &Array)],
        offsets: &[i32],
    ) -> Result<(Array, Vec<(Array, Array)>), OpError> {
        let shape = x.shape();
        let batch = match shape.as_slice() {
            [b, 1, _] => *b as usize,
            _ => {
                return Err(OpError::new(
                    "decoder_layer",
                    format!("x must be [B, 1, hidden], got {shape:?}"),
                ))
            }
        };
        let eligibility = self.eligibility(x.dtype());
        self.run(x, false, batch, eligibility, caches, offsets)
    }

    /// [`DecoderStack::forward`] from token ids `[B, 1]` (uint32 or int32)
    /// looked up in the table of [`DecoderStack::with_embedding`], in the
    /// first node.
    #[allow(clippy::type_complexity)]
    pub fn forward_tokens(
        &self,
        tokens: &Array,
        caches: &[(&Array, &Array)],
        offsets: &[i32],
    ) -> Result<(Array, Vec<(Array, Array)>), OpError> {
        let shape = tokens.shape();
        let batch = match (shape.as_slice(), tokens.dtype()) {
            ([b, 1], Dtype::U32 | Dtype::I32) => *b as usize,
            _ => {
                return Err(OpError::new(
                    "decoder_layer",
                    format!(
                        "token ids must be [B, 1] uint32 or int32, got {shape:?} {}",
                        tokens.dtype()
                    ),
                ))
            }
        };
        let Some(table) = self.embedding else {
            return Err(OpError::new(
                "decoder_layer",
                "token ids need an embedding table (DecoderStack::with_embedding)",
            ));
        };
        // The looked-up rows are f32.
        let eligibility = table.and_then(|()| self.eligibility(Dtype::F32));
        self.run(tokens, true, batch, eligibility, caches, offsets)
    }

    #[allow(clippy::type_complexity)]
    fn run(
        &self,
        input: &Array,
        tokens: bool,
        batch: usize,
        eligibility: Result<(), FallbackReason>,
        caches: &[(&Array, &Array)],
        offsets: &[i32],
    ) -> Result<(Array, Vec<(Array, Array)>), OpError> {
        let pairs = batch * self.len();
        if caches.len() != pairs || offsets.len() != pairs {
            return Err(OpError::new(
                "decoder_layer",
                format!(
                    "{batch} rows and {} blocks need {pairs} caches and offsets, got {} and {}",
                    self.len(),
                    caches.len(),
                    offsets.len()
                ),
            ));
        }
        // The blocks' activations: the looked-up rows are f32.
        let x_dtype = if tokens { Dtype::F32 } else { input.dtype() };
        let eligibility = eligibility.and_then(|()| {
            caches
                .iter()
                .all(|(k, v)| k.dtype() == x_dtype && v.dtype() == x_dtype)
                .then_some(())
                .ok_or(FallbackReason::UnsupportedDtype)
        });
        let in_place = self.in_place
            && registry::decide(Kernel::DecoderLayer, Backend::current(), eligibility).is_ok()
            && Self::caches_writable_in_place(caches);
        // Consecutive blocks share a node while it has at most
        // MAX_NODE_CACHES caches as outputs: MLX gives every output of a
        // node its own copy of the node's inputs, so one node over every
        // block of a batch-8 step (481 inputs and outputs) spent
        // milliseconds on them. In place, the node's one output is `out`.
        let per_node = if in_place {
            self.len()
        } else {
            (MAX_NODE_CACHES / (2 * batch).max(1)).max(1)
        };
        let mut h = input.clone();
        let mut updated = Vec::with_capacity(caches.len());
        for first in (0..self.len()).step_by(per_node) {
            let count = per_node.min(self.len() - first);
            let calls = first * batch..(first + count) * batch;
            let cache_list: Vec<&Array> = caches[calls.clone()]
                .iter()
                .flat_map(|(k, v)| [*k, *v])
                .collect();
            let (out, rows) = build(
                Kernel::DecoderLayer,
                |_| eligibility,
                |fused| {
                    let out = ffi::kernel_decoder_stack(
                        h.inner(),
                        tokens && first == 0,
                        &self.inner,
                        first,
                        count,
                        &list(&cache_list),
                        &offsets[calls.clone()],
                        fused,
                        fused && in_place,
                        stream(),
                    )
                    .map_err(OpError::from_cxx("decoder_layer"))?;
                    let mut arrays = unlist(&out).into_iter();
                    let out = arrays.next().expect("the op returns out first");
                    let mut rows = Vec::with_capacity(count * batch);
                    if fused && in_place {
                        rows.extend(
                            caches[calls]
                                .iter()
                                .map(|(k, v)| ((*k).clone(), (*v).clone())),
                        );
                    }
                    while let (Some(k), Some(v)) = (arrays.next(), arrays.next()) {
                        rows.push((k, v));
                    }
                    Ok((out, rows))
                },
            )?;
            h = out;
            updated.extend(rows);
        }
        Ok((h, updated))
    }
}

/// Warmup inputs: shape `[B, H, I, n_heads, n_kv_heads, head_dim]`.
pub(crate) fn warmup_specs(
    shapes: &[[i32; 6]],
    quant: QuantSpec,
    dtypes: &[Dtype],
) -> Vec<WarmupSpec> {
    let mut specs = Vec::new();
    for &dtype in dtypes {
        for shape in shapes {
            specs.push(WarmupSpec {
                kernel: Kernel::DecoderLayer,
                dtype,
                shape: shape.to_vec(),
                quant: Some(quant),
            });
        }
    }
    specs
}

/// A random block of `spec`'s shape over 8-position caches (offsets 3..).
pub(crate) fn run_warmup(spec: &WarmupSpec, key: &Array) -> Result<Vec<Array>, OpError> {
    let quant = spec.quant.unwrap_or(QuantSpec {
        bits: 4,
        group_size: 32,
    });
    let [b, h, i, nq, nkv, d] = spec.shape[..] else {
        return Err(OpError::new("decoder_layer", "warmup shape needs 6 dims"));
    };
    let normal = |shape: &[i32], scale: f32, dtype: Dtype| {
        crate::ops::random::normal(shape, dtype, 0.0, scale, Some(key))
    };
    let qz = |n: i32, k: i32| -> Result<Quantized, OpError> {
        crate::ops::quantize(
            &normal(&[n, k], 0.05, spec.dtype)?,
            quant.group_size,
            quant.bits,
        )
    };
    let projections = [
        qz(nq * d, h)?,
        qz(nkv * d, h)?,
        qz(nkv * d, h)?,
        qz(h, nq * d)?,
        qz(i, h)?,
        qz(i, h)?,
        qz(h, i)?,
    ];
    let norm = normal(&[h], 1.0, spec.dtype)?;
    let layer = DecoderLayer {
        input_norm: &norm,
        post_norm: &norm,
        eps: 1e-5,
        projections: projections.each_ref(),
        qkv_bias: None,
        qk_norm: None,
        n_heads: nq,
        n_kv_heads: nkv,
        head_dim: d,
        attn_scale: (d as f32).powf(-0.5),
        rope: RopeSpec {
            dims: d,
            traditional: false,
            base: 10000.0,
            scale: 1.0,
            mscale: 1.0,
            freqs: None,
        },
        activations: ActivationPrecision::Exact,
    };
    let x = normal(&[b, 1, h], 1.0, Dtype::F32)?;
    let cache: Vec<(Array, Array)> = (0..b)
        .map(|_| {
            Ok((
                normal(&[1, nkv, 8, d], 1.0, Dtype::F32)?,
                normal(&[1, nkv, 8, d], 1.0, Dtype::F32)?,
            ))
        })
        .collect::<Result<_, OpError>>()?;
    let refs: Vec<(&Array, &Array)> = cache.iter().map(|(k, v)| (k, v)).collect();
    let offsets: Vec<i32> = (0..b).map(|r| 3 + r % 4).collect();
    let (out, _) = decoder_layer(&x, &layer, &refs, &offsets)?;
    Ok(vec![out])
}
