//! GitLab's merge request widgets: the CI component's `planbot-widgets` job, run for real (`sh`
//! and `curl`) in a merge request pipeline against planbot and the fake GitLab, downloads the
//! reviewed plan as GitLab's Terraform report and Code Quality report; both validate with the
//! reports' schemas (`tests/fixtures/gitlab-reports/`), the counts are the note's table, the
//! findings sit at the line of their resource. The endpoint gives a job only its own merge
//! request's reviewed plan, and says why not otherwise.

use crate::apply_story::{no_workers, with_workers, World};
use crate::ci_template::{interpolate, TEMPLATE};
use crate::support::fake_gitlab::FakeJob;
use crate::support::service::TestService;
use std::process::Command;

/// The engine: `plan` copies the root's `plan.json` (bpg-shaped fixtures a real engine made),
/// `show` prints it, the checks pass.
fn fake_engine(dir: &std::path::Path) -> std::path::PathBuf {
    crate::support::fake_engine::fake_engine(
        dir,
        "terraform",
        crate::support::fake_engine::TERRAFORM_VERSION_JSON,
        r#"case "$1" in
  init) mkdir -p .terraform && echo '{"backend":{"type":"http"}}' > .terraform/terraform.tfstate; exit 0 ;;
  plan) for a in "$@"; do case "$a" in -out=*) cp plan.json "${a#-out=}" ;; esac; done; exit 0 ;;
  show) cat "$3"; exit 0 ;;
  validate) echo '{"format_version":"1.0","valid":true,"error_count":0,"warning_count":0,"diagnostics":[]}'; exit 0 ;;
  fmt) exit 0 ;;
esac
exit 1"#,
    )
}

/// planbot's own policy set: a warning per deleted resource, and one per update that quotes
/// the resource's (sensitive) description, which must never reach a report.
const OPERATOR_REGO: &str = r#"package main

warn[msg] {
	rc := input.resource_changes[_]
	rc.change.actions[_] == "delete"
	msg := sprintf("%s is deleted: is there a backup?", [rc.address])
}

warn[msg] {
	rc := input.resource_changes[_]
	rc.change.actions == ["update"]
	msg := sprintf("%s changes; description %v", [rc.address, rc.change.after.description])
}
"#;

const CANARY: &str = "widget-canary-d41c9e";
const NAME_CANARY: &str = "widget-name-canary-5b7e02";

const BACKEND: &str = "terraform {\n  backend \"http\" {}\n}\n";
/// `web` opens on line 3 of lab/vms.tf.
const LAB_VMS_TF: &str = "# The lab's VMs.\n\nresource \"proxmox_virtual_environment_vm\" \"web\" {\n  name = \"web\"\n}\n";
/// `half_checksum` opens on line 5 of prod/main.tf.
const PROD_TF: &str = "terraform {\n  backend \"http\" {}\n}\n\nresource \"proxmox_virtual_environment_download_file\" \"half_checksum\" {\n  url = \"https://example.test/x.iso\"\n}\n";

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/plans/bpg/{name}.json")),
    )
    .unwrap()
}

struct Setup {
    w: World,
    _bin: tempfile::TempDir,
}

/// Two roots (`lab`, `prod`) on `main`, planbot's policy set configured.
fn setup() -> Setup {
    let bin = tempfile::tempdir().unwrap();
    let engine = fake_engine(bin.path());
    let w = World::homelab(&engine)
        .operator_policy("backups", &[("backups.rego", OPERATOR_REGO)])
        .planbot_toml(
            "[[roots]]\nname = \"lab\"\ndir = \"lab\"\n\n[[roots]]\nname = \"prod\"\ndir = \"prod\"\n",
        )
        .files(&[("lab/main.tf", BACKEND), ("prod/main.tf", BACKEND)])
        .build();
    Setup { w, _bin: bin }
}

/// Alice's MR: lab deletes two VMs and updates `web` (its description a sensitive canary),
/// prod creates five downloads (one with a checksum but no algorithm: PVE004, an error).
fn open_mr_files(w: &World) -> u64 {
    let mut lab: serde_json::Value =
        serde_json::from_str(&fixture("vm_destroyed_and_updated")).unwrap();
    for rc in lab["resource_changes"].as_array_mut().unwrap() {
        if rc["address"] == "proxmox_virtual_environment_vm.web" {
            rc["change"]["after"]["description"] = CANARY.into();
            rc["change"]["after_sensitive"]["description"] = true.into();
        }
        // The deleted VM's name, which PVE008's message quotes, is sensitive.
        if rc["address"] == "proxmox_virtual_environment_vm.old_db" {
            rc["change"]["before"]["name"] = NAME_CANARY.into();
            rc["change"]["before_sensitive"]["name"] = true.into();
        }
    }
    w.gitlab.commit_files(
        &w.project,
        "widgets",
        &[
            ("lab/plan.json", &lab.to_string()),
            ("lab/vms.tf", LAB_VMS_TF),
            ("prod/plan.json", &fixture("checksum_and_unknowns")),
            ("prod/main.tf", PROD_TF),
        ],
    );
    w.gitlab
        .open_mr_by(&w.project, "widgets", "main", &w.alice())
}

/// Alice's MR of [`open_mr_files`]' changes from `outsider/homelab`, a fork of the project
/// (the parent project runs its pipelines, so the job's project is one planbot reviews).
fn open_fork_mr(w: &World) -> u64 {
    let fork = w.gitlab.fork_project(&w.project, "outsider/homelab");
    w.gitlab.commit_files(
        &fork,
        "from-fork",
        &[
            ("lab/plan.json", &fixture("vm_destroyed_and_updated")),
            ("lab/vms.tf", LAB_VMS_TF),
        ],
    );
    let outsider = w.gitlab.create_user("outsider");
    w.gitlab
        .open_mr_from(&fork, "from-fork", &w.project, "main", &outsider)
}

/// A running job of the MR's pipeline (`refs/merge-requests/IID/head`, or `/merge` for a
/// merged-results pipeline, whose commit is not the head).
fn mr_job(w: &World, id: u64, git_ref: &str, sha: &str) -> FakeJob {
    FakeJob {
        token: format!("glcbt-widgets-{id}"),
        id,
        name: "planbot-widgets".into(),
        status: "running".into(),
        ref_: git_ref.into(),
        tag: false,
        user: Some(w.alice().clone()),
        pipeline_id: 5000 + id,
        project_id: w.project.id,
        sha: sha.into(),
    }
}

/// The component's widgets job as GitLab would make it from the served component.
fn widgets_job() -> serde_yaml::Value {
    let jobs: serde_yaml::Value = serde_yaml::from_str(
        &interpolate(TEMPLATE, &[("planbot_url", "https://planbot.example.com")]).unwrap(),
    )
    .unwrap();
    jobs["planbot-widgets"].clone()
}

/// Run the widgets job's script as a runner would (`sh -c`, the CI variables set) in `dir`.
async fn run_widgets_script(url: &str, token: &str, dir: &std::path::Path) -> (bool, String) {
    let script = widgets_job()["script"][0].as_str().unwrap().to_string();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(script)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("PLANBOT_URL", url)
        .env("CI_JOB_TOKEN", token);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `check-jsonschema` (scripts/install-test-tools.sh): `file` against `schema`.
fn validates(schema: &str, file: &std::path::Path) -> Result<(), String> {
    let checker = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("check-jsonschema"))
        .find(|p| p.is_file())
        .expect("check-jsonschema is not installed: run scripts/install-test-tools.sh (pip install check-jsonschema==0.39.0)");
    let schema = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gitlab-reports")
        .join(schema);
    let out = Command::new(checker)
        .arg("--schemafile")
        .arg(schema)
        .arg(file)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The note's table row of `root`: (add, change, destroy).
fn table_row(note: &str, root: &str) -> (usize, usize, usize) {
    let row = note
        .lines()
        .find(|l| l.starts_with(&format!("| <code>{root}</code> ")))
        .unwrap_or_else(|| panic!("no row for {root} in the note:\n{note}"));
    let cells: Vec<usize> = row
        .split('|')
        .skip(2)
        .filter_map(|c| c.split_whitespace().next()?.parse().ok())
        .collect();
    (cells[0], cells[1], cells[2])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mr_pipelines_job_downloads_the_reviewed_plan_as_gitlabs_terraform_and_code_quality_reports(
) {
    let setup = setup();
    let w = &setup.w;
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let iid = open_mr_files(w);
    let body = w.gitlab.mr_webhook(&w.project, iid).action("open").body();
    s.deliver_mr_opened(&body, iid).await;
    let note = w.wait_for_plan(&s, iid).await;
    let head = w.gitlab.mr_sha(&w.project, iid);

    let job = mr_job(w, 71, &format!("refs/merge-requests/{iid}/head"), &head);
    w.gitlab.register_job(job.clone());
    let dir = tempfile::tempdir().unwrap();
    let (ok, log) = run_widgets_script(&s.url(""), &job.token, dir.path()).await;
    assert!(ok, "{log}");
    let tf_file = dir.path().join("planbot-terraform.json");
    let cq_file = dir.path().join("planbot-codequality.json");
    // The files the job's `artifacts:reports` name, valid by GitLab's formats.
    let reports = &widgets_job()["artifacts"]["reports"];
    assert_eq!(
        reports["terraform"].as_str(),
        Some("planbot-terraform.json")
    );
    assert_eq!(
        reports["codequality"].as_str(),
        Some("planbot-codequality.json")
    );
    validates("terraform.schema.json", &tf_file).unwrap();
    validates("codequality.schema.json", &cq_file).unwrap();

    // The counts are the note's table, summed over the roots (one Terraform report per job).
    let tf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tf_file).unwrap()).unwrap();
    let (lab, prod) = (table_row(&note, "lab"), table_row(&note, "prod"));
    assert_eq!(lab, (0, 1, 2), "{note}");
    assert_eq!(prod, (5, 0, 0), "{note}");
    assert_eq!(
        tf,
        serde_json::json!({"create": lab.0 + prod.0, "update": lab.1 + prod.1, "delete": lab.2 + prod.2})
    );

    // Every finding of the note, at the block of its resource when the MR's files have one.
    let cq_text = std::fs::read_to_string(&cq_file).unwrap();
    let cq: Vec<serde_json::Value> = serde_json::from_str(&cq_text).unwrap();
    let find = |check: &str, address: &str| {
        cq.iter()
            .find(|i| {
                i["check_name"] == check && i["description"].as_str().unwrap().contains(address)
            })
            .unwrap_or_else(|| panic!("no {check} on {address} in {cq_text}"))
            .clone()
    };
    let pve004 = find(
        "PVE004",
        "proxmox_virtual_environment_download_file.half_checksum",
    );
    assert_eq!(pve004["severity"], "critical");
    assert_eq!(pve004["location"]["path"], "prod/main.tf");
    assert_eq!(pve004["location"]["lines"]["begin"], 5);
    let pve019 = find("PVE019", "proxmox_virtual_environment_vm.web");
    assert_eq!(pve019["severity"], "major");
    assert_eq!(pve019["location"]["path"], "lab/vms.tf");
    assert_eq!(pve019["location"]["lines"]["begin"], 3);
    // A deleted VM has no block left: the root's first file.
    let pve008 = find("PVE008", "proxmox_virtual_environment_vm.old_db");
    assert_eq!(pve008["location"]["path"], "lab/main.tf");
    assert_eq!(pve008["location"]["lines"]["begin"], 1);
    assert!(note.contains("PVE008") && note.contains("PVE004") && note.contains("PVE019"));
    // The policy set's warnings, as the note shows them.
    let backup = find("policy/backups", "proxmox_vm.scratch is deleted");
    assert_eq!(backup["severity"], "major");
    // The sensitive description reached the policy's message, and neither report.
    assert!(
        cq_text.contains("proxmox_virtual_environment_vm.web changes; description"),
        "{cq_text}"
    );
    assert!(!cq_text.contains(CANARY), "{cq_text}");
    assert!(!note.contains(CANARY));
    assert!(!cq_text.contains(NAME_CANARY), "{cq_text}");
    assert!(!note.contains(NAME_CANARY));
    // Each issue once, each fingerprint its own.
    let mut prints: Vec<&str> = cq
        .iter()
        .map(|i| i["fingerprint"].as_str().unwrap())
        .collect();
    prints.sort();
    prints.dedup();
    assert_eq!(prints.len(), cq.len());

    // A merged-results pipeline (its commit is not the head) gets the head's reviewed plan.
    let merged = mr_job(
        w,
        72,
        &format!("refs/merge-requests/{iid}/merge"),
        "0123456789abcdef0123456789abcdef01234567",
    );
    w.gitlab.register_job(merged.clone());
    let dir2 = tempfile::tempdir().unwrap();
    let (ok, log) = run_widgets_script(&s.url(""), &merged.token, dir2.path()).await;
    assert!(ok, "{log}");
    assert_eq!(
        std::fs::read_to_string(dir2.path().join("planbot-terraform.json")).unwrap(),
        std::fs::read_to_string(&tf_file).unwrap()
    );

    // An MR that affects no root is planned (nothing to plan) and has no report: the job
    // fails at once with planbot's reason (it is allowed to: a warning on the pipeline).
    w.gitlab
        .commit_files(&w.project, "docs-only", &[("README.md", "notes\n")]);
    let docs = w
        .gitlab
        .open_mr_by(&w.project, "docs-only", "main", &w.alice());
    let body = w.gitlab.mr_webhook(&w.project, docs).action("open").body();
    s.deliver_mr_opened(&body, docs).await;
    w.wait_for_plan(&s, docs).await;
    let docs_head = w.gitlab.mr_sha(&w.project, docs);
    let job = mr_job(
        w,
        73,
        &format!("refs/merge-requests/{docs}/head"),
        &docs_head,
    );
    w.gitlab.register_job(job.clone());
    let dir3 = tempfile::tempdir().unwrap();
    let (ok, log) = run_widgets_script(&s.url(""), &job.token, dir3.path()).await;
    assert!(!ok, "{log}");
    assert!(
        log.contains(&format!(
            "planbot: widgets: no reviewed plan of !{docs} at `{}`",
            &docs_head[..8]
        )),
        "{log}"
    );
    assert!(!dir3.path().join("planbot-terraform.json").exists());
}

/// POST to the widgets endpoint: status, `Retry-After`, body.
async fn ask(
    s: &TestService,
    report: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, Option<String>, String) {
    let mut req = s
        .http
        .post(s.url(&format!("/api/v1/widgets/{report}")))
        .body(body.to_string());
    if let Some(t) = token {
        req = req.header("JOB-TOKEN", t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (status, retry, r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_gets_only_its_own_merge_requests_reviewed_plan_and_is_told_why_not() {
    let setup = setup();
    let w = &setup.w;
    // No workers: the MR's plan job stays queued.
    let s = TestService::start(w.config.clone(), no_workers()).await;
    let iid = open_mr_files(w);
    let head = w.gitlab.mr_sha(&w.project, iid);
    let mr_ref = format!("refs/merge-requests/{iid}/head");
    let other = w.gitlab.create_project("someone/else");
    let mut seen = Vec::new();
    let mut check = |what: &str, got: (u16, Option<String>, String), status: u16| {
        assert_eq!(got.0, status, "{what}: {}", got.2);
        assert!(got.2.starts_with("planbot: widgets: "), "{what}: {}", got.2);
        seen.push(format!("{what} → {} {}", got.0, got.2.trim_end()));
        got
    };

    // Before the webhook: wait for it.
    let job = mr_job(w, 81, &mr_ref, &head);
    w.gitlab.register_job(job.clone());
    let (_, retry, _) = check(
        "planbot has not heard of the head yet",
        ask(&s, "terraform", Some(&job.token), "").await,
        503,
    );
    assert_eq!(retry.as_deref(), Some("15"));
    // The plan is queued: wait and ask again.
    let body = w.gitlab.mr_webhook(&w.project, iid).action("open").body();
    s.deliver_mr_opened(&body, iid).await;
    let (_, retry, _) = check(
        "the head's plan is queued",
        ask(&s, "codequality", Some(&job.token), "{}").await,
        503,
    );
    assert_eq!(retry.as_deref(), Some("15"));

    let mut foreign = mr_job(w, 82, "refs/merge-requests/1/head", &head);
    foreign.project_id = other.id;
    w.gitlab.register_job(foreign.clone());
    check(
        "a job of a project planbot does not review",
        ask(&s, "terraform", Some(&foreign.token), "").await,
        403,
    );
    let branch = mr_job(w, 83, "main", &head);
    w.gitlab.register_job(branch.clone());
    check(
        "a branch pipeline's job",
        ask(&s, "terraform", Some(&branch.token), "").await,
        403,
    );
    let mut done = mr_job(w, 84, &mr_ref, &head);
    done.status = "success".into();
    w.gitlab.register_job(done.clone());
    check(
        "a finished job's token",
        ask(&s, "terraform", Some(&done.token), "").await,
        401,
    );
    check("no token", ask(&s, "terraform", None, "").await, 401);
    check(
        "a body with fields",
        ask(&s, "terraform", Some(&job.token), r#"{"mr": 1}"#).await,
        400,
    );
    check(
        "a body over the bound",
        ask(&s, "terraform", Some(&job.token), &"x".repeat(4096)).await,
        413,
    );
    check(
        "an unknown report",
        ask(&s, "sast", Some(&job.token), "").await,
        404,
    );
    let gone = mr_job(
        w,
        85,
        &format!("refs/merge-requests/{}/merge", iid + 40),
        &head,
    );
    w.gitlab.register_job(gone.clone());
    check(
        "a merged-results pipeline of an MR that does not exist",
        ask(&s, "terraform", Some(&gone.token), "").await,
        404,
    );

    // Heads no plan will come for, each told why at once (404), not after an hour of 503s.
    // Alice pushes again: the queued plan of the old head is superseded (canceled), and the
    // old pipeline's job asks.
    let newer = w
        .gitlab
        .commit_files(&w.project, "widgets", &[("lab/notes.txt", "again\n")]);
    let body = w.gitlab.mr_webhook(&w.project, iid).oldrev(&head).body();
    assert_eq!(
        s.deliver(
            std::str::from_utf8(&body).unwrap(),
            &crate::support::service::token_headers(
                "Merge Request Hook",
                "push-2",
                crate::support::service::WEBHOOK_SECRET
            ),
        )
        .await,
        200
    );
    check(
        "a head superseded before its plan ran",
        ask(&s, "terraform", Some(&job.token), "").await,
        404,
    );
    // An MR whose webhook never came: waited for while its job is young, not after.
    w.gitlab
        .commit_files(&w.project, "lost-hook", &[("lab/main.tf", BACKEND)]);
    let lost = w
        .gitlab
        .open_mr_by(&w.project, "lost-hook", "main", &w.alice());
    let lost_head = w.gitlab.mr_sha(&w.project, lost);
    let lost_ref = format!("refs/merge-requests/{lost}/head");
    let young = mr_job(w, 86, &lost_ref, &lost_head);
    w.gitlab.register_job(young.clone());
    w.gitlab.set_job_created_ago(&young.token, 9 * 60);
    let (_, retry, _) = check(
        "a head planbot has not heard of, its job 9 minutes old",
        ask(&s, "terraform", Some(&young.token), "").await,
        503,
    );
    assert_eq!(retry.as_deref(), Some("15"));
    let old = mr_job(w, 87, &lost_ref, &lost_head);
    w.gitlab.register_job(old.clone());
    w.gitlab.set_job_created_ago(&old.token, 10 * 60 + 1);
    check(
        "a head planbot has not heard of, its job over 10 minutes old",
        ask(&s, "terraform", Some(&old.token), "").await,
        404,
    );
    w.gitlab.close_mr(&w.project, lost);
    check(
        "a closed MR's head",
        ask(&s, "terraform", Some(&young.token), "").await,
        404,
    );

    let text = seen
        .join("\n")
        .replace(&head[..8], "<head>")
        .replace(&newer[..8], "<newer>")
        .replace(&lost_head[..8], "<lost>")
        .replace(&format!("!{lost} "), "!<lost> ")
        .replace(&format!("(id {})", other.id), "(id <other>)");
    insta::assert_snapshot!(text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_mrs_widgets_job_is_told_at_once_that_a_maintainer_must_ask_and_gets_the_plan_after()
{
    let setup = setup();
    let w = &setup.w;
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let iid = open_fork_mr(w);
    let head = w.gitlab.mr_sha(&w.project, iid);
    // GitLab sends the webhook: planbot posts its fork notice and plans nothing.
    let body = w.gitlab.mr_webhook(&w.project, iid).action("open").body();
    s.deliver_mr_opened(&body, iid).await;
    let (gitlab, project) = (&w.gitlab, &w.project);
    s.after_job_ends("the fork notice", 60, || async {
        gitlab
            .notes(project, iid)
            .iter()
            .any(|n| n.body.contains("comes from a fork"))
    })
    .await;

    // The widgets job (the real script, curl retrying up to 55 minutes on a 503) ends at its
    // first request, with planbot's reason and what to do.
    let mr_ref = format!("refs/merge-requests/{iid}/head");
    let job = mr_job(w, 91, &mr_ref, &head);
    w.gitlab.register_job(job.clone());
    // The answer is definitive: 404, no Retry-After (asked directly first, so that a planbot
    // that has it wait fails here rather than keeping the script below retrying for an hour).
    let (status, retry, _) = ask(&s, "terraform", Some(&job.token), "").await;
    assert_eq!((status, retry), (404, None));
    let asked_before = w.gitlab.calls("GET /api/v4/job");
    let dir = tempfile::tempdir().unwrap();
    let (ok, log) = run_widgets_script(&s.url(""), &job.token, dir.path()).await;
    assert!(!ok, "{log}");
    let reason = format!(
        "planbot: widgets: !{iid} comes from a fork, so planbot plans it only when a \
             Maintainer of this project comments `planbot plan` on it (its code would run with \
             this project's credentials): run this job again once the plan note shows the plan \
             of `{}`",
        &head[..8]
    );
    assert!(log.lines().any(|l| l == reason), "{log}");
    assert!(log.contains("returned error: 404"), "{log}");
    assert_eq!(
        w.gitlab.calls("GET /api/v4/job") - asked_before,
        1,
        "one request, no retry"
    );
    assert!(!dir.path().join("planbot-terraform.json").exists());

    // A Maintainer asks; the plan runs; the job run again gets the reviewed plan.
    let hook = w
        .gitlab
        .note_webhook(&w.project, iid, &w.alice(), "planbot plan");
    assert_eq!(
        s.deliver(
            &hook.to_string(),
            &crate::support::service::token_headers(
                "Note Hook",
                "fork-plan",
                crate::support::service::WEBHOOK_SECRET
            ),
        )
        .await,
        200
    );
    let note = w.wait_for_plan(&s, iid).await;
    let again = mr_job(w, 92, &mr_ref, &head);
    w.gitlab.register_job(again.clone());
    let dir = tempfile::tempdir().unwrap();
    let (ok, log) = run_widgets_script(&s.url(""), &again.token, dir.path()).await;
    assert!(ok, "{log}");
    let tf: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("planbot-terraform.json")).unwrap(),
    )
    .unwrap();
    let lab = table_row(&note, "lab");
    assert_eq!(
        tf,
        serde_json::json!({"create": lab.0, "update": lab.1, "delete": lab.2})
    );
}

/// Anyone with a running CI job anywhere on the GitLab instance (their own project's) holds a
/// valid job token. Asked with it over and over, planbot must not spend its bot token on each
/// request: GitLab rate-limits the bot per user, and its notes and statuses would then fail.
/// The project of such a job is looked up once (and refused from memory afterwards), by the
/// widgets and the apply endpoint alike; a job of an allowed project is still asked about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_projects_job_asking_again_and_again_costs_planbot_one_bot_call() {
    let setup = setup();
    let w = &setup.w;
    let s = TestService::start(w.config.clone(), no_workers()).await;
    let other = w.gitlab.create_project("mallory/anything");
    let head = w.gitlab.branch_head(&w.project, "main").unwrap();
    let mut foreign = mr_job(w, 91, "refs/merge-requests/1/head", &head);
    foreign.project_id = other.id;
    foreign.ref_ = "main".into();
    w.gitlab.register_job(foreign.clone());
    let before = w.gitlab.all_calls();
    for i in 0..20 {
        let report = if i % 2 == 0 {
            "terraform"
        } else {
            "codequality"
        };
        let (status, _, text) = ask(&s, report, Some(&foreign.token), "").await;
        assert_eq!(status, 403, "{text}");
        let (_, log) = crate::apply_story::call_apply(&s, &foreign.token, "{}").await;
        assert!(
            log.contains("is not one of planbot's allowed projects"),
            "{log}"
        );
    }
    let after = w.gitlab.all_calls();
    let spent: std::collections::BTreeMap<&String, u32> = after
        .iter()
        .map(|(k, v)| (k, v - before.get(k).copied().unwrap_or(0)))
        .filter(|(k, v)| *v > 0 && k.as_str() != "GET /api/v4/job")
        .collect();
    assert_eq!(
        spent.values().sum::<u32>(),
        1,
        "40 requests of a foreign project's job cost planbot one bot-token call: {spent:?}"
    );
}
