//! Dense matrix products.

use super::{stream, wrap};
use crate::array::Array;
use crate::error::OpError;
use crate::ffi;

impl Array {
    /// Matrix product with batch broadcasting, as `a @ b`.
    pub fn matmul(&self, other: &Array) -> Result<Array, OpError> {
        wrap("matmul", ffi::matmul(self.inner(), other.inner(), stream()))
    }

    /// `c + a @ b` in one op (as `mx.addmm`, what `nn.Linear` with a bias
    /// runs): the sum is rounded once, which matters in bf16.
    pub fn addmm(c: &Array, a: &Array, b: &Array) -> Result<Array, OpError> {
        wrap(
            "addmm",
            ffi::addmm(c.inner(), a.inner(), b.inner(), stream()),
        )
    }

    /// `a @ b[rhs_indices]` / `a[lhs_indices] @ b` with matrix-level gathers.
    pub fn gather_mm(
        &self,
        other: &Array,
        lhs_indices: Option<&Array>,
        rhs_indices: Option<&Array>,
        sorted_indices: bool,
    ) -> Result<Array, OpError> {
        // SAFETY: the pointers are null or borrow arrays that outlive the call.
        wrap("gather_mm", unsafe {
            ffi::gather_mm(
                self.inner(),
                other.inner(),
                Array::ptr(lhs_indices),
                Array::ptr(rhs_indices),
                sorted_indices,
                stream(),
            )
        })
    }
}
