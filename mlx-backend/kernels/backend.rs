//! The backends a kernel body can run on.
//!
//! Each Primitive keeps its faces in one folder per kernel: the Rust
//! contract and CPU body under `mlx-backend/kernels/<op>/`, the C++
//! Primitive and the CUDA and Metal bodies under `mlx-kernels-cpp/<op>/`.
//! Adding a backend's body to a kernel is that body's file plus one arm in
//! [`has_body`](super::has_body) (the registry's table of bodies); the
//! registry then keeps its switch, counters and failure memory apart from
//! the other backends'.

use crate::device::{current_spec, Device};
use std::fmt;

/// Where a kernel body runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// MLX's CPU stream; bodies in Rust, called from C++.
    Cpu,
    /// A GPU stream of MLX's CUDA build; bodies in CUDA C++.
    Cuda,
    /// A GPU stream on Apple silicon; bodies in Metal.
    Metal,
}

/// How many backends there are.
pub(crate) const BACKENDS: usize = 3;

impl Backend {
    /// Every backend, in the order the registry indexes them.
    pub const ALL: [Backend; BACKENDS] = [Backend::Cpu, Backend::Cuda, Backend::Metal];

    /// The name used in `MLX_BACKEND_KERNELS` (`rms_norm@cuda`), logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::Metal => "metal",
        }
    }

    /// The backend of a name as [`Backend::name`] spells it.
    pub fn from_name(name: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == name)
    }

    /// This build's GPU backend: MLX's GPU is Metal on macOS and CUDA
    /// elsewhere (a CPU-only MLX build has no GPU stream at all).
    pub fn gpu() -> Backend {
        if cfg!(target_os = "macos") {
            Backend::Metal
        } else {
            Backend::Cuda
        }
    }

    /// The backend of the stream ops are being built on now.
    pub fn current() -> Backend {
        Backend::of(Device::from_spec(current_spec().device))
    }

    /// The backend whose bodies run on a stream of `device`.
    pub fn of(device: Device) -> Backend {
        match device {
            Device::Cpu => Backend::Cpu,
            Device::Gpu(_) => Backend::gpu(),
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
