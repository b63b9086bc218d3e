//! The callback bridge through which the C++ GPU bodies report to the
//! registry (`mlx-kernels-cpp/common/gpu_body.cpp`, which includes the
//! generated `mlx-backend/mlx-backend/kernels/registry_bridge.rs.h`).

use super::registry::{record_gpu_enqueue, record_gpu_failure};

#[cxx::bridge(namespace = "mlx_backend")]
mod ffi {
    extern "Rust" {
        /// A GPU body's evaluation failed (its module did not load, its
        /// launch failed): remember it, so later op builds fall back.
        fn record_gpu_failure(kernel: i32, message: &str);
        /// A GPU body enqueued its kernels, taking `nanos` of host time.
        fn record_gpu_enqueue(kernel: i32, nanos: u64);
    }
}
