//! Reference runs the runner and engine tests compare against: the default
//! model's cached path, and one request generated alone.

use mlx_backend::model::fetch;
use mlx_backend::runner::{
    ForwardBatch, ForwardMode, MlxModelRunner, ModelRunner, RequestId, RequestInput, SamplingParams,
};
use std::path::PathBuf;

/// The default model when it is in the cache; otherwise says how to fetch
/// it (the test then skips).
pub fn cached_default_model() -> Option<PathBuf> {
    let p = fetch::default_model_path();
    if p.is_file() {
        Some(p)
    } else {
        eprintln!("default model not in the cache: run scripts/fetch-default-model.sh");
        None
    }
}

/// Greedy generation of one request alone: the prompt in one chunk, then
/// one decode step at a time, until `max_tokens` tokens or one of `eos`
/// (included). The request is released at the end.
pub fn solo_greedy(
    r: &mut MlxModelRunner,
    id: RequestId,
    prompt: &[u32],
    max_tokens: usize,
    eos: &[u32],
) -> Vec<u32> {
    let out = r
        .forward(&ForwardBatch::new(
            ForwardMode::Extend,
            vec![RequestInput::prompt(
                id,
                prompt.to_vec(),
                SamplingParams::greedy(),
            )],
        ))
        .unwrap();
    let mut generated = vec![out.outputs[0].next_token.unwrap()];
    while generated.len() < max_tokens && !eos.contains(generated.last().unwrap()) {
        let d = RequestInput::decode(
            id,
            *generated.last().unwrap(),
            prompt.len() + generated.len() - 1,
            SamplingParams::greedy(),
        );
        let out = r
            .forward(&ForwardBatch::new(ForwardMode::Decode, vec![d]))
            .unwrap();
        generated.push(out.outputs[0].next_token.unwrap());
    }
    r.release(&[id]);
    generated
}
