//! The `listen()` guard of every engine process: only UNIX sockets may listen; a TCP socket
//! never does, bound or not, whatever the family.
//!
//! `listen()` on a TCP socket that was never bound binds it to an ephemeral port of every
//! interface itself (the kernel's autobind), and neither Landlock (ABI ≤ 7 governs `bind()` and
//! `connect()`, not `listen()`) nor a seccomp filter (it sees the descriptor's number, not its
//! family) can refuse that alone: MR code would accept connections from outside the sandbox for
//! its job's lifetime. The providers' go-plugin servers must still listen on UNIX sockets.
//!
//! So each engine process carries one more seccomp filter, which hands every `listen()` to
//! planbot (`SECCOMP_RET_USER_NOTIF`; the filter is installed with
//! `SECCOMP_FILTER_FLAG_NEW_LISTENER` before the engine's `exec`, and its listener descriptor is
//! sent to planbot over a socket pair, then closed in the child). A supervisor thread of
//! planbot, one per engine process (its children share the filter), takes the very socket from
//! the process (`pidfd_getfd`), reads its family (`SO_DOMAIN`) and, for `AF_UNIX`, performs the
//! `listen()` itself on that socket and answers with its result; anything else gets `EPERM` and
//! is never listened on. The call is never let through to run in the process
//! (`SECCOMP_USER_NOTIF_FLAG_CONTINUE` would re-read the descriptor after the check: another
//! thread could swap a TCP socket in meanwhile).
//!
//! Fail closed: without planbot's answer (the listener closed) the kernel answers `ENOSYS`, and
//! a socket planbot cannot take gets `EPERM`. The kernel allows one listener per filter chain,
//! so MR code cannot stack a filter of its own that answers before planbot's (`EBUSY`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The planbot side of one engine process's guard, prepared before its start: the child's end of
/// the socket pair the listener descriptor travels on (the supervisor thread holds the other).
#[derive(Debug)]
pub struct ListenGuard {
    child_end: OwnedFd,
    /// The refusals are expected (the sandbox probe's own TCP `listen()`): logged at debug,
    /// not as a warning an operator would look into.
    expected: Arc<AtomicBool>,
}

/// Why the guard could not be prepared.
#[derive(Debug, thiserror::Error)]
#[error("the engine's listen() guard: {0}")]
pub struct GuardError(String);

impl ListenGuard {
    /// The socket pair, and the supervisor thread on planbot's end. The thread ends once every
    /// process that carries the filter has exited (or, when no process was ever started, once
    /// this guard is dropped).
    pub fn start() -> Result<ListenGuard, GuardError> {
        let mut pair = [0 as RawFd; 2];
        // SAFETY: socketpair writes two descriptors into the array we own.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                pair.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(GuardError(format!(
                "socketpair: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: both descriptors are new and ours.
        let (ours, child_end) =
            unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
        let expected = Arc::new(AtomicBool::new(false));
        let quiet = expected.clone();
        std::thread::Builder::new()
            .name("planbot-listen".into())
            .spawn(move || supervise(ours, quiet))
            .map_err(|e| GuardError(format!("the supervisor thread: {e}")))?;
        Ok(ListenGuard {
            child_end,
            expected,
        })
    }

    /// The processes of this guard refuse on purpose (the sandbox probe tries a TCP
    /// `listen()` to see it refused): their refusals are not warned about.
    pub fn expect_refusals(&self) {
        self.expected.store(true, Ordering::Relaxed);
    }

    /// In the engine's process before its `exec`, after `no_new_privs`: install the
    /// `listen()` filter with a new listener, send the listener to planbot and close it here.
    /// Only system calls on stack data; the errno of the step that failed.
    ///
    /// # Safety
    /// Call only in the started child that is about to `exec` the engine.
    pub unsafe fn install(&self) -> Result<(), i32> {
        let errno = || *libc::__errno_location();
        let program = listen_filter();
        let prog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_ptr() as *mut libc::sock_filter,
        };
        let listener = libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &prog as *const libc::sock_fprog,
        );
        if listener < 0 {
            return Err(errno());
        }
        let listener = listener as RawFd;
        let sent = send_fd(self.child_end.as_raw_fd(), listener);
        // The process keeps no listener: with it, MR code could answer its own `listen()`.
        libc::close(listener);
        sent
    }
}

/// What the guard answers, tried end to end in a probe's child after it entered its jail: a
/// UNIX socket (autobound to an abstract name) must listen, a TCP socket never bound must not.
/// `Err(Some(errno))`: the UNIX socket's `listen()` failed; `Err(None)`: the TCP one listened.
///
/// # Safety
/// Only system calls; call in the probe's started child.
pub unsafe fn probe_in_child() -> Result<(), Option<i32>> {
    let errno = || Some(*libc::__errno_location());
    let unix = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
    if unix < 0 {
        return Err(errno());
    }
    let family = libc::AF_UNIX as libc::sa_family_t;
    // An address of the family alone: the kernel picks an abstract name.
    if libc::bind(
        unix,
        (&family as *const libc::sa_family_t).cast(),
        std::mem::size_of::<libc::sa_family_t>() as libc::socklen_t,
    ) != 0
        || libc::listen(unix, 1) != 0
    {
        return Err(errno());
    }
    let tcp = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
    if tcp < 0 {
        return Err(errno());
    }
    if libc::listen(tcp, 1) == 0 {
        return Err(None);
    }
    Ok(())
}

/// `sock_filter` opcodes: `BPF_LD | BPF_W | BPF_ABS`, `BPF_JMP | BPF_JEQ | BPF_K`, `BPF_RET | BPF_K`.
const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const RET_K: u16 = 0x06;

/// The architecture of this build, as `seccomp_data.arch` names it.
#[cfg(target_arch = "x86_64")]
const ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const ARCH: u32 = 0xc000_00b7;
#[cfg(target_arch = "riscv64")]
const ARCH: u32 = 0xc000_00f3;

/// The filter: `listen` of this architecture goes to planbot, everything else passes (the
/// engine's other filters kill other architectures and fail x32 calls).
fn listen_filter() -> [libc::sock_filter; 6] {
    let stmt = |code, k| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code, k, jt, jf| libc::sock_filter { code, jt, jf, k };
    [
        // seccomp_data: nr at 0, arch at 4.
        stmt(LD_W_ABS, 4),
        jump(JEQ_K, ARCH, 0, 3),
        stmt(LD_W_ABS, 0),
        jump(JEQ_K, libc::SYS_listen as u32, 0, 1),
        stmt(RET_K, libc::SECCOMP_RET_USER_NOTIF),
        stmt(RET_K, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Send `fd` over the socket `over` (one byte and `SCM_RIGHTS`), without allocating.
unsafe fn send_fd(over: RawFd, fd: RawFd) -> Result<(), i32> {
    let mut byte = [1u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one descriptor's control message, aligned as cmsghdr wants.
    let mut control = [0u64; 4];
    let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let cmsg = libc::CMSG_FIRSTHDR(&msg);
    (*cmsg).cmsg_level = libc::SOL_SOCKET;
    (*cmsg).cmsg_type = libc::SCM_RIGHTS;
    (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
    std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    if libc::sendmsg(over, &msg, libc::MSG_NOSIGNAL) == 1 {
        Ok(())
    } else {
        Err(*libc::__errno_location())
    }
}

/// What arrived on planbot's end of the pair.
enum Received {
    Listener(OwnedFd),
    /// A message without a descriptor: nothing to supervise.
    Nothing,
    /// Every copy of the child's end is closed.
    Closed,
}

fn recv_fd(over: RawFd) -> Received {
    let mut byte = [0u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 4];
    // SAFETY: recvmsg into buffers we own; the descriptor read from the control message is
    // new (the kernel installed it for us, close-on-exec).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        let n = libc::recvmsg(over, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n == 0 {
            return Received::Closed;
        }
        if n < 0 {
            return match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => {
                    Received::Nothing
                }
                _ => Received::Closed,
            };
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Received::Nothing;
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
        Received::Listener(OwnedFd::from_raw_fd(fd))
    }
}

/// The supervisor: receives the listener of each process started with the guard (a retried
/// spawn starts another), answers their `listen()` calls, and ends when the pair is closed and
/// every listener reports that no process carries its filter any more.
fn supervise(pair: OwnedFd, expected: Arc<AtomicBool>) {
    let mut pair = Some(pair);
    // Each listener with how many `listen()` calls it refused (logged once, then counted: MR
    // code calling `listen()` in a loop must not flood planbot's log).
    let mut listeners: Vec<(OwnedFd, u64)> = Vec::new();
    loop {
        let mut polled: Vec<libc::pollfd> = pair
            .iter()
            .chain(listeners.iter().map(|(fd, _)| fd))
            .map(|fd| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if polled.is_empty() {
            return;
        }
        // SAFETY: poll on descriptors we own, the array ours.
        let rc = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as _, -1) };
        if rc < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // Nothing sensible is left to do: dropping the listeners makes every later
            // `listen()` of the job fail (`ENOSYS`), which is closed, not open.
            tracing::error!(
                "the engine's listen() guard stopped: poll: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        let mut revents = polled.iter().map(|p| p.revents);
        if pair.is_some() {
            let r = revents.next().unwrap_or(0);
            if r != 0 {
                match recv_fd(pair.as_ref().map(AsRawFd::as_raw_fd).unwrap_or(-1)) {
                    Received::Listener(fd) => listeners.push((fd, 0)),
                    Received::Nothing => {}
                    Received::Closed => pair = None,
                }
            }
        }
        let mut ended = Vec::new();
        for (i, r) in revents.enumerate() {
            if r & libc::POLLIN != 0 {
                let (fd, refused) = &mut listeners[i];
                if let Some(refusal) = answer_one(fd.as_raw_fd()) {
                    if *refused == 0 {
                        refusal.log(expected.load(Ordering::Relaxed));
                    }
                    *refused += 1;
                }
            } else if r != 0 {
                // POLLHUP: no process carries this filter any more.
                ended.push(i);
            }
        }
        for i in ended.into_iter().rev() {
            let (_, refused) = listeners.swap_remove(i);
            if refused > 1 {
                tracing::warn!(
                    refused,
                    "the engine's sandbox refused listen() this many times in one engine process"
                );
            }
        }
    }
}

/// A `listen()` the guard refused, for the log.
enum Refusal {
    /// A socket of another family than `AF_UNIX`.
    Family {
        pid: libc::pid_t,
        family: libc::c_int,
    },
    /// planbot could not take the socket from the process.
    Untaken { pid: libc::pid_t, error: String },
}

impl Refusal {
    /// Log the refusal; an `expected` one (the probe's) at debug.
    fn log(&self, expected: bool) {
        match self {
            Refusal::Family { pid, family } if expected => tracing::debug!(
                pid,
                family,
                "the sandbox probe's TCP listen() was refused, as it must be"
            ),
            Refusal::Family { pid, family } => tracing::warn!(
                pid,
                family,
                "the engine's sandbox refused listen() on a socket that is not a UNIX socket"
            ),
            Refusal::Untaken { pid, error } => tracing::error!(
                pid,
                "the engine's listen() guard could not take the socket ({error}): its listen() is refused"
            ),
        }
    }
}

/// Read one notification from `listener` and answer it; the refusal, when it was one.
fn answer_one(listener: RawFd) -> Option<Refusal> {
    // SAFETY: the kernel wants a zeroed struct; ioctls on our listener with structs we own.
    let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    if unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut req) } != 0 {
        // ENOENT: the process was killed meanwhile; EINTR: try again on the next poll.
        return None;
    }
    let (outcome, refusal) = match decide(listener, &req) {
        Ok(()) => (Ok(()), None),
        Err((errno, refusal)) => (Err(errno), refusal),
    };
    let mut resp = libc::seccomp_notif_resp {
        id: req.id,
        val: 0,
        error: 0,
        flags: 0,
    };
    match outcome {
        Ok(()) => {}
        Err(errno) => resp.error = -errno,
    }
    // ENOENT here too when the process was killed while we decided: nothing left to answer.
    // SAFETY: as above.
    unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp) };
    refusal
}

/// What `listen()` answers: `Ok` when planbot listened on the process's UNIX socket, else the
/// errno (`EPERM` for every other family), with the refusal when the guard refused.
fn decide(listener: RawFd, req: &libc::seccomp_notif) -> Result<(), (i32, Option<Refusal>)> {
    let kernel = |errno: i32| (errno, None);
    if req.data.nr != libc::SYS_listen as i32 {
        return Err(kernel(libc::ENOSYS));
    }
    // The kernel reads both arguments as `int`s.
    let fd = req.data.args[0] as u32 as i32;
    let backlog = req.data.args[1] as u32 as i32;
    let pid = req.pid as libc::pid_t;
    let untaken = |error: String| (libc::EPERM, Some(Refusal::Untaken { pid, error }));
    let pidfd = open_pidfd(pid).map_err(|e| untaken(format!("pidfd_open: {e}")))?;
    // The notification is still pending only while the process that made it waits in it: so
    // the pid was not reused before `pidfd_open`, and the pidfd is that process.
    let mut id = req.id;
    // SAFETY: an ioctl on our listener with a u64 we own.
    if unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &mut id) } != 0 {
        // The process is gone: nothing will read the answer.
        return Err(kernel(libc::EPERM));
    }
    // SAFETY: pidfd_getfd makes a new descriptor for us (close-on-exec), owned from here.
    let socket = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if socket < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EBADF) => kernel(libc::EBADF),
            _ => untaken(format!("pidfd_getfd: {e}")),
        });
    }
    // SAFETY: the descriptor is new and ours.
    let socket = unsafe { OwnedFd::from_raw_fd(socket as RawFd) };
    match socket_domain(&socket) {
        Err(e) => Err(kernel(e)),
        Ok(libc::AF_UNIX) => {
            // SAFETY: listen on the socket we hold: the very socket the process named.
            if unsafe { libc::listen(socket.as_raw_fd(), backlog) } == 0 {
                Ok(())
            } else {
                Err(kernel(
                    std::io::Error::last_os_error()
                        .raw_os_error()
                        .unwrap_or(libc::EPERM),
                ))
            }
        }
        Ok(family) => Err((libc::EPERM, Some(Refusal::Family { pid, family }))),
    }
}

/// A pidfd for the thread `tid` (a notification names the thread that made the call): a
/// thread pidfd (Linux ≥ 6.9), else one of its process (read from `/proc`).
fn open_pidfd(tid: libc::pid_t) -> std::io::Result<OwnedFd> {
    let open = |pid: libc::pid_t, flags: libc::c_uint| {
        // SAFETY: pidfd_open makes a new descriptor for us.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) };
        if fd < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            // SAFETY: new and ours.
            Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
        }
    };
    match open(tid, libc::PIDFD_THREAD) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let status = std::fs::read_to_string(format!("/proc/{tid}/status"))?;
            let tgid = status
                .lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ESRCH))?;
            open(tgid, 0)
        }
        other => other,
    }
}

/// The family of `socket` (`ENOTSOCK` for a descriptor that is not a socket).
fn socket_domain(socket: &OwnedFd) -> Result<libc::c_int, i32> {
    let mut domain: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into an int we own.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&mut domain as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(domain)
    } else {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOTSOCK))
    }
}
