//! Tensor files: safetensors (load and save, with metadata) and GGUF (load,
//! with typed metadata; MLX maps Q4_0/Q4_1/Q8_0 blocks to affine-quantized
//! arrays with `<name>.scales` / `<name>.biases` companions).
//!
//! Files are checked before MLX reads them, so a truncated or lying file is a
//! [`LoadError`] and never a crash; tensor data is read lazily on first eval.

use crate::array::{list, Array};
use crate::error::{LoadError, SaveError};
use crate::ffi;
use crate::gguf_check;
use cxx::UniquePtr;
use std::collections::BTreeMap;
use std::path::Path;

fn path_str(path: &Path) -> Result<&str, LoadError> {
    path.to_str().ok_or_else(|| LoadError::Invalid {
        path: path.display().to_string(),
        message: "path is not valid UTF-8".into(),
    })
}

/// Map `path` read-only and run `check` over its bytes (it reads only what
/// it needs, e.g. the header), so MLX's reader never sees a malformed file.
/// Returns the path for messages.
fn check_file(
    path: &Path,
    kind: &str,
    check: impl FnOnce(&[u8]) -> Result<(), String>,
) -> Result<String, LoadError> {
    let display = path.display().to_string();
    let invalid = |message: String| LoadError::Invalid {
        path: display.clone(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LoadError::NotFound {
            path: display.clone(),
        },
        _ => invalid(e.to_string()),
    })?;
    // SAFETY: the map is read-only and dropped before this function returns.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| invalid(e.to_string()))?;
    check(&map).map_err(|e| invalid(format!("invalid {kind} file: {e}")))?;
    Ok(display)
}

/// A loaded `.safetensors` file.
pub struct SafetensorsFile {
    raw: UniquePtr<ffi::SafetensorsFile>,
    path: String,
}

impl SafetensorsFile {
    /// Validate the header against the file (offsets, sizes, dtypes) and load it.
    pub fn load(path: impl AsRef<Path>) -> Result<SafetensorsFile, LoadError> {
        let path = path.as_ref();
        let display = check_file(path, "safetensors", |bytes| {
            safetensors::SafeTensors::read_metadata(bytes)
                .map(|_| ())
                .map_err(|e| e.to_string())
        })?;
        let raw = ffi::load_safetensors(path_str(path)?).map_err(|e| LoadError::Invalid {
            path: display.clone(),
            message: e.what().into(),
        })?;
        Ok(SafetensorsFile { raw, path: display })
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Vec<String> {
        ffi::safetensors_names(&self.raw)
    }

    pub fn get(&self, name: &str) -> Result<Array, LoadError> {
        ffi::safetensors_get(&self.raw, name)
            .map(Array::from_raw)
            .map_err(|_| LoadError::MissingTensor {
                path: self.path.clone(),
                name: name.into(),
            })
    }

    /// The header's `__metadata__` strings.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        ffi::safetensors_metadata_keys(&self.raw)
            .into_iter()
            .filter_map(|k| {
                let v = ffi::safetensors_metadata_get(&self.raw, &k).ok()?;
                Some((k, v))
            })
            .collect()
    }

    /// All tensors by name.
    pub fn tensors(&self) -> BTreeMap<String, Array> {
        self.names()
            .into_iter()
            .filter_map(|n| self.get(&n).ok().map(|a| (n, a)))
            .collect()
    }
}

/// Save arrays (evaluated as needed) with string metadata.
pub fn save_safetensors(
    path: impl AsRef<Path>,
    tensors: &[(&str, &Array)],
    metadata: &[(&str, &str)],
) -> Result<(), SaveError> {
    let path = path.as_ref();
    let display = path.display().to_string();
    let path_str = path.to_str().ok_or_else(|| SaveError {
        path: display.clone(),
        message: "path is not valid UTF-8".into(),
    })?;
    let names: Vec<String> = tensors.iter().map(|(n, _)| n.to_string()).collect();
    let arrays: Vec<&Array> = tensors.iter().map(|(_, a)| *a).collect();
    let keys: Vec<String> = metadata.iter().map(|(k, _)| k.to_string()).collect();
    let values: Vec<String> = metadata.iter().map(|(_, v)| v.to_string()).collect();
    ffi::save_safetensors(path_str, &names, &list(&arrays), &keys, &values).map_err(|e| SaveError {
        path: display,
        message: e.what().into(),
    })
}

/// One GGUF metadata value, as MLX reads it.
#[derive(Debug)]
pub enum GgufValue {
    /// Numbers and booleans (0-d for scalars, 1-d for arrays).
    Array(Array),
    String(String),
    Strings(Vec<String>),
}

/// A loaded GGUF file.
pub struct GgufFile {
    raw: UniquePtr<ffi::GgufFile>,
    path: String,
}

impl GgufFile {
    /// Check the file's structure (header, metadata, tensor table, data
    /// extents) and load it through MLX's GGUF reader.
    pub fn load(path: impl AsRef<Path>) -> Result<GgufFile, LoadError> {
        let path = path.as_ref();
        let display = check_file(path, "GGUF", |bytes| {
            gguf_check::check(bytes).map_err(|e| e.to_string())
        })?;
        let raw = ffi::load_gguf(path_str(path)?).map_err(|e| LoadError::Invalid {
            path: display.clone(),
            message: e.what().into(),
        })?;
        Ok(GgufFile { raw, path: display })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Tensor names, sorted (quantized tensors come with `.scales`/`.biases`).
    pub fn names(&self) -> Vec<String> {
        ffi::gguf_names(&self.raw)
    }

    pub fn get(&self, name: &str) -> Result<Array, LoadError> {
        ffi::gguf_get(&self.raw, name)
            .map(Array::from_raw)
            .map_err(|_| LoadError::MissingTensor {
                path: self.path.clone(),
                name: name.into(),
            })
    }

    pub fn metadata_keys(&self) -> Vec<String> {
        ffi::gguf_metadata_keys(&self.raw)
    }

    pub fn metadata(&self, key: &str) -> Option<GgufValue> {
        match ffi::gguf_metadata_kind(&self.raw, key) {
            1 => ffi::gguf_metadata_array(&self.raw, key)
                .ok()
                .map(|a| GgufValue::Array(Array::from_raw(a))),
            2 => ffi::gguf_metadata_string(&self.raw, key)
                .ok()
                .map(GgufValue::String),
            3 => ffi::gguf_metadata_strings(&self.raw, key)
                .ok()
                .map(GgufValue::Strings),
            _ => None,
        }
    }

    fn missing(&self, key: &str) -> LoadError {
        LoadError::MissingMetadata {
            path: self.path.clone(),
            key: key.into(),
        }
    }

    pub fn metadata_string(&self, key: &str) -> Result<String, LoadError> {
        match self.metadata(key) {
            Some(GgufValue::String(s)) => Ok(s),
            _ => Err(self.missing(key)),
        }
    }

    pub fn metadata_strings(&self, key: &str) -> Result<Vec<String>, LoadError> {
        match self.metadata(key) {
            Some(GgufValue::Strings(s)) => Ok(s),
            _ => Err(self.missing(key)),
        }
    }

    /// A numeric scalar (integers, floats and booleans) as f64.
    pub fn metadata_f64(&self, key: &str) -> Result<f64, LoadError> {
        match self.metadata(key) {
            Some(GgufValue::Array(a)) if a.size() == 1 => a
                .astype(crate::Dtype::F64)
                .ok()
                .and_then(|a| a.item::<f64>().ok())
                .ok_or_else(|| self.missing(key)),
            _ => Err(self.missing(key)),
        }
    }

    /// A numeric array as f64 values.
    pub fn metadata_f64s(&self, key: &str) -> Result<Vec<f64>, LoadError> {
        match self.metadata(key) {
            Some(GgufValue::Array(a)) => a
                .astype(crate::Dtype::F64)
                .ok()
                .and_then(|a| a.to_vec::<f64>().ok())
                .ok_or_else(|| self.missing(key)),
            _ => Err(self.missing(key)),
        }
    }
}
