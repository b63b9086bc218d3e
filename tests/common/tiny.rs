//! A tiny random Llama written to a temp folder, so runner tests run in
//! milliseconds per step.

use super::temp_dir;
use mlx_backend::model::{self, LoadOptions};
use mlx_backend::ops::random;
use mlx_backend::{io, Array, Dtype};
use tempfile::TempDir;

pub const VOCAB: i32 = 384;
pub const HIDDEN: i32 = 64;
pub const LAYERS: i32 = 2;
pub const HEADS: i32 = 4;
pub const KV_HEADS: i32 = 2;
pub const HEAD_DIM: i32 = 16;
pub const INTER: i32 = 128;

/// A random tiny Llama (4-bit quantized when `quantized`) as an HF folder in
/// a temp dir, removed when the returned guard drops: keep it alive while the
/// folder is in use and pass `.path()`.
pub fn tiny_llama_folder(seed: u64, quantized: bool) -> TempDir {
    let tmp = temp_dir("tiny-llama");
    let dir = tmp.path();
    let key = random::key(seed).unwrap();
    let keys = random::split(&key, 64).unwrap();
    let mut next = 0;
    let mut rand = |shape: &[i32], scale: f32| -> Array {
        let k = keys
            .slice_axis(0, next, next + 1)
            .unwrap()
            .reshape(&[2])
            .unwrap();
        next += 1;
        random::normal(shape, Dtype::F32, 0.0, scale, Some(&k)).unwrap()
    };
    let mut tensors: Vec<(String, Array)> = vec![
        (
            "model.embed_tokens.weight".into(),
            rand(&[VOCAB, HIDDEN], 0.5),
        ),
        (
            "model.norm.weight".into(),
            rand(&[HIDDEN], 0.1).add_scalar(1.0).unwrap(),
        ),
    ];
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        for (name, shape) in [
            ("self_attn.q_proj", [HEADS * HEAD_DIM, HIDDEN]),
            ("self_attn.k_proj", [KV_HEADS * HEAD_DIM, HIDDEN]),
            ("self_attn.v_proj", [KV_HEADS * HEAD_DIM, HIDDEN]),
            ("self_attn.o_proj", [HIDDEN, HEADS * HEAD_DIM]),
            ("mlp.gate_proj", [INTER, HIDDEN]),
            ("mlp.up_proj", [INTER, HIDDEN]),
            ("mlp.down_proj", [HIDDEN, INTER]),
        ] {
            tensors.push((format!("{p}.{name}.weight"), rand(&shape, 0.15)));
        }
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            tensors.push((
                format!("{p}.{norm}.weight"),
                rand(&[HIDDEN], 0.1).add_scalar(1.0).unwrap(),
            ));
        }
    }
    let mut quant_block = String::new();
    if quantized {
        let mut out = Vec::new();
        for (name, a) in tensors {
            if a.ndim() == 2 && name.ends_with(".weight") {
                let q = mlx_backend::ops::quantize(&a, 32, 4).unwrap();
                let prefix = name.trim_end_matches(".weight");
                out.push((format!("{prefix}.scales"), q.scales));
                out.push((format!("{prefix}.biases"), q.biases));
                out.push((name, q.weight));
            } else {
                out.push((name, a));
            }
        }
        tensors = out;
        quant_block = r#", "quantization": {"group_size": 32, "bits": 4}"#.into();
    }
    let refs: Vec<(&str, &Array)> = tensors.iter().map(|(n, a)| (n.as_str(), a)).collect();
    io::save_safetensors(dir.join("model.safetensors"), &refs, &[]).unwrap();
    let config = format!(
        r#"{{"model_type": "llama", "hidden_size": {HIDDEN}, "num_hidden_layers": {LAYERS},
            "num_attention_heads": {HEADS}, "num_key_value_heads": {KV_HEADS}, "head_dim": {HEAD_DIM},
            "intermediate_size": {INTER}, "vocab_size": {VOCAB}, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": true,
            "eos_token_id": 2{quant_block}}}"#
    );
    std::fs::write(dir.join("config.json"), config).unwrap();
    tmp
}

/// A tiny Llama loaded from a temp folder that is removed on return: the
/// lazily loaded weights keep their files open, so they still evaluate.
pub fn load_tiny(seed: u64, quantized: bool) -> model::Transformer {
    let folder = tiny_llama_folder(seed, quantized);
    model::load(folder.path(), &LoadOptions::default())
        .unwrap()
        .model
}

/// A deterministic pseudo-random token sequence.
pub fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % (VOCAB as u64 - 3) + 3) as u32
        })
        .collect()
}

/// A runner over a fresh 4-bit tiny Llama with the default config.
pub fn runner(seed: u64) -> mlx_backend::runner::MlxModelRunner {
    mlx_backend::runner::MlxModelRunner::new(load_tiny(seed, true), Default::default())
}
