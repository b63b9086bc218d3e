//! Helpers shared by the kernels_* integration tests.
#![allow(dead_code)]

use mlx_backend::kernels::{has_body, registry, Backend, FallbackReason, Kernel, KernelStats};
use mlx_backend::ops::{quantize, random, Quantized};
use mlx_backend::{Array, Device, Dtype};
use std::io::Write;
use std::sync::Once;

/// The devices this MLX build runs on: the CPU, and the GPU when there is one.
pub fn devices() -> Vec<Device> {
    std::iter::once(Device::Cpu).chain(Device::gpu()).collect()
}

/// Runs `f` once per device of [`devices`], every op it builds placed on
/// that device's default stream (so the kernel bodies of that device's
/// backend, and the reference ops, run there). Silent on success; a
/// failing case names its device. Without a GPU, notes once per test
/// binary that the GPU cases were skipped.
pub fn on_each_device(f: impl Fn(Device)) {
    static NO_GPU: Once = Once::new();
    let devices = devices();
    if !devices.iter().any(|d| matches!(d, Device::Gpu(_))) {
        NO_GPU.call_once(|| {
            // Past the test harness's capture, so it shows on passing runs too.
            let _ = writeln!(
                std::io::stderr(),
                "no GPU in this MLX build: GPU cases skipped"
            );
        });
    }
    for device in devices {
        let _note = NameDeviceOnPanic(device);
        device.default_stream().unwrap().scope(|| f(device));
    }
}

struct NameDeviceOnPanic(Device);

impl Drop for NameDeviceOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("(the failing case ran on {})", self.0);
        }
    }
}

/// Runs `f` with every op it builds on the CPU stream (tests of CPU-body
/// mechanics).
pub fn on_cpu<R>(f: impl FnOnce() -> R) -> R {
    Device::Cpu.default_stream().unwrap().scope(f)
}

/// Whether `kernel` has a body on the current stream's backend (else its
/// builds count [`FallbackReason::NoKernelForDevice`]).
pub fn fused_expected(kernel: Kernel) -> bool {
    has_body(kernel, Backend::current())
}

/// How the current backend counts one build of `kernel` on inputs the CPU
/// body takes: fused (`Ok`), or why it falls back. `limit` is that
/// backend's body's own verdict on the inputs: `Ok(())` where it covers
/// what the CPU body does, else e.g. [`cuda_qmv_limit`].
pub fn expected_outcome(
    kernel: Kernel,
    limit: Result<(), FallbackReason>,
) -> Result<(), FallbackReason> {
    if fused_expected(kernel) {
        limit
    } else {
        Err(FallbackReason::NoKernelForDevice)
    }
}

/// Evaluates `got`, one build of `kernel` for `case`. On a GPU, where the
/// build fell back to MLX's own op (`limit`, as in [`expected_outcome`],
/// refused the inputs, or the backend has no body) and that op fails, says
/// so and returns false: MLX 0.32.4's CUDA quantized kernels reject some
/// shapes (docs/gpu.md). A failure anywhere else, a body of ours included,
/// panics.
pub fn eval_or_note_mlx_failure(
    kernel: Kernel,
    got: &Array,
    limit: Result<(), FallbackReason>,
    case: &str,
) -> bool {
    let Err(e) = got.eval() else {
        return true;
    };
    let backend = Backend::current();
    if backend != Backend::Cpu && expected_outcome(kernel, limit).is_err() {
        eprintln!("MLX's fallback for {kernel} failed on {backend} for {case}: {e}");
        return false;
    }
    panic!("{case}: {e}");
}

/// The most rows of x the CUDA quantized bodies take.
pub const CUDA_QMV_MAX_ROWS: usize = 4;

/// The GPU quantized_matmul bodies' limits: groups of 32, 64 or 128 and K
/// a multiple of 32; on CUDA at any number of rows (more than
/// [`CUDA_QMV_MAX_ROWS`] run its tiled kernels), on Metal at most
/// [`CUDA_QMV_MAX_ROWS`] rows (its decode kernels only). `Ok(())` on the CPU.
pub fn cuda_qmm_limit(x: &Array, group_size: i32) -> Result<(), FallbackReason> {
    let backend = Backend::current();
    if backend == Backend::Cpu {
        return Ok(());
    }
    if !matches!(group_size, 32 | 64 | 128) {
        return Err(FallbackReason::UnsupportedQuantization);
    }
    let k = *x.shape().last().unwrap();
    if k <= 0 || k % 32 != 0 {
        return Err(FallbackReason::UnsupportedShape);
    }
    if backend == Backend::Metal && x.size() / k as usize > CUDA_QMV_MAX_ROWS {
        return Err(FallbackReason::UnsupportedShape);
    }
    Ok(())
}

/// The GPU dense gate_qmv_silu_mul body's limits: [`cuda_qmm_limit`]'s
/// and at most [`CUDA_QMV_MAX_ROWS`] rows of x. `Ok(())` on other backends.
pub fn cuda_qmv_limit(x: &Array, group_size: i32) -> Result<(), FallbackReason> {
    cuda_qmm_limit(x, group_size)?;
    let k = *x.shape().last().unwrap();
    if Backend::current() != Backend::Cpu && x.size() / k as usize > CUDA_QMV_MAX_ROWS {
        return Err(FallbackReason::UnsupportedShape);
    }
    Ok(())
}

/// The GPU moe_combine bodies' limit (CUDA and Metal): at most 64 experts
/// per token (y `[..., top_k, hidden]`). `Ok(())` on the CPU.
pub fn cuda_moe_limit(y: &Array) -> Result<(), FallbackReason> {
    let shape = y.shape();
    if Backend::current() != Backend::Cpu && shape[shape.len() - 2] > 64 {
        Err(FallbackReason::UnsupportedShape)
    } else {
        Ok(())
    }
}

/// The op builds of one kernel a test made, each as the current backend
/// counts it ([`expected_outcome`]); [`Tally::check`] asserts the
/// registry's counters grew by at least that much (the tests of a binary
/// share the registry and run in parallel). On the CPU every kernel has a
/// body, so it asserts `fused` grew by the number of builds.
pub struct Tally {
    kernel: Kernel,
    before: KernelStats,
    outcomes: Vec<Result<(), FallbackReason>>,
}

impl Tally {
    pub fn new(kernel: Kernel) -> Tally {
        Tally {
            kernel,
            before: registry::stats(kernel),
            outcomes: Vec::new(),
        }
    }

    /// One build on inputs the CPU body takes; `limit` as in [`expected_outcome`].
    pub fn record(&mut self, limit: Result<(), FallbackReason>) {
        self.outcomes.push(expected_outcome(self.kernel, limit));
    }

    /// How many builds were recorded.
    pub fn builds(&self) -> usize {
        self.outcomes.len()
    }

    pub fn check(&self) {
        let (kernel, backend) = (self.kernel, Backend::current());
        let after = registry::stats(kernel);
        let fused = self.outcomes.iter().filter(|o| o.is_ok()).count() as u64;
        assert!(
            after.fused - self.before.fused >= fused,
            "{kernel} on {backend}: {} of {fused} expected builds fused",
            after.fused - self.before.fused
        );
        for reason in FallbackReason::ALL {
            let n = self.outcomes.iter().filter(|&&o| o == Err(reason)).count() as u64;
            let grew = after.fallbacks(reason) - self.before.fallbacks(reason);
            assert!(
                grew >= n,
                "{kernel} on {backend}: {grew} of {n} expected builds fell back for {reason:?}"
            );
        }
    }
}

/// Asserts that one build of `kernel` since `before` fell back for
/// `reason` (the counter grew by exactly one), or, on a backend without
/// the kernel's body, for [`FallbackReason::NoKernelForDevice`] (by at least
/// one: the binary's other tests of the kernel count there too).
pub fn assert_fallback_counted(kernel: Kernel, before: &KernelStats, reason: FallbackReason) {
    let after = registry::stats(kernel);
    if fused_expected(kernel) {
        assert_eq!(after.fallbacks(reason), before.fallbacks(reason) + 1);
    } else {
        let no_body = FallbackReason::NoKernelForDevice;
        assert!(
            after.fallbacks(no_body) > before.fallbacks(no_body),
            "{kernel} on {}: not counted as {no_body:?}",
            Backend::current()
        );
    }
}

/// Fresh normal(loc, scale) data in `dtype` from an explicit seed.
pub fn normal(shape: &[i32], dtype: Dtype, loc: f32, scale: f32, seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal(shape, dtype, loc, scale, Some(&key)).unwrap()
}

/// Uniform ints in `[0, hi)` as uint32.
pub fn indices(shape: &[i32], hi: u32, seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::uniform(0.0, hi as f32, shape, Dtype::F32, Some(&key))
        .unwrap()
        .floor()
        .unwrap()
        .astype(Dtype::U32)
        .unwrap()
}

/// Largest `|got - want| / (|want| + atol)` over all elements.
pub fn max_rel_err(got: &Array, want: &Array, atol: f32) -> f32 {
    let g = got.to_f32_vec().unwrap();
    let w = want.to_f32_vec().unwrap();
    assert_eq!(g.len(), w.len());
    g.iter()
        .zip(&w)
        .map(|(g, w)| {
            assert!(g.is_finite(), "non-finite output {g}");
            (g - w).abs() / (w.abs() + atol)
        })
        .fold(0.0, f32::max)
}

/// Relative error of the whole tensor: ‖got − want‖ / ‖want‖.
pub fn norm_rel_err(got: &Array, want: &Array) -> f64 {
    let g = got.to_f32_vec().unwrap();
    let w = want.to_f32_vec().unwrap();
    assert_eq!(g.len(), w.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (g, w) in g.iter().zip(&w) {
        assert!(g.is_finite(), "non-finite output {g}");
        num += ((g - w) as f64).powi(2);
        den += (*w as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

pub fn bits(a: &Array) -> Vec<u32> {
    a.to_f32_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Random weights `[..lead, n, k]` (normal, scale 0.05) in `dtype`, quantized.
pub fn quantized_weights(
    lead: &[i32],
    n: i32,
    k: i32,
    dtype: Dtype,
    bits: i32,
    group: i32,
    seed: u64,
) -> Quantized {
    let shape: Vec<i32> = lead.iter().copied().chain([n, k]).collect();
    quantize(&normal(&shape, dtype, 0.0, 0.05, seed), group, bits).unwrap()
}

/// The same quantized weights with f32 scales and biases.
pub fn upcast(q: &Quantized) -> Quantized {
    Quantized {
        scales: q.scales.astype(Dtype::F32).unwrap(),
        biases: q.biases.astype(Dtype::F32).unwrap(),
        ..q.clone()
    }
}
