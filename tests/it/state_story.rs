//! Stories of where the state lives, with the setups users run: GitLab-managed state with a
//! Developer's token for MR plans and a Maintainer's for applies (as the State section of
//! docs/workflow.md configures it), a lock someone else holds, a root whose state would be lost
//! in the checkout, a secret that is a common word. Real engine, real git, the fake GitLab's
//! state API.

use crate::support::fake_gitlab::{FakeGitLab, MAINTAINER, REPORTER};
use crate::support::service::TestService;
pub(crate) use crate::support::world::{verdict as last_line, with_workers, World};
use crate::support::world::{PlanbotConfig, WorldBuilder};

/// A root with no backend block of its own: planbot gives it GitLab-managed state.
pub(crate) fn vms_tf(vms: &[&str]) -> String {
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

/// The state stories' world: the fake GitLab's `infra/homelab` with `.planbot.toml` on main
/// (and the files said next), and planbot's config with the documented state recipe as written,
/// its token files holding a Developer's and a Maintainer's token.
pub(crate) fn world<'a>(engine: &std::path::Path, planbot_toml: &str) -> WorldBuilder<'a> {
    World::builder()
        .engine(engine)
        .documented_state()
        .planbot_toml(planbot_toml)
}

const MANAGED: &str =
    "[[roots]]\nname = \"core\"\ndir = \"stacks/core\"\nstate = { gitlab = \"homelab\" }\n";

/// The world of [`MANAGED`] (one VM on main, `extra` config), its service, and an MR that adds
/// a second VM, planned: the MR, its note and its status.
async fn managed_mr(engine: &std::path::Path, extra: &str) -> (World, TestService, u64, String) {
    let w = world(engine, MANAGED)
        .file("stacks/core/main.tf", &vms_tf(&["blocky"]))
        .engine_lines(extra)
        .build();
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let iid = w
        .open_mr(
            &s,
            "add-gitlab",
            &[("stacks/core/main.tf", &vms_tf(&["blocky", "gitlab"]))],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}\n{note}");
    (w, s, iid, note)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_plan_reads_the_state_with_a_developer_token_and_the_apply_writes_it_with_a_maintainers(
) {
    let engine = require_engine!();
    // The first change: no state yet. The MR's plan reads it (a 404 is "none yet") and
    // nothing else: no lock, no write, with the Developer's token.
    let (w, s, iid, note) = managed_mr(&engine, "").await;
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
    let (w, s, iid, _) = managed_mr(&engine, "lock_timeout = \"2s\"\n").await;

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
    )
    .file("stacks/lab/main.tf", &vms_tf(&["blocky"]))
    .build();
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
    // Issue 35 item 3: the run pages and /metrics carry the verdict the status and the red
    // headline carry (they said "succeeded").
    assert!(note.contains("### 🔴"), "{note}");
    let run = s.app.store.recent_runs(1).await.unwrap()[0].id;
    let row = "<td class=\"state state-failed\">failed</td>";
    for path in ["/".to_string(), "/runs".to_string()] {
        let (code, page) = s.get_text(&path).await;
        assert_eq!(code, 200, "{path}");
        assert!(page.contains(row), "{path} does not say failed:\n{page}");
        assert!(
            !page.contains("state-succeeded\">succeeded"),
            "{path}:\n{page}"
        );
    }
    let (_, page) = s.get_text(&format!("/runs/{run}")).await;
    assert!(
        page.contains("<span class=\"state badge state-failed\">failed</span>"),
        "{page}"
    );
    let metrics = s.metrics().await;
    assert!(
        metrics.contains("planbot_plan_duration_seconds_count{outcome=\"failed\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("planbot_plan_duration_seconds_count{outcome=\"succeeded\"}"),
        "{metrics}"
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
    let w = world(&engine, MANAGED)
        .file("stacks/core/main.tf", &root)
        .engine_lines("env = { TF_VAR_db_password = \"apply\", DB_USERNAME = \"planbot\" }\n")
        .build();
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

/// Everything under `dir` (the SQLite store included) that holds `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p)
                .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                found.push(p);
            }
        }
    }
    found
}

/// A root calling the module `vm` of the private project `infra/modules` as `name`.
fn module_call(gitlab: &FakeGitLab, name: &str) -> String {
    format!(
        "module \"{name}\" {{\n  source = \"git::{}/infra/modules.git//vm?ref=main\"\n  name   = \"{name}\"\n}}\n",
        gitlab.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_using_a_module_from_a_private_gitlab_project_plans_and_the_token_shows_nowhere() {
    let engine = require_engine!();
    let mut reader_token = String::new();
    let w = world(&engine, MANAGED)
        .prepare(|gitlab, p| {
            // infra/modules: private, readable by its members only (not even planbot's bot).
            let modules = gitlab.create_project("infra/modules");
            gitlab.remove_member(&modules, gitlab.bot());
            gitlab.commit_files(
                &modules,
                "main",
                &[(
                    "vm/main.tf",
                    "variable \"name\" {\n  type = string\n}\n\nresource \"terraform_data\" \"vm\" {\n  input = { name = var.name }\n}\n",
                )],
            );
            let reader = gitlab.member_with_role(&modules, "modules-reader", REPORTER);
            reader_token = reader.token.clone();
            let token = format!("\"{}\"", reader.token);
            p.config = std::mem::take(&mut p.config)
                .set("modules", "projects", "[\"infra/modules\"]")
                .set("modules.plan", "token", &token)
                .set("modules.apply", "token", &token);
            p.files
                .push(("stacks/core/main.tf".to_string(), module_call(gitlab, "blocky")));
        })
        .build();
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let iid = w
        .open_mr(
            &s,
            "second-vm",
            &[("stacks/core/dns.tf", &module_call(&w.gitlab, "dns"))],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}\n{note}");
    assert!(note.contains("module.dns.terraform_data.vm"), "{note}");
    // git fetched the private project with the module token (as `planbot`), and only that way.
    let fetches: Vec<_> = w
        .gitlab
        .git_requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/infra/modules.git/"))
        .collect();
    assert!(!fetches.is_empty());
    assert!(
        fetches
            .iter()
            .all(|r| r.auth_user.as_deref() == Some("planbot") && r.status == 200),
        "{fetches:?}"
    );

    // Merged and applied: the default branch's `init` fetches the modules too.
    let log = w.merge_and_apply(&s, iid, 45).await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(
        log.contains("module.dns.terraform_data.vm: Creation complete"),
        "{log}"
    );

    // The token is in no note, status, job log, run page or stored file.
    let mut places = vec![("job log".to_string(), log)];
    let head = w.gitlab.mr_sha(&w.project, iid);
    places.push((
        "statuses".into(),
        format!("{:?}", w.gitlab.statuses(&w.project, &head)),
    ));
    for n in w.gitlab.notes(&w.project, iid) {
        places.push(("a note".into(), n.body));
    }
    let (_, runs) = s.get_text("/runs").await;
    places.push(("/runs".into(), runs));
    for run in s.app.store.recent_runs(20).await.unwrap() {
        let (code, page) = s.get_text(&format!("/runs/{}", run.id)).await;
        assert_eq!(code, 200);
        places.push((format!("/runs/{}", run.id), page));
    }
    for (place, text) in &places {
        assert!(
            !text.contains(&reader_token),
            "the module token is in {place}"
        );
    }
    assert_eq!(
        files_holding(&w.config.data_dir, &reader_token),
        Vec::<std::path::PathBuf>::new(),
        "the module token is stored"
    );
}

/// planbot's config with the `http` backend set up by hand in the engine's environment, at the
/// fake GitLab's state API on its loopback port (not 443), its data in `data`.
fn hand_made_backend_config(
    w: &World,
    data: &std::path::Path,
    engine: &std::path::Path,
) -> PlanbotConfig {
    let reader = w.user("state-reader");
    PlanbotConfig::serving(w.gitlab.url(), w.gitlab.bot_token(), data)
        .engine(engine)
        .metrics()
        .set(
            "engine.env",
            "TF_HTTP_ADDRESS",
            &format!("\"{}\"", w.state_url("core")),
        )
        .set("engine.env", "TF_HTTP_USERNAME", "\"planbot\"")
        .set(
            "engine.plan.env",
            "TF_HTTP_PASSWORD",
            &format!("\"{}\"", reader.token),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_backend_on_another_port_is_flagged_by_check_and_its_refused_connect_explained() {
    let engine = require_engine!();
    let backend_tf = "terraform {\n  backend \"http\" {}\n}\n";
    let w = world(
        &engine,
        "[[roots]]\nname = \"core\"\ndir = \"stacks/core\"\nstate = \"own\"\n",
    )
    .files(&[
        ("stacks/core/backend.tf", backend_tf),
        ("stacks/core/main.tf", &vms_tf(&["blocky"])),
    ])
    .build();
    let port = url::Url::parse(w.gitlab.url()).unwrap().port().unwrap();
    let setting = format!("connect_ports = [443, {port}]");

    // `serve --check` names the setting, the port and what would fail.
    let dir = tempfile::tempdir().unwrap();
    let blocked = hand_made_backend_config(&w, &dir.path().join("data"), &engine);
    let file = blocked.write(dir.path());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_planbot"))
        .args(["serve", "--check", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("config key `engine.env.TF_HTTP_ADDRESS`: `127.0.0.1:{port}` (a server the engine's environment names) is on a port the engine's sandbox blocks"))
            && stderr.contains(&format!("Add the port: `[sandbox] {setting}`")),
        "{stderr}"
    );

    // Run anyway, the MR's plan fails; the note says why and which setting allows it.
    let s = TestService::start(blocked.load(), with_workers()).await;
    let iid = w
        .open_mr(
            &s,
            "add-gitlab",
            &[("stacks/core/main.tf", &vms_tf(&["blocky", "gitlab"]))],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("failed"), "{status}");
    assert!(note.contains("connect: permission denied"), "{note}");
    assert!(
        note.contains(&format!(
            "sandbox refused a connection to 127.0.0.1, port {port}"
        )) && note.contains(&format!("`[sandbox] {setting}`")),
        "{note}"
    );
    drop(s);

    // With the port allowed, `--check` is content and the same MR plans.
    let data = tempfile::tempdir().unwrap();
    let allowed = hand_made_backend_config(&w, data.path(), &engine).sandbox_reaches(port);
    allowed.write(dir.path());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_planbot"))
        .args(["serve", "--check", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("- let the engine connect to 127.0.0.1:{port} (a server the engine's environment names, engine.env.TF_HTTP_ADDRESS)")),
        "{stdout}"
    );
    let s = TestService::start(allowed.load(), with_workers()).await;
    let iid = w
        .open_mr(
            &s,
            "add-backup",
            &[("stacks/core/main.tf", &vms_tf(&["blocky", "backup"]))],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}\n{note}");
}

/// Project B's state `prod`: a sensitive output and a plain one.
const B_SECRET: &str = "B-prod-db-password-7f3a9c";
const B_IP: &str = "10.9.8.7";

/// An MR file of project A that reads state `prod` of project `b` through the `http` backend at
/// `address` (HCL), and shows its outputs in a resource (the sensitive one `nonsensitive`).
fn remote_state_peek(address: &str) -> String {
    format!(
        r#"data "terraform_remote_state" "prod" {{
  backend = "http"
  config = {{
    address = {address}
  }}
}}

resource "terraform_data" "peek" {{
  input = "${{nonsensitive(data.terraform_remote_state.prod.outputs.db_password)}} ${{data.terraform_remote_state.prod.outputs.admin_ip}}"
}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_reading_another_projects_state_is_refused_and_the_note_says_why() {
    let engine = require_engine!();
    // One Developer token (`state-reader`) for MR plans of two projects: infra/homelab (A,
    // planned here) and infra/prod (B), whose state `prod` holds a password.
    // The operator's provider mirror holds a provider that runs a program of the root (as
    // `hashicorp/external` does): MR code runs with the engine's environment.
    let mirror = tempfile::tempdir().unwrap();
    let bin = mirror
        .path()
        .join("registry.terraform.io/evil/peek/1.0.0/linux_amd64/terraform-provider-peek_v1.0.0");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::write(&bin, "#!/bin/sh\nexec sh ./peek.sh\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mirror_path = mirror.path().display().to_string();
    let mut b_id = 0;
    let w = world(&engine, MANAGED)
        .prepare(|gitlab, p| {
            let b = gitlab.create_project("infra/prod");
            gitlab.member_with_role(&b, "state-reader", crate::support::fake_gitlab::DEVELOPER);
            gitlab.put_terraform_state(
                &b,
                "prod",
                &serde_json::json!({
                    "version": 4, "terraform_version": "1.11.4", "serial": 3, "lineage": "b-lineage",
                    "outputs": {
                        "db_password": {"value": B_SECRET, "type": "string", "sensitive": true},
                        "admin_ip": {"value": B_IP, "type": "string"}
                    },
                    "resources": [], "check_results": null
                }),
            );
            b_id = b.id;
            let port = url::Url::parse(gitlab.url()).unwrap().port().unwrap();
            p.files
                .push(("stacks/core/main.tf".to_string(), vms_tf(&["blocky"])));
            // GitLab's port open to the engine: what stops the direct read is the credential.
            p.config = std::mem::take(&mut p.config)
                .set("engine", "provider_mirror", &format!("\"{mirror_path}\""))
                .sandbox_reaches(port);
        })
        .build();
    let a_id = w.project.id;
    let s = TestService::start(w.config.clone(), with_workers()).await;

    // 1. MR code that runs a program with the engine's environment (a "provider" committed in
    //    the root) takes the address and credential of A's own state, swaps in B's project and
    //    state, asks, and prints what it got where the engine quotes it.
    let peek = format!(
        "b=$(printf %s \"$TF_HTTP_ADDRESS\" | sed 's#/projects/{a_id}/terraform/state/homelab#/projects/{b_id}/terraform/state/prod#')\n\
         echo \"peeked $b: $(curl -s -u \"$TF_HTTP_USERNAME:$TF_HTTP_PASSWORD\" \"$b\" | tr -d '\\n')\"\n\
         exit 1\n"
    );
    let iid = w
        .open_mr(
            &s,
            "peek-through-backend",
            &[
                ("stacks/core/peek.sh", &peek),
                (
                    "stacks/core/peek.tf",
                    "terraform {\n  required_providers {\n    peek = { source = \"evil/peek\" }\n  }\n}\n\nprovider \"peek\" {}\n",
                ),
            ],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("failed"), "{status}\n{note}");
    assert!(note.contains("peeked"), "the MR's program ran: {note}");
    assert!(
        !note.contains(B_SECRET) && !note.contains(B_IP),
        "B's state reached A's note: {note}"
    );
    assert!(
        note.contains(&format!(
            "planbot refused this plan's read of project {b_id}'s state `prod`: a plan of project {a_id} may read only project {a_id}'s states"
        )),
        "{note}"
    );

    // 2. B's state at GitLab's address, as GitLab's docs write it (a token of the author's
    //    own from a variable): planbot's override reads it through the gate, which refuses
    //    another project's state.
    let direct = format!(
        "\"{}/api/v4/projects/{b_id}/terraform/state/prod\"",
        w.gitlab.url()
    );
    let with_token = remote_state_peek(&format!(
        "{direct}\n    username = \"author\"\n    password = var.my_token"
    )) + "variable \"my_token\" {\n  default = \"glpat-the-authors-own\"\n}\n";
    let iid = w
        .open_mr(
            &s,
            "peek-as-gitlab-docs-write-it",
            &[("stacks/core/peek.tf", &with_token)],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("failed"), "{status}\n{note}");
    assert!(
        !note.contains(B_SECRET) && !note.contains(B_IP),
        "B's state reached A's note: {note}"
    );
    assert!(
        note.contains(&format!(
            "planbot refused this plan's read of project {b_id}'s state `prod`: a plan of project {a_id} may read only project {a_id}'s states"
        )),
        "{note}"
    );
    assert!(
        w.gitlab.state_requests().iter().all(|r| r.name != "prod"),
        "the gate refused it: nothing reached GitLab"
    );

    // 3. Code that overrides planbot's override (a later `*_override.tf`) reads B's state
    //    straight at GitLab: the engine's credential is no use there.
    let undo = format!(
        "data \"terraform_remote_state\" \"prod\" {{\n  config = {{\n    address = {direct}\n  }}\n}}\n"
    );
    let iid = w
        .open_mr(
            &s,
            "peek-at-gitlab",
            &[
                ("stacks/core/peek.tf", &remote_state_peek(&direct)),
                ("stacks/core/zz_override.tf", &undo),
            ],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("failed"), "{status}\n{note}");
    assert!(
        !note.contains(B_SECRET) && !note.contains(B_IP),
        "B's state reached A's note: {note}"
    );
    assert!(
        note.contains("valid only at planbot's state gate, for project"),
        "{note}"
    );

    // GitLab never answered B's state to anyone: the direct reads came without a token it knows.
    let prod: Vec<String> = w
        .gitlab
        .state_requests()
        .iter()
        .filter(|r| r.name == "prod")
        .map(|r| format!("{} {} {:?} {}", r.method, r.target, r.user, r.status))
        .collect();
    assert!(!prod.is_empty(), "the direct read reached GitLab");
    assert!(prod.iter().all(|r| r == "GET state None 401"), "{prod:?}");
}

#[test]
fn check_warns_when_one_plan_token_serves_several_projects() {
    let report = |projects: &[&str]| {
        let config = PlanbotConfig::for_gitlab("https://gitlab.lab.internal", "glpat-bot")
            .set("gitlab", "webhook_secret", "\"s\"")
            .projects(projects)
            .set("state", "default", "\"gitlab\"")
            .set("state.plan", "token", "\"glpat-reader\"")
            .load();
        planbot::flows::cli::serve::check_report(&config)
    };
    let two = report(&["infra/homelab", "infra/lab"]);
    assert!(
        two.contains("- WARNING: read the GitLab-managed state of 2 projects (infra/homelab, infra/lab) with one [state.plan] token: MR code never holds it (each job's state gate lets a plan read only its own project's states)"),
        "{two}"
    );
    let one = report(&["infra/homelab"]);
    assert!(!one.contains("[state.plan] token"), "{one}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_gate_wants_its_own_credential_and_passes_gitlabs_answers_through() {
    use planbot::capabilities::state_gate::{GateProject, StateGate};
    use planbot::core::config::{GitlabCredential, Secret};
    use planbot::core::state::GateAccess;
    let gitlab = FakeGitLab::start();
    let project = gitlab.create_project(crate::support::world::INFRA);
    let writer = gitlab.member_with_role(&project, "state-writer", MAINTAINER);
    let bob = gitlab.member_with_role(&project, "bob", MAINTAINER);
    gitlab.lock_terraform_state(&project, "homelab", &bob, "held-by-bob");
    let upstream = GitlabCredential {
        username: "planbot".into(),
        token: Secret::new(writer.token.clone()),
    };
    let own = GateProject {
        id: project.id,
        path: Some(crate::support::world::INFRA.into()),
    };
    let gate = StateGate::start(own, GateAccess::ReadWrite, gitlab.url(), &upstream, &[443])
        .await
        .unwrap()
        .pass("homelab");
    let env = gate.env();
    let (address, user, password) = (
        env["TF_HTTP_ADDRESS"].clone(),
        env["TF_HTTP_USERNAME"].clone(),
        env["TF_HTTP_PASSWORD"].clone(),
    );
    assert_eq!(
        address,
        format!(
            "http://127.0.0.1:{}/api/v4/projects/{}/terraform/state/homelab",
            gate.port(),
            project.id
        )
    );
    assert!(!address.contains(gitlab.url()) && password != writer.token);
    let http = reqwest::Client::new();

    // The job's credential, nothing else: a wrong password, or GitLab's own token, is a 401.
    for (u, p) in [(user.as_str(), "wrong"), ("planbot", writer.token.as_str())] {
        let r = http
            .get(&address)
            .basic_auth(u, Some(p))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
    }
    // The job's credential is nothing at GitLab.
    let at_gitlab = format!(
        "{}/api/v4/projects/{}/terraform/state/homelab",
        gitlab.url(),
        project.id
    );
    let r = http
        .get(&at_gitlab)
        .basic_auth(&user, Some(&password))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // GitLab's answers as they are: a held lock's 409 with its lock info.
    let r = http
        .post(format!("{address}/lock"))
        .basic_auth(&user, Some(&password))
        .json(&serde_json::json!({"ID": "mine", "Operation": "OperationTypeApply"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let held: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (held["ID"].as_str(), held["Who"].as_str()),
        (Some("held-by-bob"), Some("bob"))
    );
    let calls: Vec<String> = gitlab
        .state_requests()
        .iter()
        .map(|r| format!("{} {} {:?} {}", r.method, r.target, r.user, r.status))
        .collect();
    assert_eq!(
        calls,
        [
            "GET state None 401".to_string(),
            "POST lock Some(\"state-writer\") 409".to_string()
        ],
        "the gate forwarded only the allowed call, with the real token"
    );
    let refused = gate.refusals();
    assert_eq!(
        refused,
        ["planbot refused a request to this run's state gate without the job's own credential"]
    );
}
