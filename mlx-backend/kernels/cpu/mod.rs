//! The CPU kernel bodies' shared parts, by role:
//!
//! | module | role |
//! |---|---|
//! | [`isa`] | which instruction sets run here, and the switches that turn a body off |
//! | [`simd`] | element types (f32, f16, bf16) and the SIMD primitives on slices |
//! | [`layout`] | MLX's packed affine-quantized weights: geometry, row views, output strides |
//! | [`prepare`] | x prepared once per call ([`prepare::PreparedX`]) for the body that will run |
//! | [`unpack`] | vector helpers the quantized bodies share (fields, group parameters, dot instructions) |
//! | [`dispatch`] | the one choice of quantized dot-product body, by how x was prepared |
//! | [`blocked`] | the register-blocked dot products, AVX-512 and AVX2 |
//! | [`row_lanes`] | int16 x with one scale per group, weight rows across the lanes |
//! | [`amx`] | the AMX tile body for many x rows |
//! | [`rowwise`] | the row-at-a-time bodies (AVX2 or scalar) and dequantization |
//! | [`int8`] | int8 x per block of 32 (`ActivationPrecision::Int8`) |
//! | [`vector_math`] | softmax, SwiGLU and attention-row helpers |
//! | [`team`] | the CPU team that runs a kernel's units in parallel |
//! | [`error`] | argument errors |
//!
//! Dependencies run down the list's roles: `dispatch` above the bodies,
//! the bodies above `prepare`, `layout`, `unpack` and `isa`; nothing below
//! reaches up (`scripts/check-import-cycles.py` checks it). Below are the
//! byte-slice plumbing the `extern "Rust"` entry points use to reach the
//! typed kernels, and the chunked runner over the team.

pub(crate) mod amx;
pub(crate) mod blocked;
pub(crate) mod dispatch;
pub(crate) mod error;
pub(crate) mod int8;
pub(crate) mod isa;
pub(crate) mod layout;
pub(crate) mod prepare;
pub(crate) mod row_lanes;
pub(crate) mod rowwise;
pub(crate) mod simd;
pub(crate) mod team;
#[cfg(test)]
pub(crate) mod test_util;
pub(crate) mod unpack;
pub(crate) mod vector_math;

pub(crate) use error::KernelError;

/// How a quantized CPU kernel computes with x: the `ActivationPrecision`
/// code the C++ Primitive passes, resolved for this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum XPrecision {
    /// f32 x, FMA.
    Exact,
    /// int16 x per word of W where AVX-512 VNNI or AVX2 runs (exact elsewhere).
    Int16,
    /// int8 x per block of 32 on the given tier.
    Int8(int8::Int8Tier),
}

impl XPrecision {
    pub(crate) fn from_code(code: i32) -> Result<Self, KernelError> {
        use crate::kernels::ActivationPrecision as A;
        match A::from_code(code) {
            Some(A::Exact) => Ok(XPrecision::Exact),
            Some(A::Int16) => Ok(XPrecision::Int16),
            Some(A::Int8) => Ok(XPrecision::Int8(int8::Int8Tier::best())),
            None => Err(KernelError::Unsupported(format!(
                "activation precision code {code}"
            ))),
        }
    }

    pub(crate) fn int8(self) -> Option<int8::Int8Tier> {
        match self {
            XPrecision::Int8(tier) => Some(tier),
            _ => None,
        }
    }

    pub(crate) fn int16(self) -> bool {
        self == XPrecision::Int16
    }
}

use crate::dtype::Dtype;
use crate::kernels::registry::{self, Backend, Kernel};

/// Reinterprets MLX's bytes as `T`; MLX buffers hold whole, aligned elements.
pub(crate) fn typed<T>(bytes: &[u8]) -> Result<&[T], KernelError> {
    let (size, align) = (std::mem::size_of::<T>(), std::mem::align_of::<T>());
    if !bytes.len().is_multiple_of(size) || !(bytes.as_ptr() as usize).is_multiple_of(align) {
        return Err(KernelError::Shape(format!(
            "buffer of {} bytes is not an aligned array of {size}-byte elements",
            bytes.len()
        )));
    }
    // SAFETY: length and alignment were checked; every element type used here
    // (f32, f16, bf16, u32) is valid for any bit pattern.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len() / size) })
}

/// Mutable form of [`typed`].
pub(crate) fn typed_mut<T>(bytes: &mut [u8]) -> Result<&mut [T], KernelError> {
    let (size, align) = (std::mem::size_of::<T>(), std::mem::align_of::<T>());
    if !bytes.len().is_multiple_of(size) || !(bytes.as_ptr() as usize).is_multiple_of(align) {
        return Err(KernelError::Shape(format!(
            "output of {} bytes is not an aligned array of {size}-byte elements",
            bytes.len()
        )));
    }
    // SAFETY: as in `typed`; the borrow is exclusive.
    Ok(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len() / size) })
}

/// The float element types the kernels are instantiated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloatKind {
    F32,
    F16,
    BF16,
}

impl FloatKind {
    pub(crate) fn from_code(code: i32) -> Result<FloatKind, KernelError> {
        match Dtype::from_code(code) {
            Some(Dtype::F32) => Ok(FloatKind::F32),
            Some(Dtype::F16) => Ok(FloatKind::F16),
            Some(Dtype::BF16) => Ok(FloatKind::BF16),
            other => Err(KernelError::Unsupported(format!("dtype {other:?}"))),
        }
    }
}

/// Evaluates `body` with `T` bound to the element type of `kind`.
macro_rules! with_float {
    ($kind:expr, $T:ident => $body:expr) => {
        match $kind {
            $crate::kernels::cpu::FloatKind::F32 => {
                type $T = f32;
                $body
            }
            $crate::kernels::cpu::FloatKind::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::kernels::cpu::FloatKind::BF16 => {
                type $T = half::bf16;
                $body
            }
        }
    };
}
pub(crate) use with_float;

/// Runs `body(c, chunk, scratch)` over `dst` in chunks of `chunk_len`
/// (chunk `c` starts at element `c * chunk_len`): over the CPU team
/// ([`team::for_units`], a chunk per unit), each member with its own
/// `init()` scratch, when `parallel`; in order otherwise.
pub(crate) fn for_chunks<T: Send, B>(
    dst: &mut [T],
    chunk_len: usize,
    parallel: bool,
    init: impl Fn() -> B + Sync + Send,
    body: impl Fn(usize, &mut [T], &mut B) + Sync + Send,
) {
    let done = try_for_chunks(dst, chunk_len, parallel, init, |c, chunk, buf| {
        body(c, chunk, buf);
        Ok(())
    });
    if let Err(e) = done {
        // Only a member's panic gets here: panic as a pool would (run_entry
        // catches it).
        panic!("{e}");
    }
}

/// [`for_chunks`] for bodies that can fail: the first error is returned.
pub(crate) fn try_for_chunks<T: Send, B>(
    dst: &mut [T],
    chunk_len: usize,
    parallel: bool,
    init: impl Fn() -> B + Sync + Send,
    body: impl Fn(usize, &mut [T], &mut B) -> Result<(), KernelError> + Sync + Send,
) -> Result<(), KernelError> {
    let chunk_len = chunk_len.max(1);
    if parallel && !team::in_team() {
        // The CPU team's members take the chunks as units (their own run
        // first, then what is left of the others'): its helpers spin
        // between jobs, where a pool wakes sleeping workers, and a pool's
        // threads would share the cores with those helpers.
        let (len, count) = (dst.len(), dst.len().div_ceil(chunk_len));
        let shared = team::SharedSlice::new(dst);
        team::for_units(count, init, |c, buf| {
            let start = c * chunk_len;
            // SAFETY: chunk c is this unit's alone.
            let chunk = unsafe { shared.part(start, chunk_len.min(len - start)) };
            body(c, chunk, buf)
        })
    } else {
        let mut buf = init();
        for (c, chunk) in dst.chunks_mut(chunk_len).enumerate() {
            body(c, chunk, &mut buf)?;
        }
        Ok(())
    }
}

/// Runs one kernel invocation for C++: a panic or an error never crosses the
/// FFI boundary; it is recorded in the registry and reported as `false`.
pub(crate) fn run_entry(kernel: Kernel, body: impl FnOnce() -> Result<(), KernelError>) -> bool {
    if registry::take_forced_failure(kernel) {
        registry::record_failure(kernel, Backend::Cpu, "forced failure (test hook)".into());
        return false;
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            registry::record_failure(kernel, Backend::Cpu, e.to_string());
            false
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            registry::record_failure(kernel, Backend::Cpu, format!("panicked: {msg}"));
            false
        }
    }
}
