//! Streaming decode.
//!
//! Byte-level BPE tokens can end in the middle of a UTF-8 character (an emoji
//! is often two or three tokens). The detokenizer decodes a short window of
//! recent ids and emits text only once the window's decode no longer ends in
//! an incomplete character (U+FFFD from lossy decoding), so every piece is
//! whole characters and the pieces add up to `decode(all ids)`.
//!
//! The window keeps the last emitted ids in front of the new ones, so a
//! decoder that treats the first token specially (e.g. SentencePiece's
//! leading-space strip) sees the same context as a full decode.

use super::{Tokenizer, TokenizerError};

const REPLACEMENT: char = '\u{FFFD}';

/// Turns a stream of token ids into text pieces. See the module docs.
pub struct IncrementalDetokenizer {
    tokenizer: Tokenizer,
    skip_special: bool,
    /// Ids from `prefix` on; `ids[..read]` is already emitted.
    ids: Vec<u32>,
    read: usize,
    /// `decode(ids[..read])`: the context part of the window.
    prefix_text: String,
}

impl IncrementalDetokenizer {
    /// A decoder over `tokenizer`; `skip_special` leaves special tokens out.
    pub fn new(tokenizer: Tokenizer, skip_special: bool) -> Self {
        IncrementalDetokenizer {
            tokenizer,
            skip_special,
            ids: Vec::new(),
            read: 0,
            prefix_text: String::new(),
        }
    }

    /// Add one id; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, TokenizerError> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids, self.skip_special)?;
        if text.ends_with(REPLACEMENT) {
            return Ok(None);
        }
        let Some(new) = text.strip_prefix(self.prefix_text.as_str()) else {
            return Ok(None);
        };
        if new.is_empty() {
            return Ok(None);
        }
        let new = new.to_string();
        // The ids just emitted start on a character boundary: they are the
        // context of the next window.
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        self.prefix_text = self.tokenizer.decode(&self.ids, self.skip_special)?;
        Ok(Some(new))
    }

    /// Emit whatever is held back (an incomplete character at the end of the
    /// stream comes out as U+FFFD, as in `decode`) and reset.
    pub fn flush(&mut self) -> Result<Option<String>, TokenizerError> {
        if self.ids.len() <= self.read {
            self.reset();
            return Ok(None);
        }
        let text = self.tokenizer.decode(&self.ids, self.skip_special)?;
        let out = match text.strip_prefix(self.prefix_text.as_str()) {
            Some(new) => new.to_string(),
            // The context decoded differently inside a longer window; emit
            // the held tokens on their own.
            None => self
                .tokenizer
                .decode(&self.ids[self.read..], self.skip_special)?,
        };
        self.reset();
        Ok((!out.is_empty()).then_some(out))
    }

    /// Forget all state (e.g. between requests).
    pub fn reset(&mut self) {
        self.ids.clear();
        self.read = 0;
        self.prefix_text.clear();
    }

    /// Number of pushed ids whose text is still held back.
    pub fn pending(&self) -> usize {
        self.ids.len() - self.read
    }
}
