//! Llama (and SmolLM2, Mistral): the plain pre-norm SwiGLU decoder.

use super::config::ModelConfig;
use super::error::ModelLoadError;
use super::layers::Mlp;
use super::transformer::{FeedForward, Transformer};
use super::weights::Weights;

pub fn load(config: ModelConfig, w: &Weights) -> Result<Transformer, ModelLoadError> {
    let (h, inter) = (config.hidden_size, config.intermediate_size);
    Transformer::load(config, w, |w, p, _| {
        Ok(FeedForward::Dense(Mlp::load(w, p, h, inter)?))
    })
}
