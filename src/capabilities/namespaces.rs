//! Namespaces and resource limits around every engine process, beside Landlock: its own user,
//! mount and PID namespaces, a root that holds only the allow-list, and rlimits.
//!
//! Landlock decides what a path may be used for; it does not govern `connect()` to a pathname
//! UNIX socket, `stat()`, or which pids exist. So each engine process also starts in
//!
//! - a **user namespace** (unprivileged; the job's uid maps to planbot's own, root's to nobody),
//!   which is what lets an unprivileged planbot create the other two;
//! - a **mount namespace** whose root is a small read-only tmpfs holding only the allow-list,
//!   bind-mounted at the same paths (read-only where the list says read): planbot's sockets,
//!   `/run`, the store, other jobs and `/proc` are not there at all, so nothing can be opened,
//!   connected to or `stat()`ed; the run's `HOME` and temp dir are size-capped tmpfs mounts;
//! - a **PID namespace** whose PID 1 is the engine process itself: when it exits, the kernel
//!   kills everything left in the namespace (a `setsid` daemon included); planbot's pids do not
//!   exist inside. As PID 1 it gets from planbot only the signals it handles (the Go engines
//!   handle `SIGTERM`) and `SIGKILL`, and it inherits the orphans of the processes it starts;
//!   they are killed with the namespace;
//! - **rlimits**: tasks (counted per user namespace, so per job), open files, file size and
//!   data (the memory a process can allocate: a Go program keeps working under it, unlike
//!   under `RLIMIT_AS`).
//!
//! Everything is prepared in planbot ([`Jail::prepare`]); the process starts in the namespaces
//! without a copy of planbot ([`crate::capabilities::process_start`]), and until its `exec`
//! ([`Jail::enter`]) only system calls run, no allocation and no lock.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::capabilities::listen_guard::ListenGuard;

/// Per-process limits of every engine process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Tasks (processes and threads) of the job: its own user namespace counts them.
    pub tasks: u64,
    /// Open file descriptors of each process.
    pub open_files: u64,
    /// The largest file a process may write (bytes); a larger write fails with `EFBIG`.
    pub file_size: u64,
    /// Memory a process may allocate (`RLIMIT_DATA`, bytes).
    pub memory: u64,
    /// Size of the run's `HOME` and temp dir (each a tmpfs, bytes).
    pub scratch: u64,
}

const MIB: u64 = 1024 * 1024;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            tasks: 4096,
            open_files: 8192,
            file_size: 4096 * MIB,
            memory: 4096 * MIB,
            scratch: 1024 * MIB,
        }
    }
}

/// Whether this kernel lets an unprivileged process make the namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NsSupport {
    Available,
    Unavailable { reason: String },
}

impl NsSupport {
    /// Try, once per process: a child started in the namespaces maps its ids, mounts a tmpfs
    /// root, pivots into it and installs its filters, as a real run does.
    pub fn probe() -> NsSupport {
        static PROBED: OnceLock<NsSupport> = OnceLock::new();
        PROBED.get_or_init(probe_now).clone()
    }

    /// What is in force, in words (`planbot doctor`, `serve --check`).
    pub fn describe(&self) -> String {
        match self {
            NsSupport::Available => "user, mount and PID namespaces".into(),
            NsSupport::Unavailable { reason } => format!("no namespaces: {reason}"),
        }
    }
}

/// The setup step that failed, for the probe's reason.
#[derive(Debug, Clone, Copy)]
pub enum Stage {
    /// The process could not be started in its new namespaces.
    Namespaces,
    IdMap,
    Limits,
    Mount,
    Pivot,
    Seccomp,
    ListenGuard,
    /// The probe's TCP socket could listen: the guard let it through.
    ListenOpen,
}

fn probe_now() -> NsSupport {
    let unavailable = |reason: String| NsSupport::Unavailable { reason };
    let Ok(dir) = tempfile::tempdir() else {
        return unavailable("no temporary directory to probe in".into());
    };
    let view = View::Own { root: dir.path() };
    let jail = match Jail::prepare(
        &Shown::default(),
        &view,
        Limits::default(),
        Path::new("/"),
        true,
    ) {
        Ok(j) => j,
        Err(e) => return unavailable(e.to_string()),
    };
    // The probe's TCP listen() is refused on purpose: not a warning in the log.
    if let Some(guard) = &jail.listen {
        guard.expect_refusals();
    }
    // The child reports the step that failed here: it shares this memory until it exits.
    let mut failed: Option<(Stage, i32)> = None;
    let mut body = || -> libc::c_int {
        // The jail, then the listen() guard end to end: a UNIX socket listens (through
        // planbot's supervisor), a TCP socket does not.
        let entered = jail.enter().and_then(|()| {
            // SAFETY: only system calls, in the started child.
            match unsafe { crate::capabilities::listen_guard::probe_in_child() } {
                Ok(()) => Ok(()),
                Err(Some(errno)) => Err((Stage::ListenGuard, errno)),
                Err(None) => Err((Stage::ListenOpen, 0)),
            }
        });
        match entered {
            Ok(()) => 0,
            Err(e) => {
                failed = Some(e);
                1
            }
        }
    };
    // SAFETY: the body only makes system calls (`Jail::enter`, the guard's probe) and writes
    // `failed`, which this thread reads once the child has exited.
    let started = unsafe { crate::capabilities::process_start::start(Jail::NAMESPACES, &mut body) };
    let started = match started {
        Ok(s) => s,
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::EPERM);
            return unavailable(reason(Some(Stage::Namespaces), errno));
        }
    };
    let status = loop {
        match crate::capabilities::process_start::wait(&started.pidfd) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => break other,
        }
    };
    if let Some((stage, errno)) = failed {
        return unavailable(reason(Some(stage), errno));
    }
    match status {
        Ok(s) if s.success() => NsSupport::Available,
        Ok(s) => unavailable(format!("the probe process ended with {s}")),
        Err(e) => unavailable(format!("waiting for the probe process: {e}")),
    }
}

/// Why the namespaces cannot be had, and what to change.
fn reason(stage: Option<Stage>, errno: i32) -> String {
    let err = std::io::Error::from_raw_os_error(errno);
    match stage {
        Some(Stage::Namespaces) => format!(
            "the kernel refused unprivileged user namespaces ({err}): allow them (`sysctl kernel.unprivileged_userns_clone=1` on Debian kernels before 6.x, `user.max_user_namespaces` above 0), and in a container allow `clone` with namespace flags in its seccomp profile; under systemd `RestrictNamespaces=` must allow `user mnt pid`"
        ),
        Some(Stage::IdMap) => format!("the new user namespace could not map planbot's user ({err})"),
        Some(Stage::Mount) | Some(Stage::Pivot) => format!(
            "mounts in a new user namespace are refused ({err}): on Ubuntu 23.10 and later, `kernel.apparmor_restrict_unprivileged_userns=1` takes the namespace's rights away (set it to 0, or give planbot an AppArmor profile with `userns`)"
        ),
        Some(Stage::Limits) => format!("the resource limits could not be set ({err})"),
        Some(Stage::Seccomp) => format!("the seccomp filter of the engine (only TCP and UNIX sockets, no namespaces, no kernel keyrings, …) was refused ({err})"),
        Some(Stage::ListenOpen) => "the engine's listen() guard let a TCP socket listen in the probe: MR code could accept connections from outside the sandbox".to_string(),
        Some(Stage::ListenGuard) => format!("the engine's listen() guard (a seccomp filter that hands `listen()` to planbot, `SECCOMP_FILTER_FLAG_NEW_LISTENER`, Linux 5.0 or later) failed ({err}): planbot must be able to take a socket from its engine (`pidfd_getfd`, refused with Yama's `kernel.yama.ptrace_scope = 3`), and in a container its seccomp profile must allow `seccomp`, `pidfd_open` and `pidfd_getfd`"),
        None => format!("the probe failed ({err})"),
    }
}

/// The paths a process is shown in its own root (the sandbox's allow-list).
#[derive(Debug, Default)]
pub struct Shown<'a> {
    /// Bound read-only.
    pub read: Vec<&'a Path>,
    /// Bound read-write.
    pub write: Vec<&'a Path>,
    /// Write paths that get a size-capped tmpfs instead.
    pub scratch: Vec<&'a Path>,
    /// `(source, place)`: a file shown at another place.
    pub binds: Vec<(&'a Path, &'a Path)>,
}

/// What the engine sees of the filesystem.
pub enum View<'a> {
    /// Only the policy's paths, on a root mounted at `root` (an empty directory planbot owns).
    Own { root: &'a Path },
    /// The host's filesystem as it is (the local profile); only the user and PID namespaces.
    Host,
}

/// One step of building the root, in order.
#[derive(Debug)]
enum Mount {
    /// `mkdir` in the new root.
    Dir(CString),
    /// An empty file in the new root (a mount point for a file).
    File(CString),
    /// A symbolic link in the new root, as on the host.
    Symlink { target: CString, at: CString },
    /// Bind `src` at `dst`; read-only with the source's locked flags when `readonly` is set.
    Bind {
        src: CString,
        dst: CString,
        readonly: Option<libc::c_ulong>,
    },
    /// A size-capped tmpfs at `dst`.
    Tmpfs { dst: CString, options: CString },
}

/// Why a jail could not be prepared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("preparing the engine's namespaces failed: {0}")]
pub struct JailError(String);

/// Everything one engine process needs to enter its namespaces, prepared in the parent.
#[derive(Debug)]
pub struct Jail {
    /// `Some` with [`View::Own`]: the directory the new root is mounted on, and its steps.
    root: Option<(CString, Vec<Mount>)>,
    /// Where the engine starts (`/` when it is not in the view).
    cwd: CString,
    /// planbot's uid and gid, mapped into the namespace (read before it: inside, they show
    /// as unmapped until mapped).
    ids: (u32, u32),
    limits: Limits,
    /// The seccomp filters ([`engine_filters`]), applied in the engine's process.
    filters: Option<Vec<seccompiler::BpfProgram>>,
    /// With the filters: the `listen()` guard (only UNIX sockets listen), whose supervisor
    /// thread answers the process's `listen()` calls.
    listen: Option<ListenGuard>,
}

const PATH_SETGROUPS: &[u8] = b"/proc/self/setgroups\0";
const PATH_UID_MAP: &[u8] = b"/proc/self/uid_map\0";
const PATH_GID_MAP: &[u8] = b"/proc/self/gid_map\0";
/// Root's files stay root's, but the job is not root inside: it runs as nobody.
const NOBODY: u32 = 65534;
/// Locked mount flags a read-only remount must keep (`statvfs` names them `ST_*`).
const ST_RELATIME: libc::c_ulong = 4096;

impl Jail {
    /// The jail of one process: every path `shown` bound at its own place (read-only unless
    /// it is a write path), the scratch paths as tmpfs mounts, the binds (a socket at a
    /// per-run path) — or the host's view.
    pub fn prepare(
        shown: &Shown<'_>,
        view: &View<'_>,
        limits: Limits,
        cwd: &Path,
        seccomp: bool,
    ) -> Result<Jail, JailError> {
        let root = match view {
            View::Host => None,
            View::Own { root } => Some((cstr(root)?, plan_mounts(shown, root, limits)?)),
        };
        Ok(Jail {
            root,
            cwd: cstr(cwd)?,
            // SAFETY: getuid and getgid cannot fail.
            ids: unsafe { (libc::getuid(), libc::getgid()) },
            limits,
            filters: if seccomp {
                Some(engine_filters()?)
            } else {
                None
            },
            listen: if seccomp {
                Some(ListenGuard::start().map_err(|e| JailError(e.to_string()))?)
            } else {
                None
            },
        })
    }

    /// The namespaces this jail's process starts in (`clone` flags for
    /// [`crate::capabilities::process_start::start`]).
    pub const NAMESPACES: libc::c_int =
        libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID;

    /// Set the jail up in the process that is to exec the engine, started in
    /// [`Jail::NAMESPACES`] (so PID 1 of its PID namespace: when it exits, the kernel kills
    /// everything left in the namespace, a `setsid` daemon included): its id maps, limits,
    /// root, working directory, seccomp filters and `listen()` guard. Only system calls on
    /// prepared data: nothing allocates.
    pub fn enter(&self) -> Result<(), (Stage, i32)> {
        let errno = || {
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EPERM)
        };
        let check = |stage: Stage, rc: libc::c_long| {
            if rc < 0 {
                Err((stage, errno()))
            } else {
                Ok(())
            }
        };
        // SAFETY (whole block): raw system calls on NUL-terminated buffers prepared in the
        // parent; no allocation, no lock.
        unsafe {
            // A process that is not dumpable has root's `/proc/self` files: make it dumpable to
            // write its own maps (the `exec` that follows decides dumpability anew).
            libc::prctl(libc::PR_SET_DUMPABLE, 1 as libc::c_ulong);
            let mut buf = [0u8; 32];
            write_file(PATH_SETGROUPS, b"deny").map_err(|e| (Stage::IdMap, e))?;
            let map = id_map(&mut buf, self.ids.0);
            write_file(PATH_UID_MAP, map).map_err(|e| (Stage::IdMap, e))?;
            let map = id_map(&mut buf, self.ids.1);
            write_file(PATH_GID_MAP, map).map_err(|e| (Stage::IdMap, e))?;
            let l = self.limits;
            for (res, value) in [
                (libc::RLIMIT_NPROC, l.tasks),
                (libc::RLIMIT_NOFILE, l.open_files),
                (libc::RLIMIT_FSIZE, l.file_size),
                (libc::RLIMIT_DATA, l.memory),
                (libc::RLIMIT_CORE, 0),
            ] {
                let lim = libc::rlimit {
                    rlim_cur: value as libc::rlim_t,
                    rlim_max: value as libc::rlim_t,
                };
                check(Stage::Limits, libc::setrlimit(res, &lim) as _)?;
            }
            if let Some((root, mounts)) = &self.root {
                self.build_root(root, mounts)?;
            }
            if libc::chdir(self.cwd.as_ptr()) != 0 {
                libc::chdir(c"/".as_ptr());
            }
        }
        if let Some(filters) = &self.filters {
            // Two system calls each (no_new_privs, seccomp) on the prepared programs.
            for filter in filters {
                seccompiler::apply_filter(filter).map_err(|_| (Stage::Seccomp, errno()))?;
            }
        }
        if let Some(guard) = &self.listen {
            // SAFETY: we are the started child about to exec the engine; no_new_privs is set.
            unsafe { guard.install() }.map_err(|e| (Stage::ListenGuard, e))?;
        }
        Ok(())
    }

    /// Mount the tmpfs root on `root`, build it, pivot into it and make it read-only.
    unsafe fn build_root(&self, root: &CString, mounts: &[Mount]) -> Result<(), (Stage, i32)> {
        let errno = || {
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EPERM)
        };
        let mnt = |src: *const libc::c_char,
                   dst: *const libc::c_char,
                   fs: *const libc::c_char,
                   flags: libc::c_ulong,
                   data: *const libc::c_char| {
            if libc::mount(src, dst, fs, flags, data.cast()) != 0 {
                Err((Stage::Mount, errno()))
            } else {
                Ok(())
            }
        };
        let null = std::ptr::null();
        mnt(
            null,
            c"/".as_ptr(),
            null,
            libc::MS_REC | libc::MS_PRIVATE,
            null,
        )?;
        mnt(
            c"tmpfs".as_ptr(),
            root.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            c"size=4m,nr_inodes=4096,mode=0755".as_ptr(),
        )?;
        for m in mounts {
            match m {
                Mount::Dir(p) => {
                    if libc::mkdir(p.as_ptr(), 0o755) != 0 && errno() != libc::EEXIST {
                        return Err((Stage::Mount, errno()));
                    }
                }
                Mount::File(p) => {
                    let fd = libc::open(
                        p.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd < 0 {
                        return Err((Stage::Mount, errno()));
                    }
                    libc::close(fd);
                }
                Mount::Symlink { target, at } => {
                    if libc::symlink(target.as_ptr(), at.as_ptr()) != 0 && errno() != libc::EEXIST {
                        return Err((Stage::Mount, errno()));
                    }
                }
                Mount::Bind { src, dst, readonly } => {
                    mnt(
                        src.as_ptr(),
                        dst.as_ptr(),
                        null,
                        libc::MS_BIND | libc::MS_REC,
                        null,
                    )?;
                    if let Some(locked) = readonly {
                        let flags = libc::MS_BIND
                            | libc::MS_REMOUNT
                            | libc::MS_RDONLY
                            | libc::MS_NOSUID
                            | locked;
                        mnt(null, dst.as_ptr(), null, flags, null)?;
                    }
                }
                Mount::Tmpfs { dst, options } => mnt(
                    c"tmpfs".as_ptr(),
                    dst.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    options.as_ptr(),
                )?,
            }
        }
        let pivot = |rc: libc::c_long| {
            if rc != 0 {
                Err((Stage::Pivot, errno()))
            } else {
                Ok(())
            }
        };
        pivot(libc::chdir(root.as_ptr()) as _)?;
        pivot(libc::syscall(
            libc::SYS_pivot_root,
            c".".as_ptr(),
            c".".as_ptr(),
        ))?;
        pivot(libc::umount2(c".".as_ptr(), libc::MNT_DETACH) as _)?;
        pivot(libc::chdir(c"/".as_ptr()) as _)?;
        let ro = libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
        pivot(libc::mount(null, c"/".as_ptr(), null, ro, std::ptr::null()) as _)?;
        Ok(())
    }
}

/// System calls an engine process never needs and that a hostile one would use against the
/// kernel or its neighbours: new namespaces and mounts (a nested user namespace is where most
/// unprivileged kernel exploits start), kernel keyrings, BPF, perf events, `userfaultfd`,
/// tracing or reading other processes, modules, `kexec`, clocks, swap, accounting, the kernel
/// log and file handles. They fail with `EPERM`, as in Docker's default seccomp profile (which
/// denies these to a process without capabilities); `deploy/seccomp/planbot.json` is this list
/// less the calls planbot itself needs to build the sandbox.
pub const DENIED_CALLS: &[(&str, libc::c_long)] = &[
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("open_tree", libc::SYS_open_tree),
    ("move_mount", libc::SYS_move_mount),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("syslog", libc::SYS_syslog),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("quotactl", libc::SYS_quotactl),
    ("io_uring_setup", libc::SYS_io_uring_setup),
];

/// The calls of [`DENIED_CALLS`] that planbot itself makes to build an engine's namespaces:
/// a container running planbot must allow them (its engines never get them).
pub const SANDBOX_BUILDING_CALLS: &[&str] = &["mount", "umount2", "pivot_root"];

/// The namespace flags of `clone`: a process of the job may not make a namespace that way
/// either.
const CLONE_NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWCGROUP,
];

/// The socket types an engine process may make with `AF_INET`/`AF_INET6`: a stream, with or
/// without `SOCK_NONBLOCK` and `SOCK_CLOEXEC` (the kernel refuses any other flag with `EINVAL`).
const STREAM_TYPES: [libc::c_int; 4] = [
    libc::SOCK_STREAM,
    libc::SOCK_STREAM | libc::SOCK_NONBLOCK,
    libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
    libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
];

/// The protocols of those streams: the default (TCP) and TCP by name. Not MPTCP (262), whose
/// sockets Landlock's TCP port rules do not govern, nor SMC (256).
const STREAM_PROTOCOLS: [libc::c_int; 2] = [0, libc::IPPROTO_TCP];

/// The seccomp filters of an engine process (applied in order, all stay):
///
/// 1. **Sockets by allow-list**: `socket()` succeeds only for `AF_UNIX` (the providers'
///    go-plugin gRPC; pathname sockets exist only in the job's own view, abstract ones are
///    scoped by Landlock ABI ≥ 6) and for `AF_INET`/`AF_INET6` streams of TCP, the one
///    protocol Landlock's port rules govern; `socketpair()` only for `AF_UNIX`. Everything
///    else — UDP (names are resolved over TCP: the view's resolv.conf says `options use-vc`),
///    MPTCP, SCTP, SMC, raw, packet, netlink, vsock, `SOCK_SEQPACKET`, any other family — fails
///    with `EPERM`, whatever the kernel has built in. The arguments are compared as the 32-bit
///    `int`s the kernel reads. The same filter fails [`DENIED_CALLS`] and a `clone` with a
///    namespace flag with `EPERM` (`io_uring_setup` is among them: io_uring makes sockets past
///    seccomp). There is no `socketcall` on the architectures seccompiler builds for
///    (x86_64, aarch64, riscv64), and a 32-bit x86 call (`int 0x80`) kills the process (the
///    filter's architecture check).
/// 2. `clone3` answers `ENOSYS`, since its flags cannot be read by a filter, so that libc falls
///    back to `clone`.
/// 3. On x86_64, the x32 system calls (numbers with bit 30 set: the same calls under other
///    numbers, with the same architecture in the filter's view) fail with `EPERM`, so that none
///    of the above can be had under an x32 number on a kernel built with x32.
///
/// Everything else is allowed.
pub fn engine_filters() -> Result<Vec<seccompiler::BpfProgram>, JailError> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond,
        SeccompFilter, SeccompRule, TargetArch,
    };
    let failed =
        |e: seccompiler::BackendError| JailError(format!("the engine's seccomp filter: {e}"));
    let cond = |arg: u8, op: Op, value: libc::c_int| -> Result<Cond, JailError> {
        Cond::new(arg, Len::Dword, op, value as u32 as u64).map_err(failed)
    };
    let rule = |conds: Vec<Cond>| SeccompRule::new(conds).map_err(failed);
    // The rules name what is refused (a rule matches when all its conditions hold), so the
    // allow-list is written as its complement.
    let mut socket = vec![rule(vec![
        cond(0, Op::Ne, libc::AF_UNIX)?,
        cond(0, Op::Ne, libc::AF_INET)?,
        cond(0, Op::Ne, libc::AF_INET6)?,
    ])?];
    for family in [libc::AF_INET, libc::AF_INET6] {
        let mut not_a_stream = vec![cond(0, Op::Eq, family)?];
        for ty in STREAM_TYPES {
            not_a_stream.push(cond(1, Op::Ne, ty)?);
        }
        socket.push(rule(not_a_stream)?);
        let mut not_tcp = vec![cond(0, Op::Eq, family)?];
        for protocol in STREAM_PROTOCOLS {
            not_tcp.push(cond(2, Op::Ne, protocol)?);
        }
        socket.push(rule(not_tcp)?);
    }
    let socketpair = vec![rule(vec![cond(0, Op::Ne, libc::AF_UNIX)?])?];
    let flag = |flag: libc::c_int| -> Result<SeccompRule, JailError> {
        SeccompRule::new(vec![Cond::new(
            0,
            Len::Qword,
            Op::MaskedEq(flag as u64),
            flag as u64,
        )
        .map_err(failed)?])
        .map_err(failed)
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| JailError(format!("the engine's seccomp filter: {e}")))?;
    let mut denied: std::collections::BTreeMap<libc::c_long, Vec<SeccompRule>> =
        DENIED_CALLS.iter().map(|(_, nr)| (*nr, vec![])).collect();
    denied.insert(libc::SYS_socket, socket);
    denied.insert(libc::SYS_socketpair, socketpair);
    denied.insert(
        libc::SYS_clone,
        CLONE_NAMESPACE_FLAGS
            .iter()
            .map(|f| flag(*f))
            .collect::<Result<_, _>>()?,
    );
    let program = |rules, answer: i32| -> Result<seccompiler::BpfProgram, JailError> {
        SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(answer as u32),
            arch,
        )
        .map_err(failed)?
        .try_into()
        .map_err(|e: seccompiler::BackendError| failed(e))
    };
    let mut filters = vec![
        program(denied, libc::EPERM)?,
        program(
            [(libc::SYS_clone3, vec![])].into_iter().collect(),
            libc::ENOSYS,
        )?,
    ];
    if cfg!(target_arch = "x86_64") {
        filters.push(x32_filter());
    }
    Ok(filters)
}

/// Bit 30 of an x86_64 system call number: the x32 ABI's calls.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// A filter that fails every x32 system call with `EPERM` (seccompiler matches numbers, and an
/// x32 call reports the x86_64 architecture under another number). Other architectures pass
/// (the first filter kills them).
fn x32_filter() -> seccompiler::BpfProgram {
    use seccompiler::sock_filter;
    // BPF_LD | BPF_W | BPF_ABS, BPF_JMP | BPF_JEQ | BPF_K, BPF_JMP | BPF_JGE | BPF_K, BPF_RET.
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    /// `AUDIT_ARCH_X86_64`.
    const ARCH_X86_64: u32 = 0xc000_003e;
    let stmt = |code, k| sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code, k, jt, jf| sock_filter { code, jt, jf, k };
    vec![
        // seccomp_data: nr at 0, arch at 4.
        stmt(LD_W_ABS, 4),
        jump(JEQ_K, ARCH_X86_64, 0, 3),
        stmt(LD_W_ABS, 0),
        jump(JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(RET_K, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(RET_K, libc::SECCOMP_RET_ALLOW),
    ]
}

/// `"INSIDE OUTSIDE 1\n"` for `id` in `buf`, without allocating: the job keeps planbot's id,
/// except that root's runs as nobody inside (root's files stay root's, but the job holds no
/// capability in its namespace after `exec`).
fn id_map(buf: &mut [u8; 32], id: u32) -> &[u8] {
    fn put(buf: &mut [u8], at: usize, mut n: u32) -> usize {
        let mut digits = [0u8; 10];
        let mut len = 0;
        loop {
            digits[len] = b'0' + (n % 10) as u8;
            len += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for i in 0..len {
            buf[at + i] = digits[len - 1 - i];
        }
        at + len
    }
    let inside = if id == 0 { NOBODY } else { id };
    let mut at = put(buf, 0, inside);
    buf[at] = b' ';
    at = put(buf, at + 1, id);
    buf[at..at + 3].copy_from_slice(b" 1\n");
    &buf[..at + 3]
}

/// `write` the whole of `data` to the file at `path` (NUL-terminated), or the errno.
unsafe fn write_file(path: &[u8], data: &[u8]) -> Result<(), i32> {
    let fd = libc::open(path.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(*libc::__errno_location());
    }
    let n = libc::write(fd, data.as_ptr().cast(), data.len());
    let err = *libc::__errno_location();
    libc::close(fd);
    if n == data.len() as isize {
        Ok(())
    } else {
        Err(err)
    }
}

fn cstr(p: &Path) -> Result<CString, JailError> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| JailError(format!("{} holds a NUL byte", p.display())))
}

/// How a path of the policy is shown in the new root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Access {
    Read,
    Write,
}

/// The steps that build the new root on `root` from `shown`: each existing path bound at its
/// own place (parents first; a path inside an already bound one is bound over itself), missing
/// parents made as directories of the tmpfs, symbolic links recreated as links.
fn plan_mounts(shown: &Shown<'_>, root: &Path, limits: Limits) -> Result<Vec<Mount>, JailError> {
    use std::collections::BTreeMap;
    // Path → (access, source). A write path wins over a read path of the same place.
    let mut entries: BTreeMap<PathBuf, (Access, PathBuf)> = BTreeMap::new();
    let mut add = |path: &Path, access: Access, src: &Path| {
        let e = entries
            .entry(path.to_path_buf())
            .or_insert((access, src.to_path_buf()));
        if access > e.0 {
            *e = (access, src.to_path_buf());
        }
    };
    for p in &shown.read {
        add(p, Access::Read, p);
    }
    for p in &shown.write {
        add(p, Access::Write, p);
    }
    for (src, dst) in &shown.binds {
        add(dst, Access::Write, src);
    }
    let scratch: std::collections::BTreeSet<&Path> = shown.scratch.iter().copied().collect();
    let inner = |p: &Path| -> Result<CString, JailError> {
        let rel = p.strip_prefix("/").unwrap_or(p);
        cstr(&root.join(rel))
    };
    let mut steps = Vec::new();
    let mut made: std::collections::BTreeSet<PathBuf> = std::collections::BTreeSet::new();
    let mut bound: Vec<PathBuf> = Vec::new();
    for (path, (access, src)) in &entries {
        if !path.is_absolute() {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(src) else {
            continue; // paths that do not exist are left out
        };
        let under_bound = bound.iter().any(|b| path.starts_with(b) && path != b);
        if !under_bound {
            // Missing parents become tmpfs directories (never inside a bound path).
            let mut parent = PathBuf::from("/");
            for c in path
                .parent()
                .into_iter()
                .flat_map(|p| p.components())
                .skip(1)
            {
                parent.push(c);
                if made.insert(parent.clone()) {
                    steps.push(Mount::Dir(inner(&parent)?));
                }
            }
        }
        if meta.file_type().is_symlink() && src == path {
            if !under_bound {
                let target = std::fs::read_link(path)
                    .map_err(|e| JailError(format!("{}: {e}", path.display())))?;
                steps.push(Mount::Symlink {
                    target: cstr(&target)?,
                    at: inner(path)?,
                });
            }
            continue;
        }
        let dst = inner(path)?;
        if scratch.contains(path.as_path()) {
            if !under_bound && made.insert(path.clone()) {
                steps.push(Mount::Dir(dst.clone()));
            }
            let options = format!("size={},mode=0700", limits.scratch);
            steps.push(Mount::Tmpfs {
                dst,
                options: CString::new(options).expect("no NUL"),
            });
            bound.push(path.clone());
            continue;
        }
        let is_dir = std::fs::metadata(src).map(|m| m.is_dir()).unwrap_or(false);
        if !under_bound {
            if is_dir {
                if made.insert(path.clone()) {
                    steps.push(Mount::Dir(dst.clone()));
                }
            } else {
                steps.push(Mount::File(dst.clone()));
            }
        }
        let readonly = match access {
            Access::Write => None,
            Access::Read => Some(locked_flags(src)?),
        };
        steps.push(Mount::Bind {
            src: cstr(src)?,
            dst,
            readonly,
        });
        bound.push(path.clone());
    }
    Ok(steps)
}

/// The flags of the mount `path` is on that a read-only remount in a user namespace must
/// keep (the kernel refuses to drop `nosuid`, `nodev`, `noexec` or the atime mode).
fn locked_flags(path: &Path) -> Result<libc::c_ulong, JailError> {
    let c = cstr(path)?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs fills the struct we own.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(JailError(format!(
            "statvfs {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        )));
    }
    let f = st.f_flag;
    let mut flags: libc::c_ulong = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
    ] {
        if f & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    flags |= if f & libc::ST_NOATIME != 0 {
        libc::MS_NOATIME
    } else if f & ST_RELATIME != 0 {
        libc::MS_RELATIME
    } else {
        libc::MS_STRICTATIME
    };
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_maps_keep_the_id_but_roots_is_nobody_inside() {
        let mut buf = [0u8; 32];
        assert_eq!(id_map(&mut buf, 1000), b"1000 1000 1\n");
        assert_eq!(id_map(&mut buf, 0), b"65534 0 1\n");
        assert_eq!(id_map(&mut buf, u32::MAX), b"4294967295 4294967295 1\n");
    }
}
