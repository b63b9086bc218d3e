//! Tiny random models of every family (tests/reference/tiny/, written by
//! tests/reference/make_tiny_models.py with mlx-lm) against their mlx-lm
//! goldens: full-prompt logits, the logits of each cached decode step and the
//! greedy tokens. Then loading broken folders and files must give typed
//! errors, never panics.

use mlx_backend::io::{save_safetensors, SafetensorsFile};
use mlx_backend::model::{self, LoadOptions, Logits, ModelLoadError};
use mlx_backend::ops::QuantSpec;
use mlx_backend::{Array, Dtype, LoadError};
use std::path::{Path, PathBuf};
use tempfile::TempDir;

fn tiny_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/tiny")
}

/// Every folder the generator writes; `all_folders_are_tested` keeps this in
/// step with the directory.
const FOLDERS: &[&str] = &[
    "llama-f32",
    "llama-q4",
    "llama-q4-bf16",
    "llama_tied-f32",
    "llama_tied-q4",
    "llama_rope-f32",
    "llama_rope_linear-f32",
    "llama_rope_yarn-f32",
    "llama_rope_dynamic-f32",
    "qwen2-f32",
    "qwen2-bf16",
    "qwen2-q4",
    "qwen3-f32",
    "qwen3-bf16",
    "qwen3-q4",
    "qwen2_moe-f32",
    "qwen2_moe-q4",
    "qwen2_moe-q4-bf16",
    "qwen3_moe-f32",
    "qwen3_moe-q4",
    "qwen3_moe-q4-bf16",
    "qwen3_moe-hf-bf16",
];

struct Golden {
    prompts: Vec<Vec<u32>>,
    greedy: Vec<Vec<u32>>,
    /// `prompt_logits.{p}` and `decode_logits.{p}` as `(rows, vocab, values)`.
    logits: SafetensorsFile,
    load_dtype: Option<Dtype>,
    /// All weights float32 and unquantized: the strict tolerance applies.
    exact_f32: bool,
    /// Activations run in bfloat16 (the oracle is then no higher-precision reference).
    bf16_activations: bool,
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn golden(dir: &Path) -> Golden {
    let text = std::fs::read_to_string(dir.join("golden.json")).unwrap();
    let g: serde_json::Value = serde_json::from_str(&text).unwrap();
    let load_dtype = match g["load_dtype"].as_str() {
        None => None,
        Some("float32") => Some(Dtype::F32),
        Some(other) => panic!("unexpected load_dtype {other}"),
    };
    let float_dtypes: Vec<&str> = g["float_dtypes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    let exact_f32 = g["quantization"].is_null()
        && (load_dtype == Some(Dtype::F32) || float_dtypes == ["mlx.core.float32"]);
    Golden {
        prompts: g["prompts"].as_array().unwrap().iter().map(ids).collect(),
        greedy: g["greedy"].as_array().unwrap().iter().map(ids).collect(),
        logits: SafetensorsFile::load(dir.join("golden.safetensors")).unwrap(),
        load_dtype,
        exact_f32,
        bf16_activations: g["load_dtype"].is_null()
            && g["float_dtypes"].to_string().contains("bfloat16"),
    }
}

/// `(max |a - b|, max |b|)`.
/// `(max |a - b|, ||a - b||₂ / ||b||₂)` over all logits, computed in f64.
fn errors(got: &[f32], want: &[f32]) -> (f32, f32) {
    assert_eq!(got.len(), want.len(), "logit counts differ");
    let mut max_err = 0f64;
    let (mut diff_sq, mut ref_sq) = (0f64, 0f64);
    for (&a, &b) in got.iter().zip(want) {
        assert!(a.is_finite(), "non-finite logit {a}");
        let d = a as f64 - b as f64;
        max_err = max_err.max(d.abs());
        diff_sq += d * d;
        ref_sq += b as f64 * b as f64;
    }
    (
        max_err as f32,
        (diff_sq / ref_sq.max(f64::MIN_POSITIVE)).sqrt() as f32,
    )
}

fn argmax_last(logits: &Array) -> u32 {
    logits
        .argmax(-1, false)
        .unwrap()
        .reshape(&[-1])
        .unwrap()
        .to_vec::<u32>()
        .unwrap()[0]
}

/// Compares logits with their golden; returns `(max abs error, relative error)`.
///
/// With bfloat16 activations, mlx-lm's logits are one bf16 rounding of the
/// model and ours (whose fused kernels accumulate in f32) another; there the
/// golden is no higher-precision reference, so `f32_ref` (the same weights
/// run in float32, a path the f32 folders pin to mlx-lm bit for bit) decides:
/// ours must be about as close to it as mlx-lm's bf16 result is (within a
/// quarter of mlx-lm's own error: two bf16 roundings of a 3%-noisy model).
fn compare(
    what: &str,
    g: &Golden,
    got: &Array,
    want: &Array,
    f32_ref: Option<&Array>,
) -> (f32, f32) {
    assert_eq!(
        got.size(),
        want.size(),
        "{what}: shape {:?} vs golden {:?}",
        got.shape(),
        want.shape()
    );
    let got_v = got.to_vec::<f32>().unwrap();
    let want_v = want.to_vec::<f32>().unwrap();
    let (err, rel) = errors(&got_v, &want_v);
    if g.exact_f32 {
        assert!(err < 1e-4, "{what}: max abs error {err:e} >= 1e-4");
    } else if rel >= 2e-2 {
        let reference = f32_ref
            .filter(|_| g.bf16_activations)
            .unwrap_or_else(|| panic!("{what}: relative error {rel:e} >= 2e-2"))
            .to_vec::<f32>()
            .unwrap();
        let (_, ours) = errors(&got_v, &reference);
        let (_, oracle) = errors(&want_v, &reference);
        assert!(
            ours <= 1.25 * oracle + 2e-3,
            "{what}: relative error {rel:e} vs mlx-lm, and {ours:e} vs the f32 reference where mlx-lm's bf16 is {oracle:e}"
        );
    }
    (err, rel)
}

/// Loads `tiny/<name>` and checks every golden.
fn check_folder(name: &str) {
    check_dir(name, &tiny_dir().join(name));
}

/// Loads the model in `dir` and checks it against the goldens there.
fn check_dir(name: &str, dir: &Path) {
    let g = golden(dir);
    let options = LoadOptions {
        dtype: g.load_dtype,
        ..LoadOptions::default()
    };
    let loaded = model::load(dir, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
    let m = &loaded.model;
    let reference = g.bf16_activations.then(|| {
        let f32_options = LoadOptions {
            dtype: Some(Dtype::F32),
            ..LoadOptions::default()
        };
        model::load(dir, &f32_options).unwrap().model
    });
    let (mut worst_abs, mut worst_rel) = (0f32, 0f32);
    for (p, (prompt, greedy)) in g.prompts.iter().zip(&g.greedy).enumerate() {
        let len = prompt.len() as i32;
        let mut caches = m.new_caches(256);
        let mut ref_caches = reference.as_ref().map(|r| r.new_caches(256));
        let tokens = Array::from_slice(prompt, &[1, len]).unwrap();
        let logits = m.forward(&tokens, &mut caches, Logits::All).unwrap();
        let ref_logits = reference
            .as_ref()
            .zip(ref_caches.as_mut())
            .map(|(r, c)| r.forward(&tokens, c, Logits::All).unwrap());
        assert_eq!(logits.dtype(), Dtype::F32);
        assert_eq!(logits.shape()[..2], [1, len]);
        let want = g.logits.get(&format!("prompt_logits.{p}")).unwrap();
        let (err, rel) = compare(
            &format!("{name} prompt {p}"),
            &g,
            &logits,
            &want,
            ref_logits.as_ref(),
        );
        worst_abs = worst_abs.max(err);
        worst_rel = worst_rel.max(rel);
        let decode = g.logits.get(&format!("decode_logits.{p}")).unwrap();
        let last_row = |l: &Array| l.slice_axis(1, len - 1, len).unwrap();
        let mut got = vec![argmax_last(&last_row(&logits))];
        let mut ref_rows: Vec<Option<Array>> = vec![ref_logits.as_ref().map(last_row)];
        for step in 1..greedy.len() {
            // Feed the golden token, so one flipped token does not derail the
            // rest; the greedy comparison below still catches the flip.
            let tokens = Array::from_slice(&[greedy[step - 1]], &[1, 1]).unwrap();
            let logits = m.forward(&tokens, &mut caches, Logits::Last).unwrap();
            let ref_logits = reference
                .as_ref()
                .zip(ref_caches.as_mut())
                .map(|(r, c)| r.forward(&tokens, c, Logits::Last).unwrap());
            let row = step as i32 - 1;
            let want = decode.slice_axis(0, row, row + 1).unwrap();
            let what = format!("{name} prompt {p} decode step {step}");
            let (err, rel) = compare(&what, &g, &logits, &want, ref_logits.as_ref());
            worst_abs = worst_abs.max(err);
            worst_rel = worst_rel.max(rel);
            got.push(argmax_last(&logits));
            ref_rows.push(ref_logits);
        }
        // With bf16 activations a near-tie may flip either way; then ours
        // must be the float32 reference's choice, or the float32 reference
        // must score ours within two bf16 ulps of its best token (the
        // logits' own rounding plus the hidden state's: an order no bf16
        // computation can resolve; on a GPU, whose reductions round in
        // another order, mlx-lm's CPU choice, ours and the f32 choice can be
        // three tokens of one such tie).
        for (step, ((ours, oracle), f32_row)) in got.iter().zip(greedy).zip(&ref_rows).enumerate() {
            let f32_choice = f32_row.as_ref().map(argmax_last);
            let bf16_tie = f32_row.as_ref().zip(f32_choice).is_some_and(|(r, best)| {
                let v = r.reshape(&[-1]).unwrap().to_vec::<f32>().unwrap();
                let (a, top) = (v[*ours as usize], v[best as usize]);
                let ulp = 2f32.powi(top.abs().log2().floor() as i32 - 7);
                top - a < 2.0 * ulp
            });
            assert!(
                ours == oracle || Some(*ours) == f32_choice || bf16_tie,
                "{name} prompt {p} step {step}: greedy token {ours}, mlx-lm {oracle}, f32 reference {f32_choice:?}"
            );
        }
    }
    eprintln!("{name}: max abs error {worst_abs:.3e}, max relative error {worst_rel:.3e}");
}

macro_rules! tiny_tests {
    ($($test:ident => $folder:literal,)*) => {
        $(
            #[test]
            fn $test() {
                check_folder($folder);
            }
        )*
    };
}

tiny_tests! {
    llama_f32 => "llama-f32",
    llama_q4 => "llama-q4",
    llama_q4_bf16 => "llama-q4-bf16",
    llama_tied_f32 => "llama_tied-f32",
    llama_tied_q4 => "llama_tied-q4",
    llama_rope_f32 => "llama_rope-f32",
    llama_rope_linear_f32 => "llama_rope_linear-f32",
    llama_rope_yarn_f32 => "llama_rope_yarn-f32",
    llama_rope_dynamic_f32 => "llama_rope_dynamic-f32",
    qwen2_f32 => "qwen2-f32",
    qwen2_bf16 => "qwen2-bf16",
    qwen2_q4 => "qwen2-q4",
    qwen3_f32 => "qwen3-f32",
    qwen3_bf16 => "qwen3-bf16",
    qwen3_q4 => "qwen3-q4",
    qwen2_moe_f32 => "qwen2_moe-f32",
    qwen2_moe_q4 => "qwen2_moe-q4",
    qwen2_moe_q4_bf16 => "qwen2_moe-q4-bf16",
    qwen3_moe_f32 => "qwen3_moe-f32",
    qwen3_moe_q4 => "qwen3_moe-q4",
    qwen3_moe_q4_bf16 => "qwen3_moe-q4-bf16",
    qwen3_moe_hf_bf16 => "qwen3_moe-hf-bf16",
}

#[test]
fn all_folders_are_tested() {
    let mut on_disk: Vec<String> = std::fs::read_dir(tiny_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = FOLDERS.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
}

// --- broken inputs ---------------------------------------------------------------

/// A fresh empty directory under the system temp dir, removed when the
/// returned guard drops (when the test ends, pass or fail).
fn temp_dir(tag: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("mlx-backend-models-tiny-{tag}-"))
        .tempdir()
        .unwrap()
}

/// A copy of tiny/llama-f32's config.json and weights (no index), in a
/// temp folder removed when the returned guard drops.
fn llama_copy(tag: &str) -> TempDir {
    let src = tiny_dir().join("llama-f32");
    let dir = temp_dir(tag);
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    dir
}

/// Rewrite `dir/model.safetensors` through `edit`.
fn edit_weights(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Array)>)) {
    let path = dir.join("model.safetensors");
    let mut tensors: Vec<(String, Array)> = SafetensorsFile::load(&path)
        .unwrap()
        .tensors()
        .unwrap()
        .into_iter()
        .collect();
    for (_, a) in &tensors {
        a.eval().unwrap();
    }
    edit(&mut tensors);
    let refs: Vec<(&str, &Array)> = tensors.iter().map(|(n, a)| (n.as_str(), a)).collect();
    let tmp = dir.join("edited.safetensors");
    save_safetensors(&tmp, &refs, &[("format", "mlx")]).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

fn load_err(path: &Path) -> ModelLoadError {
    match model::load(path, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e,
    }
}

#[test]
fn the_unbroken_copy_loads() {
    let tmp = llama_copy("ok");
    let dir = tmp.path();
    model::load(dir, &LoadOptions::default()).unwrap();
    tmp.close().unwrap();
}

#[test]
fn tied_model_ignores_a_stored_lm_head() {
    let src = tiny_dir().join("llama_tied-f32");
    let tmp = temp_dir("stale-lm-head");
    let dir = tmp.path();
    for f in [
        "config.json",
        "model.safetensors",
        "golden.json",
        "golden.safetensors",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    edit_weights(dir, |tensors| {
        let zeros = Array::zeros(&[256, 64], Dtype::F32).unwrap();
        tensors.push(("lm_head.weight".into(), zeros));
    });
    check_dir("llama_tied-f32 with a zero lm_head.weight", dir);
    tmp.close().unwrap();
}

#[test]
fn config_without_hidden_size() {
    let tmp = llama_copy("no-hidden");
    let dir = tmp.path();
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(&path, config.to_string()).unwrap();
    match load_err(dir) {
        ModelLoadError::MissingConfigKey { key, path } => {
            assert_eq!(key, "hidden_size");
            assert!(path.ends_with("config.json"), "{path}");
        }
        e => panic!("expected MissingConfigKey, got {e:?}"),
    }
    tmp.close().unwrap();
}

/// Dynamic NTK RoPE scaling is refused at load time rather than run
/// unscaled: mlx-lm 0.32.2 does implement it (`DynamicNTKScalingRoPE` in
/// rope_utils.py, a base recomputed on every call from the cache offset), but
/// this crate does not.
#[test]
fn unsupported_rope_scaling_is_refused() {
    let tmp = llama_copy("longrope");
    let dir = tmp.path();
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["rope_scaling"] = serde_json::json!({"type": "longrope", "factor": 2.0});
    std::fs::write(&path, config.to_string()).unwrap();
    match load_err(dir) {
        ModelLoadError::BadConfigValue { key, message, .. } => {
            assert_eq!(key, "rope_scaling.type");
            assert!(message.contains("'longrope'"), "{message}");
        }
        e => panic!("expected BadConfigValue, got {e:?}"),
    }
    tmp.close().unwrap();
}

#[test]
fn safetensors_header_sizes_lie() {
    let tmp = llama_copy("lying-header");
    let dir = tmp.path();
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(header).unwrap();
    // The first tensor now claims to end far past the file's end.
    let name = v
        .as_object()
        .unwrap()
        .keys()
        .find(|k| *k != "__metadata__")
        .unwrap()
        .clone();
    let offsets = v[&name]["data_offsets"].as_array_mut().unwrap();
    offsets[1] = serde_json::json!(1u64 << 40);
    let mut header = v.to_string().into_bytes();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&path, out).unwrap();
    match load_err(dir) {
        ModelLoadError::Load(LoadError::Invalid { .. }) => {}
        e => panic!("expected Load(Invalid), got {e:?}"),
    }
    // A header length past the end of the file.
    let mut out = (1u64 << 40).to_le_bytes().to_vec();
    out.extend_from_slice(&bytes[8..]);
    std::fs::write(&path, out).unwrap();
    match load_err(dir) {
        ModelLoadError::Load(LoadError::Invalid { .. }) => {}
        e => panic!("expected Load(Invalid), got {e:?}"),
    }
    tmp.close().unwrap();
}

#[test]
fn tensor_with_the_wrong_shape() {
    let tmp = llama_copy("wrong-shape");
    let dir = tmp.path();
    let bad = "model.layers.1.self_attn.k_proj.weight";
    edit_weights(dir, |tensors| {
        let (_, a) = tensors.iter_mut().find(|(n, _)| n == bad).unwrap();
        let shape = a.shape();
        *a = a.reshape(&[shape[1], shape[0]]).unwrap();
    });
    match load_err(dir) {
        ModelLoadError::WrongShape {
            name,
            expected,
            found,
        } => {
            assert_eq!(name, bad);
            assert_eq!(expected, [32, 64]);
            assert_eq!(found, [64, 32]);
        }
        e => panic!("expected WrongShape, got {e:?}"),
    }
    tmp.close().unwrap();
}

#[test]
fn missing_tensor() {
    let tmp = llama_copy("missing-tensor");
    let dir = tmp.path();
    let gone = "model.layers.1.post_attention_layernorm.weight";
    edit_weights(dir, |tensors| tensors.retain(|(n, _)| n != gone));
    match load_err(dir) {
        ModelLoadError::MissingTensor(name) => assert_eq!(name, gone),
        e => panic!("expected MissingTensor, got {e:?}"),
    }
    tmp.close().unwrap();
}

#[test]
fn missing_expert_of_an_hf_moe_folder() {
    let src = tiny_dir().join("qwen3_moe-hf-bf16");
    let tmp = temp_dir("missing-expert");
    let dir = tmp.path();
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let gone = "model.layers.0.mlp.experts.5.up_proj.weight";
    edit_weights(dir, |tensors| tensors.retain(|(n, _)| n != gone));
    match load_err(dir) {
        ModelLoadError::MissingTensor(name) => assert_eq!(name, gone),
        e => panic!("expected MissingTensor, got {e:?}"),
    }
    tmp.close().unwrap();
}

fn default_gguf() -> Option<PathBuf> {
    let p = mlx_backend::model::fetch::default_model_path();
    p.is_file().then_some(p)
}

#[test]
fn truncated_gguf() {
    let Some(src) = default_gguf() else {
        eprintln!("default model not in the cache: run scripts/fetch-default-model.sh");
        return;
    };
    let bytes = std::fs::read(&src).unwrap();
    let tmp = temp_dir("truncated-gguf");
    let dir = tmp.path();
    // Inside the header, inside the metadata, inside the tensor infos, and
    // inside the tensor data.
    for n in [10, 1000, 1 << 20, bytes.len() / 2, bytes.len() - 1] {
        let path = dir.join(format!("cut-{n}.gguf"));
        std::fs::write(&path, &bytes[..n]).unwrap();
        match load_err(&path) {
            ModelLoadError::Load(LoadError::Invalid { .. }) => {}
            e => panic!("{n} bytes: expected Load(Invalid), got {e:?}"),
        }
    }
    tmp.close().unwrap();
}

#[test]
fn wrong_gguf_magic() {
    let tmp = temp_dir("bad-magic");
    let dir = tmp.path();
    let path = dir.join("model.gguf");
    let mut bytes = match default_gguf() {
        Some(src) => std::fs::read(src).unwrap(),
        None => {
            b"GGUF\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
                .to_vec()
        }
    };
    bytes[..4].copy_from_slice(b"GGUX");
    std::fs::write(&path, &bytes).unwrap();
    match load_err(&path) {
        ModelLoadError::Load(LoadError::Invalid { .. }) => {}
        e => panic!("expected Load(Invalid), got {e:?}"),
    }
    tmp.close().unwrap();
}

/// Quantize-on-load (group 64, 4 and 8 bits) of an unquantized checkpoint:
/// logits stay close to the float32 model, closer with 8 bits.
#[test]
fn quantize_on_load_tracks_the_float_model() {
    let dir = tiny_dir().join("llama-f32");
    let prompt: Vec<u32> = vec![1, 17, 42, 99, 3, 250, 7];
    let run = |quantize| {
        let m = model::load(
            &dir,
            &LoadOptions {
                quantize,
                ..LoadOptions::default()
            },
        )
        .unwrap()
        .model;
        let mut caches = m.new_caches(64);
        let tokens = Array::from_slice(&prompt, &[1, prompt.len() as i32]).unwrap();
        m.forward(&tokens, &mut caches, Logits::All)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    let spec = |bits, group_size| Some(QuantSpec { bits, group_size });
    let reference = run(None);
    let (_, rel4) = errors(&run(spec(4, 64)), &reference);
    let (_, rel8) = errors(&run(spec(8, 64)), &reference);
    assert!(rel8 < 2e-2, "8-bit relative error {rel8}");
    // Hidden 64 makes each row a single 4-bit group: coarse on random weights.
    assert!(rel4 < 0.35, "4-bit relative error {rel4}");
    assert!(rel8 < rel4, "8 bits ({rel8}) should beat 4 bits ({rel4})");
    // The same weights quantized by mlx-lm (llama-q4: group 32, 4 bits).
    let q4 = golden(&tiny_dir().join("llama-q4"));
    let want = q4
        .logits
        .get("prompt_logits.0")
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(q4.prompts[0], prompt);
    let (err, _) = errors(&run(spec(4, 32)), &want);
    assert!(
        err < 1e-4,
        "quantize-on-load differs from mlx-lm's quantized model by {err}"
    );
}
