//! Qwen3: Llama's block with a per-head RMSNorm on q and k before RoPE
//! (`ModelConfig::qk_norm`, always on for this family).

use super::config::ModelConfig;
use super::error::ModelLoadError;
use super::transformer::Transformer;
use super::weights::Weights;

pub fn load(config: ModelConfig, w: &Weights) -> Result<Transformer, ModelLoadError> {
    super::llama::load(config, w)
}
