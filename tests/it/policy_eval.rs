//! The policy evaluator against known results: conftest's own Terraform example gives
//! conftest's message in both Rego syntaxes, `warn` warns, `violation` objects carry their
//! `msg`, `data.planbot` holds the lint findings, and a policy that loops, errors or produces
//! something that is not a message gives a clear error, never a pass.

use planbot::core::plan::Plan;
use planbot::core::policy::{
    evaluate, Message, Outcome, PlanInput, PolicyError, PolicyFile, PolicySet, Results, Verdict,
};
use planbot::core::proxmox::findings::Finding;
use planbot::core::proxmox::lint::lint;
use std::path::PathBuf;
use std::time::Duration;

fn set(files: &[(&str, &str)]) -> PolicySet {
    PolicySet {
        name: "test".into(),
        namespace: "main".into(),
        files: files
            .iter()
            .map(|(path, text)| PolicyFile {
                path: path.to_string(),
                text: text.to_string(),
            })
            .collect(),
        limit: Duration::from_secs(10),
    }
}

fn check_with(plan_json: &str, findings: &[Finding], sets: &[PolicySet]) -> Verdict {
    evaluate(
        &PlanInput {
            plan_json,
            findings,
            root: "core",
        },
        sets,
    )
}

/// The one set's results (panics with the error when it could not be evaluated).
fn results(plan_json: &str, set: PolicySet) -> Results {
    let verdict = check_with(plan_json, &[], std::slice::from_ref(&set));
    match &verdict.sets[0].outcome {
        Outcome::Checked(r) => r.clone(),
        Outcome::Error(e) => panic!("the set did not evaluate: {e}"),
    }
}

fn error(plan_json: &str, set: PolicySet) -> PolicyError {
    let verdict = check_with(plan_json, &[], std::slice::from_ref(&set));
    assert!(verdict.blocks(), "an error must block");
    match &verdict.sets[0].outcome {
        Outcome::Error(e) => e.clone(),
        Outcome::Checked(r) => panic!("expected an error, the set evaluated: {r:?}"),
    }
}

fn msgs(list: &[Message]) -> Vec<&str> {
    list.iter().map(|m| m.msg.as_str()).collect()
}

const CONFTEST_MESSAGE: &str =
    "Terraform plan will change prohibited resources in the following namespaces: google_iam, google_container";

#[test]
fn conftests_terraform_example_gives_conftests_message_in_both_syntaxes() {
    let plan = crate::support::fixtures::text("policy/gke_show.json");
    for dir in ["conftest_v0", "conftest_v1"] {
        let policy = crate::support::fixtures::text(&format!("policy/{dir}/base.rego"));
        let r = results(&plan, set(&[("base.rego", &policy)]));
        assert_eq!(msgs(&r.failures), [CONFTEST_MESSAGE], "{dir}");
        assert_eq!((r.successes, r.tests()), (0, 1), "{dir}");
    }
    // A plan that touches no denied type passes: one test, one success.
    let other = crate::support::fixtures::text("plans/bpg/vm_destroyed_and_updated.json");
    let policy = crate::support::fixtures::text("policy/conftest_v0/base.rego");
    let verdict = check_with(&other, &[], &[set(&[("base.rego", &policy)])]);
    assert!(!verdict.blocks());
    assert_eq!(verdict.passed_sets().count(), 1);
    let r = verdict.sets[0].results().unwrap();
    assert_eq!((r.successes, r.failures.len()), (1, 0));
}

#[test]
fn warn_rules_warn_and_violation_objects_carry_msg_and_metadata() {
    let plan = crate::support::fixtures::text("plans/bpg/vm_destroyed_and_updated.json");
    let policy = r#"
package main

warn contains msg if {
	some rc in input.resource_changes
	"update" in rc.change.actions
	msg := sprintf("%s is updated in place", [rc.address])
}

violation contains {"msg": msg, "address": rc.address} if {
	some rc in input.resource_changes
	rc.change.actions == ["delete"]
	msg := sprintf("%s is destroyed", [rc.address])
}

deny_never contains "never" if { false }
"#;
    let r = results(&plan, set(&[("p.rego", policy)]));
    assert_eq!(
        msgs(&r.warnings),
        ["proxmox_virtual_environment_vm.web is updated in place"]
    );
    let mut failures = msgs(&r.failures);
    failures.sort();
    assert_eq!(
        failures,
        [
            "proxmox_virtual_environment_vm.old_db is destroyed",
            "proxmox_vm.scratch is destroyed"
        ]
    );
    let with_address = r
        .failures
        .iter()
        .find(|m| m.msg.starts_with("proxmox_vm."))
        .unwrap();
    assert_eq!(with_address.metadata["address"], "proxmox_vm.scratch");
    // deny_never produced nothing: one success.
    assert_eq!(r.successes, 1);

    // Warnings alone do not block.
    let only_warn = "package main\nwarn contains \"careful\" if { true }\n";
    let verdict = check_with(&plan, &[], &[set(&[("w.rego", only_warn)])]);
    assert!(!verdict.blocks());
    assert_eq!(
        msgs(&verdict.sets[0].results().unwrap().warnings),
        ["careful"]
    );
}

#[test]
fn input_is_the_document_exactly_and_data_planbot_holds_the_findings() {
    let plan_json = crate::support::fixtures::text("plans/bpg/vm_destroyed_and_updated.json");
    let plan = Plan::from_json(plan_json.as_bytes()).unwrap();
    let findings = lint(&plan, &[]);
    assert!(findings.iter().any(|f| f.rule == "PVE008"), "{findings:?}");
    // `planned_values` and `terraform_version` are not in planbot's plan model: the policy sees
    // the document itself. PVE008 (a warning in planbot) becomes a blocker.
    let policy = r#"
package main

deny contains msg if {
	some f in data.planbot.findings
	f.rule == "PVE008"
	msg := sprintf("%s (%s on root %s): %s", [f.address, f.severity, data.planbot.root, f.title])
}

warn contains msg if {
	msg := sprintf("engine %s, planned values %s", [input.terraform_version, json.marshal(input.planned_values)])
}
"#;
    let verdict = check_with(&plan_json, &findings, &[set(&[("p.rego", policy)])]);
    let r = verdict.sets[0].results().expect("evaluated");
    let mut failures = msgs(&r.failures);
    failures.sort();
    assert_eq!(
        failures,
        [
            "proxmox_virtual_environment_vm.old_db (warning on root core): VM replaced or destroyed",
            "proxmox_vm.scratch (warning on root core): VM replaced or destroyed"
        ]
    );
    assert_eq!(
        msgs(&r.warnings),
        [r#"engine 1.10.6, planned values {"root_module":{}}"#]
    );
}

#[test]
fn namespaces_are_conftests_packages_and_a_wrong_one_is_an_error() {
    let plan = crate::support::fixtures::text("policy/gke_show.json");
    let policy = "package terraform.gke\n\ndeny contains \"no GKE\" if { some rc in input.resource_changes; startswith(rc.type, \"google_container\") }\n";
    let mut s = set(&[("p.rego", policy)]);
    s.namespace = "terraform.gke".into();
    assert_eq!(
        msgs(&results(&plan, s).failures),
        ["no GKE"],
        "a set: one message"
    );

    let e = error(&plan, set(&[("p.rego", policy)]));
    assert_eq!(
        e,
        PolicyError::NoRules {
            namespace: "main".into(),
            found: "terraform.gke".into()
        }
    );
    assert!(
        e.to_string().contains("packages found: terraform.gke"),
        "{e}"
    );
    assert_eq!(error(&plan, set(&[])), PolicyError::NoFiles);
}

#[test]
fn conftest_exceptions_switch_a_rule_off() {
    let plan = crate::support::fixtures::text("policy/gke_show.json");
    let policy = r#"
package main

deny_gke contains "no GKE" if { some rc in input.resource_changes; startswith(rc.type, "google_container") }
deny_iam contains "no IAM" if { some rc in input.resource_changes; startswith(rc.type, "google_iam") }

exception contains rules if { rules := ["gke"] }
"#;
    let r = results(&plan, set(&[("p.rego", policy)]));
    assert!(r.failures.is_empty(), "{r:?}");
    assert_eq!(
        msgs(&r.exceptions),
        [r#"data.main.exception[_][_] == "gke""#]
    );
    assert_eq!(r.successes, 1, "deny_iam passed");
}

#[test]
fn a_policy_that_loops_stops_at_the_limit_with_a_clear_error() {
    let plan = crate::support::fixtures::text("policy/gke_show.json");
    // About nine million steps: many seconds without a limit, stopped after 100 ms with it.
    let policy = r#"
package main

deny contains msg if {
	n := count([x | some i in numbers.range(1, 3000); some j in numbers.range(1, 3000); x := i * j])
	msg := sprintf("%d", [n])
}
"#;
    let mut s = set(&[("loop.rego", policy)]);
    s.limit = Duration::from_millis(100);
    let e = error(&plan, s);
    assert_eq!(
        e,
        PolicyError::Limit {
            limit: Duration::from_millis(100)
        }
    );
    assert_eq!(
        e.to_string(),
        "evaluation stopped after 100ms, the limit of a policy set (a policy that loops over too much?)"
    );
}

#[test]
fn a_policy_that_errors_or_says_no_message_is_an_error_not_a_pass() {
    let plan = crate::support::fixtures::text("policy/gke_show.json");
    // A conflict at evaluation time.
    let conflict = "package main\n\nlimit := 1 if { true }\nlimit := 2 if { true }\n\ndeny contains \"x\" if { limit > 5 }\n";
    let e = error(&plan, set(&[("conflict.rego", conflict)]));
    assert!(
        matches!(&e, PolicyError::Eval { rule, .. } if rule == "data.main.deny"),
        "{e:?}"
    );

    // A builtin planbot's evaluator does not have (no network, no clock).
    let http = "package main\n\ndeny contains msg if {\n\tr := http.send({\"method\": \"GET\", \"url\": \"https://example.com\"})\n\tmsg := r.body\n}\n";
    let e = error(&plan, set(&[("http.rego", http)])).to_string();
    assert!(e.contains("http.send"), "{e}");
    let clock = "package main\n\ndeny contains \"late\" if { time.now_ns() > 0 }\n";
    let e = error(&plan, set(&[("clock.rego", clock)])).to_string();
    assert!(e.contains("time.now_ns"), "{e}");

    // `deny if { … }` is a boolean, which conftest would quietly count as a pass.
    let boolean = "package main\n\ndeny if { count(input.resource_changes) > 0 }\n";
    let e = error(&plan, set(&[("bool.rego", boolean)]));
    assert_eq!(
        e,
        PolicyError::BadResult {
            rule: "data.main.deny".into(),
            found: "the boolean true".into()
        }
    );
    // An object without `msg`.
    let no_msg = "package main\n\nviolation contains {\"message\": \"x\"} if { true }\n";
    let e = error(&plan, set(&[("obj.rego", no_msg)])).to_string();
    assert!(e.contains("without a string \"msg\""), "{e}");

    // A syntax error names the file and the line.
    let broken = "package main\n\ndeny contains msg if {\n\tmsg := \n}\n";
    match error(&plan, set(&[("broken.rego", broken)])) {
        PolicyError::Parse { file, message } => {
            assert_eq!(file, "broken.rego");
            assert!(message.contains("broken.rego:"), "{message}");
        }
        other => panic!("expected a parse error, got {other:?}"),
    }

    // A rule that depends on itself.
    let recursive = "package main\n\ndeny contains msg if { some m in deny; msg := concat(\"\", [m, \"!\"]) }\n";
    let e = error(&plan, set(&[("rec.rego", recursive)]));
    assert!(
        matches!(e, PolicyError::Eval { .. } | PolicyError::Parse { .. }),
        "{e:?}"
    );
}

#[test]
fn every_set_is_checked_and_an_error_in_one_does_not_hide_the_others() {
    let plan = crate::support::fixtures::text("policy/gke_show.json");
    let pass = set(&[(
        "ok.rego",
        "package main\ndeny contains \"x\" if { false }\n",
    )]);
    let fail = PolicySet {
        name: "gke".into(),
        ..set(&[(
            "base.rego",
            &crate::support::fixtures::text("policy/conftest_v1/base.rego"),
        )])
    };
    let broken = PolicySet {
        name: "broken".into(),
        ..set(&[("b.rego", "package main\ndeny contains")])
    };
    let verdict = check_with(&plan, &[], &[pass, fail, broken]);
    assert_eq!(
        verdict
            .passed_sets()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        ["test"]
    );
    assert_eq!(
        verdict
            .blocking_sets()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        ["gke", "broken"]
    );
    assert!(verdict.has_errors());

    // Input that is not JSON: every set errors.
    let verdict = check_with(
        "not json",
        &[],
        &[set(&[(
            "ok.rego",
            "package main\ndeny contains \"x\" if { false }\n",
        )])],
    );
    assert!(matches!(
        verdict.sets[0].outcome,
        Outcome::Error(PolicyError::Input(_))
    ));
}

/// Every set's verdict when planbot reads only the keys its policies name equals the verdict
/// over the whole document; a key no policy names is absent, a key one names is whole, and a
/// policy that looks at `input` itself sees every key.
#[test]
fn a_set_sees_the_keys_it_names_and_the_same_verdict_as_over_the_whole_plan() {
    use planbot::core::policy::{evaluate_document, reads_of, InputReads, PlanDocument};
    let dir = |d: &str| -> Vec<(String, String)> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(d);
        let mut files: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "rego"))
            .map(|p| {
                (
                    p.display().to_string(),
                    std::fs::read_to_string(&p).unwrap(),
                )
            })
            .collect();
        files.sort();
        files
    };
    let as_set = |files: &[(String, String)]| {
        let borrowed: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        set(&borrowed)
    };
    let keys_of_input = r#"
package main

import rego.v1

warn contains msg if {
	msg := concat(",", sort(object.keys(input)))
}
"#;
    let prior = r#"
package main

import rego.v1

warn contains msg if {
	msg := sprintf("%d resources before", [count(input.prior_state.values.root_module.resources)])
}
"#;
    let sets = [
        as_set(&dir("examples/policies")),
        as_set(&dir("tests/fixtures/policy/conftest_v1")),
        as_set(&dir("tests/fixtures/policy/conftest_v0")),
        set(&[("keys.rego", keys_of_input)]),
        set(&[("prior.rego", prior)]),
    ];
    for plan in [
        "plans/bpg/vm_destroyed_and_updated.json",
        "plans/changes.json",
        "policy/gke_show.json",
    ] {
        let plan_json = crate::support::fixtures::text(plan);
        let findings = lint(&Plan::from_json(plan_json.as_bytes()).unwrap(), &[]);
        let whole = PlanDocument::read(&plan_json).unwrap();
        for s in &sets {
            let one = std::slice::from_ref(s);
            let reads = reads_of(one);
            let pruned = PlanDocument::read_for(&plan_json, &reads).unwrap();
            let a = evaluate_document(&whole, &findings, "core", one);
            let b = evaluate_document(&pruned, &findings, "core", one);
            assert_eq!(
                format!("{:?}", a.sets),
                format!("{:?}", b.sets),
                "{plan}, {:?}",
                s.files[0].path
            );
        }
    }
    // What was read, seen from the policies: only the named key; everything for `input` itself.
    let plan_json = crate::support::fixtures::text("plans/changes.json");
    let named = set(&[(
        "k.rego",
        "package main\nimport rego.v1\nwarn contains m if { m := concat(\",\", sort(object.keys(input))) with input as input }\nwarn contains m if { input.prior_state; m := \"p\" }",
    )]);
    assert_eq!(reads_of(std::slice::from_ref(&named)), InputReads::Whole);
    assert_eq!(
        reads_of(&sets[4..]),
        InputReads::Keys(["prior_state".to_string()].into())
    );
    let r = results(&plan_json, sets[4].clone());
    assert_eq!(msgs(&r.warnings), ["4 resources before"]);
    let r = results(&plan_json, sets[3].clone());
    assert_eq!(
        msgs(&r.warnings),
        ["applyable,complete,configuration,errored,format_version,planned_values,prior_state,resource_changes,terraform_version,timestamp"]
    );
}
