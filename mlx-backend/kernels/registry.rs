//! The one registry of custom kernels: switches (environment and API), the
//! fused-or-fallback decision with a typed reason, counters, and remembered
//! failures, each kept per (kernel, backend).
//!
//! A kernel body that fails is logged once, marked failed on its backend,
//! and every later op build on that backend takes the fallback
//! ([`FallbackReason::PreviouslyFailed`]); nothing is retried and no partial
//! state is kept. The kernel's bodies on other backends are unaffected.
//!
//! The functions without a backend argument act on the backend of the
//! stream ops are being built on now ([`Backend::current`]), except
//! [`set_enabled`], which switches every backend.

pub use super::backend::Backend;
use super::backend::BACKENDS;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The environment variable holding the switches, read once: a comma list
/// of kernel names, each optionally prefixed by `-` to turn it off and
/// suffixed by `@backend` to switch one backend only, plus `all` / `-all`;
/// e.g. `MLX_BACKEND_KERNELS=-all,rms_norm` or `-quantized_matmul@cuda`.
pub const ENV_VAR: &str = "MLX_BACKEND_KERNELS";

/// A custom kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// RMSNorm, plain and with the residual add ([`rms_norm`](super::rms_norm())).
    RmsNorm,
    /// The weighted sum of the top-k expert outputs ([`moe_combine`](super::moe_combine())).
    MoeCombine,
    /// The quantized SwiGLU projection ([`gate_qmv_silu_mul`](super::gate_qmv_silu_mul())).
    GateQmvSiluMul,
    /// `x·Wᵀ` on affine-quantized weights ([`quantized_matmul`](super::quantized_matmul())).
    QuantizedMatmul,
    /// Scaled dot-product attention ([`attention`](super::attention())).
    Attention,
    /// A whole quantized decoder block for decode rows ([`decoder_layer`](super::decoder_layer())).
    DecoderLayer,
}

/// How many kernels there are.
const KERNELS: usize = 6;

impl Kernel {
    /// Every kernel, in the order the registry (and the C++ side) numbers them.
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

    /// The kernel of a name as [`Kernel::name`] spells it.
    pub fn from_name(name: &str) -> Option<Kernel> {
        Kernel::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the kernel is on when neither the environment nor the API
    /// says otherwise, before the CPU family is considered
    /// ([`Kernel::default_enabled_on`]). Every kernel is: each beats MLX's
    /// own ops in its benchmark (docs/performance.md). A kernel that ever
    /// loses one gets its arm here.
    pub fn default_enabled(self) -> bool {
        match self {
            Kernel::RmsNorm
            | Kernel::MoeCombine
            | Kernel::GateQmvSiluMul
            | Kernel::QuantizedMatmul
            | Kernel::Attention
            | Kernel::DecoderLayer => true,
        }
    }

    /// Whether the kernel is on by default on `backend` for a CPU of
    /// `arch` (what the registry starts from before the environment and
    /// the API): [`Kernel::default_enabled`], except that the CPU bodies
    /// are on only on x86-64. Their speed comes from x86 SIMD paths
    /// (AVX2/AVX-512/AMX, `kernels/cpu`) and was measured only there
    /// (docs/performance.md); on other CPUs (Apple silicon's included)
    /// they run portable code that no one has measured against MLX's own
    /// Accelerate/NEON ops, so MLX's ops are the default there until NEON
    /// bodies are written and measured. `MLX_BACKEND_KERNELS=all@cpu`
    /// turns them on (the macOS CI job tests them that way).
    pub fn default_enabled_on(self, backend: Backend, arch: CpuArch) -> bool {
        if !self.default_enabled() {
            return false;
        }
        match (backend, arch) {
            (Backend::Cpu, CpuArch::X86_64) => true,
            (Backend::Cpu, CpuArch::Aarch64 | CpuArch::Other) => match self {
                Kernel::RmsNorm
                | Kernel::MoeCombine
                | Kernel::GateQmvSiluMul
                | Kernel::QuantizedMatmul
                | Kernel::Attention
                | Kernel::DecoderLayer => false,
            },
            (Backend::Cuda | Backend::Metal, _) => true,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The CPU family the CPU bodies run on: their defaults differ by it
/// ([`Kernel::default_enabled_on`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CpuArch {
    /// x86-64, where the CPU bodies were written and measured.
    X86_64,
    /// 64-bit Arm (Apple silicon, Linux on Arm servers).
    Aarch64,
    /// Anything else.
    Other,
}

impl CpuArch {
    /// The CPU this build targets.
    pub const fn current() -> CpuArch {
        if cfg!(target_arch = "x86_64") {
            CpuArch::X86_64
        } else if cfg!(target_arch = "aarch64") {
            CpuArch::Aarch64
        } else {
            CpuArch::Other
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether this build has `kernel`'s body for `backend`: the table of
/// bodies. A kernel without a body on the stream's backend builds MLX's
/// fallback graph ([`FallbackReason::NoKernelForDevice`]).
pub fn has_body(kernel: Kernel, backend: Backend) -> bool {
    use Backend::*;
    use Kernel::*;
    let cuda = cfg!(feature = "cuda");
    let metal = cfg!(all(feature = "metal", target_os = "macos"));
    match (kernel, backend) {
        (_, Cpu) => true,
        (RmsNorm, Cuda) => cuda,
        (MoeCombine, Cuda) => cuda,
        (GateQmvSiluMul, Cuda) => cuda,
        (QuantizedMatmul, Cuda) => cuda,
        (Attention, Cuda) => cuda,
        (DecoderLayer, Cuda) => cuda,
        (RmsNorm, Metal) => metal,
        (MoeCombine, Metal) => metal,
        (GateQmvSiluMul, Metal) => metal,
        (QuantizedMatmul, Metal) => metal,
        (Attention, Metal) => metal,
        _ => false,
    }
}

/// How many fallback reasons there are.
const REASONS: usize = 7;

/// Why an op build used MLX's fallback graph instead of the fused Primitive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FallbackReason {
    /// Switched off (environment or API).
    Disabled,
    /// This build has no body of the kernel for the stream's backend.
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
    /// A shape the backend's body does not cover (e.g. more rows than a
    /// GPU body written for decode takes: MLX's matmul serves prefill).
    UnsupportedShape,
}

impl FallbackReason {
    /// Every reason, in the order [`KernelStats`] counts them.
    pub const ALL: [FallbackReason; REASONS] = [
        FallbackReason::Disabled,
        FallbackReason::NoKernelForDevice,
        FallbackReason::UnsupportedDtype,
        FallbackReason::UnsupportedQuantization,
        FallbackReason::UnsupportedMask,
        FallbackReason::PreviouslyFailed,
        FallbackReason::UnsupportedShape,
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
    fallbacks: [u64; REASONS],
    /// Whether the kernel is switched on.
    pub enabled: bool,
    /// Whether the kernel failed earlier in this process.
    pub failed: bool,
    /// GPU bodies: evaluations enqueued.
    pub gpu_enqueues: u64,
    /// GPU bodies: the host time spent enqueuing their kernels (setting up
    /// arguments, adding graph nodes), in ns.
    pub gpu_enqueue_ns: u64,
}

impl KernelStats {
    /// Op builds that fell back for `reason`.
    pub fn fallbacks(&self, reason: FallbackReason) -> u64 {
        self.fallbacks[reason.index()]
    }

    /// Op builds that fell back, for any reason.
    pub fn total_fallbacks(&self) -> u64 {
        self.fallbacks.iter().sum()
    }
}

/// A snapshot of every kernel's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Each kernel with its counters, in [`Kernel::ALL`] order.
    pub kernels: Vec<(Kernel, KernelStats)>,
}

impl Snapshot {
    /// The counters of `kernel` (zeros when absent).
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
    /// The kernel that failed.
    pub kernel: Kernel,
    /// The backend its body failed on.
    pub backend: Backend,
    /// The body's error message.
    pub message: String,
}

struct Slot {
    enabled: AtomicBool,
    failed: AtomicBool,
    force_failure: AtomicBool,
    fused: AtomicU64,
    fallbacks: [AtomicU64; REASONS],
    gpu_enqueues: AtomicU64,
    gpu_enqueue_ns: AtomicU64,
}

struct Registry {
    /// Indexed by kernel, then backend.
    slots: [[Slot; BACKENDS]; KERNELS],
    /// Bumped on every recorded failure, so an eval can tell one happened.
    failure_epoch: AtomicU64,
    last_failure: Mutex<Option<Failure>>,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let env = std::env::var(ENV_VAR).unwrap_or_default();
        let switches = parse_switches(&env);
        let slot = |k: Kernel, b: Backend| Slot {
            enabled: AtomicBool::new(
                switches[k.index()][b.index()]
                    .unwrap_or_else(|| k.default_enabled_on(b, CpuArch::current())),
            ),
            failed: AtomicBool::new(false),
            force_failure: AtomicBool::new(false),
            fused: AtomicU64::new(0),
            fallbacks: Default::default(),
            gpu_enqueues: AtomicU64::new(0),
            gpu_enqueue_ns: AtomicU64::new(0),
        };
        Registry {
            slots: Kernel::ALL.map(|k| Backend::ALL.map(|b| slot(k, b))),
            failure_epoch: AtomicU64::new(0),
            last_failure: Mutex::new(None),
        }
    })
}

/// One kernel's switch per backend (`None`: its default).
type Switches = [[Option<bool>; BACKENDS]; KERNELS];

/// Applies `MLX_BACKEND_KERNELS` syntax; later entries win; unknown names
/// are reported once on stderr and otherwise ignored.
fn parse_switches(spec: &str) -> Switches {
    let mut out = [[None; BACKENDS]; KERNELS];
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (on, rest) = match item.strip_prefix('-') {
            Some(rest) => (false, rest),
            None => (true, item.strip_prefix('+').unwrap_or(item)),
        };
        let (name, backends): (&str, Vec<Backend>) = match rest.split_once('@') {
            None => (rest, Backend::ALL.to_vec()),
            Some((name, b)) => match Backend::from_name(b) {
                Some(b) => (name, vec![b]),
                None => {
                    eprintln!("mlx-backend: {ENV_VAR}: unknown backend '{b}' in '{item}' ignored");
                    continue;
                }
            },
        };
        let kernels: Vec<Kernel> = if name == "all" {
            Kernel::ALL.to_vec()
        } else if let Some(k) = Kernel::from_name(name) {
            vec![k]
        } else {
            eprintln!("mlx-backend: {ENV_VAR}: unknown kernel '{name}' ignored");
            continue;
        };
        for k in kernels {
            for &b in &backends {
                out[k.index()][b.index()] = Some(on);
            }
        }
    }
    out
}

fn slot(kernel: Kernel, backend: Backend) -> &'static Slot {
    &registry().slots[kernel.index()][backend.index()]
}

/// Turns a kernel on or off for later op builds, on every backend.
pub fn set_enabled(kernel: Kernel, enabled: bool) {
    for b in Backend::ALL {
        set_enabled_on(kernel, b, enabled);
    }
}

/// Turns a kernel on or off for later op builds on one backend.
pub fn set_enabled_on(kernel: Kernel, backend: Backend, enabled: bool) {
    slot(kernel, backend)
        .enabled
        .store(enabled, Ordering::SeqCst);
}

/// Whether the kernel is switched on for the current stream's backend.
pub fn is_enabled(kernel: Kernel) -> bool {
    is_enabled_on(kernel, Backend::current())
}

/// Whether the kernel is switched on for `backend`.
pub fn is_enabled_on(kernel: Kernel, backend: Backend) -> bool {
    slot(kernel, backend).enabled.load(Ordering::SeqCst)
}

/// Whether the kernel failed earlier in this process on the current
/// stream's backend.
pub fn has_failed(kernel: Kernel) -> bool {
    has_failed_on(kernel, Backend::current())
}

/// Whether the kernel failed earlier in this process on `backend`.
pub fn has_failed_on(kernel: Kernel, backend: Backend) -> bool {
    slot(kernel, backend).failed.load(Ordering::SeqCst)
}

/// Whether op builds on `backend` would use the kernel's body: it has one
/// there, is switched on, and has not failed. (Each call's own inputs can
/// still make it fall back.)
pub fn is_fused_on(kernel: Kernel, backend: Backend) -> bool {
    has_body(kernel, backend) && is_enabled_on(kernel, backend) && !has_failed_on(kernel, backend)
}

/// The kernel's counters on the current stream's backend.
pub fn stats(kernel: Kernel) -> KernelStats {
    stats_on(kernel, Backend::current())
}

/// The kernel's counters on `backend`.
pub fn stats_on(kernel: Kernel, backend: Backend) -> KernelStats {
    let s = slot(kernel, backend);
    KernelStats {
        fused: s.fused.load(Ordering::SeqCst),
        fallbacks: std::array::from_fn(|i| s.fallbacks[i].load(Ordering::SeqCst)),
        enabled: s.enabled.load(Ordering::SeqCst),
        failed: s.failed.load(Ordering::SeqCst),
        gpu_enqueues: s.gpu_enqueues.load(Ordering::Relaxed),
        gpu_enqueue_ns: s.gpu_enqueue_ns.load(Ordering::Relaxed),
    }
}

/// Every kernel's counters on the current stream's backend.
pub fn snapshot() -> Snapshot {
    snapshot_on(Backend::current())
}

/// Every kernel's counters on `backend`.
pub fn snapshot_on(backend: Backend) -> Snapshot {
    Snapshot {
        kernels: Kernel::ALL.map(|k| (k, stats_on(k, backend))).to_vec(),
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

/// The kernel's next CPU invocation fails as if its body had returned an
/// error ([`super::test_hooks::force_failure`]).
#[cfg(feature = "testing")]
pub(crate) fn force_failure(kernel: Kernel, fail: bool) {
    slot(kernel, Backend::Cpu)
        .force_failure
        .store(fail, Ordering::SeqCst);
}

/// Forgets a recorded failure on every backend, so the kernel is used
/// again ([`super::test_hooks::clear_failure`]).
#[cfg(feature = "testing")]
pub(crate) fn clear_failure(kernel: Kernel) {
    for b in Backend::ALL {
        slot(kernel, b).failed.store(false, Ordering::SeqCst);
    }
}

pub(crate) fn take_forced_failure(kernel: Kernel) -> bool {
    slot(kernel, Backend::Cpu)
        .force_failure
        .swap(false, Ordering::SeqCst)
}

/// Decides fused or fallback for one op build on `backend`. `eligibility`
/// is the kernel's own verdict on the inputs for that backend; the registry
/// adds the table of bodies, the switches and the failure memory. The
/// decision is counted by [`count`] once the op is built, so rejected
/// (invalid) calls count nothing.
pub(crate) fn decide(
    kernel: Kernel,
    backend: Backend,
    eligibility: Result<(), FallbackReason>,
) -> Result<(), FallbackReason> {
    if !has_body(kernel, backend) {
        return Err(FallbackReason::NoKernelForDevice);
    }
    let s = slot(kernel, backend);
    if !s.enabled.load(Ordering::SeqCst) {
        return Err(FallbackReason::Disabled);
    }
    if s.failed.load(Ordering::SeqCst) {
        return Err(FallbackReason::PreviouslyFailed);
    }
    eligibility
}

pub(crate) fn count(kernel: Kernel, backend: Backend, decision: Result<(), FallbackReason>) {
    let s = slot(kernel, backend);
    match decision {
        Ok(()) => s.fused.fetch_add(1, Ordering::SeqCst),
        Err(r) => s.fallbacks[r.index()].fetch_add(1, Ordering::SeqCst),
    };
}

/// Records a failure of the kernel's body on `backend` (a CPU body's on
/// MLX's stream thread, a GPU body's when its evaluation failed); logs the
/// first failure of each (kernel, backend).
pub(crate) fn record_failure(kernel: Kernel, backend: Backend, message: String) {
    let r = registry();
    let first = !r.slots[kernel.index()][backend.index()]
        .failed
        .swap(true, Ordering::SeqCst);
    if first {
        eprintln!(
            "mlx-backend: kernel {kernel} failed on {backend} ({message}); using MLX's fallback there from now on"
        );
    }
    *r.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(Failure {
        kernel,
        backend,
        message,
    });
    r.failure_epoch.fetch_add(1, Ordering::SeqCst);
}

/// The C++ side's report of a failed GPU body; `kernel` is the
/// [`Kernel`]'s position in [`Kernel::ALL`] (as `mlx-kernels-cpp/bridge.h`
/// numbers them).
pub(crate) fn record_gpu_failure(kernel: i32, message: &str) {
    let kernel = usize::try_from(kernel)
        .ok()
        .and_then(|i| Kernel::ALL.get(i).copied());
    match kernel {
        Some(k) => record_failure(k, Backend::gpu(), message.to_string()),
        None => eprintln!("mlx-backend: a GPU body of unknown kernel {kernel:?} failed: {message}"),
    }
}

/// The C++ side's report of one GPU body's enqueue and its host time.
pub(crate) fn record_gpu_enqueue(kernel: i32, nanos: u64) {
    if let Some(&k) = usize::try_from(kernel)
        .ok()
        .and_then(|i| Kernel::ALL.get(i))
    {
        let s = slot(k, Backend::gpu());
        s.gpu_enqueues.fetch_add(1, Ordering::Relaxed);
        s.gpu_enqueue_ns.fetch_add(nanos, Ordering::Relaxed);
    }
}

pub(crate) fn failure_epoch() -> u64 {
    registry().failure_epoch.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The switches of `kernel` on every backend.
    fn of(sw: &Switches, kernel: Kernel) -> [Option<bool>; BACKENDS] {
        sw[kernel.index()]
    }

    #[test]
    fn parses_switches() {
        assert_eq!(parse_switches(""), [[None; BACKENDS]; KERNELS]);
        let sw = parse_switches("rms_norm, -moe_combine");
        assert_eq!(of(&sw, Kernel::RmsNorm), [Some(true); BACKENDS]);
        assert_eq!(of(&sw, Kernel::MoeCombine), [Some(false); BACKENDS]);
        assert_eq!(of(&sw, Kernel::Attention), [None; BACKENDS]);
        let sw = parse_switches("-all,gate_qmv_silu_mul,bogus");
        for k in Kernel::ALL {
            let on = k == Kernel::GateQmvSiluMul;
            assert_eq!(of(&sw, k), [Some(on); BACKENDS], "{k}");
        }
        let sw = parse_switches("-quantized_matmul");
        assert_eq!(of(&sw, Kernel::QuantizedMatmul), [Some(false); BACKENDS]);
        assert_eq!(of(&sw, Kernel::RmsNorm), [None; BACKENDS]);
    }

    #[test]
    fn parses_per_backend_switches() {
        let (cpu, cuda, metal) = (
            Backend::Cpu.index(),
            Backend::Cuda.index(),
            Backend::Metal.index(),
        );
        let sw = parse_switches("-quantized_matmul@cuda,rms_norm@metal");
        let q = of(&sw, Kernel::QuantizedMatmul);
        assert_eq!((q[cpu], q[cuda], q[metal]), (None, Some(false), None));
        let r = of(&sw, Kernel::RmsNorm);
        assert_eq!((r[cpu], r[cuda], r[metal]), (None, None, Some(true)));
        // `all@backend`, then a later entry for one kernel wins.
        let sw = parse_switches("-all@cpu,+attention@cpu,moe_combine@tpu");
        for k in Kernel::ALL {
            let v = of(&sw, k);
            assert_eq!(v[cpu], Some(k == Kernel::Attention), "{k}");
            assert_eq!((v[cuda], v[metal]), (None, None), "{k}");
        }
    }

    #[test]
    fn cpu_bodies_default_off_except_on_x86_64() {
        for k in Kernel::ALL {
            assert!(k.default_enabled_on(Backend::Cpu, CpuArch::X86_64), "{k}");
            assert!(!k.default_enabled_on(Backend::Cpu, CpuArch::Aarch64), "{k}");
            assert!(!k.default_enabled_on(Backend::Cpu, CpuArch::Other), "{k}");
            for arch in [CpuArch::X86_64, CpuArch::Aarch64, CpuArch::Other] {
                for gpu in [Backend::Cuda, Backend::Metal] {
                    assert_eq!(k.default_enabled_on(gpu, arch), k.default_enabled(), "{k}");
                }
            }
        }
    }

    #[test]
    fn current_arch_matches_the_target() {
        let want = if cfg!(target_arch = "x86_64") {
            CpuArch::X86_64
        } else if cfg!(target_arch = "aarch64") {
            CpuArch::Aarch64
        } else {
            CpuArch::Other
        };
        assert_eq!(CpuArch::current(), want);
    }

    #[test]
    fn metal_bodies_only_on_macos_with_the_feature() {
        let metal = cfg!(all(feature = "metal", target_os = "macos"));
        for k in Kernel::ALL {
            let want = metal && k != Kernel::DecoderLayer;
            assert_eq!(has_body(k, Backend::Metal), want, "{k}");
        }
    }

    #[test]
    fn every_kernel_has_a_cpu_body_and_no_metal_body_off_macos() {
        for k in Kernel::ALL {
            assert!(has_body(k, Backend::Cpu), "{k}");
            if !cfg!(target_os = "macos") {
                assert!(!has_body(k, Backend::Metal), "{k}");
            }
            if !cfg!(feature = "cuda") {
                assert!(!has_body(k, Backend::Cuda), "{k}");
            }
        }
    }
}
