//! The engine runner with the real engine: plan, apply of the same plan file, redacted errors,
//! and nothing left in the temp root afterwards.

use crate::support::fake_engine as fake;

use planbot::capabilities::engine::{Engine, EngineError, EngineKind, PlanRequest, Step};
use planbot::core::redact::REDACTED;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

fn copy_root(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap().flatten() {
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn root_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

#[tokio::test]
async fn plans_the_quickstart_in_a_private_dir_and_leaves_no_file_behind() {
    let bin = require_engine!();
    let root = tempfile::tempdir().unwrap();
    copy_root(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quickstart"),
        root.path(),
    );
    let temp_root = tempfile::tempdir().unwrap();
    let engine = Engine::builder(&bin, temp_root.path())
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();

    let run = engine
        .plan(root.path(), &PlanRequest::default())
        .await
        .unwrap();

    let version = run.version().clone();
    assert!(matches!(
        version.name,
        EngineKind::Terraform | EngineKind::OpenTofu
    ));
    assert!(version.to_string().starts_with(version.name.name()));
    let creates: Vec<&str> = run
        .plan()
        .managed_changes()
        .filter(|rc| rc.change.actions == ["create"])
        .map(|rc| rc.address.as_str())
        .collect();
    assert_eq!(
        creates,
        vec![
            "terraform_data.root_password",
            "terraform_data.vm[\"backup\"]",
            "terraform_data.vm[\"blocky\"]",
            "terraform_data.vm[\"gitlab\"]"
        ]
    );
    assert!(run.log().contains("4 to add"), "{}", run.log());
    // The quickstart's sensitive default is known as a secret, and the log does not show it.
    assert!(run
        .secrets()
        .iter()
        .any(|s| s == "quickstart-not-a-real-secret"));
    assert!(!run.log().contains("quickstart-not-a-real-secret"));

    // While the run lives, its plan file sits in a 0700 dir under the temp root.
    use std::os::unix::fs::PermissionsExt;
    let private = run.private_dir().to_path_buf();
    assert!(private.starts_with(temp_root.path()));
    assert_eq!(
        std::fs::metadata(&private).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert!(private.join("out/plan").is_file());
    assert!(run.duration() > Duration::ZERO);

    drop(run);
    assert_eq!(fake::leftovers(temp_root.path()), Vec::<String>::new());
}

#[tokio::test]
async fn a_failing_root_gives_the_redacted_error_and_leaves_no_file_behind() {
    let bin = require_engine!();
    let root = root_with(&[(
        "main.tf",
        r#"
variable "admin_password" {
  type      = string
  sensitive = true
  default   = "engine-canary-precondition-5e1"
}
variable "api_token" {
  type = string
}
resource "terraform_data" "token" {
  input = tonumber(var.api_token)
}
resource "terraform_data" "vm" {
  lifecycle {
    precondition {
      condition     = var.admin_password == "something else"
      error_message = "wrong password ${nonsensitive(var.admin_password)}"
    }
  }
}
"#,
    )]);
    let temp_root = tempfile::tempdir().unwrap();
    // A configured engine env value (a secret) that the engine quotes in its error.
    let env: BTreeMap<String, String> = [(
        "TF_VAR_api_token".to_string(),
        "engine-canary-env-token-77f".to_string(),
    )]
    .into();
    let engine = Engine::builder(&bin, temp_root.path())
        .env(env)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();

    let err = engine
        .plan(root.path(), &PlanRequest::default())
        .await
        .unwrap_err();

    let EngineError::Failed {
        step,
        exit_code,
        ref log,
    } = err
    else {
        panic!("expected a plan failure, got {err:?}");
    };
    assert_eq!(step, Step::Plan);
    assert_eq!(exit_code, Some(1));
    assert!(log.contains("Error:"), "{log}");
    assert!(
        log.contains(REDACTED),
        "the secrets were there and are hidden: {log}"
    );
    assert!(log.contains("Resource precondition failed"), "{log}");
    assert!(log.contains("tonumber"), "{log}");
    for canary in [
        "engine-canary-precondition-5e1",
        "engine-canary-env-token-77f",
    ] {
        assert!(!log.contains(canary), "{canary} leaked: {log}");
    }
    let report = err.report(40);
    assert!(
        report.starts_with("`plan` failed (exit code 1)"),
        "{report}"
    );
    assert_eq!(fake::leftovers(temp_root.path()), Vec::<String>::new());
}

#[tokio::test]
async fn apply_runs_exactly_the_planned_file_and_streams_redacted_lines() {
    let bin = require_engine!();
    let root = root_with(&[(
        "main.tf",
        r#"
variable "token" {
  type      = string
  sensitive = true
}
resource "terraform_data" "echo" {
  input = var.token
}
resource "terraform_data" "plain" {
  input = "visible-value"
}
output "echoed" {
  value     = terraform_data.echo.output
  sensitive = true
}
"#,
    )]);
    let temp_root = tempfile::tempdir().unwrap();
    let engine = Engine::builder(&bin, temp_root.path())
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let req = PlanRequest {
        extra_env: [(
            "TF_VAR_token".to_string(),
            "engine-canary-apply-token-3c9".to_string(),
        )]
        .into(),
        ..PlanRequest::default()
    };
    let run = engine.plan(root.path(), &req).await.unwrap();
    assert_eq!(run.plan().managed_changes().count(), 2);
    let private = run.private_dir().to_path_buf();

    // Change the config after planning: apply must still do what was planned, nothing else.
    std::fs::write(
        root.path().join("extra.tf"),
        r#"resource "terraform_data" "late" { input = "not reviewed" }"#,
    )
    .unwrap();

    let mut lines = Vec::new();
    let outcome = run
        .apply_streaming(|l| lines.push(l.to_string()))
        .await
        .unwrap();
    let streamed = lines.join("\n");
    assert!(
        streamed.contains("Apply complete! Resources: 2 added"),
        "{streamed}"
    );
    assert!(!streamed.contains("terraform_data.late"), "{streamed}");
    assert!(
        !streamed.contains("engine-canary-apply-token-3c9"),
        "{streamed}"
    );
    assert!(!outcome.log.contains("engine-canary-apply-token-3c9"));
    assert!(outcome.log.contains("Apply complete!"));
    assert!(!private.exists(), "the plan file is gone after the apply");
    assert_eq!(fake::leftovers(temp_root.path()), Vec::<String>::new());

    // The state holds what was planned: a new plan only wants the late resource.
    let again = engine.plan(root.path(), &req).await.unwrap();
    let pending: Vec<&str> = again
        .plan()
        .managed_changes()
        .filter(|rc| rc.has_change())
        .map(|rc| rc.address.as_str())
        .collect();
    assert_eq!(pending, vec!["terraform_data.late"]);
    // The echoed secret (a computed attribute, stored unmasked in state) is still scrubbed.
    assert!(again
        .secrets()
        .iter()
        .any(|s| s == "engine-canary-apply-token-3c9"));
}

#[tokio::test]
async fn an_unknown_binary_is_not_found() {
    let temp_root = tempfile::tempdir().unwrap();
    let err = Engine::builder("no-such-engine-binary", temp_root.path())
        .build()
        .unwrap_err();
    assert!(matches!(err, EngineError::NotFound(_)), "{err}");
    assert!(err.to_string().contains("not on PATH"), "{err}");
}

#[tokio::test]
async fn an_apply_that_runs_too_long_is_stopped_gracefully_by_the_real_engine() {
    let bin = require_engine!();
    let root = root_with(&[(
        "main.tf",
        r#"
resource "terraform_data" "slow" {
  input = "x"
  provisioner "local-exec" {
    command = "sleep 120"
  }
}
"#,
    )]);
    let temp_root = tempfile::tempdir().unwrap();
    let engine = Engine::builder(&bin, temp_root.path())
        .timeout(Duration::from_secs(3))
        .grace(Duration::from_secs(15))
        .build()
        .unwrap();
    let run = engine
        .plan(root.path(), &PlanRequest::default())
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut lines = Vec::new();
    let err = run
        .apply_streaming(|l| lines.push(l.to_string()))
        .await
        .unwrap_err();
    let took = started.elapsed();
    let EngineError::TimedOut { step, ref log, .. } = err else {
        panic!("expected a timeout, got {err:?}");
    };
    assert_eq!(step, Step::Apply);
    // One SIGTERM is a graceful stop: the engine says so and exits on its own, before the kill.
    let streamed = lines.join("\n");
    assert!(
        streamed.contains("Gracefully shutting down") || streamed.contains("Interrupt received"),
        "{streamed}"
    );
    assert!(log.contains("terraform_data.slow"), "{log}");
    assert!(
        took < Duration::from_secs(3 + 15),
        "stopped within the grace: {took:?}"
    );
    // The state is written and unlocked: a new plan runs at once.
    let again = Engine::builder(&bin, temp_root.path())
        .lock_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
        .plan(root.path(), &PlanRequest::default())
        .await;
    assert!(again.is_ok(), "{:?}", again.err());
    drop(again);
    assert_eq!(fake::leftovers(temp_root.path()), Vec::<String>::new());
}

/// Issue 36 item 4: a request's `parallelism` is `-parallelism=N` on the engine's `plan` and on
/// the apply of that plan file (the real engine behind a wrapper that prints its arguments), an
/// out-of-range value is refused before anything runs, and none is passed without one.
#[tokio::test]
async fn parallelism_goes_to_plan_and_apply_and_only_when_set() {
    let real = require_engine!();
    let bin_dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    let bin = bin_dir.path().join("terraform");
    std::fs::write(
        &bin,
        format!(
            "#!/bin/sh\ncase \"$1\" in plan|apply) echo \"engine argv: $*\" >&2 ;; esac\nexec {} \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let temp_root = tempfile::tempdir().unwrap();
    let engine = Engine::builder(&bin, temp_root.path())
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let argv = |log: &str, step: &str| -> String {
        log.lines()
            .find(|l| l.contains(&format!("engine argv: {step} ")))
            .unwrap_or_else(|| panic!("no {step} argv in:\n{log}"))
            .to_string()
    };

    let root = root_with(&[("main.tf", "resource \"terraform_data\" \"a\" {}\n")]);
    let req = PlanRequest {
        parallelism: Some(3),
        ..PlanRequest::default()
    };
    let run = engine.plan(root.path(), &req).await.unwrap();
    assert_eq!(run.parallelism(), Some(3));
    assert!(
        argv(run.log(), "plan").contains(" -parallelism=3 "),
        "{}",
        run.log()
    );
    let outcome = run.apply().await.unwrap();
    assert!(
        argv(&outcome.log, "apply").contains(" -parallelism=3 "),
        "{}",
        outcome.log
    );

    let root = root_with(&[("main.tf", "resource \"terraform_data\" \"b\" {}\n")]);
    let run = engine
        .plan(root.path(), &PlanRequest::default())
        .await
        .unwrap();
    assert!(
        !argv(run.log(), "plan").contains("-parallelism"),
        "{}",
        run.log()
    );
    let outcome = run.apply().await.unwrap();
    assert!(!argv(&outcome.log, "apply").contains("-parallelism"));

    for bad in [0, 257] {
        let req = PlanRequest {
            parallelism: Some(bad),
            ..PlanRequest::default()
        };
        match engine.plan(root.path(), &req).await {
            Err(EngineError::InvalidRequest(m)) => assert!(m.contains("parallelism"), "{m}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

/// Issue 36 item 5: after a successful apply, a plan of the root again (same variables) lists
/// what the apply left. `uuid()` stands for a provider that reports success without converging:
/// its value is unknown at every plan, so the plan right after the apply still wants to change
/// that resource — deterministically, every time. The twin converges: nothing is left.
#[tokio::test]
async fn the_plan_after_an_apply_lists_what_it_left_and_nothing_when_it_converged() {
    let bin = require_engine!();
    let temp_root = tempfile::tempdir().unwrap();
    let engine = Engine::builder(&bin, temp_root.path())
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    // A required variable: a plan after the apply without the apply's `-var` would fail.
    let req = PlanRequest {
        vars: vec![("name".to_string(), "web".to_string())],
        ..PlanRequest::default()
    };
    let kept = r#"
variable "name" {
  type = string
}
resource "terraform_data" "kept" {
  input = var.name
}
"#;
    let root = root_with(&[(
        "main.tf",
        &format!(
            "{kept}\nresource \"terraform_data\" \"never_converges\" {{\n  input = uuid()\n}}\n"
        ),
    )]);
    let run = engine.plan(root.path(), &req).await.unwrap();
    let private = run.private_dir().to_path_buf();
    let (outcome, left) = run.apply_and_replan(|_| {}).await.unwrap();
    assert!(
        outcome.log.contains("Apply complete! Resources: 2 added"),
        "{}",
        outcome.log
    );
    assert_eq!(
        left,
        Ok(vec!["terraform_data.never_converges (update)".to_string()])
    );
    assert!(!private.exists(), "the plan files are gone after the apply");
    assert_eq!(fake::leftovers(temp_root.path()), Vec::<String>::new());

    // The healthy twin: a root whose apply converges leaves nothing.
    let root = root_with(&[("main.tf", kept)]);
    let run = engine.plan(root.path(), &req).await.unwrap();
    let (_, left) = run.apply_and_replan(|_| {}).await.unwrap();
    assert_eq!(left, Ok(vec![]));
}
