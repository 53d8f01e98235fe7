//! Proxmox lint rules over the plan model: one function per rule, collected in one table.
//!
//! Rules are pure: they read `change.after` (never `variables` or `configuration` values) and
//! stay silent when what they need is only known after apply. Every text a user reads comes
//! from `templates/lint.j2` (one `<ID>_message` and one `<ID>_fix` macro per rule).

mod download;
pub mod model;
mod refactor;
mod snippets;
mod vm;

use crate::core::plan::Plan;
use minijinja::Environment;
use serde::Serialize;
use std::collections::BTreeSet;
use std::sync::OnceLock;

/// How bad a finding is. Errors fail the commit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
    Info,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// One rule firing on one resource (or on the whole plan when `address` is empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub rule: &'static str,
    pub severity: Severity,
    pub address: String,
    pub message: String,
    /// What to do, ready to paste where possible.
    pub fix: String,
}

/// Facts about the Proxmox cluster that sharpen some rules when the API is reachable
/// (lint without them is still correct, only less precise).
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// Storage ids marked `shared` (a snippet there is visible from every node).
    pub shared_storages: BTreeSet<String>,
    /// Whether the apply will have SSH credentials for the bpg provider (snippet uploads go
    /// over SSH); `None` when unknown (a local run), which makes PVE015 stay silent.
    pub apply_ssh: Option<bool>,
}

/// What a rule sees: the plan, the optional cluster facts, the plan's lookups
/// ([`model::Index`], built once per lint call), and what the one pass over the plan's VMs and
/// destroys/creates gathered for the rules that relate resources to each other.
pub struct LintInput<'a> {
    pub plan: &'a Plan,
    pub facts: &'a Facts,
    pub index: model::Index<'a>,
    /// Which VMs use which file (for PVE009).
    pub file_uses: download::FileUses<'a>,
    /// The destroys and creates a `moved` block could join (for PVE010).
    pub moves: refactor::Candidates<'a>,
}

impl<'a> LintInput<'a> {
    pub fn new(plan: &'a Plan, facts: &'a Facts) -> LintInput<'a> {
        LintInput::scan(plan, facts, &[], Gather::ALL).0
    }

    /// Build the input in one pass over the plan: each VM and container, and each destroy or
    /// create PVE010 may pair, has its values parsed once, is shown to the `each` rules,
    /// gathered from, and dropped, so the plan's value trees are never all in memory at once.
    fn scan(
        plan: &'a Plan,
        facts: &'a Facts,
        each: &[fn(&LintInput, &model::Res) -> Vec<Finding>],
        gather: Gather,
    ) -> (LintInput<'a>, Vec<Finding>) {
        let mut input = LintInput {
            plan,
            facts,
            index: model::Index::new(plan),
            file_uses: download::FileUses::default(),
            moves: refactor::Candidates::default(),
        };
        let mut file_uses = download::FileUses::default();
        let mut moves = refactor::Candidates::default();
        let pairable = if gather.moves {
            refactor::pairable_groups(input.index.live())
        } else {
            Default::default()
        };
        let mut findings = Vec::new();
        for &rc in input.index.live() {
            let kind = model::Kind::of(rc);
            let machine = (!each.is_empty() || gather.file_uses)
                && kind.is_some_and(|k| k.is_vm() || k == model::Kind::Container);
            let pairs = refactor::is_candidate(rc, &pairable);
            if !machine && !pairs {
                continue;
            }
            let parsed;
            let res = match input.index.file(rc) {
                Some(file) => file,
                None => {
                    parsed = model::Res::parse(rc);
                    &parsed
                }
            };
            if machine {
                for check in each {
                    findings.extend(check(&input, res));
                }
                if gather.file_uses {
                    file_uses.add(&input.index, res);
                }
            }
            if pairs {
                moves.add(res);
            }
        }
        input.file_uses = file_uses;
        input.moves = moves;
        (input, findings)
    }
}

/// What the lint pass gathers for the rules that relate resources to each other (only what an
/// enabled rule reads).
#[derive(Clone, Copy)]
struct Gather {
    /// Which VMs use which file (PVE009).
    file_uses: bool,
    /// Destroys and creates a `moved` block could join (PVE010).
    moves: bool,
}

impl Gather {
    const ALL: Gather = Gather {
        file_uses: true,
        moves: true,
    };
}

/// How a rule runs.
pub enum Check {
    /// Once, over the whole plan (the file resources kept by the index, and what the pass over
    /// the plan gathered).
    Plan(fn(&LintInput) -> Vec<Finding>),
    /// On each VM and container, while its values are parsed.
    Each(fn(&LintInput, &model::Res) -> Vec<Finding>),
}

/// One lint rule: a stable id, its severity, and the check.
pub struct Rule {
    pub id: &'static str,
    pub severity: Severity,
    pub title: &'static str,
    pub check: Check,
}

/// Every plan rule, in catalogue order (`proxmox-rules.md`).
pub const RULES: &[Rule] = &[
    Rule {
        id: "PVE001",
        severity: Severity::Error,
        title: "import download with a name Proxmox refuses",
        check: Check::Plan(download::pve001),
    },
    Rule {
        id: "PVE002",
        severity: Severity::Error,
        title: "iso/vztmpl download with the wrong extension",
        check: Check::Plan(download::pve002),
    },
    Rule {
        id: "PVE003",
        severity: Severity::Error,
        title: "decompression is only supported for iso downloads",
        check: Check::Plan(download::pve003),
    },
    Rule {
        id: "PVE004",
        severity: Severity::Error,
        title: "checksum without checksum_algorithm (or the reverse)",
        check: Check::Plan(download::pve004),
    },
    Rule {
        id: "PVE005",
        severity: Severity::Error,
        title: "VM disk imported from an iso volume",
        check: Check::Each(vm::pve005),
    },
    Rule {
        id: "PVE006",
        severity: Severity::Warning,
        title: "floating download URL without checksum",
        check: Check::Plan(download::pve006),
    },
    Rule {
        id: "PVE007",
        severity: Severity::Warning,
        title: "floating download URL with overwrite",
        check: Check::Plan(download::pve007),
    },
    Rule {
        id: "PVE008",
        severity: Severity::Warning,
        title: "VM replaced or destroyed",
        check: Check::Each(vm::pve008),
    },
    Rule {
        id: "PVE009",
        severity: Severity::Warning,
        title: "downloaded image replaced",
        check: Check::Plan(download::pve009),
    },
    Rule {
        id: "PVE010",
        severity: Severity::Info,
        title: "destroy + create where a moved block would do",
        check: Check::Plan(refactor::pve010),
    },
    Rule {
        id: "PVE011",
        severity: Severity::Warning,
        title: "cloud-init file that is not a snippet on the VM's node",
        check: Check::Each(vm::pve011),
    },
    Rule {
        id: "PVE012",
        severity: Severity::Warning,
        title: "Ignition spec newer than 3.5.0 in a snippet",
        check: Check::Plan(snippets::pve012),
    },
    Rule {
        id: "PVE013",
        severity: Severity::Info,
        title: "needs Sys.Modify on / (privileged container, VM startup)",
        check: Check::Each(vm::pve013),
    },
    Rule {
        id: "PVE014",
        severity: Severity::Info,
        title: "imported disk without an explicit size",
        check: Check::Each(vm::pve014),
    },
    Rule {
        id: "PVE015",
        severity: Severity::Warning,
        title: "snippet upload without SSH credentials for the apply",
        check: Check::Plan(snippets::pve015),
    },
];

/// The rule with this id (plan rules only).
pub fn rule(id: &str) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.id == id)
}

/// Run every rule not in `disabled` over `plan`; findings sorted errors first.
pub fn lint(plan: &Plan, disabled: &[String]) -> Vec<Finding> {
    lint_with(plan, disabled, &Facts::default())
}

/// [`lint`] with facts from the Proxmox API.
pub fn lint_with(plan: &Plan, disabled: &[String], facts: &Facts) -> Vec<Finding> {
    let enabled: Vec<&Rule> = RULES
        .iter()
        .filter(|r| !disabled.iter().any(|d| d.trim().eq_ignore_ascii_case(r.id)))
        .collect();
    let each: Vec<_> = enabled
        .iter()
        .filter_map(|r| match r.check {
            Check::Each(f) => Some(f),
            Check::Plan(_) => None,
        })
        .collect();
    let runs = |id: &str| enabled.iter().any(|r| r.id == id);
    let gather = Gather {
        file_uses: runs("PVE009"),
        moves: runs("PVE010"),
    };
    let (input, mut out) = LintInput::scan(plan, facts, &each, gather);
    for r in &enabled {
        if let Check::Plan(f) = r.check {
            out.extend(f(&input));
        }
    }
    sort_findings(&mut out);
    out
}

/// Whether `id` is a rule a root may disable (a lint rule or a preflight check).
pub fn is_known_rule(id: &str) -> bool {
    let id = id.trim();
    RULES.iter().any(|r| r.id.eq_ignore_ascii_case(id))
        || crate::core::preflight::CHECKS
            .iter()
            .any(|(c, _, _)| c.eq_ignore_ascii_case(id))
}

/// The entries of a `[lint] disable = [...]` list that name no rule (for `check-config`:
/// a typo must not silently keep a rule on).
pub fn unknown_rule_ids(disabled: &[String]) -> Vec<String> {
    disabled
        .iter()
        .filter(|d| !is_known_rule(d))
        .cloned()
        .collect()
}

/// Drop the findings of disabled rules (for the preflight findings, which `lint` does not see).
pub fn without_disabled(findings: Vec<Finding>, disabled: &[String]) -> Vec<Finding> {
    findings
        .into_iter()
        .filter(|f| {
            !disabled
                .iter()
                .any(|d| d.trim().eq_ignore_ascii_case(f.rule))
        })
        .collect()
}

/// Errors first, then warnings, then info; by rule id and address within.
pub fn sort_findings(findings: &mut [Finding]) {
    findings
        .sort_by(|a, b| (a.severity, a.rule, &a.address).cmp(&(b.severity, b.rule, &b.address)));
}

/// Whether any finding is an error (the commit status is then `failed`).
pub fn has_errors(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.severity == Severity::Error)
}

/// The commit status description when there are error findings: one line naming the first
/// error (`PVE001 proxmox_download_file.talos: …`) and how many more there are.
pub fn status_description(findings: &[Finding]) -> Option<String> {
    let errors: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .collect();
    let first = errors.first()?;
    let text = render_macro(
        "status",
        &serde_json::json!({
            "rule": first.rule,
            "address": first.address,
            "message": first.message.lines().next().unwrap_or_default(),
            "more": errors.len() - 1,
        }),
    );
    Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn templates() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template("lint.j2", include_str!("../../../templates/lint.j2"))
            .expect("templates/lint.j2 parses");
        env
    })
}

/// `templates/lint.j2`, looked up once.
fn lint_template() -> &'static minijinja::Template<'static, 'static> {
    static TMPL: OnceLock<minijinja::Template<'static, 'static>> = OnceLock::new();
    TMPL.get_or_init(|| {
        templates()
            .get_template("lint.j2")
            .expect("lint.j2 is registered")
    })
}

thread_local! {
    /// `lint.j2` evaluated once per thread (it only defines macros): every finding calls its
    /// macros on this state instead of evaluating the template again.
    static LINT_STATE: minijinja::Captured<'static> = lint_template()
        .render_captured(())
        .expect("lint.j2 evaluates without a context");
}

/// Call one macro of `templates/lint.j2` with `details` as its argument.
pub(crate) fn render_macro(name: &str, details: &serde_json::Value) -> String {
    call_macro(name, &minijinja::Value::from_serialize(details))
}

fn call_macro(name: &str, arg: &minijinja::Value) -> String {
    LINT_STATE.with(|captured| {
        captured
            .state()
            .call_macro(name, std::slice::from_ref(arg))
            .unwrap_or_else(|e| panic!("lint.j2 macro {name}: {e}"))
            .trim()
            .to_string()
    })
}

/// Build a finding for `rule` on `rc`: message and fix rendered from the rule's macros with
/// `details` (which also gets `address`).
pub(crate) fn finding(rule_id: &'static str, address: &str, details: serde_json::Value) -> Finding {
    let severity = rule(rule_id).map_or(Severity::Info, |r| r.severity);
    finding_with(rule_id, severity, address, details)
}

/// [`finding`] with an explicit severity (the preflight checks have their own table).
pub(crate) fn finding_with(
    rule_id: &'static str,
    severity: Severity,
    address: &str,
    details: serde_json::Value,
) -> Finding {
    let mut d = details;
    if let Some(obj) = d.as_object_mut() {
        obj.insert("address".into(), address.into());
    }
    let arg = minijinja::Value::from_serialize(&d);
    Finding {
        rule: rule_id,
        severity,
        address: address.to_string(),
        message: call_macro(&format!("{rule_id}_message"), &arg),
        fix: call_macro(&format!("{rule_id}_fix"), &arg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_ids_are_unique_and_in_catalogue_order() {
        let ids: Vec<&str> = RULES.iter().map(|r| r.id).collect();
        let expected: Vec<String> = (1..=15).map(|i| format!("PVE{i:03}")).collect();
        assert_eq!(ids, expected);
    }

    #[test]
    fn disable_lists_are_checked_and_applied() {
        let list = vec![
            "PVE012".to_string(),
            "pve104".to_string(),
            "PVE999".to_string(),
        ];
        assert_eq!(unknown_rule_ids(&list), vec!["PVE999".to_string()]);
        let f = |rule| Finding {
            rule,
            severity: Severity::Error,
            address: String::new(),
            message: String::new(),
            fix: String::new(),
        };
        let kept = without_disabled(vec![f("PVE104"), f("PVE103")], &list);
        assert_eq!(kept, vec![f("PVE103")]);
    }

    #[test]
    fn errors_decide_the_status() {
        let f = |rule, severity| Finding {
            rule,
            severity,
            address: "proxmox_download_file.talos".into(),
            message: "bad name\nsecond line".into(),
            fix: String::new(),
        };
        assert!(!has_errors(&[f("PVE006", Severity::Warning)]));
        assert_eq!(status_description(&[f("PVE006", Severity::Warning)]), None);
        let all = [
            f("PVE001", Severity::Error),
            f("PVE003", Severity::Error),
            f("PVE006", Severity::Warning),
        ];
        assert!(has_errors(&all));
        insta::assert_snapshot!(status_description(&all).unwrap());
    }
}
