//! The plan flow end to end against the fake GitLab and the real engine: an MR push gets one
//! plan note (edited in place, re-created when deleted), commit statuses, stored fingerprints;
//! only the roots the change touches are planned; the config comes from the default branch.

use crate::support::world::World;
use planbot::core::ids::{MrIid, ProjectId};
use planbot::core::render::NOTE_MARKER;
use tokio_util::sync::CancellationToken;

const CANARY: &str = "canary-secret-7f3a9c";

const REPO_CONFIG: &str = r#"[[roots]]
name = "core"
dir = "tofu/stacks/core"
when_modified = ["*.tf", "../../modules/**"]

[[roots]]
name = "dns"
dir = "tofu/stacks/dns"

[plan]
checkout = "merge"
"#;

fn tf(name: &str, input: &str) -> String {
    format!(
        r#"variable "token" {{
  type      = string
  sensitive = true
  default   = "unset"
}}
resource "terraform_data" "{name}" {{
  input = "{input}"
}}
"#
    )
}

fn world(engine: &std::path::Path) -> World {
    World::builder()
        .no_members()
        .engine(engine)
        .managed_state()
        .planbot_toml(REPO_CONFIG)
        .file("tofu/stacks/core/main.tf", &tf("vm", "blocky"))
        .file("tofu/stacks/dns/main.tf", &tf("zone", "home.arpa"))
        .config(|c| {
            c.set(
                "engine",
                "env",
                &format!("{{ TF_VAR_token = \"{CANARY}\" }}"),
            )
        })
        .build()
}

impl World {
    fn states(&self, sha: &str) -> Vec<String> {
        self.gitlab
            .statuses(&self.project, sha)
            .into_iter()
            .filter(|s| s.name == "planbot/plan")
            .map(|s| s.state)
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_push_gets_one_plan_note_statuses_and_a_stored_fingerprint() {
    let engine = require_engine!();
    let w = world(&engine);
    w.gitlab.commit_files(
        &w.project,
        "feature/vm",
        &[("tofu/stacks/core/main.tf", &tf("vm", "blocky-v2"))],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/vm", "main");
    let head = w.gitlab.mr_sha(&w.project, iid);
    w.plan(iid).await;

    let notes = w.gitlab.notes(&w.project, iid);
    assert_eq!(notes.len(), 1, "exactly one note");
    let note = &notes[0];
    assert_eq!(note.author_id, w.gitlab.bot().id);
    assert!(note.body.starts_with(NOTE_MARKER), "{}", note.body);
    assert!(note.body.contains("core"), "{}", note.body);
    assert!(
        note.body.contains("dns"),
        "the skipped root is listed: {}",
        note.body
    );
    assert!(note.body.contains("blocky-v2"), "{}", note.body);
    assert!(
        note.body.contains("GitLab's merge result"),
        "says which commit: {}",
        note.body
    );
    assert!(!note.body.contains(CANARY), "a secret leaked into the note");

    assert_eq!(w.states(&head), ["pending", "running", "success"]);
    let last = w.gitlab.status(&w.project, &head, "planbot/plan").unwrap();
    // Without [gitlab.oauth] the run pages answer only on the planbot host: the status links
    // nowhere and the note says where the log can be read.
    assert_eq!(last.target_url, None, "{last:?}");
    assert!(
        note.body
            .contains("log on the planbot host: `http://localhost:"),
        "{}",
        note.body
    );
    assert!(
        last.description.as_deref().unwrap().contains("core"),
        "{last:?}"
    );
    assert_eq!(last.ref_.as_deref(), Some("feature/vm"));

    let fp = w
        .app()
        .store
        .last_shown_fingerprint(ProjectId(w.project.id), MrIid(iid), "core")
        .await
        .unwrap()
        .expect("fingerprint stored for core");
    assert!(
        note.body.contains(fp.fingerprint.short()),
        "the note shows the fingerprint"
    );
    // Stored for the MR head (what webhooks and the apply look up); the note names the planned
    // merge result.
    assert_eq!(fp.sha.as_str(), head);
    let merge = w
        .gitlab
        .ref_sha(&w.project, &format!("refs/merge-requests/{iid}/merge"))
        .unwrap();
    assert!(note.body.contains(&merge[..8]), "{}", note.body);
    let runs = w
        .app()
        .store
        .runs_for_mr(ProjectId(w.project.id), MrIid(iid))
        .await
        .unwrap();
    assert_eq!(runs.len(), 1, "one run: the core root");
    assert_eq!(runs[0].root, "core");
    assert_eq!(runs[0].sha.as_str(), head);
    assert!(w
        .app()
        .store
        .last_shown_fingerprint(ProjectId(w.project.id), MrIid(iid), "dns")
        .await
        .unwrap()
        .is_none());

    // A new push: the same note is edited, not a second one posted.
    w.gitlab.push(
        &w.project,
        "feature/vm",
        &[("tofu/stacks/core/main.tf", &tf("vm", "blocky-v3"))],
    );
    w.plan(iid).await;
    let notes = w.gitlab.notes(&w.project, iid);
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0].id, note.id);
    assert_eq!(notes[0].edits, 1);
    assert!(notes[0].body.contains("blocky-v3"));

    // Someone deletes the note: the next plan posts it again.
    w.gitlab.delete_note(&w.project, iid, note.id);
    w.plan(iid).await;
    let notes = w.gitlab.notes(&w.project, iid);
    assert_eq!(notes.len(), 1);
    assert_ne!(notes[0].id, note.id);
    assert!(notes[0].body.starts_with(NOTE_MARKER));

    // Nothing of the job is left on disk.
    let work = w.app().workspaces_dir().join("work");
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(w.app().temp_root()).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_502_after_gitlab_stored_the_plan_note_leaves_one_plan_note() {
    // A proxy in front of GitLab answers 502 after GitLab stored the note: planbot's retry
    // finds the note instead of posting it again.
    let engine = require_engine!();
    let w = world(&engine);
    w.gitlab.commit_files(
        &w.project,
        "feature/vm",
        &[("tofu/stacks/core/main.tf", &tf("vm", "blocky-v2"))],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/vm", "main");
    w.gitlab.fail_next_after_write(
        "POST /api/v4/projects/{id}/merge_requests/{iid}/notes",
        1,
        502,
    );
    w.plan(iid).await;
    let notes = w.gitlab.notes(&w.project, iid);
    assert_eq!(notes.len(), 1, "exactly one note: {notes:#?}");
    assert!(notes[0].body.starts_with(NOTE_MARKER));
    let head = w.gitlab.mr_sha(&w.project, iid);
    assert_eq!(w.states(&head), ["pending", "running", "success"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_note_id_is_found_again_by_its_marker() {
    let engine = require_engine!();
    let w = world(&engine);
    w.gitlab.commit_files(
        &w.project,
        "feature/dns",
        &[("tofu/stacks/dns/main.tf", &tf("zone", "lan"))],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/dns", "main");
    // A note posted earlier by the bot (e.g. before the database was lost).
    let old = w.gitlab.add_note(
        &w.project,
        iid,
        &w.gitlab.bot().clone(),
        &format!("{NOTE_MARKER}\nold plan"),
    );
    w.plan(iid).await;
    let notes = w.gitlab.notes(&w.project, iid);
    assert_eq!(
        notes.len(),
        1,
        "edited the old note instead of posting another"
    );
    assert_eq!(notes[0].id, old);
    assert!(notes[0].body.contains("dns"));
    assert!(!notes[0].body.contains("old plan"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_config_on_main_gets_a_note_saying_what_is_wrong_and_nothing_is_planned() {
    let engine = require_engine!();
    let w = world(&engine);
    w.gitlab.commit_files(
        &w.project,
        "main",
        &[(
            ".planbot.toml",
            "[[roots]]\nname = \"core\"\ndirectory = \"x\"\n",
        )],
    );
    w.gitlab.commit_files(
        &w.project,
        "feature/x",
        &[("tofu/stacks/core/main.tf", &tf("vm", "x"))],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/x", "main");
    let head = w.gitlab.mr_sha(&w.project, iid);
    w.plan(iid).await;
    let notes = w.gitlab.notes(&w.project, iid);
    assert_eq!(notes.len(), 1);
    let body = &notes[0].body;
    assert!(body.starts_with(NOTE_MARKER));
    assert!(
        body.contains("`.planbot.toml` on `main` is invalid"),
        "{body}"
    );
    assert!(body.contains("line 3"), "{body}");
    assert!(body.contains("roots[0].directory"), "{body}");
    assert_eq!(w.states(&head), ["pending", "running", "failed"]);
    let last = w.gitlab.status(&w.project, &head, "planbot/plan").unwrap();
    assert!(last
        .description
        .unwrap()
        .contains("invalid .planbot.toml on main"));
    let runs = w
        .app()
        .store
        .runs_for_mr(ProjectId(w.project.id), MrIid(iid))
        .await
        .unwrap();
    assert!(runs.is_empty(), "nothing was planned");
}

/// Issue 35 item 2: an MR that breaks `.planbot.toml` (a typo'd key, an unknown rule, a
/// duplicate root) must not get a green check: the status fails naming the file, the headline
/// is red, and the note lists every problem at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_breaking_the_config_fails_its_status_and_lists_every_problem() {
    let engine = require_engine!();
    let w = world(&engine);
    w.gitlab.commit_files(
        &w.project,
        "feature/typo",
        &[(
            ".planbot.toml",
            "[[roots]]\nname = \"core\"\ndir = \"tofu/stacks/core\"\nwhen_modifed = [\"*.tf\"]\nlint_disable = [\"PVE999\"]\n\n[[roots]]\nname = \"core\"\ndir = \"tofu/stacks/dns\"\n",
        )],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/typo", "main");
    let head = w.gitlab.mr_sha(&w.project, iid);
    w.plan(iid).await;
    let body = &w.gitlab.notes(&w.project, iid)[0].body;
    let headline = body
        .lines()
        .find(|l| l.starts_with("### "))
        .expect("a headline");
    assert!(
        headline.contains('🔴') && !headline.contains('🟢'),
        "{headline}"
    );
    assert!(
        headline.contains("`.planbot.toml` in this MR is invalid"),
        "{headline}"
    );
    // Every problem at once: the typo, the unknown rule, the duplicate name.
    for problem in [
        "unknown key `when_modifed`",
        "`PVE999` is not a rule planbot has",
        "root name `core` is used twice",
    ] {
        assert!(body.contains(problem), "{problem} missing from:\n{body}");
    }
    let last = w.gitlab.status(&w.project, &head, "planbot/plan").unwrap();
    assert_eq!(last.state, "failed");
    let description = last.description.unwrap();
    assert!(
        description
            .starts_with(".planbot.toml in this MR is invalid (3 problems, all in the note)"),
        "{description}"
    );
}

/// A new user's mistake (issue 43): the MR adds a root whose `dir` is misspelled. Its proposed
/// `.planbot.toml` is checked against the MR's own tree, as `planbot check-repo-config` checks
/// it: the note says which directory does not exist and the one meant, and the status fails.
/// It used to be a valid preview, and after the merge the root planned nothing, ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_adding_a_root_whose_directory_it_does_not_have_is_told_the_one_meant() {
    let engine = require_engine!();
    let w = world(&engine);
    let proposed =
        format!("{REPO_CONFIG}\n[[roots]]\nname = \"network\"\ndir = \"tofu/stacks/nework\"\n");
    w.gitlab.commit_files(
        &w.project,
        "feature/network",
        &[
            (".planbot.toml", proposed.as_str()),
            ("tofu/stacks/network/main.tf", &tf("net", "lan")),
        ],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/network", "main");
    let head = w.gitlab.mr_sha(&w.project, iid);
    w.plan(iid).await;
    let body = w.note(iid);
    assert!(
        body.contains("the directory `tofu/stacks/nework` does not exist on this branch (did you mean `tofu/stacks/network`?)"),
        "{body}"
    );
    assert!(
        body.contains("`.planbot.toml` in this MR is invalid"),
        "{body}"
    );
    let status = w.status_says(&head, "planbot/plan");
    assert!(
        status.starts_with("failed: .planbot.toml in this MR is invalid: line "),
        "{status}"
    );
    assert!(
        status.contains("the directory `tofu/stacks/nework` does not exist"),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_changing_the_config_gets_a_preview_but_main_config_decides() {
    let engine = require_engine!();
    let w = world(&engine);
    w.gitlab.commit_files(
        &w.project,
        "feature/cfg",
        &[(
            ".planbot.toml",
            &format!("{REPO_CONFIG}\n[[roots]]\nname = \"everything\"\ndir = \".\"\n"),
        )],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/cfg", "main");
    w.plan(iid).await;
    let body = &w.gitlab.notes(&w.project, iid)[0].body;
    assert!(body.contains("changed in this MR: preview"), "{body}");
    assert!(body.contains("<code>everything</code>"), "{body}");
    // Main's config still rules: neither root is touched by a .planbot.toml change.
    let runs = w
        .app()
        .store
        .runs_for_mr(ProjectId(w.project.id), MrIid(iid))
        .await
        .unwrap();
    assert!(runs.is_empty(), "{runs:?}");
    let head = w.gitlab.mr_sha(&w.project, iid);
    let last = w.gitlab.status(&w.project, &head, "planbot/plan").unwrap();
    assert_eq!(last.state, "success");
    assert_eq!(
        last.description.as_deref(),
        Some("planbot: no root affected by this change")
    );
}

/// The size of the huge `.planbot.toml` below: 8 MiB by default (over the 1 MiB cap, cheap);
/// `PLANBOT_HUGE_CONFIG_BYTES=536870912` measures the attacker's 512 MiB (the test prints how
/// far this process's resident memory peaked above its size before the plan).
fn huge_config_bytes() -> u64 {
    std::env::var("PLANBOT_HUGE_CONFIG_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8 << 20)
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_planbot_toml_is_refused_from_its_size_unread_with_a_note_that_says_so() {
    let engine = require_engine!();
    let w = world(&engine);
    let bytes = huge_config_bytes();
    let size = planbot::core::repo_config::byte_size(bytes);
    // An MR proposing a huge `.planbot.toml` (a comment line a few hundred million times):
    // the preview says why it is refused; main's config still plans the MR.
    w.gitlab.commit_files(
        &w.project,
        "feature/huge",
        &[("tofu/stacks/core/main.tf", &tf("vm", "x"))],
    );
    w.gitlab
        .commit_generated_file(&w.project, "feature/huge", ".planbot.toml", "# x", bytes);
    let iid = w.gitlab.open_mr(&w.project, "feature/huge", "main");
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let before = status_kib("VmRSS:");
    w.plan(iid).await;
    eprintln!(
        "a {size} .planbot.toml in an MR: peak RSS {} MiB above the {} MiB before the plan",
        status_kib("VmHWM:").saturating_sub(before) >> 10,
        before >> 10
    );
    let body = &w.gitlab.notes(&w.project, iid)[0].body;
    assert!(
        body.contains("`.planbot.toml` changed in this MR and is invalid"),
        "{body}"
    );
    let why =
        format!("the file is {size}: planbot reads at most 1 MiB of it, and did not read this one");
    assert!(body.contains(&why), "{body}");
    assert!(
        body.contains("<code>core</code>"),
        "main's roots are planned: {body}"
    );

    // The same file merged to main: nothing is planned, the status fails and says why.
    w.gitlab
        .commit_generated_file(&w.project, "main", ".planbot.toml", "# x", bytes);
    w.gitlab.commit_files(
        &w.project,
        "feature/after",
        &[("tofu/stacks/core/main.tf", &tf("vm", "y"))],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/after", "main");
    let head = w.gitlab.mr_sha(&w.project, iid);
    let blob_reads = || {
        w.app()
            .workspace
            .invocations()
            .into_iter()
            .filter(|i| i.argv.iter().any(|a| a == "blob"))
            .count()
    };
    let blobs_before = blob_reads();
    w.plan(iid).await;
    let body = &w.gitlab.notes(&w.project, iid)[0].body;
    assert!(
        body.contains("`.planbot.toml` on `main` is invalid"),
        "{body}"
    );
    assert!(body.contains(&why), "{body}");
    assert_eq!(w.states(&head), ["pending", "running", "failed"]);
    let last = w.gitlab.status(&w.project, &head, "planbot/plan").unwrap();
    let description = last.description.unwrap();
    assert!(
        description.contains("invalid .planbot.toml on main") && description.contains(&size),
        "{description}"
    );
    // Sized, never read: this plan ran no `git cat-file blob`.
    assert_eq!(blob_reads(), blobs_before, "main's .planbot.toml was read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_error_fails_the_root_and_the_status_with_the_secret_scrubbed() {
    let engine = require_engine!();
    let w = world(&engine);
    let broken = format!(
        "{}\nresource \"terraform_data\" \"bad\" {{\n  input = nonexistent_function(var.token)\n}}\n",
        tf("vm", "x")
    );
    w.gitlab.commit_files(
        &w.project,
        "feature/broken",
        &[("tofu/stacks/core/main.tf", &broken)],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/broken", "main");
    let head = w.gitlab.mr_sha(&w.project, iid);
    w.plan(iid).await;
    let body = &w.gitlab.notes(&w.project, iid)[0].body;
    assert!(
        body.contains("nonexistent_function"),
        "the engine's error is shown: {body}"
    );
    assert!(!body.contains(CANARY));
    let last = w.gitlab.status(&w.project, &head, "planbot/plan").unwrap();
    assert_eq!(last.state, "failed");
    assert!(last.description.unwrap().contains("core: failed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_mrs_of_one_project_are_planned_at_the_same_time_on_one_mirror() {
    let engine = require_engine!();
    let w = world(&engine);
    w.gitlab.commit_files(
        &w.project,
        "feature/a",
        &[("tofu/stacks/core/main.tf", &tf("vm", "a"))],
    );
    w.gitlab.commit_files(
        &w.project,
        "feature/b",
        &[("tofu/stacks/dns/main.tf", &tf("zone", "b"))],
    );
    let a = w.gitlab.open_mr(&w.project, "feature/a", "main");
    let b = w.gitlab.open_mr(&w.project, "feature/b", "main");
    let (ja, jb) = (w.job(a), w.job(b));
    let none = CancellationToken::new();
    let (ra, rb) = tokio::join!(
        planbot::flows::review::plan::run(w.app(), &ja, None, &none),
        planbot::flows::review::plan::run(w.app(), &jb, None, &none)
    );
    ra.expect("MR a planned");
    rb.expect("MR b planned");
    for (iid, text) in [(a, "\"a\""), (b, "\"b\"")] {
        let notes = w.gitlab.notes(&w.project, iid);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].body.contains(text), "{}", notes[0].body);
        let head = w.gitlab.mr_sha(&w.project, iid);
        assert_eq!(
            w.gitlab
                .status(&w.project, &head, "planbot/plan")
                .unwrap()
                .state,
            "success"
        );
    }
}

/// What GitLab and a reader make of the MR's plan note: GitLab would act on nothing in what
/// planbot posted (the fake checks every post with the port of GitLab's rule), the rendered
/// note has only planbot's own headings and HTML, no "apply approved" verdict, and `shown` is
/// visible (not hidden in a comment, not run as a command).
fn assert_note_reads_safely(w: &World, iid: u64, shown: &[&str]) {
    use crate::support::gitlab_reading::{is_planbots_html, reading};
    let hazards = w.gitlab.take_hazards();
    assert!(hazards.is_empty(), "GitLab would act on: {hazards:#?}");
    let body = w.gitlab.plan_note(&w.project, iid).expect("a plan note");
    let seen = reading(&body);
    let verdicts: Vec<&String> = seen
        .headings
        .iter()
        .filter(|h| h.contains("planbot ·"))
        .collect();
    assert_eq!(
        verdicts.len(),
        1,
        "one headline: {:?}\n{body}",
        seen.headings
    );
    assert!(
        verdicts[0].contains("planbot · plan for") && !verdicts[0].contains("approved"),
        "{verdicts:?}"
    );
    let foreign: Vec<&String> = seen.html.iter().filter(|h| !is_planbots_html(h)).collect();
    assert!(
        foreign.is_empty(),
        "HTML planbot did not write: {foreign:?}\n{body}"
    );
    for text in shown {
        assert!(
            seen.visible.contains(text),
            "{text:?} is not shown:\n{}",
            seen.visible
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mrs_config_cannot_put_commands_a_fake_verdict_or_a_hidden_plan_in_the_note() {
    let engine = require_engine!();
    let w = world(&engine);
    // Each MR changes the core root (so it is planned) and proposes a hostile `.planbot.toml`.
    let attacks = [
        // Values printed as they were: lines of their own in the note.
        r#"[[roots]]
name = "core"
dir = "tofu/stacks/core\n/approve\n/label ~planbot::approved\n/assign_reviewer @alice\n@all look <img src=\"https://attacker.example/x.png\">\n\n### 🟢 planbot · plan for `0000000` · apply approved\n<!--"
when_modified = ["*.tf\n/unlabel ~planbot::blocked"]
"#,
        // Problem messages quoting the values.
        r#"[[roots]]
name = "core"
dir = "../../`x` /approve <img src=x> <!-- @here"
when_modified = ["../../y\n/approve\n@here <!--"]
"#,
        // Valid values full of markup.
        r#"[[roots]]
name = "core"
dir = "tofu/stacks/core"
when_modified = ["*.tf", "x | <b>bold</b> <!-- @all"]
"#,
    ];
    for (i, config) in attacks.iter().enumerate() {
        let branch = format!("feature/cfg-{i}");
        w.gitlab.commit_files(
            &w.project,
            &branch,
            &[
                (".planbot.toml", config),
                ("tofu/stacks/core/main.tf", &tf("vm", &format!("v{i}"))),
            ],
        );
        let iid = w.gitlab.open_mr(&w.project, &branch, "main");
        w.plan(iid).await;
        let shown: &[&str] = match i {
            0 => &[
                "/approve",
                "@all look <img src=\"https://attacker.example/x.png\">",
            ],
            1 => &[
                "../../`x` /approve <img src=x> <!-- @here leaves the repository",
                "/approve @here <!-- holds a control character",
            ],
            _ => &["<b>bold</b> <!-- @all"],
        };
        let mut shown = shown.to_vec();
        // The plan itself stays in view.
        shown.push("terraform_data.vm");
        assert_note_reads_safely(&w, iid, &shown);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_output_cannot_close_its_code_block_and_post_commands() {
    let engine = require_engine!();
    let w = world(&engine);
    // A precondition's message is printed by the engine as written: lines of its own.
    let hostile = r#"variable "v" {
  default = "a"
}
resource "terraform_data" "vm" {
  input = var.v
  lifecycle {
    precondition {
      condition     = var.v == "b"
      error_message = "Bad.\n```\n/approve\n/label ~planbot::approved\n@all look <img src=x>\n```\n### 🟢 planbot · apply approved\n<!--"
    }
  }
}
"#;
    w.gitlab.commit_files(
        &w.project,
        "feature/out",
        &[("tofu/stacks/core/main.tf", hostile)],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/out", "main");
    w.plan(iid).await;
    assert_note_reads_safely(
        &w,
        iid,
        &[
            "/approve",
            "@all look <img src=x>",
            "### 🟢 planbot · apply approved",
        ],
    );
}

/// Bytes of the SQLite store on disk (the database and its write-ahead log).
fn store_bytes(w: &World) -> u64 {
    std::fs::read_dir(w.data_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("planbot.db"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_40_mb_value_ends_in_a_clear_note_and_the_store_barely_grows() {
    let engine = require_engine!();
    let w = world(&engine);
    let tf = crate::support::forty_mb_value_tf();
    w.gitlab.commit_files(
        &w.project,
        "feature/big",
        &[("tofu/stacks/core/main.tf", &tf)],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/big", "main");
    let head = w.gitlab.mr_sha(&w.project, iid);
    let before = store_bytes(&w);
    w.plan(iid).await;
    let grew = store_bytes(&w) - before;

    let body = w.gitlab.plan_note(&w.project, iid).expect("a plan note");
    assert!(
        body.contains("the plan is too large: `show -json` printed more than 32 MiB, the most planbot accepts (`engine.max_plan_json_mib`)"),
        "{}",
        &body[..body.len().min(3000)]
    );
    assert!(body.len() < 100_000, "the note is {} bytes", body.len());
    let last = w.gitlab.status(&w.project, &head, "planbot/plan").unwrap();
    assert_eq!(last.state, "failed");
    assert!(grew < 4 * 1024 * 1024, "the store grew by {grew} bytes");
    let runs = w
        .app()
        .store
        .runs_for_mr(ProjectId(w.project.id), MrIid(iid))
        .await
        .unwrap();
    assert_eq!(runs.len(), 1);
    let run = w.app().store.run(runs[0].id).await.unwrap().unwrap();
    assert!(
        run.log.len() < 2 * 1024 * 1024,
        "a stored log of {} bytes",
        run.log.len()
    );
}
