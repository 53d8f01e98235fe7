//! The plan note as a reviewer sees it, one snapshot per kind of change, rendered from plan JSON
//! made by the real engine (`tests/fixtures/plans/regen.sh`) or written by hand in the documented
//! shape (`tests/fixtures/plans/handmade.py`: imports, drift, unknown actions, Proxmox resources).
//! Every note is also checked for well-formed Markdown (fences, `<details>`, table rows, marker).

use planbot::core::fingerprint::Fingerprint;
use planbot::core::plan::Plan;
use planbot::core::proxmox::findings::{Finding, Severity};
use planbot::core::redact::{Scrubber, Secrets};
use planbot::core::render::{
    render_note, NoteContext, PlanWait, RootOutcome, RootSection, WaitOn, NOTE_BUDGET, NOTE_MARKER,
};
use serde_json::json;
use std::time::Duration;

fn fp() -> Fingerprint {
    Fingerprint::from_hex("9c41e07a2b3d5f6a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c")
        .unwrap()
}

fn ctx() -> NoteContext {
    NoteContext {
        sha: Some("3f9a2c1e5b7d9f0a1c3e5b7d9f0a1c3e5b7d9f0a".into()),
        engine: Some("OpenTofu 1.10.6".into()),
        duration: Some(Duration::from_millis(8200)),
        run_url: Some("https://planbot.example.com/runs/118".into()),
        ..NoteContext::default()
    }
}

/// The note for one planned root named `core`, scrubbed with the plan's own secrets.
fn note_with(plan: &Plan, findings: &[Finding], ctx: &NoteContext) -> String {
    let fp = fp();
    let scrubber = Secrets::from_plan(plan).scrubber();
    let note = render_note(
        ctx,
        &[RootSection {
            name: "core".into(),
            outcome: RootOutcome::Planned {
                plan,
                findings,
                fingerprint: &fp,
            },
        }],
        &scrubber,
    );
    assert_well_formed(&note);
    note
}

fn note(name: &str) -> String {
    note_with(&crate::support::fixtures::plan(name), &[], &ctx())
}

/// The structure GitLab relies on: the marker once, at the top; fences closed; outside fences no
/// HTML comment, no `<script>`, balanced `<details>`; every table row has exactly six cells.
fn assert_well_formed(note: &str) {
    assert!(note.starts_with(NOTE_MARKER), "marker first:\n{note}");
    assert_eq!(note.matches("<!--").count(), 1, "one comment only:\n{note}");
    assert_eq!(note.matches("-->").count(), 1, "one comment only:\n{note}");
    let mut fence: Option<String> = None;
    let mut open_details = 0i64;
    for line in note.lines() {
        let trimmed = line.trim_start();
        let ticks = trimmed.bytes().take_while(|b| *b == b'`').count();
        match &fence {
            Some(f) => {
                if ticks >= f.len() && trimmed[ticks..].trim().is_empty() {
                    fence = None;
                }
                continue;
            }
            None if ticks >= 3 => {
                fence = Some("`".repeat(ticks));
                continue;
            }
            None => {}
        }
        assert!(
            !line.contains("<script"),
            "raw <script> outside a fence: {line}"
        );
        open_details += line.matches("<details>").count() as i64;
        open_details -= line.matches("</details>").count() as i64;
        assert!(open_details >= 0, "</details> closes nothing: {line}");
        if line.starts_with('|') {
            let pipes = line.matches('|').count() - line.matches("\\|").count();
            assert_eq!(pipes, 7, "table row with a broken cell: {line}");
        }
    }
    assert!(fence.is_none(), "unclosed fence in:\n{note}");
    assert_eq!(open_details, 0, "unbalanced <details> in:\n{note}");
}

#[test]
fn creates_updates_replacements_and_deletes_show_only_what_changes() {
    let note = note("changes");
    assert!(note.contains("### 🟡 planbot · plan for `3f9a2c1e` · 1 root with changes"));
    assert!(note.contains("| <code>core</code> | 5 | 1 | 2 ⚠️ | 0 | 0 |"));
    assert!(note.contains(
        "> - `terraform_data.db` will be **replaced** — because `triggers_replace` forces replacement."
    ));
    assert!(note.contains("~ input.disk[0].size = 10 -> 20\n"));
    assert!(note.contains("~ triggers_replace = \"v1\" -> \"v2\"  # forces replacement\n"));
    assert!(note.contains("  # 5 unchanged attributes hidden\n"));
    // The unchanged resource is not listed at all.
    assert!(!note.contains("terraform_data.keep"));
    insta::assert_snapshot!(note);
}

#[test]
fn a_move_says_where_the_resource_went() {
    let note = note("moved");
    assert!(note.contains("`terraform_data.blocky` has moved to `terraform_data.dns`."));
    assert!(note.contains("### 🟢"));
    insta::assert_snapshot!(note);
}

#[test]
fn imports_say_will_be_imported_with_the_id() {
    let note = note("import");
    assert!(note.contains("It will be imported (id `pve02/101`)."));
    assert!(note.contains("| 0 | 1 | 0 | 2 | 0 |"));
    insta::assert_snapshot!(note);
}

#[test]
fn a_removed_block_forgets_instead_of_destroying() {
    let note = note("forget");
    assert!(note.contains("removed from state, not destroyed"));
    assert!(!note.contains("Destructive changes"));
    insta::assert_snapshot!(note);
}

#[test]
fn a_write_only_attribute_says_write_only_in_the_note_the_terminal_and_the_run_page() {
    // Made by Terraform 1.11.4 with hashicorp/aws 5.100.0 (tests/fixtures/plans/README.md):
    // `value_wo` is null in the plan, set by a constant in one resource and by a reference to an
    // ephemeral value in the other; `description` is a reference that is null.
    let note = note("write_only");
    for address in [
        "aws_ssm_parameter.db_password",
        "aws_ssm_parameter.cluster_token",
    ] {
        let section = note
            .split("<details>")
            .find(|s| s.contains(&format!("+ {address}</code>")))
            .unwrap_or_else(|| panic!("{address} in:\n{note}"));
        assert!(
            section.contains("\n+ value_wo = (write-only)\n"),
            "{address}:\n{section}"
        );
    }
    assert!(!note.contains("value_wo = null"), "{note}");
    assert!(!note.contains("value_wo = (sensitive"), "{note}");
    assert!(!note.contains("removed"), "{note}");
    // A null reference is not taken for write-only.
    assert!(!note.contains("description ="), "{note}");
    // The write-only value itself is never anywhere.
    assert!(!note.contains("write-only-fixture-value"), "{note}");
    // Terraform writes nothing of the ephemeral resource: the note invents none.
    assert!(!note.contains("Ephemeral"), "{note}");
    // `planbot plan` / `render` on a terminal, and the run page, are made from the same note.
    let text = planbot::core::render::terminal::note_as_text(&note);
    assert!(text.contains("+ value_wo = (write-only)"), "{text}");
    let html = planbot::core::note_html::note_to_html(&note);
    assert!(html.contains("+ value_wo = (write-only)"), "{html}");
    insta::assert_snapshot!(note);
}

#[test]
fn opentofu_forgets_a_vm_that_stays_in_proxmox_and_lists_ephemeral_resources_as_such() {
    // Shapes from OpenTofu's own sources (tests/fixtures/plans/README.md).
    let note = note("tofu_shapes");
    assert!(note.contains(
        "<code>. proxmox_virtual_environment_vm.legacy</code> — removed from state, not destroyed (its state says <code>lifecycle { destroy = false }</code>)"
    ), "{note}");
    assert!(note.contains(
        "It leaves OpenTofu's state but is not destroyed: the real object stays in Proxmox, no longer managed by this root."
    ), "{note}");
    assert!(note.contains(
        "The object it replaces leaves OpenTofu's state but is not destroyed: it stays in Proxmox, no longer managed, beside the new one created here."
    ), "{note}");
    // Neither is a destruction.
    assert!(!note.contains("Destructive changes"), "{note}");
    // The ephemeral block is named as what it is, not as a create.
    assert!(note.contains(
        "Ephemeral resource (opened for the plan and again for the apply, never stored in the plan or the state; not a change): `ephemeral.simple_resource.test_ephemeral`."
    ), "{note}");
    assert!(!note.contains("+ ephemeral."), "{note}");
    let text = planbot::core::render::terminal::note_as_text(&note);
    assert!(text.contains("stays in Proxmox"), "{text}");
    assert!(
        text.contains("ephemeral.simple_resource.test_ephemeral"),
        "{text}"
    );
    let html = planbot::core::note_html::note_to_html(&note);
    assert!(html.contains("stays in Proxmox"), "{html}");
    assert!(
        html.contains("ephemeral.simple_resource.test_ephemeral"),
        "{html}"
    );
    insta::assert_snapshot!(note);
}

#[test]
fn a_root_without_changes_is_one_line() {
    let note = note("no_changes");
    assert!(note.contains("### 🟢 planbot · plan for `3f9a2c1e` · no changes"));
    assert!(note.contains("\nNo changes. Your infrastructure matches the configuration.\n"));
    assert!(!note.contains("<details>"));
    insta::assert_snapshot!(note);
}

#[test]
fn an_errored_plan_is_red_shows_the_error_and_the_partial_changes() {
    let mut c = ctx();
    c.plan_errors.insert(
        "core".into(),
        "Error: Resource precondition failed\n\n  on main.tf line 9, in resource \"terraform_data\" \"vm\":\n   9:       condition     = var.memory >= 512\n\nA VM needs at least 512 MiB of memory.".into(),
    );
    let note = note_with(&crate::support::fixtures::plan("errored"), &[], &c);
    assert!(note.contains("### 🔴"));
    assert!(note.contains("<code>core</code> ❌ errored"));
    assert!(note.contains("```text\nError: Resource precondition failed"));
    assert!(note.contains("<code>+ terraform_data.extra</code>"));
    insta::assert_snapshot!(note);
}

#[test]
fn a_plan_that_waited_a_second_or_more_says_on_what_and_how_long_in_the_last_line() {
    let plan = crate::support::fixtures::plan("no_changes");
    let fp = fp();
    let mut c = ctx();
    let wait = |root: &str, on, ms| PlanWait {
        root: root.into(),
        on,
        took: Duration::from_millis(ms),
    };
    c.waits = vec![
        wait("core", WaitOn::AuthorShare { share: 1 }, 12_300),
        wait("core", WaitOn::Slot { total: 2 }, 999),
        wait("dns", WaitOn::Slot { total: 2 }, 3_000),
        wait("edge", WaitOn::Slot { total: 1 }, 61_000),
    ];
    let planned = |name: &str| RootSection {
        name: name.into(),
        outcome: RootOutcome::Planned {
            plan: &plan,
            findings: &[],
            fingerprint: &fp,
        },
    };
    let note = render_note(
        &c,
        &[planned("core"), planned("dns"), planned("edge")],
        &Scrubber::none(),
    );
    assert_well_formed(&note);
    let last = note.lines().last().unwrap();
    assert!(
        last.contains("planned in 8.2 s · `core` waited 12.3 s for this author's other plans (their share: 1 engine slot) · `dns` waited 3.0 s for an engine slot (all 2 busy) · `edge` waited 1 min 1 s for the one engine slot · [run page]"),
        "{last}"
    );
    // A wait under a second is not worth saying.
    assert!(!last.contains("0.9 s"), "{last}");
    // One root: the wait names no root; a plan that did not wait says nothing.
    let mut one = ctx();
    one.waits = vec![wait("core", WaitOn::AuthorShare { share: 3 }, 4_000)];
    let note = note_with(&plan, &[], &one);
    assert!(
        note.contains("planned in 8.2 s · waited 4.0 s for this author's other plans (their share: 3 engine slots) · "),
        "{note}"
    );
    assert!(!self::note("no_changes").contains("waited"));
}

#[test]
fn failed_and_skipped_roots_sit_in_the_table_next_to_planned_ones() {
    let changes = crate::support::fixtures::plan("changes");
    let fp = fp();
    let mut c = ctx();
    c.draft = true;
    c.banners = vec!["merged as `3f9a2c1e` — waiting for the `planbot-apply` job on `main`".into()];
    c.preflight_note = Some("Proxmox preflight skipped: no endpoint configured".into());
    let roots = [
        RootSection {
            name: "dns".into(),
            outcome: RootOutcome::Planned {
                plan: &changes,
                findings: &[],
                fingerprint: &fp,
            },
        },
        RootSection {
            name: "core".into(),
            outcome: RootOutcome::Skipped {
                reason: "no files changed".into(),
            },
        },
        RootSection {
            name: "edge".into(),
            outcome: RootOutcome::Failed {
                error: "Error: Failed to query available provider packages\n\nCould not retrieve the list of available versions for provider bpg/proxmox".into(),
            },
        },
    ];
    let note = render_note(&c, &roots, &Scrubber::none());
    assert_well_formed(&note);
    assert!(note.contains(
        "### 🔴 planbot · plan for `3f9a2c1e` · draft · 1 of 3 roots failed, 1 with changes"
    ));
    assert!(note.contains("| <code>core</code> | – skipped: no files changed | | | | |"));
    assert!(note.contains("| <code>edge</code> | ❌ failed | | | | |"));
    assert!(note.contains("> - `dns`: `terraform_data.db` will be **replaced**"));
    assert!(note.contains("```text\nError: Failed to query available provider packages"));
    // Banners come first, right after the marker.
    assert!(note.starts_with(&format!("{NOTE_MARKER}\nmerged as `3f9a2c1e`")));
    insta::assert_snapshot!(note);
}

#[test]
fn output_changes_are_folded_and_a_sensitive_output_is_hidden_whole() {
    let note = note("outputs");
    assert!(note.contains("<details><summary>Output changes (4)</summary>"));
    assert!(note.contains("~ token = (sensitive value)\n"));
    assert!(note.contains("~ input.token = (sensitive value)\n"));
    assert!(!note.contains("tok-before-0000-canary") && !note.contains("tok-after-1111-canary"));
    assert!(
        !note.contains("tok-"),
        "not even a part of the token:\n{note}"
    );
    insta::assert_snapshot!(note);
}

#[test]
fn drift_is_shown_as_changed_outside_of_opentofu() {
    let note = note("drift");
    assert!(note.contains("<details><summary>Changed outside of OpenTofu (1)</summary>"));
    assert!(note.contains("~ memory[0].dedicated = 2048 -> 4096\n"));
    insta::assert_snapshot!(note);
}

#[test]
fn a_cloud_init_change_is_a_line_diff_inside_the_file() {
    let note = note("cloudinit");
    assert!(note.contains("~ input.user_data:\n"));
    assert!(note.contains("\n-        groups: [sudo]\n+        groups: [sudo, docker]\n"));
    assert!(note.contains("\n+      - docker.io\n"));
    insta::assert_snapshot!(note);
}

#[test]
fn an_ignition_data_url_is_decoded_down_to_the_changed_line() {
    let note = note("ignition");
    // Both the plain Ignition JSON and the data: URL form show the one line added in the file.
    assert_eq!(
        note.matches("\n+              - https://v.firebog.net/hosts/Easyprivacy.txt\n")
            .count(),
        2,
        "{note}"
    );
    assert!(note.contains("file /etc/blocky/config.yml (data: URL, decoded):"));
    assert!(!note.contains(";base64,"), "no base64 blob left:\n{note}");
    assert!(note.contains("<code>-/+ terraform_data.blocky_vm</code> — replaced (<code>replace_triggered_by</code> fired)"));
    insta::assert_snapshot!(note);
}

#[test]
fn proxmox_vm_replacement_is_red_and_says_the_disks_are_recreated() {
    let note = note("proxmox");
    assert!(note.contains("### 🔴"));
    assert!(note.contains("> - `proxmox_virtual_environment_vm.blocky` (VM 1000 `blocky` on `pve01`) will be **replaced** — because `disk[0].datastore_id` forces replacement. Its disks are recreated"));
    assert!(note.contains("(container 200 `pihole` on `pve02`) will be **destroyed**"));
    assert!(note.contains("~ source_raw[0].data (JSON, pretty-printed):  # forces replacement\n"));
    // A base64 cloud-init blob is decoded; sensitive values never appear, at any depth.
    assert!(note.contains("+    packages:\n+      - qemu-guest-agent\n+      - unbound\n"));
    for canary in [
        "vm-pass-canary",
        "canary-key",
        "pve-token-canary",
        "s-canary",
    ] {
        assert!(!note.contains(canary), "{canary} leaked:\n{note}");
    }
    assert!(note.contains("~ initialization[0].user_account[0].password = (sensitive value)\n"));
    assert!(note.contains("+ secret_list[1] = (sensitive value)\n"));
    insta::assert_snapshot!(note);
}

#[test]
fn unknown_actions_deposed_objects_and_unknown_reasons_are_shown_not_dropped() {
    let note = note("unusual");
    assert!(
        note.contains("It is changed in a way planbot does not know: `[\"teleport\",\"create\"]`.")
    );
    assert!(note
        .contains("> - `terraform_data.web` (deposed object `a1b2c3d4`) will be **destroyed**."));
    assert!(note.contains("the engine gives the reason `delete_because_something_new_in_tofu_2`"));
    // Data sources are read, not changed: not listed.
    assert!(!note.contains("proxmox_virtual_environment_nodes"));
    insta::assert_snapshot!(note);
}

#[test]
fn markdown_hostile_values_cannot_break_the_note() {
    let note = note("hostile");
    // assert_well_formed ran: one marker, closed fences, balanced <details>, no <script>.
    assert!(note.contains(
        "<code>+ terraform_data.hostile&#91;&quot;&lt;/details&gt;&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#93;</code>"
    ));
    // The fence is longer than the longest backtick run inside (5).
    assert!(note.contains("\n``````diff\n"));
    insta::assert_snapshot!(note);
}

#[test]
fn hostile_root_names_findings_and_errors_are_escaped_too() {
    let plan = crate::support::fixtures::plan("changes");
    let fp = fp();
    let findings = [Finding {
        rule: "PVE999",
        severity: Severity::Warning,
        address: "a`b".into(),
        message: "message with <!-- planbot:mr-note v1 --> and </details>".into(),
        fix: "line one\n```\n</details>\n<!-- x -->".into(),
    }];
    let roots = [
        RootSection {
            name: "x|y`<b>".into(),
            outcome: RootOutcome::Planned {
                plan: &plan,
                findings: &findings,
                fingerprint: &fp,
            },
        },
        RootSection {
            name: "<!-- planbot:mr-note v1 -->".into(),
            outcome: RootOutcome::Failed {
                error: "```\n</details><script>x</script>\n<!-- planbot:mr-note v1 -->".into(),
            },
        },
        RootSection {
            name: "skip|me".into(),
            outcome: RootOutcome::Skipped {
                reason: "a|b <!-- c".into(),
            },
        },
    ];
    let note = render_note(&ctx(), &roots, &Scrubber::none());
    assert_well_formed(&note);
    assert!(note.contains("| <code>x&#124;y&#96;&lt;b&gt;</code> |"));
}

/// The code spans GitLab's Markdown parser (comrak) finds in `note`, as a reader sees them.
fn code_spans_as_gitlab_shows_them(note: &str) -> Vec<String> {
    let mut options = comrak::Options::default();
    options.extension.table = true;
    options.extension.autolink = true;
    options.extension.strikethrough = true;
    let arena = comrak::Arena::new();
    let root = comrak::parse_document(&arena, note, &options);
    root.descendants()
        .filter_map(|n| match &n.data.borrow().value {
            comrak::nodes::NodeValue::Code(c) => Some(c.literal.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_findings_message_with_quotes_reads_with_its_real_characters() {
    // Real lint findings: the messages quote HCL (`content_type = "import"`) in code spans,
    // where GitLab shows `&quot;` verbatim.
    let plan = crate::support::fixtures::plan("bpg/seed_talos_raw_xz_decompress");
    let findings = planbot::core::proxmox::lint::lint(&plan, &[]);
    assert_eq!(findings.len(), 2);
    let note = note_with(&plan, &findings, &ctx());
    assert!(
        note.contains("(named after the URL) with `content_type = \"import\"`, but Proxmox"),
        "{note}"
    );
    assert!(
        note.contains("sets `decompression_algorithm = \"zst\"` with"),
        "{note}"
    );
    let spans = code_spans_as_gitlab_shows_them(&note);
    for shown in [
        "content_type = \"import\"",
        "decompression_algorithm = \"zst\"",
    ] {
        assert!(spans.iter().any(|s| s == shown), "{shown} in {spans:?}");
    }
    for s in &spans {
        assert!(
            !s.contains("&quot;") && !s.contains("&#39;") && !s.contains("&amp;"),
            "an entity shown verbatim: {s}"
        );
    }
    insta::assert_snapshot!(note);
}

#[test]
fn findings_come_errors_first_each_with_its_fix() {
    let plan = crate::support::fixtures::plan("proxmox");
    let f = |rule, severity, fix: &str| Finding {
        rule,
        severity,
        address: "proxmox_virtual_environment_vm.blocky".into(),
        message: format!("{rule} fired"),
        fix: fix.into(),
    };
    let findings = [
        f(
            "PVE008",
            Severity::Info,
            "expected for a cattle VM configured by Ignition",
        ),
        f("PVE001", Severity::Warning, "set `on_boot = true`"),
        f(
            "PVE003",
            Severity::Error,
            "lifecycle {\n  prevent_destroy = true\n}",
        ),
    ];
    let mut c = ctx();
    c.preflight_note = Some("✅ Proxmox token can do what this plan needs".into());
    let note = note_with(&plan, &findings, &c);
    let pos = |s: &str| {
        note.find(s)
            .unwrap_or_else(|| panic!("{s} missing:\n{note}"))
    };
    assert!(pos("**PVE003**") < pos("**PVE001**") && pos("**PVE001**") < pos("**PVE008**"));
    assert!(note.contains("  ```\n  lifecycle {\n    prevent_destroy = true\n  }\n  ```\n"));
    assert!(pos("Destructive changes") < pos("**Checks**") && pos("**Checks**") < pos("<details>"));
    insta::assert_snapshot!(note);
}

#[test]
fn every_known_secret_is_scrubbed_from_the_final_text() {
    let plan = crate::support::fixtures::plan("outputs");
    let fp = fp();
    let mut secrets = Secrets::from_plan(&plan);
    secrets.add("https://pve02:8006");
    let note = render_note(
        &ctx(),
        &[RootSection {
            name: "core".into(),
            outcome: RootOutcome::Planned {
                plan: &plan,
                findings: &[],
                fingerprint: &fp,
            },
        }],
        &secrets.scrubber(),
    );
    assert!(!note.contains("pve02:8006"), "{note}");
    assert!(note.contains("~ endpoint = \"https://pve01:8006\" -> \"(sensitive value)\""));
}

/// A plan with `n` updated resources, each carrying a multi-line string of about `lines` lines,
/// plus `destroys` destroyed VMs.
fn huge_plan(n: usize, lines: usize, destroys: usize) -> Plan {
    let mut changes = Vec::new();
    for i in 0..n {
        let text = |v: &str| -> String {
            (0..lines)
                .map(|l| format!("line {l} of the config of vm-{i}: {v}\n"))
                .collect()
        };
        changes.push(json!({
            "address": format!("terraform_data.vm[{i}]"), "mode": "managed", "type": "terraform_data", "name": "vm",
            "change": {"actions": ["update"],
                "before": {"id": format!("id-{i}"), "input": {"name": format!("vm-{i}"), "user_data": text("old")}},
                "after": {"id": format!("id-{i}"), "input": {"name": format!("vm-{i}"), "user_data": text("new")}},
                "after_unknown": {"output": true}, "before_sensitive": {}, "after_sensitive": {}}
        }));
    }
    for i in 0..destroys {
        changes.push(json!({
            "address": format!("proxmox_virtual_environment_vm.old[{i}]"), "mode": "managed",
            "type": "proxmox_virtual_environment_vm", "name": "old", "action_reason": "delete_because_count_index",
            "change": {"actions": ["delete"], "before": {"vm_id": 2000 + i, "name": format!("old-{i}")}, "after": null,
                "after_unknown": {}, "before_sensitive": {}, "after_sensitive": false}
        }));
    }
    Plan::from_value(json!({"format_version": "1.2", "resource_changes": changes})).unwrap()
}

#[test]
fn a_huge_plan_stays_under_the_budget_and_keeps_what_a_reviewer_needs() {
    let plan = huge_plan(6000, 40, 20);
    let note = note_with(&plan, &[], &ctx());
    assert!(note.len() <= NOTE_BUDGET, "{} chars", note.len());
    // The headline, the table and every destructive change are still there.
    assert!(note.contains("| <code>core</code> | 0 | 6000 | 20 ⚠️ | 0 | 0 |"));
    assert_eq!(
        note.matches("> - `proxmox_virtual_environment_vm.old[")
            .count(),
        20
    );
    let left_out: usize = note
        .split("**")
        .find_map(|s| s.strip_suffix(" resources left out"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no left-out line in the note"));
    // Every resource is accounted for: shown in full, folded to its summary line, or counted.
    let shown = note.matches("<details><summary><code>").count();
    let folded = note
        .matches("diff left out to keep this note short")
        .count();
    assert!(folded > 0 && left_out > 0, "{shown} {folded} {left_out}");
    assert_eq!(
        shown + folded + left_out,
        6000 + 20,
        "{shown} {folded} {left_out}"
    );
    assert!(note.contains(
        "left out** to keep this note under GitLab's size limit — see the [run page](https://planbot.example.com/runs/118)."
    ));
}

#[test]
fn when_only_some_diffs_fit_the_smallest_are_shown_and_every_larger_one_folds() {
    // 3,000 updates whose diffs differ in size (a multi-line string of 1 to 30 lines): their
    // summary lines fit the budget, their diffs do not all fit.
    let mut changes = Vec::new();
    let lines_of = |i: usize| 1 + (i * 7) % 30;
    for i in 0..3000 {
        let text = |v: &str| -> String {
            (0..lines_of(i))
                .map(|l| format!("line {l} of vm-{i}: {v}\n"))
                .collect()
        };
        changes.push(json!({
            "address": format!("terraform_data.vm[{i}]"), "mode": "managed", "type": "terraform_data", "name": "vm",
            "change": {"actions": ["update"],
                "before": {"input": {"user_data": text("old")}}, "after": {"input": {"user_data": text("new")}},
                "after_unknown": {}, "before_sensitive": {}, "after_sensitive": {}}
        }));
    }
    let plan =
        Plan::from_value(json!({"format_version": "1.2", "resource_changes": changes})).unwrap();
    let note = note_with(&plan, &[], &ctx());
    assert!(note.len() <= NOTE_BUDGET, "{} chars", note.len());
    assert!(!note.contains("resources left out**"), "every summary fits");
    let folded_marker =
        "</code> — updated in place · <em>diff left out to keep this note short</em>";
    let (mut largest_shown, mut smallest_folded, mut shown) = (0, usize::MAX, 0);
    for i in 0..3000 {
        let address = format!("terraform_data.vm[{i}]");
        let in_code = format!("terraform_data.vm&#91;{i}&#93;");
        if note.contains(&format!("<code>~ {in_code}{folded_marker}")) {
            smallest_folded = smallest_folded.min(lines_of(i));
        } else {
            assert!(
                note.contains(&format!("line 0 of vm-{i}: new")),
                "{address} is neither shown nor folded"
            );
            largest_shown = largest_shown.max(lines_of(i));
            shown += 1;
        }
    }
    assert!(
        shown > 100 && smallest_folded != usize::MAX,
        "{shown} shown"
    );
    assert!(
        largest_shown <= smallest_folded,
        "a diff of {largest_shown} lines is shown while one of {smallest_folded} lines is folded"
    );
}

#[test]
fn thousands_of_destroyed_vms_with_their_findings_still_fit_the_budget() {
    // 3,000 destroyed VMs: 3,000 destructive changes and 3,000 PVE008 findings, whose lists
    // alone would be larger than the budget.
    let plan = huge_plan(0, 0, 3000);
    let findings = planbot::core::proxmox::lint::lint(&plan, &[]);
    assert_eq!(findings.len(), 3000);
    let note = note_with(&plan, &findings, &ctx());
    assert!(note.len() <= NOTE_BUDGET, "{} chars", note.len());
    // The first ones are listed, the rest counted, and nothing is silently lost.
    let listed = note
        .matches("> - `proxmox_virtual_environment_vm.old[")
        .count();
    let more: usize = note
        .split("> - … and ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of the destructive changes not listed"));
    assert!(listed >= 20, "{listed}");
    assert_eq!(listed + more, 3000);
    assert!(note.contains("> - `proxmox_virtual_environment_vm.old[0]`"));
    assert!(note.contains("more findings — see the [run page]"));
}

#[test]
fn over_budget_the_largest_diffs_fold_first_then_sections_drop() {
    let plan = crate::support::fixtures::plan("proxmox");
    // Enough room for everything but the two largest diffs.
    let mut c = ctx();
    let full = note_with(&plan, &[], &c).len();
    c.budget = full - 900;
    let folded = note_with(&plan, &[], &c);
    assert!(folded.len() <= c.budget);
    assert!(folded.contains("- <code>-/+ proxmox_virtual_environment_file.ignition</code> — replaced (because <code>source_raw&#91;0&#93;.data</code> forces replacement) · <em>diff left out to keep this note short</em>"), "{folded}");
    assert!(!folded.contains("left out** to keep"));
    insta::assert_snapshot!("budget_folded", folded);
    // Far too little room: sections are dropped and counted, the callout stays.
    c.budget = 1500;
    let dropped = note_with(&plan, &[], &c);
    assert!(dropped.contains("resources left out**") || dropped.contains("resource left out**"));
    assert!(dropped.contains("Destructive changes"));
    insta::assert_snapshot!("budget_dropped", dropped);
}

#[test]
fn the_policies_section_lists_each_set_its_messages_owners_and_approvals() {
    use planbot::core::policy::review::{
        ApprovalView, ClearedApproval, PolicySection, RecordedSet, RecordedVerdict, SetOrigin,
        SetState,
    };
    use planbot::core::policy::Owner;
    let set = |name: &str, origin, state, owners: Vec<Owner>| RecordedSet {
        name: name.into(),
        origin,
        path: if origin == SetOrigin::Repository {
            "policies".into()
        } else {
            String::new()
        },
        namespace: "main".into(),
        owners,
        state,
        failures: vec![],
        failures_more: 0,
        warnings: vec![],
        warnings_more: 0,
        error: None,
    };
    let verdict = RecordedVerdict {
        sets: vec![
            RecordedSet {
                warnings: vec!["proxmox_virtual_environment_vm.web has no backup job".into()],
                ..set("backups", SetOrigin::Operator, SetState::Passed, vec![])
            },
            RecordedSet {
                failures: vec![
                    "proxmox_virtual_environment_vm.db would be destroyed".into(),
                    "a `code` span, <b>html</b> and | a pipe".into(),
                ],
                failures_more: 3,
                ..set(
                    "no-deletes",
                    SetOrigin::Repository,
                    SetState::Failed,
                    vec![
                        Owner::User("alice".into()),
                        Owner::Group("infra/admins".into()),
                    ],
                )
            },
            RecordedSet {
                failures: vec!["VM 101 asks for 65536 MiB; 16384 at most".into()],
                ..set(
                    "sizes",
                    SetOrigin::Repository,
                    SetState::Failed,
                    vec![Owner::User("carol".into())],
                )
            },
            RecordedSet {
                error: Some("policies/broken.rego does not parse: policies/broken.rego:3:1: error: unexpected token".into()),
                ..set("broken", SetOrigin::Repository, SetState::Error, vec![])
            },
        ],
    };
    let section = PolicySection::new(
        &verdict,
        &[ApprovalView {
            set: "sizes".into(),
            approver: "carol".into(),
        }],
        &[ClearedApproval {
            set: "no-deletes".into(),
            approver: "alice".into(),
            sha: "1a2b3c4d".into(),
        }],
        "main",
    );
    let ctx = NoteContext {
        policies: [("core".to_string(), section)].into_iter().collect(),
        ..ctx()
    };
    let note = note_with(&crate::support::fixtures::plan("no_changes"), &[], &ctx);
    assert!(note.contains("### 🔴 planbot"), "a set waits: {note}");
    assert!(note.contains("**Policies** · sets from the default branch `main` and planbot's own"));
    insta::assert_snapshot!(note);
}

#[test]
fn a_local_plan_cut_to_gitlabs_budget_points_to_the_command_that_prints_it_whole() {
    // `planbot plan DIR --budget gitlab`: no run page and no plan file; the hint names the
    // command that prints the whole plan, the directory in a code span.
    let plan = huge_plan(600, 4, 0);
    let ctx = NoteContext {
        local_run: true,
        budget: 20_000,
        plan_dir: Some("infra/my `core`".into()),
        ..NoteContext::default()
    };
    let note = note_with(&plan, &[], &ctx);
    assert!(
        note.contains(
            "left out** to keep this note under GitLab's size limit — see the full plan \
             (`` planbot plan infra/my `core` ``, without `--budget`)."
        ),
        "{}",
        &note[note.len().saturating_sub(800)..]
    );
}

#[test]
fn checks_that_could_not_run_say_why_and_engine_text_cannot_break_the_note() {
    use planbot::core::engine_checks::{RootChecks, StepCheck};
    let hostile = r#"{"valid":false,"diagnostics":[{"severity":"error","summary":"Bad </details> <!-- x","detail":"line one\n/approve\n@all ```\nend","range":{"filename":"main.tf","start":{"line":7}}},{"severity":"warning","summary":"Deprecated Resource","detail":"use `proxmox_vm` instead","range":{"filename":"vm.tf","start":{"line":2}}},{"severity":"warning","summary":"Deprecated Resource","detail":"use `proxmox_vm` instead","range":{"filename":"vm.tf","start":{"line":9}}}]}"#;
    let checks = RootChecks::read(
        &StepCheck::Ran {
            exit: Some(1),
            stdout: hostile.as_bytes().to_vec(),
        },
        &StepCheck::Ran {
            exit: Some(2),
            stdout: Vec::new(),
        },
        &StepCheck::NotRun("`test -json` timed out after 30m".into()),
        &planbot::core::engine_checks::PlanWarnings::default(),
        None,
    );
    let mut c = ctx();
    c.checks.insert("core".into(), checks);
    let note = note_with(&crate::support::fixtures::plan("no_changes"), &[], &c);
    assert!(
        note.contains("### 🔴"),
        "tests that did not run are red: {note}"
    );
    assert!(
        note.contains("- ❌ **Tests did not run**: `test -json` timed out after 30m\n"),
        "{note}"
    );
    assert!(note.contains("- ⚠️ **Format not checked**: "), "{note}");
    assert!(
        note.contains("<details><summary>⚠️ 2 warnings from OpenTofu</summary>"),
        "{note}"
    );
    assert!(
        note.contains("- **Deprecated Resource** (2×)\n  - at `vm.tf:2`, `vm.tf:9`: use `proxmox_vm` instead\n"),
        "{note}"
    );
    assert_eq!(note.matches("</details>").count(), 1, "{note}");
    assert!(!note.contains("\n/approve"), "{note}");
    insta::assert_snapshot!(note);
}

#[test]
fn warnings_a_plan_gave_past_those_planbot_keeps_are_counted_and_said() {
    use planbot::core::engine_checks::{
        Diagnostic, PlanWarnings, RootChecks, Severity, StepCheck, PLAN_WARNINGS_KEPT,
    };
    let mut plan = PlanWarnings::default();
    for i in 0..PLAN_WARNINGS_KEPT + 3 {
        plan.add(Diagnostic {
            severity: Severity::Warning,
            summary: "Deprecated attribute".into(),
            detail: "use `cpu` instead".into(),
            at: Some(format!("vm{i}.tf:4")),
        });
    }
    let validated = StepCheck::Ran {
        exit: Some(0),
        stdout: br#"{"valid":true,"diagnostics":[]}"#.to_vec(),
    };
    let checks = RootChecks::read(&validated, &StepCheck::Off, &StepCheck::Off, &plan, None);
    let mut c = ctx();
    c.checks.insert("core".into(), checks);
    let note = note_with(&crate::support::fixtures::plan("no_changes"), &[], &c);
    assert!(
        note.contains("<details><summary>⚠️ 1003 warnings from OpenTofu</summary>"),
        "{note}"
    );
    assert!(
        note.contains("- **Deprecated attribute** (1000×)\n"),
        "{note}"
    );
    assert!(
        note.contains("- … and 3 more warnings the plan gave, not read: planbot reads the first 1000 different ones of a plan — see the [run page](https://planbot.example.com/runs/118).\n"),
        "{note}"
    );
}

#[test]
fn a_root_planned_below_a_root_changed_in_the_same_mr_says_so_with_its_output_changes() {
    use planbot::core::render::planned_before::planned_before;
    use planbot::core::root_graph::RootGraph;
    let network = crate::support::fixtures::plan("outputs");
    let vms = crate::support::fixtures::plan("changes");
    let fp = fp();
    let graph =
        RootGraph::new(&[("network", &[][..]), ("vms", &["network".to_string()][..])]).unwrap();
    let plans = [("network", &network), ("vms", &vms)].into_iter().collect();
    let mut c = ctx();
    c.planned_before = planned_before(&graph, &plans);
    let roots = [
        RootSection {
            name: "network".into(),
            outcome: RootOutcome::Planned {
                plan: &network,
                findings: &[],
                fingerprint: &fp,
            },
        },
        RootSection {
            name: "vms".into(),
            outcome: RootOutcome::Planned {
                plan: &vms,
                findings: &[],
                fingerprint: &fp,
            },
        },
    ];
    let note = render_note(&c, &roots, &Scrubber::none());
    assert_well_formed(&note);
    let vms_section = note.split("#### Root `vms`").nth(1).unwrap();
    assert!(
        vms_section.contains(
            "⏳ Planned against `network` before its apply: re-planned by the apply job."
        ),
        "{note}"
    );
    assert_eq!(note.matches("⏳ Planned against").count(), 1, "{note}");
    insta::assert_snapshot!(note);
}

#[test]
fn an_output_with_one_sensitive_part_is_hidden_whole_in_the_note_and_the_fingerprint() {
    // Only `password` is marked, but an output that marks anything is sensitive as a whole:
    // its other parts (`host`) are not shown, and the fingerprint holds their HMAC only.
    let plan = |host: &str| {
        Plan::from_value(json!({"format_version": "1.2", "output_changes": {"conn": {
            "actions": ["update"],
            "before": {"host": "old-host-canary", "password": "pw-before-canary"},
            "after": {"host": host, "password": "pw-after-canary"},
            "after_unknown": false, "before_sensitive": false,
            "after_sensitive": {"password": true}}}}))
        .unwrap()
    };
    let changed = plan("new-host-canary");
    let note = note_with(&changed, &[], &ctx());
    assert!(note.contains("~ conn = (sensitive value)\n"), "{note}");
    assert!(!note.contains("canary"), "no part of the output:\n{note}");
    let projection = planbot::core::fingerprint::projection(&changed, b"k", None);
    assert!(!projection.contains("canary"), "{projection}");
    // Hidden, still bound: another host is another fingerprint.
    assert_ne!(
        Fingerprint::of(&changed, b"k"),
        Fingerprint::of(&plan("other-host-canary"), b"k")
    );
}
