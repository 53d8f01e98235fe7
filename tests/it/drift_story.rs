//! The drift story with the real engine against GitLab-managed state in the fake GitLab: a
//! drift check of `main` opens one issue per drifted root, edits it while the drift lasts, says
//! "could not check" on it when the engine fails, closes it when reality matches `main` again,
//! and calls a merge still waiting for its apply "waiting", not drift. The issue's fingerprint
//! is what the apply job confirms.

use crate::apply_story::{call_apply, last_line, no_workers, world};
use crate::support::service::TestService;
use planbot::capabilities::store::RunKind;
use planbot::core::drift::DriftVerdict;
use planbot::flows::drift::check::{tick, Selection, Tick};
use planbot::flows::drift::issue::IssueAction;
use std::time::SystemTime;

async fn check(s: &TestService) -> Tick {
    tick(&s.app, &Selection::default(), SystemTime::now())
        .await
        .expect("a drift tick")
}

/// Someone sets the (sensitive) password in the state by hand.
async fn hand_set_password(w: &crate::support::world::World, value: &str) {
    w.edit_state(|state| {
        for r in state["resources"].as_array_mut().unwrap() {
            if r["name"] == "password" {
                r["instances"][0]["attributes"]["input"]["value"] = value.into();
            }
        }
    })
    .await;
}

/// The `PLANBOT_CONFIRM=<prefix>` an issue body tells to set.
fn confirm_in(body: &str) -> String {
    body.split("PLANBOT_CONFIRM=")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .expect("the issue says how to confirm")
        .to_string()
}

fn one_root(t: &Tick) -> (&DriftVerdict, Option<IssueAction>) {
    assert_eq!(t.roots.len(), 1, "{t:?}");
    (&t.roots[0].verdict, t.roots[0].issue)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_of_main_lives_in_one_issue_that_the_apply_job_repairs() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), no_workers()).await;
    let head = || w.gitlab.branch_head(&w.project, "main").unwrap();
    let drift_status = |sha: &str| w.gitlab.status(&w.project, sha, "planbot/drift").unwrap();

    // `main` was pushed directly and never applied: reality lacks what its code creates.
    let first = check(&s).await;
    let (verdict, issue) = one_root(&first);
    assert!(matches!(verdict, DriftVerdict::Drifted { .. }), "{first:?}");
    assert_eq!(issue, Some(IssueAction::Opened(1)));
    assert_eq!(first.exit_code(), 2);
    assert_eq!(drift_status(&head()).state, "failed");
    let issues = w.gitlab.issues(&w.project);
    assert_eq!(issues.len(), 1);
    assert_eq!(issues[0].labels, vec!["drift".to_string()]);
    let body = &issues[0].description;
    assert!(body.contains("`terraform_data.vm[\"blocky\"]`"), "{body}");
    assert!(!body.contains("apply-canary-password-7f3a"), "{body}");
    // The issue's own recipe: the apply job with PLANBOT_CONFIRM=<prefix>.
    let prefix = confirm_in(body);
    assert_eq!(
        Some(prefix.as_str()),
        first.roots[0].fingerprint.as_deref().map(|f| &f[..12])
    );

    // The job on main with that confirm applies exactly that plan.
    let job = w.apply_job(41);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, &format!(r#"{{"confirm":"{prefix}"}}"#)).await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    // The drift issue hears the apply's result.
    let notes = &w.gitlab.issues(&w.project)[0].notes;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].2.contains("planbot · applied"), "{}", notes[0].2);

    // Clean: the issue gets a short note and closes; the status turns green.
    let clean = check(&s).await;
    assert_eq!(
        one_root(&clean),
        (&DriftVerdict::Clean, Some(IssueAction::Closed(1)))
    );
    assert_eq!(clean.exit_code(), 0);
    assert_eq!(drift_status(&head()).state, "success");
    let closed = &w.gitlab.issues(&w.project)[0];
    assert_eq!(closed.state, "closed");
    assert_eq!(closed.notes.len(), 2);
    assert!(
        closed.notes[1].2.contains("matches `main`"),
        "{}",
        closed.notes[1].2
    );

    // Someone resizes the VM behind the engine's back: a new issue, attribute by attribute.
    w.drift("blocky", 8).await;
    let drifted = check(&s).await;
    assert_eq!(one_root(&drifted).1, Some(IssueAction::Opened(2)));
    let issue = |iid: u64| {
        w.gitlab
            .issues(&w.project)
            .into_iter()
            .find(|i| i.iid == iid)
            .unwrap()
    };
    let body = issue(2).description;
    the_docs_show(&body);
    assert!(
        body.contains("~ input.cores = 2 -> 8\n"),
        "main's 2 cores, reality's 8, by path: {body}"
    );

    // The next check edits the same issue: no second issue, no note.
    let again = check(&s).await;
    assert_eq!(one_root(&again).1, Some(IssueAction::Edited(2)));
    assert_eq!(w.gitlab.issues(&w.project).len(), 2);
    assert!(issue(2).notes.is_empty(), "edited, not reposted");

    // Reality moves again between the issue and the apply (another hand change, so the apply
    // would now do more than the issue shows): the issue's fingerprint is refused.
    let prefix = confirm_in(&issue(2).description);
    hand_set_password(&w, "changed-by-hand").await;
    let job = w.apply_job(42);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, &format!(r#"{{"confirm":"{prefix}"}}"#)).await;
    assert!(
        last_line(&log).starts_with("planbot: apply refused"),
        "{log}"
    );
    let state = String::from_utf8(w.gitlab.terraform_state(&w.project, "core").0.unwrap()).unwrap();
    assert!(state.contains("\"cores\":8"), "nothing applied: {state}");
    assert!(
        state.contains("changed-by-hand"),
        "nothing applied: {state}"
    );
    assert!(
        issue(2).notes.is_empty(),
        "a refusal applies nothing to report on the issue"
    );

    // The engine fails (main's code is broken): "could not check" on the open issue.
    w.gitlab.commit_files(
        &w.project,
        "main",
        &[("main.tf", "resource \"terraform_data\" {")],
    );
    let broken = check(&s).await;
    assert!(
        matches!(one_root(&broken).0, DriftVerdict::CouldNotCheck { .. }),
        "{broken:?}"
    );
    assert_eq!(one_root(&broken).1, Some(IssueAction::Edited(2)));
    assert_eq!(broken.exit_code(), 1);
    let open = issue(2);
    assert_eq!(open.state, "opened");
    assert!(
        open.description.contains("could not check root `default`"),
        "{}",
        open.description
    );
    assert_eq!(
        w.gitlab.issues(&w.project).len(),
        2,
        "no issue opened for it"
    );

    // Code repaired and the hand change reverted: clean, the issue closes.
    w.gitlab.commit_files(
        &w.project,
        "main",
        &[("main.tf", &crate::support::infra_main_tf(&["blocky"]))],
    );
    w.drift("blocky", 2).await;
    hand_set_password(&w, "apply-canary-password-7f3a").await;
    let reverted = check(&s).await;
    assert_eq!(
        one_root(&reverted),
        (&DriftVerdict::Clean, Some(IssueAction::Closed(2)))
    );
    assert_eq!(issue(2).state, "closed");

    // A merge whose apply has not run: waiting for it, not drift; no issue.
    w.gitlab.commit_files(
        &w.project,
        "add-gitlab-vm",
        &[(
            "main.tf",
            &crate::support::infra_main_tf(&["blocky", "gitlab"]),
        )],
    );
    let iid = w
        .gitlab
        .open_mr_by(&w.project, "add-gitlab-vm", "main", &w.alice());
    w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    let waiting = check(&s).await;
    assert_eq!(
        one_root(&waiting),
        (
            &DriftVerdict::WaitingForApply { mr: iid },
            Some(IssueAction::None)
        )
    );
    assert_eq!(waiting.exit_code(), 0);
    assert_eq!(drift_status(&head()).state, "success");
    assert_eq!(w.gitlab.issues(&w.project).len(), 2);
    let text = waiting.render_text(&s.app.scrubber, "planbot-apply");
    assert!(
        text.contains(&format!("waiting for the apply of !{iid} (not drift)")),
        "{text}"
    );

    // Every check is a `drift` run on the run pages' store.
    let runs = s.app.store.recent_runs(50).await.unwrap();
    let drift_runs = runs.iter().filter(|r| r.kind.as_str() == "drift").count();
    assert_eq!(drift_runs, 7, "one run per check");
}

const EXAMPLE_START: &str = "<!-- drift-issue-example:start -->";
const EXAMPLE_END: &str = "<!-- drift-issue-example:end -->";

/// docs/drift.md shows this issue body (commit, times and fingerprint as placeholders);
/// `PLANBOT_UPDATE_README=1` rewrites the example in place.
fn the_docs_show(body: &str) {
    let mut example = body.to_string();
    for (pattern, placeholder) in [
        (r"\b[0-9a-f]{64}\b", "<fingerprint>"),
        (r"PLANBOT_CONFIRM=[0-9a-f]{12}", "PLANBOT_CONFIRM=<prefix>"),
        (r"`[0-9a-f]{8}`", "`<commit>`"),
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "<time>"),
        (r"localhost:\d+/runs/\d+", "localhost:8080/runs/<run>"),
    ] {
        example = regex::Regex::new(pattern)
            .unwrap()
            .replace_all(&example, placeholder)
            .into_owned();
    }
    let expected = format!("\n````markdown\n{}\n````\n", example.trim_end());
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/drift.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let (head, rest) = page
        .split_once(EXAMPLE_START)
        .expect("the example's start marker");
    let (found, tail) = rest
        .split_once(EXAMPLE_END)
        .expect("the example's end marker");
    if found != expected {
        if std::env::var_os("PLANBOT_UPDATE_README").is_some() {
            std::fs::write(
                &path,
                format!("{head}{EXAMPLE_START}{expected}{EXAMPLE_END}{tail}"),
            )
            .unwrap();
        }
        panic!(
            "docs/drift.md does not show the drift issue this check wrote (run with \
             PLANBOT_UPDATE_README=1 to rewrite it); expected:{expected}"
        );
    }
}

/// `planbot drift` as cron or a scheduled pipeline runs it: the real binary, the config file.
#[test]
fn the_command_prints_the_check_and_exits_2_on_drift_and_dry_run_writes_nothing() {
    let engine = require_engine!();
    let w = world(&engine);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("planbot.toml");
    std::fs::write(&file, w.planbot.text()).unwrap();
    let drift = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_planbot"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .arg("drift")
            .arg("--config")
            .arg(&file)
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), stdout, stderr)
    };
    let head = w.gitlab.branch_head(&w.project, "main").unwrap();

    // Never applied: drift, printed, but a dry run writes no issue and no status.
    let (code, stdout, stderr) = drift(&["--dry-run"]);
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with(&format!(
            "infra/homelab · root default · main at {}:\n  DRIFT, 2 resources\n",
            &head[..8]
        )),
        "{stdout}"
    );
    assert!(stdout.contains("PLANBOT_CONFIRM="), "{stdout}");
    assert!(!stdout.contains("apply-canary-password-7f3a"), "{stdout}");
    assert!(w.gitlab.issues(&w.project).is_empty());
    assert!(w
        .gitlab
        .status(&w.project, &head, "planbot/drift")
        .is_none());

    // A root that does not exist: nothing to check.
    let (code, stdout, _) = drift(&["--root", "nope"]);
    assert_eq!((code, stdout.as_str()), (Some(0), "no root to check\n"));

    // For real: the issue and the status.
    let (code, stdout, _) = drift(&["--project", "infra/homelab"]);
    assert_eq!(code, Some(2));
    assert!(stdout.ends_with("  issue: opened #1\n"), "{stdout}");
    assert_eq!(w.gitlab.issues(&w.project).len(), 1);
    assert_eq!(
        w.gitlab
            .status(&w.project, &head, "planbot/drift")
            .unwrap()
            .state,
        "failed"
    );
}

/// A VM whose one attribute is a big object: a cloud-init text, six disks, twenty tags.
const BIG_VM_TF: &str = r##"terraform {
  backend "http" {}
}

resource "terraform_data" "vm" {
  input = {
    name      = "blocky"
    cores     = 2
    memory    = 2048
    user_data = "#cloud-config\n${join("\n", [for i in range(30) : "write_files_${i}: /etc/planbot/${i}.conf"])}\n"
    disks     = [for i in range(6) : { interface = "scsi${i}", size = 32, datastore = "local-lvm", discard = "on" }]
    tags      = [for i in range(20) : "tag-${i}"]
  }
}
"##;

/// The issue body with what changes from run to run (commit, times, fingerprint, run, port)
/// as placeholders.
fn stable(body: &str) -> String {
    let mut out = body.to_string();
    for (pattern, placeholder) in [
        (r"\b[0-9a-f]{64}\b", "<fingerprint>"),
        (r"PLANBOT_CONFIRM=[0-9a-f]{12}", "PLANBOT_CONFIRM=<prefix>"),
        (r"`[0-9a-f]{8}`", "`<commit>`"),
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "<time>"),
        (r"localhost:\d+/runs/\d+", "localhost:<port>/runs/<run>"),
    ] {
        out = regex::Regex::new(pattern)
            .unwrap()
            .replace_all(&out, placeholder)
            .into_owned();
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_deep_in_a_big_object_shows_by_its_path_in_the_output_the_issue_and_the_run_page()
{
    let engine = require_engine!();
    let w = world(&engine);
    w.gitlab
        .commit_files(&w.project, "main", &[("main.tf", BIG_VM_TF)]);
    let s = TestService::start(w.config.clone(), no_workers()).await;

    // Applied as `main` says (the first check finds it never applied; its issue's confirm).
    check(&s).await;
    let prefix = confirm_in(&w.gitlab.issues(&w.project)[0].description);
    let job = w.apply_job(51);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, &format!(r#"{{"confirm":"{prefix}"}}"#)).await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");

    // Someone grows the third disk by hand: one number, far past the first 80 characters of
    // the attribute's JSON.
    w.edit_state(|state| {
        for r in state["resources"].as_array_mut().unwrap() {
            if r["name"] == "vm" {
                r["instances"][0]["attributes"]["input"]["value"]["disks"][2]["size"] = 64.into();
            }
        }
    })
    .await;
    let drifted = check(&s).await;
    let (verdict, _) = one_root(&drifted);
    let DriftVerdict::Drifted { resources } = verdict else {
        panic!("expected drift: {verdict:?}");
    };
    assert_eq!(
        resources[0].diff,
        "~ input.disks[2].size = 32 -> 64\n~ output = (known after apply) -> {…}\n",
        "the one leaf that changed, by its path, main -> reality (and the engine's own output)"
    );

    // The terminal output of `planbot drift`.
    let text = drifted.render_text(&s.app.scrubber, "planbot-apply");
    assert!(
        text.contains(
            "    terraform_data.vm (update), main -> reality:\n      ~ input.disks[2].size = 32 -> 64\n"
        ),
        "{text}"
    );

    // The issue: the diff in a fenced block, nothing cut, and where the run's log is.
    let body = w.gitlab.issues(&w.project)[0].description.clone();
    assert!(
        body.contains("```diff\n~ input.disks[2].size = 32 -> 64\n"),
        "{body}"
    );
    for unchanged in ["input.cores", "user_data", "disks[1]", "tags"] {
        assert!(!body.contains(unchanged), "only what changed: {body}");
    }
    let run = drifted.roots[0].run.expect("a drift run");
    assert!(
        body.contains(&format!(
            "log on the planbot host: `http://localhost:{}/runs/{run}`",
            s.app.config.listen.port()
        )),
        "{body}"
    );
    insta::assert_snapshot!(stable(&body));

    // The run page shows the same diff.
    let (status, page) = s.newest_run_page(RunKind::Drift).await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert!(
        page.contains("~ input.disks[2].size = 32 -&gt; 64"),
        "{page}"
    );
}
