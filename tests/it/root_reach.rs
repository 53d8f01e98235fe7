//! Which roots a change reaches, without globs (issue 38 item 1): a repository of three roots
//! (`network`, `vms`, `dns`) and shared local modules, no `when_modified` written, the real
//! engine and GitLab-managed state in the fake GitLab. A change to a module plans exactly the
//! roots that use it, directly or through another module, and the note says why and draws them
//! in their `depends_on` order (issue 38 item 5); a module source that leaves the repository, by
//! `../` or through a symbolic link, is not followed.

use crate::support::world::World;

const REPO_CONFIG: &str = r#"[[roots]]
name = "network"
dir = "stacks/network"

[[roots]]
name = "vms"
dir = "stacks/vms"
depends_on = ["network"]

[[roots]]
name = "dns"
dir = "stacks/dns"
depends_on = ["vms"]
"#;

fn vm_module(input: &str) -> String {
    format!(
        r#"variable "name" {{
  type = string
}}
resource "terraform_data" "vm" {{
  input = "${{var.name}}-{input}"
}}
output "name" {{
  value = terraform_data.vm.output
}}
"#
    )
}

/// `modules/record` uses `modules/vm`: dns reaches it only through this module.
const RECORD_MODULE: &str = r#"module "host" {
  source = "../vm"
  name   = "ns"
}
resource "terraform_data" "record" {
  input = module.host.name
}
"#;

const NETWORK: &str = r#"resource "terraform_data" "bridge" {
  input = "vmbr0"
}
"#;

const VMS: &str = r#"module "web" {
  source = "../../modules/vm"
  name   = "web"
}
"#;

const DNS: &str = r#"module "rec" {
  source = "../../modules/record"
}
"#;

fn world(engine: &std::path::Path, extra: &[(&str, &str)]) -> World {
    let mut files: Vec<(&str, String)> = vec![
        (".planbot.toml", REPO_CONFIG.to_string()),
        ("modules/vm/main.tf", vm_module("v1")),
        ("modules/record/main.tf", RECORD_MODULE.to_string()),
        ("stacks/network/main.tf", NETWORK.to_string()),
        ("stacks/vms/main.tf", VMS.to_string()),
        ("stacks/dns/main.tf", DNS.to_string()),
    ];
    for (path, text) in extra {
        files.retain(|(p, _)| p != path);
        files.push((path, text.to_string()));
    }
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, &t[..])).collect();
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, &t[..])).collect();
    World::builder()
        .no_members()
        .engine(engine)
        .managed_state()
        .files(&files)
        .build()
}

/// The line of the "Why these roots were planned" list for `root`.
fn why_line<'a>(note: &'a str, root: &str) -> &'a str {
    let section = note
        .split_once("**Why these roots were planned**")
        .unwrap_or_else(|| panic!("no reasons in the note:\n{note}"))
        .1;
    section
        .lines()
        .find(|l| l.starts_with(&format!("- `{root}`:")))
        .unwrap_or_else(|| panic!("no reason for {root}:\n{note}"))
}

/// The table row of `root`.
fn row<'a>(note: &'a str, root: &str) -> &'a str {
    note.lines()
        .find(|l| {
            l.starts_with(&format!("| {root} |"))
                || l.starts_with(&format!("| <code>{root}</code> |"))
        })
        .unwrap_or_else(|| panic!("no row for {root}:\n{note}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_change_plans_exactly_the_roots_that_use_it_and_the_note_says_why() {
    let engine = require_engine!();
    let w = world(&engine, &[]);
    w.gitlab.commit_files(
        &w.project,
        "feature/vm",
        &[("modules/vm/main.tf", &vm_module("v2"))],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/vm", "main");
    let note = w.plan_note(iid).await;

    // network does not use the module: skipped with its reason; vms and dns are planned with
    // the module's new value.
    assert!(
        row(&note, "network").contains("skipped: no changed file matches"),
        "{note}"
    );
    assert!(!row(&note, "vms").contains("skipped"), "{note}");
    assert!(!row(&note, "dns").contains("skipped"), "{note}");
    assert!(
        note.contains("web-v2"),
        "vms planned the module's change: {note}"
    );
    assert!(
        note.contains("ns-v2"),
        "dns planned the module's change: {note}"
    );
    assert_eq!(
        why_line(&note, "vms"),
        "- `vms`: uses `modules/vm`, changed (`modules/vm/main.tf`)"
    );
    assert_eq!(
        why_line(&note, "dns"),
        "- `dns`: uses `modules/vm` through `modules/record`, changed (`modules/vm/main.tf`)"
    );
    assert!(!note.contains("- `network`:"), "{note}");
    // Two roots planned: their picture, as a Mermaid graph.
    assert!(
        note.contains("```mermaid\ngraph LR\n  r0[\"vms\"]\n  r1[\"dns\"]\n  r0 --> r1\n```"),
        "{note}"
    );
    let head = w.gitlab.mr_sha(&w.project, iid);
    let status = w.gitlab.status(&w.project, &head, "planbot/plan").unwrap();
    assert_eq!(status.state, "success", "{status:?}");

    // A change to the nested module alone reaches dns only; a root's own file, that root.
    w.gitlab.commit_files(
        &w.project,
        "feature/record",
        &[
            (
                "modules/record/main.tf",
                &RECORD_MODULE.replace("\"ns\"", "\"ns2\""),
            ),
            ("stacks/network/main.tf", &NETWORK.replace("vmbr0", "vmbr1")),
        ],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/record", "main");
    let note = w.plan_note(iid).await;
    assert!(row(&note, "vms").contains("skipped"), "{note}");
    assert_eq!(
        why_line(&note, "dns"),
        "- `dns`: uses `modules/record`, changed (`modules/record/main.tf`)"
    );
    assert_eq!(
        why_line(&note, "network"),
        "- `network`: its files changed (`stacks/network/main.tf`)"
    );
    assert!(note.contains("ns2-v1"), "{note}");
    // network before dns (through vms, which this MR does not reach).
    assert!(
        note.contains("```mermaid\ngraph LR\n  r0[\"network\"]\n  r1[\"dns\"]\n  r0 --> r1\n```"),
        "{note}"
    );
    assert!(note.contains("vmbr1"), "{note}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_reading_another_roots_managed_state_gets_the_depends_on_line_in_the_note() {
    let engine = require_engine!();
    // `vms` says nothing of `network` in `.planbot.toml`.
    let w = world(
        &engine,
        &[(
            ".planbot.toml",
            &REPO_CONFIG.replace("depends_on = [\"network\"]\n", ""),
        )],
    );
    // The MR makes `vms` read `network`'s managed state of this project, and the state of
    // another project that has a state of that name too (`count = 0`: the plan reads neither,
    // the hint comes from the configuration as written).
    let read = |project: u64| {
        format!(
            "data \"terraform_remote_state\" \"p{project}\" {{\n  count   = 0\n  backend = \"http\"\n  config = {{\n    address = \"{}/api/v4/projects/{project}/terraform/state/network\"\n  }}\n}}\n",
            w.gitlab.url()
        )
    };
    let other = w.project.id + 1000;
    let text = format!("{}{}", read(w.project.id), read(other));
    w.gitlab.commit_files(
        &w.project,
        "feature/read",
        &[("stacks/vms/state.tf", &text)],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/read", "main");
    let note = w.plan_note(iid).await;
    let hints: Vec<&str> = note.lines().filter(|l| l.starts_with("- 💡")).collect();
    assert_eq!(
        hints,
        ["- 💡 `vms` reads `network`'s state: add `depends_on = [\"network\"]` to root `vms` in `.planbot.toml` so it plans and applies after it"],
        "{note}"
    );
    let head = w.gitlab.mr_sha(&w.project, iid);
    let status = w.gitlab.status(&w.project, &head, "planbot/plan").unwrap();
    assert_eq!(status.state, "success", "{status:?}\n{note}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_source_leaving_the_repository_is_not_followed_and_says_nothing_of_it() {
    let engine = require_engine!();
    // Outside the repository, on planbot's host: a configuration that names a canary.
    let outside = tempfile::tempdir().unwrap();
    let canary = "outside-canary-91c2";
    std::fs::write(
        outside.path().join("main.tf"),
        format!("module \"deeper\" {{\n  source = \"./{canary}\"\n}}\nresource \"terraform_data\" \"x\" {{\n  input = \"{canary}\"\n}}\n"),
    )
    .unwrap();
    std::fs::create_dir(outside.path().join(canary)).unwrap();
    let w = world(
        &engine,
        &[
            // vms also calls a module directory that is a symbolic link out of the repository;
            // dns one that `../` takes out of it.
            (
                "stacks/vms/main.tf",
                &format!("{VMS}module \"evil\" {{\n  source = \"../../modules/evil\"\n}}\n"),
            ),
            (
                "stacks/dns/main.tf",
                &format!("{DNS}module \"up\" {{\n  source = \"../../../elsewhere\"\n}}\n"),
            ),
        ],
    );
    let target = outside.path().to_string_lossy().into_owned();
    w.gitlab
        .commit_with_mode(&w.project, "main", "modules/evil", "120000", &target);

    // An MR that changes only network: vms reaches a directory that could not be read, so it is
    // planned (a change may reach it) and the note says why; dns reaches nothing changed.
    w.gitlab.commit_files(
        &w.project,
        "feature/net",
        &[("stacks/network/main.tf", &NETWORK.replace("vmbr0", "vmbr2"))],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/net", "main");
    let note = w.plan_note(iid).await;
    assert_eq!(
        why_line(&note, "vms"),
        "- `vms`: it reaches `modules/evil`, which could not be read (it resolves outside the repository through a symbolic link: not followed): planned, as a change may reach it"
    );
    assert!(row(&note, "dns").contains("skipped"), "{note}");

    // An MR that changes dns: planned for its files, the escaping source named as not followed.
    w.gitlab.commit_files(
        &w.project,
        "feature/dns",
        &[(
            "stacks/dns/main.tf",
            &format!("{DNS}module \"up\" {{\n  source = \"../../../elsewhere\"\n}}\n# v2\n"),
        )],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/dns", "main");
    let note = w.plan_note(iid).await;
    assert_eq!(
        why_line(&note, "dns"),
        format!("- `dns`: its files changed (`stacks/dns/main.tf`); not followed, outside the repository: `../../../elsewhere`")
    );
    // Nothing of the outside directory is in either note: not its path, not what it holds.
    for iid in [1, 2] {
        let notes = w.gitlab.notes(&w.project, iid);
        let reasons = notes[0]
            .body
            .split_once("**Why these roots were planned**")
            .unwrap()
            .1
            .split("\n\n")
            .nth(1)
            .unwrap();
        assert!(!reasons.contains(&target), "{reasons}");
        assert!(!reasons.contains(canary), "{reasons}");
    }
}

// ---------------------------------------------------------------------------------------------
// The note's reasons and picture, rendered (no engine).

use planbot::core::reach::{DependsHint, Reached, Why};
use planbot::core::redact::Scrubber;
use planbot::core::render::{render_note, NoteContext, RootOutcome, RootSection};

fn reached(root: &str, why: Vec<Why>) -> Reached {
    Reached {
        root: root.into(),
        why,
        outside: Vec::new(),
        unread: Vec::new(),
    }
}

/// A note of three roots: two reached (one through a nested module), one skipped; `names`
/// are the roots' names as the repo config wrote them.
fn reach_note(names: [&str; 3], edges: Vec<(String, String)>) -> String {
    reach_note_with(names, edges, Vec::new())
}

/// [`reach_note`] with `depends_on` hints.
fn reach_note_with(
    names: [&str; 3],
    edges: Vec<(String, String)>,
    depends_hints: Vec<DependsHint>,
) -> String {
    let plan = crate::support::fixtures::plan("changes");
    let fp = planbot::core::fingerprint::Fingerprint::from_hex(
        "9c41e07a2b3d5f6a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c",
    )
    .unwrap();
    let planned = || RootOutcome::Planned {
        plan: &plan,
        findings: &[],
        fingerprint: &fp,
    };
    let roots = [
        RootSection {
            name: names[0].into(),
            outcome: RootOutcome::Skipped {
                reason: "no changed file matches `stacks/network/**`".into(),
            },
        },
        RootSection {
            name: names[1].into(),
            outcome: planned(),
        },
        RootSection {
            name: names[2].into(),
            outcome: planned(),
        },
    ];
    let mut dns = reached(
        names[2],
        vec![
            Why::Module {
                module: "modules/vm".into(),
                via: vec!["modules/record".into()],
                files: vec!["modules/vm/main.tf".into(), "modules/vm/disk.tf".into()],
                more: 0,
            },
            Why::WhenModified {
                pattern: "../../zones/*.txt".into(),
                files: vec!["zones/home.txt".into()],
                more: 2,
            },
        ],
    );
    dns.outside = vec!["../../../elsewhere".into()];
    let ctx = NoteContext {
        sha: Some("3f9a2c1e5b7d9f0a1c3e5b7d9f0a1c3e5b7d9f0a".into()),
        engine: Some("OpenTofu 1.10.6".into()),
        reach: vec![
            reached(
                names[1],
                vec![Why::Module {
                    module: "modules/vm".into(),
                    via: vec![],
                    files: vec!["modules/vm/main.tf".into()],
                    more: 0,
                }],
            ),
            dns,
        ],
        root_edges: edges,
        depends_hints,
        ..NoteContext::default()
    };
    render_note(&ctx, &roots, &Scrubber::none())
}

/// The note's Mermaid block, as GitLab's parser (comrak) reads it: `(info string, content)` of
/// every fenced block whose info string is `mermaid`, and the number of fenced blocks in all.
fn mermaid_blocks(note: &str) -> (Vec<String>, usize) {
    use comrak::nodes::NodeValue;
    let arena = comrak::Arena::new();
    let options = planbot::core::markdown::gitlab_flavour();
    let root = comrak::parse_document(&arena, note, &options);
    let (mut mermaid, mut all) = (Vec::new(), 0);
    for node in root.descendants() {
        if let NodeValue::CodeBlock(block) = &node.data.borrow().value {
            all += 1;
            if block.info == "mermaid" {
                mermaid.push(block.literal.clone());
            }
        }
    }
    (mermaid, all)
}

#[test]
fn the_note_says_why_each_root_was_planned_and_draws_the_roots_it_reaches() {
    let note = reach_note(
        ["network", "vms", "dns"],
        vec![
            ("network".into(), "vms".into()),
            ("vms".into(), "dns".into()),
            // An edge to a root the MR does not reach is left out of the picture.
            ("network".into(), "dns".into()),
        ],
    );
    let (mermaid, _) = mermaid_blocks(&note);
    assert_eq!(
        mermaid,
        ["graph LR\n  r0[\"vms\"]\n  r1[\"dns\"]\n  r0 --> r1\n"],
        "{note}"
    );
    insta::assert_snapshot!(note);
}

#[test]
fn the_note_suggests_the_depends_on_line_of_a_root_reading_another_roots_state() {
    let note = reach_note_with(
        ["network", "vms", "dns"],
        vec![("vms".into(), "dns".into())],
        vec![DependsHint {
            root: "vms".into(),
            reads: "network".into(),
        }],
    );
    assert!(
        note.contains("- 💡 `vms` reads `network`'s state: add `depends_on = [\"network\"]` to root `vms` in `.planbot.toml` so it plans and applies after it\n"),
        "{note}"
    );
    insta::assert_snapshot!(note);
}

#[test]
fn a_hostile_root_name_cannot_leave_the_picture() {
    let hostile = "x\"] --> r9[\"<img src=https://phish.example/i.png>\n```\n[ok](https://phish.example/b) @all\n/approve\nclick r0 href \"javascript:alert(1)\"";
    let note = reach_note(
        ["network", hostile, "dns"],
        vec![(hostile.into(), "dns".into())],
    );
    let (mermaid, blocks) = mermaid_blocks(&note);
    // One Mermaid block of exactly two nodes and one arrow; the label holds nothing that Mermaid
    // or Markdown reads as more than text.
    assert_eq!(mermaid.len(), 1, "{note}");
    let lines: Vec<&str> = mermaid[0].lines().collect();
    assert_eq!(lines.len(), 4, "{note}");
    assert_eq!(lines[0], "graph LR");
    assert!(
        lines[1].starts_with("  r0[\"x_") && lines[1].ends_with("\"]"),
        "{}",
        lines[1]
    );
    let label = &lines[1]["  r0[\"".len()..lines[1].len() - 2];
    assert!(
        label
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || " ._-/".contains(c)),
        "{label}"
    );
    assert_eq!(lines[2], "  r1[\"dns\"]");
    assert_eq!(lines[3], "  r0 --> r1");
    // The only other fenced blocks are the plans' diffs: the name opened none.
    let clean = reach_note(["network", "vms", "dns"], vec![]);
    assert_eq!(blocks, mermaid_blocks(&clean).1, "{note}");
}

/// A few KiB of `.tf` nesting a list thousands deep overflowed the stack of the thread reading
/// the module calls (`hcl::parse` recurses per level), and a stack overflow aborts the process:
/// every job and apply of planbot ended, and the job, queued again at the next start, ended it
/// again. The text is refused unparsed now: the directory is unreadable, the roots reaching it
/// are planned and the note says why, and the engine plans the MR as it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_nested_thousands_deep_is_refused_unparsed_and_planbot_lives() {
    let engine = require_engine!();
    let w = world(&engine, &[]);
    let deep = format!(
        "{RECORD_MODULE}locals {{\n  deep = {}1{}\n}}\n",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    w.gitlab.commit_files(
        &w.project,
        "feature/deep",
        &[("modules/record/main.tf", &deep)],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/deep", "main");
    let note = w.plan_note(iid).await;
    assert_eq!(
        why_line(&note, "dns"),
        "- `dns`: uses `modules/record`, changed (`modules/record/main.tf`); `modules/record` not read (main.tf nests deeper than 500 levels (brackets, blocks, templates or chained operators) at line 9: planbot does not read it)"
    );
    assert!(!row(&note, "dns").contains("skipped"), "{note}");
    assert!(row(&note, "network").contains("skipped"), "{note}");
}
