//! Reductions, scans, sorting and softmax. An empty `axes` means all axes.

use super::{stream, wrap};
use crate::array::Array;
use crate::error::OpError;
use crate::ffi;

#[derive(Clone, Copy)]
#[repr(i32)]
enum Reduce {
    Sum = 0,
    Mean = 1,
    Max = 2,
    Min = 3,
    Prod = 4,
    LogSumExp = 5,
    All = 6,
    Any = 7,
}

macro_rules! reduce_methods {
    ($($(#[$doc:meta])* $name:ident => $code:ident),* $(,)?) => {
        impl Array {
            $($(#[$doc])*
            ///
            /// Reduces over `axes` (every axis when empty; negative ones count
            /// from the end); `keepdims` keeps them as axes of size 1.
            pub fn $name(&self, axes: &[i32], keepdims: bool) -> Result<Array, OpError> {
                wrap(
                    stringify!($name),
                    ffi::reduce(Reduce::$code as i32, self.inner(), axes, keepdims, stream()),
                )
            })*
        }
    };
}

reduce_methods! {
    /// The sum.
    sum => Sum,
    /// The arithmetic mean.
    mean => Mean,
    /// The largest element.
    max => Max,
    /// The smallest element.
    min => Min,
    /// The product.
    prod => Prod,
    /// `log(sum(exp(x)))`, computed stably.
    logsumexp => LogSumExp,
    /// Whether every element is true (nonzero).
    all => All,
    /// Whether any element is true (nonzero).
    any => Any,
}

impl Array {
    /// Index of the largest element along `axis` (uint32).
    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array, OpError> {
        wrap(
            "argmax",
            ffi::arg_reduce(0, self.inner(), axis, keepdims, stream()),
        )
    }

    /// Index of the smallest element along `axis` (uint32).
    pub fn argmin(&self, axis: i32, keepdims: bool) -> Result<Array, OpError> {
        wrap(
            "argmin",
            ffi::arg_reduce(1, self.inner(), axis, keepdims, stream()),
        )
    }

    /// Indices that partition along `axis` so the `kth` element is in its sorted place.
    pub fn argpartition(&self, kth: i32, axis: i32) -> Result<Array, OpError> {
        wrap(
            "argpartition",
            ffi::argpartition(self.inner(), kth, axis, stream()),
        )
    }

    /// The `k` largest values along `axis` (unordered, as MLX returns them).
    pub fn topk(&self, k: i32, axis: i32) -> Result<Array, OpError> {
        wrap("topk", ffi::topk(self.inner(), k, axis, stream()))
    }

    /// Sorted ascending along `axis`.
    pub fn sort(&self, axis: i32) -> Result<Array, OpError> {
        wrap("sort", ffi::sort(self.inner(), axis, false, stream()))
    }

    /// Indices that sort along `axis` ascending (uint32).
    pub fn argsort(&self, axis: i32) -> Result<Array, OpError> {
        wrap("argsort", ffi::sort(self.inner(), axis, true, stream()))
    }

    /// Running sum along `axis`; `reverse` sums from the end, `inclusive`
    /// counts each element in its own sum.
    pub fn cumsum(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array, OpError> {
        wrap(
            "cumsum",
            ffi::cumsum(self.inner(), axis, reverse, inclusive, stream()),
        )
    }

    /// Softmax over `axes`; `precise` accumulates low-precision inputs in f32.
    pub fn softmax(&self, axes: &[i32], precise: bool) -> Result<Array, OpError> {
        wrap(
            "softmax",
            ffi::softmax(self.inner(), axes, precise, stream()),
        )
    }
}
