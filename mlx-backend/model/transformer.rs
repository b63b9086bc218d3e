//! The decoder stack every family shares: embeddings, pre-norm blocks
//! (attention + dense MLP or sparse MoE), final norm, lm_head (tied or not).

use super::config::ModelConfig;
use super::error::{ForwardError, ModelLoadError};
use super::kv_cache::LayerKvCache;
use super::layers::{
    fused_decoder_layer, Attention, Embedding, Linear, Mlp, RaggedBatch, RmsNorm, SparseMoe,
};
use super::weights::Weights;
use crate::kernels::{registry, DecoderLayer, DecoderStack, Kernel};
use crate::ops::AttentionMask;
use crate::{Array, OpError};

/// The feed-forward half of a block.
pub enum FeedForward {
    Dense(Mlp),
    Sparse(Box<SparseMoe>),
}

impl FeedForward {
    fn forward(&self, x: &Array) -> Result<Array, OpError> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Sparse(m) => m.forward(x),
        }
    }
}

pub struct Block {
    input_layernorm: RmsNorm,
    attention: Attention,
    post_attention_layernorm: RmsNorm,
    feed_forward: FeedForward,
}

impl Block {
    fn forward(
        &self,
        x: &Array,
        cache: &mut LayerKvCache,
        mask: AttentionMask<'_>,
    ) -> Result<Array, OpError> {
        let h = x.add(&self.attention.forward(
            &self.input_layernorm.forward(x)?,
            cache,
            mask,
        )?)?;
        self.feed_forward_residual(&h)
    }

    fn forward_ragged(
        &self,
        x: &Array,
        caches: &mut [&mut LayerKvCache],
        ragged: &RaggedBatch,
    ) -> Result<Array, OpError> {
        let h = x.add(&self.attention.forward_ragged(
            &self.input_layernorm.forward(x)?,
            caches,
            ragged,
        )?)?;
        self.feed_forward_residual(&h)
    }

    /// This block as one fused decode node, when its weights allow it.
    fn fused(&self) -> Option<DecoderLayer<'_>> {
        match &self.feed_forward {
            FeedForward::Dense(mlp) => fused_decoder_layer(
                &self.input_layernorm,
                &self.attention,
                &self.post_attention_layernorm,
                mlp,
            ),
            FeedForward::Sparse(_) => None,
        }
    }

    fn feed_forward_residual(&self, h: &Array) -> Result<Array, OpError> {
        h.add(
            &self
                .feed_forward
                .forward(&self.post_attention_layernorm.forward(h)?)?,
        )
    }
}

/// Which positions get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Every position: `[B, L, V]`.
    All,
    /// Only the last position of each row: `[B, 1, V]` (what sampling needs).
    Last,
}

/// A decoder-only transformer in mlx-lm's layout.
pub struct Transformer {
    /// The hyperparameters.
    pub config: ModelConfig,
    embed_tokens: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    /// The blocks as one fused decode node (see [`Transformer::decoder_stack`]).
    decoder_stack: std::cell::OnceCell<Option<DecoderStack>>,
}

impl Transformer {
    /// Build from HF-named weights; `feed_forward(i)` picks each block's MLP.
    pub(crate) fn load(
        config: ModelConfig,
        w: &Weights,
        feed_forward: impl Fn(&Weights, &str, usize) -> Result<FeedForward, ModelLoadError>,
    ) -> Result<Transformer, ModelLoadError> {
        let c = &config;
        let embed_tokens = Embedding::load(w, "model.embed_tokens", c.vocab_size, c.hidden_size)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            layers.push(Block {
                input_layernorm: RmsNorm::load(
                    w,
                    &format!("{p}.input_layernorm.weight"),
                    c.hidden_size,
                    c.rms_norm_eps,
                )?,
                attention: Attention::load(w, &format!("{p}.self_attn"), c)?,
                post_attention_layernorm: RmsNorm::load(
                    w,
                    &format!("{p}.post_attention_layernorm.weight"),
                    c.hidden_size,
                    c.rms_norm_eps,
                )?,
                feed_forward: feed_forward(w, &format!("{p}.mlp"), i)?,
            });
        }
        let norm = RmsNorm::load(w, "model.norm.weight", c.hidden_size, c.rms_norm_eps)?;
        // Tied: the embeddings are the head, and a stored `lm_head.weight`
        // is ignored (mlx-lm's sanitize drops it; HF ties over it).
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(Linear::load(
                w,
                "lm_head",
                c.hidden_size,
                c.vocab_size,
                false,
            )?)
        };
        Ok(Transformer {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            decoder_stack: std::cell::OnceCell::new(),
        })
    }

    /// Decoder blocks (one KV cache each).
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The dtype activations flow in (that of the embedding's values).
    pub fn dtype(&self) -> crate::Dtype {
        self.embed_tokens.dtype()
    }

    /// One forward pass: `tokens [B, L]` (int32/uint32) at the caches'
    /// current offset (equal across the batch); appends to the caches and
    /// returns float32 logits.
    pub fn forward(
        &self,
        tokens: &Array,
        caches: &mut [LayerKvCache],
        logits: Logits,
    ) -> Result<Array, ForwardError> {
        let shape = tokens.shape();
        if shape.len() != 2 || tokens.dtype().is_float() {
            return Err(ForwardError::BadTokens(shape));
        }
        if caches.len() != self.layers.len() {
            return Err(ForwardError::CacheCount {
                expected: self.layers.len(),
                got: caches.len(),
            });
        }
        let l = shape[1];
        let mask = if l > 1 {
            AttentionMask::Causal
        } else {
            AttentionMask::None
        };
        if l == 1 && shape[0] == 1 {
            if let Some(out) = self.fused_decode(tokens, &mut [&mut *caches])? {
                return Ok(out);
            }
        }
        let mut h = self.embed_tokens.forward(tokens)?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            h = layer.forward(&h, cache, mask)?;
        }
        if logits == Logits::Last && l > 1 {
            h = h.slice_axis(1, l - 1, l)?;
        }
        self.head(&h)
    }

    /// One decode step for `B` requests with caches of different lengths:
    /// `tokens [B, 1]`, `caches[b]` the per-layer caches of row `b`. Returns
    /// float32 logits `[B, 1, V]`; equals running each row alone.
    pub fn forward_decode_batch(
        &self,
        tokens: &Array,
        caches: &mut [&mut [LayerKvCache]],
    ) -> Result<Array, ForwardError> {
        let shape = tokens.shape();
        if shape.len() != 2
            || shape[1] != 1
            || shape[0] as usize != caches.len()
            || tokens.dtype().is_float()
        {
            return Err(ForwardError::BadTokens(shape));
        }
        if let Some(c) = caches.iter().find(|c| c.len() != self.layers.len()) {
            return Err(ForwardError::CacheCount {
                expected: self.layers.len(),
                got: c.len(),
            });
        }
        let lengths: Vec<i32> = caches
            .iter()
            .map(|c| c.first().map_or(0, |l| l.offset()))
            .collect();
        if let Some(out) = self.fused_decode(tokens, caches)? {
            return Ok(out);
        }
        let mut h = self.embed_tokens.forward(tokens)?;
        let ragged = RaggedBatch::new(&lengths)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let mut layer_caches: Vec<&mut LayerKvCache> =
                caches.iter_mut().map(|c| &mut c[i]).collect();
            h = layer.forward_ragged(&h, &mut layer_caches, &ragged)?;
        }
        self.head(&h)
    }

    /// The blocks prepared as one fused decode node, built on first use;
    /// `None` when a block cannot fuse (e.g. a MoE block).
    fn decoder_stack(&self) -> Result<Option<&DecoderStack>, OpError> {
        if let Some(stack) = self.decoder_stack.get() {
            return Ok(stack.as_ref());
        }
        let layers: Option<Vec<DecoderLayer<'_>>> = self.layers.iter().map(Block::fused).collect();
        let stack = match layers {
            Some(layers) => {
                // The caches are this model's own (LayerKvCache), evaluated
                // with the logits every step.
                let stack = DecoderStack::new(&layers)?.writing_caches_in_place();
                // The lookup goes into the first node where the kernel
                // takes the table and the rows are f32 (as the model's own
                // lookup gives them).
                let stack = match &self.embed_tokens {
                    Embedding::Quantized(q, _, crate::Dtype::F32) if matches!(q.bits, 4 | 8) => {
                        stack.with_embedding(q)?
                    }
                    _ => stack,
                };
                // And the final norm and head go into the last node when the
                // head is quantized (tied or not) and the kernel takes it.
                let head = match (&self.lm_head, &self.embed_tokens) {
                    (None, Embedding::Quantized(q, activations, _)) => Some((q, *activations)),
                    (
                        Some(Linear::Quantized {
                            q,
                            bias: None,
                            activations,
                        }),
                        _,
                    ) => Some((q, *activations)),
                    _ => None,
                };
                let head = head.filter(|(q, _)| {
                    matches!(q.bits, 4 | 8) && matches!(q.group_size, 32 | 64 | 128)
                });
                Some(match head {
                    Some((q, activations)) => {
                        stack.with_head(&self.norm.weight, self.norm.eps, q, activations)?
                    }
                    None => stack,
                })
            }
            None => None,
        };
        Ok(self.decoder_stack.get_or_init(|| stack).as_ref())
    }

    /// One decode step through the fused blocks (see [`DecoderStack`]),
    /// from `tokens [B, 1]` (row `b` owning `rows[b]`); `None` when the
    /// kernel is off or the blocks, activations or caches do not qualify,
    /// and the blocks must run op by op.
    fn fused_decode(
        &self,
        tokens: &Array,
        rows: &mut [&mut [LayerKvCache]],
    ) -> Result<Option<Array>, ForwardError> {
        if !registry::is_fused_on(Kernel::DecoderLayer, registry::Backend::current()) {
            return Ok(None);
        }
        let Some(stack) = self.decoder_stack()? else {
            return Ok(None);
        };
        let single_row = rows
            .iter()
            .all(|r| r.iter().all(|c| c.batch().is_none_or(|b| b == 1)));
        if !single_row || stack.eligibility(self.dtype()).is_err() {
            return Ok(None);
        }
        let ids = matches!(tokens.dtype(), crate::Dtype::U32 | crate::Dtype::I32);
        let out = if stack.has_embedding() && ids {
            fused_steps(StackStart::Tokens(tokens), self.dtype(), stack, rows)?
        } else {
            let h = self.embed_tokens.forward(tokens)?;
            fused_steps(StackStart::Rows(&h), self.dtype(), stack, rows)?
        };
        if stack.has_head() {
            return Ok(Some(out));
        }
        self.head(&out).map(Some)
    }

    fn head(&self, h: &Array) -> Result<Array, ForwardError> {
        let h = self.norm.forward(h)?;
        let out = match &self.lm_head {
            Some(head) => head.forward_logits(&h)?,
            None => self.embed_tokens.as_linear(&h)?,
        };
        Ok(out.astype(crate::Dtype::F32)?)
    }

    /// The shapes and dtype the fused kernels see, for `kernels::warmup_for_model`.
    pub fn kernel_dims(&self) -> crate::kernels::ModelDims {
        let c = &self.config;
        let quant = self.layers.iter().find_map(|l| match &l.feed_forward {
            FeedForward::Dense(m) => m.quantization(),
            FeedForward::Sparse(_) => None,
        });
        crate::kernels::ModelDims {
            hidden_size: c.hidden_size as i32,
            intermediate_size: c.intermediate_size as i32,
            dtype: self.dtype(),
            quant,
            moe: c.moe.as_ref().map(|m| crate::kernels::MoeDims {
                num_experts: m.num_experts as i32,
                top_k: m.num_experts_per_tok as i32,
                intermediate_size: m.moe_intermediate_size as i32,
            }),
            attention: Some(crate::kernels::AttentionDims {
                n_heads: c.num_attention_heads as i32,
                n_kv_heads: c.num_key_value_heads as i32,
                head_dim: c.head_dim as i32,
            }),
        }
    }

    /// Fresh caches, one per layer.
    pub fn new_caches(&self, step: i32) -> Vec<LayerKvCache> {
        (0..self.layers.len())
            .map(|_| LayerKvCache::new(step))
            .collect()
    }
}

/// What the fused blocks start from.
enum StackStart<'a> {
    /// The embedded rows `[B, 1, H]`.
    Rows(&'a Array),
    /// Token ids `[B, 1]`, looked up in the stack's table.
    Tokens(&'a Array),
}

/// Runs the blocks as fused nodes over every row's caches (of `dtype`, the
/// activations'). On an error each cache gets its arrays back unchanged.
fn fused_steps(
    start: StackStart,
    dtype: crate::Dtype,
    stack: &DecoderStack,
    rows: &mut [&mut [LayerKvCache]],
) -> Result<Array, OpError> {
    let restore = |rows: &mut [&mut [LayerKvCache]], taken: Vec<(Array, Array, i32)>| {
        for (i, (k, v, _)) in taken.into_iter().enumerate() {
            rows[i % rows.len()][i / rows.len()].restore(k, v);
        }
    };
    // Block-major, as the stack takes them.
    let mut taken = Vec::with_capacity(rows.len() * stack.len());
    for layer in 0..stack.len() {
        let (heads, dim) = stack.kv_shape(layer).expect("layer < len");
        for r in 0..rows.len() {
            match rows[r][layer].take_for_decode(heads, dim, dtype) {
                Ok(t) => taken.push(t),
                Err(e) => {
                    restore(rows, taken);
                    return Err(e);
                }
            }
        }
    }
    let offsets: Vec<i32> = taken.iter().map(|t| t.2).collect();
    let result = {
        let refs: Vec<(&Array, &Array)> = taken.iter().map(|(k, v, _)| (k, v)).collect();
        // A cache that just grew is a pending concatenation: evaluated
        // first, the node can write it in place like the others.
        let pending: Vec<&Array> = refs
            .iter()
            .flat_map(|(k, v)| [*k, *v])
            .filter(|c| c.is_pending())
            .collect();
        if !pending.is_empty() {
            if let Err(e) = crate::eval(&pending) {
                drop(refs);
                restore(rows, taken);
                return Err(OpError::new("decoder_layer", e.to_string()));
            }
        }
        match start {
            StackStart::Rows(x) => stack.forward(x, &refs, &offsets),
            StackStart::Tokens(t) => stack.forward_tokens(t, &refs, &offsets),
        }
    };
    match result {
        Ok((out, updated)) => {
            // The inputs are dropped before evaluation so their buffers can
            // be reused in place.
            drop(taken);
            for (i, (k, v)) in updated.into_iter().enumerate() {
                rows[i % rows.len()][i / rows.len()].commit_decode(k, v);
            }
            Ok(out)
        }
        Err(e) => {
            restore(rows, taken);
            Err(e)
        }
    }
}
