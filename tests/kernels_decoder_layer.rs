//! decoder_layer: the fused decode block against the same block built from
//! MLX's ops (the op's fallback graph) on the same device, on random
//! quantized weights and caches of different lengths per row; cache
//! immutability and contract errors. Every case runs on every device.

mod common;
mod kernels_common;

use kernels_common::{fused_expected, max_rel_err, norm_rel_err, normal, on_cpu, on_each_device};
use mlx_backend::kernels::{
    decoder_layer, registry, ActivationPrecision, Backend, DecoderLayer, DecoderStack,
    FallbackReason, Kernel, RopeSpec,
};
use mlx_backend::model::{self, LoadOptions, Logits};
use mlx_backend::ops::{quantize, Quantized};
use mlx_backend::{eval, Array, Dtype};
use std::sync::Mutex;

/// Tests toggle the process-wide registry: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const H: i32 = 128;
const I: i32 = 192;
const NQ: i32 = 4;
const NKV: i32 = 2;
const D: i32 = 32;

struct Variant {
    bias: bool,
    qk_norm: bool,
    traditional: bool,
    freqs: bool,
    mscale: f32,
    rope_dims: i32,
    /// (bits, group) for q, k, v, o, gate, up, down.
    quant: [(i32, i32); 7],
    activations: ActivationPrecision,
    /// dtype of the projections' scales and biases (norms stay f32).
    scales: Dtype,
    /// dtype of x, the caches, and (when not f32) of the norms, biases,
    /// scales and biases too: a half-precision checkpoint.
    act: Dtype,
}

impl Default for Variant {
    fn default() -> Self {
        Variant {
            bias: false,
            qk_norm: false,
            traditional: true,
            freqs: false,
            mscale: 1.0,
            rope_dims: D,
            quant: [(4, 32); 7],
            activations: ActivationPrecision::Exact,
            scales: Dtype::F32,
            act: Dtype::F32,
        }
    }
}

struct Weights {
    norms: [Array; 2],
    proj: [Quantized; 7],
    bias: [Array; 3],
    qk_norm: [Array; 2],
    freqs: Array,
}

fn weights(v: &Variant, seed: u64) -> Weights {
    let dims = [
        (NQ * D, H),
        (NKV * D, H),
        (NKV * D, H),
        (H, NQ * D),
        (I, H),
        (I, H),
        (H, I),
    ];
    let proj = std::array::from_fn(|p| {
        let (n, k) = dims[p];
        let (bits, group) = v.quant[p];
        let mut q = quantize(
            &normal(&[n, k], Dtype::F32, 0.0, 0.08, seed + p as u64),
            group,
            bits,
        )
        .unwrap();
        let scales = if v.act == Dtype::F32 { v.scales } else { v.act };
        q.scales = q.scales.astype(scales).unwrap();
        q.biases = q.biases.astype(scales).unwrap();
        q
    });
    let vector = |len: i32, loc: f32, scale: f32, s: u64| {
        normal(&[len], Dtype::F32, loc, scale, s)
            .astype(v.act)
            .unwrap()
    };
    let freqs: Vec<f32> = (0..v.rope_dims / 2)
        .map(|i| 10000f32.powf(2.0 * i as f32 / v.rope_dims as f32) * 1.7)
        .collect();
    Weights {
        norms: [
            vector(H, 1.0, 0.2, seed + 10),
            vector(H, 1.0, 0.2, seed + 11),
        ],
        proj,
        bias: [
            vector(NQ * D, 0.0, 0.5, seed + 12),
            vector(NKV * D, 0.0, 0.5, seed + 13),
            vector(NKV * D, 0.0, 0.5, seed + 14),
        ],
        qk_norm: [
            vector(D, 1.0, 0.2, seed + 15),
            vector(D, 1.0, 0.2, seed + 16),
        ],
        freqs: Array::from_slice(&freqs, &[freqs.len() as i32]).unwrap(),
    }
}

fn layer<'a>(v: &Variant, w: &'a Weights) -> DecoderLayer<'a> {
    DecoderLayer {
        input_norm: &w.norms[0],
        post_norm: &w.norms[1],
        eps: 1e-5,
        projections: w.proj.each_ref(),
        qkv_bias: v.bias.then(|| w.bias.each_ref()),
        qk_norm: v.qk_norm.then(|| w.qk_norm.each_ref()),
        n_heads: NQ,
        n_kv_heads: NKV,
        head_dim: D,
        attn_scale: (D as f32).powf(-0.5),
        rope: RopeSpec {
            dims: v.rope_dims,
            traditional: v.traditional,
            base: 10000.0,
            scale: 0.5,
            mscale: v.mscale,
            freqs: v.freqs.then_some(&w.freqs),
        },
        activations: v.activations,
    }
}

/// Random caches: row `r` has capacity `caps[r]`.
fn caches(caps: &[i32], seed: u64) -> Vec<(Array, Array)> {
    caches_of(caps, seed, Dtype::F32)
}

fn caches_of(caps: &[i32], seed: u64, dtype: Dtype) -> Vec<(Array, Array)> {
    caps.iter()
        .enumerate()
        .map(|(r, &c)| {
            let s = seed + 100 * r as u64;
            (
                normal(&[1, NKV, c, D], dtype, 0.0, 1.0, s),
                normal(&[1, NKV, c, D], dtype, 0.0, 1.0, s + 1),
            )
        })
        .collect()
}

fn run(
    fused: bool,
    v: &Variant,
    w: &Weights,
    x: &Array,
    cache: &[(Array, Array)],
    offsets: &[i32],
) -> (Array, Vec<(Array, Array)>) {
    let (out, rows, nodes) = run_stack(
        |refs| decoder_layer(x, &layer(v, w), refs, offsets),
        cache,
        fused,
    );
    // The CPU kernel takes f32 activations only; a GPU body takes half
    // ones with half parameters too.
    let takes = v.act == Dtype::F32 || Backend::current() != Backend::Cpu;
    assert_eq!(
        nodes,
        u64::from(fused && takes && fused_expected(Kernel::DecoderLayer))
    );
    (out, rows)
}

fn check(v: Variant, caps: &[i32], offsets: &[i32], seed: u64) {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = weights(&v, seed);
    let cache = caches_of(caps, seed + 1000, v.act);
    let x = normal(&[caps.len() as i32, 1, H], v.act, 0.0, 1.0, seed + 2000);
    let (mut want, mut want_rows) = run(false, &v, &w, &x, &cache, offsets);
    let (got, got_rows) = run(true, &v, &w, &x, &cache, offsets);
    // How far MLX's own ops on this device are from the same graph on the
    // CPU (0 on the CPU).
    let mut mlx_gpu_err = 0.0;
    if Backend::current() != Backend::Cpu {
        // The same graph on the CPU is the reference a GPU body answers to:
        // MLX's own GPU ops are not exact on every quantization (reported).
        let (cpu, cpu_rows) = on_cpu(|| run(false, &v, &w, &x, &cache, offsets));
        let (gpu_err, fused_err) = (norm_rel_err(&want, &cpu), norm_rel_err(&got, &cpu));
        if gpu_err > 1e-3 {
            eprintln!(
                "MLX's GPU ops differ from its CPU ops by {gpu_err:.2e} (norm rel) on {:?}; \
                 the fused step differs by {fused_err:.2e}",
                v.quant
            );
        }
        (want, want_rows) = (cpu, cpu_rows);
        mlx_gpu_err = gpu_err;
    }
    // x rounded to int8 per 32 values (int16 per word of W) before each
    // projection (CPU kernel): compare whole tensors (the error, ~1e-2
    // (~4e-5) of the signal, is spread evenly; exact is ~5e-7). Half
    // activations round where MLX's ops round; a sum that lands on the
    // other side of a rounding moves one ulp (2^-8 in bf16) and what
    // follows it; on a GPU the step may be as far from the CPU graph as
    // MLX's own GPU ops are (their reductions round in another order),
    // with a quarter of margin.
    let bound = match (v.act, v.activations) {
        (Dtype::F16 | Dtype::BF16, _) => Some(f64::max(1e-2, 1.25 * mlx_gpu_err)),
        (_, ActivationPrecision::Int8) => Some(2e-2),
        (_, ActivationPrecision::Int16) => Some(2e-4),
        (_, ActivationPrecision::Exact) => None,
    };
    if let Some(bound) = bound {
        let err = norm_rel_err(&got, &want);
        assert!(err < bound, "out: norm rel err {err}");
        for ((gk, gv), (wk, wv)) in got_rows.iter().zip(&want_rows) {
            let (ek, ev) = (norm_rel_err(gk, wk), norm_rel_err(gv, wv));
            assert!(ek < bound && ev < bound, "caches: {ek}, {ev}");
        }
        return;
    }
    let err = max_rel_err(&got, &want, 1e-2);
    assert!(err < 2e-4, "out: max rel err {err}");
    for (r, ((gk, gv), (wk, wv))) in got_rows.iter().zip(&want_rows).enumerate() {
        assert_eq!(gk.shape(), vec![1, NKV, caps[r], D]);
        let ek = max_rel_err(gk, wk, 1e-2);
        let ev = max_rel_err(gv, wv, 1e-2);
        assert!(ek < 1e-4 && ev < 1e-4, "row {r}: keys {ek}, values {ev}");
    }
}

#[test]
fn one_row_matches_mlx_ops() {
    on_each_device(|_dev| {
        check(Variant::default(), &[16], &[5], 1);
    });
}

#[test]
fn ragged_rows_match_mlx_ops() {
    on_each_device(|_dev| {
        check(Variant::default(), &[8, 40, 33], &[0, 39, 17], 2);
    });
}

#[test]
fn long_rows_match_mlx_ops() {
    on_each_device(|_dev| {
        // Enough keys that the attention is split over the pool.
        check(Variant::default(), &[600, 300], &[590, 250], 18);
    });
}

#[test]
fn non_traditional_rope_with_bias_and_qk_norm() {
    on_each_device(|_dev| {
        let v = Variant {
            bias: true,
            qk_norm: true,
            traditional: false,
            ..Variant::default()
        };
        check(v, &[12, 20], &[11, 3], 3);
    });
}

#[test]
fn explicit_frequencies_mscale_and_partial_rotation() {
    on_each_device(|_dev| {
        let v = Variant {
            freqs: true,
            mscale: 1.3,
            rope_dims: 16,
            ..Variant::default()
        };
        check(v, &[24], &[9], 4);
    });
}

#[test]
fn mixed_bits_and_group_sizes() {
    on_each_device(|_dev| {
        let v = Variant {
            quant: [
                (8, 64),
                (4, 64),
                (8, 32),
                (4, 128),
                (8, 32),
                (8, 32),
                (4, 64),
            ],
            ..Variant::default()
        };
        check(v, &[10, 10], &[4, 9], 5);
    });
}

#[test]
fn half_precision_scales_with_f32_norms() {
    on_each_device(|_dev| {
        // The GGUF layout on the CPU: f32 activations and norms, the
        // checkpoint's f16 (or bf16) scales and biases.
        for (scales, seed) in [(Dtype::F16, 21), (Dtype::BF16, 22)] {
            let v = Variant {
                bias: true,
                qk_norm: true,
                scales,
                ..Variant::default()
            };
            check(v, &[9, 17], &[8, 2], seed);
        }
    });
}

/// A half-precision checkpoint (x, caches, norms, biases and scales all
/// f16 or bf16): a GPU body takes it, rounding where MLX's ops round; the
/// CPU kernel takes f32 only and builds MLX's ops (`run` checks which).
#[test]
fn half_precision_activations_with_half_parameters() {
    on_each_device(|_dev| {
        for (act, seed) in [(Dtype::F16, 41), (Dtype::BF16, 42)] {
            let v = Variant {
                bias: true,
                qk_norm: true,
                act,
                ..Variant::default()
            };
            check(v, &[9, 40, 17], &[8, 39, 2], seed);
        }
    });
}

#[test]
fn int8_activations_stay_close_to_mlx_ops() {
    on_each_device(|_dev| {
        let v = Variant {
            activations: ActivationPrecision::Int8,
            quant: [
                (4, 32),
                (4, 32),
                (8, 64),
                (4, 32),
                (4, 32),
                (4, 32),
                (8, 32),
            ],
            ..Variant::default()
        };
        check(v, &[16, 30], &[15, 6], 17);
    });
}

/// Int16 x (rounded per word of W, ~1e-5 of a projection) stays within
/// 2e-4 of the MLX graph (int8: 2e-2).
#[test]
fn int16_activations_stay_close_to_mlx_ops() {
    on_each_device(|_dev| {
        let v = Variant {
            activations: ActivationPrecision::Int16,
            quant: [
                (4, 32),
                (4, 64),
                (8, 32),
                (4, 32),
                (4, 128),
                (4, 128),
                (8, 64),
            ],
            bias: true,
            qk_norm: true,
            ..Variant::default()
        };
        check(v, &[16, 30, 9], &[15, 6, 0], 23);
    });
}

/// Six ragged rows in int16: on AVX-512 VNNI the projections take
/// `row_lanes` (4+ rows, one scale per group of x), which also prefetches
/// each member's cache rows for the attention while it computes; on AVX2
/// the per-word `vpmaddwd` kernel.
#[test]
fn int16_batch_of_six_rows_stays_close_to_mlx_ops() {
    on_each_device(|_dev| {
        let v = Variant {
            activations: ActivationPrecision::Int16,
            ..Variant::default()
        };
        check(v, &[16, 30, 9, 64, 5, 41], &[15, 6, 0, 63, 2, 40], 29);
    });
}

/// Nine ragged rows in int16: `row_lanes` on AVX2 too (8+ rows there),
/// with a pass of 8 x rows and one of 1.
#[test]
fn int16_batch_of_nine_rows_stays_close_to_mlx_ops() {
    on_each_device(|_dev| {
        let v = Variant {
            activations: ActivationPrecision::Int16,
            ..Variant::default()
        };
        check(
            v,
            &[16, 30, 9, 64, 5, 41, 12, 33, 7],
            &[15, 6, 0, 63, 2, 40, 11, 1, 6],
            31,
        );
    });
}

#[test]
fn a_cache_held_elsewhere_is_left_unchanged() {
    on_each_device(|_dev| {
        let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let v = Variant::default();
        let w = weights(&v, 6);
        let (k, val) = caches(&[9], 7).pop().unwrap();
        eval(&[&k, &val]).unwrap();
        let (k_before, v_before) = (k.to_vec::<f32>().unwrap(), val.to_vec::<f32>().unwrap());
        let x = normal(&[1, 1, H], Dtype::F32, 0.0, 1.0, 8);
        let (_, rows) = decoder_layer(&x, &layer(&v, &w), &[(&k, &val)], &[4]).unwrap();
        let (k2, v2) = &rows[0];
        eval(&[k2, v2]).unwrap();
        // The inputs are still held here: the kernel must have copied them.
        assert_eq!(k.to_vec::<f32>().unwrap(), k_before);
        assert_eq!(val.to_vec::<f32>().unwrap(), v_before);
        let (k2, v2) = (k2.to_vec::<f32>().unwrap(), v2.to_vec::<f32>().unwrap());
        let row = |h: usize, p: usize| (h * 9 + p) * D as usize..(h * 9 + p + 1) * D as usize;
        for h in 0..NKV as usize {
            for p in (0..9).filter(|&p| p != 4) {
                assert_eq!(k2[row(h, p)], k_before[row(h, p)], "head {h} pos {p}");
                assert_eq!(v2[row(h, p)], v_before[row(h, p)], "head {h} pos {p}");
            }
            assert_ne!(k2[row(h, 4)], k_before[row(h, 4)]);
        }
    });
}

#[test]
fn bad_calls_name_the_problem_and_leave_things_usable() {
    on_each_device(|_dev| {
        let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let v = Variant::default();
        let w = weights(&v, 9);
        let (k, val) = caches(&[6], 10).pop().unwrap();
        let l = layer(&v, &w);
        let x = normal(&[1, 1, H], Dtype::F32, 0.0, 1.0, 11);
        let err = decoder_layer(&x, &l, &[(&k, &val)], &[6]).unwrap_err();
        assert!(err.to_string().contains("offset 6"), "{err}");
        let two_tokens = normal(&[1, 2, H], Dtype::F32, 0.0, 1.0, 12);
        let err = decoder_layer(&two_tokens, &l, &[(&k, &val)], &[1]).unwrap_err();
        assert!(err.to_string().contains("[B, 1, hidden]"), "{err}");
        let wrong_heads = normal(&[1, NKV + 1, 6, D], Dtype::F32, 0.0, 1.0, 13);
        let err = decoder_layer(&x, &l, &[(&wrong_heads, &wrong_heads)], &[1]).unwrap_err();
        assert!(err.to_string().contains("cache 0"), "{err}");
        let err = decoder_layer(&x, &l, &[(&k, &val)], &[1, 2]).unwrap_err();
        assert!(err.to_string().contains("offsets"), "{err}");
        // Still usable.
        let (out, _) = decoder_layer(&x, &l, &[(&k, &val)], &[5]).unwrap();
        assert!(out.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
    });
}

#[test]
fn half_precision_activations_fall_back_counted() {
    on_each_device(|_dev| {
        let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let v = Variant::default();
        let w = weights(&v, 14);
        let (k, val) = caches(&[6], 15).pop().unwrap();
        let (k, val) = (
            k.astype(Dtype::F16).unwrap(),
            val.astype(Dtype::F16).unwrap(),
        );
        let x = normal(&[1, 1, H], Dtype::F16, 0.0, 1.0, 16);
        let before = registry::snapshot().get(Kernel::DecoderLayer);
        let (out, _) = decoder_layer(&x, &layer(&v, &w), &[(&k, &val)], &[2]).unwrap();
        let after = registry::snapshot().get(Kernel::DecoderLayer);
        assert_eq!(
            after.fallbacks(FallbackReason::UnsupportedDtype)
                - before.fallbacks(FallbackReason::UnsupportedDtype),
            1
        );
        assert!(out.to_f32_vec().unwrap().iter().all(|v| v.is_finite()));
    });
}

/// Gate and up quantized differently (valid for MLX, not for the fused
/// pair) build MLX's graph, counted, and the kernel stays usable.
#[test]
fn unlike_gate_and_up_fall_back_counted() {
    on_each_device(|_dev| {
        let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let mut v = Variant::default();
        v.quant[5] = (4, 64);
        let w = weights(&v, 24);
        let cache = caches(&[6], 25);
        let kv: Vec<(&Array, &Array)> = cache.iter().map(|(k, v)| (k, v)).collect();
        let x = normal(&[1, 1, H], Dtype::F32, 0.0, 1.0, 26);
        let reason = FallbackReason::UnsupportedQuantization;
        let before = registry::snapshot().get(Kernel::DecoderLayer);
        let (out, _) = decoder_layer(&x, &layer(&v, &w), &kv, &[2]).unwrap();
        out.eval().unwrap();
        let after = registry::snapshot().get(Kernel::DecoderLayer);
        assert_eq!(after.fallbacks(reason) - before.fallbacks(reason), 1);
        assert!(out.to_f32_vec().unwrap().iter().all(|v| v.is_finite()));
        drop(guard);
        check(Variant::default(), &[7], &[3], 27);
    });
}

/// Greedy decode of the tiny 4-bit Llama: `(tokens, last logits, fused
/// nodes (one per step: every block in one), cache copies)` with the kernel on or off. A cache step of 4
/// makes the caches grow during decode.
fn tiny_greedy(m: &model::Transformer, fused: bool) -> (Vec<u32>, Array, u64, u64) {
    registry::set_enabled(Kernel::DecoderLayer, fused);
    let mut caches = m.new_caches(4);
    let prompt = common::tiny::tokens(22, 9);
    let argmax = |l: &Array| {
        l.argmax(-1, false)
            .unwrap()
            .reshape(&[-1])
            .unwrap()
            .to_vec::<u32>()
            .unwrap()[0]
    };
    let x = Array::from_slice(&prompt, &[1, prompt.len() as i32]).unwrap();
    let mut logits = m.forward(&x, &mut caches, Logits::Last).unwrap();
    let mut out = vec![argmax(&logits)];
    let (fused_before, copies_before) = (
        registry::snapshot().get(Kernel::DecoderLayer).fused,
        mlx_backend::kernels::decoder_layer::cache_copies(),
    );
    for _ in 0..12 {
        let x = Array::from_slice(&[*out.last().unwrap()], &[1, 1]).unwrap();
        logits = m.forward(&x, &mut caches, Logits::Last).unwrap();
        out.push(argmax(&logits));
    }
    registry::set_enabled(Kernel::DecoderLayer, true);
    (
        out,
        logits,
        registry::snapshot().get(Kernel::DecoderLayer).fused - fused_before,
        mlx_backend::kernels::decoder_layer::cache_copies() - copies_before,
    )
}

#[test]
fn tiny_model_decodes_through_fused_blocks_in_place() {
    on_each_device(|_dev| {
        let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let folder = common::tiny::tiny_llama_folder(21, true);
        // Exact x: fused and op-by-op blocks then agree to f32 rounding (with
        // int16 x each rounds x at its own points).
        let options = LoadOptions {
            activations: ActivationPrecision::Exact,
            ..LoadOptions::for_device(mlx_backend::Device::Cpu)
        };
        let m = model::load(folder.path(), &options).unwrap().model;
        let (want, want_logits, unfused, _) = tiny_greedy(&m, false);
        let (got, got_logits, fused, copies) = tiny_greedy(&m, true);
        assert_eq!(unfused, 0);
        assert_eq!(fused, 12);
        assert_eq!(got, want);
        let err = max_rel_err(&got_logits, &want_logits, 1e-2);
        assert!(err < 1e-3, "logits: max rel err {err}");
        // Every cache buffer was updated in place: no per-token copy.
        assert_eq!(copies, 0);
    });
}

/// The result of a decoder call: out and the updated caches.
type Outcome = Result<(Array, Vec<(Array, Array)>), mlx_backend::OpError>;

/// Runs `call` with the kernel on or off over fresh copies of `cache`
/// (copies, so the kernel may reuse their buffers), evaluates everything
/// and returns the output, the updated caches and the fused nodes the
/// registry counted.
fn run_stack(
    call: impl FnOnce(&[(&Array, &Array)]) -> Outcome,
    cache: &[(Array, Array)],
    fused: bool,
) -> (Array, Vec<(Array, Array)>, u64) {
    registry::set_enabled(Kernel::DecoderLayer, fused);
    let owned: Vec<(Array, Array)> = cache
        .iter()
        .map(|(k, v)| (k.add_scalar(0.0).unwrap(), v.add_scalar(0.0).unwrap()))
        .collect();
    let refs: Vec<(&Array, &Array)> = owned.iter().map(|(k, v)| (k, v)).collect();
    let before = registry::snapshot().get(Kernel::DecoderLayer).fused;
    let (out, rows) = call(&refs).unwrap();
    drop(refs);
    drop(owned);
    let mut all = vec![&out];
    all.extend(rows.iter().flat_map(|(k, v)| [k, v]));
    eval(&all).unwrap();
    let nodes = registry::snapshot().get(Kernel::DecoderLayer).fused - before;
    registry::set_enabled(Kernel::DecoderLayer, true);
    (out, rows, nodes)
}

/// The fused output and every cache within 1e-3 (relative, 1e-2 floor)
/// of the reference.
fn assert_close(got: &(Array, Vec<(Array, Array)>, u64), want: &(Array, Vec<(Array, Array)>, u64)) {
    let err = max_rel_err(&got.0, &want.0, 1e-2);
    assert!(err < 1e-3, "out: max rel err {err}");
    assert_eq!(got.1.len(), want.1.len());
    for (i, ((gk, gv), (wk, wv))) in got.1.iter().zip(&want.1).enumerate() {
        let ek = max_rel_err(gk, wk, 1e-2);
        let ev = max_rel_err(gv, wv, 1e-2);
        assert!(ek < 1e-3 && ev < 1e-3, "cache {i}: keys {ek}, values {ev}");
    }
}

/// The stack tests' call: seven blocks with q/k/v biases, five rows of
/// cache capacities 9–30 (block-major: block l, row b at l * 5 + b), each
/// row's offset, and x.
struct StackCall {
    v: Variant,
    weights: Vec<Weights>,
    cache: Vec<(Array, Array)>,
    offsets: Vec<i32>,
    x: Array,
}

const STACK_BLOCKS: u64 = 7;

fn stack_call(seed: u64) -> StackCall {
    let v = Variant {
        bias: true,
        ..Variant::default()
    };
    let caps = [9, 30, 17, 12, 25];
    let offsets_per_row = [8, 0, 16, 5, 24];
    StackCall {
        weights: (0..STACK_BLOCKS)
            .map(|l| weights(&v, seed + 50 * l))
            .collect(),
        cache: (0..STACK_BLOCKS)
            .flat_map(|l| caches(&caps, seed + 400 + 10 * l))
            .collect(),
        offsets: (0..STACK_BLOCKS).flat_map(|_| offsets_per_row).collect(),
        x: normal(&[caps.len() as i32, 1, H], Dtype::F32, 0.0, 1.0, seed + 477),
        v,
    }
}

/// A stack of blocks with their own weights and caches, block l's output
/// feeding block l + 1: fused (in nodes of several blocks; at 5 rows, 6
/// blocks per node, so 7 blocks take two nodes) against the same blocks
/// built from MLX's ops, with every cache checked.
#[test]
fn stacked_blocks_match_mlx_ops_across_nodes() {
    on_each_device(|_dev| {
        let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let StackCall {
            v,
            weights,
            cache,
            offsets,
            x,
        } = stack_call(300);
        let layers: Vec<DecoderLayer> = weights.iter().map(|w| layer(&v, w)).collect();
        let stack = DecoderStack::new(&layers).unwrap();
        assert_eq!(stack.len(), STACK_BLOCKS as usize);
        let want = run_stack(|c| stack.forward(&x, c, &offsets), &cache, false);
        let got = run_stack(|c| stack.forward(&x, c, &offsets), &cache, true);
        assert_eq!((want.2, got.2), (0, 2));
        assert_eq!(got.1.len(), cache.len());
        assert_close(&got, &want);
        // A call that does not match the stack is an error and changes nothing.
        let refs: Vec<(&Array, &Array)> = cache.iter().map(|(k, v)| (k, v)).collect();
        let err = stack.forward(&x, &refs[1..], &offsets[1..]).unwrap_err();
        assert!(err.to_string().contains("35 caches"), "{err}");
        let (out, _) = stack.forward(&x, &refs, &offsets).unwrap();
        assert!(out.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
    });
}

/// With `writing_caches_in_place`, evaluated caches that hold their
/// buffers alone are written where they are: every block of a 5-row call
/// in one node (70 caches, past the 64 a node takes as outputs), the given
/// arrays come back and hold what MLX's ops give. A cache that shares its
/// buffer with a view makes the call build the returning nodes instead,
/// and the view and the given caches keep their values.
#[test]
fn caches_are_written_in_place_when_they_allow_it() {
    on_each_device(|_dev| {
        let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let StackCall {
            v,
            weights,
            cache,
            offsets,
            x,
        } = stack_call(1500);
        let layers: Vec<DecoderLayer> = weights.iter().map(|w| layer(&v, w)).collect();
        let stack = DecoderStack::new(&layers)
            .unwrap()
            .writing_caches_in_place();
        let want = run_stack(|c| stack.forward(&x, c, &offsets), &cache, false);
        let fused = || registry::snapshot().get(Kernel::DecoderLayer).fused;
        // Evaluated copies, each the only holder of its buffer.
        let evaluated = || {
            let owned: Vec<(Array, Array)> = cache
                .iter()
                .map(|(k, v)| (k.add_scalar(0.0).unwrap(), v.add_scalar(0.0).unwrap()))
                .collect();
            let all: Vec<&Array> = owned.iter().flat_map(|(k, v)| [k, v]).collect();
            eval(&all).unwrap();
            owned
        };

        let owned = evaluated();
        let refs: Vec<(&Array, &Array)> = owned.iter().map(|(k, v)| (k, v)).collect();
        assert!(DecoderStack::caches_writable_in_place(&refs));
        // The same buffer twice is not writable in place.
        assert!(!DecoderStack::caches_writable_in_place(&[(
            &owned[0].0,
            &owned[0].0
        )]));
        let pending = owned[0].1.add_scalar(1.0).unwrap();
        assert!(!DecoderStack::caches_writable_in_place(&[(
            &owned[0].0,
            &pending
        )]));
        let before = fused();
        let (out, rows) = stack.forward(&x, &refs, &offsets).unwrap();
        assert_eq!(fused() - before, 1);
        assert_eq!(rows.len(), owned.len());
        eval(&[&out]).unwrap();
        assert_close(&(out.clone(), owned.clone(), 1), &want);
        assert_close(&(out, rows, 1), &want);

        // A view of one cache shares its buffer: not written in place.
        let owned = evaluated();
        let view = owned[3].1.slice_axis(2, 0, 4).unwrap();
        eval(&[&view]).unwrap();
        let view_before = view.to_vec::<f32>().unwrap();
        let given_before = owned[3].1.to_vec::<f32>().unwrap();
        let refs: Vec<(&Array, &Array)> = owned.iter().map(|(k, v)| (k, v)).collect();
        assert!(!DecoderStack::caches_writable_in_place(&refs));
        let before = fused();
        let (out, rows) = stack.forward(&x, &refs, &offsets).unwrap();
        assert_eq!(fused() - before, 2, "6 blocks of 5 rows per node");
        let mut all = vec![&out];
        all.extend(rows.iter().flat_map(|(k, v)| [k, v]));
        eval(&all).unwrap();
        assert_close(&(out, rows, 2), &want);
        assert_eq!(view.to_vec::<f32>().unwrap(), view_before);
        assert_eq!(owned[3].1.to_vec::<f32>().unwrap(), given_before);

        // A view made after the node was built, evaluated before it: the node
        // refuses to write a shared buffer (a typed error, the view keeps its
        // values), and the stack goes on working.
        let owned = evaluated();
        let refs: Vec<(&Array, &Array)> = owned.iter().map(|(k, v)| (k, v)).collect();
        let (out, _) = stack.forward(&x, &refs, &offsets).unwrap();
        let late = owned[0].0.slice_axis(2, 0, 4).unwrap();
        eval(&[&late]).unwrap();
        let late_before = late.to_vec::<f32>().unwrap();
        let err = eval(&[&out]).unwrap_err();
        assert!(err.to_string().contains("written in place"), "{err}");
        assert_eq!(late.to_vec::<f32>().unwrap(), late_before);
        assert!(!registry::has_failed(Kernel::DecoderLayer));
        drop(late);
        let again = run_stack(|c| stack.forward(&x, c, &offsets), &cache, true);
        assert_close(&again, &want);
    });
}

/// Token ids looked up in the stack's quantized table inside the first
/// node (8-bit and 4-bit tables, uint32 and int32 ids) against the blocks
/// run from the rows MLX's own lookup gives (take, dequantize), built from
/// MLX's ops; calls the table cannot serve are errors.
#[test]
fn token_ids_are_looked_up_in_the_first_node() {
    on_each_device(|_dev| {
        let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let v = Variant::default();
        let weights: Vec<Weights> = (0..3).map(|l| weights(&v, 900 + 50 * l)).collect();
        let layers: Vec<DecoderLayer> = weights.iter().map(|w| layer(&v, w)).collect();
        let caps = [9, 20, 14];
        let offsets_per_row = [8, 3, 13];
        let cache: Vec<(Array, Array)> =
            (0..3).flat_map(|l| caches(&caps, 1100 + 10 * l)).collect();
        let offsets: Vec<i32> = (0..3).flat_map(|_| offsets_per_row).collect();
        for (bits, seed) in [(8, 1200), (4, 1300)] {
            let table = quantize(&normal(&[50, H], Dtype::F32, 0.0, 1.0, seed), 32, bits).unwrap();
            let stack = DecoderStack::new(&layers)
                .unwrap()
                .with_embedding(&table)
                .unwrap();
            for ids in [
                Array::from_slice(&[7u32, 49, 0], &[3, 1]).unwrap(),
                Array::from_slice(&[7i32, 49, 0], &[3, 1]).unwrap(),
            ] {
                // The model's own lookup, then the blocks from MLX's ops.
                let rows = Quantized {
                    weight: table.weight.take(&ids, 0).unwrap(),
                    scales: table.scales.take(&ids, 0).unwrap(),
                    biases: table.biases.take(&ids, 0).unwrap(),
                    group_size: 32,
                    bits,
                }
                .dequantize()
                .unwrap();
                let want = run_stack(|c| stack.forward(&rows, c, &offsets), &cache, false);
                let got = run_stack(|c| stack.forward_tokens(&ids, c, &offsets), &cache, true);
                assert_eq!(got.2, 1);
                assert_eq!(got.0.shape(), vec![3, 1, H]);
                assert_close(&got, &want);
            }
        }
        let refs: Vec<(&Array, &Array)> = cache.iter().map(|(k, v)| (k, v)).collect();
        let ids = Array::from_slice(&[1u32, 2, 3], &[3, 1]).unwrap();
        let plain = DecoderStack::new(&layers).unwrap();
        let err = plain.forward_tokens(&ids, &refs, &offsets).unwrap_err();
        assert!(err.to_string().contains("embedding table"), "{err}");
        let floats = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3, 1]).unwrap();
        let err = plain.forward_tokens(&floats, &refs, &offsets).unwrap_err();
        assert!(err.to_string().contains("token ids"), "{err}");
    });
}

/// A stack from token ids to logits (lookup, blocks, final norm and an
/// 8-bit head in one node) against the same from MLX's ops: the logits'
/// shape and values, and each cache.
#[test]
fn a_stack_with_a_head_returns_the_models_logits() {
    on_each_device(|_dev| {
        let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let v = Variant::default();
        let weights: Vec<Weights> = (0..2).map(|l| weights(&v, 1500 + 50 * l)).collect();
        let layers: Vec<DecoderLayer> = weights.iter().map(|w| layer(&v, w)).collect();
        let caps = [11, 6];
        let cache: Vec<(Array, Array)> =
            (0..2).flat_map(|l| caches(&caps, 1600 + 10 * l)).collect();
        let offsets = [10, 2, 10, 2];
        let table = quantize(&normal(&[70, H], Dtype::F32, 0.0, 1.0, 1700), 32, 8).unwrap();
        let norm = normal(&[H], Dtype::F32, 1.0, 0.2, 1701);
        let stack = DecoderStack::new(&layers)
            .unwrap()
            .with_embedding(&table)
            .unwrap()
            .with_head(&norm, 1e-5, &table, ActivationPrecision::Exact)
            .unwrap();
        assert!(stack.has_head() && stack.has_embedding());
        let ids = Array::from_slice(&[69u32, 5], &[2, 1]).unwrap();
        let want = run_stack(|c| stack.forward_tokens(&ids, c, &offsets), &cache, false);
        let got = run_stack(|c| stack.forward_tokens(&ids, c, &offsets), &cache, true);
        assert_eq!((want.2, got.2), (0, 1));
        assert_eq!(got.0.shape(), vec![2, 1, 70]);
        assert_eq!(got.0.dtype(), Dtype::F32);
        assert_close(&got, &want);
    });
}
