//! Starting the ranks of a group on this machine, as `mlx.launch` does for
//! local hosts: one process per rank, each told its place through the
//! environment MLX's backends read.
//!
//! * ring: `MLX_RANK` and `MLX_HOSTFILE`, a JSON file listing per rank the
//!   `"ip:port"` addresses it listens on (`[["127.0.0.1:41000"], ...]`);
//!   the launcher picks free loopback ports and writes it.
//! * nccl: `MLX_RANK`, `MLX_WORLD_SIZE`, `NCCL_HOST_IP`, `NCCL_PORT` and one
//!   GPU per rank through `CUDA_VISIBLE_DEVICES`.
//!
//! `mlx.launch`'s own hosts file (`[{"ssh": "host", "ips": ["10.0.0.1"]}]`)
//! is read by [`read_hosts`]; only local hosts are started here (no ssh).
//! If any rank fails, the others are killed, so no rank is left waiting on
//! a peer that will never come.

use super::{Backend, DistributedError, ENV_BACKEND, ENV_HOSTFILE, ENV_RANK, ENV_WORLD_SIZE};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One entry of `mlx.launch`'s hosts file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// The name `mlx.launch` would ssh to.
    pub ssh: String,
    /// The addresses the host's ranks listen on.
    pub ips: Vec<String>,
}

impl Host {
    /// Whether ranks for it can be started here without ssh.
    pub fn is_local(&self) -> bool {
        matches!(self.ssh.as_str(), "localhost" | "127.0.0.1" | "::1")
    }
}

/// What to start.
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    /// Ranks (processes) to start.
    pub ranks: usize,
    /// The backend they form their group over.
    pub backend: Backend,
    /// The program every rank runs.
    pub program: PathBuf,
    /// Its arguments (the same for every rank).
    pub args: Vec<String>,
    /// The hosts, in rank order; `None`: every rank on 127.0.0.1.
    pub hosts: Option<Vec<Host>>,
    /// Whether ranks other than 0 write to this process's stdout (their
    /// stderr is always passed through).
    pub all_stdout: bool,
    /// How long the other ranks may take to finish once one rank has
    /// failed or rank 0 has exited, before they are killed.
    pub grace: Duration,
    /// Environment variables set for every rank (besides the group's).
    pub env: Vec<(String, String)>,
}

impl LaunchConfig {
    /// `ranks` local ranks of `program args` over `backend`.
    pub fn local(ranks: usize, backend: Backend, program: PathBuf, args: Vec<String>) -> Self {
        LaunchConfig {
            ranks,
            backend,
            program,
            args,
            hosts: None,
            all_stdout: false,
            grace: Duration::from_secs(10),
            env: Vec::new(),
        }
    }
}

/// Read `mlx.launch`'s hosts file: a JSON list of `{"ssh": ..., "ips": [...]}`.
pub fn read_hosts(path: &Path) -> Result<Vec<Host>, DistributedError> {
    let bad = |message: String| DistributedError::Launch {
        rank: 0,
        message: format!("hosts file {}: {message}", path.display()),
        source: None,
    };
    let text = std::fs::read_to_string(path).map_err(|e| DistributedError::Launch {
        rank: 0,
        message: format!("reading hosts file {}", path.display()),
        source: Some(Arc::new(e)),
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let list = v.as_array().ok_or_else(|| bad("not a JSON list".into()))?;
    list.iter()
        .map(|h| {
            let ssh = h
                .get("ssh")
                .and_then(|s| s.as_str())
                .ok_or_else(|| bad("an entry has no \"ssh\" string".into()))?;
            let ips = match h.get("ips") {
                None => Vec::new(),
                Some(ips) => ips
                    .as_array()
                    .ok_or_else(|| bad("\"ips\" is not a list".into()))?
                    .iter()
                    .map(|ip| ip.as_str().map(String::from))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad("an ip is not a string".into()))?,
            };
            Ok(Host {
                ssh: ssh.to_string(),
                ips,
            })
        })
        .collect()
}

/// The number of ranks the ring hostfile in [`ENV_HOSTFILE`] lists.
pub(crate) fn read_ring_hostfile() -> Result<usize, DistributedError> {
    let path = std::env::var(ENV_HOSTFILE).map_err(|_| {
        DistributedError::NotConfigured(format!("{ENV_HOSTFILE} is not set (ring backend)"))
    })?;
    let bad = |reason: String| DistributedError::BadEnv {
        name: ENV_HOSTFILE,
        value: path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let ranks = v
        .as_array()
        .ok_or_else(|| bad("not a JSON list of per-rank address lists".into()))?;
    for r in ranks {
        let ok = r
            .as_array()
            .is_some_and(|a| !a.is_empty() && a.iter().all(|x| x.as_str().is_some()));
        if !ok {
            return Err(bad(
                "each rank needs a non-empty list of \"ip:port\" strings".into(),
            ));
        }
    }
    if ranks.is_empty() {
        return Err(bad("the hostfile lists no ranks".into()));
    }
    Ok(ranks.len())
}

/// A port nobody listens on now (the OS's pick for port 0).
fn free_port(rank: usize) -> Result<u16, DistributedError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| DistributedError::Launch {
        rank,
        message: "finding a free loopback port".into(),
        source: Some(Arc::new(e)),
    })?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| DistributedError::Launch {
            rank,
            message: "reading a bound port".into(),
            source: Some(Arc::new(e)),
        })
}

/// The ranks' environments: per rank, the variables to set, and the
/// hostfile written for them (removed when the launch ends).
struct Plan {
    envs: Vec<Vec<(String, String)>>,
    hostfile: Option<PathBuf>,
}

fn plan(config: &LaunchConfig) -> Result<Plan, DistributedError> {
    let n = config.ranks;
    let ips: Vec<String> = match &config.hosts {
        None => vec!["127.0.0.1".to_string(); n],
        Some(hosts) => {
            if hosts.len() != n {
                return Err(DistributedError::Launch {
                    rank: 0,
                    message: format!("{} hosts listed for {n} ranks", hosts.len()),
                    source: None,
                });
            }
            hosts
                .iter()
                .enumerate()
                .map(|(rank, h)| {
                    if !h.is_local() {
                        return Err(DistributedError::Launch {
                            rank,
                            message: format!(
                                "host '{}' is remote; this launcher starts local ranks only \
                                 (use mlx.launch over ssh)",
                                h.ssh
                            ),
                            source: None,
                        });
                    }
                    Ok(h.ips.first().cloned().unwrap_or_else(|| "127.0.0.1".into()))
                })
                .collect::<Result<_, _>>()?
        }
    };
    let mut envs: Vec<Vec<(String, String)>> = (0..n)
        .map(|rank| {
            vec![
                (ENV_RANK.to_string(), rank.to_string()),
                (ENV_WORLD_SIZE.to_string(), n.to_string()),
                (ENV_BACKEND.to_string(), config.backend.to_string()),
            ]
        })
        .collect();
    let mut hostfile = None;
    match config.backend {
        Backend::Ring | Backend::Any => {
            let addrs: Vec<Vec<String>> = ips
                .iter()
                .enumerate()
                .map(|(rank, ip)| Ok(vec![format!("{ip}:{}", free_port(rank)?)]))
                .collect::<Result<_, DistributedError>>()?;
            let path = std::env::temp_dir().join(format!(
                "mlx-backend-hostfile-{}-{}.json",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            ));
            let text = serde_json::to_string(&addrs).map_err(|e| DistributedError::Launch {
                rank: 0,
                message: format!("encoding the hostfile: {e}"),
                source: None,
            })?;
            std::fs::write(&path, text).map_err(|e| DistributedError::Launch {
                rank: 0,
                message: format!("writing the hostfile {}", path.display()),
                source: Some(Arc::new(e)),
            })?;
            for env in &mut envs {
                env.push((ENV_HOSTFILE.into(), path.display().to_string()));
                // The group is formed over ring whatever `any` would pick.
                env[2].1 = Backend::Ring.to_string();
            }
            hostfile = Some(path);
        }
        Backend::Nccl => {
            let port = free_port(0)?;
            for (rank, env) in envs.iter_mut().enumerate() {
                env.push(("NCCL_HOST_IP".into(), ips[0].clone()));
                env.push(("NCCL_PORT".into(), port.to_string()));
                env.push(("CUDA_VISIBLE_DEVICES".into(), rank.to_string()));
            }
        }
        Backend::Mpi | Backend::Jaccl => {
            return Err(DistributedError::Launch {
                rank: 0,
                message: format!(
                    "the {} backend is started by its own launcher (mpirun / mlx.launch)",
                    config.backend
                ),
                source: None,
            })
        }
    }
    Ok(Plan { envs, hostfile })
}

/// The started ranks. Dropping it kills the ranks still running and
/// removes the generated hostfile.
pub struct Ranks {
    children: Vec<Option<Child>>,
    hostfile: Option<PathBuf>,
    grace: Duration,
}

/// Start every rank (see [`LaunchConfig`]) and return at once.
pub fn spawn(config: &LaunchConfig) -> Result<Ranks, DistributedError> {
    if config.ranks == 0 {
        return Err(DistributedError::Launch {
            rank: 0,
            message: "at least one rank is needed".into(),
            source: None,
        });
    }
    let plan = plan(config)?;
    let mut ranks = Ranks {
        children: Vec::with_capacity(config.ranks),
        hostfile: plan.hostfile,
        grace: config.grace,
    };
    for (rank, env) in plan.envs.iter().enumerate() {
        let mut cmd = Command::new(&config.program);
        cmd.args(&config.args)
            .envs(config.env.iter().cloned())
            .envs(env.iter().cloned());
        if rank > 0 && !config.all_stdout {
            cmd.stdout(Stdio::null());
        }
        let child = cmd.spawn().map_err(|e| DistributedError::Launch {
            rank,
            message: format!("starting {}", config.program.display()),
            source: Some(Arc::new(e)),
        })?;
        ranks.children.push(Some(child));
    }
    Ok(ranks)
}

/// Start every rank, wait for all of them, and return the launch's exit
/// code (see [`Ranks::wait`]).
pub fn launch(config: &LaunchConfig) -> Result<i32, DistributedError> {
    spawn(config)?.wait()
}

impl Ranks {
    /// The process id of `rank`, while it runs.
    pub fn pid(&self, rank: usize) -> Option<u32> {
        self.children.get(rank)?.as_ref().map(Child::id)
    }

    /// Kill `rank` now (SIGKILL).
    pub fn kill(&mut self, rank: usize) -> Result<(), DistributedError> {
        let Some(Some(child)) = self.children.get_mut(rank) else {
            return Ok(());
        };
        child.kill().map_err(|e| DistributedError::Launch {
            rank,
            message: "killing the rank".into(),
            source: Some(Arc::new(e)),
        })
    }

    /// Wait for every rank and return the launch's exit code: 0 when every
    /// rank succeeded, else the first failing rank's code (a rank killed by
    /// a signal counts as 128 + the signal). Once a rank fails or rank 0
    /// exits, the others get the grace period to finish and are then killed.
    pub fn wait(mut self) -> Result<i32, DistributedError> {
        Ok(self.wait_codes()?.0)
    }

    /// As [`Ranks::wait`], with every rank's own exit code (`None`: killed
    /// by the launcher after the grace period).
    pub fn wait_codes(&mut self) -> Result<(i32, Vec<Option<i32>>), DistributedError> {
        let mut codes: Vec<Option<i32>> = vec![None; self.children.len()];
        let mut code: Option<i32> = None;
        let mut deadline: Option<Instant> = None;
        loop {
            for (rank, slot) in self.children.iter_mut().enumerate() {
                let Some(child) = slot else { continue };
                let status = child.try_wait().map_err(|e| DistributedError::Launch {
                    rank,
                    message: "waiting for the rank".into(),
                    source: Some(Arc::new(e)),
                })?;
                let Some(status) = status else { continue };
                *slot = None;
                let c = exit_code(status);
                codes[rank] = Some(c);
                if c != 0 && code.is_none_or(|k| k == 0) {
                    code = Some(c);
                } else if code.is_none() && rank == 0 {
                    code = Some(0);
                }
                if c != 0 || rank == 0 {
                    deadline.get_or_insert(Instant::now() + self.grace);
                }
            }
            if self.children.iter().all(Option::is_none) {
                return Ok((code.unwrap_or(0), codes));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                eprintln!("launch: ranks still running after the grace period; killing them");
                kill_all(&mut self.children);
                let code = match code {
                    Some(0) | None => 1,
                    Some(c) => c,
                };
                return Ok((code, codes));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        kill_all(&mut self.children);
        if let Some(path) = &self.hostfile {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    if let Some(c) = status.code() {
        return c;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return 128 + sig;
        }
    }
    1
}

fn kill_all(children: &mut [Option<Child>]) {
    for slot in children.iter_mut() {
        if let Some(mut child) = slot.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
