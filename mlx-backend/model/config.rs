//! Model hyperparameters, read from an HF `config.json` or GGUF metadata.
//! Unknown keys are ignored; a missing required key is an error naming it.

use super::error::ModelLoadError;
use crate::io::GgufFile;
use crate::ops::QuantSpec;
use serde_json::Value;

/// The supported families.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Llama, SmolLM/SmolLM2 and Mistral.
    Llama,
    /// Qwen2 (biased q/k/v).
    Qwen2,
    /// Qwen3 (q/k norms).
    Qwen3,
    /// Qwen2-MoE (with a shared expert).
    Qwen2Moe,
    /// Qwen3-MoE.
    Qwen3Moe,
}

impl Architecture {
    /// The architecture of an HF `model_type` (or GGUF `general.architecture`).
    pub fn from_model_type(name: &str) -> Result<Architecture, ModelLoadError> {
        Ok(match name {
            "llama" | "mistral" | "smollm" | "smollm2" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "qwen2_moe" => Architecture::Qwen2Moe,
            "qwen3_moe" => Architecture::Qwen3Moe,
            other => return Err(ModelLoadError::UnsupportedArchitecture(other.into())),
        })
    }

    /// The family's `model_type` name.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen2Moe => "qwen2_moe",
            Architecture::Qwen3Moe => "qwen3_moe",
        }
    }
}

/// RoPE frequency scaling, as mlx-lm's `initialize_rope` supports it.
///
/// Of mlx-lm 0.32.2's other types, `longrope`, `proportional` and `mrope`
/// are not implemented here; `parse_rope_scaling` refuses them with
/// `ModelLoadError::BadConfigValue` rather than run the model unscaled.
/// YaRN's `attention_factor` (HF) is honoured, while mlx-lm ignores it.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor`.
    Linear {
        /// The divisor of positions.
        factor: f32,
    },
    /// Dynamic NTK (mlx-lm's `DynamicNTKScalingRoPE`): the base is
    /// recomputed on every call from `max(offset + L, max_position_embeddings)`.
    Dynamic {
        /// The context extension factor.
        factor: f32,
    },
    /// Llama 3's frequency-band scaling.
    Llama3 {
        /// The overall scaling factor.
        factor: f32,
        /// Wavelengths above `original / low_freq_factor` are fully scaled.
        low_freq_factor: f32,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f32,
        /// The context length the model was trained with.
        original_max_position_embeddings: f32,
    },
    /// YaRN scaling.
    Yarn {
        /// The context extension factor.
        factor: f32,
        /// The context length the model was trained with.
        original_max_position_embeddings: f32,
        /// Rotations above which a dimension is kept (extrapolated).
        beta_fast: f32,
        /// Rotations below which a dimension is fully interpolated.
        beta_slow: f32,
        /// The attention temperature's coefficient.
        mscale: f32,
        /// The coefficient it is divided by (DeepSeek's form).
        mscale_all_dim: f32,
        /// An explicit attention scale (HF); replaces the computed one.
        attention_factor: Option<f32>,
    },
}

/// Quantization of a checkpoint (mlx-community `quantization` block).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantConfig {
    /// What every quantized module uses unless overridden.
    pub default: QuantSpec,
    /// Per-module overrides: `(module path, Some(spec) | None = not quantized)`.
    pub overrides: Vec<(String, Option<QuantSpec>)>,
}

/// Mixture-of-experts settings.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per MoE layer.
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub num_experts_per_tok: usize,
    /// Each expert's intermediate size.
    pub moe_intermediate_size: usize,
    /// Qwen2-MoE's shared expert (with its sigmoid gate); 0 when absent.
    pub shared_expert_intermediate_size: usize,
    /// Renormalise the top-k routing weights to sum to 1.
    pub norm_topk_prob: bool,
    /// Every this-many-th layer is sparse (Qwen2-MoE).
    pub decoder_sparse_step: usize,
    /// Layers that keep a dense MLP.
    pub mlp_only_layers: Vec<usize>,
}

impl MoeConfig {
    /// Whether layer `i` uses the sparse MoE block (Qwen's rule).
    pub fn is_sparse_layer(&self, i: usize) -> bool {
        !self.mlp_only_layers.contains(&i)
            && self.num_experts > 0
            && (i + 1).is_multiple_of(self.decoder_sparse_step.max(1))
    }
}

#[derive(Clone, Debug, PartialEq)]
/// A model's hyperparameters, named as in HF `config.json`.
pub struct ModelConfig {
    /// The model family.
    pub architecture: Architecture,
    /// The residual stream's width.
    pub hidden_size: usize,
    /// Decoder blocks.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (fewer than query heads: GQA).
    pub num_key_value_heads: usize,
    /// Features per head.
    pub head_dim: usize,
    /// The dense MLP's intermediate size.
    pub intermediate_size: usize,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// The RMSNorms' epsilon.
    pub rms_norm_eps: f32,
    /// RoPE's base frequency.
    pub rope_theta: f32,
    /// Interleaved-pair RoPE (llama.cpp's GGUF q/k layout).
    pub rope_traditional: bool,
    /// RoPE frequency scaling, when configured.
    pub rope_scaling: Option<RopeScaling>,
    /// The longest context the model was trained for.
    pub max_position_embeddings: usize,
    /// The output head reuses the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2).
    pub attention_bias: bool,
    /// Per-head RMSNorm of q and k (Qwen3).
    pub qk_norm: bool,
    /// Mixture-of-experts settings (MoE families).
    pub moe: Option<MoeConfig>,
    /// The checkpoint's quantization (mlx-community folders).
    pub quantization: Option<QuantConfig>,
    /// The beginning-of-sequence token, when known.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
}

struct Json<'a> {
    v: &'a Value,
    path: &'a str,
}

impl Json<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }

    fn req_usize(&self, key: &str) -> Result<usize, ModelLoadError> {
        match self.get(key) {
            None => Err(ModelLoadError::MissingConfigKey {
                path: self.path.into(),
                key: key.into(),
            }),
            Some(v) => v
                .as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| self.bad(key, "not a non-negative integer")),
        }
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>, ModelLoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.req_usize(key).map(Some),
        }
    }

    fn opt_f32(&self, key: &str) -> Result<Option<f32>, ModelLoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.bad(key, "not a number")),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ModelLoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.bad(key, "not a boolean")),
        }
    }

    fn bad(&self, key: &str, message: &str) -> ModelLoadError {
        ModelLoadError::BadConfigValue {
            path: self.path.into(),
            key: key.into(),
            message: message.into(),
        }
    }
}

fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

impl ModelConfig {
    /// The longest context the model is meant to serve: its
    /// `max_position_embeddings`, stretched by the factor under dynamic NTK
    /// scaling (which exists to run past it).
    pub fn max_context(&self) -> usize {
        match self.rope_scaling {
            Some(RopeScaling::Dynamic { factor }) => {
                (self.max_position_embeddings as f32 * factor.max(1.0)) as usize
            }
            _ => self.max_position_embeddings,
        }
    }

    /// Parse an HF `config.json` (`path` names it in errors).
    pub fn from_json(text: &str, path: &str) -> Result<ModelConfig, ModelLoadError> {
        let v: Value = serde_json::from_str(text).map_err(|e| ModelLoadError::Io {
            path: path.into(),
            message: format!("invalid JSON: {e}"),
        })?;
        let j = Json { v: &v, path };
        let model_type = j
            .get("model_type")
            .and_then(|m| m.as_str())
            .ok_or_else(|| ModelLoadError::MissingConfigKey {
                path: path.into(),
                key: "model_type".into(),
            })?;
        let architecture = Architecture::from_model_type(model_type)?;
        let hidden_size = j.req_usize("hidden_size")?;
        let num_attention_heads = j.req_usize("num_attention_heads")?;
        let head_dim = j
            .opt_usize("head_dim")?
            .unwrap_or(hidden_size / num_attention_heads.max(1));
        let is_moe = matches!(
            architecture,
            Architecture::Qwen2Moe | Architecture::Qwen3Moe
        );
        let moe = if is_moe {
            Some(MoeConfig {
                num_experts: j.req_usize("num_experts")?,
                num_experts_per_tok: j.req_usize("num_experts_per_tok")?,
                moe_intermediate_size: j.req_usize("moe_intermediate_size")?,
                shared_expert_intermediate_size: j
                    .opt_usize("shared_expert_intermediate_size")?
                    .unwrap_or(0),
                norm_topk_prob: j
                    .opt_bool("norm_topk_prob")?
                    .unwrap_or(architecture == Architecture::Qwen3Moe),
                decoder_sparse_step: j.opt_usize("decoder_sparse_step")?.unwrap_or(1),
                mlp_only_layers: j
                    .get("mlp_only_layers")
                    .and_then(|a| a.as_array())
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_u64())
                            .map(|x| x as usize)
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        } else {
            None
        };
        Ok(ModelConfig {
            architecture,
            hidden_size,
            num_hidden_layers: j.req_usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: j
                .opt_usize("num_key_value_heads")?
                .unwrap_or(num_attention_heads),
            head_dim,
            intermediate_size: j.req_usize("intermediate_size")?,
            vocab_size: j.req_usize("vocab_size")?,
            rms_norm_eps: j.opt_f32("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta: j.opt_f32("rope_theta")?.unwrap_or(10000.0),
            rope_traditional: j.opt_bool("rope_traditional")?.unwrap_or(false),
            rope_scaling: parse_rope_scaling(&j)?,
            max_position_embeddings: j.opt_usize("max_position_embeddings")?.unwrap_or(32768),
            tie_word_embeddings: j
                .opt_bool("tie_word_embeddings")?
                .unwrap_or(architecture == Architecture::Qwen3),
            attention_bias: j.opt_bool("attention_bias")?.unwrap_or(matches!(
                architecture,
                Architecture::Qwen2 | Architecture::Qwen2Moe
            )),
            qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Qwen3Moe),
            moe,
            quantization: parse_quantization(&j)?,
            bos_token_id: j.opt_usize("bos_token_id")?.map(|x| x as u32),
            eos_token_ids: token_ids(j.get("eos_token_id")),
        })
    }

    /// Hyperparameters of a llama-architecture GGUF file.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelLoadError> {
        let arch = file.metadata_string("general.architecture")?;
        let architecture = Architecture::from_model_type(&arch)?;
        let key = |k: &str| format!("{arch}.{k}");
        let num = |k: &str| file.metadata_f64(&key(k));
        let opt = |k: &str| file.opt_metadata_f64(&key(k));
        let hidden_size = num("embedding_length")? as usize;
        let heads = num("attention.head_count")? as usize;
        let vocab_size = match opt("vocab_size")? {
            Some(v) => v as usize,
            None => file.metadata_strings("tokenizer.ggml.tokens")?.len(),
        };
        let head_dim = opt("rope.dimension_count")?
            .map(|d| d as usize)
            .unwrap_or(hidden_size / heads.max(1));
        let num_key_value_heads = opt("attention.head_count_kv")?
            .map(|v| v as usize)
            .unwrap_or(heads);
        let rms_norm_eps = opt("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5) as f32;
        let rope_theta = opt("rope.freq_base")?.unwrap_or(10000.0) as f32;
        let max_position_embeddings = opt("context_length")?.map_or(4096, |v| v as usize);
        // Some converters write -1 / u32::MAX for "no such token".
        let token_id = |k: &str| -> Result<Option<u32>, ModelLoadError> {
            Ok(file
                .opt_metadata_f64(k)?
                .filter(|&v| v >= 0.0 && v < u32::MAX as f64)
                .map(|v| v as u32))
        };
        let bos_token_id = token_id("tokenizer.ggml.bos_token_id")?;
        let eos_token_ids = token_id("tokenizer.ggml.eos_token_id")?
            .into_iter()
            .collect();
        Ok(ModelConfig {
            architecture,
            hidden_size,
            num_hidden_layers: num("block_count")? as usize,
            num_attention_heads: heads,
            num_key_value_heads,
            head_dim,
            intermediate_size: num("feed_forward_length")? as usize,
            vocab_size,
            rms_norm_eps,
            rope_theta,
            // llama.cpp's converter permutes q/k for interleaved rotation.
            rope_traditional: architecture == Architecture::Llama,
            rope_scaling: None,
            max_position_embeddings,
            tie_word_embeddings: !file.names().iter().any(|n| n == "output.weight"),
            attention_bias: file.names().iter().any(|n| n == "blk.0.attn_q.bias"),
            qk_norm: file.names().iter().any(|n| n == "blk.0.attn_q_norm.weight"),
            moe: None,
            quantization: None,
            bos_token_id,
            eos_token_ids,
        })
    }
}

fn parse_rope_scaling(j: &Json<'_>) -> Result<Option<RopeScaling>, ModelLoadError> {
    let Some(scaling) = j.get("rope_scaling") else {
        return Ok(None);
    };
    let s = Json {
        v: scaling,
        path: j.path,
    };
    let kind = scaling
        .get("type")
        .or_else(|| scaling.get("rope_type"))
        .and_then(|t| t.as_str())
        .unwrap_or("default");
    let factor = || -> Result<f32, ModelLoadError> {
        s.opt_f32("factor")?
            .ok_or_else(|| ModelLoadError::MissingConfigKey {
                path: j.path.into(),
                key: "rope_scaling.factor".into(),
            })
    };
    Ok(match kind {
        "default" => None,
        "linear" => Some(RopeScaling::Linear { factor: factor()? }),
        "dynamic" => Some(RopeScaling::Dynamic { factor: factor()? }),
        "llama3" => Some(RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: s.opt_f32("low_freq_factor")?.unwrap_or(1.0),
            high_freq_factor: s.opt_f32("high_freq_factor")?.unwrap_or(4.0),
            original_max_position_embeddings: s
                .opt_f32("original_max_position_embeddings")?
                .unwrap_or(8192.0),
        }),
        "yarn" | "deepseek_yarn" => Some(RopeScaling::Yarn {
            factor: factor()?,
            original_max_position_embeddings: s
                .opt_f32("original_max_position_embeddings")?
                .unwrap_or(4096.0),
            beta_fast: s.opt_f32("beta_fast")?.unwrap_or(32.0),
            beta_slow: s.opt_f32("beta_slow")?.unwrap_or(1.0),
            mscale: s.opt_f32("mscale")?.unwrap_or(1.0),
            mscale_all_dim: s.opt_f32("mscale_all_dim")?.unwrap_or(0.0),
            attention_factor: s.opt_f32("attention_factor")?,
        }),
        other => {
            return Err(j.bad(
                "rope_scaling.type",
                &format!("'{other}' is not supported (linear, dynamic, llama3, yarn are)"),
            ))
        }
    })
}

fn parse_quantization(j: &Json<'_>) -> Result<Option<QuantConfig>, ModelLoadError> {
    let Some(q) = j
        .get("quantization")
        .or_else(|| j.get("quantization_config"))
    else {
        return Ok(None);
    };
    let qj = Json { v: q, path: j.path };
    let group_size = qj.opt_usize("group_size")?.unwrap_or(64) as i32;
    let bits = qj.opt_usize("bits")?.unwrap_or(4) as i32;
    if let Some(mode) = q.get("mode").and_then(|m| m.as_str()) {
        if mode != "affine" {
            return Err(j.bad(
                "quantization.mode",
                &format!("'{mode}' is not supported (affine is)"),
            ));
        }
    }
    let mut overrides = Vec::new();
    if let Some(obj) = q.as_object() {
        for (k, v) in obj {
            match v {
                Value::Bool(false) => overrides.push((k.clone(), None)),
                Value::Object(o) => {
                    let g = o
                        .get("group_size")
                        .and_then(|x| x.as_i64())
                        .unwrap_or(group_size as i64) as i32;
                    let b = o
                        .get("bits")
                        .and_then(|x| x.as_i64())
                        .unwrap_or(bits as i64) as i32;
                    overrides.push((
                        k.clone(),
                        Some(QuantSpec {
                            bits: b,
                            group_size: g,
                        }),
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(Some(QuantConfig {
        default: QuantSpec { bits, group_size },
        overrides,
    }))
}
