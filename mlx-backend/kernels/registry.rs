//! The one registry of custom kernels: per-kernel switches (environment and
//! API), the fused-or-fallback decision with a typed reason, counters, and
//! remembered failures.
//!
//! A kernel whose CPU body fails is logged once, marked failed, and every
//! later op build takes the fallback ([`FallbackReason::PreviouslyFailed`]);
//! nothing is retried and no partial state is kept.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The environment variable holding per-kernel switches, read once:
/// a comma list of kernel names, each optionally prefixed by `-` to turn it
/// off, plus `all` / `-all`; e.g. `MLX_BACKEND_KERNELS=rms_norm,-moe_combine`.
pub const ENV_VAR: &str = "MLX_BACKEND_KERNELS";

/// A custom kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    RmsNorm,
    MoeCombine,
    GateQmvSiluMul,
    QuantizedMatmul,
    Attention,
    DecoderLayer,
}

/// How many kernels there are.
const KERNELS: usize = 6;

impl Kernel {
    pub const ALL: [Kernel; KERNELS] = [
        Kernel::RmsNorm,
        Kernel::MoeCombine,
        Kernel::GateQmvSiluMul,
        Kernel::QuantizedMatmul,
        Kernel::Attention,
        Kernel::DecoderLayer,
    ];

    /// The name used in `MLX_BACKEND_KERNELS`, logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::RmsNorm => "rms_norm",
            Kernel::MoeCombine => "moe_combine",
            Kernel::GateQmvSiluMul => "gate_qmv_silu_mul",
            Kernel::QuantizedMatmul => "quantized_matmul",
            Kernel::Attention => "attention",
            Kernel::DecoderLayer => "decoder_layer",
        }
    }

    pub fn from_name(name: &str) -> Option<Kernel> {
        Kernel::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the kernel is on when neither the environment nor the API
    /// says otherwise; each kernel decides from its benchmark.
    pub fn default_enabled(self) -> bool {
        match self {
            Kernel::RmsNorm => super::rms_norm::DEFAULT_ENABLED,
            Kernel::MoeCombine => super::moe_combine::DEFAULT_ENABLED,
            Kernel::GateQmvSiluMul => super::gate_qmv_silu_mul::DEFAULT_ENABLED,
            Kernel::QuantizedMatmul => super::quantized_matmul::DEFAULT_ENABLED,
            Kernel::Attention => super::attention::DEFAULT_ENABLED,
            Kernel::DecoderLayer => super::decoder_layer::DEFAULT_ENABLED,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an op build used MLX's fallback graph instead of the fused Primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FallbackReason {
    /// Switched off (environment or API).
    Disabled,
    /// The stream's device has no kernel yet (GPU until CUDA/Metal land).
    NoKernelForDevice,
    /// A dtype (or dtype combination) the kernel does not cover.
    UnsupportedDtype,
    /// A valid MLX quantization the kernel does not cover (e.g. 3-bit).
    UnsupportedQuantization,
    /// A mask (array masks) or shape (causal with more queries than keys)
    /// the kernel does not cover.
    UnsupportedMask,
    /// The kernel failed earlier in this process.
    PreviouslyFailed,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 6] = [
        FallbackReason::Disabled,
        FallbackReason::NoKernelForDevice,
        FallbackReason::UnsupportedDtype,
        FallbackReason::UnsupportedQuantization,
        FallbackReason::UnsupportedMask,
        FallbackReason::PreviouslyFailed,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// Counters of one kernel, as read by [`stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// Op builds that used the fused Primitive.
    pub fused: u64,
    /// Op builds that used the fallback, indexed like [`FallbackReason::ALL`].
    fallbacks: [u64; 6],
    pub enabled: bool,
    pub failed: bool,
}

impl KernelStats {
    pub fn fallbacks(&self, reason: FallbackReason) -> u64 {
        self.fallbacks[reason.index()]
    }

    pub fn total_fallbacks(&self) -> u64 {
        self.fallbacks.iter().sum()
    }
}

/// A snapshot of every kernel's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub kernels: Vec<(Kernel, KernelStats)>,
}

impl Snapshot {
    pub fn get(&self, kernel: Kernel) -> KernelStats {
        self.kernels
            .iter()
            .find(|(k, _)| *k == kernel)
            .map_or_else(KernelStats::default, |(_, s)| *s)
    }
}

/// A recorded kernel failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub kernel: Kernel,
    pub message: String,
}

struct Slot {
    enabled: AtomicBool,
    failed: AtomicBool,
    force_failure: AtomicBool,
    fused: AtomicU64,
    fallbacks: [AtomicU64; 6],
}

struct Registry {
    slots: [Slot; KERNELS],
    /// Bumped on every recorded failure, so an eval can tell one happened.
    failure_epoch: AtomicU64,
    last_failure: Mutex<Option<Failure>>,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let env = std::env::var(ENV_VAR).unwrap_or_default();
        let switches = parse_switches(&env);
        let slot = |k: Kernel| Slot {
            enabled: AtomicBool::new(switches[k.index()].unwrap_or(k.default_enabled())),
            failed: AtomicBool::new(false),
            force_failure: AtomicBool::new(false),
            fused: AtomicU64::new(0),
            fallbacks: Default::default(),
        };
        Registry {
            slots: Kernel::ALL.map(slot),
            failure_epoch: AtomicU64::new(0),
            last_failure: Mutex::new(None),
        }
    })
}

/// Applies `MLX_BACKEND_KERNELS` syntax; later entries win; unknown names
/// are reported once on stderr and otherwise ignored.
fn parse_switches(spec: &str) -> [Option<bool>; KERNELS] {
    let mut out = [None; KERNELS];
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (on, name) = match item.strip_prefix('-') {
            Some(rest) => (false, rest),
            None => (true, item.strip_prefix('+').unwrap_or(item)),
        };
        if name == "all" {
            out = [Some(on); KERNELS];
        } else if let Some(k) = Kernel::from_name(name) {
            out[k.index()] = Some(on);
        } else {
            eprintln!("mlx-backend: {ENV_VAR}: unknown kernel '{name}' ignored");
        }
    }
    out
}

fn slot(kernel: Kernel) -> &'static Slot {
    &registry().slots[kernel.index()]
}

/// Turns a kernel on or off for later op builds.
pub fn set_enabled(kernel: Kernel, enabled: bool) {
    slot(kernel).enabled.store(enabled, Ordering::SeqCst);
}

pub fn is_enabled(kernel: Kernel) -> bool {
    slot(kernel).enabled.load(Ordering::SeqCst)
}

/// Whether the kernel failed earlier in this process.
pub fn has_failed(kernel: Kernel) -> bool {
    slot(kernel).failed.load(Ordering::SeqCst)
}

pub fn stats(kernel: Kernel) -> KernelStats {
    let s = slot(kernel);
    KernelStats {
        fused: s.fused.load(Ordering::SeqCst),
        fallbacks: std::array::from_fn(|i| s.fallbacks[i].load(Ordering::SeqCst)),
        enabled: s.enabled.load(Ordering::SeqCst),
        failed: s.failed.load(Ordering::SeqCst),
    }
}

pub fn snapshot() -> Snapshot {
    Snapshot {
        kernels: Kernel::ALL.map(|k| (k, stats(k))).to_vec(),
    }
}

/// The most recent kernel failure, if any.
pub fn last_failure() -> Option<Failure> {
    registry()
        .last_failure
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// Test hook: the kernel's next CPU invocation fails as if its body had
/// returned an error.
#[doc(hidden)]
pub fn force_failure(kernel: Kernel, fail: bool) {
    slot(kernel).force_failure.store(fail, Ordering::SeqCst);
}

/// Test hook: forget a recorded failure so the kernel is used again.
#[doc(hidden)]
pub fn clear_failure(kernel: Kernel) {
    slot(kernel).failed.store(false, Ordering::SeqCst);
}

pub(crate) fn take_forced_failure(kernel: Kernel) -> bool {
    slot(kernel).force_failure.swap(false, Ordering::SeqCst)
}

/// Decides fused or fallback for one op build. `eligibility` is the
/// kernel's own verdict on the inputs; the registry adds the switches and
/// the failure memory. The decision is counted by [`count`] once the op
/// is built, so rejected (invalid) calls count nothing.
pub(crate) fn decide(
    kernel: Kernel,
    eligibility: Result<(), FallbackReason>,
) -> Result<(), FallbackReason> {
    let s = slot(kernel);
    if !s.enabled.load(Ordering::SeqCst) {
        return Err(FallbackReason::Disabled);
    }
    if s.failed.load(Ordering::SeqCst) {
        return Err(FallbackReason::PreviouslyFailed);
    }
    eligibility
}

pub(crate) fn count(kernel: Kernel, decision: Result<(), FallbackReason>) {
    let s = slot(kernel);
    match decision {
        Ok(()) => s.fused.fetch_add(1, Ordering::SeqCst),
        Err(r) => s.fallbacks[r.index()].fetch_add(1, Ordering::SeqCst),
    };
}

/// Records a failure of the kernel's CPU body (called on MLX's stream
/// thread); logs the first failure of each kernel.
pub(crate) fn record_failure(kernel: Kernel, message: String) {
    let r = registry();
    let first = !r.slots[kernel.index()].failed.swap(true, Ordering::SeqCst);
    if first {
        eprintln!(
            "mlx-backend: kernel {kernel} failed ({message}); using MLX's fallback from now on"
        );
    }
    *r.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(Failure { kernel, message });
    r.failure_epoch.fetch_add(1, Ordering::SeqCst);
}

pub(crate) fn failure_epoch() -> u64 {
    registry().failure_epoch.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_switches() {
        assert_eq!(parse_switches(""), [None; KERNELS]);
        assert_eq!(
            parse_switches("rms_norm, -moe_combine"),
            [Some(true), Some(false), None, None, None, None]
        );
        assert_eq!(
            parse_switches("-all,gate_qmv_silu_mul,bogus"),
            [
                Some(false),
                Some(false),
                Some(true),
                Some(false),
                Some(false),
                Some(false)
            ]
        );
        assert_eq!(
            parse_switches("-quantized_matmul"),
            [None, None, None, Some(false), None, None]
        );
    }
}
