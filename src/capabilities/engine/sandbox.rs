//! The Landlock sandbox around every engine process: what it may read, write, run and reach.
//!
//! The engine runs hostile code (an MR's HCL, a provider binary committed to the repository,
//! an `external` program). Landlock, the kernel's unprivileged access-control LSM, lets a
//! process restrict itself and everything it starts; planbot applies a ruleset in the engine's
//! process before its `exec` ([`PreparedSandbox::enter`]), so `init`, `plan`,
//! `show`, `apply` and every provider they start stay inside it. Nothing outside the allow-list
//! exists for them: not `data_dir` (store, mirrors, other jobs), not the config file or secret
//! files, and not `/proc` (Landlock's ptrace rule hides `/proc/<pid>/mem` of planbot, but not
//! `/proc/<pid>/environ`, so `/proc` is simply not in the list).
//!
//! How engine processes are confined ([`SandboxMode`]) and the sandbox of one run: it may write
//! only the run's worktree, its private directory (home, temp, plan file) and the plugin cache,
//! in its own namespaces. A run that must be sandboxed on a kernel without Landlock or without
//! unprivileged namespaces is refused.

use super::run_dir::RunDirs;
use super::{Engine, EngineError};
pub use crate::capabilities::namespaces::Limits;
use crate::capabilities::namespaces::{Jail, NsSupport, Shown, View};
use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort,
    PathBeneath, Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
    ABI,
};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Which rules a run gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The service's: read the system, write only this job's own directories, connect only to
    /// allowed TCP ports.
    Strict,
    /// `planbot plan` on the user's own code: read anything but `/proc`, write only the root,
    /// the run's private directory and the plugin cache; any network.
    Local,
}

/// What the kernel offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Landlock with this ABI version (1 = Linux 5.13 …).
    Landlock { abi: i32 },
    /// No Landlock: not built, not enabled at boot (`lsm=`), or switched off by
    /// `[sandbox] landlock = "off"`.
    Unavailable { reason: &'static str },
}

impl Support {
    /// Ask the kernel (`landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`).
    pub fn probe() -> Support {
        // The `landlock` crate keeps this query private, and `nix` has no Landlock wrapper.
        // SAFETY: the version query takes no pointer the kernel writes to.
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<libc::c_void>(),
                0usize,
                1u32, // LANDLOCK_CREATE_RULESET_VERSION
            )
        };
        if v >= 1 {
            return Support::Landlock { abi: v as i32 };
        }
        match nix::errno::Errno::last() {
            nix::errno::Errno::EOPNOTSUPP => Support::Unavailable {
                reason: "Landlock is built into this kernel but not enabled (add `landlock` to the `lsm=` boot parameter)",
            },
            _ => Support::Unavailable {
                reason: "this kernel has no Landlock (it needs Linux 5.13 or later built with CONFIG_SECURITY_LANDLOCK)",
            },
        }
    }

    /// The ABI version, when there is Landlock.
    pub fn abi(&self) -> Option<i32> {
        match self {
            Support::Landlock { abi } => Some(*abi),
            Support::Unavailable { .. } => None,
        }
    }

    /// What is enforced at this level, in words (`planbot doctor`, `serve --check`, notes).
    pub fn describe(&self) -> String {
        match self {
            Support::Landlock { abi } => {
                let mut parts = vec!["filesystem allow-list"];
                if *abi >= 4 {
                    parts.push("TCP connect allow-list, no TCP bind");
                }
                if *abi >= 6 {
                    parts.push("no signals or abstract sockets outside the sandbox");
                }
                format!("Landlock ABI {abi}: {}", parts.join("; "))
            }
            Support::Unavailable { reason } => format!("no sandbox: {reason}"),
        }
    }
}

/// The allow-list of one run. Paths that do not exist are left out.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Read and execute (directories: everything beneath).
    pub read_exec: Vec<PathBuf>,
    /// Read only.
    pub read: Vec<PathBuf>,
    /// Read, write, create, remove and execute.
    pub write: Vec<PathBuf>,
    /// TCP ports it may connect to; `None`: any (no network rule).
    pub connect_ports: Option<Vec<u16>>,
    /// Write paths that are per-process scratch space: a size-capped tmpfs in the namespaces'
    /// view (the run's `HOME` and temp dir), nothing kept after the process.
    pub scratch: Vec<PathBuf>,
    /// `(source, place)`: a file shown at another place in the namespaces' view (the apply's
    /// SSH agent socket at a per-run path). Nothing without namespaces.
    pub binds: Vec<(PathBuf, PathBuf)>,
}

/// The system directories every engine run may read and execute.
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// The `/etc` files a Go program (the engine, a provider) reads: TLS roots, name resolution,
/// users, time zone. Found by running `init` + `plan` under the sandbox (`tests/it/sandbox.rs`).
const ETC_FILES: &[&str] = &[
    "/etc/ssl/certs",
    "/etc/ca-certificates",
    "/etc/pki/tls/certs",
    "/etc/pki/ca-trust/extracted",
    "/etc/ssl/cert.pem",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/passwd",
    "/etc/group",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/mime.types",
];

/// Devices: `/dev/null` is written, the random sources read. No terminal, and no `/dev/zero`
/// (nothing the engine or a provider runs needs it; `file("/dev/zero")` grew the engine until
/// the OOM killer came).
const DEVICES_READ: &[&str] = &["/dev/urandom", "/dev/random"];

impl Policy {
    /// The base allow-list of `profile`: system directories, the needed `/etc` files and
    /// devices (strict), or every top-level directory but `/proc` (local). The caller adds the
    /// run's own directories with [`Policy::allow_write`].
    pub fn base(profile: Profile) -> Policy {
        let mut p = Policy::default();
        match profile {
            Profile::Strict => {
                p.read_exec.extend(SYSTEM_DIRS.iter().map(PathBuf::from));
                for f in ETC_FILES {
                    p.allow_read(f);
                }
                p.read.extend(DEVICES_READ.iter().map(PathBuf::from));
                p.connect_ports = Some(Vec::new());
            }
            Profile::Local => {
                for entry in std::fs::read_dir("/").into_iter().flatten().flatten() {
                    if entry.file_name() != "proc" {
                        p.read_exec.push(entry.path());
                    }
                }
            }
        }
        p.write.push(PathBuf::from("/dev/null"));
        p
    }

    /// Allow reading `path` and, when it is a symbolic link, what it points to (Landlock
    /// checks the file that is finally opened: `/etc/localtime` → `/usr/share/zoneinfo/…`,
    /// `/etc/resolv.conf` → `/run/systemd/resolve/…`).
    pub fn allow_read(&mut self, path: impl AsRef<Path>) {
        let path = path.as_ref();
        if let Ok(real) = std::fs::canonicalize(path) {
            if real != path {
                self.read.push(real);
            }
        }
        self.read.push(path.to_path_buf());
    }

    /// Allow everything beneath `path` (the run's worktree, home, temp dir, plugin cache).
    pub fn allow_write(&mut self, path: impl Into<PathBuf>) {
        self.write.push(path.into());
    }

    /// Allow reading and executing `path` (the engine binary when it lives outside `/usr`).
    pub fn allow_exec(&mut self, path: impl AsRef<Path>) {
        let path = path.as_ref();
        if let Ok(real) = std::fs::canonicalize(path) {
            if real != path {
                self.read_exec.push(real);
            }
        }
        self.read_exec.push(path.to_path_buf());
    }

    /// Allow everything beneath `path`, as per-process scratch space (a tmpfs in the view).
    pub fn allow_scratch(&mut self, path: impl Into<PathBuf>) {
        let path = path.into();
        self.write.push(path.clone());
        self.scratch.push(path);
    }

    /// Show the file `source` at `place` (namespaces only: Landlock cannot rename).
    pub fn bind(&mut self, source: impl Into<PathBuf>, place: impl Into<PathBuf>) {
        self.binds.push((source.into(), place.into()));
    }

    /// Allow TCP connections to `port` (strict profile; the local one allows any).
    pub fn allow_port(&mut self, port: u16) {
        if let Some(ports) = &mut self.connect_ports {
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
    }

    /// Build the kernel ruleset for this policy (in the parent: it opens the allowed paths).
    pub fn prepare(&self, support: Support) -> Result<PreparedSandbox, SandboxError> {
        let Some(abi_version) = support.abi() else {
            return Err(SandboxError::Unavailable(support.describe()));
        };
        let abi = ABI::from(abi_version);
        let failed = |e: landlock::RulesetError| SandboxError::Ruleset(e.to_string());
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(abi))
            .map_err(failed)?;
        if self.connect_ports.is_some() && abi_version >= 4 {
            ruleset = ruleset
                .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
                .map_err(failed)?;
        }
        if abi_version >= 6 {
            ruleset = ruleset
                .scope(Scope::AbstractUnixSocket | Scope::Signal)
                .map_err(failed)?;
        }
        let mut created = ruleset.create().map_err(failed)?;
        created = created
            .add_rules(path_beneath_rules(
                &self.read_exec,
                AccessFs::from_read(abi),
            ))
            .map_err(failed)?
            .add_rules(path_beneath_rules(
                &self.read,
                AccessFs::ReadFile | AccessFs::ReadDir,
            ))
            .map_err(failed)?
            .add_rules(path_beneath_rules(&self.write, AccessFs::from_all(abi)))
            .map_err(failed)?;
        if let (Some(ports), true) = (&self.connect_ports, abi_version >= 4) {
            for port in ports {
                created = created
                    .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                    .map_err(failed)?;
            }
        }
        Ok(PreparedSandbox {
            ruleset: Some(created),
            jail: None,
            scratch: Vec::new(),
            write_access: AccessFs::from_all(abi),
        })
    }

    /// [`Policy::prepare`], and the namespaces of `isolation` around the process, which starts
    /// in `cwd` (when it is in the view).
    pub fn prepare_isolated(
        &self,
        support: Support,
        isolation: &Isolation,
        cwd: &Path,
    ) -> Result<PreparedSandbox, SandboxError> {
        let mut prepared = self.prepare(support)?;
        let view = match &isolation.root {
            Some(root) => View::Own { root },
            None => View::Host,
        };
        let shown = Shown {
            read: self
                .read_exec
                .iter()
                .chain(&self.read)
                .map(PathBuf::as_path)
                .collect(),
            write: self.write.iter().map(PathBuf::as_path).collect(),
            scratch: self.scratch.iter().map(PathBuf::as_path).collect(),
            binds: self
                .binds
                .iter()
                .map(|(s, d)| (s.as_path(), d.as_path()))
                .collect(),
        };
        let jail = Jail::prepare(&shown, &view, isolation.limits, cwd, isolation.seccomp)
            .map_err(|e| SandboxError::Namespaces(e.to_string()))?;
        prepared.jail = Some(jail);
        // The scratch tmpfs mounts are new inodes the rules above (opened on the host's
        // directories) do not cover: each gets its rule in the child, once mounted.
        prepared.scratch = self
            .scratch
            .iter()
            .map(|p| {
                std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
                    .map_err(|_| SandboxError::Namespaces(format!("{}: a NUL byte", p.display())))
            })
            .collect::<Result<_, _>>()?;
        Ok(prepared)
    }
}

/// The namespaces around each engine process: the limits, and the empty directory its own
/// root is mounted on (`None`: the host's filesystem as it is, for the local profile).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolation {
    pub limits: Limits,
    pub root: Option<PathBuf>,
    /// The seccomp filters: only TCP and UNIX sockets (no UDP: names are then resolved over
    /// TCP; no MPTCP, SCTP, raw, packet, netlink or vsock sockets, which Landlock's TCP rules
    /// do not govern), and the calls an engine never needs refused
    /// (`namespaces::DENIED_CALLS`).
    pub seccomp: bool,
}

/// Why a sandbox could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    #[error("{0}")]
    Unavailable(String),
    #[error("building the Landlock ruleset failed: {0}")]
    Ruleset(String),
    #[error("{0}")]
    Namespaces(String),
}

/// A ruleset ready to be applied to one child process.
pub struct PreparedSandbox {
    ruleset: Option<RulesetCreated>,
    jail: Option<Jail>,
    /// The scratch paths the jail mounts a tmpfs on: allowed in the child after the mounts.
    scratch: Vec<std::ffi::CString>,
    /// What a write path allows (the ABI's every file-system access).
    write_access: BitFlags<AccessFs>,
}

impl PreparedSandbox {
    /// The namespaces the engine's process starts in (`clone` flags; 0: none).
    pub fn namespaces(&self) -> libc::c_int {
        if self.jail.is_some() {
            Jail::NAMESPACES
        } else {
            0
        }
    }

    /// Enter the jail (when prepared with namespaces) and apply the ruleset, in the engine's
    /// process before its `exec`; the errno of the step that failed. The engine then fails to
    /// start (`EPERM`, or that errno) rather than run unconfined.
    ///
    /// # Safety
    /// Only in a child started by [`crate::capabilities::process_start::start`] (with
    /// [`PreparedSandbox::namespaces`]) that is about to `exec`: only system calls on data
    /// prepared before, no allocation; the ruleset used is the child's bitwise copy (its
    /// descriptor is the child's own, and it holds nothing on the heap), so this value is
    /// left as it was for planbot to drop.
    pub unsafe fn enter(&self) -> Result<(), i32> {
        if let Some(jail) = &self.jail {
            jail.enter().map_err(|(_, errno)| errno)?;
        }
        let denied = libc::EPERM;
        let Some(ruleset) = self.ruleset.as_ref() else {
            return Err(denied);
        };
        let mut r: RulesetCreated = std::ptr::read(ruleset);
        // The jail's tmpfs scratch mounts (the run's HOME and temp dir) are in place now:
        // rules on them, as the paths resolve in the view (a rule opened on the host's
        // directory would not reach the tmpfs mounted over it).
        for path in &self.scratch {
            let fd = libc::open(
                path.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return Err(denied);
            }
            let dir = std::os::fd::BorrowedFd::borrow_raw(fd);
            let added = r.add_rule(PathBeneath::new(dir, self.write_access));
            libc::close(fd);
            r = added.map_err(|_| denied)?;
        }
        match r.restrict_self() {
            Ok(status) if status.ruleset != RulesetStatus::NotEnforced => Ok(()),
            _ => Err(denied),
        }
    }
}

// ---- The engine's side: how its processes are confined, and the sandbox of one run ----

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
        profile: Profile,
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
        Self::with_profile(Profile::Strict, support, required, refusal)
    }

    /// `profile` where the kernel offers Landlock, else refused or off as for [`Self::strict`].
    pub fn with_profile(
        profile: Profile,
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
        profile: Profile,
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
                    NsSupport::Unavailable { reason } if required && profile == Profile::Strict => {
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
                if *profile == Profile::Strict && *abi >= 4 {
                    let ports: Vec<String> = connect_ports.iter().map(u16::to_string).collect();
                    text.push_str(&format!(" (TCP ports allowed: {})", ports.join(", ")));
                }
                if *profile == Profile::Strict && matches!(namespaces, Namespaces::On { .. }) {
                    text.push_str(
                        "; only TCP and UNIX sockets (names resolved over TCP), no new namespaces, mounts, keyrings, BPF or tracing",
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
                    (Profile::Local, _) => None,
                    (Profile::Strict, Some((_, dirs))) => Some(dirs.root.clone()),
                    (Profile::Strict, None) => {
                        let dir = super::run_dir::private_run_dir(&self.inner.temp_root).ok()?;
                        let path = dir.path().to_path_buf();
                        root_dir = Some(std::sync::Arc::new(dir));
                        Some(path)
                    }
                },
                seccomp: *profile == Profile::Strict,
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
                // Only TCP and UNIX sockets (no UDP): names are resolved over TCP (Go's resolver
                // and glibc's read `options use-vc`), from a copy of the host's resolv.conf shown
                // in its place.
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
