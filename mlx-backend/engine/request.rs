//! What a caller submits and what comes back, event by event.

use super::error::EngineError;
use crate::runner::SamplingParams;
use crate::tokenizer::ChatMessage;
use std::time::Duration;

/// The input of a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Token ids, sent as they are.
    Tokens(Vec<u32>),
    /// Text, tokenized with the model's BOS rule; special-token text in it
    /// (e.g. `<|im_start|>`) becomes the special token.
    Text(String),
    /// Chat messages, rendered with the model's chat template and a
    /// generation prompt.
    Chat(Vec<ChatMessage>),
}

/// One generation request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateRequest {
    /// What to generate from.
    pub prompt: Prompt,
    /// How to pick each token (greedy by default).
    pub sampling: SamplingParams,
    /// Most tokens to generate; None: the engine's default, capped by the
    /// context left after the prompt.
    pub max_tokens: Option<usize>,
    /// Stop when one of these texts appears; it is not part of the output,
    /// and no part of it is ever streamed.
    pub stop: Vec<String>,
    /// Stop at these token ids, as at EOS.
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS (until `max_tokens` or a stop).
    pub ignore_eos: bool,
    /// Return each sampled token's log-probability.
    pub logprobs: bool,
    /// Return the n most likely tokens at each step (0: none).
    pub top_logprobs: usize,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: bool,
}

impl GenerateRequest {
    /// A greedy request with the engine's defaults for everything else.
    pub fn new(prompt: Prompt) -> Self {
        GenerateRequest {
            prompt,
            sampling: SamplingParams::greedy(),
            max_tokens: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: false,
            top_logprobs: 0,
            skip_special_tokens: true,
        }
    }

    /// A request from chat messages (rendered with the chat template).
    pub fn chat(messages: Vec<ChatMessage>) -> Self {
        Self::new(Prompt::Chat(messages))
    }

    /// A request from plain text (no chat template).
    pub fn text(text: impl Into<String>) -> Self {
        Self::new(Prompt::Text(text.into()))
    }

    /// A request from token ids.
    pub fn tokens(ids: Vec<u32>) -> Self {
        Self::new(Prompt::Tokens(ids))
    }

    /// Generates at most `n` tokens.
    pub fn with_max_tokens(mut self, n: usize) -> Self {
        self.max_tokens = Some(n);
        self
    }

    /// Samples with `sampling`.
    pub fn with_sampling(mut self, sampling: SamplingParams) -> Self {
        self.sampling = sampling;
        self
    }

    /// Stops at any of these texts.
    pub fn with_stop(mut self, stop: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.stop = stop.into_iter().map(Into::into).collect();
        self
    }
}

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// Cancelled: the stream was dropped, the request aborted, or the
    /// engine shut down.
    Abort,
    /// The runner failed for this request ([`Finished::error`] says why).
    Error,
}

impl FinishReason {
    /// The OpenAI API's name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }
}

/// A sampled token with what was asked about it.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledToken {
    /// The token id.
    pub id: u32,
    /// Its log-probability, when asked for.
    pub logprob: Option<f32>,
    /// Most likely first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Token counts of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the prompt as run (after the chat template).
    pub prompt_tokens: usize,
    /// Sampled tokens, an EOS or stop token included.
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
}

/// The end of a request.
#[derive(Clone, Debug)]
pub struct Finished {
    /// Why the request ended.
    pub reason: FinishReason,
    /// Its token counts.
    pub usage: Usage,
    /// From submission to the first sampled token.
    pub time_to_first_token: Option<Duration>,
    /// From submission to the end.
    pub total_time: Duration,
    /// Set when `reason` is [`FinishReason::Error`].
    pub error: Option<EngineError>,
}

/// What a request's stream yields: deltas, then exactly one `Finished`.
#[derive(Clone, Debug)]
pub enum Event {
    /// One sampled token (or, at the end, only text held back until then).
    /// `text` may be empty: it is held back while it could still become a
    /// stop string or an incomplete character.
    Delta {
        /// Text that may be shown now.
        text: String,
        /// The token sampled, if any.
        token: Option<SampledToken>,
    },
    /// The request ended; the last event.
    Finished(Finished),
}
