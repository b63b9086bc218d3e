//! Models: Llama/SmolLM2, Qwen2, Qwen3, Qwen2-MoE and Qwen3-MoE over shared
//! layers, loaded from HF folders (f32/f16/bf16 safetensors), mlx-community
//! quantized folders, or GGUF files. The forward pass takes per-layer KV
//! caches from the caller.

pub mod config;
mod error;
pub mod fetch;
mod fused;
mod gguf;
pub mod kv_cache;
mod layers;
mod llama;
mod qwen2;
mod qwen3;
mod qwen_moe;
mod shard;
pub mod synthetic;
mod transformer;
mod weights;

pub use config::{Architecture, ModelConfig, MoeConfig, QuantConfig, RopeScaling};
pub use error::{ForwardError, ModelLoadError};
pub use kv_cache::LayerKvCache;
pub use transformer::{Logits, Transformer};

use crate::io::{GgufFile, SafetensorsFile};
use crate::kernels::ActivationPrecision;
use crate::ops::QuantSpec;
use crate::{Array, Dtype};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use weights::Weights;

/// Options for [`load`].
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Cast floating tensors (norms, dense weights) to this dtype; the
    /// scales and biases of quantized tensors are cast only when it is
    /// narrower than theirs (f32 keeps a GGUF's f16 scales: same values,
    /// fewer bytes per step). `None` keeps a checkpoint's dtypes, except
    /// that a GGUF file runs in f32 (its norms are f32, which widens the
    /// graph's activations to f32 anyway).
    pub dtype: Option<Dtype>,
    /// Quantize an unquantized checkpoint on load with these parameters.
    pub quantize: Option<QuantSpec>,
    /// Activation precision of the quantized layers' CPU kernels
    /// (`quantized_matmul`, `gate_qmv_silu_mul`); no effect where they fall
    /// back to MLX's graph (GPU streams, ineligible inputs).
    pub activations: ActivationPrecision,
}

impl LoadOptions {
    /// What runs fastest on `device`: on the CPU, floating tensors in f32
    /// (MLX's CPU half-precision ops convert element by element, and f32 is
    /// at least as accurate) and int16 activations in the quantized kernels
    /// (x rounded per word of W, ~1e-5 of a projection: the default model's
    /// greedy tokens equal both oracles' and its logits stay as close to
    /// mlx-lm's f32 ones as exact x, while prefill runs ~1.3× faster); on a
    /// GPU, the checkpoint's own dtypes. Int8 activations change the default
    /// model's greedy tokens on one of the goldens, so they are opt-in;
    /// `ActivationPrecision::Exact` gives MLX's result to f32 rounding.
    /// (A GGUF file runs in f32 on either device; see `dtype`.)
    pub fn for_device(device: crate::Device) -> LoadOptions {
        let cpu = device == crate::Device::Cpu;
        LoadOptions {
            dtype: cpu.then_some(Dtype::F32),
            quantize: None,
            activations: if cpu {
                ActivationPrecision::Int16
            } else {
                ActivationPrecision::Exact
            },
        }
    }
}

/// Where a model came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelFormat {
    /// A single GGUF file.
    Gguf,
    /// An HF or mlx-community folder (`config.json` and safetensors).
    HfFolder,
}

/// A loaded model and its origin.
pub struct LoadedModel {
    /// The model.
    pub model: Transformer,
    /// The format it was loaded from.
    pub format: ModelFormat,
    /// The file or folder it was loaded from.
    pub path: PathBuf,
}

/// Load a GGUF file or an HF-style folder (config.json + safetensors).
pub fn load(path: impl AsRef<Path>, options: &LoadOptions) -> Result<LoadedModel, ModelLoadError> {
    let path = path.as_ref();
    if path.is_dir() {
        let (config, tensors) = read_hf_folder(path)?;
        let model = build(config, tensors, false, options, None)?;
        return Ok(LoadedModel {
            model,
            format: ModelFormat::HfFolder,
            path: path.to_path_buf(),
        });
    }
    load_gguf(&GgufFile::load(path)?, options)
}

/// Build the model of a GGUF file already read, so the caller can take its
/// tokenizer and chat template from the same read.
pub fn load_gguf(file: &GgufFile, options: &LoadOptions) -> Result<LoadedModel, ModelLoadError> {
    let config = ModelConfig::from_gguf(file)?;
    let tensors = gguf::tensors(file)?;
    // GGUF keeps norms in f32, so MLX's graph widens every activation to
    // f32 at the first norm anyway: without a dtype asked for, the model
    // runs in f32 throughout (embedding rows and caches too; the quantized
    // scales keep their dtype), which the fused decode step takes.
    let options = LoadOptions {
        dtype: options.dtype.or(Some(Dtype::F32)),
        ..options.clone()
    };
    let model = build(config, tensors, true, &options, None)?;
    Ok(LoadedModel {
        model,
        format: ModelFormat::Gguf,
        path: PathBuf::from(file.path()),
    })
}

/// Load this rank's tensor-parallel shard of a GGUF file or HF folder
/// (Megatron-style; the rules are in docs/distributed.md): attention heads,
/// MLP widths and experts divided over `group`, whose ranks must all load
/// the same model with the same options. The sizes are checked before any
/// tensor is read: [`ModelLoadError::NotShardable`] names the one that does
/// not divide. The model's `config` then describes the shard (its heads
/// and widths per rank).
pub fn load_shard(
    path: impl AsRef<Path>,
    options: &LoadOptions,
    group: &crate::distributed::Group,
) -> Result<LoadedModel, ModelLoadError> {
    let path = path.as_ref();
    let ranks = group.size();
    let quant_group = |config: &ModelConfig, gguf: bool| {
        config
            .quantization
            .as_ref()
            .map(|q| q.default.group_size as usize)
            .or(options.quantize.map(|q| q.group_size as usize))
            .or(gguf.then_some(32))
    };
    if path.is_dir() {
        let config_path = path.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(|e| io_err(&config_path, e))?;
        let config = ModelConfig::from_json(&text, &config_path.display().to_string())?;
        shard::check(&config, ranks, quant_group(&config, false))?;
        let (config, tensors) = read_hf_folder(path)?;
        let model = build(config, tensors, false, options, Some(group))?;
        return Ok(LoadedModel {
            model,
            format: ModelFormat::HfFolder,
            path: path.to_path_buf(),
        });
    }
    let file = GgufFile::load(path)?;
    let config = ModelConfig::from_gguf(&file)?;
    shard::check(&config, ranks, quant_group(&config, true))?;
    let tensors = gguf::tensors(&file)?;
    let options = LoadOptions {
        dtype: options.dtype.or(Some(Dtype::F32)),
        ..options.clone()
    };
    let model = build(config, tensors, true, &options, Some(group))?;
    Ok(LoadedModel {
        model,
        format: ModelFormat::Gguf,
        path: path.to_path_buf(),
    })
}

fn build(
    config: ModelConfig,
    mut tensors: BTreeMap<String, Array>,
    from_gguf: bool,
    options: &LoadOptions,
    tensor_parallel: Option<&crate::distributed::Group>,
) -> Result<Transformer, ModelLoadError> {
    qwen_moe::stack_experts(&mut tensors, &config)?;
    let mut weights = Weights::new(tensors, config.quantization.clone(), from_gguf);
    weights.set_activations(options.activations);
    if let Some(dtype) = options.dtype {
        weights.cast_floats(dtype)?;
    }
    let mut config = config;
    if let Some(spec) = options.quantize {
        if config.quantization.is_none() && !from_gguf {
            // Norms and the MoE router stay dense, as mlx-lm's quantize does for
            // layers whose input size the group does not divide.
            weights.quantize_linears(spec, |name| {
                name.contains("norm") || name.ends_with("mlp.gate.weight")
            })?;
            config.quantization = Some(QuantConfig {
                default: spec,
                overrides: Vec::new(),
            });
        }
    }
    if let Some(group) = tensor_parallel.filter(|g| g.size() > 1) {
        // Quantized first (as one process would), then split: each rank's
        // groups are exactly the single-process model's.
        shard::check(&config, group.size(), None)?;
        shard::shard_tensors(weights.tensors_mut(), group.rank(), group.size())?;
        config = shard::shard_config(&config, group.size());
        weights.set_tensor_parallel(group.clone());
    }
    match config.architecture {
        Architecture::Llama => llama::load(config, &weights),
        Architecture::Qwen2 => qwen2::load(config, &weights),
        Architecture::Qwen3 => qwen3::load(config, &weights),
        Architecture::Qwen2Moe | Architecture::Qwen3Moe => qwen_moe::load(config, &weights),
    }
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> ModelLoadError {
    ModelLoadError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// The config and all tensors of an HF / mlx-community folder.
fn read_hf_folder(dir: &Path) -> Result<(ModelConfig, BTreeMap<String, Array>), ModelLoadError> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| io_err(&config_path, e))?;
    let config = ModelConfig::from_json(&text, &config_path.display().to_string())?;
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<PathBuf> = if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| io_err(&index, e))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| io_err(&index, e))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| io_err(&index, "no weight_map"))?;
        let mut files: Vec<String> = map
            .values()
            .filter_map(|f| f.as_str().map(String::from))
            .collect();
        files.sort();
        files.dedup();
        files.into_iter().map(|f| dir.join(f)).collect()
    } else {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| io_err(dir, e))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|e| e == "safetensors")
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("model"))
            })
            .collect();
        files.sort();
        files
    };
    if files.is_empty() {
        return Err(io_err(dir, "no model*.safetensors files"));
    }
    let mut tensors = BTreeMap::new();
    for f in files {
        let file = SafetensorsFile::load(&f)?;
        tensors.extend(file.tensors()?);
    }
    Ok((config, tensors))
}
