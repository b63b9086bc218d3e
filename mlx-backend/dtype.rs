//! Element types: MLX's dtypes and the Rust types that hold them on the host.

use half::{bf16, f16};
use std::fmt;

/// An MLX dtype. The discriminants are MLX's `Dtype::Val` codes, which is how
/// the bridge passes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Dtype {
    /// Boolean.
    Bool = 0,
    /// Unsigned 8-bit integer.
    U8 = 1,
    /// Unsigned 16-bit integer.
    U16 = 2,
    /// Unsigned 32-bit integer.
    U32 = 3,
    /// Unsigned 64-bit integer.
    U64 = 4,
    /// Signed 8-bit integer.
    I8 = 5,
    /// Signed 16-bit integer.
    I16 = 6,
    /// Signed 32-bit integer.
    I32 = 7,
    /// Signed 64-bit integer.
    I64 = 8,
    /// IEEE half precision.
    F16 = 9,
    /// IEEE single precision.
    F32 = 10,
    /// IEEE double precision (CPU only in MLX).
    F64 = 11,
    /// bfloat16.
    BF16 = 12,
    /// Complex of two f32.
    Complex64 = 13,
}

impl Dtype {
    pub(crate) fn from_code(code: i32) -> Option<Dtype> {
        use Dtype::*;
        Some(match code {
            0 => Bool,
            1 => U8,
            2 => U16,
            3 => U32,
            4 => U64,
            5 => I8,
            6 => I16,
            7 => I32,
            8 => I64,
            9 => F16,
            10 => F32,
            11 => F64,
            12 => BF16,
            13 => Complex64,
            _ => return None,
        })
    }

    pub(crate) fn code(self) -> i32 {
        self as i32
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        use Dtype::*;
        match self {
            Bool | U8 | I8 => 1,
            U16 | I16 | F16 | BF16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | Complex64 => 8,
        }
    }

    /// Floating point (f16, bf16, f32, f64).
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Dtype::*;
        let name = match self {
            Bool => "bool",
            U8 => "uint8",
            U16 => "uint16",
            U32 => "uint32",
            U64 => "uint64",
            I8 => "int8",
            I16 => "int16",
            I32 => "int32",
            I64 => "int64",
            F16 => "float16",
            F32 => "float32",
            F64 => "float64",
            BF16 => "bfloat16",
            Complex64 => "complex64",
        };
        f.write_str(name)
    }
}

/// A Rust type that holds one element of an MLX dtype, bit for bit.
///
/// # Safety
/// `Self` must have the size and in-memory layout of `DTYPE`'s element, and
/// every bit pattern MLX can produce for that dtype must be a valid `Self`.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The dtype of arrays of this element type.
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(unsafe impl Element for $t { const DTYPE: Dtype = Dtype::$d; })*
    };
}

element! {
    bool => Bool, u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    f16 => F16, bf16 => BF16, f32 => F32, f64 => F64,
}
