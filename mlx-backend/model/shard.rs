//! Tensor-parallel sharding at load time (Megatron-style, as mlx-lm's
//! sharded models): each rank keeps only its part of every block.
//!
//! * q/k/v (and their biases) split by output rows into whole heads; rank
//!   `r` takes query heads `r·nq/n..` and KV heads `r·nkv/n..`, so every
//!   query head keeps the KV head it attends with (GQA groups stay whole).
//! * gate/up split by output rows, down by input columns; o by input
//!   columns. The block's partial outputs are then summed over the group
//!   (one `all_sum` after attention, one after the MLP).
//! * MoE: the stacked experts split by expert, each rank owning whole
//!   experts; the router is replicated and each rank combines only the
//!   experts it owns, the sum over ranks giving the full combine. A shared
//!   expert splits like a dense MLP.
//! * Embeddings, norms (q/k norms act per head) and the head are replicated.
//!
//! Quantized matrices split along the same axes: by rows freely, by input
//! columns only at group boundaries (the packed words and the per-group
//! scales/biases split together). Every size is checked before a tensor is
//! touched, and [`ModelLoadError::NotShardable`] names the one that does not
//! divide. A kept part is copied out of the checkpoint's buffer, so a rank
//! holds its shard only.

use super::config::ModelConfig;
use super::error::ModelLoadError;
use crate::{ffi, Array};
use std::collections::BTreeMap;

/// How one matrix of a block splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    /// Output rows (axis 0 of a 2-D weight, of a bias, of scales/biases).
    Rows,
    /// Input columns (the last axis).
    Columns,
    /// Whole experts (axis 0 of a stacked `[E, N, K]` tensor).
    Experts,
}

/// The sizes sharding divides, checked before anything is loaded.
/// `group_size` is the quantization group of the column-split matrices
/// (`None` for dense weights).
pub(crate) fn check(
    config: &ModelConfig,
    ranks: usize,
    group_size: Option<usize>,
) -> Result<(), ModelLoadError> {
    let not = |what: &'static str, size: usize| ModelLoadError::NotShardable {
        what: what.into(),
        size,
        ranks,
    };
    if ranks == 0 {
        return Err(not("the group", 0));
    }
    let c = config;
    if !c.num_key_value_heads.is_multiple_of(ranks) {
        // Whole KV heads per rank; replicating KV heads is not implemented.
        return Err(not("num_key_value_heads", c.num_key_value_heads));
    }
    if !c.num_attention_heads.is_multiple_of(ranks) {
        return Err(not("num_attention_heads", c.num_attention_heads));
    }
    let mut column_split = vec![("attention output width", c.num_attention_heads * c.head_dim)];
    let dense_layers = match &c.moe {
        None => true,
        Some(m) => (0..c.num_hidden_layers).any(|i| !m.is_sparse_layer(i)),
    };
    if dense_layers {
        column_split.push(("intermediate_size", c.intermediate_size));
    }
    if let Some(m) = &c.moe {
        if !m.num_experts.is_multiple_of(ranks) {
            return Err(not("num_experts", m.num_experts));
        }
        if m.shared_expert_intermediate_size > 0 {
            column_split.push((
                "shared_expert_intermediate_size",
                m.shared_expert_intermediate_size,
            ));
        }
    }
    for (what, size) in column_split {
        if !size.is_multiple_of(ranks) {
            return Err(not(what, size));
        }
        if let Some(g) = group_size {
            if !(size / ranks).is_multiple_of(g) {
                return Err(ModelLoadError::NotShardable {
                    what: format!("{what} (per rank, in quantization groups of {g})"),
                    size,
                    ranks,
                });
            }
        }
    }
    Ok(())
}

/// The hyperparameters of one rank's shard: its heads and intermediate
/// widths (the expert count stays the router's; see [`experts_per_rank`]).
pub(crate) fn shard_config(config: &ModelConfig, ranks: usize) -> ModelConfig {
    let mut c = config.clone();
    c.num_attention_heads /= ranks;
    c.num_key_value_heads /= ranks;
    c.intermediate_size /= ranks;
    if let Some(m) = &mut c.moe {
        m.shared_expert_intermediate_size /= ranks;
    }
    c
}

/// The experts each rank owns.
pub(crate) fn experts_per_rank(num_experts: usize, ranks: usize) -> usize {
    num_experts / ranks
}

/// How the tensor `name` splits, or `None` when it is replicated.
fn split_of(name: &str) -> Option<Split> {
    let (prefix, _part) = name.rsplit_once('.')?;
    let module = prefix.rsplit('.').next()?;
    if prefix.contains(".switch_mlp.") {
        return Some(Split::Experts);
    }
    match module {
        "q_proj" | "k_proj" | "v_proj" | "gate_proj" | "up_proj" => Some(Split::Rows),
        "o_proj" | "down_proj" => Some(Split::Columns),
        _ => None,
    }
}

/// Keep rank `rank`'s part of every split tensor (of a model whose sizes
/// passed [`check`]).
pub(crate) fn shard_tensors(
    tensors: &mut BTreeMap<String, Array>,
    rank: usize,
    ranks: usize,
) -> Result<(), ModelLoadError> {
    let names: Vec<(String, Split)> = tensors
        .keys()
        .filter(|n| n.starts_with("model.layers."))
        .filter_map(|n| split_of(n).map(|s| (n.clone(), s)))
        .collect();
    for (name, split) in names {
        let t = &tensors[&name];
        let shape = t.shape();
        let axis = match split {
            Split::Rows | Split::Experts => 0,
            // A 1-D tensor of a column-split layer (a bias) is per output: whole.
            Split::Columns if shape.len() < 2 => continue,
            Split::Columns => shape.len() - 1,
        };
        let size = shape[axis] as usize;
        if !size.is_multiple_of(ranks) {
            return Err(ModelLoadError::NotShardable {
                what: format!("{name} axis {axis}"),
                size,
                ranks,
            });
        }
        let part = size / ranks;
        let kept = copy_part(
            t,
            axis as i32,
            (rank * part) as i32,
            ((rank + 1) * part) as i32,
        )?;
        tensors.insert(name, kept);
    }
    Ok(())
}

/// `t[start..stop]` along `axis` as a fresh dense array: a slice view would
/// keep the whole checkpoint tensor alive.
fn copy_part(t: &Array, axis: i32, start: i32, stop: i32) -> Result<Array, ModelLoadError> {
    let part = t.slice_axis(axis, start, stop)?;
    part.eval()?;
    let mut bytes = vec![0u8; part.nbytes()];
    ffi::copy_to_host(part.inner(), &mut bytes).map_err(|e| crate::EvalError {
        message: e.what().to_string(),
    })?;
    let copy = ffi::from_bytes(&bytes, &part.shape(), part.dtype().code())
        .map_err(crate::OpError::from_cxx("shard_copy"))?;
    Ok(Array::from_raw(copy))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_as_megatron_does() {
        let s = |n: &str| split_of(n);
        assert_eq!(
            s("model.layers.0.self_attn.q_proj.weight"),
            Some(Split::Rows)
        );
        assert_eq!(s("model.layers.0.self_attn.k_proj.bias"), Some(Split::Rows));
        assert_eq!(
            s("model.layers.0.self_attn.v_proj.scales"),
            Some(Split::Rows)
        );
        assert_eq!(
            s("model.layers.3.self_attn.o_proj.biases"),
            Some(Split::Columns)
        );
        assert_eq!(
            s("model.layers.1.mlp.down_proj.weight"),
            Some(Split::Columns)
        );
        assert_eq!(s("model.layers.1.mlp.up_proj.weight"), Some(Split::Rows));
        assert_eq!(
            s("model.layers.1.mlp.switch_mlp.down_proj.weight"),
            Some(Split::Experts)
        );
        assert_eq!(
            s("model.layers.1.mlp.shared_expert.down_proj.weight"),
            Some(Split::Columns)
        );
        assert_eq!(s("model.layers.1.mlp.gate.weight"), None);
        assert_eq!(s("model.layers.1.mlp.shared_expert_gate.weight"), None);
        assert_eq!(s("model.layers.1.self_attn.q_norm.weight"), None);
        assert_eq!(s("model.embed_tokens.weight"), None);
    }

    #[test]
    fn rows_and_columns_keep_their_part() {
        let data: Vec<f32> = (0..24).map(|x| x as f32).collect();
        let t = Array::from_slice(&data, &[4, 6]).unwrap();
        let mut m = BTreeMap::new();
        m.insert("model.layers.0.mlp.up_proj.weight".to_string(), t.clone());
        m.insert("model.layers.0.mlp.down_proj.weight".to_string(), t);
        shard_tensors(&mut m, 1, 2).unwrap();
        let up = m["model.layers.0.mlp.up_proj.weight"]
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(up, (12..24).map(|x| x as f32).collect::<Vec<_>>());
        let down = m["model.layers.0.mlp.down_proj.weight"]
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(
            down,
            vec![3.0, 4.0, 5.0, 9.0, 10.0, 11.0, 15.0, 16.0, 17.0, 21.0, 22.0, 23.0]
        );
        let t = Array::from_slice(&data, &[4, 6]).unwrap();
        let mut m = BTreeMap::new();
        m.insert("model.layers.0.mlp.up_proj.weight".to_string(), t);
        assert!(matches!(
            shard_tensors(&mut m, 0, 3),
            Err(ModelLoadError::NotShardable {
                size: 4,
                ranks: 3,
                ..
            })
        ));
    }
}
