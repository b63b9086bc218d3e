//! A GPT-2 style byte-level BPE tokenizer rebuilt from GGUF metadata, split
//! the way llama.cpp splits for the file's `tokenizer.ggml.pre` type.
//!
//! llama.cpp applies a list of regexes in turn: each one cuts every piece left
//! by the previous one into its matches and the text between them (both kept).
//! That is a `Sequence` of `Split(regex, Isolated)` pre-tokenizers, followed by
//! a `ByteLevel` pre-tokenizer that only maps bytes to symbols (no prefix
//! space, no regex of its own).

use super::error::TokenizerError;
use crate::io::GgufFile;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

/// The GPT-2 regex (llama.cpp's form: HF's trailing `|\s+` is not needed,
/// because text between matches is kept as its own piece anyway).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's regex with `(?i:...)` spelled out as ASCII case classes, as
/// llama.cpp does (so Unicode case folding cannot match e.g. U+017F for `s`).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's regex: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How one `tokenizer.ggml.pre` name splits text.
pub(crate) struct PreSplit {
    pub regexes: &'static [&'static str],
    /// Whole words found in the vocabulary skip BPE merging (Llama 3 family).
    pub ignore_merges: bool,
    /// The BOS default when the file has no `tokenizer.ggml.add_bos_token`.
    pub add_bos_default: bool,
}

/// The regex list llama.cpp uses for a `tokenizer.ggml.pre` name, or `None`
/// for names this crate does not know.
pub(crate) fn pre_split(pre: &str) -> Option<PreSplit> {
    const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"];
    const SMOLLM: &[&str] = &[r"\p{N}", GPT2];
    let (regexes, ignore_merges, add_bos_default): (&'static [&'static str], bool, bool) =
        match pre {
            "default" => (DEFAULT, false, false),
            "gpt-2" | "phi-2" | "gigachat" | "mellum" | "exaone4" | "mpt" | "olmo" | "jais"
            | "trillion" | "granite-docling" => (&[GPT2], false, false),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => (SMOLLM, false, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => (&[LLAMA3], true, true),
            "dbrx" | "smaug-bpe" => (&[LLAMA3], false, false),
            "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "megrez" | "hunyuan" => {
                (&[QWEN2], false, false)
            }
            _ => return None,
        };
    Some(PreSplit {
        regexes,
        ignore_merges,
        add_bos_default,
    })
}

/// GGUF `tokenizer.ggml.token_type` values.
pub(crate) mod token_type {
    pub const UNKNOWN: i64 = 2;
    pub const CONTROL: i64 = 3;
    pub const USER_DEFINED: i64 = 4;
}

/// Texts that end generation when they are control tokens (llama.cpp treats
/// these as end-of-generation tokens as well as the declared EOS/EOT/EOM).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
];

/// Everything [`Tokenizer::from_gguf`](super::Tokenizer::from_gguf) needs.
pub(crate) struct GgufVocab {
    pub tokenizer: tokenizers::Tokenizer,
    pub bos_id: Option<u32>,
    pub eos_ids: Vec<u32>,
    pub pad_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub special_ids: Vec<u32>,
}

fn opt_id(gguf: &GgufFile, key: &str, n_vocab: usize) -> Result<Option<u32>, TokenizerError> {
    let Some(v) = gguf.opt_metadata_f64(key)? else {
        return Ok(None);
    };
    // Some converters write -1 / u32::MAX for "none".
    if v < 0.0 || v >= u32::MAX as f64 {
        return Ok(None);
    }
    if v as usize >= n_vocab || v.fract() != 0.0 {
        return Err(TokenizerError::InvalidKey {
            path: gguf.path().into(),
            key: key.into(),
            message: format!("token id {v} is outside the vocabulary of {n_vocab} tokens"),
        });
    }
    Ok(Some(v as u32))
}

fn opt_bool(gguf: &GgufFile, key: &str) -> Result<Option<bool>, TokenizerError> {
    Ok(gguf.opt_metadata_f64(key)?.map(|v| v != 0.0))
}

pub(crate) fn build(gguf: &GgufFile) -> Result<GgufVocab, TokenizerError> {
    let path = gguf.path().to_string();
    let missing = |key: &str| TokenizerError::MissingKey {
        path: path.clone(),
        key: key.into(),
    };
    let model = gguf
        .opt_metadata_string("tokenizer.ggml.model")?
        .ok_or_else(|| missing("tokenizer.ggml.model"))?;
    if model != "gpt2" {
        return Err(TokenizerError::UnsupportedModel {
            path: path.clone(),
            model,
        });
    }
    let pre_name = gguf
        .opt_metadata_string("tokenizer.ggml.pre")?
        .unwrap_or_else(|| "default".to_string());
    let pre = pre_split(&pre_name).ok_or_else(|| TokenizerError::UnsupportedPreTokenizer {
        path: path.clone(),
        pre: pre_name.clone(),
    })?;

    let mut tokens = gguf
        .opt_metadata_strings("tokenizer.ggml.tokens")?
        .ok_or_else(|| missing("tokenizer.ggml.tokens"))?;
    // llama.cpp names empty tokens so that every id has a distinct text.
    for (i, t) in tokens.iter_mut().enumerate() {
        if t.is_empty() {
            *t = format!("[EMPTY_{i}]");
        }
    }
    let n_vocab = tokens.len();
    let merges_raw = gguf
        .opt_metadata_strings("tokenizer.ggml.merges")?
        .ok_or_else(|| missing("tokenizer.ggml.merges"))?;
    let types: Vec<i64> = match gguf.opt_metadata_f64s("tokenizer.ggml.token_type")? {
        Some(t) if t.len() == n_vocab => t.into_iter().map(|x| x as i64).collect(),
        Some(t) => {
            return Err(TokenizerError::InvalidKey {
                path,
                key: "tokenizer.ggml.token_type".into(),
                message: format!("{} entries for {n_vocab} tokens", t.len()),
            })
        }
        // Without types every token is normal: nothing is parsed as special.
        None => vec![1; n_vocab],
    };

    let mut vocab = Vocab::with_capacity(n_vocab);
    for (id, tok) in tokens.iter().enumerate() {
        // On a duplicated text the first id wins, as in the merges' view.
        vocab.entry(tok.clone()).or_insert(id as u32);
    }
    let mut merges = Vec::with_capacity(merges_raw.len());
    for (i, m) in merges_raw.iter().enumerate() {
        // Split at the first space after the first byte, as llama.cpp does.
        let cut = m
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(i, _)| i);
        let (a, b) =
            cut.map(|i| (&m[..i], &m[i + 1..]))
                .ok_or_else(|| TokenizerError::InvalidKey {
                    path: path.clone(),
                    key: "tokenizer.ggml.merges".into(),
                    message: format!("entry {i} ({m:?}) is not two space-separated symbols"),
                })?;
        merges.push((a.to_string(), b.to_string()));
    }

    let bos_id = opt_id(gguf, "tokenizer.ggml.bos_token_id", n_vocab)?;
    let eos_id = opt_id(gguf, "tokenizer.ggml.eos_token_id", n_vocab)?;
    let eot_id = opt_id(gguf, "tokenizer.ggml.eot_token_id", n_vocab)?;
    let eom_id = opt_id(gguf, "tokenizer.ggml.eom_token_id", n_vocab)?;
    let pad_id = opt_id(gguf, "tokenizer.ggml.padding_token_id", n_vocab)?;
    let unk_id = opt_id(gguf, "tokenizer.ggml.unknown_token_id", n_vocab)?;
    let add_bos = opt_bool(gguf, "tokenizer.ggml.add_bos_token")?.unwrap_or(pre.add_bos_default);
    let add_eos = opt_bool(gguf, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);

    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges);
    if let Some(unk) = unk_id {
        builder = builder.unk_token(tokens[unk as usize].clone());
    }
    let bpe = builder.build().map_err(|e| TokenizerError::Invalid {
        path: path.clone(),
        message: format!("building the BPE model: {e}"),
    })?;

    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(pre.regexes.len() + 1);
    for re in pre.regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Invalid {
            path: path.clone(),
            message: format!("pre-tokenizer '{pre_name}' regex {re:?}: {e}"),
        })?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer
        .with_pre_tokenizer(Some(Sequence::new(steps)))
        .with_decoder(Some(ByteLevelDecoder::default()));

    // Control (and unknown) tokens are special: parsed from text on request
    // and skipped by `decode(.., skip_special = true)`. User-defined tokens are
    // always parsed as one token, as llama.cpp does, but are ordinary text.
    let mut special = Vec::new();
    let mut user = Vec::new();
    let mut special_ids = Vec::new();
    for (id, (tok, ty)) in tokens.iter().zip(&types).enumerate() {
        match *ty {
            token_type::CONTROL | token_type::UNKNOWN => {
                special.push(AddedToken::from(tok.clone(), true));
                special_ids.push(id as u32);
            }
            token_type::USER_DEFINED => user.push(AddedToken::from(tok.clone(), false)),
            _ => {}
        }
    }
    tokenizer.add_special_tokens(&special);
    tokenizer.add_tokens(&user);

    let mut eos_ids: Vec<u32> = Vec::new();
    for id in [eos_id, eot_id, eom_id].into_iter().flatten() {
        if !eos_ids.contains(&id) {
            eos_ids.push(id);
        }
    }
    for &id in &special_ids {
        if EOG_TEXTS.contains(&tokens[id as usize].as_str()) && !eos_ids.contains(&id) {
            eos_ids.push(id);
        }
    }

    Ok(GgufVocab {
        tokenizer,
        bos_id,
        eos_ids,
        pad_id,
        unk_id,
        add_bos,
        add_eos,
        special_ids,
    })
}
