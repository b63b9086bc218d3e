//! GGUF (llama.cpp layout) → HF tensor names. MLX's reader already turns
//! Q4_0/Q4_1/Q8_0 blocks into affine-quantized `weight`/`scales`/`biases`
//! (group 32); bits per tensor follow from the shapes (in the default model
//! token_embd is 8-bit, the blocks 4-bit).

use super::error::ModelLoadError;
use crate::io::GgufFile;
use crate::Array;
use std::collections::BTreeMap;

/// `blk.N.<gguf>` → `model.layers.N.<hf>`.
const BLOCK_NAMES: &[(&str, &str)] = &[
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
];

const TOP_NAMES: &[(&str, &str)] = &[
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
];

fn hf_name(gguf: &str) -> Option<String> {
    let (stem, part) = gguf.rsplit_once('.')?;
    if let Some(rest) = stem.strip_prefix("blk.") {
        let (layer, module) = rest.split_once('.')?;
        let hf = BLOCK_NAMES.iter().find(|(g, _)| *g == module)?.1;
        return Some(format!("model.layers.{layer}.{hf}.{part}"));
    }
    let hf = TOP_NAMES.iter().find(|(g, _)| *g == stem)?.1;
    Some(format!("{hf}.{part}"))
}

/// All tensors of `file` under HF names; unknown tensors are an error naming them.
pub fn tensors(file: &GgufFile) -> Result<BTreeMap<String, Array>, ModelLoadError> {
    let mut out = BTreeMap::new();
    for name in file.names() {
        if name == "rope_freqs.weight" {
            continue;
        }
        let hf = hf_name(&name).ok_or_else(|| ModelLoadError::BadTensor {
            name: name.clone(),
            message: "no known mapping to a model tensor".into(),
        })?;
        out.insert(hf, file.get(&name)?);
    }
    Ok(out)
}
