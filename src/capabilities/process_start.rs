//! Starting a process without copying planbot: `clone(CLONE_VM | CLONE_VFORK)` onto a stack of
//! its own, into new namespaces when asked, with a pidfd to wait on (what `posix_spawn` does).
//!
//! A `fork` copies planbot's page tables into every child, and each page planbot then writes
//! while the copy lives is copied again: an engine process used to be three such copies (the
//! namespace's parent, its init and the engine before its `exec`), two of them alive for the
//! whole step. Here the child shares planbot's memory while the calling thread waits, runs only
//! system calls on data prepared before, and `exec`s (or `_exit`s): nothing is copied, and the
//! child is PID 1 of its new PID namespace itself, so the engine needs no init beside it.

use std::ffi::c_void;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// The child's own stack (the setup runs Landlock's and seccomp's calls on it).
const STACK_SIZE: usize = 256 * 1024;

/// A started child: its pid (in planbot's PID namespace) and a pidfd that becomes readable when
/// it exits (and waits for it with `waitid(P_PIDFD)`).
#[derive(Debug)]
pub struct Started {
    pub pid: i32,
    pub pidfd: OwnedFd,
}

/// What the trampoline hands the body.
struct Payload<'a> {
    body: &'a mut dyn FnMut() -> libc::c_int,
}

/// Start a child that runs `body` and then exits with its result, unless `body` `exec`s.
/// `namespaces` are `CLONE_NEW*` flags (0: none). Returns once the child has `exec`ed or
/// exited. Every signal is blocked in the calling thread meanwhile, and the child starts with
/// every handler at its default and an empty mask (planbot's handlers must not run in it).
///
/// # Safety
/// `body` runs in a process that shares planbot's memory while other threads of planbot go on
/// running: it may only make system calls on data prepared before (no allocation, no lock, no
/// write to anything planbot reads later except through values it owns), and must `exec` or
/// return.
pub unsafe fn start(
    namespaces: libc::c_int,
    body: &mut dyn FnMut() -> libc::c_int,
) -> io::Result<Started> {
    let page = match libc::sysconf(libc::_SC_PAGESIZE) {
        n if n > 0 => n as usize,
        _ => 4096,
    };
    let len = STACK_SIZE + page;
    let stack = libc::mmap(
        std::ptr::null_mut(),
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
        -1,
        0,
    );
    if stack == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // The lowest page guards against the stack running over into planbot's memory.
    if libc::mprotect(stack, page, libc::PROT_NONE) != 0 {
        let err = io::Error::last_os_error();
        libc::munmap(stack, len);
        return Err(err);
    }
    let top = (stack as usize + len) & !15;
    let mut all: libc::sigset_t = std::mem::zeroed();
    let mut old: libc::sigset_t = std::mem::zeroed();
    libc::sigfillset(&mut all);
    libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    let mut payload = Payload { body };
    let mut pidfd: libc::c_int = -1;
    let pid = libc::clone(
        trampoline,
        top as *mut c_void,
        libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD | namespaces,
        (&mut payload as *mut Payload).cast(),
        &mut pidfd as *mut libc::c_int,
    );
    let err = io::Error::last_os_error();
    libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    // The child has exec'ed or exited (CLONE_VFORK): its stack is no longer in use.
    libc::munmap(stack, len);
    if pid < 0 {
        return Err(err);
    }
    Ok(Started {
        pid,
        pidfd: OwnedFd::from_raw_fd(pidfd),
    })
}

/// The child's first code: default handlers, an empty signal mask, then the body.
extern "C" fn trampoline(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Payload` of `start`, alive until the child execs or exits; only
    // system calls below.
    unsafe {
        for sig in 1..=libc::SIGRTMAX() {
            let mut action: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut action) != 0 {
                continue;
            }
            let handled =
                action.sa_sigaction != libc::SIG_DFL && action.sa_sigaction != libc::SIG_IGN;
            // Rust ignores SIGPIPE in planbot; a child gets it back (as `std::process` does).
            let pipe_ignored = sig == libc::SIGPIPE && action.sa_sigaction == libc::SIG_IGN;
            if handled || pipe_ignored {
                action.sa_sigaction = libc::SIG_DFL;
                action.sa_flags = 0;
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        let payload = &mut *(arg as *mut Payload);
        let code = (payload.body)();
        libc::_exit(code)
    }
}

/// How a child ended, once: `None` while it runs. Reaps it.
pub fn try_wait(pidfd: &OwnedFd) -> io::Result<Option<std::process::ExitStatus>> {
    waitid(pidfd, libc::WNOHANG)
}

/// Wait until the child ends (blocking the thread), and reap it.
pub fn wait(pidfd: &OwnedFd) -> io::Result<std::process::ExitStatus> {
    waitid(pidfd, 0)?.ok_or_else(|| io::Error::other("waitid returned no child"))
}

fn waitid(pidfd: &OwnedFd, flags: libc::c_int) -> io::Result<Option<std::process::ExitStatus>> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::ExitStatusExt;
    // SAFETY: waitid writes into the siginfo we own.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | flags,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: waitid filled `info` (si_pid 0: nothing exited yet).
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    // The wait status `std` reads: an exit code in the second byte, or the signal (with the
    // core-dump bit).
    let raw = match info.si_code {
        libc::CLD_EXITED => (status & 0xff) << 8,
        libc::CLD_DUMPED => status | 0x80,
        _ => status,
    };
    Ok(Some(std::process::ExitStatus::from_raw(raw)))
}

/// Send `signal` to the child through its pidfd (no pid reuse can misdirect it).
pub fn signal(pidfd: &OwnedFd, signal: libc::c_int) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a system call on a descriptor we hold.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
