//! One engine process: started without a copy of planbot ([`process_start`]) in its run's
//! cgroup, process group and sandbox, its output on two pipes, waited for through its pidfd.

use super::sandbox::PreparedSandbox;
use crate::capabilities::process_start::{self, Started};
use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::ExitStatus;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// The `oom_score_adj` of every engine process: the most there is, so the kernel's OOM killer
/// picks an engine (or a provider it started) before planbot. Raising it needs no privilege.
pub const ENGINE_OOM_SCORE_ADJ: &[u8] = b"1000";

/// Raise this process's `oom_score_adj` to [`ENGINE_OOM_SCORE_ADJ`] (in the engine's process
/// before its `exec`: open, write, close, nothing that allocates). An error fails the spawn: an engine
/// the OOM killer would spare over planbot does not run.
fn raise_oom_score() -> std::io::Result<()> {
    // SAFETY: system calls on a static NUL-terminated path and a static buffer.
    unsafe {
        let fd = libc::open(
            c"/proc/self/oom_score_adj".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = libc::write(
            fd,
            ENGINE_OOM_SCORE_ADJ.as_ptr().cast(),
            ENGINE_OOM_SCORE_ADJ.len(),
        );
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if n == ENGINE_OOM_SCORE_ADJ.len() as isize {
            Ok(())
        } else {
            Err(err)
        }
    }
}

/// How one engine process is started.
pub struct Launch<'a> {
    /// The engine binary, resolved (an absolute path, or one relative to planbot's directory).
    pub program: &'a Path,
    pub args: &'a [OsString],
    /// Its whole environment.
    pub env: &'a BTreeMap<String, OsString>,
    /// Its working directory (in a jail, the jail's own takes over once it is entered).
    pub dir: &'a Path,
    /// The run's cgroup's `cgroup.procs` descriptors the process writes itself into first.
    pub cgroup: &'a [RawFd],
    /// The sandbox it enters before its `exec` (`None`: none).
    pub sandbox: Option<&'a PreparedSandbox>,
}

/// A running engine process (every engine process planbot starts is one; tests start their
/// confined children the same way).
pub struct EngineChild {
    pid: i32,
    /// `None` once handed to the reaper of an abandoned child.
    pidfd: Option<AsyncFd<OwnedFd>>,
    exited: Option<ExitStatus>,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
}

/// The step of the child's start that failed.
#[derive(Clone, Copy)]
enum Failed {
    Setup(i32),
    Sandbox(i32),
    Exec(i32),
}

/// Why an engine process did not start.
#[derive(Debug)]
pub enum StartError {
    /// Its sandbox (the namespaces or the Landlock ruleset) was refused.
    Sandbox(io::Error),
    /// Anything else (the binary not found, `ETXTBSY`, no pipe).
    Io(io::Error),
}

impl StartError {
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            StartError::Sandbox(e) | StartError::Io(e) => e.raw_os_error(),
        }
    }
}

impl EngineChild {
    /// Start `launch`'s process: stdin `/dev/null`, stdout and stderr piped. Returns once it
    /// runs the engine (or failed before).
    pub fn spawn(launch: &Launch<'_>) -> Result<EngineChild, StartError> {
        let io = StartError::Io;
        let exec = Exec::of(launch).map_err(io)?;
        let null = above_stdio(open_null().map_err(io)?).map_err(io)?;
        let (out_r, out_w) = pipe_pair().map_err(io)?;
        let (err_r, err_w) = pipe_pair().map_err(io)?;
        let fds = [null.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()];
        let namespaces = launch.sandbox.map(|s| s.namespaces()).unwrap_or(0);
        let mut failed: Option<Failed> = None;
        let mut body = || -> libc::c_int {
            // SAFETY: system calls on the descriptors and strings prepared above; the child
            // writes `failed` (read by planbot once it has exec'ed or exited) and nothing else
            // of planbot's memory.
            unsafe {
                let errno = || *libc::__errno_location();
                // First, before anything: into the run's cgroup (no instant of the engine
                // outside it), then the OOM killer's first choice.
                if super::cgroup::enter(launch.cgroup).is_err()
                    || raise_oom_score().is_err()
                    || libc::setpgid(0, 0) != 0
                {
                    failed = Some(Failed::Setup(errno()));
                    return 127;
                }
                for (fd, to) in fds.iter().zip(0..) {
                    if libc::dup2(*fd, to) < 0 {
                        failed = Some(Failed::Setup(errno()));
                        return 127;
                    }
                }
                if libc::chdir(exec.dir.as_ptr()) != 0 {
                    failed = Some(Failed::Setup(errno()));
                    return 127;
                }
                if let Some(sandbox) = launch.sandbox {
                    if let Err(e) = sandbox.enter() {
                        failed = Some(Failed::Sandbox(e));
                        return 127;
                    }
                }
                libc::execve(
                    exec.program.as_ptr(),
                    exec.argv_ptrs.as_ptr(),
                    exec.envp_ptrs.as_ptr(),
                );
                failed = Some(Failed::Exec(errno()));
                127
            }
        };
        // SAFETY: the body only makes system calls on data prepared above and writes `failed`.
        let started = unsafe { process_start::start(namespaces, &mut body) };
        drop((null, out_w, err_w));
        let Started { pid, pidfd } = started.map_err(|e| match namespaces {
            0 => StartError::Io(e),
            _ => StartError::Sandbox(e),
        })?;
        if let Some(failed) = failed {
            // It exited: reap it.
            let _ = process_start::wait(&pidfd);
            return Err(match failed {
                Failed::Setup(e) | Failed::Exec(e) => {
                    StartError::Io(io::Error::from_raw_os_error(e))
                }
                Failed::Sandbox(e) => StartError::Sandbox(io::Error::from_raw_os_error(e)),
            });
        }
        EngineChild::adopt(pid, pidfd, out_r, err_r)
    }

    /// The started process's handle: its pidfd registered with the runtime, its output pipes.
    fn adopt(
        pid: i32,
        pidfd: OwnedFd,
        out_r: OwnedFd,
        err_r: OwnedFd,
    ) -> Result<EngineChild, StartError> {
        let io = StartError::Io;
        // SAFETY: the pidfd is owned by the `AsyncFd` from here until it is dropped or taken
        // back with `into_inner`.
        let registered =
            unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) };
        let pidfd = match registered {
            Ok(pidfd) => pidfd,
            Err(e) => {
                let (pidfd, err) = e.into_parts();
                let _ = process_start::signal(&pidfd, libc::SIGKILL);
                let _ = process_start::wait(&pidfd);
                return Err(io(err));
            }
        };
        // From here on, dropping `child` kills and reaps the process.
        let mut child = EngineChild {
            pid,
            pidfd: Some(pidfd),
            exited: None,
            stdout: None,
            stderr: None,
        };
        child.stdout = Some(pipe::Receiver::from_owned_fd(out_r).map_err(io)?);
        child.stderr = Some(pipe::Receiver::from_owned_fd(err_r).map_err(io)?);
        Ok(child)
    }

    /// Its pid in planbot's PID namespace (its process group's id too).
    pub fn id(&self) -> i32 {
        self.pid
    }

    /// Wait until it exits (cancel-safe), and reap it.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.exited {
            return Ok(status);
        }
        let pidfd = self.pidfd.as_ref().expect("a running child has its pidfd");
        loop {
            let mut ready = pidfd.readable().await?;
            match process_start::try_wait(pidfd.get_ref())? {
                Some(status) => {
                    self.exited = Some(status);
                    return Ok(status);
                }
                None => ready.clear_ready(),
            }
        }
    }
}

impl Drop for EngineChild {
    /// A child never waited for (its run abandoned) is killed, and reaped on a thread of its
    /// own (it exits at once).
    fn drop(&mut self) {
        if self.exited.is_some() {
            return;
        }
        let Some(pidfd) = self.pidfd.take() else {
            return;
        };
        let pidfd = pidfd.into_inner();
        let _ = process_start::signal(&pidfd, libc::SIGKILL);
        let _ = std::thread::Builder::new()
            .name("planbot-reap".into())
            .spawn(move || process_start::wait(&pidfd));
    }
}

/// What the child's `execve` and `chdir` read, made before it starts (it may not allocate).
struct Exec {
    program: CString,
    dir: CString,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
    /// The strings the pointers point into.
    _strings: (Vec<CString>, Vec<CString>),
}

impl Exec {
    fn of(launch: &Launch<'_>) -> io::Result<Exec> {
        let program = cstring(absolute(launch.program)?.as_os_str())?;
        let argv: Vec<CString> = std::iter::once(Ok(program.clone()))
            .chain(launch.args.iter().map(|a| cstring(a)))
            .collect::<io::Result<_>>()?;
        let envp: Vec<CString> = launch
            .env
            .iter()
            .map(|(k, v)| {
                let mut kv = OsString::from(k);
                kv.push("=");
                kv.push(v);
                cstring(&kv)
            })
            .collect::<io::Result<_>>()?;
        Ok(Exec {
            program,
            dir: cstring(launch.dir.as_os_str())?,
            argv_ptrs: null_terminated(&argv),
            envp_ptrs: null_terminated(&envp),
            _strings: (argv, envp),
        })
    }
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: a NUL byte", s.to_string_lossy()),
        )
    })
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// The binary as an absolute path (the child changes its directory before `exec`).
fn absolute(program: &Path) -> io::Result<std::path::PathBuf> {
    if program.is_absolute() {
        Ok(program.to_path_buf())
    } else {
        Ok(std::env::current_dir()?.join(program))
    }
}

fn open_null() -> io::Result<OwnedFd> {
    // SAFETY: open of a static NUL-terminated path; the descriptor is ours.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pipe (read end, write end), both close-on-exec and above the standard descriptors.
fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(r)?, above_stdio(w)?))
}

/// `fd` moved above 0–2 when it is one of them (planbot started with a standard descriptor
/// closed), so that the child's `dup2`s onto 0–2 cannot overwrite one another.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: fcntl duplicates a descriptor we hold into a new one we own.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}
