//! [`Array`]: an owned handle to an `mlx::core::array`, a node of MLX's lazy
//! graph. Ops build new nodes; nothing is computed until [`Array::eval`] (or a
//! host read, which evaluates first).
//!
//! Arrays are not `Send`: MLX streams belong to the thread that made them.
//!
//! ```compile_fail
//! fn needs_send<T: Send>(_: T) {}
//! needs_send(mlx_backend::Array::from_f32(1.0));
//! ```

use crate::device::current_spec;
use crate::dtype::{Dtype, Element};
use crate::error::{EvalError, HostDataError, OpError};
use crate::ffi;
use crate::kernels::registry;
use cxx::UniquePtr;
use std::fmt;

/// An owned node of MLX's lazy array graph.
///
/// Ops build new nodes and do no work; [`Array::eval`] (or reading the
/// data) computes them. Not `Send`: see [`Stream`](crate::Stream).
pub struct Array {
    pub(crate) raw: UniquePtr<ffi::array>,
}

impl Array {
    pub(crate) fn from_raw(raw: UniquePtr<ffi::array>) -> Array {
        Array { raw }
    }

    pub(crate) fn inner(&self) -> &ffi::array {
        // A live Array always holds an array; UniquePtr is only null if moved out.
        self.raw.as_ref().expect("Array holds an mlx array")
    }

    pub(crate) fn ptr(this: Option<&Array>) -> *const ffi::array {
        this.map_or(std::ptr::null(), |a| a.inner() as *const ffi::array)
    }

    /// An array holding a copy of `data`, shaped `shape` (row-major).
    pub fn from_slice<T: Element>(data: &[T], shape: &[i32]) -> Result<Array, HostDataError> {
        let expected = shape_len(shape)?;
        if data.len() != expected {
            return Err(HostDataError::LengthMismatch {
                len: data.len(),
                shape: shape.to_vec(),
                expected,
            });
        }
        // SAFETY: Element types are plain bytes of their dtype's size.
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data))
        };
        ffi::from_bytes(bytes, shape, T::DTYPE.code())
            .map(Array::from_raw)
            .map_err(|e| HostDataError::Mlx(e.what().into()))
    }

    /// A 0-d array.
    pub fn scalar<T: Element>(value: T) -> Array {
        Array::from_slice(&[value], &[]).expect("a scalar always matches the empty shape")
    }

    /// A 0-d float32 array.
    pub fn from_f32(value: f32) -> Array {
        Array::scalar(value)
    }

    /// An array of `shape` filled with `value`, cast to `dtype`.
    pub fn full(shape: &[i32], value: f64, dtype: Dtype) -> Result<Array, OpError> {
        ffi::full(shape, value, dtype.code(), current_spec())
            .map(Array::from_raw)
            .map_err(OpError::from_cxx("full"))
    }

    /// An array of zeros.
    pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array, OpError> {
        Array::full(shape, 0.0, dtype)
    }

    /// An array of ones.
    pub fn ones(shape: &[i32], dtype: Dtype) -> Result<Array, OpError> {
        Array::full(shape, 1.0, dtype)
    }

    /// `[start, stop)` in steps of `step`.
    pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array, OpError> {
        ffi::arange(start, stop, step, dtype.code(), current_spec())
            .map(Array::from_raw)
            .map_err(OpError::from_cxx("arange"))
    }

    /// The dimensions.
    pub fn shape(&self) -> Vec<i32> {
        ffi::array_shape(self.inner())
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// The size of axis `axis` (negative counts from the end).
    pub fn dim(&self, axis: i32) -> Result<i32, OpError> {
        let shape = self.shape();
        let n = shape.len() as i32;
        let a = if axis < 0 { axis + n } else { axis };
        if a < 0 || a >= n {
            return Err(OpError::new(
                "dim",
                format!("axis {axis} is out of bounds for an array of rank {n}"),
            ));
        }
        Ok(shape[a as usize])
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        let code = ffi::array_dtype(self.inner());
        Dtype::from_code(code).unwrap_or(Dtype::Complex64)
    }

    /// Number of elements.
    pub fn size(&self) -> usize {
        ffi::array_size(self.inner())
    }

    /// Bytes of the data (elements × element size).
    pub fn nbytes(&self) -> usize {
        ffi::array_nbytes(self.inner())
    }

    /// Whether an `eval` would compute this array: it comes from an op and
    /// has not been scheduled for evaluation yet.
    pub fn is_pending(&self) -> bool {
        ffi::array_is_pending(self.inner())
    }

    /// Compute this array (and what it depends on) now.
    pub fn eval(&self) -> Result<(), EvalError> {
        checked_eval(|| ffi::eval(self.inner()))
    }

    /// Evaluate and copy out as a dense row-major `Vec<T>`; `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, HostDataError> {
        self.require_dtype::<T>()?;
        self.eval()?;
        let n = self.size();
        let mut out: Vec<T> = Vec::with_capacity(n);
        // SAFETY: the buffer has room for n elements; copy_to_host fills all
        // n * size_of::<T>() bytes or fails, and Element guarantees any bit
        // pattern MLX writes is a valid T.
        unsafe {
            let bytes =
                std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, n * T::DTYPE.size());
            ffi::copy_to_host(self.inner(), bytes).map_err(|e| EvalError {
                message: e.what().into(),
            })?;
            out.set_len(n);
        }
        Ok(out)
    }

    /// Evaluates and lends the data as `&[T]` without a copy when MLX
    /// holds it dense and row-major (`Ok(None)` for a view, e.g. a
    /// transpose or a broadcast: use [`Array::to_vec`]); `T` must match the
    /// dtype. The slice is MLX's buffer: while it is borrowed, evaluate no
    /// node that writes this array's buffer in place (a `DecoderStack`
    /// writing its caches in place, given this array as a cache).
    pub fn host_slice<T: Element>(&self) -> Result<Option<&[T]>, HostDataError> {
        self.require_dtype::<T>()?;
        self.eval()?;
        let n = self.size();
        if n == 0 {
            return Ok(Some(&[]));
        }
        let addr = ffi::array_host_data(self.inner()).map_err(|e| EvalError {
            message: e.what().into(),
        })?;
        if addr == 0 || !addr.is_multiple_of(std::mem::align_of::<T>()) {
            return Ok(None);
        }
        // SAFETY: MLX's evaluated, finished buffer holds n dense elements of
        // T's dtype and lives as long as this array; Element guarantees any
        // bit pattern is a valid T; nothing writes it while `self` is
        // borrowed (see above).
        Ok(Some(unsafe {
            std::slice::from_raw_parts(addr as *const T, n)
        }))
    }

    /// `T` must be this array's element type to read it back.
    fn require_dtype<T: Element>(&self) -> Result<(), HostDataError> {
        let dtype = self.dtype();
        if dtype != T::DTYPE {
            return Err(HostDataError::DtypeMismatch {
                actual: dtype,
                requested: T::DTYPE,
            });
        }
        Ok(())
    }

    /// Cast to f32 and copy out (convenient for tests and logits).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>, crate::error::Error> {
        Ok(self.astype(Dtype::F32)?.to_vec::<f32>()?)
    }

    /// Evaluate and copy out as f64, widening each element on the host.
    /// Works whatever the stream's device is (MLX has no float64 on a GPU,
    /// so `astype(F64)` would fail there). Integers wider than 53 bits
    /// round; complex values are an error.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>, HostDataError> {
        fn widen<T: Element>(a: &Array, f: impl Fn(T) -> f64) -> Result<Vec<f64>, HostDataError> {
            Ok(a.to_vec::<T>()?.into_iter().map(f).collect())
        }
        match self.dtype() {
            Dtype::Bool => widen(self, |v: bool| f64::from(u8::from(v))),
            Dtype::U8 => widen::<u8>(self, f64::from),
            Dtype::U16 => widen::<u16>(self, f64::from),
            Dtype::U32 => widen::<u32>(self, f64::from),
            Dtype::U64 => widen(self, |v: u64| v as f64),
            Dtype::I8 => widen::<i8>(self, f64::from),
            Dtype::I16 => widen::<i16>(self, f64::from),
            Dtype::I32 => widen::<i32>(self, f64::from),
            Dtype::I64 => widen(self, |v: i64| v as f64),
            Dtype::F16 => widen::<crate::f16>(self, f64::from),
            Dtype::BF16 => widen::<crate::bf16>(self, f64::from),
            Dtype::F32 => widen::<f32>(self, f64::from),
            Dtype::F64 => self.to_vec::<f64>(),
            Dtype::Complex64 => Err(HostDataError::DtypeMismatch {
                actual: Dtype::Complex64,
                requested: Dtype::F64,
            }),
        }
    }

    /// The single element of a one-element array.
    pub fn item<T: Element>(&self) -> Result<T, HostDataError> {
        if self.size() != 1 {
            return Err(HostDataError::NotScalar {
                shape: self.shape(),
            });
        }
        Ok(self.to_vec::<T>()?[0])
    }
}

impl Clone for Array {
    /// A new handle to the same graph node (no data is copied).
    fn clone(&self) -> Array {
        Array::from_raw(ffi::array_clone(self.inner()))
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array(shape={:?}, dtype={})", self.shape(), self.dtype())
    }
}

fn shape_len(shape: &[i32]) -> Result<usize, HostDataError> {
    shape.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d)
            .ok()
            .and_then(|d| acc.checked_mul(d))
            .ok_or_else(|| HostDataError::Mlx(format!("invalid shape {shape:?}")))
    })
}

/// Evaluate several arrays together (one graph walk, shared work done once).
pub fn eval(arrays: &[&Array]) -> Result<(), EvalError> {
    checked_eval(|| ffi::eval_list(&list(arrays)))
}

/// Runs an evaluation and turns a custom kernel failure during it into an
/// error: the kernel left NaN in its output and recorded why in the
/// registry, whose failure epoch moved. (A failure on another thread's
/// concurrent evaluation is attributed here too; kernels failing is rare
/// and each kernel fails at most once per process.)
fn checked_eval(run: impl FnOnce() -> Result<(), cxx::Exception>) -> Result<(), EvalError> {
    let before = registry::failure_epoch();
    run().map_err(EvalError::from)?;
    if registry::failure_epoch() != before {
        let message = match registry::last_failure() {
            Some(f) => format!(
                "kernel {} failed on {}: {}; its outputs are invalid, later builds there use the fallback",
                f.kernel, f.backend, f.message
            ),
            None => "a custom kernel failed".to_string(),
        };
        return Err(EvalError { message });
    }
    Ok(())
}

/// Start evaluating several arrays without waiting; a later eval or host read waits.
pub fn async_eval(arrays: &[&Array]) -> Result<(), EvalError> {
    ffi::async_eval_list(&list(arrays)).map_err(EvalError::from)
}

pub(crate) fn list(arrays: &[&Array]) -> UniquePtr<ffi::ArrayList> {
    let mut l = ffi::new_array_list();
    for a in arrays {
        ffi::array_list_push(l.pin_mut(), a.inner());
    }
    l
}

pub(crate) fn unlist(l: &ffi::ArrayList) -> Vec<Array> {
    (0..ffi::array_list_len(l))
        .map(|i| Array::from_raw(ffi::array_list_get(l, i).expect("index is in range")))
        .collect()
}
