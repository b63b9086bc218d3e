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
    /// `|x|`.
    abs => Abs,
    /// `-x`.
    neg => Neg,
    /// `e^x`.
    exp => Exp,
    /// The natural logarithm.
    log => Log,
    /// The square root.
    sqrt => Sqrt,
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt,
    /// The sine (radians).
    sin => Sin,
    /// The cosine (radians).
    cos => Cos,
    /// The hyperbolic tangent.
    tanh => Tanh,
    /// `1 / (1 + e^-x)`.
    sigmoid => Sigmoid,
    /// `x * x`.
    square => Square,
    /// Round down to an integer value.
    floor => Floor,
    /// Round up to an integer value.
    ceil => Ceil,
    /// The Gauss error function.
    erf => Erf,
    /// Boolean not.
    logical_not => LogicalNot,
    /// `1 / x`.
    reciprocal => Reciprocal,
    /// `ln(1 + x)`, accurate near 0.
    log1p => Log1p,
    /// -1, 0 or 1 by the sign of x.
    sign => Sign,
    /// `x * sigmoid(x)`, as `mlx.nn.silu`.
    silu => Silu,
    /// `x * (1 + erf(x / sqrt(2))) / 2`, as `mlx.nn.gelu`.
    gelu => Gelu,
    /// The same values, with no gradient flowing back.
    stop_gradient => StopGradient,
    /// Round half to even.
    round => Round,
}

// Binary ops broadcast their operands and promote their dtypes as MLX does.
binary_methods! {
    /// `self + other`.
    add => Add,
    /// `self - other`.
    sub => Sub,
    /// `self * other`.
    mul => Mul,
    /// `self / other` (true division).
    div => Div,
    /// `self` to the power `other`.
    pow => Pow,
    /// The larger of the two, elementwise.
    maximum => Maximum,
    /// The smaller of the two, elementwise.
    minimum => Minimum,
    /// `self == other` (bool).
    eq => Eq,
    /// `self != other` (bool).
    ne => Ne,
    /// `self < other` (bool).
    lt => Lt,
    /// `self <= other` (bool).
    le => Le,
    /// `self > other` (bool).
    gt => Gt,
    /// `self >= other` (bool).
    ge => Ge,
    /// Boolean and.
    logical_and => LogicalAnd,
    /// Boolean or.
    logical_or => LogicalOr,
    /// The remainder of `self / other`, with the sign of `other` (as Python's `%`).
    remainder => Remainder,
    /// `floor(self / other)`.
    floor_divide => FloorDivide,
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
