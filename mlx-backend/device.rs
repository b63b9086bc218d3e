//! Devices and streams.
//!
//! MLX streams belong to the thread that made them: the default stream of a
//! device is per thread, and a graph is evaluated on the stream its ops were
//! built on. That is why [`crate::Array`] is not `Send`: an array built on one
//! thread's stream must be evaluated there. A runner that an async engine
//! shares lives on a thread of its own behind a `Send` handle.

use crate::error::DeviceError;
use crate::ffi;
use std::cell::Cell;
use std::fmt;

/// A compute device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// The host CPU.
    Cpu,
    /// The GPU of that index (CUDA or Metal, by the MLX build).
    Gpu(i32),
}

impl Device {
    pub(crate) fn spec(self) -> ffi::DeviceSpec {
        match self {
            Device::Cpu => ffi::DeviceSpec {
                device_type: 0,
                device_index: 0,
            },
            Device::Gpu(i) => ffi::DeviceSpec {
                device_type: 1,
                device_index: i,
            },
        }
    }

    pub(crate) fn from_spec(spec: ffi::DeviceSpec) -> Device {
        if spec.device_type == 1 {
            Device::Gpu(spec.device_index)
        } else {
            Device::Cpu
        }
    }

    /// The first GPU, when this MLX build has one (CUDA or Metal).
    pub fn gpu() -> Option<Device> {
        Device::Gpu(0).is_available().then_some(Device::Gpu(0))
    }

    /// Whether this MLX build can run on the device.
    pub fn is_available(self) -> bool {
        ffi::device_is_available(self.spec())
    }

    /// How many devices of this kind MLX sees (0 GPUs on a CPU-only build).
    pub fn count(gpu: bool) -> usize {
        ffi::device_count(i32::from(gpu)).map_or(0, |n| n.max(0) as usize)
    }

    /// MLX's default device for new ops (the GPU when there is one).
    pub fn default_device() -> Device {
        Device::from_spec(ffi::default_device())
    }

    /// Make `self` MLX's default device for ops built without a stream scope.
    pub fn set_default(self) -> Result<(), DeviceError> {
        if !self.is_available() {
            return Err(DeviceError::Unavailable(self.to_string()));
        }
        ffi::set_default_device(self.spec()).map_err(|e| DeviceError::Mlx(e.what().into()))
    }

    /// This thread's default stream on the device.
    pub fn default_stream(self) -> Result<Stream, DeviceError> {
        if !self.is_available() {
            return Err(DeviceError::Unavailable(self.to_string()));
        }
        ffi::default_stream(self.spec())
            .map(Stream)
            .map_err(|e| DeviceError::Mlx(e.what().into()))
    }

    /// A new stream on the device, owned by this thread.
    pub fn new_stream(self) -> Result<Stream, DeviceError> {
        if !self.is_available() {
            return Err(DeviceError::Unavailable(self.to_string()));
        }
        ffi::new_stream(self.spec())
            .map(Stream)
            .map_err(|e| DeviceError::Mlx(e.what().into()))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Gpu(i) => write!(f, "gpu:{i}"),
        }
    }
}

/// An MLX stream: a queue of work on one device. Ops are built on the
/// stream of the innermost [`Stream::scope`], else on this thread's default
/// stream of the default device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream(pub(crate) ffi::StreamSpec);

thread_local! {
    static CURRENT: Cell<Option<ffi::StreamSpec>> = const { Cell::new(None) };
}

impl Stream {
    /// The stream ops built now on this thread go to.
    pub fn current() -> Stream {
        Stream(current_spec())
    }

    /// The device the stream runs on.
    pub fn device(&self) -> Device {
        Device::from_spec(self.0.device)
    }

    /// MLX's index of the stream.
    pub fn index(&self) -> i32 {
        self.0.index
    }

    /// Run `f` with every op it builds on this thread placed on `self`.
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore(Option<ffi::StreamSpec>);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(CURRENT.with(|c| c.replace(Some(self.0))));
        f()
    }

    /// Make `self` this thread's default stream for its device in MLX itself
    /// (what ops built outside any [`Stream::scope`] use).
    pub fn set_as_default(&self) -> Result<(), DeviceError> {
        ffi::set_default_stream(self.0).map_err(|e| DeviceError::Mlx(e.what().into()))
    }

    /// Block until all work queued on the stream is done.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        ffi::synchronize(self.0).map_err(|e| DeviceError::Mlx(e.what().into()))
    }
}

pub(crate) fn current_spec() -> ffi::StreamSpec {
    CURRENT.with(|c| c.get()).unwrap_or_else(|| {
        // The default device always has a default stream on this thread.
        ffi::default_stream(ffi::default_device()).unwrap_or(ffi::StreamSpec {
            index: 0,
            device: ffi::default_device(),
        })
    })
}
