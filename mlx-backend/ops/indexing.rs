//! Gathers, scatters, selection and joining.

use super::{stream, wrap};
use crate::array::{list, unlist, Array};
use crate::error::OpError;
use crate::ffi;

impl Array {
    /// Elements at `indices` along `axis`.
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array, OpError> {
        wrap(
            "take",
            ffi::take(self.inner(), indices.inner(), axis, stream()),
        )
    }

    /// Elements picked along `axis` by `indices`, which has this array's rank.
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array, OpError> {
        wrap(
            "take_along_axis",
            ffi::take_along_axis(self.inner(), indices.inner(), axis, stream()),
        )
    }

    /// A copy of `self` with `values` written at `indices` along `axis`.
    pub fn put_along_axis(
        &self,
        indices: &Array,
        values: &Array,
        axis: i32,
    ) -> Result<Array, OpError> {
        wrap(
            "put_along_axis",
            ffi::put_along_axis(
                self.inner(),
                indices.inner(),
                values.inner(),
                axis,
                stream(),
            ),
        )
    }
}

/// `cond ? x : y`, elementwise with broadcasting.
pub fn where_(cond: &Array, x: &Array, y: &Array) -> Result<Array, OpError> {
    wrap(
        "where",
        ffi::where_(cond.inner(), x.inner(), y.inner(), stream()),
    )
}

/// Joins arrays along an existing `axis`.
pub fn concatenate(arrays: &[&Array], axis: i32) -> Result<Array, OpError> {
    wrap(
        "concatenate",
        ffi::concatenate(&list(arrays), axis, stream()),
    )
}

/// Stacks same-shaped arrays along a new `axis`.
pub fn stack(arrays: &[&Array], axis: i32) -> Result<Array, OpError> {
    wrap("stack", ffi::stack(&list(arrays), axis, stream()))
}

/// Split `a` along `axis` at the given indices.
pub fn split(a: &Array, indices: &[i32], axis: i32) -> Result<Vec<Array>, OpError> {
    let l = ffi::split_sections(a.inner(), indices, axis, stream())
        .map_err(OpError::from_cxx("split"))?;
    Ok(unlist(&l))
}
