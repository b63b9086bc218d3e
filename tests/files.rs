//! Safetensors and GGUF files: round trips, and every kind of broken file is
//! an `Err` with a message after which the process keeps working. The real
//! default model is checked when it is on disk.

mod common;

use common::*;
use mlx_backend::io::{save_safetensors, GgufFile, SafetensorsFile};
use mlx_backend::{bf16, check_gguf, f16, Array, Dtype, Element, LoadError};
use std::path::{Path, PathBuf};

fn typed<T: Element>(rng: &mut Rng, f: impl Fn(u64) -> T) -> (Array, Vec<T>) {
    let data: Vec<T> = (0..12).map(|_| f(rng.next_u64())).collect();
    (arr(&data, &[3, 4]), data)
}

#[track_caller]
fn same<T: Element + PartialEq + std::fmt::Debug>(file: &SafetensorsFile, name: &str, data: &[T]) {
    let a = file.get(name).unwrap();
    assert_eq!((a.dtype(), a.shape()), (T::DTYPE, vec![3, 4]), "{name}");
    assert_eq!(a.to_vec::<T>().unwrap(), data, "{name}");
}

#[test]
fn safetensors_round_trip_every_dtype() {
    let mut rng = Rng::new(101);
    let r = &mut rng;
    let (b, vb) = typed(r, |x| x & 1 == 1);
    let (u8a, vu8) = typed(r, |x| x as u8);
    let (u16a, vu16) = typed(r, |x| x as u16);
    let (u32a, vu32) = typed(r, |x| x as u32);
    let (u64a, vu64) = typed(r, |x| x);
    let (i8a, vi8) = typed(r, |x| x as i8);
    let (i16a, vi16) = typed(r, |x| x as i16);
    let (i32a, vi32) = typed(r, |x| x as i32);
    let (i64a, vi64) = typed(r, |x| x as i64);
    let (f16a, vf16) = typed(r, |x| f16::from_f64((x % 2000) as f64 / 7.0 - 100.0));
    let (bf16a, vbf16) = typed(r, |x| bf16::from_f64((x % 2000) as f64 / 7.0 - 100.0));
    let (f32a, vf32) = typed(r, |x| (x % 100_000) as f32 / 3.0 - 1000.0);
    let (c64_real, vc64) = typed(r, |x| (x % 100_000) as f32 / 3.0 - 1000.0);
    let c64a = c64_real.astype(Dtype::Complex64).unwrap();
    let tmp = temp_dir("st");
    let dir = tmp.path();
    let path = dir.join("all.safetensors");
    let tensors: Vec<(&str, &Array)> = vec![
        ("bool", &b),
        ("u8", &u8a),
        ("u16", &u16a),
        ("u32", &u32a),
        ("u64", &u64a),
        ("i8", &i8a),
        ("i16", &i16a),
        ("i32", &i32a),
        ("i64", &i64a),
        ("f16", &f16a),
        ("bf16", &bf16a),
        ("f32", &f32a),
        ("c64", &c64a),
    ];
    let metadata = [("format", "mlx"), ("note", "round trip ✓"), ("empty", "")];
    save_safetensors(&path, &tensors, &metadata).unwrap();

    let file = SafetensorsFile::load(&path).unwrap();
    let mut names: Vec<&str> = tensors.iter().map(|(n, _)| *n).collect();
    names.sort();
    assert_eq!(file.names(), names);
    let meta = file.metadata().unwrap();
    assert_eq!(meta.len(), 3);
    for (k, v) in metadata {
        assert_eq!(meta.get(k).map(String::as_str), Some(v), "metadata {k}");
    }
    same(&file, "bool", &vb);
    same(&file, "u8", &vu8);
    same(&file, "u16", &vu16);
    same(&file, "u32", &vu32);
    same(&file, "u64", &vu64);
    same(&file, "i8", &vi8);
    same(&file, "i16", &vi16);
    same(&file, "i32", &vi32);
    same(&file, "i64", &vi64);
    same(&file, "f16", &vf16);
    same(&file, "bf16", &vbf16);
    same(&file, "f32", &vf32);
    let c64 = file.get("c64").unwrap();
    assert_eq!(c64.dtype(), Dtype::Complex64);
    assert_eq!(
        c64.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap(),
        vc64
    );
    assert_eq!(file.tensors().unwrap().len(), 13);
    assert!(matches!(
        file.get("nope"),
        Err(LoadError::MissingTensor { .. })
    ));

    // Views (a transpose) are saved as their values, not their storage.
    let (x, xa) = rng.array(&[2, 3]);
    let t = xa.t().unwrap();
    let vpath = dir.join("view.safetensors");
    save_safetensors(&vpath, &[("t", &t)], &[]).unwrap();
    let back = SafetensorsFile::load(&vpath).unwrap().get("t").unwrap();
    let expected: Vec<f64> = (0..6).map(|i| x[(i % 2) * 3 + i / 2] as f64).collect();
    assert_close(&f32s(&back), &expected, 0.0, 0.0, "saved view");
    assert!(SafetensorsFile::load(&vpath)
        .unwrap()
        .metadata()
        .unwrap()
        .is_empty());

    // MLX 0.32 writes no float64 safetensors: an error, not a crash. The
    // f64 array is made on the CPU (MLX has no float64 on a GPU).
    let f64_array = mlx_backend::Device::Cpu
        .default_stream()
        .unwrap()
        .scope(|| xa.astype(Dtype::F64).unwrap());
    let e = save_safetensors(dir.join("f64.safetensors"), &[("d", &f64_array)], &[])
        .expect_err("MLX cannot save float64");
    // MLX names the dtype (or, saving from a GPU stream, float64 itself).
    let message = e.to_string();
    assert!(
        message.contains("dtype") || message.contains("float64"),
        "{e}"
    );
    assert_still_works();
}

#[track_caller]
fn assert_load_err<T>(r: Result<T, LoadError>, what: &str) {
    match r {
        Ok(_) => panic!("{what}: loaded"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.len() > 10, "{what}: message {msg:?}");
        }
    }
    assert_still_works();
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A safetensors file from a raw header string and data bytes.
fn safetensors_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    b
}

#[test]
fn broken_safetensors_are_errors() {
    let tmp = temp_dir("st-bad");
    let dir = tmp.path();
    assert!(matches!(
        SafetensorsFile::load(dir.join("missing.safetensors")),
        Err(LoadError::NotFound { .. })
    ));
    assert_load_err(SafetensorsFile::load(dir), "a directory");

    let good_path = dir.join("good.safetensors");
    let (_, a) = Rng::new(102).array(&[8, 8]);
    save_safetensors(&good_path, &[("a", &a), ("b", &a)], &[("k", "v")]).unwrap();
    let good = std::fs::read(&good_path).unwrap();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let cuts = [
        0,
        4,
        8,
        9,
        header_len / 2,
        header_len + 7,
        header_len + 8,
        header_len + 100,
        good.len() - 1,
    ];
    for cut in cuts {
        let p = write(dir, &format!("cut{cut}.safetensors"), &good[..cut]);
        assert_load_err(SafetensorsFile::load(&p), &format!("truncated at {cut}"));
    }

    let data = [0u8; 16];
    let lies = [
        // Sizes that lie: the offsets claim more data than there is.
        r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,64]}}"#,
        // Shape and offsets disagree.
        r#"{"w":{"dtype":"F32","shape":[8],"data_offsets":[0,16]}}"#,
        // Overlapping tensors.
        r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"v":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#,
        r#"{"w":{"dtype":"F99","shape":[4],"data_offsets":[0,16]}}"#,
        r#"{"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}}"#,
        r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}}"#,
        r#"{"w":{"dtype":"F32","shape":[4]}}"#,
        r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]"#,
        r#"["not", "an", "object"]"#,
    ];
    for (i, header) in lies.iter().enumerate() {
        let p = write(
            dir,
            &format!("lie{i}.safetensors"),
            &safetensors_bytes(header, &data),
        );
        assert_load_err(SafetensorsFile::load(&p), header);
    }
    // A header length far beyond the file.
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let p = write(dir, "huge.safetensors", &huge);
    assert_load_err(SafetensorsFile::load(&p), "huge header length");
    // Garbage.
    let mut rng = Rng::new(103);
    for n in [0usize, 3, 8, 100, 5000] {
        let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
        let p = write(dir, &format!("garbage{n}.safetensors"), &bytes);
        assert_load_err(SafetensorsFile::load(&p), &format!("{n} garbage bytes"));
    }
    // The good file still loads after all that.
    let f = SafetensorsFile::load(&good_path).unwrap();
    assert_close(
        &f32s(&f.get("b").unwrap()),
        &to_f64(&f32s(&a)),
        0.0,
        0.0,
        "good file",
    );
}

/// GGUF writer for the tests: string/u32/f32/array metadata and F32/F16 tensors.
struct Gguf {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

impl Gguf {
    fn new() -> Gguf {
        Gguf {
            kv: Vec::new(),
            n_kv: 0,
            tensors: Vec::new(),
        }
    }

    fn key(&mut self, key: &str, value_type: u32) {
        self.kv.extend_from_slice(&(key.len() as u64).to_le_bytes());
        self.kv.extend_from_slice(key.as_bytes());
        self.kv.extend_from_slice(&value_type.to_le_bytes());
        self.n_kv += 1;
    }

    fn string(mut self, key: &str, value: &str) -> Gguf {
        self.key(key, 8);
        self.kv
            .extend_from_slice(&(value.len() as u64).to_le_bytes());
        self.kv.extend_from_slice(value.as_bytes());
        self
    }

    fn u32(mut self, key: &str, value: u32) -> Gguf {
        self.key(key, 4);
        self.kv.extend_from_slice(&value.to_le_bytes());
        self
    }

    fn f32(mut self, key: &str, value: f32) -> Gguf {
        self.key(key, 6);
        self.kv.extend_from_slice(&value.to_le_bytes());
        self
    }

    fn strings(mut self, key: &str, values: &[&str]) -> Gguf {
        self.key(key, 9);
        self.kv.extend_from_slice(&8u32.to_le_bytes());
        self.kv
            .extend_from_slice(&(values.len() as u64).to_le_bytes());
        for v in values {
            self.kv.extend_from_slice(&(v.len() as u64).to_le_bytes());
            self.kv.extend_from_slice(v.as_bytes());
        }
        self
    }

    /// A tensor with GGUF dims (fastest-varying first) and raw data.
    fn tensor(mut self, name: &str, gguf_dims: &[u64], ggml_type: u32, data: Vec<u8>) -> Gguf {
        self.tensors
            .push((name.into(), gguf_dims.to_vec(), ggml_type, data));
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.n_kv.to_le_bytes());
        b.extend_from_slice(&self.kv);
        let mut offset = 0u64;
        for (name, d, t, data) in &self.tensors {
            b.extend_from_slice(&(name.len() as u64).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
            b.extend_from_slice(&(d.len() as u32).to_le_bytes());
            for x in d {
                b.extend_from_slice(&x.to_le_bytes());
            }
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        for (_, _, _, data) in &self.tensors {
            while !b.len().is_multiple_of(32) {
                b.push(0);
            }
            b.extend_from_slice(data);
        }
        b
    }
}

fn le_bytes<T: Copy, const N: usize>(v: &[T], f: fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

fn tiny_gguf(rng: &mut Rng) -> (Vec<u8>, Vec<f32>, Vec<f16>) {
    let w = rng.vec(6, -1.0, 1.0);
    let h: Vec<f16> = rng
        .vec(8, -1.0, 1.0)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let bytes = Gguf::new()
        .string("general.architecture", "llama")
        .u32("llama.embedding_length", 576)
        .f32("llama.rope.freq_base", 10000.0)
        .strings("tokenizer.ggml.tokens", &["<s>", "hi", "✓"])
        .tensor("w", &[3, 2], 0, le_bytes(&w, f32::to_le_bytes))
        .tensor("h", &[8], 1, le_bytes(&h, f16::to_le_bytes))
        .bytes();
    (bytes, w, h)
}

#[test]
fn gguf_loads_metadata_and_tensors() {
    let tmp = temp_dir("gguf");
    let dir = tmp.path();
    let (bytes, w, h) = tiny_gguf(&mut Rng::new(104));
    assert_eq!(check_gguf(&bytes), Ok(()));
    let path = write(dir, "tiny.gguf", &bytes);
    let f = GgufFile::load(&path).unwrap();
    assert_eq!(f.metadata_string("general.architecture").unwrap(), "llama");
    assert_eq!(f.metadata_f64("llama.embedding_length").unwrap(), 576.0);
    assert_eq!(f.metadata_f64("llama.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(
        f.metadata_strings("tokenizer.ggml.tokens").unwrap(),
        vec!["<s>", "hi", "✓"]
    );
    assert!(matches!(
        f.metadata_string("nope"),
        Err(LoadError::MissingMetadata { .. })
    ));
    assert!(f.metadata_string("llama.embedding_length").is_err());
    assert_eq!(f.names(), vec!["h", "w"]);
    // GGUF dims are reversed: [3, 2] is a 2 x 3 row-major matrix.
    let wa = f.get("w").unwrap();
    assert_eq!((wa.shape(), wa.dtype()), (vec![2, 3], Dtype::F32));
    assert_eq!(wa.to_vec::<f32>().unwrap(), w);
    let ha = f.get("h").unwrap();
    assert_eq!((ha.shape(), ha.dtype()), (vec![8], Dtype::F16));
    assert_eq!(ha.to_vec::<f16>().unwrap(), h);
    assert!(matches!(f.get("x"), Err(LoadError::MissingTensor { .. })));
}

#[test]
fn broken_gguf_files_are_errors() {
    let tmp = temp_dir("gguf-bad");
    let dir = tmp.path();
    assert!(matches!(
        GgufFile::load(dir.join("missing.gguf")),
        Err(LoadError::NotFound { .. })
    ));
    let (good, _, _) = tiny_gguf(&mut Rng::new(105));
    for cut in [
        0,
        3,
        4,
        8,
        16,
        24,
        40,
        100,
        good.len() / 2,
        good.len() - 33,
        good.len() - 1,
    ] {
        let p = write(dir, &format!("cut{cut}.gguf"), &good[..cut]);
        assert_load_err(GgufFile::load(&p), &format!("truncated at {cut}"));
    }
    let mut magic = good.clone();
    magic[..4].copy_from_slice(b"GGML");
    assert_load_err(
        GgufFile::load(write(dir, "magic.gguf", &magic)),
        "wrong magic",
    );
    let mut version = good.clone();
    version[4..8].copy_from_slice(&99u32.to_le_bytes());
    assert_load_err(
        GgufFile::load(write(dir, "version.gguf", &version)),
        "version",
    );
    // Counts and lengths that lie.
    for (at, value) in [
        (8, u64::MAX),
        (8, 3),
        (16, 1 << 40),
        (24, u64::MAX),
        (24, 1 << 20),
    ] {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&value.to_le_bytes());
        let p = write(dir, &format!("lie{at}-{value}.gguf"), &b);
        assert_load_err(GgufFile::load(&p), &format!("field at {at} = {value}"));
    }
    // A tensor whose data runs past the end; an unknown ggml type.
    let past = Gguf::new().tensor("w", &[64], 0, vec![0; 16]).bytes();
    assert_load_err(
        GgufFile::load(write(dir, "past.gguf", &past)),
        "data past the end",
    );
    let unknown = Gguf::new().tensor("w", &[4], 77, vec![0; 16]).bytes();
    assert_load_err(
        GgufFile::load(write(dir, "type.gguf", &unknown)),
        "unknown type",
    );
    let mut rng = Rng::new(106);
    for n in [0usize, 4, 24, 1000] {
        let mut bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
        if n >= 4 {
            bytes[..4].copy_from_slice(b"GGUF");
        }
        let p = write(dir, &format!("garbage{n}.gguf"), &bytes);
        assert_load_err(GgufFile::load(&p), &format!("{n} garbage bytes"));
    }
    assert!(GgufFile::load(write(dir, "good.gguf", &good)).is_ok());
}

/// The checker never panics on mutations of a valid file: bit flips,
/// truncations, length fields overwritten with extreme values, spliced bytes.
#[test]
fn gguf_checker_survives_20000_mutations() {
    let (good, _, _) = tiny_gguf(&mut Rng::new(107));
    let mut rng = Rng::new(108);
    let extremes = [
        0u64,
        1,
        31,
        32,
        255,
        u32::MAX as u64,
        1 << 32,
        1 << 40,
        u64::MAX / 24,
        u64::MAX,
    ];
    let mut accepted = 0;
    for _ in 0..20_000 {
        let mut b = good.clone();
        for _ in 0..1 + rng.below(4) {
            match rng.below(4) {
                0 if !b.is_empty() => {
                    let bit = rng.below(b.len() * 8);
                    b[bit / 8] ^= 1 << (bit % 8);
                }
                1 => b.truncate(rng.below(b.len() + 1)),
                2 if b.len() >= 8 => {
                    let at = rng.below(b.len() - 7);
                    let v = extremes[rng.below(extremes.len())];
                    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
                _ => {
                    let at = rng.below(b.len() + 1);
                    let junk: Vec<u8> = (0..rng.below(16)).map(|_| rng.next_u64() as u8).collect();
                    b.splice(at..at, junk);
                }
            }
        }
        if check_gguf(&b).is_ok() {
            accepted += 1;
        }
    }
    // Some mutations (e.g. in padding or string contents) stay valid.
    assert!(accepted > 0 && accepted < 20_000, "accepted {accepted}");
}

fn default_model() -> Option<PathBuf> {
    let p = mlx_backend::model::fetch::default_model_path();
    p.is_file().then_some(p)
}

#[test]
fn default_model_gguf() {
    let Some(path) = default_model() else {
        println!("note: default model not in the cache (scripts/fetch-default-model.sh); skipped");
        return;
    };
    let f = GgufFile::load(&path).unwrap();
    assert_eq!(f.metadata_string("general.architecture").unwrap(), "llama");
    assert_eq!(f.metadata_f64("llama.embedding_length").unwrap(), 576.0);
    assert!(f
        .metadata_keys()
        .iter()
        .any(|k| k == "tokenizer.ggml.tokens"));
    assert!(!f
        .metadata_strings("tokenizer.ggml.tokens")
        .unwrap()
        .is_empty());

    let names = f.names();
    for n in [
        "blk.0.attn_q.weight",
        "blk.0.attn_q.scales",
        "blk.0.attn_q.biases",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} missing");
    }
    let q = f.get("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.dtype(), Dtype::U32);
    assert_eq!(
        q.shape(),
        vec![576, 576 * 4 / 32],
        "Q4_1 packs 8 values per word"
    );
    let scales = f.get("blk.0.attn_q.scales").unwrap();
    assert_eq!(scales.shape(), vec![576, 576 / 32]);
    assert_eq!(
        f.get("blk.0.attn_q.biases").unwrap().shape(),
        scales.shape()
    );

    let emb = f.get("token_embd.weight").unwrap();
    assert_eq!(emb.dtype(), Dtype::U32);
    assert_eq!(emb.dim(-1).unwrap(), 576 * 8 / 32, "token_embd is 8-bit");
    let emb_scales = f.get("token_embd.scales").unwrap();
    let vocab = emb.dim(0).unwrap();
    assert_eq!(emb_scales.shape(), vec![vocab, 576 / 32]);
    // The 8-bit embedding dequantizes to finite values.
    let rows = emb.slice(&[0, 0], &[4, 144], &[]).unwrap();
    let q8 = mlx_backend::ops::Quantized {
        weight: rows,
        scales: emb_scales.slice(&[0, 0], &[4, 18], &[]).unwrap(),
        biases: f
            .get("token_embd.biases")
            .unwrap()
            .slice(&[0, 0], &[4, 18], &[])
            .unwrap(),
        group_size: 32,
        bits: 8,
    };
    let v = f32s(&q8.dequantize().unwrap());
    assert_eq!(v.len(), 4 * 576);
    assert!(v.iter().all(|x| x.is_finite()) && v.iter().any(|&x| x != 0.0));
}

/// MLX 0.32 reads no float64 safetensors either: a file from another
/// writer is a clear error.
#[test]
fn foreign_f64_safetensors_is_an_error() {
    let tmp = temp_dir("st-f64");
    let dir = tmp.path();
    let values = [1.5f64, -2.25, 1e300, f64::MIN_POSITIVE];
    let header = r#"{"d":{"dtype":"F64","shape":[2,2],"data_offsets":[0,32]}}"#;
    let bytes = safetensors_bytes(header, &le_bytes(&values, f64::to_le_bytes));
    let p = write(dir, "f64.safetensors", &bytes);
    let e = SafetensorsFile::load(&p)
        .err()
        .expect("MLX 0.32 has no F64 safetensors");
    assert!(e.to_string().contains("F64"), "{e}");
    assert_still_works();
}
