//! When a request ends and what text it shows: EOS and stop ids, stop
//! strings over the detokenized stream (held back while they could still
//! match, never shown), and `max_tokens`.

use super::request::FinishReason;
use crate::tokenizer::{IncrementalDetokenizer, StopStrings, Tokenizer, TokenizerError};
use std::sync::Arc;

/// One request's output side.
pub(crate) struct TextOutput {
    detok: IncrementalDetokenizer,
    stops: StopStrings,
    /// EOS ids (empty with `ignore_eos`) and the request's stop ids.
    stop_ids: Arc<[u32]>,
    extra_stop_ids: Vec<u32>,
    max_tokens: usize,
    generated: usize,
}

impl TextOutput {
    pub fn new(
        tokenizer: &Tokenizer,
        skip_special: bool,
        eos: Arc<[u32]>,
        stop_token_ids: Vec<u32>,
        stop: Vec<String>,
        max_tokens: usize,
    ) -> TextOutput {
        TextOutput {
            detok: tokenizer.detokenizer(skip_special),
            stops: StopStrings::new(stop),
            stop_ids: eos,
            extra_stop_ids: stop_token_ids,
            max_tokens,
            generated: 0,
        }
    }

    /// Take a sampled token: the text it releases, and the finish reason
    /// when the request ends with it.
    pub fn push(&mut self, token: u32) -> Result<(String, Option<FinishReason>), TokenizerError> {
        self.generated += 1;
        if self.stop_ids.contains(&token) || self.extra_stop_ids.contains(&token) {
            return Ok((self.flush()?, Some(FinishReason::Stop)));
        }
        let mut text = String::new();
        if let Some(piece) = self.detok.push(token)? {
            let out = self.stops.push(&piece);
            text = out.text;
            if out.stopped {
                return Ok((text, Some(FinishReason::Stop)));
            }
        }
        if self.generated >= self.max_tokens {
            text.push_str(&self.flush()?);
            return Ok((text, Some(FinishReason::Length)));
        }
        Ok((text, None))
    }

    /// What the detokenizer and the stop matcher still hold, at the end.
    fn flush(&mut self) -> Result<String, TokenizerError> {
        let mut rest = String::new();
        if let Some(tail) = self.detok.flush()? {
            rest = self.stops.push(&tail).text;
        }
        rest.push_str(&self.stops.finish());
        Ok(rest)
    }
}
