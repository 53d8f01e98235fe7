//! How engine processes are confined ([`SandboxMode`]) and the policy of one run: it may write
//! only the run's worktree, its private directory (home, temp, plan file) and the plugin cache,
//! in its own namespaces. A run that must be sandboxed on a kernel without Landlock or without
//! unprivileged namespaces is refused.

use super::run_dir::RunDirs;
use super::{Engine, EngineError};
pub use crate::capabilities::namespaces::Limits;
use crate::capabilities::namespaces::NsSupport;
pub use crate::capabilities::sandbox::Profile as SandboxProfile;
use crate::capabilities::sandbox::{Isolation, Policy, Support};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Whether each engine process gets its own namespaces (and rlimits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespaces {
    On {
        limits: Limits,
    },
    /// The kernel refuses them and the operator accepted that (`[sandbox] required = false`),
    /// or the local profile on such a kernel.
    Off {
        reason: String,
    },
}

/// Where the engine reads its name servers.
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The name of the apply's SSH agent socket in its run's private directory.
const AGENT_SOCKET_NAME: &str = "ssh-agent.sock";

/// How engine processes are confined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxMode {
    /// Every process under Landlock with this profile.
    Landlock {
        profile: SandboxProfile,
        /// The kernel's Landlock ABI version.
        abi: i32,
        /// Further paths the engine may read (`[sandbox] read_paths`).
        extra_read: Vec<PathBuf>,
        /// Further paths the engine may read and execute (a filesystem provider mirror).
        extra_exec: Vec<PathBuf>,
        /// TCP ports it may connect to (strict profile only).
        connect_ports: Vec<u16>,
        /// The namespaces and limits around each process, or why there are none.
        namespaces: Namespaces,
        /// An SSH agent socket the runs may use (the default branch's), shown only in their
        /// view at a per-run path.
        agent_socket: Option<PathBuf>,
    },
    /// No sandbox (`planbot plan --no-sandbox`, or `[sandbox] required = false` where the
    /// kernel offers none). The reason is shown wherever a plan is.
    Off { reason: String },
    /// A sandbox is required and unavailable: every run is refused with this text.
    Refused { reason: String },
}

impl SandboxMode {
    /// The strict profile where the kernel offers Landlock; else refused (`required`) with
    /// `refusal`, or off with the kernel's reason.
    pub fn strict(support: Support, required: bool, refusal: impl FnOnce(&str) -> String) -> Self {
        Self::with_profile(SandboxProfile::Strict, support, required, refusal)
    }

    /// `profile` where the kernel offers Landlock, else refused or off as for [`Self::strict`].
    pub fn with_profile(
        profile: SandboxProfile,
        support: Support,
        required: bool,
        refusal: impl FnOnce(&str) -> String,
    ) -> Self {
        Self::with_support(profile, support, NsSupport::probe(), required, refusal)
    }

    /// `profile` with what the kernel offers: Landlock and the namespaces, both required for
    /// the strict profile when `required` (refused with `refusal` of the first missing one).
    /// The local profile runs without namespaces where the kernel has none.
    pub fn with_support(
        profile: SandboxProfile,
        support: Support,
        ns: NsSupport,
        required: bool,
        refusal: impl FnOnce(&str) -> String,
    ) -> Self {
        match support {
            Support::Landlock { abi } => {
                let namespaces = match ns {
                    NsSupport::Available => Namespaces::On {
                        limits: Limits::default(),
                    },
                    NsSupport::Unavailable { reason }
                        if required && profile == SandboxProfile::Strict =>
                    {
                        return SandboxMode::Refused {
                            reason: refusal(&reason),
                        }
                    }
                    NsSupport::Unavailable { reason } => Namespaces::Off { reason },
                };
                SandboxMode::Landlock {
                    profile,
                    abi,
                    extra_read: Vec::new(),
                    extra_exec: Vec::new(),
                    connect_ports: vec![443],
                    namespaces,
                    agent_socket: None,
                }
            }
            Support::Unavailable { reason } if required => SandboxMode::Refused {
                reason: refusal(reason),
            },
            Support::Unavailable { reason } => SandboxMode::Off {
                reason: reason.to_string(),
            },
        }
    }

    /// The kernel support this mode runs with (what `doctor` and `--check` describe).
    pub fn describe(&self) -> String {
        match self {
            SandboxMode::Landlock {
                profile,
                abi,
                connect_ports,
                namespaces,
                ..
            } => {
                let mut text = Support::Landlock { abi: *abi }.describe();
                if *profile == SandboxProfile::Strict && *abi >= 4 {
                    let ports: Vec<String> = connect_ports.iter().map(u16::to_string).collect();
                    text.push_str(&format!(" (TCP ports allowed: {})", ports.join(", ")));
                }
                if *profile == SandboxProfile::Strict && matches!(namespaces, Namespaces::On { .. })
                {
                    text.push_str(
                        "; no UDP (names resolved over TCP), no new namespaces, mounts, keyrings, BPF or tracing",
                    );
                }
                match namespaces {
                    Namespaces::On { limits } => text.push_str(&format!(
                        "; {}: only the allow-list mounted, no planbot pids; at most {} tasks, {} open files, files of {}, {} of memory per process",
                        NsSupport::Available.describe(),
                        limits.tasks,
                        limits.open_files,
                        bytes(limits.file_size),
                        bytes(limits.memory),
                    )),
                    Namespaces::Off { reason } => {
                        text.push_str(&format!("; no namespaces: {reason}"))
                    }
                }
                text
            }
            SandboxMode::Off { reason } => format!("no sandbox: {reason}"),
            SandboxMode::Refused { reason } => reason.clone(),
        }
    }
}

/// `n` bytes in MiB or GiB.
fn bytes(n: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if n.is_multiple_of(1024 * MIB) {
        format!("{} GiB", n / (1024 * MIB))
    } else {
        format!("{} MiB", n / MIB)
    }
}

/// The sandbox of one run, ready to be applied to each of its processes.
#[derive(Debug, Clone)]
pub(super) struct Confinement {
    pub(super) policy: Policy,
    pub(super) support: Support,
    /// The namespaces around each process (`None`: Landlock only).
    pub(super) isolation: Option<Isolation>,
    /// The per-run path of the SSH agent socket, when it is shown there.
    agent_socket: Option<PathBuf>,
    /// The root's mount point of a step outside a run, deleted with the confinement.
    _root_dir: Option<std::sync::Arc<tempfile::TempDir>>,
}

impl Confinement {
    /// Point the run's environment at the per-run agent socket, when there is one.
    pub(super) fn set_env(&self, env: &mut BTreeMap<String, OsString>) {
        if let Some(sock) = &self.agent_socket {
            env.insert("PROXMOX_VE_SSH_AUTH_SOCK".into(), sock.clone().into());
            env.insert("SSH_AUTH_SOCK".into(), sock.clone().into());
        }
    }
}

impl Engine {
    /// `Err` when a sandbox is required and the kernel offers none: nothing may run.
    pub(super) fn refuse_unsandboxed(&self) -> Result<(), EngineError> {
        match &self.inner.sandbox {
            SandboxMode::Refused { reason } => Err(EngineError::SandboxRefused(reason.clone())),
            _ => Ok(()),
        }
    }

    /// The sandbox of one run: the profile's base, the engine binary, the operator's extra
    /// read paths, and `run`'s own directories (worktree, private dirs, plugin cache). `None`
    /// when runs are not sandboxed.
    pub(super) fn confinement(&self, run: Option<(&Path, &RunDirs)>) -> Option<Confinement> {
        let SandboxMode::Landlock {
            profile,
            abi,
            extra_read,
            extra_exec,
            connect_ports,
            namespaces,
            agent_socket,
        } = &self.inner.sandbox
        else {
            return None;
        };
        // The empty directory each process's own root is mounted on (in its namespace only):
        // in the run's private directory, or one of its own for a step outside a run.
        let mut root_dir = None;
        let isolation = match namespaces {
            Namespaces::On { limits } => Some(Isolation {
                limits: *limits,
                root: match (profile, run) {
                    (SandboxProfile::Local, _) => None,
                    (SandboxProfile::Strict, Some((_, dirs))) => Some(dirs.root.clone()),
                    (SandboxProfile::Strict, None) => {
                        let dir = super::run_dir::private_run_dir(&self.inner.temp_root).ok()?;
                        let path = dir.path().to_path_buf();
                        root_dir = Some(std::sync::Arc::new(dir));
                        Some(path)
                    }
                },
                seccomp: *profile == SandboxProfile::Strict,
            }),
            Namespaces::Off { .. } => None,
        };
        let mut policy = Policy::base(*profile);
        policy.allow_exec(&self.inner.binary);
        for p in extra_read {
            policy.allow_read(p);
        }
        for p in extra_exec {
            policy.allow_exec(p);
        }
        for port in connect_ports {
            policy.allow_port(*port);
        }
        let mut run_agent_socket = None;
        if let Some((worktree, dirs)) = run {
            policy.allow_write(worktree);
            policy.allow_write(&dirs.out);
            policy.allow_scratch(&dirs.tmp);
            if let Some(home) = &dirs.home {
                policy.allow_scratch(home);
            }
            if let Some(Isolation { seccomp: true, .. }) = &isolation {
                // UDP is closed: names are resolved over TCP (Go's resolver and glibc's read
                // `options use-vc`), from a copy of the host's resolv.conf shown in its place.
                let copy = dirs.private.join("resolv.conf");
                let mut text = std::fs::read(RESOLV_CONF).unwrap_or_default();
                text.extend_from_slice(b"\noptions use-vc\n");
                if std::fs::write(&copy, text).is_ok() {
                    policy.allow_read(&copy);
                    policy.bind(&copy, RESOLV_CONF);
                    policy.allow_port(53);
                }
            }
            if let (Some(sock), Some(Isolation { root: Some(_), .. })) = (agent_socket, &isolation)
            {
                let place = dirs.private.join(AGENT_SOCKET_NAME);
                policy.bind(sock, &place);
                run_agent_socket = Some(place);
            }
            if let Some(file) = &dirs.cli_config_file {
                policy.allow_read(file);
            }
            if let Some(cache) = &self.inner.plugin_cache_dir {
                policy.allow_write(cache);
            }
        }
        Some(Confinement {
            policy,
            support: Support::Landlock { abi: *abi },
            isolation,
            agent_socket: run_agent_socket,
            _root_dir: root_dir,
        })
    }
}
