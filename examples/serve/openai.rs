//! The OpenAI API's request and response bodies, and their translation to
//! engine requests. Unknown fields are ignored, as OpenAI-compatible
//! servers do; known fields with bad values are 400s naming the field.

use mlx_backend::engine::{FinishReason, GenerateRequest, Prompt, SampledToken, Usage};
use mlx_backend::runner::SamplingParams;
use mlx_backend::tokenizer::{ChatMessage, Tokenizer};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;

/// A 4xx/5xx answer in OpenAI's error shape.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// `stop`: one string or a list.
#[derive(Deserialize, Debug, Default)]
#[serde(untagged)]
pub enum Stop {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// What chat and text completions share.
#[derive(Deserialize, Debug, Default)]
pub struct Common {
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Stop,
    pub n: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    #[serde(default)]
    pub ignore_eos: bool,
}

#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    /// Chat: whether to return logprobs (`top_logprobs` says how many alternatives).
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<i64>,
    #[serde(flatten)]
    pub common: Common,
}

#[derive(Deserialize, Debug)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Content,
}

/// Message content: a string or a list of parts (text parts are joined).
#[derive(Deserialize, Debug, Default)]
#[serde(untagged)]
pub enum Content {
    #[default]
    Null,
    Text(String),
    Parts(Vec<Value>),
}

#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    pub prompt: PromptInput,
    /// Completions: the number of most likely tokens to return per step.
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub common: Common,
}

/// `prompt`: a string, one token list, or a one-element list of either.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

/// One request expanded to `n` engine requests, and what the answer needs.
pub struct Plan {
    pub requests: Vec<GenerateRequest>,
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: bool,
}

fn in_range(param: &str, v: Option<f32>, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
    match v {
        Some(x) if !(x.is_finite() && x >= lo && x <= hi) => Err(ApiError::invalid(
            param,
            format!("{param} must be in [{lo}, {hi}], got {x}"),
        )),
        v => Ok(v),
    }
}

/// Sampling and limits from the shared fields; `n` engine requests.
fn plan(common: &Common, prompt: Prompt, logprobs: bool, top: usize) -> Result<Plan, ApiError> {
    let temperature = in_range("temperature", common.temperature, 0.0, 2.0)?;
    let top_p = common.top_p;
    if let Some(p) = top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::invalid(
                "top_p",
                format!("top_p must be in (0, 1], got {p}"),
            ));
        }
    }
    let min_p = in_range("min_p", common.min_p, 0.0, 1.0)?;
    let presence = in_range("presence_penalty", common.presence_penalty, -2.0, 2.0)?;
    let frequency = in_range("frequency_penalty", common.frequency_penalty, -2.0, 2.0)?;
    let repetition = common.repetition_penalty;
    if let Some(r) = repetition {
        if !(r.is_finite() && r > 0.0) {
            return Err(ApiError::invalid(
                "repetition_penalty",
                "repetition_penalty must be > 0",
            ));
        }
    }
    let top_k = match common.top_k {
        None | Some(-1) => 0,
        Some(k) if k >= 0 && k <= u32::MAX as i64 => k as u32,
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be >= 0 (or -1), got {k}"),
            ))
        }
    };
    let n = common.n.unwrap_or(1);
    if !(1..=128).contains(&n) {
        return Err(ApiError::invalid(
            "n",
            format!("n must be in [1, 128], got {n}"),
        ));
    }
    let max_tokens = match common.max_completion_tokens.or(common.max_tokens) {
        None => None,
        Some(m) if m >= 1 => Some(m as usize),
        Some(m) => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!("max_tokens must be >= 1, got {m}"),
            ))
        }
    };
    let mut logit_bias = Vec::new();
    for (k, v) in common.logit_bias.iter().flatten() {
        let id: u32 = k.parse().map_err(|_| {
            ApiError::invalid(
                "logit_bias",
                format!("logit_bias key {k:?} is not a token id"),
            )
        })?;
        if !(v.is_finite() && (-100.0..=100.0).contains(v)) {
            return Err(ApiError::invalid(
                "logit_bias",
                "logit_bias values must be in [-100, 100]",
            ));
        }
        logit_bias.push((id, *v));
    }
    let stop = match &common.stop {
        Stop::None => Vec::new(),
        Stop::One(s) => vec![s.clone()],
        Stop::Many(v) => v.clone(),
    };
    if stop.len() > 16 {
        return Err(ApiError::invalid("stop", "at most 16 stop sequences"));
    }
    let sampling = SamplingParams {
        temperature: temperature.unwrap_or(1.0),
        top_k,
        top_p: top_p.unwrap_or(1.0),
        min_p: min_p.unwrap_or(0.0),
        repetition_penalty: repetition.unwrap_or(1.0),
        presence_penalty: presence.unwrap_or(0.0),
        frequency_penalty: frequency.unwrap_or(0.0),
        logit_bias,
        seed: None,
    };
    let requests = (0..n)
        .map(|i| {
            let mut r = GenerateRequest::new(prompt.clone());
            r.sampling = SamplingParams {
                seed: common.seed.map(|s| (s as u64).wrapping_add(i as u64)),
                ..sampling.clone()
            };
            r.max_tokens = max_tokens;
            r.stop = stop.clone();
            r.ignore_eos = common.ignore_eos;
            r.logprobs = logprobs;
            r.top_logprobs = top;
            r
        })
        .collect();
    Ok(Plan {
        requests,
        stream: common.stream,
        include_usage: common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
        logprobs,
    })
}

impl ChatRequest {
    pub fn plan(&self) -> Result<Plan, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "messages must not be empty"));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            let content = match &m.content {
                Content::Null => String::new(),
                Content::Text(t) => t.clone(),
                Content::Parts(parts) => {
                    let mut text = String::new();
                    for p in parts {
                        match (
                            p.get("type").and_then(Value::as_str),
                            p.get("text").and_then(Value::as_str),
                        ) {
                            (Some("text"), Some(t)) => text.push_str(t),
                            _ => {
                                return Err(ApiError::invalid(
                                    &format!("messages[{i}].content"),
                                    "only text content parts are supported",
                                ))
                            }
                        }
                    }
                    text
                }
            };
            messages.push(ChatMessage::new(m.role.clone(), content));
        }
        let top = self.top_logprobs.unwrap_or(0);
        if !(0..=20).contains(&top) {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs must be in [0, 20]",
            ));
        }
        if top > 0 && !self.logprobs {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ));
        }
        plan(
            &self.common,
            Prompt::Chat(messages),
            self.logprobs,
            top as usize,
        )
    }
}

impl CompletionRequest {
    pub fn plan(&self) -> Result<Plan, ApiError> {
        let prompt = match &self.prompt {
            PromptInput::Text(t) => Prompt::Text(t.clone()),
            PromptInput::Tokens(ids) => Prompt::Tokens(ids.clone()),
            PromptInput::Texts(v) if v.len() == 1 => Prompt::Text(v[0].clone()),
            PromptInput::TokenLists(v) if v.len() == 1 => Prompt::Tokens(v[0].clone()),
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "one prompt per request is supported",
                ))
            }
        };
        if self.echo {
            return Err(ApiError::invalid("echo", "echo is not supported"));
        }
        let top = self.logprobs.unwrap_or(0);
        if !(0..=20).contains(&top) {
            return Err(ApiError::invalid("logprobs", "logprobs must be in [0, 20]"));
        }
        let mut common_default_16 =
            plan(&self.common, prompt, self.logprobs.is_some(), top as usize)?;
        // The completions API's documented default.
        if self.common.max_tokens.is_none() && self.common.max_completion_tokens.is_none() {
            for r in &mut common_default_16.requests {
                r.max_tokens = Some(16);
            }
        }
        Ok(common_default_16)
    }
}

pub fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// Chat's `logprobs.content` entry of one token.
pub fn chat_logprob(tok: &Tokenizer, t: &SampledToken) -> Value {
    let entry = |id: u32, lp: f32| {
        let text = token_text(tok, id);
        json!({"token": text, "logprob": lp, "bytes": text.as_bytes()})
    };
    let mut v = entry(t.id, t.logprob.unwrap_or(0.0));
    v["top_logprobs"] = Value::Array(
        t.top_logprobs
            .iter()
            .map(|&(id, lp)| entry(id, lp))
            .collect(),
    );
    v
}

/// Completions' `logprobs` object over some tokens.
pub fn completion_logprobs(tok: &Tokenizer, tokens: &[SampledToken], offset: usize) -> Value {
    let mut texts = Vec::new();
    let mut lps = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    let mut at = offset;
    for t in tokens {
        let text = token_text(tok, t.id);
        offsets.push(at);
        at += text.len();
        texts.push(text);
        lps.push(t.logprob.unwrap_or(0.0));
        let top: serde_json::Map<String, Value> = t
            .top_logprobs
            .iter()
            .map(|&(id, lp)| (token_text(tok, id), json!(lp)))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

pub fn finish_reason(r: FinishReason) -> &'static str {
    r.as_str()
}

pub fn usage_json(all: &[Usage]) -> Value {
    let prompt = all.first().map_or(0, |u| u.prompt_tokens);
    let completion: usize = all.iter().map(|u| u.completion_tokens).sum();
    let cached = all.first().map_or(0, |u| u.cached_tokens);
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}
