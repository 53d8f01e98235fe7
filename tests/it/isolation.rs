//! The namespaces around every engine process, proven on real processes: what an attacker did
//! from inside the Landlock sandbox alone (connect to planbot's UNIX sockets, `stat()` the
//! store, map planbot's pids with `kill(pid, 0)`, leave a `setsid` daemon running, fork
//! without end) works under Landlock alone — each test shows that first, so it proves the
//! namespaces and not the machine — and fails inside the namespaces.

use crate::support::world::PlanbotConfig;
use planbot::capabilities::engine::child::{EngineChild, Launch};
use planbot::capabilities::engine::sandbox::{
    Isolation, Policy, PreparedSandbox, Profile, Support,
};
use planbot::capabilities::engine::{
    CliConfig, Engine, Limits, PlanRequest, SandboxMode, SandboxProfile,
};
use planbot::capabilities::namespaces::NsSupport;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Landlock and the namespaces of this kernel; the tests fail (never skip) without them.
fn kernel() -> Support {
    let landlock = Support::probe();
    assert!(
        landlock.abi().is_some(),
        "this kernel offers no Landlock: {}",
        landlock.describe()
    );
    assert_eq!(
        NsSupport::probe(),
        NsSupport::Available,
        "this kernel refuses unprivileged namespaces: the isolation cannot be tested here"
    );
    landlock
}

/// planbot's surroundings as an attacker finds them: a store file and a listening UNIX socket
/// (an SSH agent, a PostgreSQL socket), in a directory that is not in any allow-list.
struct Planbot {
    dir: tempfile::TempDir,
    _listener: std::os::unix::net::UnixListener,
}

impl Planbot {
    fn new() -> Planbot {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("planbot.db"), "SQLite format 3\0").unwrap();
        let listener =
            std::os::unix::net::UnixListener::bind(dir.path().join("agent.sock")).unwrap();
        Planbot {
            dir,
            _listener: listener,
        }
    }
    fn store(&self) -> PathBuf {
        self.dir.path().join("planbot.db")
    }
    fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }
}

/// A job's directories: a worktree (written) and the empty directory its root is mounted on.
pub(crate) struct Job {
    pub(crate) work: tempfile::TempDir,
    pub(crate) jail_root: tempfile::TempDir,
}

impl Job {
    pub(crate) fn new() -> Job {
        let job = Job {
            work: tempfile::tempdir().unwrap(),
            jail_root: tempfile::tempdir().unwrap(),
        };
        use std::os::unix::fs::PermissionsExt;
        for d in [job.work.path(), job.jail_root.path()] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        job
    }

    pub(crate) fn policy(&self) -> Policy {
        let mut p = Policy::base(Profile::Strict);
        p.allow_write(self.work.path());
        p
    }

    pub(crate) fn isolation(&self, limits: Limits) -> Isolation {
        Isolation {
            limits,
            root: Some(self.jail_root.path().to_path_buf()),
            seccomp: true,
        }
    }
}

pub(crate) struct Ran {
    /// It exited with 0.
    pub(crate) ok: bool,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Ran {
    /// Fails the test, showing the whole output, unless stdout holds `text`.
    fn says(&self, text: &str) {
        assert!(
            self.stdout.contains(text),
            "expected {text:?} in the output:\n{}\n{}",
            self.stdout,
            self.stderr
        );
    }
}

/// How a test child is confined.
pub(crate) enum Confined<'a> {
    /// Not at all (what an attack does with no sandbox).
    Nothing,
    /// Landlock alone (what planbot had before the namespaces).
    LandlockOnly(&'a Policy),
    /// Landlock and the namespaces.
    Isolated(&'a Policy, &'a Isolation),
}

/// `bash -c script` as `uid` (when given), confined as asked, in `cwd`.
pub(crate) async fn bash(script: &str, how: Confined<'_>, cwd: &Path, uid: Option<u32>) -> Ran {
    match uid {
        None => output(start_bash(script, how, cwd)).await,
        // The child must be `uid`'s from its start (its user namespace is made by the `clone`
        // that starts it): a thread of this test takes the ids (its own only, by the raw
        // system calls) and starts and waits for it.
        Some(uid) => std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: raw system calls change this thread's ids alone.
                    unsafe {
                        assert_eq!(
                            libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
                            0
                        );
                        assert_eq!(libc::syscall(libc::SYS_setresgid, uid, uid, uid), 0);
                        assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
                        // A change of ids leaves the process not dumpable (its `/proc/self`
                        // files root's); planbot running as `uid` is.
                        assert_eq!(libc::prctl(libc::PR_SET_DUMPABLE, 1 as libc::c_ulong), 0);
                    }
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(async { output(start_bash(script, how, cwd)).await })
                })
                .join()
                .expect("the test's child thread")
        }),
    }
}

/// `bash -c script` started as planbot starts an engine process ([`EngineChild::spawn`]),
/// confined as asked, in `cwd`: stdin `/dev/null`, stdout and stderr piped.
pub(crate) fn start_bash(script: &str, how: Confined<'_>, cwd: &Path) -> EngineChild {
    let landlock = kernel();
    let prepared = match how {
        Confined::Nothing => None,
        Confined::LandlockOnly(p) => Some(p.prepare(landlock)),
        Confined::Isolated(p, iso) => Some(p.prepare_isolated(landlock, iso, cwd)),
    }
    .map(Result::unwrap);
    start_bash_in(script, prepared.as_ref(), cwd)
}

/// `bash -c script` started as planbot starts an engine process, in `sandbox` (prepared by the
/// caller; `None`: none), in `cwd`.
pub(crate) fn start_bash_in(
    script: &str,
    sandbox: Option<&PreparedSandbox>,
    cwd: &Path,
) -> EngineChild {
    let args = [OsString::from("-c"), OsString::from(script)];
    let env = BTreeMap::from([("PATH".to_string(), OsString::from("/usr/bin:/bin"))]);
    EngineChild::spawn(&Launch {
        program: Path::new("/bin/bash"),
        args: &args,
        env: &env,
        dir: cwd,
        cgroup: &[],
        sandbox,
    })
    .expect("bash starts")
}

/// All a child says on stdout and stderr, once it has ended (and whatever held its output).
pub(crate) async fn output(mut child: EngineChild) -> Ran {
    use tokio::io::AsyncReadExt;
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let ended = async {
        let (a, b) = tokio::join!(out.read_to_end(&mut stdout), err.read_to_end(&mut stderr));
        a.and(b).expect("the output is read");
        child.wait().await.expect("the child is waited for")
    };
    let status = tokio::time::timeout(Duration::from_secs(60), ended)
        .await
        .expect("the confined command ends (and whatever holds its output)");
    Ran {
        ok: status.success(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// Perl that connects to the UNIX socket at `path` and says whether it could.
fn connect_script(path: &Path) -> String {
    format!(
        r#"perl -MSocket -e 'socket(S, PF_UNIX, SOCK_STREAM, 0) or die; if (connect(S, pack_sockaddr_un("{}"))) {{ print "connect: ok\n" }} else {{ print "connect: $!\n" }}'"#,
        path.display()
    )
}

#[tokio::test]
async fn a_job_cannot_reach_planbots_sockets_stat_its_store_or_see_its_pids() {
    let planbot = Planbot::new();
    let job = Job::new();
    let me = std::process::id();
    let script = format!(
        "{connect}\n\
         stat -c 'stat: %n' '{store}' 2>&1 | sed 's/^stat: cannot stat.*: /stat: /'\n\
         kill -0 {me} 2>&1 | sed 's/.*kill: ([0-9]*) - /kill: /'; kill -0 {me} 2>/dev/null && echo 'kill: ok'\n\
         for d in run proc home root var srv usr etc dev tmp; do [ -e /$d ] && printf 'root: %s\\n' $d; done\n",
        connect = connect_script(&planbot.socket()),
        store = planbot.store().display(),
    );
    let policy = job.policy();

    // Landlock alone: the attack works (as it did against planbot before the namespaces).
    let before = bash(
        &script,
        Confined::LandlockOnly(&policy),
        job.work.path(),
        None,
    )
    .await;
    assert!(
        before.stdout.contains("connect: ok"),
        "Landlock alone lets a job connect to planbot's sockets: {} {}",
        before.stdout,
        before.stderr
    );
    assert!(
        before
            .stdout
            .contains(&format!("stat: {}", planbot.store().display())),
        "{}",
        before.stdout
    );
    assert!(
        before.stdout.contains("Operation not permitted") || before.stdout.contains("kill: ok"),
        "planbot's pid is visible under Landlock alone: {}",
        before.stdout
    );

    // In the namespaces: the socket, the store and planbot's pids do not exist.
    let iso = job.isolation(Limits::default());
    let after = bash(
        &script,
        Confined::Isolated(&policy, &iso),
        job.work.path(),
        None,
    )
    .await;
    after.says("connect: No such file or directory");
    after.says("stat: No such file or directory");
    after.says("kill: No such process");
    let root: Vec<&str> = after
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("root: "))
        .collect();
    // /tmp holds this test's job directory; the rest of it is not there.
    assert_eq!(root, vec!["usr", "etc", "dev", "tmp"], "{}", after.stdout);
    before.says("root: run");
    // The job's own directory works as before.
    let own = bash(
        "echo made > here && cat here && ls /dev | tr '\\n' ' '",
        Confined::Isolated(&policy, &iso),
        job.work.path(),
        None,
    )
    .await;
    assert!(
        own.stdout.starts_with("made"),
        "{}{}",
        own.stdout,
        own.stderr
    );
    assert!(
        !own.stdout.contains("zero"),
        "/dev/zero is in the view: {}",
        own.stdout
    );
}

/// The pids of processes whose command line holds `marker`, seen from outside.
fn processes_with(marker: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(marker) {
            pids.push(pid);
        }
    }
    pids
}

#[tokio::test]
async fn a_setsid_daemon_ends_with_the_job() {
    let job = Job::new();
    let policy = job.policy();
    // A number no other process has on its command line.
    let marker = format!(
        "{}.{}",
        900000 + std::process::id() % 1000,
        std::process::id()
    );
    let script = format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 &\necho started");

    // Landlock alone: the daemon outlives the job (it left the process group, too).
    let ran = bash(
        &script,
        Confined::LandlockOnly(&policy),
        job.work.path(),
        None,
    )
    .await;
    ran.says("started");
    let survivors = processes_with(&marker);
    assert!(
        !survivors.is_empty(),
        "under Landlock alone the setsid daemon survives the job (else this test proves nothing)"
    );
    for pid in survivors {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    // In the namespaces: when the job's main process ends, its PID namespace ends, and every
    // process in it with it — before planbot hears that the job ended.
    let iso = job.isolation(Limits::default());
    let ran = bash(
        &script,
        Confined::Isolated(&policy, &iso),
        job.work.path(),
        None,
    )
    .await;
    ran.says("started");
    assert_eq!(
        processes_with(&marker),
        Vec::<i32>::new(),
        "the setsid daemon outlived its job"
    );
}

/// An unprivileged user to run a test child as: the kernel does not count root's processes
/// against a process limit (planbot's service runs as an unprivileged user).
const NOBODY: u32 = 65534;

#[tokio::test]
async fn a_fork_bomb_hits_the_jobs_task_limit_and_ends_with_the_job() {
    let job = Job::new();
    let policy = job.policy();
    let marker = format!("forkbomb-{}", std::process::id());
    // Perl reports the first failed fork instead of retrying as bash does.
    let script = format!(
        r#"exec perl -e 'my $n = 0; for (1..300) {{ my $p = fork; if (!defined $p) {{ print "fork failed after $n: $!\n"; exit 0 }} if ($p == 0) {{ close STDOUT; close STDERR; sleep 600; exit 0 }} $n++ }} print "forked $n\n"' {marker}"#
    );
    // SAFETY: getuid cannot fail.
    let as_user = (unsafe { libc::getuid() } == 0).then_some(NOBODY);

    // Landlock alone: every fork succeeds (nothing counts the job's processes).
    let ran = bash(
        &script,
        Confined::LandlockOnly(&policy),
        job.work.path(),
        as_user,
    )
    .await;
    let left = processes_with(&marker);
    for pid in &left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(
        ran.stdout.contains("forked 300"),
        "without a task limit the forks succeed (else this test proves nothing): {}{}",
        ran.stdout,
        ran.stderr
    );

    // In the namespaces, with a limit of 64 tasks for the job: the 64th fork fails, and the
    // forked processes end with the job.
    let limits = Limits {
        tasks: 64,
        ..Limits::default()
    };
    let iso = job.isolation(limits);
    let ran = bash(
        &script,
        Confined::Isolated(&policy, &iso),
        job.work.path(),
        as_user,
    )
    .await;
    let failed_after: u32 = ran
        .stdout
        .trim()
        .strip_prefix("fork failed after ")
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "the fork bomb was not stopped: {}{}",
                ran.stdout, ran.stderr
            )
        });
    assert!(failed_after < 64, "{}", ran.stdout);
    ran.says("Resource temporarily unavailable");
    assert_eq!(processes_with(&marker), Vec::<i32>::new());
}

// ---- the real engine ----------------------------------------------------------------------

fn engine(temp_root: &Path, limits: Option<Limits>, cli: CliConfig) -> Engine {
    let landlock = kernel();
    let mut mode =
        SandboxMode::with_profile(SandboxProfile::Strict, landlock, true, |r| r.to_string());
    if let (
        Some(l),
        SandboxMode::Landlock {
            namespaces: planbot::capabilities::engine::Namespaces::On { limits },
            ..
        },
    ) = (limits, &mut mode)
    {
        *limits = l;
    }
    Engine::builder(crate::support::engine(), temp_root)
        .timeout(Duration::from_secs(120))
        .sandbox(mode)
        .cli_config(cli)
        .build()
        .unwrap()
}

fn owned() -> CliConfig {
    CliConfig::Owned {
        provider_mirror: None,
    }
}

/// The engine's error as one line (it wraps its messages).
fn one_line(e: &planbot::capabilities::engine::EngineError) -> String {
    e.report(200)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn hcl_reading_dev_zero_fails_at_once_and_a_value_past_the_memory_cap_ends_clearly() {
    let temp_root = tempfile::tempdir().unwrap();
    let eng = engine(temp_root.path(), None, owned());
    let root = tempfile::tempdir().unwrap();
    std::fs::write(
        root.path().join("main.tf"),
        "output \"zero\" {\n  value = length(file(\"/dev/zero\"))\n}\n",
    )
    .unwrap();
    let err = match eng.plan(root.path(), &PlanRequest::default()).await {
        Ok(_) => panic!("read /dev/zero"),
        Err(e) => e,
    };
    let text = one_line(&err);
    assert!(text.contains("/dev/zero"), "{text}");
    assert!(text.contains("no file exists"), "{text}");

    // A value of 1.6 GB built in HCL, under a cap of 512 MiB per process.
    let eng = engine(
        temp_root.path(),
        Some(Limits {
            memory: 512 << 20,
            ..Limits::default()
        }),
        owned(),
    );
    std::fs::write(
        root.path().join("main.tf"),
        "output \"big\" {\n  value = length(join(\"\", [for i in range(160) : format(\"%010000000d\", i)]))\n}\n",
    )
    .unwrap();
    let err = match eng.plan(root.path(), &PlanRequest::default()).await {
        Ok(run) => panic!(
            "a 1.6 GB value fit under a 512 MiB cap: {:?}",
            run.plan().output_changes
        ),
        Err(e) => e,
    };
    let text = one_line(&err);
    assert!(text.contains("out of memory"), "{text}");
    assert!(
        text.contains("[sandbox] memory_max"),
        "the note says which cap was hit: {text}"
    );
}

/// A service config with a filesystem provider mirror at `mirror`.
fn config_with_mirror(mirror: &Path) -> planbot::core::config::Config {
    PlanbotConfig::for_gitlab("https://gitlab.example.com/", "glpat-secret-token")
        .set(
            "engine",
            "provider_mirror",
            &format!("\"{}\"", mirror.display()),
        )
        .load()
}

#[tokio::test]
async fn a_provider_from_an_unpacked_filesystem_mirror_runs() {
    kernel();
    // An unpacked mirror (the layout `terraform providers mirror` writes, unzipped): the
    // provider must be executable in the sandbox, not only readable.
    let mirror = tempfile::tempdir().unwrap();
    let dir = mirror
        .path()
        .join("registry.terraform.io/example/mirrored/1.0.0/linux_amd64");
    std::fs::create_dir_all(&dir).unwrap();
    let root = tempfile::tempdir().unwrap();
    let marker = root.path().join("provider-ran");
    let bin = dir.join("terraform-provider-mirrored_v1.0.0");
    std::fs::write(
        &bin,
        format!("#!/bin/sh\necho ran > '{}'\nexit 1\n", marker.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        root.path().join("main.tf"),
        "terraform {\n  required_providers {\n    mirrored = { source = \"example/mirrored\" }\n  }\n}\n\
         provider \"mirrored\" {}\n",
    )
    .unwrap();
    let config = config_with_mirror(mirror.path());
    let plan = |mode: SandboxMode| {
        let temp_root = tempfile::tempdir().unwrap();
        let eng = Engine::builder(crate::support::engine(), temp_root.path())
            .timeout(Duration::from_secs(120))
            .sandbox(mode)
            .cli_config(CliConfig::Owned {
                provider_mirror: Some(planbot::capabilities::engine::ProviderMirror::Filesystem(
                    mirror.path().to_path_buf(),
                )),
            })
            .build()
            .unwrap();
        let root = root.path().to_path_buf();
        async move {
            let result = eng.plan(&root, &PlanRequest::default()).await;
            drop(temp_root);
            match result {
                Ok(_) => panic!("a provider that exits 1 planned"),
                Err(e) => one_line(&e),
            }
        }
    };
    use planbot::flows::confinement::{credentials::Trust, sandbox::service_mode};
    let service = service_mode(&config, Trust::MergeRequest);

    // The mirror only readable (as planbot had it): the engine cannot start the provider.
    let mut read_only = service.clone();
    if let SandboxMode::Landlock {
        extra_read,
        extra_exec,
        ..
    } = &mut read_only
    {
        extra_read.append(extra_exec);
    }
    let text = plan(read_only).await;
    assert!(text.contains("permission denied"), "{text}");
    assert!(!marker.exists());

    // The service's sandbox: the provider from the mirror runs.
    let text = plan(service).await;
    assert!(!text.contains("permission denied"), "{text}");
    assert!(marker.exists(), "the mirrored provider did not run: {text}");
}

// ---- the apply's SSH agent ------------------------------------------------------------------

/// An SSH agent holding a fresh ed25519 key (the apply key of `[proxmox.apply]`).
struct Agent {
    dir: tempfile::TempDir,
    process: std::process::Child,
}

impl Agent {
    fn start() -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("apply-key");
        let keygen = std::process::Command::new("ssh-keygen")
            .args([
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "planbot-apply-key",
                "-f",
            ])
            .arg(&key)
            .status()
            .expect("ssh-keygen (openssh-client) is installed");
        assert!(keygen.success());
        let agent = std::process::Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(dir.path().join("agent.sock"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("ssh-agent (openssh-client) is installed");
        let a = Agent {
            dir,
            process: agent,
        };
        // ssh-add waits for nothing: retry until the agent listens (it binds at once).
        let added = (0..200).any(|_| {
            let ok = std::process::Command::new("ssh-add")
                .arg("-q")
                .arg(&key)
                .env("SSH_AUTH_SOCK", a.socket())
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap()
                .success();
            if !ok {
                std::thread::sleep(Duration::from_millis(25));
            }
            ok
        });
        assert!(added, "ssh-add never reached the agent");
        a
    }
    fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }
    fn public_key(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("apply-key.pub")).unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A Proxmox node's SSH server on loopback: this user may log in with `authorized` (and
/// nothing else), and uploads land in `snippets`.
struct Sshd {
    child: std::process::Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Sshd {
    fn start(authorized: &str) -> Sshd {
        let dir = tempfile::tempdir().unwrap();
        let host_key = dir.path().join("host_key");
        assert!(std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&host_key)
            .status()
            .unwrap()
            .success());
        std::fs::write(dir.path().join("authorized_keys"), authorized).unwrap();
        std::fs::create_dir(dir.path().join("snippets")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.path().join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nAuthorizedKeysFile {ak}\n\
                 PermitRootLogin prohibit-password\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n",
                hk = host_key.display(),
                ak = dir.path().join("authorized_keys").display(),
            ),
        )
        .unwrap();
        // sshd's privilege separation directory (Debian's package makes it at boot).
        let _ = std::fs::create_dir_all("/run/sshd");
        let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("sshd (openssh-server) is installed: the SSH upload story needs it");
        let child = std::process::Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let s = Sshd { child, port, dir };
        let listening = (0..400).any(|_| {
            let ok = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            if !ok {
                std::thread::sleep(Duration::from_millis(25));
            }
            ok
        });
        assert!(listening, "sshd never listened on {port}");
        s
    }
    fn snippets(&self) -> PathBuf {
        self.dir.path().join("snippets")
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The service config of this story: the apply's SSH agent, the test sshd's port allowed.
fn config_with_agent(agent: &Path, port: u16) -> planbot::core::config::Config {
    PlanbotConfig::for_gitlab("https://gitlab.example.com/", "glpat-secret-token")
        .sandbox_reaches(port)
        .set("proxmox.apply", "ssh_username", "\"root\"")
        .set(
            "proxmox.apply",
            "ssh_agent_socket",
            &format!("\"{}\"", agent.display()),
        )
        .load()
}

/// The engine the service builds for `use_`: its sandbox and its credentials.
fn service_engine(
    config: &planbot::core::config::Config,
    use_: planbot::flows::confinement::credentials::Trust,
    mode: SandboxMode,
    temp_root: &Path,
) -> Engine {
    Engine::builder(crate::support::engine(), temp_root)
        .timeout(Duration::from_secs(120))
        .sandbox(mode)
        .env(planbot::flows::confinement::credentials::engine_env(
            config, use_,
        ))
        .cli_config(CliConfig::User)
        .build()
        .unwrap()
}

/// A root whose committed "provider" (run by the plan) tries the agent at its configured path
/// and at whatever the environment names, and reports into `report`.
fn mr_root_trying_the_agent(agent: &Path) -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let report = root.path().join("report.txt");
    let dir = root
        .path()
        .join("terraform.d/plugins/registry.terraform.io/evil/agent/1.0.0/linux_amd64");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("terraform-provider-agent_v1.0.0");
    std::fs::write(
        &bin,
        format!(
            "#!/bin/sh\n{{\n\
             echo ran\n\
             SSH_AUTH_SOCK='{agent}' ssh-add -L && echo listed-at-configured-path\n\
             [ -n \"$PROXMOX_VE_SSH_AUTH_SOCK\" ] && SSH_AUTH_SOCK=\"$PROXMOX_VE_SSH_AUTH_SOCK\" ssh-add -L && echo listed-from-env\n\
             }} > '{report}' 2>&1\nexit 1\n",
            agent = agent.display(),
            report = report.display(),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        root.path().join("main.tf"),
        "terraform {\n  required_providers {\n    agent = { source = \"evil/agent\" }\n  }\n}\n\
         provider \"agent\" {}\n",
    )
    .unwrap();
    (root, report)
}

#[tokio::test]
async fn an_mr_plan_cannot_reach_the_apply_agent_and_the_apply_uploads_a_snippet_over_ssh() {
    use planbot::flows::confinement::{credentials::Trust, sandbox::service_mode};
    kernel();
    let agent = Agent::start();
    let sshd = Sshd::start(&agent.public_key());
    let config = config_with_agent(&agent.socket(), sshd.port);
    let temp_root = tempfile::tempdir().unwrap();

    // Landlock alone (planbot before the namespaces): MR code lists the apply key.
    let (root, report) = mr_root_trying_the_agent(&agent.socket());
    let mut landlock_only = service_mode(&config, Trust::MergeRequest);
    if let SandboxMode::Landlock { namespaces, .. } = &mut landlock_only {
        *namespaces = planbot::capabilities::engine::Namespaces::Off {
            reason: "this test's control".into(),
        };
    }
    let eng = service_engine(
        &config,
        Trust::MergeRequest,
        landlock_only,
        temp_root.path(),
    );
    assert!(eng
        .plan(root.path(), &PlanRequest::default())
        .await
        .is_err());
    let got = std::fs::read_to_string(&report).expect("the MR's code ran");
    assert!(
        got.contains("listed-at-configured-path") && got.contains("planbot-apply-key"),
        "under Landlock alone an MR plan lists the apply key (else this test proves nothing): {got}"
    );

    // The service's MR plan: the agent is nowhere in its view, and not in its environment.
    let (root, report) = mr_root_trying_the_agent(&agent.socket());
    let eng = service_engine(
        &config,
        Trust::MergeRequest,
        service_mode(&config, Trust::MergeRequest),
        temp_root.path(),
    );
    assert!(eng
        .plan(root.path(), &PlanRequest::default())
        .await
        .is_err());
    let got = std::fs::read_to_string(&report).expect("the MR's code ran");
    assert!(got.starts_with("ran"), "{got}");
    assert!(
        !got.contains("listed"),
        "an MR plan reached the agent: {got}"
    );
    assert!(!got.contains("planbot-apply-key"), "{got}");
    assert!(
        got.contains("Could not open a connection") || got.contains("No such file"),
        "{got}"
    );

    // The default branch's apply: it finds the agent at its per-run path and uploads a snippet
    // over SSH with the key, as the bpg provider does.
    let user = String::from_utf8(
        std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(
        root.path().join("main.tf"),
        format!(
            r#"resource "terraform_data" "snippet" {{
  input = "vm-101"
  provisioner "local-exec" {{
    command = "printf '#cloud-config\nhostname: vm-101\n' | ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentityAgent=$PROXMOX_VE_SSH_AUTH_SOCK -p {port} {user}@127.0.0.1 'cat > {snippets}/vm-101.yaml'"
  }}
}}
"#,
            port = sshd.port,
            user = user.trim(),
            snippets = sshd.snippets().display(),
        ),
    )
    .unwrap();
    let eng = service_engine(
        &config,
        Trust::DefaultBranch,
        service_mode(&config, Trust::DefaultBranch),
        temp_root.path(),
    );
    let planned = eng
        .plan(root.path(), &PlanRequest::default())
        .await
        .unwrap_or_else(|e| panic!("{}", e.report(60)));
    let private = planned.private_dir().to_path_buf();
    let outcome = planned.apply().await;
    let uploaded = std::fs::read_to_string(sshd.snippets().join("vm-101.yaml"));
    assert!(
        outcome.is_ok(),
        "{}",
        outcome.err().map(|e| e.report(60)).unwrap_or_default()
    );
    assert_eq!(uploaded.unwrap(), "#cloud-config\nhostname: vm-101\n");
    // The per-run path was a place in the run's own view only: nothing of it is left outside.
    assert!(!private.exists());
}

#[tokio::test]
async fn udp_is_closed_and_the_engines_resolv_conf_asks_over_tcp() {
    let job = Job::new();
    let policy = job.policy();
    let listener = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!("echo probe-report > /dev/udp/127.0.0.1/{port} && echo sent");

    // Landlock alone: the datagram goes out (as the attacker's probe report did).
    let ran = bash(
        &script,
        Confined::LandlockOnly(&policy),
        job.work.path(),
        None,
    )
    .await;
    ran.says("sent");
    let mut buf = [0u8; 64];
    let n = listener.recv(&mut buf).expect("the datagram arrives");
    assert_eq!(&buf[..n], b"probe-report\n");

    // In the namespaces: no UDP socket can be made.
    let iso = job.isolation(Limits::default());
    let ran = bash(
        &script,
        Confined::Isolated(&policy, &iso),
        job.work.path(),
        None,
    )
    .await;
    assert!(!ran.stdout.contains("sent"), "{}", ran.stdout);
    assert!(
        ran.stderr.contains("Operation not permitted"),
        "{}",
        ran.stderr
    );

    // The engine's view has a resolv.conf that makes Go's resolver (and glibc's) ask over TCP.
    let temp_root = tempfile::tempdir().unwrap();
    let eng = engine(temp_root.path(), None, owned());
    let root = tempfile::tempdir().unwrap();
    std::fs::write(
        root.path().join("main.tf"),
        "output \"resolv\" {\n  value = file(\"/etc/resolv.conf\")\n}\n",
    )
    .unwrap();
    let run = eng
        .plan(root.path(), &PlanRequest::default())
        .await
        .unwrap_or_else(|e| panic!("{}", e.report(40)));
    let resolv = run.plan().output_changes["resolv"].after.to_string();
    assert!(resolv.contains("options use-vc"), "{resolv}");
    assert!(resolv.contains("nameserver"), "{resolv}");
}

#[tokio::test]
async fn a_job_cannot_make_namespaces_of_its_own() {
    // A nested user namespace is where most unprivileged kernel exploits start: the engine's
    // seccomp filter refuses it (and mounts, keyrings, BPF, tracing: `DENIED_CALLS`).
    let job = Job::new();
    let policy = job.policy();
    let script = "unshare --user --pid --net --fork true && echo nested";

    // Landlock alone: the namespaces are made (the job holds every capability in them).
    let ran = bash(
        script,
        Confined::LandlockOnly(&policy),
        job.work.path(),
        None,
    )
    .await;
    ran.says("nested");

    // In the namespaces: refused.
    let iso = job.isolation(Limits::default());
    let ran = bash(
        script,
        Confined::Isolated(&policy, &iso),
        job.work.path(),
        None,
    )
    .await;
    assert!(!ran.stdout.contains("nested"), "{}", ran.stdout);
    assert!(
        ran.stderr.contains("Operation not permitted"),
        "{}",
        ran.stderr
    );
}

/// A provider plugin (go-plugin) makes its UNIX socket in `$TMPDIR`; Go programs write caches
/// under `$HOME`. Both are the run's size-capped tmpfs mounts in the namespaces, new inodes no
/// rule opened on the host reached: every real provider failed to start in the service's
/// sandbox ("Failed to read any lines from plugin's stdout") while `terraform_data` planned.
#[tokio::test]
async fn the_engine_writes_in_its_temp_dir_and_home_in_the_services_sandbox() {
    kernel();
    let bin_dir = tempfile::tempdir().unwrap();
    let body = format!(
        "case \"$1\" in\n\
         init) : ;;\n\
         plan) if ! echo socket > \"$TMPDIR/plugin123\"; then echo \"cannot write TMPDIR $TMPDIR\" >&2; exit 1; fi\n\
               if ! mkdir -p \"$HOME/.cache/probe\"; then echo \"cannot write HOME $HOME\" >&2; exit 1; fi\n\
               {write} ;;\n\
         show) echo '{plan}' ;;\n\
         esac",
        write = crate::support::fake_engine::WRITE_PLAN_FILE,
        plan = crate::support::fake_engine::PLAN_JSON,
    );
    let bin = crate::support::fake_engine::fake_engine(
        bin_dir.path(),
        "terraform",
        crate::support::fake_engine::TERRAFORM_VERSION_JSON,
        &body,
    );
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("main.tf"), "").unwrap();
    let temp_root = tempfile::tempdir().unwrap();
    let config = config_with_mirror(Path::new("/nonexistent-mirror"));
    use planbot::flows::confinement::{credentials::Trust, sandbox::service_mode};
    let mode = service_mode(&config, Trust::MergeRequest);
    assert!(
        matches!(
            &mode,
            SandboxMode::Landlock {
                namespaces: planbot::capabilities::engine::Namespaces::On { .. },
                ..
            }
        ),
        "{mode:?}"
    );
    let eng = Engine::builder(bin, temp_root.path())
        .timeout(Duration::from_secs(60))
        .sandbox(mode)
        .cli_config(owned())
        .build()
        .unwrap();
    match eng.plan(root.path(), &PlanRequest::default()).await {
        Ok(planned) => assert!(planned.plan_json().starts_with(b"{")),
        Err(e) => panic!(
            "the engine could not write its scratch space: {}",
            one_line(&e)
        ),
    }
}
