//! The building blocks every family shares: linear layers (dense or
//! quantized), embeddings (dense or quantized, usable as the tied lm_head),
//! RMSNorm, rotary embeddings with mlx-lm's scalings, GQA attention over a
//! caller-owned KV cache, the SwiGLU MLP and the sparse MoE block.

use super::config::{ModelConfig, MoeConfig, RopeScaling};
use super::error::ModelLoadError;
use super::kv_cache::LayerKvCache;
use super::weights::Weights;
use crate::distributed::Group;
use crate::kernels::ActivationPrecision;
use crate::ops::{scaled_dot_product_attention, AttentionMask, Quantized, RopeOffset};
use crate::{Array, Dtype, OpError};

/// `y = x·Wᵀ (+ b)`, W dense or affine-quantized.
pub enum Linear {
    Dense {
        weight: Array,
        bias: Option<Array>,
    },
    Quantized {
        q: Quantized,
        bias: Option<Array>,
        activations: ActivationPrecision,
    },
}

impl Linear {
    pub fn load(
        w: &Weights,
        prefix: &str,
        in_f: usize,
        out_f: usize,
        bias: bool,
    ) -> Result<Linear, ModelLoadError> {
        let bias = if bias {
            Some(w.get_shaped(&format!("{prefix}.bias"), &[out_f as i32])?)
        } else {
            None
        };
        match w.quantized(prefix, in_f)? {
            Some(q) => {
                if q.weight.dim(0)? != out_f as i32 {
                    return Err(ModelLoadError::WrongShape {
                        name: format!("{prefix}.weight"),
                        expected: vec![out_f as i32, (in_f as i32) * q.bits / 32],
                        found: q.weight.shape(),
                    });
                }
                Ok(Linear::Quantized {
                    q,
                    bias,
                    activations: w.activations(),
                })
            }
            None => Ok(Linear::Dense {
                weight: w.get_shaped(&format!("{prefix}.weight"), &[out_f as i32, in_f as i32])?,
                bias,
            }),
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Array, OpError> {
        match self {
            // mlx-lm's nn.Linear: one fused, once-rounded `bias + x·Wᵀ`.
            Linear::Dense {
                weight,
                bias: Some(b),
            } => Array::addmm(b, x, &weight.t()?),
            Linear::Dense { weight, bias: None } => x.matmul(&weight.t()?),
            // QuantizedLinear adds its bias after the product.
            Linear::Quantized {
                q,
                bias,
                activations,
            } => {
                let y = super::fused::quantized_matmul_with(x, q, *activations)?;
                match bias {
                    Some(b) => y.add(b),
                    None => Ok(y),
                }
            }
        }
    }
}

impl Linear {
    /// The lm_head: as [`Linear::forward`], but a quantized head takes x in
    /// f32 and returns f32 logits (see [`Embedding::as_linear`]).
    pub fn forward_logits(&self, x: &Array) -> Result<Array, OpError> {
        match self {
            Linear::Quantized {
                q,
                bias,
                activations,
            } => {
                let x = x.astype(Dtype::F32)?;
                let y = super::fused::quantized_matmul_with(&x, q, *activations)?;
                match bias {
                    Some(b) => y.add(b),
                    None => Ok(y),
                }
            }
            Linear::Dense { .. } => self.forward(x),
        }
    }
}

/// Token embeddings; also the lm_head when weights are tied.
pub enum Embedding {
    Dense(Array),
    /// The activation precision applies when it serves as the lm_head; the
    /// dtype is that of the rows it returns (the model's activations, which
    /// may be wider than the scales).
    Quantized(Quantized, ActivationPrecision, Dtype),
}

impl Embedding {
    pub fn load(
        w: &Weights,
        prefix: &str,
        vocab: usize,
        hidden: usize,
    ) -> Result<Embedding, ModelLoadError> {
        match w.quantized(prefix, hidden)? {
            Some(q) => {
                let dtype = w.float_dtype().unwrap_or(q.scales.dtype());
                Ok(Embedding::Quantized(q, w.activations(), dtype))
            }
            None => Ok(Embedding::Dense(w.get_shaped(
                &format!("{prefix}.weight"),
                &[vocab as i32, hidden as i32],
            )?)),
        }
    }

    /// Rows for `ids` (any shape) → `[..., hidden]`.
    pub fn forward(&self, ids: &Array) -> Result<Array, OpError> {
        match self {
            Embedding::Dense(w) => w.take(ids, 0),
            Embedding::Quantized(q, _, dtype) => {
                // Only the looked-up rows' scales are widened (to the
                // activations' dtype; a no-op when equal), so dequantization
                // runs in it.
                Quantized {
                    weight: q.weight.take(ids, 0)?,
                    scales: q.scales.take(ids, 0)?.astype(*dtype)?,
                    biases: q.biases.take(ids, 0)?.astype(*dtype)?,
                    group_size: q.group_size,
                    bits: q.bits,
                }
                .dequantize()
            }
        }
    }

    /// `x·Eᵀ`: logits through the tied embedding matrix. The quantized
    /// head takes x in f32 and returns f32 logits (f16/bf16 scales are
    /// promoted inside the kernel), so near-equal logits are not tied by a
    /// final f16/bf16 rounding.
    pub fn as_linear(&self, x: &Array) -> Result<Array, OpError> {
        match self {
            Embedding::Dense(w) => x.matmul(&w.t()?),
            Embedding::Quantized(q, activations, _) => {
                super::fused::quantized_matmul_with(&x.astype(Dtype::F32)?, q, *activations)
            }
        }
    }

    pub fn dtype(&self) -> Dtype {
        match self {
            Embedding::Dense(w) => w.dtype(),
            Embedding::Quantized(_, _, dtype) => *dtype,
        }
    }
}

/// RMSNorm with a learned scale (not Gemma's `1 + w`).
pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
}

impl RmsNorm {
    pub fn load(w: &Weights, name: &str, dim: usize, eps: f32) -> Result<RmsNorm, ModelLoadError> {
        Ok(RmsNorm {
            weight: w.get_shaped(name, &[dim as i32])?,
            eps,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array, OpError> {
        super::fused::rms_norm(x, &self.weight, self.eps)
    }
}

/// Rotary embedding as mlx-lm's `initialize_rope` builds it.
pub struct Rope {
    dims: i32,
    traditional: bool,
    base: f32,
    scale: f32,
    freqs: Option<Array>,
    /// YaRN's attention scaling of the rotated features.
    mscale: f32,
    /// Dynamic NTK: `(factor, max_position_embeddings)`; the base then
    /// depends on the sequence length at each call.
    dynamic: Option<(f32, i32)>,
}

impl Rope {
    pub fn new(c: &ModelConfig) -> Result<Rope, OpError> {
        let dims = c.head_dim as i32;
        let mut rope = Rope {
            dims,
            traditional: c.rope_traditional,
            base: c.rope_theta,
            scale: 1.0,
            freqs: None,
            mscale: 1.0,
            dynamic: None,
        };
        let base = c.rope_theta as f64;
        let d = dims as f64;
        let exps: Vec<f64> = (0..dims / 2).map(|i| (2 * i) as f64 / d).collect();
        match &c.rope_scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => rope.scale = 1.0 / factor,
            Some(RopeScaling::Dynamic { factor }) => {
                rope.dynamic = Some((*factor, c.max_position_embeddings as i32))
            }
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let (factor, lo, hi, old) = (
                    *factor as f64,
                    *low_freq_factor as f64,
                    *high_freq_factor as f64,
                    *original_max_position_embeddings as f64,
                );
                let (low_wavelen, high_wavelen) = (old / lo, old / hi);
                let freqs: Vec<f32> = exps
                    .iter()
                    .map(|e| {
                        let f = base.powf(*e);
                        let wavelen = 2.0 * std::f64::consts::PI * f;
                        let scaled = if wavelen > low_wavelen { f * factor } else { f };
                        if wavelen > high_wavelen && wavelen < low_wavelen {
                            let smooth = (old / wavelen - lo) / (hi - lo);
                            (scaled / ((1.0 - smooth) / factor + smooth)) as f32
                        } else {
                            scaled as f32
                        }
                    })
                    .collect();
                rope.freqs =
                    Some(Array::from_slice(&freqs, &[freqs.len() as i32]).map_err(host_err)?);
            }
            Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                attention_factor,
            }) => {
                let factor = *factor as f64;
                let orig = *original_max_position_embeddings as f64;
                let correction_dim = |rot: f64| {
                    (d * (orig / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * base.ln())
                };
                let low = correction_dim(*beta_fast as f64).floor().max(0.0);
                let high = correction_dim(*beta_slow as f64).ceil().min(d - 1.0);
                let get_mscale = |scale: f64, m: f64| {
                    if scale <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * scale.ln() + 1.0
                    }
                };
                rope.mscale = match attention_factor {
                    Some(a) => *a,
                    None => {
                        (get_mscale(factor, *mscale as f64)
                            / get_mscale(factor, *mscale_all_dim as f64))
                            as f32
                    }
                };
                let high = if high == low { high + 0.001 } else { high };
                let freqs: Vec<f32> = exps
                    .iter()
                    .enumerate()
                    .map(|(i, e)| {
                        let extra = base.powf(*e);
                        let inter = factor * extra;
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let mask = 1.0 - ramp;
                        ((inter * extra) / (inter * mask + extra * (1.0 - mask))) as f32
                    })
                    .collect();
                rope.freqs =
                    Some(Array::from_slice(&freqs, &[freqs.len() as i32]).map_err(host_err)?);
            }
        }
        Ok(rope)
    }

    /// Whether the rotation depends on the sequence length (dynamic NTK), so
    /// rows of different lengths cannot share one call.
    pub fn length_dependent(&self) -> bool {
        self.dynamic.is_some()
    }

    /// The base for a sequence of `len` tokens (only dynamic NTK changes it).
    fn base_for(&self, len: i32) -> f32 {
        match self.dynamic {
            None => self.base,
            Some((factor, max_pos)) => {
                let seq = len.max(max_pos) as f64;
                let (f, m, d) = (factor as f64, max_pos as f64, self.dims as f64);
                (self.base as f64 * ((f * seq / m) - (f - 1.0)).powf(d / (d - 2.0))) as f32
            }
        }
    }

    pub fn forward(&self, x: &Array, offset: RopeOffset<'_>) -> Result<Array, OpError> {
        let base = match offset {
            RopeOffset::Static(o) => self.base_for(o + x.dim(-2)?),
            RopeOffset::Dynamic(_) if self.dynamic.is_some() => {
                return Err(OpError::new(
                    "rope",
                    "dynamic NTK scaling needs a host offset (one row at a time)",
                ))
            }
            RopeOffset::Dynamic(_) => self.base,
        };
        let x = if self.mscale != 1.0 {
            let rotated = x
                .slice_axis(-1, 0, self.dims)?
                .mul_scalar(self.mscale as f64)?;
            let d = x.dim(-1)?;
            if d > self.dims {
                crate::ops::concatenate(&[&rotated, &x.slice_axis(-1, self.dims, d)?], -1)?
            } else {
                rotated
            }
        } else {
            x.clone()
        };
        x.rope(
            self.dims,
            self.traditional,
            base,
            self.scale,
            offset,
            self.freqs.as_ref(),
        )
    }
}

fn host_err(e: crate::HostDataError) -> OpError {
    OpError::new("rope", e.to_string())
}

/// Multi-head attention with grouped KV heads, optional q/k/v bias (Qwen2)
/// and per-head q/k RMSNorm (Qwen3).
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    scale: f32,
    rope: Rope,
    /// Under tensor parallelism: the group o_proj's partial sums add up over.
    reduce: Option<Group>,
}

impl Attention {
    pub fn load(w: &Weights, prefix: &str, c: &ModelConfig) -> Result<Attention, ModelLoadError> {
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (nq, nkv) = (c.num_attention_heads, c.num_key_value_heads);
        let norm = |name: &str| -> Result<Option<RmsNorm>, ModelLoadError> {
            if c.qk_norm {
                Ok(Some(RmsNorm::load(
                    w,
                    &format!("{prefix}.{name}.weight"),
                    hd,
                    c.rms_norm_eps,
                )?))
            } else {
                Ok(None)
            }
        };
        Ok(Attention {
            q_proj: Linear::load(w, &format!("{prefix}.q_proj"), h, nq * hd, c.attention_bias)?,
            k_proj: Linear::load(
                w,
                &format!("{prefix}.k_proj"),
                h,
                nkv * hd,
                c.attention_bias,
            )?,
            v_proj: Linear::load(
                w,
                &format!("{prefix}.v_proj"),
                h,
                nkv * hd,
                c.attention_bias,
            )?,
            o_proj: Linear::load(w, &format!("{prefix}.o_proj"), nq * hd, h, false)?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            n_heads: nq as i32,
            n_kv_heads: nkv as i32,
            head_dim: hd as i32,
            scale: (hd as f32).powf(-0.5),
            rope: Rope::new(c)?,
            reduce: w.tensor_parallel().cloned(),
        })
    }

    /// q, k, v as `[B, heads, L, D]`, before RoPE.
    fn project(&self, x: &Array) -> Result<(Array, Array, Array), OpError> {
        let shape = x.shape();
        let (b, l) = (shape[0], shape[1]);
        let heads = |t: Array, n: i32, norm: &Option<RmsNorm>| -> Result<Array, OpError> {
            let t = t.reshape(&[b, l, n, self.head_dim])?;
            let t = match norm {
                Some(norm) => norm.forward(&t)?,
                None => t,
            };
            t.transpose(&[0, 2, 1, 3])
        };
        Ok((
            heads(self.q_proj.forward(x)?, self.n_heads, &self.q_norm)?,
            heads(self.k_proj.forward(x)?, self.n_kv_heads, &self.k_norm)?,
            heads(self.v_proj.forward(x)?, self.n_kv_heads, &None)?,
        ))
    }

    fn output(&self, o: &Array, b: i32, l: i32) -> Result<Array, OpError> {
        let y = self
            .o_proj
            .forward(&o.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)?;
        all_sum(y, self.reduce.as_ref())
    }

    /// `x [B, L, H]` → `[B, L, H]` for rows that share one cache (and offset),
    /// appending this step's keys/values to `cache`.
    pub fn forward(
        &self,
        x: &Array,
        cache: &mut LayerKvCache,
        mask: AttentionMask<'_>,
    ) -> Result<Array, OpError> {
        let shape = x.shape();
        let (q, k, v) = self.project(x)?;
        let offset = cache.offset();
        let q = self.rope.forward(&q, RopeOffset::Static(offset))?;
        let k = self.rope.forward(&k, RopeOffset::Static(offset))?;
        let (k, v) = cache.update(&k, &v)?;
        // The attention kernel pays for prefill (5x at 1024 tokens). A single
        // query reaches this path only when the fused decoder_layer does not
        // apply (e.g. f16 activations); it stays on MLX's op, which measured
        // faster than the attention kernel over a large pooled cache.
        let o = if shape[1] > 1 {
            crate::kernels::attention(&q, &k, &v, self.scale, mask)?
        } else {
            scaled_dot_product_attention(&q, &k, &v, self.scale, mask)?
        };
        self.output(&o, shape[0], shape[1])
    }

    /// One decode step for `B` requests of different lengths, `x [B, 1, H]`,
    /// each with its own cache: keys/values are gathered into a left-padded
    /// batch and `ragged.mask` hides the padding.
    pub fn forward_ragged(
        &self,
        x: &Array,
        caches: &mut [&mut LayerKvCache],
        ragged: &RaggedBatch,
    ) -> Result<Array, OpError> {
        let b = x.dim(0)?;
        let (q, k, v) = self.project(x)?;
        let (q, k) = if self.rope.length_dependent() {
            // Each row's base depends on its own length: rotate row by row.
            let per_row = |t: &Array| -> Result<Array, OpError> {
                let rows: Vec<Array> = ragged
                    .lengths
                    .iter()
                    .enumerate()
                    .map(|(r, &len)| {
                        let r = r as i32;
                        self.rope
                            .forward(&t.slice_axis(0, r, r + 1)?, RopeOffset::Static(len))
                    })
                    .collect::<Result<_, _>>()?;
                crate::ops::concatenate(&rows.iter().collect::<Vec<_>>(), 0)
            };
            (per_row(&q)?, per_row(&k)?)
        } else {
            (
                self.rope
                    .forward(&q, RopeOffset::Dynamic(&ragged.offsets))?,
                self.rope
                    .forward(&k, RopeOffset::Dynamic(&ragged.offsets))?,
            )
        };
        let mut keys = Vec::with_capacity(caches.len());
        let mut values = Vec::with_capacity(caches.len());
        for (row, cache) in caches.iter_mut().enumerate() {
            let row = row as i32;
            let (kr, vr) = cache.update(
                &k.slice_axis(0, row, row + 1)?,
                &v.slice_axis(0, row, row + 1)?,
            )?;
            let pad = ragged.max_len - cache.offset();
            if pad > 0 {
                let mut shape = kr.shape();
                shape[2] = pad;
                let zeros = Array::zeros(&shape, kr.dtype())?;
                keys.push(crate::ops::concatenate(&[&zeros, &kr], 2)?);
                values.push(crate::ops::concatenate(&[&zeros, &vr], 2)?);
            } else {
                keys.push(kr);
                values.push(vr);
            }
        }
        let keys = crate::ops::concatenate(&keys.iter().collect::<Vec<_>>(), 0)?;
        let values = crate::ops::concatenate(&values.iter().collect::<Vec<_>>(), 0)?;
        let o = scaled_dot_product_attention(
            &q,
            &keys,
            &values,
            self.scale,
            AttentionMask::Array(&ragged.mask),
        )?;
        self.output(&o, b, 1)
    }
}

/// Per-step data shared by every layer of a ragged decode batch.
pub struct RaggedBatch {
    /// Each row's position before this step, int32 `[B]`.
    pub offsets: Array,
    /// `[B, 1, 1, max_len]` bool: true where a key is real (left padding is false).
    pub mask: Array,
    pub max_len: i32,
    /// The same offsets on the host.
    pub lengths: Vec<i32>,
}

impl RaggedBatch {
    /// From each row's cached length before this step.
    pub fn new(lengths: &[i32]) -> Result<RaggedBatch, OpError> {
        let max_len = lengths.iter().copied().max().unwrap_or(0) + 1;
        let mut mask = Vec::with_capacity(lengths.len() * max_len as usize);
        for &len in lengths {
            let valid = len + 1;
            mask.extend((0..max_len).map(|j| j >= max_len - valid));
        }
        let b = lengths.len() as i32;
        let host = |e: crate::HostDataError| OpError::new("ragged_batch", e.to_string());
        Ok(RaggedBatch {
            offsets: Array::from_slice(lengths, &[b]).map_err(host)?,
            mask: Array::from_slice(&mask, &[b, 1, 1, max_len]).map_err(host)?,
            max_len,
            lengths: lengths.to_vec(),
        })
    }
}

/// SwiGLU: `down(silu(gate(x)) * up(x))`.
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    /// Under tensor parallelism: the group down_proj's partial sums add up
    /// over (`None` for a MoE's shared expert, summed with the experts).
    reduce: Option<Group>,
}

impl Mlp {
    /// The gate projection's quantization, when it is quantized.
    pub fn quantization(&self) -> Option<crate::ops::QuantSpec> {
        match &self.gate_proj {
            Linear::Quantized { q, .. } => Some(q.spec()),
            Linear::Dense { .. } => None,
        }
    }
}

impl Mlp {
    pub fn load(
        w: &Weights,
        prefix: &str,
        hidden: usize,
        inter: usize,
    ) -> Result<Mlp, ModelLoadError> {
        Ok(Mlp {
            gate_proj: Linear::load(w, &format!("{prefix}.gate_proj"), hidden, inter, false)?,
            up_proj: Linear::load(w, &format!("{prefix}.up_proj"), hidden, inter, false)?,
            down_proj: Linear::load(w, &format!("{prefix}.down_proj"), inter, hidden, false)?,
            reduce: w.tensor_parallel().cloned(),
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array, OpError> {
        let h = match (&self.gate_proj, &self.up_proj) {
            (
                Linear::Quantized {
                    q: g,
                    bias: None,
                    activations,
                },
                Linear::Quantized {
                    q: u, bias: None, ..
                },
            ) => super::fused::gate_qmv_silu_mul_with(x, g, u, *activations)?,
            _ => self
                .gate_proj
                .forward(x)?
                .silu()?
                .mul(&self.up_proj.forward(x)?)?,
        };
        all_sum(self.down_proj.forward(&h)?, self.reduce.as_ref())
    }
}

/// `y` summed over the tensor-parallel group, or `y` itself without one.
fn all_sum(y: Array, group: Option<&Group>) -> Result<Array, OpError> {
    match group {
        Some(g) => g.all_sum(&y),
        None => Ok(y),
    }
}

/// Stacked expert weights `[E, N, K]`, dense or quantized (mlx-lm's SwitchLinear).
enum SwitchLinear {
    Dense(Array),
    Quantized(Quantized, ActivationPrecision),
}

impl SwitchLinear {
    fn load(
        w: &Weights,
        prefix: &str,
        experts: usize,
        in_f: usize,
        out_f: usize,
    ) -> Result<SwitchLinear, ModelLoadError> {
        match w.quantized(prefix, in_f)? {
            Some(q) => Ok(SwitchLinear::Quantized(q, w.activations())),
            None => Ok(SwitchLinear::Dense(w.get_shaped(
                &format!("{prefix}.weight"),
                &[experts as i32, out_f as i32, in_f as i32],
            )?)),
        }
    }

    /// `x [..., 1, 1, K]`, `idx [..., k]` → `[..., k, 1, N]`.
    fn forward(&self, x: &Array, idx: &Array) -> Result<Array, OpError> {
        match self {
            SwitchLinear::Dense(w) => {
                x.gather_mm(&w.transpose(&[0, 2, 1])?, None, Some(idx), false)
            }
            // MLX's gather_qmm: the activation precision does not apply.
            SwitchLinear::Quantized(q, _) => q.gather_matmul(x, None, Some(idx), true, false),
        }
    }
}

/// The sparse MoE block: softmax router, top-k experts by argpartition (as
/// mlx-lm), optional renormalisation, SwitchGLU experts, the score-weighted
/// combine, and Qwen2-MoE's sigmoid-gated shared expert.
pub struct SparseMoe {
    router: Linear,
    gate_proj: SwitchLinear,
    up_proj: SwitchLinear,
    down_proj: SwitchLinear,
    shared: Option<(Mlp, Linear)>,
    top_k: i32,
    norm_topk_prob: bool,
    /// Under tensor parallelism: the group, and the first of the experts
    /// this rank owns (the stacked weights hold only those).
    tensor_parallel: Option<(Group, i32)>,
}

impl SparseMoe {
    pub fn load(
        w: &Weights,
        prefix: &str,
        c: &ModelConfig,
        moe: &MoeConfig,
    ) -> Result<SparseMoe, ModelLoadError> {
        let (h, e, inter) = (c.hidden_size, moe.num_experts, moe.moe_intermediate_size);
        let group = w.tensor_parallel();
        let ranks = group.map_or(1, |g| g.size());
        let local = super::shard::experts_per_rank(e, ranks);
        let tensor_parallel = group.map(|g| (g.clone(), (g.rank() * local) as i32));
        let shared = if moe.shared_expert_intermediate_size > 0 {
            let mut mlp = Mlp::load(
                w,
                &format!("{prefix}.shared_expert"),
                h,
                moe.shared_expert_intermediate_size,
            )?;
            // Summed once with the experts' part.
            mlp.reduce = None;
            Some((
                mlp,
                Linear::load(w, &format!("{prefix}.shared_expert_gate"), h, 1, false)?,
            ))
        } else {
            None
        };
        let sw = format!("{prefix}.switch_mlp");
        Ok(SparseMoe {
            router: Linear::load(w, &format!("{prefix}.gate"), h, e, false)?,
            gate_proj: SwitchLinear::load(w, &format!("{sw}.gate_proj"), local, h, inter)?,
            up_proj: SwitchLinear::load(w, &format!("{sw}.up_proj"), local, h, inter)?,
            down_proj: SwitchLinear::load(w, &format!("{sw}.down_proj"), local, inter, h)?,
            shared,
            top_k: moe.num_experts_per_tok as i32,
            norm_topk_prob: moe.norm_topk_prob,
            tensor_parallel,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array, OpError> {
        let gates = self.router.forward(x)?.softmax(&[-1], true)?;
        let e = gates.dim(-1)?;
        let k = self.top_k;
        let inds = gates.neg()?.argpartition(k - 1, -1)?.slice_axis(-1, 0, k)?;
        let mut scores = gates.take_along_axis(&inds, -1)?;
        if self.norm_topk_prob {
            scores = scores.div(&scores.sum(&[-1], true)?)?;
        }
        debug_assert!(e >= k);
        // Under tensor parallelism a rank runs only the chosen experts it
        // owns: the others get weight 0 (and a valid local index), so its
        // combine is its part of the full one.
        let (inds, scores) = match &self.tensor_parallel {
            None => (inds, scores),
            Some((group, first)) => {
                let local_count = e / group.size() as i32;
                let local = inds.astype(Dtype::I32)?.add_scalar(-(*first as f64))?;
                let owned = local
                    .ge(&local.scalar_like(0.0)?)?
                    .logical_and(&local.lt(&local.scalar_like(local_count as f64)?)?)?;
                let local = crate::ops::where_(&owned, &local, &local.scalar_like(0.0)?)?
                    .astype(inds.dtype())?;
                let scores = scores.mul(&owned.astype(scores.dtype())?)?;
                (local, scores)
            }
        };
        let xe = x.expand_dims(&[-2, -3])?;
        let y = match (&self.gate_proj, &self.up_proj) {
            (SwitchLinear::Quantized(g, activations), SwitchLinear::Quantized(u, _)) => {
                super::fused::gather_gate_qmv_silu_mul_with(x, &inds, g, u, *activations)?
                    .expand_dims(&[-2])?
            }
            _ => {
                let g = self.gate_proj.forward(&xe, &inds)?;
                let u = self.up_proj.forward(&xe, &inds)?;
                g.silu()?.mul(&u)?
            }
        };
        let y = self.down_proj.forward(&y, &inds)?.squeeze(&[-2])?;
        let mut out = super::fused::moe_combine(&y, &scores)?;
        if let Some((mlp, gate)) = &self.shared {
            let shared = mlp.forward(x)?.mul(&gate.forward(x)?.sigmoid()?)?;
            out = out.add(&shared)?;
        }
        all_sum(out, self.tensor_parallel.as_ref().map(|(g, _)| g))
    }
}

/// The fused decode block's view of one pre-norm layer, when every
/// projection is quantized (q/k/v biases all present or all absent, none
/// elsewhere), the MLP is dense SwiGLU and RoPE does not depend on the
/// sequence length.
pub(crate) fn fused_decoder_layer<'a>(
    input_norm: &'a RmsNorm,
    attn: &'a Attention,
    post_norm: &'a RmsNorm,
    mlp: &'a Mlp,
) -> Option<crate::kernels::DecoderLayer<'a>> {
    fn quantized(l: &Linear) -> Option<(&Quantized, Option<&Array>)> {
        match l {
            Linear::Quantized { q, bias, .. } => Some((q, bias.as_ref())),
            Linear::Dense { .. } => None,
        }
    }
    // The fused block has no collective inside: a sharded block runs op
    // by op, with its all_sums.
    if attn.reduce.is_some() || mlp.reduce.is_some() {
        return None;
    }
    let activations = match &attn.q_proj {
        Linear::Quantized { activations, .. } => *activations,
        Linear::Dense { .. } => return None,
    };
    let (q, bq) = quantized(&attn.q_proj)?;
    let (k, bk) = quantized(&attn.k_proj)?;
    let (v, bv) = quantized(&attn.v_proj)?;
    let qkv_bias = match (bq, bk, bv) {
        (Some(a), Some(b), Some(c)) => Some([a, b, c]),
        (None, None, None) => None,
        _ => return None,
    };
    let mut unbiased = [&attn.o_proj, &mlp.gate_proj, &mlp.up_proj, &mlp.down_proj]
        .map(|l| quantized(l).filter(|(_, b)| b.is_none()).map(|(q, _)| q));
    let [o, gate, up, down] = [0, 1, 2, 3].map(|i| unbiased[i].take());
    let qk_norm = match (&attn.q_norm, &attn.k_norm) {
        (Some(a), Some(b)) if a.eps == input_norm.eps && b.eps == input_norm.eps => {
            Some([&a.weight, &b.weight])
        }
        (None, None) => None,
        _ => return None,
    };
    let rope = &attn.rope;
    if rope.dynamic.is_some() || input_norm.eps != post_norm.eps {
        return None;
    }
    Some(crate::kernels::DecoderLayer {
        input_norm: &input_norm.weight,
        post_norm: &post_norm.weight,
        eps: input_norm.eps,
        projections: [q, k, v, o?, gate?, up?, down?],
        qkv_bias,
        qk_norm,
        n_heads: attn.n_heads,
        n_kv_heads: attn.n_kv_heads,
        head_dim: attn.head_dim,
        attn_scale: attn.scale,
        rope: crate::kernels::RopeSpec {
            dims: rope.dims,
            traditional: rope.traditional,
            base: rope.base,
            scale: rope.scale,
            mscale: rope.mscale,
            freqs: rope.freqs.as_ref(),
        },
        activations,
    })
}
