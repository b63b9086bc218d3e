//! Synthetic checkpoints of published model shapes, for benchmarks where the
//! real checkpoints are out of reach: a published config with seeded random
//! weights, written as an mlx-community style folder (config.json and
//! model.safetensors, linear layers and embeddings 4-bit or 8-bit affine
//! quantized, or all bf16). This crate and mlx-lm (`mlx_lm.utils.load_model`)
//! load the same folder, so both run the same shapes on the same weights.
//! The tokens they produce are noise; their speed is the real models'.

use super::{io_err, ModelLoadError};
use crate::ops::{quantize, random};
use crate::{io, Array, Dtype};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// A published model shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyntheticShape {
    /// HuggingFaceTB/SmolLM2-135M-Instruct (Llama).
    Smollm2_135m,
    /// Qwen/Qwen3-0.6B (q/k norms).
    Qwen3_0_6b,
    /// Qwen/Qwen1.5-MoE-A2.7B (60 experts, top 4, a shared expert, q/k/v biases).
    Qwen15MoeA2_7b,
    /// Qwen/Qwen3-30B-A3B (128 experts, top 8).
    Qwen3_30bA3b,
}

impl SyntheticShape {
    /// Every shape.
    pub const ALL: [SyntheticShape; 4] = [
        SyntheticShape::Smollm2_135m,
        SyntheticShape::Qwen3_0_6b,
        SyntheticShape::Qwen15MoeA2_7b,
        SyntheticShape::Qwen3_30bA3b,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            SyntheticShape::Smollm2_135m => "smollm2-135m",
            SyntheticShape::Qwen3_0_6b => "qwen3-0.6b",
            SyntheticShape::Qwen15MoeA2_7b => "qwen1.5-moe-a2.7b",
            SyntheticShape::Qwen3_30bA3b => "qwen3-30b-a3b",
        }
    }

    /// The published config (the fields the loaders read).
    fn config(self) -> serde_json::Value {
        use serde_json::json;
        match self {
            SyntheticShape::Smollm2_135m => json!({
                "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
                "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                "head_dim": 64, "vocab_size": 49152, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
                "max_position_embeddings": 8192, "tie_word_embeddings": true,
                "eos_token_id": 2,
            }),
            SyntheticShape::Qwen3_0_6b => json!({
                "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
                "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0, "max_position_embeddings": 40960,
                "tie_word_embeddings": true, "eos_token_id": 151645,
            }),
            SyntheticShape::Qwen15MoeA2_7b => json!({
                "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
                "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                "max_position_embeddings": 8192, "tie_word_embeddings": false,
                "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1,
                "norm_topk_prob": false, "mlp_only_layers": [], "eos_token_id": 151643,
            }),
            SyntheticShape::Qwen3_30bA3b => json!({
                "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
                "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0, "max_position_embeddings": 40960,
                "tie_word_embeddings": false, "num_experts": 128, "num_experts_per_tok": 8,
                "moe_intermediate_size": 768, "decoder_sparse_step": 1, "norm_topk_prob": true,
                "mlp_only_layers": [], "eos_token_id": 151645,
            }),
        }
    }
}

impl fmt::Display for SyntheticShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SyntheticShape {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        SyntheticShape::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = SyntheticShape::ALL.iter().map(|m| m.name()).collect();
                format!(
                    "unknown synthetic model `{s}` (one of: {})",
                    names.join(", ")
                )
            })
    }
}

/// How a synthetic checkpoint stores its weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyntheticWeights {
    /// Linear layers and embeddings affine-quantized, scales and the rest
    /// bf16 (mlx-lm's `convert -q` layout).
    Quantized {
        /// Elements per quantization group.
        group_size: i32,
        /// Bits per quantized element.
        bits: i32,
    },
    /// Everything bf16.
    Bf16,
}

impl SyntheticWeights {
    fn tag(self) -> String {
        match self {
            SyntheticWeights::Quantized { group_size, bits } => format!("q{bits}g{group_size}"),
            SyntheticWeights::Bf16 => "bf16".into(),
        }
    }
}

/// The folder of `shape` with `weights` and `seed` under `root`: written on
/// first use, reused afterwards (the folder name holds all three).
pub fn synthetic_folder(
    root: &Path,
    shape: SyntheticShape,
    weights: SyntheticWeights,
    seed: u64,
) -> Result<PathBuf, ModelLoadError> {
    let dir = root.join(format!("{shape}-{}-seed{seed}", weights.tag()));
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    let partial = root.join(format!(".{shape}-{}-seed{seed}.partial", weights.tag()));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).map_err(|e| io_err(&partial, e))?;
    write_synthetic(&partial, shape, weights, seed)?;
    std::fs::rename(&partial, &dir).map_err(|e| io_err(&dir, e))?;
    Ok(dir)
}

/// Writes `shape`'s config and seeded random weights into `dir`.
pub fn write_synthetic(
    dir: &Path,
    shape: SyntheticShape,
    weights: SyntheticWeights,
    seed: u64,
) -> Result<(), ModelLoadError> {
    write_config_and_weights(dir, shape.config(), weights, seed)
}

fn write_config_and_weights(
    dir: &Path,
    mut config: serde_json::Value,
    weights: SyntheticWeights,
    seed: u64,
) -> Result<(), ModelLoadError> {
    let tensors = random_tensors(&config, weights, seed)?;
    if let SyntheticWeights::Quantized { group_size, bits } = weights {
        config["quantization"] = serde_json::json!({ "group_size": group_size, "bits": bits });
    }
    let refs: Vec<(&str, &Array)> = tensors.iter().map(|(n, a)| (n.as_str(), a)).collect();
    io::save_safetensors(dir.join("model.safetensors"), &refs, &[("format", "mlx")])
        .map_err(|e| io_err(dir, e))?;
    let path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&config).expect("a JSON value serializes");
    std::fs::write(&path, text).map_err(|e| io_err(&path, e))
}

/// Every tensor of the config's architecture, in mlx-lm's names (experts
/// stacked as `switch_mlp`), each evaluated as it is made so that only the
/// stored form is held.
fn random_tensors(
    c: &serde_json::Value,
    weights: SyntheticWeights,
    seed: u64,
) -> Result<Vec<(String, Array)>, ModelLoadError> {
    let int = |k: &str| c[k].as_i64().unwrap_or(0) as i32;
    let kind = c["model_type"].as_str().unwrap_or_default();
    let (hidden, inter, layers) = (
        int("hidden_size"),
        int("intermediate_size"),
        int("num_hidden_layers"),
    );
    let (heads, kv_heads, vocab) = (
        int("num_attention_heads"),
        int("num_key_value_heads"),
        int("vocab_size"),
    );
    let head_dim = c["head_dim"].as_i64().map_or(hidden / heads, |d| d as i32);
    let moe = kind.ends_with("_moe");
    let qk_norm = kind.starts_with("qwen3");
    let qkv_bias = kind == "qwen2_moe";
    let tied = c["tie_word_embeddings"].as_bool().unwrap_or(false);

    let mut out = Vec::new();
    let mut counter = 0u64;
    let mut add = |name: String, shape: &[i32], linear: bool| -> Result<(), ModelLoadError> {
        counter += 1;
        let key = random::key(seed.wrapping_mul(1_000_003).wrapping_add(counter))?;
        let is_norm = shape.len() == 1 && !name.ends_with(".bias");
        let w = if is_norm {
            random::normal(shape, Dtype::BF16, 1.0, 0.02, Some(&key))?
        } else {
            random::normal(shape, Dtype::BF16, 0.0, 0.02, Some(&key))?
        };
        match weights {
            SyntheticWeights::Quantized { group_size, bits } if linear => {
                let q = quantize(&w, group_size, bits)?;
                crate::eval(&[&q.weight, &q.scales, &q.biases])?;
                let prefix = name.trim_end_matches(".weight").to_string();
                out.push((format!("{prefix}.scales"), q.scales));
                out.push((format!("{prefix}.biases"), q.biases));
                out.push((name, q.weight));
            }
            _ => {
                crate::eval(&[&w])?;
                out.push((name, w));
            }
        }
        Ok(())
    };

    add("model.embed_tokens.weight".into(), &[vocab, hidden], true)?;
    add("model.norm.weight".into(), &[hidden], false)?;
    if !tied {
        add("lm_head.weight".into(), &[vocab, hidden], true)?;
    }
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (proj, n, k) in [
            ("q_proj", heads * head_dim, hidden),
            ("k_proj", kv_heads * head_dim, hidden),
            ("v_proj", kv_heads * head_dim, hidden),
            ("o_proj", hidden, heads * head_dim),
        ] {
            add(format!("{p}.self_attn.{proj}.weight"), &[n, k], true)?;
            if qkv_bias && proj != "o_proj" {
                add(format!("{p}.self_attn.{proj}.bias"), &[n], false)?;
            }
        }
        if qk_norm {
            add(format!("{p}.self_attn.q_norm.weight"), &[head_dim], false)?;
            add(format!("{p}.self_attn.k_norm.weight"), &[head_dim], false)?;
        }
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            add(format!("{p}.{norm}.weight"), &[hidden], false)?;
        }
        if moe {
            let (experts, moe_inter) = (int("num_experts"), int("moe_intermediate_size"));
            // The router stays dense, as mlx-lm's quantize leaves it when
            // the checkpoint has no scales for it.
            add(format!("{p}.mlp.gate.weight"), &[experts, hidden], false)?;
            for (proj, n, k) in [
                ("gate_proj", moe_inter, hidden),
                ("up_proj", moe_inter, hidden),
                ("down_proj", hidden, moe_inter),
            ] {
                add(
                    format!("{p}.mlp.switch_mlp.{proj}.weight"),
                    &[experts, n, k],
                    true,
                )?;
            }
            let shared = int("shared_expert_intermediate_size");
            if shared > 0 {
                for (proj, n, k) in [
                    ("gate_proj", shared, hidden),
                    ("up_proj", shared, hidden),
                    ("down_proj", hidden, shared),
                ] {
                    add(
                        format!("{p}.mlp.shared_expert.{proj}.weight"),
                        &[n, k],
                        true,
                    )?;
                }
                add(
                    format!("{p}.mlp.shared_expert_gate.weight"),
                    &[1, hidden],
                    false,
                )?;
            }
        } else {
            for (proj, n, k) in [
                ("gate_proj", inter, hidden),
                ("up_proj", inter, hidden),
                ("down_proj", hidden, inter),
            ] {
                add(format!("{p}.mlp.{proj}.weight"), &[n, k], true)?;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_choices() {
        for m in SyntheticShape::ALL {
            assert_eq!(m.name().parse::<SyntheticShape>(), Ok(m));
        }
        let err = "llama-7b".parse::<SyntheticShape>().unwrap_err();
        assert!(err.contains("qwen3-30b-a3b"), "{err}");
    }

    /// Each shape's architecture, shrunk, written and loaded by this
    /// crate's loader (every tensor name and shape it expects), quantized
    /// and bf16; a forward pass gives finite logits.
    #[test]
    fn every_architecture_loads_and_runs_shrunk() {
        for shape in SyntheticShape::ALL {
            let mut c = shape.config();
            for (k, v) in [
                ("hidden_size", 128),
                ("intermediate_size", 256),
                ("num_hidden_layers", 2),
                ("num_attention_heads", 4),
                ("num_key_value_heads", 2),
                ("vocab_size", 320),
                ("num_experts", 4),
                ("num_experts_per_tok", 2),
                ("moe_intermediate_size", 64),
            ] {
                if c.get(k).is_some() {
                    c[k] = v.into();
                }
            }
            if c.get("head_dim").is_some() {
                c["head_dim"] = 32.into();
            }
            if c.get("shared_expert_intermediate_size").is_some() {
                c["shared_expert_intermediate_size"] = 128.into();
            }
            for weights in [
                SyntheticWeights::Quantized {
                    group_size: 64,
                    bits: 4,
                },
                SyntheticWeights::Bf16,
            ] {
                let tmp = tempfile::tempdir().unwrap();
                let dir = tmp.path();
                write_config_and_weights(dir, c.clone(), weights, 7).unwrap();
                // f32 activations: MLX's CPU gather_mm (the bf16 experts)
                // takes f32 only.
                let options = crate::model::LoadOptions::for_device(crate::Device::Cpu);
                let m = crate::model::load(dir, &options)
                    .unwrap_or_else(|e| panic!("{shape} {weights:?}: {e}"))
                    .model;
                let mut caches = m.new_caches(16);
                let x = Array::from_slice(&[1u32, 5, 300], &[1, 3]).unwrap();
                let logits = m
                    .forward(&x, &mut caches, crate::model::Logits::Last)
                    .unwrap();
                assert_eq!(logits.shape(), vec![1, 1, 320], "{shape}");
                let v = logits.to_vec::<f32>().unwrap();
                assert!(v.iter().all(|x| x.is_finite()), "{shape} {weights:?}");
            }
        }
    }
}
