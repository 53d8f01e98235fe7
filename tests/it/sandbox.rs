//! The engine's sandbox, proven on real processes: a shell under the strict Landlock profile
//! cannot read planbot's files or `/proc/<pid>/environ`, cannot write outside its own
//! directories, cannot connect to a port that is not allowed — and the same shell without the
//! sandbox can do each of these, so the test proves the sandbox, not the environment. Then the
//! real engine: hostile HCL, a provider committed to the repository, a symlinked root.

use crate::isolation::{output, start_bash_in, Ran};
use planbot::capabilities::engine::sandbox::{Policy, Profile, Support};
use planbot::capabilities::engine::{
    CliConfig, Engine, EngineError, PlanRequest, SandboxMode, SandboxProfile,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

const CANARY: &str = "canary-3f9a1c7e-not-for-mr-authors";

/// The Landlock ABI of this kernel; the tests fail (never skip) without one.
fn landlock() -> Support {
    let support = Support::probe();
    assert!(
        support.abi().is_some(),
        "this kernel offers no Landlock ({}): the sandbox cannot be tested here",
        support.describe()
    );
    support
}

/// planbot's own files, as the sandbox must hide them: a config, a secret file, a store.
struct PlanbotFiles {
    _dir: tempfile::TempDir,
    config: PathBuf,
    secret: PathBuf,
    store: PathBuf,
}

fn planbot_files() -> PlanbotFiles {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("planbot.toml");
    let secret = dir.path().join("gitlab-token");
    let store = dir.path().join("planbot.db");
    std::fs::write(&config, format!("fingerprint_key = \"{CANARY}\"\n")).unwrap();
    std::fs::write(&secret, CANARY).unwrap();
    std::fs::write(&store, format!("SQLite format 3\0{CANARY}")).unwrap();
    PlanbotFiles {
        _dir: dir,
        config,
        secret,
        store,
    }
}

/// The strict policy of a job whose worktree is `work`.
fn strict_policy(work: &Path, ports: &[u16]) -> Policy {
    let mut p = Policy::base(Profile::Strict);
    p.allow_write(work);
    for port in ports {
        p.allow_port(*port);
    }
    p
}

/// `bash -c script`, sandboxed by `policy` (Landlock alone) or not, started as planbot starts
/// an engine process.
async fn bash(script: &str, policy: Option<&Policy>) -> Ran {
    let prepared = policy.map(|p| p.prepare(landlock()).unwrap());
    let dir = std::env::current_dir().unwrap();
    output(start_bash_in(script, prepared.as_ref(), &dir)).await
}

#[test]
fn this_kernel_offers_landlock_and_planbot_reports_its_abi() {
    let support = landlock();
    let text = support.describe();
    assert!(text.starts_with("Landlock ABI "), "{text}");
    assert!(text.contains("filesystem allow-list"), "{text}");
    if support.abi().unwrap() >= 4 {
        assert!(text.contains("TCP connect allow-list"), "{text}");
    }
}

#[tokio::test]
async fn a_sandboxed_child_cannot_read_planbots_files_and_an_unsandboxed_one_can() {
    let files = planbot_files();
    let work = tempfile::tempdir().unwrap();
    let policy = strict_policy(work.path(), &[]);
    for file in [&files.config, &files.secret, &files.store] {
        let script = format!("cat '{}'", file.display());
        let free = bash(&script, None).await;
        assert!(
            free.ok && free.stdout.contains(CANARY),
            "without the sandbox {} is readable (else this test proves nothing): {}",
            file.display(),
            free.stderr
        );
        let boxed = bash(&script, Some(&policy)).await;
        assert!(!boxed.ok, "{} was readable in the sandbox", file.display());
        assert!(!boxed.stdout.contains(CANARY));
        assert!(
            boxed.stderr.contains("Permission denied"),
            "{}",
            boxed.stderr
        );
    }
    // What the job owns stays usable.
    std::fs::write(work.path().join("main.tf"), "# root").unwrap();
    let own = bash(
        &format!("cat '{}/main.tf'", work.path().display()),
        Some(&policy),
    )
    .await;
    assert!(own.ok && own.stdout.contains("# root"), "{}", own.stderr);
}

#[tokio::test]
async fn a_sandboxed_child_cannot_read_another_process_environment() {
    // A process outside the sandbox (as planbot is) with a secret in its environment.
    let mut holder = std::process::Command::new("/bin/sleep")
        .arg("60")
        .env("PLANBOT_GITLAB_TOKEN", CANARY)
        .spawn()
        .unwrap();
    let script = format!("tr '\\0' '\\n' < /proc/{}/environ", holder.id());
    let work = tempfile::tempdir().unwrap();
    let free = bash(&script, None).await;
    let boxed = bash(&script, Some(&strict_policy(work.path(), &[]))).await;
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(
        free.stdout.contains(CANARY),
        "unsandboxed, /proc/<pid>/environ is readable: {}",
        free.stderr
    );
    assert!(!boxed.ok);
    assert!(!boxed.stdout.contains(CANARY));
}

#[tokio::test]
async fn a_sandboxed_child_writes_only_its_own_directories() {
    let work = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let policy = strict_policy(work.path(), &[]);
    let target = outside.path().join("planted");
    let script = format!("echo x > '{}'", target.display());
    let boxed = bash(&script, Some(&policy)).await;
    assert!(!boxed.ok, "wrote outside the sandbox");
    assert!(!target.exists());
    let free = bash(&script, None).await;
    assert!(free.ok && target.exists(), "{}", free.stderr);

    let inside = work.path().join("made-here");
    let ok = bash(&format!("echo x > '{}'", inside.display()), Some(&policy)).await;
    assert!(ok.ok && inside.exists(), "{}", ok.stderr);
    // /dev/null is writable (every tool writes there); a terminal is not reachable.
    assert!(bash("echo x > /dev/null", Some(&policy)).await.ok);
}

#[tokio::test]
async fn a_sandboxed_child_connects_only_to_allowed_ports() {
    let support = landlock();
    assert!(
        support.abi().unwrap() >= 4,
        "the TCP rules need Landlock ABI 4 (Linux 6.7); this kernel has {}",
        support.describe()
    );
    let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let allowed_port = allowed.local_addr().unwrap().port();
    let other_port = other.local_addr().unwrap().port();
    let work = tempfile::tempdir().unwrap();
    let policy = strict_policy(work.path(), &[allowed_port]);
    let connect = |port: u16| format!("exec 3<>/dev/tcp/127.0.0.1/{port}");

    assert!(
        bash(&connect(other_port), None).await.ok,
        "unsandboxed connect"
    );
    let denied = bash(&connect(other_port), Some(&policy)).await;
    assert!(!denied.ok, "connected to a port that is not allowed");
    assert!(
        denied.stderr.contains("Permission denied"),
        "{}",
        denied.stderr
    );
    let ok = bash(&connect(allowed_port), Some(&policy)).await;
    assert!(
        ok.ok,
        "could not connect to the allowed port: {}",
        ok.stderr
    );

    // No TCP server inside: binding any port is refused (perl, as every Debian has it).
    let bind = r#"exec /usr/bin/perl -MSocket -e 'socket(S, PF_INET, SOCK_STREAM, 0) or die; bind(S, pack_sockaddr_in(0, inet_aton("127.0.0.1"))) or die "bind: $!\n"'"#;
    assert!(bash(bind, None).await.ok, "unsandboxed bind");
    let denied = bash(bind, Some(&policy)).await;
    assert!(!denied.ok, "bound a port inside the sandbox");
    assert!(
        denied.stderr.contains("bind: Permission denied"),
        "{}",
        denied.stderr
    );
}

// ---- the real engine ----------------------------------------------------------------------

fn engine(bin: &Path, temp_root: &Path, cli: CliConfig, cache: Option<&Path>) -> Engine {
    let support = landlock();
    let mut b = Engine::builder(bin, temp_root)
        .timeout(Duration::from_secs(120))
        .sandbox(SandboxMode::with_profile(
            SandboxProfile::Strict,
            support,
            true,
            |r| r.to_string(),
        ))
        .cli_config(cli);
    if let Some(c) = cache {
        b = b.plugin_cache_dir(c);
    }
    b.build().unwrap()
}

fn owned() -> CliConfig {
    CliConfig::Owned {
        provider_mirror: None,
    }
}

fn error_text(e: &EngineError) -> String {
    e.report(200)
}

#[tokio::test]
async fn hcl_file_of_planbots_config_secret_store_or_environ_fails_inside_the_plan() {
    let bin = crate::support::engine();
    let files = planbot_files();
    let temp_root = tempfile::tempdir().unwrap();
    let eng = engine(&bin, temp_root.path(), owned(), None);
    let me = std::process::id();
    for (what, path) in [
        ("config", files.config.display().to_string()),
        ("secret file", files.secret.display().to_string()),
        ("store", files.store.display().to_string()),
        ("environ", format!("/proc/{me}/environ")),
    ] {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(
            root.path().join("main.tf"),
            format!("output \"stolen\" {{\n  value = strrev(base64encode(file(\"{path}\")))\n}}\n"),
        )
        .unwrap();
        let err = match eng.plan(root.path(), &PlanRequest::default()).await {
            Ok(run) => panic!(
                "the plan read planbot's {what}: {:?}",
                run.plan().output_changes
            ),
            Err(e) => e,
        };
        // The engine wraps its messages: read them as one line.
        let text = error_text(&err)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        // Not in the view at all (the mount namespace), or denied (Landlock, where the path's
        // directory is in the view): `/proc`.
        assert!(
            text.contains("no file exists") || text.contains("permission denied"),
            "{what}: {text}"
        );
        assert!(!text.contains(CANARY), "{what}: {text}");
    }
}

/// A "provider" committed in Terraform's implied local mirror: a script that, when run, tries
/// to steal and to plant, and writes what it managed into `report`.
fn commit_hostile_provider(root: &Path, report: &Path, files: &PlanbotFiles, apply_cache: &Path) {
    let dir = root.join("terraform.d/plugins/registry.terraform.io/evil/pwn/1.0.0/linux_amd64");
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "#!/bin/sh\n\
         {{\n\
         echo ran\n\
         cat '{secret}' && echo read-secret\n\
         cat '{config}' && echo read-config\n\
         tr '\\0' '\\n' < /proc/$PPID/environ && echo read-environ\n\
         mkdir -p '{cache}/registry.terraform.io' && echo planted > '{cache}/registry.terraform.io/x' && echo wrote-apply-cache\n\
         }} > '{report}' 2>&1\n\
         exit 1\n",
        secret = files.secret.display(),
        config = files.config.display(),
        cache = apply_cache.display(),
        report = report.display(),
    );
    let bin = dir.join("terraform-provider-pwn_v1.0.0");
    std::fs::write(&bin, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        root.join("main.tf"),
        "terraform {\n  required_providers {\n    pwn = { source = \"evil/pwn\" }\n  }\n}\n\
         provider \"pwn\" {}\n",
    )
    .unwrap();
}

/// A root with a committed hostile provider, and the directories around its job.
struct HostileRoot {
    files: PlanbotFiles,
    temp_root: tempfile::TempDir,
    _caches: tempfile::TempDir,
    root: tempfile::TempDir,
    report: PathBuf,
    mr_cache: PathBuf,
    apply_cache: PathBuf,
}

fn hostile_root() -> HostileRoot {
    let files = planbot_files();
    let caches = tempfile::tempdir().unwrap();
    let (mr_cache, apply_cache) = (caches.path().join("mr"), caches.path().join("main"));
    std::fs::create_dir_all(&apply_cache).unwrap();
    let root = tempfile::tempdir().unwrap();
    let report = root.path().join("report.txt");
    commit_hostile_provider(root.path(), &report, &files, &apply_cache);
    HostileRoot {
        files,
        temp_root: tempfile::tempdir().unwrap(),
        _caches: caches,
        root,
        report,
        mr_cache,
        apply_cache,
    }
}

#[tokio::test]
async fn a_provider_committed_under_terraform_d_plugins_is_never_installed() {
    let bin = crate::support::engine();
    let HostileRoot {
        files: _files,
        temp_root,
        _caches,
        root,
        report,
        mr_cache,
        ..
    } = hostile_root();

    let eng = engine(&bin, temp_root.path(), owned(), Some(&mr_cache));
    let err = match eng.plan(root.path(), &PlanRequest::default()).await {
        Ok(_) => panic!("a plan with an uninstallable provider succeeded"),
        Err(e) => e,
    };
    assert!(
        !report.exists(),
        "the committed provider ran: {}",
        std::fs::read_to_string(&report).unwrap_or_default()
    );
    let text = error_text(&err);
    assert!(text.contains("evil/pwn"), "{text}");
    assert!(!text.contains(CANARY), "{text}");
}

#[tokio::test]
async fn a_committed_provider_that_runs_anyway_stays_inside_the_sandbox() {
    // Even with the user's own CLI config (where Terraform does use the implied local mirror),
    // the provider runs confined: it runs, but steals and plants nothing.
    let bin = crate::support::engine();
    let HostileRoot {
        files: _files,
        temp_root,
        _caches,
        root,
        report,
        mr_cache,
        apply_cache,
    } = hostile_root();

    let eng = engine(&bin, temp_root.path(), CliConfig::User, Some(&mr_cache));
    let result = eng.plan(root.path(), &PlanRequest::default()).await;
    assert!(result.is_err(), "the hostile provider's plan succeeded");
    let report = std::fs::read_to_string(&report).expect("the committed provider ran");
    assert!(report.starts_with("ran"), "{report}");
    for stolen in [
        "read-secret",
        "read-config",
        "read-environ",
        "wrote-apply-cache",
        CANARY,
    ] {
        assert!(!report.contains(stolen), "{stolen}: {report}");
    }
    assert_eq!(std::fs::read_dir(&apply_cache).unwrap().count(), 0);
}

#[tokio::test]
async fn a_root_or_var_file_that_is_a_symlink_out_of_the_checkout_is_refused() {
    let bin = crate::support::engine();
    let temp_root = tempfile::tempdir().unwrap();
    let eng = engine(&bin, temp_root.path(), owned(), None);
    let data_dir = tempfile::tempdir().unwrap();
    std::fs::write(
        data_dir.path().join("main.tf"),
        "output \"x\" { value = 1 }\n",
    )
    .unwrap();
    let checkout = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(data_dir.path(), checkout.path().join("stack")).unwrap();

    let req = PlanRequest {
        worktree: Some(checkout.path().to_path_buf()),
        ..PlanRequest::default()
    };
    let err = match eng.plan(&checkout.path().join("stack"), &req).await {
        Ok(_) => panic!("planned a root outside the checkout"),
        Err(e) => e,
    };
    assert!(
        err.to_string()
            .contains("resolves outside the repository checkout"),
        "{err}"
    );

    // A var file linked to a file outside.
    std::fs::create_dir(checkout.path().join("core")).unwrap();
    std::fs::write(checkout.path().join("core/main.tf"), "variable \"v\" {}\n").unwrap();
    std::os::unix::fs::symlink(
        data_dir.path().join("main.tf"),
        checkout.path().join("core/prod.tfvars"),
    )
    .unwrap();
    let req = PlanRequest {
        worktree: Some(checkout.path().to_path_buf()),
        var_files: vec!["prod.tfvars".into()],
        ..PlanRequest::default()
    };
    let err = match eng.plan(&checkout.path().join("core"), &req).await {
        Ok(_) => panic!("planned with a var file outside the checkout"),
        Err(e) => e,
    };
    assert!(err.to_string().contains("prod.tfvars"), "{err}");
    assert!(
        err.to_string()
            .contains("resolves outside the repository checkout"),
        "{err}"
    );
}

#[tokio::test]
async fn without_landlock_a_required_sandbox_refuses_before_anything_runs() {
    let bin = crate::support::engine();
    let temp_root = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let marker = root.path().join("ran");
    std::fs::write(root.path().join("main.tf"), "output \"x\" { value = 1 }\n").unwrap();
    let unavailable = Support::Unavailable {
        reason: "switched off for this test",
    };
    let eng = Engine::builder(&bin, temp_root.path())
        .sandbox(SandboxMode::with_profile(
            SandboxProfile::Strict,
            unavailable,
            true,
            |r| format!("refused: {r}"),
        ))
        .build()
        .unwrap();
    let err = match eng.plan(root.path(), &PlanRequest::default()).await {
        Ok(_) => panic!("planned without the required sandbox"),
        Err(e) => e,
    };
    assert!(matches!(err, EngineError::SandboxRefused(_)), "{err:?}");
    assert_eq!(err.to_string(), "refused: switched off for this test");
    assert!(!root.path().join(".terraform").exists(), "init ran");
    assert!(!marker.exists());
    assert!(eng.version().await.is_err(), "even `version` is refused");

    // Not required: it runs, unconfined, and says so.
    let eng = Engine::builder(&bin, temp_root.path())
        .sandbox(SandboxMode::with_profile(
            SandboxProfile::Strict,
            unavailable,
            false,
            |r| r.to_string(),
        ))
        .build()
        .unwrap();
    assert!(matches!(eng.sandbox(), SandboxMode::Off { .. }));
    eng.plan(root.path(), &PlanRequest::default())
        .await
        .expect("plans without a sandbox when not required");
}

#[tokio::test]
async fn a_terraformrc_committed_in_the_repository_is_never_read() {
    // A root that ships a CLI config pointing the engine at a "mirror" in the repository,
    // holding the hostile provider: planbot's own CLI config is the only one the engine reads.
    let bin = crate::support::engine();
    let HostileRoot {
        files: _files,
        temp_root,
        _caches,
        root,
        report,
        mr_cache,
        ..
    } = hostile_root();
    std::fs::rename(
        root.path().join("terraform.d/plugins"),
        root.path().join("mirror"),
    )
    .unwrap();
    let rc = format!(
        "provider_installation {{\n  filesystem_mirror {{\n    path = \"{}/mirror\"\n  }}\n}}\n",
        root.path().display()
    );
    for name in [".terraformrc", "terraform.rc", ".tofurc", "tofu.rc"] {
        std::fs::write(root.path().join(name), &rc).unwrap();
    }
    let eng = engine(&bin, temp_root.path(), owned(), Some(&mr_cache));
    assert!(eng
        .plan(root.path(), &PlanRequest::default())
        .await
        .is_err());
    assert!(
        !report.exists(),
        "the repository's CLI config was read and its provider ran: {}",
        std::fs::read_to_string(&report).unwrap_or_default()
    );
}

/// `planbot plan` on `root` with `args`: (exit code, stdout).
fn planbot_plan(root: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_planbot"))
        .arg("plan")
        .arg(root)
        .args(["--engine", crate::support::engine().to_str().unwrap()])
        .args(args)
        .env("PLANBOT_FINGERPRINT_KEY", "local-test-key-0123456789")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn planbot_plan_reads_the_users_files_but_not_proc_unless_told_to_run_unsandboxed() {
    landlock();
    // A file of the user's outside the root (as `~/.ssh/id_ed25519.pub` in an Ignition config).
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("id_ed25519.pub"),
        "ssh-ed25519 AAAA user@host",
    )
    .unwrap();
    // A process with a token in its environment (as the shell that started planbot).
    let mut shell = std::process::Command::new("/bin/sleep")
        .arg("60")
        .env("GITLAB_TOKEN", CANARY)
        .spawn()
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(
        root.path().join("main.tf"),
        format!(
            "output \"key\" {{\n  value = file(\"{}/id_ed25519.pub\")\n}}\n\
             output \"env\" {{\n  value = try(strrev(filebase64(\"/proc/{}/environ\")), \"denied-environ\")\n}}\n",
            home.path().display(),
            shell.id()
        ),
    )
    .unwrap();

    let (code, local) = planbot_plan(root.path(), &[]);
    let (strict_code, strict) = planbot_plan(root.path(), &["--sandbox", "strict"]);
    let (free_code, free) = planbot_plan(root.path(), &["--no-sandbox"]);
    shell.kill().unwrap();
    shell.wait().unwrap();

    assert_eq!(code, Some(0), "{local}");
    assert!(local.contains("ssh-ed25519 AAAA user@host"), "{local}");
    assert!(local.contains("denied-environ"), "{local}");
    // The service's profile reads neither.
    assert_eq!(strict_code, Some(1), "{strict}");
    assert!(strict.contains("no file exists"), "{strict}");
    // Unsandboxed, /proc is readable: the local profile is what hid it.
    assert_eq!(free_code, Some(0), "{free}");
    assert!(!free.contains("denied-environ"), "{free}");
}
