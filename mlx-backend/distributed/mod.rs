//! MLX's distributed layer (`mlx::core::distributed`): a [`Group`] of
//! processes and its collectives (`all_sum`, `all_gather`, `send`, `recv`),
//! over whichever backend MLX was built with: ring (TCP, what runs on
//! CPUs here), MPI, NCCL (CUDA) or JACCL (Thunderbolt). Nothing here moves
//! bytes itself; every transfer is an MLX op evaluated like any other.
//!
//! Processes find each other through the environment `mlx.launch` sets up
//! (see [`Group::from_env`]); [`launch`] starts local ranks the same way.

mod error;
pub mod launch;

pub use error::DistributedError;

use crate::array::Array;
use crate::error::OpError;
use crate::ffi;
use crate::ops::{stream, wrap};
use crate::Dtype;
use cxx::UniquePtr;
use std::fmt;
use std::str::FromStr;

/// This rank's index in the group (`mlx.launch`'s convention).
pub const ENV_RANK: &str = "MLX_RANK";
/// The ring backend's hostfile: a JSON list, per rank, of `"ip:port"` strings.
pub const ENV_HOSTFILE: &str = "MLX_HOSTFILE";
/// The number of ranks, where the backend takes it from the environment
/// (NCCL); checked against the hostfile when both are set.
pub const ENV_WORLD_SIZE: &str = "MLX_WORLD_SIZE";
/// This crate's own choice of backend for [`Group::from_env`] (MLX's
/// environment does not name one; `mlx.launch` passes it in code).
pub const ENV_BACKEND: &str = "MLX_DISTRIBUTED_BACKEND";

/// A distributed backend of MLX.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The first one MLX finds available.
    Any,
    /// A ring of TCP connections (any machine; what `mlx.launch` defaults to).
    Ring,
    /// MPI.
    Mpi,
    /// NCCL between CUDA GPUs.
    Nccl,
    /// JACCL, RDMA over Thunderbolt between Macs.
    Jaccl,
}

impl Backend {
    /// MLX's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Any => "any",
            Backend::Ring => "ring",
            Backend::Mpi => "mpi",
            Backend::Nccl => "nccl",
            Backend::Jaccl => "jaccl",
        }
    }

    /// Whether this MLX build has the backend.
    pub fn is_available(self) -> bool {
        ffi::distributed_is_available(self.as_str()).unwrap_or(false)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Backend {
    type Err = DistributedError;

    fn from_str(s: &str) -> Result<Backend, DistributedError> {
        Ok(match s {
            "any" => Backend::Any,
            "ring" => Backend::Ring,
            "mpi" => Backend::Mpi,
            "nccl" => Backend::Nccl,
            "jaccl" => Backend::Jaccl,
            other => return Err(DistributedError::UnknownBackend(other.to_string())),
        })
    }
}

/// A group of processes that run collectives together. Clones share the
/// backend's communicator. Like arrays, it stays on the thread that uses it.
pub struct Group {
    raw: UniquePtr<ffi::DistGroup>,
    backend: Backend,
}

impl Clone for Group {
    fn clone(&self) -> Group {
        Group {
            raw: ffi::dist_group_clone(self.inner()),
            backend: self.backend,
        }
    }
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

impl Group {
    /// Join the group of `backend` as MLX's `distributed::init` does, from
    /// the backend's own environment. `strict`: fail when no group can be
    /// formed, instead of returning the single-process group.
    pub fn init(strict: bool, backend: Backend) -> Result<Group, DistributedError> {
        if strict && !backend.is_available() {
            return Err(DistributedError::Unavailable {
                backend: backend.to_string(),
            });
        }
        let raw = ffi::distributed_init(strict, backend.as_str()).map_err(|e| {
            DistributedError::Init {
                backend: backend.to_string(),
                message: e.what().to_string(),
            }
        })?;
        Ok(Group { raw, backend })
    }

    /// Join the group `mlx.launch` (or [`launch`]) described in the
    /// environment: [`ENV_RANK`] and, for the ring backend, [`ENV_HOSTFILE`];
    /// [`ENV_WORLD_SIZE`] is checked when set. The backend is
    /// [`ENV_BACKEND`] when set, else ring when a hostfile is given, else
    /// whichever MLX finds. Fails, before contacting any peer, when the
    /// variables are missing or inconsistent.
    pub fn from_env() -> Result<Group, DistributedError> {
        let rank = env_usize(ENV_RANK)?
            .ok_or_else(|| DistributedError::NotConfigured(format!("{ENV_RANK} is not set")))?;
        let backend = match std::env::var(ENV_BACKEND) {
            Ok(b) => b.parse()?,
            Err(_) if std::env::var_os(ENV_HOSTFILE).is_some() => Backend::Ring,
            Err(_) => Backend::Any,
        };
        let mut size = env_usize(ENV_WORLD_SIZE)?;
        if backend == Backend::Ring {
            let hosts = launch::read_ring_hostfile()?;
            if let Some(world) = size.filter(|&w| w != hosts) {
                return Err(DistributedError::BadEnv {
                    name: ENV_WORLD_SIZE,
                    value: world.to_string(),
                    reason: format!("the hostfile lists {hosts} ranks"),
                });
            }
            size = Some(hosts);
        }
        if let Some(size) = size.filter(|&s| rank >= s) {
            return Err(DistributedError::BadEnv {
                name: ENV_RANK,
                value: rank.to_string(),
                reason: format!("the group has {size} ranks"),
            });
        }
        let group = Group::init(true, backend)?;
        if group.rank() != rank {
            return Err(DistributedError::BadEnv {
                name: ENV_RANK,
                value: rank.to_string(),
                reason: format!("the backend placed this process at rank {}", group.rank()),
            });
        }
        Ok(group)
    }

    /// The stream a collective is built on. The ring, MPI and JACCL
    /// backends communicate from the CPU: their collectives go on this
    /// thread's default CPU stream whatever the current device (MLX keeps
    /// streams per thread, and a stream MLX would pick for them need not
    /// exist on this one). NCCL's, and those of a backend MLX chose
    /// (`Backend::Any`), go on the current stream.
    fn collective_stream(&self, op: &'static str) -> Result<ffi::StreamSpec, OpError> {
        match self.backend {
            Backend::Ring | Backend::Mpi | Backend::Jaccl => {
                ffi::default_stream(crate::device::Device::Cpu.spec())
                    .map_err(OpError::from_cxx(op))
            }
            Backend::Nccl | Backend::Any => Ok(stream()),
        }
    }

    fn inner(&self) -> &ffi::DistGroup {
        // A live Group always holds its communicator.
        self.raw.as_ref().expect("Group holds a communicator")
    }

    /// This process's rank, `0..size()`.
    pub fn rank(&self) -> usize {
        ffi::dist_group_rank(self.inner()).max(0) as usize
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        ffi::dist_group_size(self.inner()).max(1) as usize
    }

    /// The element-wise sum of `x` over every rank (lazy, like any op).
    pub fn all_sum(&self, x: &Array) -> Result<Array, OpError> {
        wrap(
            "all_sum",
            ffi::dist_all_sum(x.inner(), self.inner(), self.collective_stream("all_sum")?),
        )
    }

    /// Every rank's `x` concatenated along the first axis, in rank order.
    pub fn all_gather(&self, x: &Array) -> Result<Array, OpError> {
        wrap(
            "all_gather",
            ffi::dist_all_gather(
                x.inner(),
                self.inner(),
                self.collective_stream("all_gather")?,
            ),
        )
    }

    /// Send `x` to rank `dst`; the result is an empty array to evaluate.
    pub fn send(&self, x: &Array, dst: usize) -> Result<Array, OpError> {
        wrap(
            "send",
            ffi::dist_send(
                x.inner(),
                dst as i32,
                self.inner(),
                self.collective_stream("send")?,
            ),
        )
    }

    /// Receive an array of `shape` and `dtype` sent by rank `src`.
    pub fn recv(&self, shape: &[i32], dtype: Dtype, src: usize) -> Result<Array, OpError> {
        wrap(
            "recv",
            ffi::dist_recv(
                shape,
                dtype.code(),
                src as i32,
                self.inner(),
                self.collective_stream("recv")?,
            ),
        )
    }

    /// Rank `root`'s `data` on every rank (what the others pass is
    /// ignored): its length, then the values, each as one `all_sum` to
    /// which the other ranks add zeros. Blocks until the peers take part.
    pub fn broadcast_i32(&self, root: usize, data: &[i32]) -> Result<Vec<i32>, DistributedError> {
        let me = self.rank() == root;
        let len = if me { data.len() as i32 } else { 0 };
        let len = self.sum_to_host(&[len])?;
        let len = usize::try_from(len[0]).map_err(|_| {
            DistributedError::Protocol(format!("negative broadcast length {}", len[0]))
        })?;
        if len == 0 {
            return Ok(Vec::new());
        }
        if me {
            self.sum_to_host(data)
        } else {
            self.sum_to_host(&vec![0; len])
        }
    }

    fn sum_to_host(&self, values: &[i32]) -> Result<Vec<i32>, DistributedError> {
        let op = "all_sum";
        let x = Array::from_slice(values, &[values.len() as i32])
            .map_err(|source| DistributedError::HostData { op, source })?;
        let sum = self
            .all_sum(&x)
            .map_err(|source| DistributedError::Op { op, source })?;
        sum.eval()
            .map_err(|source| DistributedError::Eval { op, source })?;
        sum.to_vec::<i32>()
            .map_err(|source| DistributedError::HostData { op, source })
    }
}

fn env_usize(name: &'static str) -> Result<Option<usize>, DistributedError> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|e| DistributedError::BadEnv {
                name,
                value: v.clone(),
                reason: e.to_string(),
            }),
    }
}

/// End the process now with `code`, without running exit handlers or
/// static destructors. What a rank must do once a collective may be stuck:
/// a thread blocked inside MLX's backend (a ring socket whose peer died)
/// would otherwise keep MLX's shutdown, and so the process, waiting forever.
pub fn exit_process(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process at once; nothing runs after it.
    unsafe { libc::_exit(code) }
}
