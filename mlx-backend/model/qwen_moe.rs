//! Qwen2-MoE and Qwen3-MoE: sparse MoE blocks (softmax router, top-k by
//! argpartition, SwitchGLU experts) on the layers `MoeConfig::is_sparse_layer`
//! selects, dense MLPs elsewhere; Qwen2-MoE adds a sigmoid-gated shared
//! expert, Qwen3-MoE renormalises the top-k scores (`norm_topk_prob`) and
//! uses Qwen3's q/k norms.

use super::config::ModelConfig;
use super::error::ModelLoadError;
use super::layers::{Mlp, SparseMoe};
use super::transformer::{FeedForward, Transformer};
use super::weights::Weights;

pub fn load(config: ModelConfig, w: &Weights) -> Result<Transformer, ModelLoadError> {
    let moe = config
        .moe
        .clone()
        .ok_or_else(|| ModelLoadError::MissingConfigKey {
            path: "config.json".into(),
            key: "num_experts".into(),
        })?;
    let (h, inter) = (config.hidden_size, config.intermediate_size);
    let c = config.clone();
    Transformer::load(config, w, move |w, p, i| {
        if moe.is_sparse_layer(i) {
            Ok(FeedForward::Sparse(Box::new(SparseMoe::load(
                w, p, &c, &moe,
            )?)))
        } else {
            Ok(FeedForward::Dense(Mlp::load(w, p, h, inter)?))
        }
    })
}

/// HF checkpoints store experts one by one
/// (`mlp.experts.{e}.gate_proj.weight`); stack them into mlx-lm's
/// `mlp.switch_mlp.gate_proj.weight [E, N, K]` (and scales/biases alike).
pub fn stack_experts(
    tensors: &mut std::collections::BTreeMap<String, crate::Array>,
    config: &ModelConfig,
) -> Result<(), ModelLoadError> {
    let Some(moe) = &config.moe else {
        return Ok(());
    };
    for layer in 0..config.num_hidden_layers {
        for proj in ["gate_proj", "up_proj", "down_proj"] {
            for part in ["weight", "scales", "biases"] {
                let name = |e: usize| format!("model.layers.{layer}.mlp.experts.{e}.{proj}.{part}");
                if !tensors.contains_key(&name(0)) {
                    continue;
                }
                let mut experts = Vec::with_capacity(moe.num_experts);
                for e in 0..moe.num_experts {
                    experts.push(
                        tensors
                            .remove(&name(e))
                            .ok_or_else(|| ModelLoadError::MissingTensor(name(e)))?,
                    );
                }
                let refs: Vec<&crate::Array> = experts.iter().collect();
                let stacked = crate::ops::stack(&refs, 0)?;
                tensors.insert(
                    format!("model.layers.{layer}.mlp.switch_mlp.{proj}.{part}"),
                    stacked,
                );
            }
        }
    }
    Ok(())
}
