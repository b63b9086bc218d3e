//! A per-layer KV cache grown in steps (as mlx-lm's KVCache), owned by the
//! caller: the model appends to it, the runner decides its lifetime.

use crate::{Array, OpError};

/// Keys and values of one layer, `[B, H_kv, capacity, D]`, valid up to `offset`.
#[derive(Default)]
pub struct LayerKvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
    step: i32,
}

impl LayerKvCache {
    /// An empty cache growing `step` positions at a time.
    pub fn new(step: i32) -> LayerKvCache {
        LayerKvCache {
            step: step.max(1),
            ..Default::default()
        }
    }

    /// Tokens cached so far.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Positions allocated.
    pub fn capacity(&self) -> i32 {
        self.keys.as_ref().map_or(0, |k| k.shape()[2])
    }

    /// Bytes held by the cache arrays.
    pub fn nbytes(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.nbytes())
            + self.values.as_ref().map_or(0, |v| v.nbytes())
    }

    /// Forget everything (keeps nothing allocated).
    pub fn clear(&mut self) {
        self.keys = None;
        self.values = None;
        self.offset = 0;
    }

    /// Drop positions past `len` (they are overwritten by later updates).
    pub fn truncate(&mut self, len: i32) {
        self.offset = self.offset.min(len.max(0));
    }

    /// The cached arrays (views up to `offset`), when any.
    pub fn state(&self) -> Option<(Array, Array)> {
        let (k, v) = (self.keys.as_ref()?, self.values.as_ref()?);
        Some((
            k.slice_axis(2, 0, self.offset).ok()?,
            v.slice_axis(2, 0, self.offset).ok()?,
        ))
    }

    /// The cache's whole key and value buffers (capacity, not `offset`), when
    /// any: what evaluating materialises the cache without slicing it.
    pub fn buffers(&self) -> Option<(&Array, &Array)> {
        Some((self.keys.as_ref()?, self.values.as_ref()?))
    }

    /// Append `k, v [B, H_kv, L, D]` and return all cached keys and values.
    pub fn update(&mut self, k: &Array, v: &Array) -> Result<(Array, Array), OpError> {
        let (ks, vs) = (k.shape(), v.shape());
        let l = ks[2];
        let prev = self.offset;
        if self.keys.is_none() || prev + l > self.capacity() {
            let step = self.step.max(1);
            let n = (l + step - 1) / step * step;
            let grow_k = crate::Array::zeros(&[ks[0], ks[1], n, ks[3]], k.dtype())?;
            let grow_v = crate::Array::zeros(&[vs[0], vs[1], n, vs[3]], v.dtype())?;
            match (&self.keys, &self.values) {
                (Some(old_k), Some(old_v)) => {
                    let old_k = old_k.slice_axis(2, 0, prev)?;
                    let old_v = old_v.slice_axis(2, 0, prev)?;
                    self.keys = Some(crate::ops::concatenate(&[&old_k, &grow_k], 2)?);
                    self.values = Some(crate::ops::concatenate(&[&old_v, &grow_v], 2)?);
                }
                _ => {
                    self.keys = Some(grow_k);
                    self.values = Some(grow_v);
                }
            }
        }
        let (keys, values) = (
            self.keys.as_ref().expect("allocated above"),
            self.values.as_ref().expect("allocated above"),
        );
        let start = [0, 0, prev, 0];
        let stop_k = [ks[0], ks[1], prev + l, ks[3]];
        let stop_v = [vs[0], vs[1], prev + l, vs[3]];
        let keys = keys.slice_update(k, &start, &stop_k, &[])?;
        let values = values.slice_update(v, &start, &stop_v, &[])?;
        self.offset = prev + l;
        let out = (
            keys.slice_axis(2, 0, self.offset)?,
            values.slice_axis(2, 0, self.offset)?,
        );
        self.keys = Some(keys);
        self.values = Some(values);
        Ok(out)
    }

    /// Hands the cache arrays to a fused decode step of one token (see
    /// `kernels::decoder_layer`), growing them first when full; the cache
    /// holds no reference meanwhile, so the step can reuse their buffers.
    /// Returns `(keys, values, offset)`; give the step's outputs back with
    /// [`LayerKvCache::commit_decode`], or the inputs with
    /// [`LayerKvCache::restore`] if the step could not be built.
    pub fn take_for_decode(
        &mut self,
        heads: i32,
        dim: i32,
        dtype: crate::Dtype,
    ) -> Result<(Array, Array, i32), OpError> {
        let prev = self.offset;
        if self.keys.is_none() || prev + 1 > self.capacity() {
            let n = self.step.max(1);
            let grow = || crate::Array::zeros(&[1, heads, n, dim], dtype);
            // Built from borrows: on an error the cache is left as it was.
            let grown = match (&self.keys, &self.values) {
                (Some(old_k), Some(old_v)) => (
                    crate::ops::concatenate(&[&old_k.slice_axis(2, 0, prev)?, &grow()?], 2)?,
                    crate::ops::concatenate(&[&old_v.slice_axis(2, 0, prev)?, &grow()?], 2)?,
                ),
                _ => (grow()?, grow()?),
            };
            self.keys = None;
            self.values = None;
            return Ok((grown.0, grown.1, prev));
        }
        let k = self.keys.take().expect("checked above");
        let v = self
            .values
            .take()
            .expect("keys and values are set together");
        Ok((k, v, prev))
    }

    /// Rows of the cached arrays (`None` before the first update).
    pub fn batch(&self) -> Option<i32> {
        self.keys.as_ref().map(|k| k.shape()[0])
    }

    /// Stores a fused decode step's updated arrays: one more token cached.
    pub fn commit_decode(&mut self, keys: Array, values: Array) {
        self.keys = Some(keys);
        self.values = Some(values);
        self.offset += 1;
    }

    /// Puts back what [`LayerKvCache::take_for_decode`] handed out.
    pub fn restore(&mut self, keys: Array, values: Array) {
        self.keys = Some(keys);
        self.values = Some(values);
    }
}
