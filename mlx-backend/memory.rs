//! MLX's allocator: active, peak and cached bytes, and its limits.

use crate::ffi;

/// Bytes held by live arrays (not counting the allocator's cache).
pub fn active_memory() -> usize {
    ffi::active_memory()
}

/// The most bytes held at once since the start or the last [`reset_peak_memory`].
pub fn peak_memory() -> usize {
    ffi::peak_memory()
}

/// Restarts [`peak_memory`] from the bytes held now.
pub fn reset_peak_memory() {
    ffi::reset_peak_memory()
}

/// Bytes freed by arrays but kept by the allocator for reuse.
pub fn cache_memory() -> usize {
    ffi::cache_memory()
}

/// Set the guideline for the most memory a graph evaluation may use; returns the old one.
pub fn set_memory_limit(bytes: usize) -> usize {
    ffi::set_memory_limit(bytes)
}

/// The current memory limit guideline, in bytes.
pub fn memory_limit() -> usize {
    ffi::memory_limit()
}

/// Set how many freed bytes the allocator may keep; 0 disables the cache. Returns the old limit.
pub fn set_cache_limit(bytes: usize) -> usize {
    ffi::set_cache_limit(bytes)
}

/// Return the allocator's cached buffers to the system.
pub fn clear_cache() {
    ffi::clear_cache()
}
