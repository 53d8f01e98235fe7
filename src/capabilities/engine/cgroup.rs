//! Per-run cgroups: every engine process of one run (init, plan, show, the checks, the apply,
//! and all they start) in a cgroup made for it, with a memory limit and a tasks limit, killed
//! and removed when the run ends.
//!
//! `RLIMIT_DATA` caps each process; only a cgroup caps them together (eight processes of
//! 250 MiB each stay under any per-process cap). Where the host gives planbot a cgroup it may
//! manage ([`CgroupSupport::prepare`]):
//! - **cgroup v2**, planbot's own cgroup delegated to it (systemd's `Delegate=yes`) with the
//!   `memory` and `pids` controllers: planbot moves itself into a `service` leaf (v2 lets no
//!   cgroup with children-controllers hold processes) and makes each run's cgroup beside it;
//! - **cgroup v1**, the `memory` and `pids` hierarchies mounted and planbot's cgroups in them
//!   writable: each run's cgroup is made under planbot's own in both.
//!
//! The engine's process joins the run's cgroup before its `exec`, before anything else (it
//! writes `0`, itself, to `cgroup.procs` files opened by planbot): no engine code runs outside.
//! A job plans its roots one after the other, so at any moment a job's engine processes are
//! one run's.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Where run cgroups are made, or why none can be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupSupport {
    /// cgroup v2: run cgroups are made in this (delegated) cgroup, beside planbot's leaf.
    V2 { parent: PathBuf },
    /// cgroup v1: run cgroups are made under these two cgroups of planbot's.
    V1 { memory: PathBuf, pids: PathBuf },
    /// None: the reason, in words (`planbot doctor`, `serve --check`, the start-up warning).
    Unavailable { reason: String },
}

/// The name of the v2 leaf planbot moves itself into.
const SERVICE_LEAF: &str = "service";

impl CgroupSupport {
    /// What this host offers, read from `/proc/self/cgroup` and `/proc/self/mountinfo`,
    /// changing nothing (`planbot doctor`, `serve --check`).
    pub fn probe() -> CgroupSupport {
        let (cgroups, mounts) = match (
            std::fs::read_to_string("/proc/self/cgroup"),
            std::fs::read_to_string("/proc/self/mountinfo"),
        ) {
            (Ok(c), Ok(m)) => (c, m),
            (Err(e), _) | (_, Err(e)) => {
                return CgroupSupport::Unavailable {
                    reason: format!("/proc/self/cgroup or /proc/self/mountinfo unreadable ({e})"),
                }
            }
        };
        let v2 = match v2_own(&cgroups, &mounts) {
            Some(dir) => match v2_usable(&dir) {
                Ok(()) => return CgroupSupport::V2 { parent: dir },
                Err(why) => why,
            },
            None => "no cgroup v2 mounted".to_string(),
        };
        let v1 = match (
            v1_own(&cgroups, &mounts, "memory"),
            v1_own(&cgroups, &mounts, "pids"),
        ) {
            (Some(memory), Some(pids)) => match (writable(&memory), writable(&pids)) {
                (Ok(()), Ok(())) => return CgroupSupport::V1 { memory, pids },
                (Err(e), _) | (_, Err(e)) => e,
            },
            _ => "no cgroup v1 `memory` and `pids` hierarchies mounted".to_string(),
        };
        CgroupSupport::Unavailable {
            reason: format!("{v2}; {v1}"),
        }
    }

    /// [`CgroupSupport::probe`], then for v2 the layout v2 needs: planbot moves itself into a
    /// `service` leaf of its cgroup and enables `memory` and `pids` for its children. Done once
    /// per process (what the first call found is kept).
    pub fn prepare() -> CgroupSupport {
        static PREPARED: OnceLock<CgroupSupport> = OnceLock::new();
        PREPARED
            .get_or_init(|| {
                let prepared = match CgroupSupport::probe() {
                    CgroupSupport::V2 { parent } => match v2_layout(&parent) {
                        Ok(()) => CgroupSupport::V2 { parent },
                        Err(reason) => CgroupSupport::Unavailable { reason },
                    },
                    other => other,
                };
                sweep(&prepared);
                prepared
            })
            .clone()
    }

    /// In words, for `planbot doctor`, `serve --check` and the start-up log.
    pub fn describe(&self) -> String {
        match self {
            CgroupSupport::V2 { parent } => {
                format!("cgroup v2, delegated: {}", parent.display())
            }
            CgroupSupport::V1 { memory, pids } => {
                format!("cgroup v1: {} and {}", memory.display(), pids.display())
            }
            CgroupSupport::Unavailable { reason } => format!("none: {reason}"),
        }
    }
}

/// [`sweep`] now (done once when the cgroups are prepared).
pub fn sweep_stale_run_cgroups() {
    sweep(&CgroupSupport::prepare());
}

/// Remove the run cgroups a planbot that is gone left behind (it was killed, or a run was never
/// dropped): `planbot-run-<pid>-<n>` of a pid that no longer runs; what is left in one is killed.
fn sweep(support: &CgroupSupport) {
    let bases = match support {
        CgroupSupport::V2 { parent } => vec![parent.clone()],
        CgroupSupport::V1 { memory, pids } => vec![memory.clone(), pids.clone()],
        CgroupSupport::Unavailable { .. } => return,
    };
    for base in bases {
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(pid) = name
                .strip_prefix("planbot-run-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            let stale = JobCgroup {
                dirs: vec![e.path()],
                procs: Vec::new(),
                memory_events: PathBuf::new(),
                pids_events: PathBuf::new(),
                v2: matches!(support, CgroupSupport::V2 { .. }),
                memory_max: 0,
                tasks_max: 0,
            };
            drop(stale);
        }
    }
}

/// planbot's v2 cgroup directory: the `0::` line under the cgroup2 mount.
fn v2_own(cgroups: &str, mounts: &str) -> Option<PathBuf> {
    let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let (root, point) = mount_of(mounts, |fstype, _| fstype == "cgroup2")?;
    Some(join_under(&point, &root, path))
}

/// planbot's v1 cgroup directory of `controller`.
fn v1_own(cgroups: &str, mounts: &str, controller: &str) -> Option<PathBuf> {
    let path = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        ctrls.split(',').any(|c| c == controller).then_some(path)
    })?;
    let (root, point) = mount_of(mounts, |fstype, opts| {
        fstype == "cgroup" && opts.split(',').any(|o| o == controller)
    })?;
    Some(join_under(&point, &root, path))
}

/// The `(root, mount point)` of the first mount whose fs type and super options match.
fn mount_of(mounts: &str, wanted: impl Fn(&str, &str) -> bool) -> Option<(String, PathBuf)> {
    mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let f: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        let (root, point) = (f.get(3)?, f.get(4)?);
        let (fstype, opts) = (r.first()?, r.get(2).copied().unwrap_or(""));
        wanted(fstype, opts).then(|| (root.to_string(), PathBuf::from(point)))
    })
}

/// `point` + `path` with the mount's `root` taken off `path`.
fn join_under(point: &Path, root: &str, path: &str) -> PathBuf {
    let rel = if root != "/" {
        path.strip_prefix(root).unwrap_or(path)
    } else {
        path
    };
    match rel.trim_start_matches('/') {
        "" => point.to_path_buf(),
        rel => point.join(rel),
    }
}

fn writable(dir: &Path) -> Result<(), String> {
    let c =
        std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0 {
        Ok(())
    } else {
        Err(format!(
            "planbot may not make cgroups in {} ({})",
            dir.display(),
            std::io::Error::last_os_error()
        ))
    }
}

/// Whether the v2 cgroup `dir` has the controllers and is planbot's to manage.
fn v2_usable(dir: &Path) -> Result<(), String> {
    let controllers = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
    if !has("memory") || !has("pids") {
        return Err(format!(
            "planbot's cgroup v2 {} offers no `memory` and `pids` controllers (it has: {}); with systemd set `Delegate=yes` in the unit",
            dir.display(),
            if controllers.trim().is_empty() { "none" } else { controllers.trim() }
        ));
    }
    writable(dir)?;
    writable(&dir.join("cgroup.subtree_control")).map_err(|_| {
        format!(
            "planbot's cgroup v2 {} is not delegated to it (cgroup.subtree_control is not writable); with systemd set `Delegate=yes` and `ProtectControlGroups=no`",
            dir.display()
        )
    })
}

/// v2's rule: a cgroup whose children have controllers holds no process. Move every process
/// of `dir` (planbot) into its `service` leaf, then enable `memory` and `pids` below `dir`.
fn v2_layout(dir: &Path) -> Result<(), String> {
    let fail = |what: &str, e: std::io::Error| format!("cgroup v2 {}: {what} ({e})", dir.display());
    let leaf = dir.join(SERVICE_LEAF);
    match std::fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail("making the `service` leaf", e)),
    }
    let procs = std::fs::read_to_string(dir.join("cgroup.procs"))
        .map_err(|e| fail("reading cgroup.procs", e))?;
    for pid in procs.split_whitespace() {
        std::fs::write(leaf.join("cgroup.procs"), pid)
            .map_err(|e| fail(&format!("moving process {pid} into the `service` leaf"), e))?;
    }
    std::fs::write(dir.join("cgroup.subtree_control"), "+memory +pids")
        .map_err(|e| fail("enabling memory and pids for its children", e))
}

/// The per-run cgroups of one engine runner: where they are made and their limits.
#[derive(Debug, Clone)]
pub struct JobCgroups {
    support: Arc<CgroupSupport>,
    memory_max: u64,
    tasks_max: u64,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

impl JobCgroups {
    /// Run cgroups made where `support` says, each capped at `memory_max` bytes and
    /// `tasks_max` tasks. `None` when `support` is unavailable.
    pub fn new(support: CgroupSupport, memory_max: u64, tasks_max: u64) -> Option<JobCgroups> {
        match support {
            CgroupSupport::Unavailable { .. } => None,
            s => Some(JobCgroups {
                support: Arc::new(s),
                memory_max,
                tasks_max,
            }),
        }
    }

    pub fn memory_max(&self) -> u64 {
        self.memory_max
    }

    pub fn tasks_max(&self) -> u64 {
        self.tasks_max
    }

    /// Make one run's cgroup, limits set.
    pub(super) fn create(&self) -> Result<JobCgroup, String> {
        let name = format!(
            "planbot-run-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut cg = JobCgroup {
            dirs: Vec::new(),
            procs: Vec::new(),
            memory_events: PathBuf::new(),
            pids_events: PathBuf::new(),
            v2: false,
            memory_max: self.memory_max,
            tasks_max: self.tasks_max,
        };
        let mkdir = |dir: &Path| {
            std::fs::create_dir(dir)
                .map_err(|e| format!("making the cgroup {}: {e}", dir.display()))
        };
        let set = |dir: &Path, file: &str, value: String| {
            std::fs::write(dir.join(file), &value)
                .map_err(|e| format!("setting {file} = {value} in {}: {e}", dir.display()))
        };
        match &*self.support {
            CgroupSupport::V2 { parent } => {
                let dir = parent.join(&name);
                mkdir(&dir)?;
                cg.dirs.push(dir.clone());
                cg.v2 = true;
                set(&dir, "memory.max", self.memory_max.to_string())?;
                if dir.join("memory.swap.max").exists() {
                    set(&dir, "memory.swap.max", "0".into())?;
                }
                // The OOM killer ends the whole run, not one process the engine may survive.
                set(&dir, "memory.oom.group", "1".into())?;
                set(&dir, "pids.max", self.tasks_max.to_string())?;
                cg.memory_events = dir.join("memory.events");
                cg.pids_events = dir.join("pids.events");
            }
            CgroupSupport::V1 { memory, pids } => {
                let m = memory.join(&name);
                mkdir(&m)?;
                cg.dirs.push(m.clone());
                let p = pids.join(&name);
                mkdir(&p)?;
                cg.dirs.push(p.clone());
                set(&m, "memory.limit_in_bytes", self.memory_max.to_string())?;
                if m.join("memory.memsw.limit_in_bytes").exists() {
                    set(
                        &m,
                        "memory.memsw.limit_in_bytes",
                        self.memory_max.to_string(),
                    )?;
                }
                set(&p, "pids.max", self.tasks_max.to_string())?;
                cg.memory_events = m.join("memory.oom_control");
                cg.pids_events = p.join("pids.events");
            }
            CgroupSupport::Unavailable { reason } => return Err(reason.clone()),
        }
        for dir in cg.dirs.clone() {
            let f = OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))
                .map_err(|e| format!("opening {}/cgroup.procs: {e}", dir.display()))?;
            cg.procs.push(f);
        }
        Ok(cg)
    }
}

/// One run's cgroup (one directory on v2, two on v1). Dropping it kills what is left in it and
/// removes it.
#[derive(Debug)]
pub(super) struct JobCgroup {
    dirs: Vec<PathBuf>,
    /// `cgroup.procs` of each directory, open for the child to write itself into.
    procs: Vec<File>,
    /// v2 `memory.events`, v1 `memory.oom_control`: both count `oom_kill`.
    memory_events: PathBuf,
    pids_events: PathBuf,
    v2: bool,
    pub(super) memory_max: u64,
    pub(super) tasks_max: u64,
}

/// What a run's cgroup has counted so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts {
    /// Processes the kernel's OOM killer ended at the memory limit.
    pub(super) oom_kills: u64,
    /// Forks refused at the tasks limit.
    pub(super) forks_refused: u64,
}

impl JobCgroup {
    /// The descriptors the child writes `0` into (see [`enter`]).
    pub(super) fn enter_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(|f| f.as_raw_fd()).collect()
    }

    pub(super) fn counts(&self) -> Counts {
        let field = |path: &Path, name: &str| -> u64 {
            std::fs::read_to_string(path)
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or(0)
        };
        Counts {
            oom_kills: field(&self.memory_events, "oom_kill "),
            forks_refused: field(&self.pids_events, "max "),
        }
    }

    /// SIGKILL everything in the cgroup until it is empty (bounded).
    pub(super) fn kill_all(&self) {
        if self.v2 {
            let _ = std::fs::write(self.dirs[0].join("cgroup.kill"), "1");
        }
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let mut any = false;
            for dir in &self.dirs {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                {
                    any = true;
                    // SAFETY: a signal to a process of this run's cgroup.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
            if !any || Instant::now() > until {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for JobCgroup {
    fn drop(&mut self) {
        self.kill_all();
        // A killed process leaves the cgroup when it is reaped: retry for a moment.
        let until = Instant::now() + Duration::from_secs(5);
        for dir in &self.dirs {
            while std::fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// In the engine's process before its `exec`: join the run's cgroup by writing `0` (the writer
/// itself) into each `cgroup.procs` descriptor. Only `write`: nothing that allocates.
pub(super) fn enter(fds: &[RawFd]) -> std::io::Result<()> {
    for &fd in fds {
        // SAFETY: a write of a static byte to a descriptor planbot opened.
        let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        if n != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str =
        "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n\
31 25 0:27 / /sys/fs/cgroup/pids rw,relatime shared:10 - cgroup cgroup rw,pids\n\
35 25 0:31 / /sys/fs/cgroup/unified rw,relatime shared:14 - cgroup2 cgroup2 rw\n";

    #[test]
    fn finds_its_own_cgroups_under_their_mounts() {
        let cg = "8:pids:/\n4:memory:/process_api/abc\n0::/system.slice/planbot.service\n";
        assert_eq!(
            v1_own(cg, MOUNTS, "memory"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
        assert_eq!(
            v1_own(cg, MOUNTS, "pids"),
            Some(PathBuf::from("/sys/fs/cgroup/pids"))
        );
        assert_eq!(
            v2_own(cg, MOUNTS),
            Some(PathBuf::from(
                "/sys/fs/cgroup/unified/system.slice/planbot.service"
            ))
        );
        assert_eq!(v1_own(cg, MOUNTS, "cpu"), None);
    }
}
