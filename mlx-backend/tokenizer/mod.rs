//! Tokenizers and chat templates.
//!
//! * [`Tokenizer`]: a HuggingFace `tokenizers` tokenizer, loaded from a
//!   `tokenizer.json` or rebuilt from a GGUF file's `tokenizer.ggml.*`
//!   metadata (GPT-2 style byte-level BPE, split like llama.cpp splits for the
//!   file's `tokenizer.ggml.pre` type), with BOS/EOS handling and the ids a
//!   generation loop needs (`bos_id`, `eos_ids`, special ids).
//! * [`IncrementalDetokenizer`]: streaming decode that never cuts a UTF-8
//!   character in two.
//! * [`ChatTemplate`]: a model's Jinja chat template rendered with
//!   `minijinja` the way HF `apply_chat_template` renders it.
//! * [`StopStrings`]: stop strings over streamed text, holding back what
//!   could still become one, so a stop string is never shown.

mod chat_template;
mod detokenizer;
mod error;
mod gguf_bpe;
mod stop;

pub use chat_template::{ChatMessage, ChatTemplate};
pub use detokenizer::IncrementalDetokenizer;
pub use error::{TemplateError, TokenizerError};
pub use stop::{StopOutput, StopStrings};

use crate::io::GgufFile;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// A tokenizer plus its special-token facts. Cloning is cheap (shared).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    tk: tokenizers::Tokenizer,
    /// `tk` with special-token parsing off, built on first use.
    plain: OnceLock<tokenizers::Tokenizer>,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    pad_id: Option<u32>,
    unk_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// BOS/EOS are added here (GGUF, or a tokenizer.json without a
    /// post-processor) instead of by the tokenizer's post-processor.
    manual_specials: bool,
    special_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.inner.bos_id)
            .field("eos_ids", &self.inner.eos_ids)
            .field("add_bos", &self.inner.add_bos)
            .finish()
    }
}

/// A token named in `tokenizer_config.json`: a string or an AddedToken dict.
fn config_token(config: &serde_json::Value, key: &str) -> Option<String> {
    match config.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

impl Tokenizer {
    /// Load a HuggingFace `tokenizer.json`. When a `tokenizer_config.json`
    /// lies beside it, its `bos_token` / `eos_token` / `pad_token` /
    /// `unk_token` and `add_bos_token` / `add_eos_token` are used; a
    /// `generation_config.json` there adds its `eos_token_id`(s).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        let path = path.as_ref();
        let display = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => TokenizerError::NotFound {
                path: display.clone(),
            },
            _ => TokenizerError::Invalid {
                path: display.clone(),
                message: e.to_string(),
            },
        })?;
        let tk =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| TokenizerError::Invalid {
                path: display.clone(),
                message: format!("not a valid tokenizer.json: {e}"),
            })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let config = read_json(&dir.join("tokenizer_config.json")).unwrap_or_default();
        let id_of = |key: &str| config_token(&config, key).and_then(|t| tk.token_to_id(&t));
        let bos_id = id_of("bos_token");
        let mut eos_ids: Vec<u32> = id_of("eos_token").into_iter().collect();
        if let Some(gen) = read_json(&dir.join("generation_config.json")) {
            let ids: Vec<u64> = match gen.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => n.as_u64().into_iter().collect(),
                Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_u64()).collect(),
                _ => Vec::new(),
            };
            for id in ids {
                let id = id as u32;
                if !eos_ids.contains(&id) {
                    eos_ids.push(id);
                }
            }
        }
        let flag = |key: &str| config.get(key).and_then(|v| v.as_bool());
        let mut special_ids: Vec<u32> = tk
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        special_ids.sort_unstable();
        let manual_specials = tk.get_post_processor().is_none();
        Ok(Tokenizer {
            inner: Arc::new(Inner {
                bos_id,
                eos_ids,
                pad_id: id_of("pad_token"),
                unk_id: id_of("unk_token"),
                add_bos: flag("add_bos_token").unwrap_or(false),
                add_eos: flag("add_eos_token").unwrap_or(false),
                manual_specials,
                special_ids,
                tk,
                plain: OnceLock::new(),
            }),
        })
    }

    /// Rebuild the tokenizer of a GGUF file from its `tokenizer.ggml.*`
    /// metadata: `model` must be `"gpt2"` (byte-level BPE); `pre` picks the
    /// split regexes (llama.cpp's names: `default`, `gpt-2`, `smollm`,
    /// `llama-bpe`, `qwen2`, ...); `tokens`, `merges` and `token_type`
    /// (control and user-defined tokens are matched whole in text); the
    /// `bos`/`eos`/`eot`/`eom`/`padding`/`unknown` ids; `add_bos_token` /
    /// `add_eos_token`.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let v = gguf_bpe::build(gguf)?;
        Ok(Tokenizer {
            inner: Arc::new(Inner {
                tk: v.tokenizer,
                plain: OnceLock::new(),
                bos_id: v.bos_id,
                eos_ids: v.eos_ids,
                pad_id: v.pad_id,
                unk_id: v.unk_id,
                add_bos: v.add_bos,
                add_eos: v.add_eos,
                manual_specials: true,
                special_ids: v.special_ids,
            }),
        })
    }

    /// Encode `text`, matching special tokens written in it (so
    /// `"<|im_start|>"` is one id). With `add_special_tokens`, BOS/EOS are
    /// added as the model asks (`add_bos_token` / `add_eos_token`).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, add_special_tokens, true)
    }

    /// [`encode`](Self::encode), choosing whether special-token text is
    /// parsed (`parse_special`) or tokenized as ordinary text (user-defined
    /// tokens are matched either way, as in llama.cpp).
    pub fn encode_with(
        &self,
        text: &str,
        add_special_tokens: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let inner = &*self.inner;
        let tk = if parse_special {
            &inner.tk
        } else {
            inner.plain.get_or_init(|| {
                let mut t = inner.tk.clone();
                t.set_encode_special_tokens(true);
                t
            })
        };
        let post = add_special_tokens && !inner.manual_specials;
        let enc = tk
            .encode_fast(text, post)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let body = enc.get_ids();
        if !(add_special_tokens && inner.manual_specials) {
            return Ok(body.to_vec());
        }
        let mut ids = Vec::with_capacity(body.len() + 2);
        if let (true, Some(bos)) = (inner.add_bos, inner.bos_id) {
            ids.push(bos);
        }
        ids.extend_from_slice(body);
        if let (true, Some(&eos)) = (inner.add_eos, inner.eos_ids.first()) {
            ids.push(eos);
        }
        Ok(ids)
    }

    /// Decode ids to text; `skip_special` drops special (control) tokens.
    /// An id outside the vocabulary is an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        if let Some(&bad) = ids
            .iter()
            .find(|&&id| self.inner.tk.id_to_token(id).is_none())
        {
            return Err(TokenizerError::Decode(format!(
                "token id {bad} is not in the vocabulary ({} tokens)",
                self.vocab_size()
            )));
        }
        self.inner
            .tk
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// A streaming decoder over this tokenizer.
    pub fn detokenizer(&self, skip_special: bool) -> IncrementalDetokenizer {
        IncrementalDetokenizer::new(self.clone(), skip_special)
    }

    /// The id of a vocabulary entry.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.tk.token_to_id(token)
    }

    /// The vocabulary entry of `id` (byte-level symbols, e.g. `"Ġhello"`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.tk.id_to_token(id)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.tk.get_vocab_size(true)
    }

    /// The BOS id, if the tokenizer has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.inner.bos_id
    }

    /// The declared EOS id.
    pub fn eos_id(&self) -> Option<u32> {
        self.inner.eos_ids.first().copied()
    }

    /// Every id that ends generation: the declared EOS first, then EOT/EOM
    /// and end-of-turn control tokens such as `<|im_end|>`.
    pub fn eos_ids(&self) -> &[u32] {
        &self.inner.eos_ids
    }

    /// This tokenizer with `ids` as its EOS set (the first is the declared
    /// EOS), for a model bundle that settles one EOS set for the tokenizer
    /// and the runner alike.
    pub fn with_eos_ids(&self, ids: Vec<u32>) -> Tokenizer {
        let i = &*self.inner;
        Tokenizer {
            inner: Arc::new(Inner {
                tk: i.tk.clone(),
                plain: OnceLock::new(),
                bos_id: i.bos_id,
                eos_ids: ids,
                pad_id: i.pad_id,
                unk_id: i.unk_id,
                add_bos: i.add_bos,
                add_eos: i.add_eos,
                manual_specials: i.manual_specials,
                special_ids: i.special_ids.clone(),
            }),
        }
    }

    /// Whether `id` ends generation ([`eos_ids`](Self::eos_ids)).
    pub fn is_eos(&self, id: u32) -> bool {
        self.inner.eos_ids.contains(&id)
    }

    /// The padding id, if declared.
    pub fn pad_id(&self) -> Option<u32> {
        self.inner.pad_id
    }

    /// The unknown-token id, if declared.
    pub fn unk_id(&self) -> Option<u32> {
        self.inner.unk_id
    }

    /// Whether `encode(.., add_special_tokens = true)` prepends BOS.
    pub fn add_bos_token(&self) -> bool {
        if self.inner.manual_specials {
            self.inner.add_bos && self.inner.bos_id.is_some()
        } else {
            self.inner.add_bos
        }
    }

    /// Whether `encode(.., add_special_tokens = true)` appends EOS.
    pub fn add_eos_token(&self) -> bool {
        self.inner.add_eos
    }

    /// Ids of special (control) tokens, sorted.
    pub fn special_ids(&self) -> &[u32] {
        &self.inner.special_ids
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.special_ids.binary_search(&id).is_ok()
    }

    /// Text of the BOS token, e.g. for a chat template's `bos_token`.
    pub fn bos_token(&self) -> Option<String> {
        self.bos_id().and_then(|id| self.id_to_token(id))
    }

    /// Text of the declared EOS token.
    pub fn eos_token(&self) -> Option<String> {
        self.eos_id().and_then(|id| self.id_to_token(id))
    }

    /// The underlying HuggingFace tokenizer.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner.tk
    }
}

/// A model without a chat template is fine (`None`); one whose template
/// file or key is there but broken is an error.
fn optional_template(
    t: Result<ChatTemplate, TemplateError>,
) -> Result<Option<ChatTemplate>, TokenizerError> {
    match t {
        Ok(t) => Ok(Some(t)),
        Err(TemplateError::NotFound { .. } | TemplateError::MissingKey { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The tokenizer and chat template that come with a model: from a GGUF
/// file's metadata, or from `tokenizer.json` / `tokenizer_config.json` in an
/// HF-style folder. The template is None when the model ships none.
pub fn for_model(
    path: impl AsRef<Path>,
) -> Result<(Tokenizer, Option<ChatTemplate>), TokenizerError> {
    let path = path.as_ref();
    if path.is_dir() {
        let tokenizer = Tokenizer::from_file(path.join("tokenizer.json"))?;
        let template = optional_template(ChatTemplate::from_tokenizer_config(
            path.join("tokenizer_config.json"),
        ))?;
        return Ok((tokenizer, template));
    }
    for_gguf(&GgufFile::load(path)?)
}

/// [`for_model`] of a GGUF file already read.
pub fn for_gguf(gguf: &GgufFile) -> Result<(Tokenizer, Option<ChatTemplate>), TokenizerError> {
    let tokenizer = Tokenizer::from_gguf(gguf)?;
    let template = optional_template(ChatTemplate::from_gguf(gguf))?;
    Ok((tokenizer, template))
}
