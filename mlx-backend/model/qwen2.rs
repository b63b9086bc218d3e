//! Qwen2: Llama's block with biases on the q/k/v projections
//! (`ModelConfig::attention_bias`, on by default for this family).

use super::config::ModelConfig;
use super::error::ModelLoadError;
use super::transformer::Transformer;
use super::weights::Weights;

pub fn load(config: ModelConfig, w: &Weights) -> Result<Transformer, ModelLoadError> {
    super::llama::load(config, w)
}
