//! What the parent process has in its environment does not reach the engine: the runner builds
//! the child environment from scratch (library and `planbot plan`, real and stand-in engines).

use crate::support::fake_engine as fake;

use planbot::capabilities::engine::{Engine, PlanRequest};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

/// Things a CI runner or a developer shell may have set, each of which would change what the
/// engine does or leak secrets.
const POISON: &[(&str, &str)] = &[
    ("TF_CLI_ARGS", "-refresh=false"),
    ("TF_CLI_ARGS_plan", "-var=region=from-cli-args"),
    ("TF_LOG", "trace"),
    ("TF_LOG_PROVIDER", "trace"),
    ("TF_VAR_region", "from-parent-env"),
    ("GITLAB_TOKEN", "glpat-env-canary-should-never-pass"),
    ("CI_JOB_TOKEN", "job-token-env-canary"),
    ("GOGC", "off"),
    ("GOMEMLIMIT", "1MiB"),
];

/// The Go runtime's settings planbot gives an engine whose processes have a memory cap (the
/// namespaces' `RLIMIT_DATA`, where the kernel offers them): the parent's never.
fn go_settings(capped: bool) -> Vec<&'static str> {
    match capped {
        true => vec!["GOGC", "GOMEMLIMIT"],
        false => Vec::new(),
    }
}

/// `NAME=value` of `name` in a dump.
fn dumped(path: &Path, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")).map(str::to_string))
}

/// Variables a POSIX shell adds by itself (the stand-in engine is a shell script).
const SHELL_OWN: &[&str] = &["PWD", "SHLVL", "_", "OLDPWD"];

fn dumped_keys(path: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_string()))
        .filter(|k| !SHELL_OWN.contains(&k.as_str()))
        .collect()
}

/// A stand-in engine in `dir` that dumps its environment into `dumps` (the root it plans: the
/// one place a sandboxed engine may write).
fn env_dumping_engine(dir: &Path, dumps: &Path) -> std::path::PathBuf {
    let body = format!(
        r#"env > {dir}/env-$1
case "$1" in
  plan) {write};;
  show) echo '{plan}';;
esac"#,
        dir = dumps.display(),
        write = fake::WRITE_PLAN_FILE,
        plan = fake::PLAN_JSON
    );
    fake::fake_engine(dir, "terraform", fake::TERRAFORM_VERSION_JSON, &body)
}

#[test]
fn the_parent_environment_does_not_reach_the_engine() {
    // The poisoned environment is this process's own: the test runs alone in a child started
    // with it (setting the environment of a process of many threads is not safe).
    if !crate::support::alone_in_a_process(
        "engine_env::the_parent_environment_does_not_reach_the_engine",
        POISON,
    ) {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();

    // 1. A stand-in engine dumps exactly what it got.
    let bin_dir = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let bin = env_dumping_engine(bin_dir.path(), root.path());
    let temp_root = tempfile::tempdir().unwrap();
    let engine = Engine::builder(&bin, temp_root.path())
        .env(
            [(
                "TF_VAR_pve_token".to_string(),
                "configured-secret".to_string(),
            )]
            .into(),
        )
        .plugin_cache_dir(bin_dir.path().join("cache"))
        .build()
        .unwrap();
    let req = PlanRequest {
        workspace: Some("staging".into()),
        ..PlanRequest::default()
    };
    rt.block_on(engine.plan(root.path(), &req)).unwrap();
    let capped = matches!(
        engine.sandbox(),
        planbot::capabilities::engine::SandboxMode::Landlock {
            namespaces: planbot::capabilities::engine::Namespaces::On { .. },
            ..
        }
    );
    let expected: BTreeSet<String> = [
        "CHECKPOINT_DISABLE",
        "HOME",
        "PATH",
        "TF_INPUT",
        "TF_IN_AUTOMATION",
        "TF_PLUGIN_CACHE_DIR",
        "TF_VAR_pve_token",
        "TF_WORKSPACE",
        "TMPDIR",
    ]
    .into_iter()
    .chain(go_settings(capped))
    .map(|s| s.to_string())
    .collect();
    for step in ["init", "plan", "show"] {
        let dump = root.path().join(format!("env-{step}"));
        assert_eq!(dumped_keys(&dump), expected, "environment of `{step}`");
        // The default cap (`sandbox.memory_max`, 4 GiB): half of it, never the parent's.
        if capped {
            assert_eq!(dumped(&dump, "GOGC").as_deref(), Some("400"));
            assert_eq!(dumped(&dump, "GOMEMLIMIT").as_deref(), Some("2048MiB"));
        }
    }

    // 2. `planbot plan` started from that poisoned environment: same.
    let cli_dir = tempfile::tempdir().unwrap();
    let cli_bin = env_dumping_engine(cli_dir.path(), root.path());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_planbot"))
        .args(["plan", "--format", "json", "--engine"])
        .arg(&cli_bin)
        .arg(root.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let keys = dumped_keys(&root.path().join("env-plan"));
    // `planbot plan` sandboxes with the same namespaces where the kernel offers them.
    let capped = matches!(
        planbot::capabilities::namespaces::NsSupport::probe(),
        planbot::capabilities::namespaces::NsSupport::Available
    );
    let expected_cli: BTreeSet<String> = [
        "CHECKPOINT_DISABLE",
        "HOME",
        "PATH",
        "TF_INPUT",
        "TF_IN_AUTOMATION",
        "TMPDIR",
    ]
    .into_iter()
    .chain(go_settings(capped))
    .map(|s| s.to_string())
    .collect();
    assert_eq!(keys, expected_cli);

    // 3. The real engine: the plan is the code's own, with no trace logging.
    let real = crate::support::engine();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(
        root.path().join("main.tf"),
        r#"
variable "region" {
  default = "from-default"
}
resource "terraform_data" "r" {
  input = var.region
}
output "region" {
  value = var.region
}
"#,
    )
    .unwrap();
    let engine = Engine::builder(&real, temp_root.path())
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let run = rt
        .block_on(engine.plan(root.path(), &PlanRequest::default()))
        .unwrap();
    let region = &run.plan().output_changes["region"].after;
    assert_eq!(
        region, "from-default",
        "neither TF_VAR_region nor TF_CLI_ARGS_plan got in"
    );
    assert!(!run.log().contains("[TRACE]"), "TF_LOG did not get in");
    assert!(!run.log().contains("[DEBUG]"), "TF_LOG did not get in");
    let json = String::from_utf8_lossy(run.plan_json());
    assert!(!json.contains("from-parent-env") && !json.contains("from-cli-args"));
}
