//! Elementwise arithmetic, comparisons (with broadcasting) and activations.

use super::{stream, wrap};
use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::OpError;
use crate::ffi;

/// Bridge codes of `unary` in bridge.cpp.
#[derive(Clone, Copy)]
#[repr(i32)]
enum Unary {
    Abs = 0,
    Neg = 1,
    Exp = 2,
    Log = 3,
    Sqrt = 4,
    Rsqrt = 5,
    Sin = 6,
    Cos = 7,
    Tanh = 8,
    Sigmoid = 9,
    Square = 10,
    Floor = 11,
    Ceil = 12,
    Erf = 13,
    LogicalNot = 14,
    Reciprocal = 15,
    Log1p = 16,
    Sign = 17,
    Silu = 18,
    Gelu = 19,
    StopGradient = 20,
    Round = 21,
}

/// Bridge codes of `binary` in bridge.cpp.
#[derive(Clone, Copy)]
#[repr(i32)]
enum Binary {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
    Pow = 4,
    Maximum = 5,
    Minimum = 6,
    Eq = 7,
    Ne = 8,
    Lt = 9,
    Le = 10,
    Gt = 11,
    Ge = 12,
    LogicalAnd = 13,
    LogicalOr = 14,
    Remainder = 15,
    FloorDivide = 16,
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $code:ident),* $(,)?) => {
        impl Array {
            $($(#[$doc])* pub fn $name(&self) -> Result<Array, OpError> {
                wrap(stringify!($name), ffi::unary(Unary::$code as i32, self.inner(), stream()))
            })*
        }
    };
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $code:ident),* $(,)?) => {
        impl Array {
            $($(#[$doc])* pub fn $name(&self, other: &Array) -> Result<Array, OpError> {
                wrap(
                    stringify!($name),
                    ffi::binary(Binary::$code as i32, self.inner(), other.inner(), stream()),
                )
            })*
        }
    };
}

unary_methods! {
    abs => Abs, neg => Neg, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt,
    sin => Sin, cos => Cos, tanh => Tanh, sigmoid => Sigmoid, square => Square,
    floor => Floor, ceil => Ceil, erf => Erf, logical_not => LogicalNot,
    reciprocal => Reciprocal, log1p => Log1p, sign => Sign,
    /// `x * sigmoid(x)`, as `mlx.nn.silu`.
    silu => Silu,
    /// `x * (1 + erf(x / sqrt(2))) / 2`, as `mlx.nn.gelu`.
    gelu => Gelu,
    /// The same values, with no gradient flowing back.
    stop_gradient => StopGradient,
    /// Round half to even.
    round => Round,
}

binary_methods! {
    add => Add, sub => Sub, mul => Mul, div => Div, pow => Pow,
    maximum => Maximum, minimum => Minimum,
    eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge,
    logical_and => LogicalAnd, logical_or => LogicalOr,
    remainder => Remainder, floor_divide => FloorDivide,
}

impl Array {
    /// Convert to `dtype`.
    pub fn astype(&self, dtype: Dtype) -> Result<Array, OpError> {
        wrap("astype", ffi::astype(self.inner(), dtype.code(), stream()))
    }

    /// A row-major dense copy (a no-op graph node when already dense).
    pub fn contiguous(&self) -> Result<Array, OpError> {
        wrap("contiguous", ffi::contiguous(self.inner(), stream()))
    }

    /// Clamp into `[lo, hi]`.
    pub fn clip(&self, lo: f64, hi: f64) -> Result<Array, OpError> {
        wrap("clip", ffi::clip(self.inner(), lo, hi, stream()))
    }

    /// `self + value`, with `value` in this array's dtype.
    pub fn add_scalar(&self, value: f64) -> Result<Array, OpError> {
        self.add(&self.scalar_like(value)?)
    }

    /// `self * value`, with `value` in this array's dtype.
    pub fn mul_scalar(&self, value: f64) -> Result<Array, OpError> {
        self.mul(&self.scalar_like(value)?)
    }

    /// A 0-d array holding `value` in this array's dtype.
    pub fn scalar_like(&self, value: f64) -> Result<Array, OpError> {
        Array::full(&[], value, self.dtype())
    }
}
