//! Tensor files: safetensors (load and save, with metadata) and GGUF (load,
//! with typed metadata; MLX maps Q4_0/Q4_1/Q8_0 blocks to affine-quantized
//! arrays with `<name>.scales` / `<name>.biases` companions).
//!
//! Files are checked before MLX reads them, so a truncated or lying file is a
//! [`LoadError`] and never a crash; tensor data is read lazily on first eval.

use crate::array::{list, Array};
use crate::error::{HostDataError, LoadError, SaveError};
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

/// Why reading tensor `name` failed: the file has no such tensor, or MLX
/// could not read the one it has (its message kept).
fn tensor_error(path: &str, names: &[String], name: &str, e: &cxx::Exception) -> LoadError {
    if names.iter().any(|n| n == name) {
        LoadError::Invalid {
            path: path.to_string(),
            message: format!("tensor '{name}': {}", e.what()),
        }
    } else {
        LoadError::MissingTensor {
            path: path.to_string(),
            name: name.into(),
        }
    }
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

    /// The tensor `name`.
    pub fn get(&self, name: &str) -> Result<Array, LoadError> {
        ffi::safetensors_get(&self.raw, name)
            .map(Array::from_raw)
            .map_err(|e| tensor_error(&self.path, &self.names(), name, &e))
    }

    /// The header's `__metadata__` strings.
    pub fn metadata(&self) -> Result<BTreeMap<String, String>, LoadError> {
        ffi::safetensors_metadata_keys(&self.raw)
            .into_iter()
            .map(|k| {
                let v = ffi::safetensors_metadata_get(&self.raw, &k).map_err(|e| {
                    LoadError::Invalid {
                        path: self.path.clone(),
                        message: format!("metadata key '{k}': {}", e.what()),
                    }
                })?;
                Ok((k, v))
            })
            .collect()
    }

    /// All tensors by name.
    pub fn tensors(&self) -> Result<BTreeMap<String, Array>, LoadError> {
        self.names()
            .into_iter()
            .map(|n| Ok((n.clone(), self.get(&n)?)))
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
    /// A string.
    String(String),
    /// An array of strings.
    Strings(Vec<String>),
}

impl GgufValue {
    /// What kind of value this is, for messages ("a uint32 scalar").
    pub fn kind(&self) -> String {
        match self {
            GgufValue::Array(a) if a.ndim() == 0 => format!("a {} scalar", a.dtype()),
            GgufValue::Array(a) => format!("a {} array of {}", a.dtype(), a.size()),
            GgufValue::String(_) => "a string".into(),
            GgufValue::Strings(s) => format!("a string array of {}", s.len()),
        }
    }
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

    /// The file's path, as given.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Tensor names, sorted (quantized tensors come with `.scales`/`.biases`).
    pub fn names(&self) -> Vec<String> {
        ffi::gguf_names(&self.raw)
    }

    /// The tensor `name`, as MLX's GGUF reader gives it.
    pub fn get(&self, name: &str) -> Result<Array, LoadError> {
        ffi::gguf_get(&self.raw, name)
            .map(Array::from_raw)
            .map_err(|e| tensor_error(&self.path, &self.names(), name, &e))
    }

    /// Every metadata key.
    pub fn metadata_keys(&self) -> Vec<String> {
        ffi::gguf_metadata_keys(&self.raw)
    }

    /// The value under `key`: `Ok(None)` when the file has no such key, an
    /// error (with MLX's message) when it has one that cannot be read.
    pub fn metadata(&self, key: &str) -> Result<Option<GgufValue>, LoadError> {
        let failed = |e: cxx::Exception| LoadError::MetadataRead {
            path: self.path.clone(),
            key: key.into(),
            source: HostDataError::Mlx(e.what().into()),
        };
        Ok(match ffi::gguf_metadata_kind(&self.raw, key) {
            1 => Some(GgufValue::Array(Array::from_raw(
                ffi::gguf_metadata_array(&self.raw, key).map_err(failed)?,
            ))),
            2 => Some(GgufValue::String(
                ffi::gguf_metadata_string(&self.raw, key).map_err(failed)?,
            )),
            3 => Some(GgufValue::Strings(
                ffi::gguf_metadata_strings(&self.raw, key).map_err(failed)?,
            )),
            _ => None,
        })
    }

    fn missing(&self, key: &str) -> LoadError {
        LoadError::MissingMetadata {
            path: self.path.clone(),
            key: key.into(),
        }
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &GgufValue) -> LoadError {
        LoadError::MetadataType {
            path: self.path.clone(),
            key: key.into(),
            expected,
            found: found.kind(),
        }
    }

    /// A required value: absent is [`LoadError::MissingMetadata`].
    fn required<T>(&self, key: &str, value: Option<T>) -> Result<T, LoadError> {
        value.ok_or_else(|| self.missing(key))
    }

    /// A string value; an error when the key is absent or not a string.
    pub fn metadata_string(&self, key: &str) -> Result<String, LoadError> {
        let v = self.opt_metadata_string(key)?;
        self.required(key, v)
    }

    /// A string value, `Ok(None)` when the key is absent.
    pub fn opt_metadata_string(&self, key: &str) -> Result<Option<String>, LoadError> {
        match self.metadata(key)? {
            None => Ok(None),
            Some(GgufValue::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong_type(key, "a string", &other)),
        }
    }

    /// A string-array value; an error when the key is absent or not one.
    pub fn metadata_strings(&self, key: &str) -> Result<Vec<String>, LoadError> {
        let v = self.opt_metadata_strings(key)?;
        self.required(key, v)
    }

    /// A string array, `Ok(None)` when the key is absent.
    pub fn opt_metadata_strings(&self, key: &str) -> Result<Option<Vec<String>>, LoadError> {
        match self.metadata(key)? {
            None => Ok(None),
            Some(GgufValue::Strings(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong_type(key, "a string array", &other)),
        }
    }

    /// A numeric scalar (integers, floats and booleans) as f64.
    pub fn metadata_f64(&self, key: &str) -> Result<f64, LoadError> {
        let v = self.opt_metadata_f64(key)?;
        self.required(key, v)
    }

    /// A numeric scalar as f64, `Ok(None)` when the key is absent. Read on
    /// the host, so it works whatever the default device is (MLX has no
    /// float64 on a GPU).
    pub fn opt_metadata_f64(&self, key: &str) -> Result<Option<f64>, LoadError> {
        match self.metadata(key)? {
            None => Ok(None),
            Some(GgufValue::Array(a)) if a.size() == 1 => {
                Ok(self.numbers(key, &a)?.first().copied())
            }
            Some(other) => Err(self.wrong_type(key, "a number", &other)),
        }
    }

    /// A numeric array as f64 values.
    pub fn metadata_f64s(&self, key: &str) -> Result<Vec<f64>, LoadError> {
        let v = self.opt_metadata_f64s(key)?;
        self.required(key, v)
    }

    /// A numeric array as f64 values, `Ok(None)` when the key is absent.
    pub fn opt_metadata_f64s(&self, key: &str) -> Result<Option<Vec<f64>>, LoadError> {
        match self.metadata(key)? {
            None => Ok(None),
            Some(GgufValue::Array(a)) => self.numbers(key, &a).map(Some),
            Some(other) => Err(self.wrong_type(key, "a numeric array", &other)),
        }
    }

    fn numbers(&self, key: &str, a: &Array) -> Result<Vec<f64>, LoadError> {
        a.to_f64_vec().map_err(|source| LoadError::MetadataRead {
            path: self.path.clone(),
            key: key.into(),
            source,
        })
    }
}
