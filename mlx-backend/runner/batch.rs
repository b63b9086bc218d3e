//! The per-forward-batch contract: what the engine sends and gets back
//! (SGLang's ForwardBatch / output of MlxModelRunner, in Rust).

use std::time::Duration;

/// A request's id, chosen by the engine.
pub type RequestId = u64;

/// What kind of batch this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardMode {
    /// Prompt chunks (new requests or continued prefill).
    Extend,
    /// One new token for each running request.
    Decode,
    /// Prefill chunks and decode tokens together.
    Mixed,
    /// Nothing to run.
    Idle,
}

/// How to pick the next token. The defaults are greedy and switch every
/// other transform off.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy (argmax).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: u32,
    /// Keep the smallest set whose probability reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely; 0 keeps all.
    pub min_p: f32,
    /// HF-style: positive logits of seen tokens divided by it, negative multiplied; 1 is off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every seen token.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every seen token.
    pub frequency_penalty: f32,
    /// Added to the logits of these token ids.
    pub logit_bias: Vec<(u32, f32)>,
    /// Reproducible sampling: the same seed gives the same tokens.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Always the most likely token (the defaults).
    pub fn greedy() -> Self {
        Self::default()
    }

    pub(crate) fn uses_history(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// What to return besides the next token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReturnOptions {
    /// The sampled token's log-probability.
    pub logprob: bool,
    /// The `n` most likely tokens with their log-probabilities (0: none).
    pub top_logprobs: usize,
    /// The full float32 logits of the last position.
    pub logits: bool,
}

/// One request's part of a batch.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestInput {
    /// The request.
    pub id: RequestId,
    /// A prompt chunk (Extend) or the single decode token.
    pub tokens: Vec<u32>,
    /// How many of the request's tokens the runner already holds (checked).
    pub cached_tokens: usize,
    /// How to pick its next token.
    pub sampling: SamplingParams,
    /// What to return besides the token.
    pub returns: ReturnOptions,
    /// For prompt chunks: whether this is the last one (only it samples).
    pub last_chunk: bool,
}

impl RequestInput {
    /// A whole prompt in one Extend chunk.
    pub fn prompt(id: RequestId, tokens: Vec<u32>, sampling: SamplingParams) -> Self {
        RequestInput {
            id,
            tokens,
            cached_tokens: 0,
            sampling,
            returns: ReturnOptions::default(),
            last_chunk: true,
        }
    }

    /// A prompt chunk starting after `cached_tokens`.
    pub fn chunk(
        id: RequestId,
        tokens: Vec<u32>,
        cached_tokens: usize,
        last_chunk: bool,
        sampling: SamplingParams,
    ) -> Self {
        RequestInput {
            id,
            tokens,
            cached_tokens,
            sampling,
            returns: ReturnOptions::default(),
            last_chunk,
        }
    }

    /// One decode token for a running request.
    pub fn decode(
        id: RequestId,
        token: u32,
        cached_tokens: usize,
        sampling: SamplingParams,
    ) -> Self {
        RequestInput {
            id,
            tokens: vec![token],
            cached_tokens,
            sampling,
            returns: ReturnOptions::default(),
            last_chunk: true,
        }
    }

    /// Asks for `returns` with the token.
    pub fn with_returns(mut self, returns: ReturnOptions) -> Self {
        self.returns = returns;
        self
    }
}

/// A batch for one forward pass.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardBatch {
    /// What kind of pass this is.
    pub mode: ForwardMode,
    /// Each request's part, in output order.
    pub requests: Vec<RequestInput>,
}

impl ForwardBatch {
    /// A batch of `requests` in `mode`.
    pub fn new(mode: ForwardMode, requests: Vec<RequestInput>) -> Self {
        ForwardBatch { mode, requests }
    }

    /// An empty batch (nothing runs).
    pub fn idle() -> Self {
        ForwardBatch {
            mode: ForwardMode::Idle,
            requests: Vec::new(),
        }
    }
}

/// One request's result, in batch order.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestOutput {
    /// The request.
    pub id: RequestId,
    /// The sampled token; None for a prompt chunk that is not the last.
    pub next_token: Option<u32>,
    /// The sampled token's log-probability, when asked for.
    pub logprob: Option<f32>,
    /// Most likely tokens first.
    pub top_logprobs: Vec<(u32, f32)>,
    /// The last position's float32 logits, when asked for.
    pub logits: Option<Vec<f32>>,
}

/// The result of one forward pass.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardOutput {
    /// One per request of the batch, in batch order.
    pub outputs: Vec<RequestOutput>,
    /// Building and evaluating the model graph.
    pub forward_time: Duration,
    /// Of `forward_time`, building the graph on the host (before MLX
    /// evaluates it).
    pub build_time: Duration,
    /// Sampling and reading tokens back.
    pub sample_time: Duration,
}
