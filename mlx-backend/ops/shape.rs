//! Shape manipulation and slicing.

use super::{stream, wrap};
use crate::array::Array;
use crate::error::OpError;
use crate::ffi;

impl Array {
    /// The same elements in `shape` (one entry may be -1: inferred).
    pub fn reshape(&self, shape: &[i32]) -> Result<Array, OpError> {
        wrap("reshape", ffi::reshape(self.inner(), shape, stream()))
    }

    /// Permute axes; an empty `axes` reverses them.
    pub fn transpose(&self, axes: &[i32]) -> Result<Array, OpError> {
        wrap("transpose", ffi::transpose(self.inner(), axes, stream()))
    }

    /// Swap the last two axes (`.T` of a matrix).
    pub fn t(&self) -> Result<Array, OpError> {
        let n = self.ndim() as i32;
        if n < 2 {
            return Err(OpError::new("t", "needs an array of rank 2 or more"));
        }
        let mut axes: Vec<i32> = (0..n).collect();
        axes.swap((n - 1) as usize, (n - 2) as usize);
        self.transpose(&axes)
    }

    /// Remove size-1 axes; an empty `axes` removes them all.
    pub fn squeeze(&self, axes: &[i32]) -> Result<Array, OpError> {
        wrap("squeeze", ffi::squeeze(self.inner(), axes, stream()))
    }

    /// Inserts axes of size 1 at `axes`.
    pub fn expand_dims(&self, axes: &[i32]) -> Result<Array, OpError> {
        wrap(
            "expand_dims",
            ffi::expand_dims(self.inner(), axes, stream()),
        )
    }

    /// Repeats size-1 (or missing leading) axes to `shape`, without copying.
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array, OpError> {
        wrap(
            "broadcast_to",
            ffi::broadcast_to(self.inner(), shape, stream()),
        )
    }

    /// Merge axes `start..=end` into one.
    pub fn flatten(&self, start: i32, end: i32) -> Result<Array, OpError> {
        wrap("flatten", ffi::flatten(self.inner(), start, end, stream()))
    }

    /// `self[start[i]:stop[i]:strides[i], ...]`; `strides` empty means all 1.
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array, OpError> {
        let ones;
        let strides = if strides.is_empty() {
            ones = vec![1; start.len()];
            &ones
        } else {
            strides
        };
        wrap(
            "slice",
            ffi::slice(self.inner(), start, stop, strides, stream()),
        )
    }

    /// Slice `start..stop` along one axis, everything along the others.
    pub fn slice_axis(&self, axis: i32, start: i32, stop: i32) -> Result<Array, OpError> {
        let shape = self.shape();
        let n = shape.len() as i32;
        let a = if axis < 0 { axis + n } else { axis };
        if a < 0 || a >= n {
            return Err(OpError::new(
                "slice_axis",
                format!("axis {axis} is out of bounds for rank {n}"),
            ));
        }
        let mut lo = vec![0; shape.len()];
        let mut hi = shape.clone();
        lo[a as usize] = start;
        hi[a as usize] = stop;
        self.slice(&lo, &hi, &[])
    }

    /// A copy of `self` with `self[start:stop:strides] = update`.
    pub fn slice_update(
        &self,
        update: &Array,
        start: &[i32],
        stop: &[i32],
        strides: &[i32],
    ) -> Result<Array, OpError> {
        let ones = unit_strides(start, strides);
        let strides = ones.as_deref().unwrap_or(strides);
        wrap(
            "slice_update",
            ffi::slice_update(self.inner(), update.inner(), start, stop, strides, stream()),
        )
    }

    /// Slice of `size` along `axes` starting at the (device-side) indices `start`.
    pub fn slice_dynamic(
        &self,
        start: &Array,
        axes: &[i32],
        size: &[i32],
    ) -> Result<Array, OpError> {
        wrap(
            "slice_dynamic",
            ffi::slice_dynamic(self.inner(), start.inner(), axes, size, stream()),
        )
    }

    /// A copy of `self` with `update` written at the (device-side) indices `start` along `axes`.
    pub fn slice_update_dynamic(
        &self,
        update: &Array,
        start: &Array,
        axes: &[i32],
    ) -> Result<Array, OpError> {
        wrap(
            "slice_update_dynamic",
            ffi::slice_update_dynamic(self.inner(), update.inner(), start.inner(), axes, stream()),
        )
    }
}

/// All-ones strides when the caller gave none.
fn unit_strides(start: &[i32], strides: &[i32]) -> Option<Vec<i32>> {
    strides.is_empty().then(|| vec![1; start.len()])
}
