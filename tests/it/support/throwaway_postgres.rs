//! The PostgreSQL server of the tests when none is named: a throwaway cluster this test process
//! starts once, from the system's `initdb` and `postgres` (on `PATH`, or Debian's
//! `/usr/lib/postgresql/<version>/bin`), on a free loopback port and a private socket directory,
//! offering TLS with a certificate for `localhost` signed by a throwaway CA (made with the
//! `openssl` CLI). It stops (immediate shutdown) and its directory goes away when the process
//! exits; should the process be killed, the server gets SIGQUIT from the kernel
//! (`PR_SET_PDEATHSIG`) and the next run sweeps the directory.
//!
//! Shared, as a file, by the integration tests (`tests/it/support/postgres.rs`), the library's store
//! tests and the replicas benchmark. As root, the server runs as the `postgres` user (Debian's
//! package makes it) or `nobody`: `initdb` refuses root.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What to do when the server programs are missing.
pub const INSTALL: &str =
    "install PostgreSQL's server programs (`scripts/install-test-tools.sh` does; \
     on Debian or Ubuntu `apt-get install postgresql`, which puts them in \
     /usr/lib/postgresql/<version>/bin), or name a server of your own in \
     PLANBOT_TEST_POSTGRES_URL";

/// A running throwaway server: a superuser URL (plaintext on loopback; TLS offered) and the PEM
/// of the CA that signed its certificate for `localhost`.
pub struct Throwaway {
    pub url: String,
    pub ca: PathBuf,
}

static SERVER: OnceLock<Result<Throwaway, String>> = OnceLock::new();
static POSTMASTER: AtomicI32 = AtomicI32::new(0);
static DIR: OnceLock<PathBuf> = OnceLock::new();

/// The server, started on the first call; the error says what to install.
pub fn throwaway() -> Result<&'static Throwaway, String> {
    SERVER.get_or_init(start).as_ref().map_err(Clone::clone)
}

/// The directory holding `initdb` and `postgres`.
fn server_programs() -> Option<PathBuf> {
    let has = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(d) = std::env::split_paths(&path).find(|d| has(d)) {
        return Some(d);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has(&bin).then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, d)| d)
}

fn on_path(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|d| d.join(name).is_file())
}

/// The user the server runs as when this process is root: `postgres`, else `nobody`.
fn server_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid cannot fail; getpwnam returns a pointer into static storage, read at once.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    for name in [c"postgres", c"nobody"] {
        let pw = unsafe { libc::getpwnam(name.as_ptr()) };
        if !pw.is_null() {
            return Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) });
        }
    }
    None
}

/// Remove the directories of throwaway servers whose test process is gone.
fn sweep(tmp: &Path) {
    for e in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("planbot-test-pg-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        if unsafe { libc::kill(pid, 0) } != 0 {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("starting the test PostgreSQL: {what}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "starting the test PostgreSQL: {what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// A CA (`ca.pem`) and a server certificate for DNS:localhost only (`server.pem`, `server.key`).
fn certificates(dir: &Path) -> Result<(), String> {
    let openssl = |args: &[&str]| {
        let mut cmd = Command::new("openssl");
        cmd.args(args).current_dir(dir);
        run(&mut cmd, &format!("openssl {}", args[0]))
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=planbot test PostgreSQL CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ])?;
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ])?;
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(|e| e.to_string())?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ])?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .map_err(|e| e.to_string())
}

fn chown_all(dir: &Path, uid: u32, gid: u32) {
    let _ = std::os::unix::fs::chown(dir, Some(uid), Some(gid));
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            chown_all(&e.path(), uid, gid);
        } else {
            let _ = std::os::unix::fs::chown(e.path(), Some(uid), Some(gid));
        }
    }
}

fn as_user(cmd: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

fn start() -> Result<Throwaway, String> {
    let bin = server_programs().ok_or_else(|| {
        format!(
            "PLANBOT_TEST_POSTGRES_URL is not set and no PostgreSQL server programs (initdb, \
             postgres) are on PATH or in /usr/lib/postgresql/*/bin, so the PostgreSQL tests \
             cannot start their own server: {INSTALL}"
        )
    })?;
    if !on_path("openssl") {
        return Err(format!(
            "the test PostgreSQL offers TLS with a certificate made by the openssl CLI, which is \
             not on PATH: install it (`apt-get install openssl`), or {INSTALL}"
        ));
    }
    let tmp = std::env::temp_dir();
    sweep(&tmp);
    let dir = tmp.join(format!(
        "planbot-test-pg-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    for sub in ["data", "sock", "tls"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let _ = DIR.set(dir.clone());
    // SAFETY: registers a plain function run by exit(), which the test harness ends with.
    unsafe { libc::atexit(stop) };
    certificates(&dir.join("tls"))?;
    let user = server_user();
    if let Some((uid, gid)) = user {
        chown_all(&dir, uid, gid);
    }
    let data = dir.join("data");
    run(
        as_user(&mut Command::new(bin.join("initdb")), user)
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]),
        "initdb",
    )?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let log = std::fs::File::create(dir.join("server.log")).map_err(|e| e.to_string())?;
    let mut postgres = Command::new(bin.join("postgres"));
    as_user(&mut postgres, user)
        .arg("-D")
        .arg(&data)
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-k"])
        .arg(dir.join("sock"))
        .args([
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ])
        .args(["-c", "max_connections=400", "-c", "ssl=on"])
        .arg("-c")
        .arg(format!(
            "ssl_cert_file={}",
            dir.join("tls/server.pem").display()
        ))
        .arg("-c")
        .arg(format!(
            "ssl_key_file={}",
            dir.join("tls/server.key").display()
        ))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    // SAFETY: prctl only sets the signal this child gets when its parent thread ends.
    unsafe {
        postgres.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT);
            Ok(())
        });
    }
    // The kernel signals the child when the *thread* that forked it ends: a thread of its own,
    // which lives as long as the process, starts it and keeps it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || match postgres.spawn() {
        Ok(child) => {
            POSTMASTER.store(child.id() as i32, Ordering::SeqCst);
            let _ = tx.send(Ok(()));
            let _keep = child;
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            let _ = tx.send(Err(format!("starting the test PostgreSQL: postgres: {e}")));
        }
    });
    rx.recv().map_err(|e| e.to_string())??;
    // Ready when postmaster.pid's status line says so (PostgreSQL 10 and later).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = std::fs::read_to_string(data.join("postmaster.pid")).unwrap_or_default();
        if status.lines().nth(7).map(str::trim) == Some("ready") {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the test PostgreSQL did not become ready in 60 s:\n{}",
                std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "test PostgreSQL: {} on 127.0.0.1:{port}, data in {}",
        bin.display(),
        dir.display()
    );
    Ok(Throwaway {
        url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        ca: dir.join("tls/ca.pem"),
    })
}

/// At exit: an immediate shutdown, then the directory goes.
extern "C" fn stop() {
    let pid = POSTMASTER.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: signals and reaps our own child.
        unsafe { libc::kill(pid, libc::SIGQUIT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let mut status = 0;
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if let Some(dir) = DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}
