//! The distributed layer's typed error. Collective failures carry the
//! array-layer error that caused them; a peer that stops answering is told
//! apart from a local failure, so a serving engine can fail the group
//! instead of retrying.

use crate::{EvalError, HostDataError, OpError};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// Why a distributed call failed.
#[derive(Debug, Clone, Error)]
pub enum DistributedError {
    /// The MLX build has no such backend (or none at all for `any`).
    #[error("distributed backend '{backend}' is not available in this MLX build")]
    Unavailable {
        /// The backend asked for.
        backend: String,
    },
    /// An unknown backend name.
    #[error("unknown distributed backend '{0}' (expected any, ring, mpi, nccl or jaccl)")]
    UnknownBackend(String),
    /// MLX could not set the group up (unreachable peers, bad hostfile).
    #[error("initializing the '{backend}' distributed backend failed: {message}")]
    Init {
        /// The backend asked for.
        backend: String,
        /// MLX's explanation.
        message: String,
    },
    /// The environment does not describe a group (no `MLX_RANK`, ...).
    #[error("no distributed group is configured: {0}")]
    NotConfigured(String),
    /// An environment variable of the group is malformed.
    #[error("environment variable {name}={value:?} is invalid: {reason}")]
    BadEnv {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The group has another size than the caller expects (`--tp N`).
    #[error("the distributed group has {actual} ranks, {expected} were asked for")]
    SizeMismatch {
        /// Ranks asked for.
        expected: usize,
        /// Ranks in the group.
        actual: usize,
    },
    /// Building a collective op failed.
    #[error("building {op} failed")]
    Op {
        /// The collective.
        op: &'static str,
        /// The op error.
        #[source]
        source: OpError,
    },
    /// Running a collective failed.
    #[error("running {op} failed")]
    Eval {
        /// The collective.
        op: &'static str,
        /// The evaluation error.
        #[source]
        source: EvalError,
    },
    /// Copying a collective's result to the host failed.
    #[error("reading the result of {op} failed")]
    HostData {
        /// The collective.
        op: &'static str,
        /// The copy's error.
        #[source]
        source: HostDataError,
    },
    /// A message of the runner protocol could not be decoded.
    #[error("malformed protocol message: {0}")]
    Protocol(String),
    /// A peer did not take part in a step within the timeout: it died, hung
    /// or lost its connection. The group cannot be used again.
    #[error("a peer rank did not answer within {timeout:?} while {during}")]
    PeerTimeout {
        /// The configured timeout.
        timeout: Duration,
        /// What rank 0 was doing.
        during: &'static str,
    },
    /// An earlier step lost a peer; the group serves no more calls.
    #[error("the distributed group was lost in an earlier step")]
    GroupLost,
    /// Starting or watching a rank's process failed.
    #[error("launching rank {rank}: {message}")]
    Launch {
        /// The rank.
        rank: usize,
        /// What was being done.
        message: String,
        /// The operating system's error.
        #[source]
        source: Option<Arc<std::io::Error>>,
    },
}
