//! Chat templates: a model's Jinja template rendered with `minijinja` the way
//! HF transformers' `apply_chat_template` renders it (`trim_blocks` and
//! `lstrip_blocks` on, `{% break %}`/`{% continue %}`, Python string/dict/list
//! methods such as `.strip()`, `.startswith()`, `.items()`, and the helpers
//! HF adds: `raise_exception`, a Python-`json.dumps`-style `tojson` and
//! `strftime_now`).

use super::error::TemplateError;
use crate::io::GgufFile;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use std::path::Path;

const TEMPLATE_NAME: &str = "chat_template";
/// Prefix that marks an error as coming from the template's own
/// `raise_exception(...)`.
const RAISED: &str = "raise_exception: ";

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or another role the template knows.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message of any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    fn to_value(&self) -> Value {
        Value::from_pairs([
            ("role", Value::from(self.role.as_str())),
            ("content", Value::from(self.content.as_str())),
        ])
    }
}

/// A compiled chat template plus the `bos_token` / `eos_token` strings it is
/// rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

fn read_config(path: &Path) -> Result<serde_json::Value, TemplateError> {
    let display = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => TemplateError::NotFound {
            path: display.clone(),
        },
        _ => TemplateError::Invalid {
            path: display.clone(),
            message: e.to_string(),
        },
    })?;
    serde_json::from_str(&text).map_err(|e| TemplateError::Invalid {
        path: display,
        message: format!("not valid JSON: {e}"),
    })
}

fn config_token(config: &serde_json::Value, key: &str) -> String {
    match config.get(key) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Object(o)) => o
            .get("content")
            .and_then(|c| c.as_str())
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// Compile `source` (checked now, so a broken template fails here and not
    /// on the first request).
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, TemplateError> {
        let source = source.into();
        let mut env = Environment::new();
        let mut syntax = minijinja::syntax::SyntaxConfig::builder();
        syntax.trim_blocks(true).lstrip_blocks(true);
        env.set_syntax(
            syntax
                .build()
                .map_err(|e| TemplateError::Syntax(e.to_string()))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{RAISED}{message}"),
                ))
            },
        );
        env.add_function("strftime_now", |format: String| -> String {
            strftime_now(&format)
        });
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// The template of a HF `tokenizer_config.json`: its `chat_template`
    /// (a string, or a list of `{name, template}` of which `"default"` is
    /// taken) or else a `chat_template.jinja` beside it; `bos_token` and
    /// `eos_token` come from the same config.
    pub fn from_tokenizer_config(path: impl AsRef<Path>) -> Result<ChatTemplate, TemplateError> {
        Self::from_tokenizer_config_named(path, "default")
    }

    /// [`from_tokenizer_config`](Self::from_tokenizer_config) choosing a
    /// named template (e.g. `"tool_use"`) when the config lists several.
    pub fn from_tokenizer_config_named(
        path: impl AsRef<Path>,
        name: &str,
    ) -> Result<ChatTemplate, TemplateError> {
        let path = path.as_ref();
        let display = path.display().to_string();
        let config = read_config(path)?;
        let bos = config_token(&config, "bos_token");
        let eos = config_token(&config, "eos_token");
        let source = match config.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => {
                let named: Vec<(String, String)> = list
                    .iter()
                    .filter_map(|t| {
                        Some((
                            t.get("name")?.as_str()?.to_string(),
                            t.get("template")?.as_str()?.to_string(),
                        ))
                    })
                    .collect();
                match named.iter().find(|(n, _)| n == name) {
                    Some((_, t)) => t.clone(),
                    None => {
                        return Err(TemplateError::MissingNamed {
                            path: display,
                            name: name.into(),
                            available: named.into_iter().map(|(n, _)| n).collect(),
                        })
                    }
                }
            }
            Some(_) => {
                return Err(TemplateError::Invalid {
                    path: display,
                    message: "'chat_template' is neither a string nor a list of named templates"
                        .into(),
                })
            }
            None => {
                let jinja = path
                    .parent()
                    .unwrap_or(Path::new("."))
                    .join("chat_template.jinja");
                std::fs::read_to_string(&jinja).map_err(|_| TemplateError::MissingKey {
                    path: display,
                    key: "chat_template".into(),
                })?
            }
        };
        Self::new(source, bos, eos)
    }

    /// The template of a GGUF file (`tokenizer.chat_template`), rendered with
    /// the texts of its BOS/EOS tokens.
    pub fn from_gguf(gguf: &GgufFile) -> Result<ChatTemplate, TemplateError> {
        let key = "tokenizer.chat_template";
        let source = gguf
            .opt_metadata_string(key)?
            .ok_or_else(|| TemplateError::MissingKey {
                path: gguf.path().into(),
                key: key.into(),
            })?;
        let tokens = gguf
            .opt_metadata_strings("tokenizer.ggml.tokens")?
            .unwrap_or_default();
        let text_of = |key: &str| -> Result<String, TemplateError> {
            Ok(gguf
                .opt_metadata_f64(key)?
                .filter(|&v| v >= 0.0)
                .and_then(|v| tokens.get(v as usize).cloned())
                .unwrap_or_default())
        };
        let bos = text_of("tokenizer.ggml.bos_token_id")?;
        let eos = text_of("tokenizer.ggml.eos_token_id")?;
        Self::new(source, bos, eos)
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The text the template sees as `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The text the template sees as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Render `messages`; `add_generation_prompt` appends the opening of the
    /// assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let messages: Value = messages.iter().map(ChatMessage::to_value).collect();
        self.render_value(messages, add_generation_prompt, None)
    }

    /// Render messages given as JSON (content parts, tool calls, ...) with
    /// extra template variables (e.g. `tools`, `documents`) from `extra`,
    /// which must be a JSON object when given.
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        extra: Option<&serde_json::Value>,
    ) -> Result<String, TemplateError> {
        self.render_value(json_to_value(messages), add_generation_prompt, extra)
    }

    fn render_value(
        &self,
        messages: Value,
        add_generation_prompt: bool,
        extra: Option<&serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let mut ctx: Vec<(String, Value)> = Vec::new();
        if let Some(extra) = extra {
            let serde_json::Value::Object(map) = extra else {
                return Err(TemplateError::Render(
                    "extra template variables must be a JSON object".into(),
                ));
            };
            for (k, v) in map {
                ctx.push((k.clone(), json_to_value(v)));
            }
        }
        ctx.push(("messages".into(), messages));
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        ctx.push(("bos_token".into(), Value::from(self.bos_token.as_str())));
        ctx.push(("eos_token".into(), Value::from(self.eos_token.as_str())));
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        template
            .render(Value::from_pairs(ctx))
            .map_err(|e| match raised_message(&e) {
                Some(m) => TemplateError::Raised(m),
                None => TemplateError::Render(describe(&e)),
            })
    }
}

/// The error with its cause chain, on one line.
fn describe(e: &Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn raised_message(e: &Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(mj) = err.downcast_ref::<Error>() {
            if let Some(m) = mj.detail().and_then(|d| d.strip_prefix(RAISED)) {
                return Some(m.to_string());
            }
        }
        cur = err.source();
    }
    None
}

fn json_to_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => a.iter().map(json_to_value).collect(),
        serde_json::Value::Object(o) => {
            Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), json_to_value(v))))
        }
    }
}

/// `tojson` as HF defines it: Python's `json.dumps(x, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let opts = JsonOpts {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
        item_sep,
        key_sep,
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonOpts {
    indent: Option<usize>,
    sort_keys: bool,
    ensure_ascii: bool,
    item_sep: String,
    key_sep: String,
}

fn json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_newline(out: &mut String, opts: &JsonOpts, depth: usize) {
    if let Some(n) = opts.indent {
        out.push('\n');
        out.push_str(&" ".repeat(n * depth));
    }
}

fn write_json(out: &mut String, v: &Value, opts: &JsonOpts, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else {
                    // Rust's shortest round-trip form, which is Python's repr
                    // for all but exponent spelling.
                    out.push_str(&format!("{f:?}"));
                }
            }
        }
        ValueKind::String => json_string(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                json_newline(out, opts, depth + 1);
                match k.as_str() {
                    Some(s) => json_string(out, s, opts.ensure_ascii),
                    None => json_string(out, &k.to_string(), opts.ensure_ascii),
                }
                out.push_str(&opts.key_sep);
                write_json(out, &v.get_item(k)?, opts, depth + 1)?;
            }
            json_newline(out, opts, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                json_newline(out, opts, depth + 1);
                write_json(out, item, opts, depth + 1)?;
            }
            json_newline(out, opts, depth);
            out.push(']');
        }
        _ => json_string(out, &v.to_string(), opts.ensure_ascii),
    }
    Ok(())
}

/// Python's `datetime.now().strftime(format)` for the common directives, in
/// UTC.
fn strftime_now(format: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (proleptic
/// Gregorian calendar, computed over 400-year eras).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn strftime(format: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, (secs / 60) % 60, secs % 60);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let is_leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cumulative[month as usize - 1] + day as i64 + i64::from(month > 2 && is_leap(year));
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        // `%-d` (glibc): no zero padding.
        let pad = spec != Some('-');
        if !pad {
            spec = chars.next();
        }
        let num = |v: i64, width: usize| {
            if pad {
                format!("{v:0width$}")
            } else {
                v.to_string()
            }
        };
        match spec {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&num(year.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(month as i64, 2)),
            Some('d') => out.push_str(&num(day as i64, 2)),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('j') => out.push_str(&num(yday, 3)),
            Some('H') => out.push_str(&num(hour, 2)),
            Some('I') => out.push_str(&num(hour12, 2)),
            Some('M') => out.push_str(&num(minute, 2)),
            Some('S') => out.push_str(&num(second, 2)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('b') | Some('h') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if !pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(strftime("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %-d, %j %I%p %%", t),
            "Thursday February 29, 060 01PM %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
        assert_eq!(strftime("%Y-%m-%d %a", 951_782_400), "2000-02-29 Tue");
    }
}
