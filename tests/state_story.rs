//! Stories of where the state lives, with the setups users run: GitLab-managed state with a
//! Developer's token for MR plans and a Maintainer's for applies (as the README's State section
//! configures it), a lock someone else holds, a root whose state would be lost in the checkout,
//! a secret that is a common word. Real engine, real git, the fake GitLab's state API.

mod service_support;
mod support;

use planbot::core::config::Config;
use planbot::flows::service::application::Options;
use service_support::TestService;
use support::fake_gitlab::{FakeGitLab, FakeJob, FakeProject, FakeUser, MAINTAINER};

const INFRA: &str = "infra/homelab";

/// A root with no backend block of its own: planbot gives it GitLab-managed state.
fn vms_tf(vms: &[&str]) -> String {
    let vms: Vec<String> = vms.iter().map(|v| format!("\"{v}\"")).collect();
    format!(
        r#"variable "vms" {{
  type    = set(string)
  default = [{}]
}}

resource "terraform_data" "vm" {{
  for_each = var.vms
  input    = {{ name = each.key }}
}}
"#,
        vms.join(", ")
    )
}

/// The fenced block right after `<!-- {marker} -->` in the README: the recipe as written.
fn readme_block(marker: &str) -> String {
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    let (_, after) = readme
        .split_once(&format!("<!-- {marker} -->"))
        .unwrap_or_else(|| panic!("the README has no `<!-- {marker} -->`"));
    let body = after
        .split_once("```")
        .and_then(|(_, b)| b.split_once('\n'))
        .map(|(_, b)| b)
        .unwrap();
    body.split_once("\n```").unwrap().0.to_string()
}

struct World {
    gitlab: FakeGitLab,
    project: FakeProject,
    alice: FakeUser,
    config: Config,
    _data: tempfile::TempDir,
}

/// The fake GitLab with `infra/homelab` (`.planbot.toml` and `files` on main), and planbot's
/// config: the README's state recipe as written (its token files holding a Developer's and a
/// Maintainer's token), plus `extra`.
fn world(
    engine: &std::path::Path,
    planbot_toml: &str,
    files: &[(&str, &str)],
    extra: &str,
) -> World {
    let gitlab = FakeGitLab::start();
    let project = gitlab.create_project(INFRA);
    let alice = gitlab.member_with_role(&project, "alice", MAINTAINER);
    let mut all = vec![(".planbot.toml", planbot_toml)];
    all.extend_from_slice(files);
    gitlab.commit_files(&project, "main", &all);
    let reader = gitlab.member_with_role(&project, "state-reader", support::fake_gitlab::DEVELOPER);
    let writer = gitlab.member_with_role(&project, "state-writer", MAINTAINER);
    let data = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
listen = "127.0.0.1:0"
data_dir = "{data}"
public_url = "http://planbot.test"
fingerprint_key = "test-fingerprint-key-0123456789"

[gitlab]
url = "{url}"
token = "{bot}"
webhook_secret = "{secret}"
projects = ["{INFRA}"]

[engine]
binary = "{engine}"
timeout = "5m"
{extra}
{recipe}
"#,
        data = data.path().display(),
        url = gitlab.url(),
        bot = gitlab.bot_token(),
        secret = service_support::WEBHOOK_SECRET,
        engine = engine.display(),
        recipe = readme_block("state recipe: planbot.toml"),
    );
    let (plan_token, apply_token) = (reader.token.clone(), writer.token.clone());
    // The token files are names in $CREDENTIALS_DIRECTORY, as systemd's LoadCredential= fills it.
    let env = [(
        "CREDENTIALS_DIRECTORY".to_string(),
        "/run/credentials/planbot.service".to_string(),
    )];
    let config = Config::load(&text, &env, &move |path| match path {
        "/run/credentials/planbot.service/state-plan-token" => Ok(format!("{plan_token}\n")),
        "/run/credentials/planbot.service/state-apply-token" => Ok(format!("{apply_token}\n")),
        other => Err(format!("no file {other}")),
    })
    .expect("the README's state recipe is a valid config");
    World {
        gitlab,
        project,
        alice,
        config,
        _data: data,
    }
}

fn with_workers() -> Options {
    Options {
        workers: true,
        reconcile: false,
    }
}

impl World {
    /// Alice pushes `files` on `branch`, opens an MR, and GitLab delivers the webhook.
    async fn open_mr(&self, s: &TestService, branch: &str, files: &[(&str, &str)]) -> u64 {
        self.gitlab.commit_files(&self.project, branch, files);
        let iid = self
            .gitlab
            .open_mr_by(&self.project, branch, "main", &self.alice);
        let body = self
            .gitlab
            .mr_webhook(&self.project, iid)
            .action("open")
            .body();
        let status = s
            .deliver(
                std::str::from_utf8(&body).unwrap(),
                &service_support::token_headers(
                    "Merge Request Hook",
                    &format!("open-{iid}"),
                    service_support::WEBHOOK_SECRET,
                ),
            )
            .await;
        assert_eq!(status, 200);
        iid
    }

    /// The plan note once the MR head's `planbot/plan` status is final, and that status.
    async fn plan_of(&self, s: &TestService, iid: u64) -> (String, String) {
        let head = self.gitlab.mr_sha(&self.project, iid);
        let (gitlab, project) = (&self.gitlab, &self.project);
        s.eventually_for("a final planbot/plan status", 90, || async {
            gitlab
                .status(project, &head, "planbot/plan")
                .is_some_and(|st| st.state == "success" || st.state == "failed")
        })
        .await;
        let status = self
            .gitlab
            .status(&self.project, &head, "planbot/plan")
            .unwrap();
        let note = self
            .gitlab
            .notes(&self.project, iid)
            .into_iter()
            .find(|n| n.body.contains(planbot::core::render::NOTE_MARKER))
            .expect("a plan note");
        (
            note.body,
            format!(
                "{}: {}",
                status.state,
                status.description.unwrap_or_default()
            ),
        )
    }

    /// Merge the MR and run the manual apply job of `main`'s new head: the job's log.
    async fn merge_and_apply(&self, s: &TestService, iid: u64, job_id: u64) -> String {
        self.gitlab.merge_mr(&self.project, iid, Some(&self.alice));
        let job = FakeJob {
            token: format!("glcbt-job-{job_id}"),
            id: job_id,
            name: "planbot-apply".into(),
            status: "running".into(),
            ref_: "main".into(),
            tag: false,
            user: Some(self.alice.clone()),
            pipeline_id: 1000 + job_id,
            project_id: self.project.id,
            sha: self.gitlab.branch_head(&self.project, "main").unwrap(),
        };
        self.gitlab.register_job(job.clone());
        let r = s
            .http
            .post(s.url("/api/v1/apply"))
            .header("JOB-TOKEN", &job.token)
            .send()
            .await
            .expect("POST /api/v1/apply");
        r.text().await.unwrap()
    }

    /// The state API's requests so far, as `method target user`.
    fn state_calls(&self) -> Vec<String> {
        self.gitlab
            .state_requests()
            .iter()
            .map(|r| {
                format!(
                    "{} {} {} {}",
                    r.method,
                    r.target,
                    r.user.as_deref().unwrap_or("-"),
                    r.status
                )
            })
            .collect()
    }
}

fn last_line(log: &str) -> &str {
    log.lines()
        .rev()
        .find(|l| !l.starts_with("planbot: still working"))
        .unwrap_or("")
}

const MANAGED: &str =
    "[[roots]]\nname = \"core\"\ndir = \"stacks/core\"\nstate = { gitlab = \"homelab\" }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_plan_reads_the_state_with_a_developer_token_and_the_apply_writes_it_with_a_maintainers(
) {
    let engine = require_engine!();
    let w = world(
        &engine,
        MANAGED,
        &[("stacks/core/main.tf", &vms_tf(&["blocky"]))],
        "",
    );
    let s = TestService::start(w.config.clone(), with_workers()).await;

    // The first change: no state yet. The MR's plan reads it (a 404 is "none yet") and
    // nothing else: no lock, no write, with the Developer's token.
    let iid = w
        .open_mr(
            &s,
            "add-gitlab",
            &[("stacks/core/main.tf", &vms_tf(&["blocky", "gitlab"]))],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}\n{note}");
    assert!(note.contains("<code>core</code> | 2 | 0 | 0"), "{note}");
    let reads = w.state_calls();
    assert!(
        !reads.is_empty() && reads.iter().all(|c| c == "GET state state-reader 404"),
        "{reads:?}"
    );

    // Merged and applied: the Maintainer's token locks, writes the new state and unlocks.
    let log = w.merge_and_apply(&s, iid, 41).await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    let (state, lock) = w.gitlab.terraform_state(&w.project, "homelab");
    let state = String::from_utf8(state.expect("the apply wrote the state")).unwrap();
    assert!(
        state.contains("\"gitlab\"") && state.contains("\"blocky\""),
        "{state}"
    );
    assert!(lock.is_none(), "the lock is released");
    let applied: Vec<String> = w.state_calls().split_off(reads.len());
    assert!(
        applied
            .iter()
            .all(|c| c.contains(" state-writer ") && c.ends_with(" 200") || c.starts_with("GET")),
        "{applied:?}"
    );
    assert!(
        applied.iter().any(|c| c == "POST lock state-writer 200"),
        "{applied:?}"
    );
    assert!(
        applied.iter().any(|c| c == "POST state state-writer 200"),
        "{applied:?}"
    );
    assert!(
        applied.iter().any(|c| c == "DELETE lock state-writer 200"),
        "{applied:?}"
    );
    assert_eq!(
        w.gitlab
            .terraform_state_versions(&w.project, "homelab")
            .len(),
        1
    );

    // The next MR plans against that state: one more VM, and again only reads.
    let before = w.state_calls().len();
    let iid = w
        .open_mr(
            &s,
            "add-backup",
            &[(
                "stacks/core/main.tf",
                &vms_tf(&["blocky", "gitlab", "backup"]),
            )],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}\n{note}");
    assert!(note.contains("<code>core</code> | 1 | 0 | 0"), "{note}");
    let reads = &w.state_calls()[before..];
    assert!(
        !reads.is_empty() && reads.iter().all(|c| c == "GET state state-reader 200"),
        "{reads:?}"
    );
    // No token of any kind reached the note or the statuses.
    let head = w.gitlab.mr_sha(&w.project, iid);
    let statuses = format!("{:?}", w.gitlab.statuses(&w.project, &head));
    for token in ["state-reader", "state-writer"].map(|u| w.gitlab.user_named(u).unwrap().token) {
        assert!(!note.contains(&token) && !statuses.contains(&token) && !log.contains(&token));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_by_someone_else_says_who_since_when_and_how_to_release_it() {
    let engine = require_engine!();
    let w = world(
        &engine,
        MANAGED,
        &[("stacks/core/main.tf", &vms_tf(&["blocky"]))],
        "lock_timeout = \"2s\"\n",
    );
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let iid = w
        .open_mr(
            &s,
            "add-gitlab",
            &[("stacks/core/main.tf", &vms_tf(&["blocky", "gitlab"]))],
        )
        .await;
    let (_, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}");

    // Bob's laptop holds the lock (a crashed apply, a local `tofu apply`).
    let bob = w.gitlab.member_with_role(&w.project, "bob", MAINTAINER);
    w.gitlab
        .lock_terraform_state(&w.project, "homelab", &bob, "6c1f0e2a-held-by-bob");
    let log = w.merge_and_apply(&s, iid, 42).await;
    let verdict = last_line(&log);
    assert!(
        verdict.starts_with("planbot: apply failed: root `core`: the plan failed: the state of root `core` is locked by @bob since 20")
            && verdict.ends_with("(lock ID `6c1f0e2a-held-by-bob`)"),
        "{log}"
    );
    assert!(
        log.contains(
            "planbot: Another plan or apply holds the state lock; planbot waited 2s for it"
        ) && log.contains("`tofu force-unlock 6c1f0e2a-held-by-bob`"),
        "{log}"
    );
    // The MR hears it the same way.
    let result = w
        .gitlab
        .notes(&w.project, iid)
        .into_iter()
        .map(|n| n.body)
        .find(|b| b.contains("apply of"))
        .expect("an apply result note");
    assert!(result.contains("is locked by @bob since"), "{result}");
    // Nothing was written, and bob's lock is still his.
    assert_eq!(w.gitlab.terraform_state(&w.project, "homelab").0, None);
    let (_, lock) = w.gitlab.terraform_state(&w.project, "homelab");
    assert_eq!(lock.unwrap()["Who"], "bob");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_with_local_state_gets_the_rule_a_failed_status_and_an_apply_refused_before_the_engine_runs(
) {
    let engine = require_engine!();
    let w = world(
        &engine,
        "[[roots]]\nname = \"lab\"\ndir = \"stacks/lab\"\nstate = \"own\"\n",
        &[("stacks/lab/main.tf", &vms_tf(&["blocky"]))],
        "",
    );
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let iid = w
        .open_mr(
            &s,
            "add-gitlab",
            &[("stacks/lab/main.tf", &vms_tf(&["blocky", "gitlab"]))],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(
        status.starts_with("failed: STATE001: Root `lab` keeps its state in the checkout"),
        "{status}"
    );
    assert!(
        note.contains(
            "**STATE001**: Root `lab` keeps its state in the checkout (it has no backend block"
        ),
        "{note}"
    );
    assert!(
        note.contains("state = { gitlab = \"lab\" }"),
        "the fix to paste: {note}"
    );

    let log = w.merge_and_apply(&s, iid, 43).await;
    assert_eq!(
        last_line(&log),
        "planbot: apply refused: root `lab` keeps its state in the checkout (a `local` backend, or no backend at all): planbot applies in a throwaway checkout, so the new state would be lost",
        "{log}"
    );
    // Refused before any engine ran: no plan of the root in the job log, no engine output.
    assert!(!log.contains("planning `stacks/lab`"), "{log}");
    assert!(!log.contains("Initializing"), "{log}");
    assert!(w.gitlab.state_requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_that_is_a_common_word_is_hidden_and_planbots_own_lines_stay_whole() {
    let engine = require_engine!();
    // A database password "apply", handed to the root as a variable the root does not mark
    // sensitive; a user name "planbot" (no secret).
    let root = format!(
        "{}\nvariable \"db_password\" {{\n  type = string\n}}\n\nresource \"terraform_data\" \"db\" {{\n  input = \"user planbot, password ${{var.db_password}}\"\n}}\n",
        vms_tf(&["blocky"])
    );
    let w = world(
        &engine,
        MANAGED,
        &[("stacks/core/main.tf", &root)],
        "env = { TF_VAR_db_password = \"apply\", DB_USERNAME = \"planbot\" }\n",
    );
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let iid = w
        .open_mr(
            &s,
            "more",
            &[(
                "stacks/core/vm.tf",
                "resource \"terraform_data\" \"extra\" {}\n",
            )],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success: core: 3 to add"), "{status}");
    assert!(
        note.contains("user planbot, password (sensitive value)"),
        "the password is hidden, the user name is not: {note}"
    );
    assert!(!note.contains("password apply"), "{note}");
    let log = w.merge_and_apply(&s, iid, 44).await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(
        log.contains("planbot: root `core`: applying the reviewed plan"),
        "{log}"
    );
    assert!(!log.contains("password apply"), "{log}");
}
