//! Tokenizer, streaming detokenizer and chat template tests.
//!
//! The default-model tests read the GGUF at
//! `${MLX_BACKEND_CACHE:-~/.cache/mlx-backend}/models/SmolLM2-135M-Instruct.Q4_1.gguf`
//! (fetched by `scripts/fetch-default-model.sh`) and compare with the
//! llama.cpp goldens in `tests/reference/default_model.json`; they skip with a
//! note when the model is absent. The rest build a small byte-level BPE
//! `tokenizer.json` and templates of their own.

use mlx_backend::io::GgufFile;
use mlx_backend::tokenizer::{
    ChatMessage, ChatTemplate, IncrementalDetokenizer, TemplateError, Tokenizer, TokenizerError,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tempfile::TempDir;

// ---------------------------------------------------------------- helpers

fn model_path() -> PathBuf {
    mlx_backend::model::fetch::default_model_path()
}

fn load_model() -> Option<GgufFile> {
    let path = model_path();
    if !path.exists() {
        eprintln!(
            "SKIP: default model not found at {} (run scripts/fetch-default-model.sh)",
            path.display()
        );
        return None;
    }
    Some(GgufFile::load(&path).expect("load default model"))
}

fn goldens() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/default_model.json");
    let text = std::fs::read_to_string(&path).expect("read tests/reference/default_model.json");
    serde_json::from_str(&text).expect("parse default_model.json")
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn messages_of(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .expect("message list")
        .iter()
        .map(|m| {
            ChatMessage::new(
                m["role"].as_str().expect("role"),
                m["content"].as_str().expect("content"),
            )
        })
        .collect()
}

/// Strings that stress the pre-tokenizer and byte-level decoding.
const ROUND_TRIP: &[&str] = &[
    "",
    "a",
    "Hello, world!",
    " leading space",
    "   three leading spaces",
    "trailing   ",
    "Héllo café crème brûlée naïve façade Ångström Œuvre ß",
    "Ελληνικά и русский текст",
    "日本語のテキスト、中文文本和한국어",
    "emoji 😀👍🏽🇫🇷🇯🇵",
    "ZWJ 👨\u{200d}👩\u{200d}👧\u{200d}👦 🏳️\u{200d}🌈 🧑🏾\u{200d}💻",
    "def f(x):\n\treturn x + 1\n",
    "fn main() {\n    println!(\"{}\", 42);\n}\n",
    "tabs\t\tand\ttabs",
    "a \t \n b\u{a0}c\u{2003}d",
    "\n\n\nnewlines\r\nCRLF\r\n",
    "0123456789 3.14159 1,000,000 -42 1e-9 0xDEADBEEF",
    "don't won't I'm we'll they've SHE'S",
    "URL https://example.com/a?b=1&c=2#d <tag attr=\"v\">",
    "math ∑∫√∞ ≠ ≤ ≥ → ⇒ ∀x∈ℝ",
    "zero\u{200b}width and \u{feff}bom and combining e\u{301}",
    "<|im_start|>user\nhi<|im_end|>",
    "text <|im_end|> inside <|endoftext|>",
    "half-special <|im_sta and <|im_end",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 and 𐍈 and \u{10ffff}",
];

/// Push every id and check the streaming contract: the pieces (plus flush)
/// concatenate to `decode(ids)`; no piece holds a replacement character that
/// the full decode does not have at that point.
fn stream(tk: &Tokenizer, ids: &[u32], skip_special: bool) -> (String, usize) {
    let mut d = tk.detokenizer(skip_special);
    let mut out = String::new();
    let mut held = 0;
    for &id in ids {
        match d.push(id).expect("push") {
            Some(piece) => {
                assert!(!piece.is_empty());
                out.push_str(&piece);
            }
            None => held += 1,
        }
    }
    if let Some(rest) = d.flush().expect("flush") {
        out.push_str(&rest);
    }
    assert_eq!(d.pending(), 0);
    let full = tk.decode(ids, skip_special).expect("decode");
    assert_eq!(out, full, "stream != decode for ids {ids:?}");
    (out, held)
}

// ------------------------------------------------- default model (GGUF)

#[test]
fn gguf_tokenizer_facts() {
    let Some(gguf) = load_model() else { return };
    let tk = Tokenizer::from_gguf(&gguf).expect("tokenizer from GGUF");
    assert_eq!(tk.vocab_size(), 49152);
    assert_eq!(tk.bos_id(), Some(1));
    assert_eq!(tk.eos_id(), Some(2));
    assert!(tk.eos_ids().contains(&2), "{:?}", tk.eos_ids());
    assert!(tk.is_eos(tk.token_to_id("<|im_end|>").unwrap()));
    assert!(!tk.add_bos_token());
    assert_eq!(tk.pad_id(), Some(2));
    assert_eq!(tk.bos_token().as_deref(), Some("<|im_start|>"));
    assert_eq!(tk.eos_token().as_deref(), Some("<|im_end|>"));
    assert_eq!(tk.token_to_id("<|endoftext|>"), Some(0));
    assert_eq!(tk.id_to_token(1).as_deref(), Some("<|im_start|>"));
    assert!(tk.is_special(1) && tk.is_special(2) && !tk.is_special(100));
    assert_eq!(tk.special_ids().len(), 17);
    assert!(tk.decode(&[49152], false).is_err());

    // Special tokens written in text are single ids; as plain text they are not.
    let ids = tk.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(ids.len(), 5, "{ids:?}");
    let plain = tk
        .encode_with("<|im_start|>user\nhi<|im_end|>", false, false)
        .unwrap();
    assert!(!plain.contains(&1) && !plain.contains(&2), "{plain:?}");
    assert_eq!(tk.decode(&ids, true).unwrap(), "user\nhi");
}

#[test]
fn gguf_tokenizer_matches_llama_cpp() {
    let Some(gguf) = load_model() else { return };
    let tk = Tokenizer::from_gguf(&gguf).expect("tokenizer from GGUF");
    let doc = goldens();
    let cases = doc["tokenizer_goldens"]["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20);
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let checks = [
            ("ids", tk.encode(text, false).unwrap()),
            ("ids_add_special", tk.encode(text, true).unwrap()),
            (
                "ids_no_special_parse",
                tk.encode_with(text, false, false).unwrap(),
            ),
        ];
        for (field, ours) in checks {
            let want = ids_of(&case[field]);
            if ours != want {
                failures.push(format!(
                    "{text:?} {field}: ours {ours:?} llama.cpp {want:?}"
                ));
            }
        }
        let ids = ids_of(&case["ids"]);
        if case["detok_roundtrip"].as_bool() == Some(true) {
            assert_eq!(tk.decode(&ids, false).unwrap(), text);
        }
        stream(&tk, &ids, false);
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn gguf_chat_template_matches_llama_cpp() {
    let Some(gguf) = load_model() else { return };
    let tk = Tokenizer::from_gguf(&gguf).unwrap();
    let template = ChatTemplate::from_gguf(&gguf).expect("chat template from GGUF");
    let doc = goldens();
    let chat = &doc["chat"];
    assert_eq!(template.source(), chat["chat_template"].as_str().unwrap());
    assert_eq!(template.bos_token(), "<|im_start|>");
    assert_eq!(template.eos_token(), "<|im_end|>");

    let messages = messages_of(&chat["messages"]);
    let add_gen = chat["add_generation_prompt"].as_bool().unwrap();
    let rendered = template.render(&messages, add_gen).unwrap();
    assert_eq!(rendered, chat["rendered_prompt"].as_str().unwrap());
    assert_eq!(
        tk.encode(&rendered, true).unwrap(),
        ids_of(&chat["prompt_token_ids"])
    );
    assert_eq!(
        template.render(&messages[1..], add_gen).unwrap(),
        chat["rendered_prompt_without_system_message"]
            .as_str()
            .unwrap()
    );

    let extra = doc["chat_extra"].as_object().expect("chat_extra");
    assert!(!extra.is_empty());
    for (name, case) in extra {
        let rendered = template
            .render(&messages_of(&case["messages"]), true)
            .unwrap();
        assert_eq!(
            rendered,
            case["rendered_prompt"].as_str().unwrap(),
            "chat_extra.{name}"
        );
        assert_eq!(
            tk.encode(&rendered, true).unwrap(),
            ids_of(&case["prompt_token_ids"]),
            "chat_extra.{name}"
        );
    }
}

#[test]
fn gguf_round_trip_and_streaming() {
    let Some(gguf) = load_model() else { return };
    let tk = Tokenizer::from_gguf(&gguf).unwrap();
    assert!(ROUND_TRIP.len() >= 20);
    let mut total_held = 0;
    for s in ROUND_TRIP {
        for parse_special in [true, false] {
            let ids = tk.encode_with(s, false, parse_special).unwrap();
            assert_eq!(tk.decode(&ids, false).unwrap(), *s, "ids {ids:?}");
            let (text, held) = stream(&tk, &ids, false);
            assert_eq!(text, *s);
            total_held += held;
        }
    }
    // Emoji and CJK split across tokens, so some pushes must have held back.
    assert!(total_held > 0);

    // A 4-byte emoji tokenized into several byte tokens streams as one piece.
    let ids = tk.encode("🇫🇷", false).unwrap();
    assert!(ids.len() > 1, "{ids:?}");
    let mut d = tk.detokenizer(false);
    let pieces: Vec<Option<String>> = ids.iter().map(|&id| d.push(id).unwrap()).collect();
    assert!(pieces[0].is_none());
    let joined: String = pieces.into_iter().flatten().collect();
    assert_eq!(joined, "🇫🇷");

    // Skipping special tokens while streaming.
    let ids = tk
        .encode("<|im_start|>assistant\n日本語<|im_end|>", false)
        .unwrap();
    let (text, _) = stream(&tk, &ids, true);
    assert_eq!(text, "assistant\n日本語");
}

// ------------------------------------------ a small tokenizer.json of our own

/// GPT-2's byte -> printable char table.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec!['\0'; 256];
    for (b, c) in printable.iter().zip(&chars) {
        table[*b as usize] = char::from_u32(*c).unwrap();
    }
    table
}

/// Writes tokenizer.json (+ tokenizer_config.json) into a fresh temp
/// directory, removed when the returned guard drops.
fn small_tokenizer_dir(name: &str, config: Option<Value>) -> TempDir {
    let tmp = tempfile::Builder::new()
        .prefix(&format!("mlx-backend-tok-{name}-"))
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    let table = byte_chars();
    let mut vocab = serde_json::Map::new();
    for (i, c) in table.iter().enumerate() {
        vocab.insert(c.to_string(), json!(i));
    }
    let merges = [
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        ("hell", "o"),
        ("Ġ", "w"),
    ];
    for (i, (a, b)) in merges.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), json!(256 + i));
    }
    let specials = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"];
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": 261 + i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
                          "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true,
                    "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab,
                  "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    if let Some(config) = config {
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    }
    tmp
}

#[test]
fn tokenizer_json_encode_decode() {
    let tmp = small_tokenizer_dir(
        "json",
        Some(json!({"bos_token": "<s>", "eos_token": {"content": "</s>"},
                    "add_bos_token": true, "add_eos_token": false})),
    );
    let dir = tmp.path();
    let tk = Tokenizer::from_file(dir.join("tokenizer.json")).expect("from_file");
    assert_eq!(tk.vocab_size(), 265);
    assert_eq!(tk.bos_id(), Some(261));
    assert_eq!(tk.eos_ids(), &[262]);
    assert!(tk.add_bos_token());
    assert_eq!(tk.encode("hello", false).unwrap(), vec![259]);
    assert_eq!(tk.encode("hello", true).unwrap(), vec![261, 259]);
    assert_eq!(tk.encode("hello world", false).unwrap()[..2], [259, 260]);
    assert_eq!(
        tk.encode("<|im_start|>hello<|im_end|>", false).unwrap(),
        vec![263, 259, 264]
    );
    assert_eq!(
        tk.encode_with("<|im_start|>", false, false).unwrap().len(),
        "<|im_start|>".len()
    );
    assert_eq!(tk.special_ids(), &[261, 262, 263, 264]);
    for s in ROUND_TRIP {
        let ids = tk.encode(s, false).unwrap();
        assert_eq!(tk.decode(&ids, false).unwrap(), *s);
    }
    let err = Tokenizer::from_file(dir.join("missing.json")).unwrap_err();
    assert!(matches!(err, TokenizerError::NotFound { ref path } if path.ends_with("missing.json")));
    std::fs::write(dir.join("bad.json"), "{not json").unwrap();
    let err = Tokenizer::from_file(dir.join("bad.json")).unwrap_err();
    assert!(err.to_string().contains("bad.json"), "{err}");
    tmp.close().unwrap();
}

#[test]
fn detokenizer_never_splits_characters() {
    let tmp = small_tokenizer_dir("detok", None);
    let dir = tmp.path();
    let tk = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    // Every non-ASCII byte is its own token here, so every multi-byte
    // character is split across tokens.
    let ids = tk.encode("a😀", false).unwrap();
    assert_eq!(ids.len(), 5);
    let mut d = IncrementalDetokenizer::new(tk.clone(), false);
    let got: Vec<Option<String>> = ids.iter().map(|&id| d.push(id).unwrap()).collect();
    assert_eq!(
        got,
        vec![Some("a".into()), None, None, None, Some("😀".into())]
    );
    assert_eq!(d.flush().unwrap(), None);

    // An incomplete character at the end comes out of flush as U+FFFD, like decode.
    let partial = &tk.encode("日", false).unwrap()[..2];
    let (text, held) = stream(&tk, partial, false);
    assert_eq!(text, "\u{fffd}");
    assert_eq!(held, 2);

    for s in ROUND_TRIP {
        let (text, _) = stream(&tk, &tk.encode(s, false).unwrap(), false);
        assert_eq!(text, *s);
    }

    // Pseudo-random mixes of scripts, emoji, specials and whitespace.
    let palette = [
        "a",
        " ",
        "\n",
        "\t",
        "é",
        "日",
        "本",
        "한",
        "😀",
        "👍🏽",
        "\u{200d}",
        "🇫🇷",
        "<|im_end|>",
        "hello",
        "💻",
        "ß",
        "\u{301}",
        "  ",
    ];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..200 {
        let mut s = String::new();
        for _ in 0..12 {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            s.push_str(palette[(seed >> 33) as usize % palette.len()]);
        }
        let ids = tk.encode(&s, false).unwrap();
        assert_eq!(stream(&tk, &ids, false).0, s);
        stream(&tk, &ids, true);
    }
    tmp.close().unwrap();
}

// ------------------------------------------------------------ chat templates

/// Rendered by Python jinja2 3.1.6 the way HF transformers renders
/// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
/// HF's `tojson`).
const TEMPLATE: &str = "{{ bos_token }}\n{% for m in messages %}\n    {% if m['role'] == 'system' %}\n[SYS] {{ m['content'].strip() }}\n    {% elif m.content.startswith('skip') %}\n        {% continue %}\n    {% else %}\n[{{ m.role | upper }} {{ loop.index }}/{{ loop.length }}{% if loop.last %} last{% endif %}] {{ m['content'] | trim }}\n    {% endif %}\n{% endfor %}\n{{ {'role': 'tool', 'args': [1, 2.5, none, true], 'text': '\u{e9} \"q\"\\n'} | tojson }}\n{{ messages[0] | tojson(indent=2) }}\n{% if add_generation_prompt %}\n[ASSISTANT]{{ eos_token }}\n{% endif %}";
const RENDERED: &str = "<s>\n[SYS] be brief\n[USER 2/4] hi there\n[ASSISTANT 4/4 last] hello\n{\"role\": \"tool\", \"args\": [1, 2.5, null, true], \"text\": \"\u{e9} \\\"q\\\"\\n\"}\n{\n  \"role\": \"system\",\n  \"content\": \"  be brief  \"\n}\n[ASSISTANT]</s>\n";

fn template_messages() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("  be brief  "),
        ChatMessage::user("hi there "),
        ChatMessage::user("skip me"),
        ChatMessage::assistant("hello"),
    ]
}

#[test]
fn chat_template_renders_like_jinja2() {
    let t = ChatTemplate::new(TEMPLATE, "<s>", "</s>").unwrap();
    assert_eq!(t.render(&template_messages(), true).unwrap(), RENDERED);
    let no_gen = t.render(&template_messages(), false).unwrap();
    assert_eq!(no_gen, RENDERED.replace("[ASSISTANT]</s>\n", ""));

    // JSON messages and extra variables (tools etc.).
    let t = ChatTemplate::new(
        "{% for m in messages %}{{ m.role }}:{{ m.content[0].text }};{% endfor %}{{ tools | tojson }}{{ x.items() | list | length }}",
        "",
        "",
    )
    .unwrap();
    let out = t
        .render_json(
            &json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
            false,
            Some(&json!({"tools": [{"name": "f", "parameters": {}}], "x": {"a": 1, "b": 2}})),
        )
        .unwrap();
    assert_eq!(out, "user:hi;[{\"name\": \"f\", \"parameters\": {}}]2");

    // strftime_now is available (UTC); its year is four digits.
    let t = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
    let year = t.render(&[], false).unwrap();
    assert!(year.len() == 4 && year.starts_with('2'), "{year}");
}

#[test]
fn chat_template_errors() {
    let t = ChatTemplate::new(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}ok",
        "",
        "",
    )
    .unwrap();
    assert_eq!(t.render(&[ChatMessage::user("x")], false).unwrap(), "ok");
    match t.render(&[ChatMessage::assistant("x")], false) {
        Err(TemplateError::Raised(m)) => {
            assert_eq!(
                m,
                "Conversation roles must alternate user/assistant/user/assistant/..."
            )
        }
        other => panic!("expected Raised, got {other:?}"),
    }
    assert!(matches!(
        ChatTemplate::new("{% for m in messages %}", "", ""),
        Err(TemplateError::Syntax(_))
    ));
    let t = ChatTemplate::new("{{ messages[0].content.nosuchmethod() }}", "", "").unwrap();
    assert!(matches!(
        t.render(&[ChatMessage::user("x")], false),
        Err(TemplateError::Render(_))
    ));
}

#[test]
fn chat_template_from_tokenizer_config() {
    let tmp = tempfile::Builder::new()
        .prefix("mlx-backend-tpl-")
        .tempdir()
        .unwrap();
    let dir = tmp.path();

    let single = dir.join("single.json");
    std::fs::write(
        &single,
        json!({"chat_template": TEMPLATE, "bos_token": "<s>",
               "eos_token": {"content": "</s>", "special": true}})
        .to_string(),
    )
    .unwrap();
    let t = ChatTemplate::from_tokenizer_config(&single).unwrap();
    assert_eq!(t.render(&template_messages(), true).unwrap(), RENDERED);

    let named = dir.join("named.json");
    std::fs::write(
        &named,
        json!({"chat_template": [
                  {"name": "default", "template": "D{{ messages | length }}"},
                  {"name": "tool_use", "template": "T{{ eos_token }}"}],
               "eos_token": "</s>"})
        .to_string(),
    )
    .unwrap();
    let msgs = [ChatMessage::user("a"), ChatMessage::assistant("b")];
    let t = ChatTemplate::from_tokenizer_config(&named).unwrap();
    assert_eq!(t.render(&msgs, false).unwrap(), "D2");
    let t = ChatTemplate::from_tokenizer_config_named(&named, "tool_use").unwrap();
    assert_eq!(t.render(&msgs, false).unwrap(), "T</s>");
    match ChatTemplate::from_tokenizer_config_named(&named, "rag") {
        Err(TemplateError::MissingNamed {
            name, available, ..
        }) => {
            assert_eq!(name, "rag");
            assert_eq!(available, vec!["default", "tool_use"]);
        }
        other => panic!("expected MissingNamed, got {other:?}"),
    }

    let none = dir.join("none.json");
    std::fs::write(&none, json!({"bos_token": "<s>"}).to_string()).unwrap();
    let err = ChatTemplate::from_tokenizer_config(&none).unwrap_err();
    assert!(
        matches!(err, TemplateError::MissingKey { ref key, ref path } if key == "chat_template" && path.ends_with("none.json")),
        "{err:?}"
    );
    // A chat_template.jinja beside the config is used when the key is absent.
    std::fs::write(dir.join("chat_template.jinja"), "J{{ bos_token }}").unwrap();
    let t = ChatTemplate::from_tokenizer_config(&none).unwrap();
    assert_eq!(t.render(&msgs, false).unwrap(), "J<s>");

    let err = ChatTemplate::from_tokenizer_config(dir.join("absent.json")).unwrap_err();
    assert!(matches!(err, TemplateError::NotFound { .. }), "{err:?}");
    tmp.close().unwrap();
}
