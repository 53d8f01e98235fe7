//! Proxmox lint rules over the plan model: one function per rule, collected in one table.
//!
//! Rules are pure: they read `change.after` (never `variables` or `configuration` values) and
//! stay silent when what they need is only known after apply. Every text a user reads comes
//! from `templates/lint.j2` (one `<ID>_message` and one `<ID>_fix` macro per rule).

mod download;
mod guests;
mod refactor;
mod sdn;
mod snippets;
mod together;
mod vm;

pub use together::{cross_root, RootPlan};

use crate::core::plan::Plan;
use crate::core::proxmox::findings::{
    self, finding, is_disabled, render_macro, sort_findings, Facts, Finding, Severity,
};
use crate::core::proxmox::model;

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
    /// The full clones the plan creates (for PVE016).
    pub clones: together::Clones,
    /// The VM ids the plan's guests ask for (for PVE023).
    pub vm_ids: together::VmIds,
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
            clones: together::Clones::default(),
            vm_ids: together::VmIds::default(),
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
            let machine = (!each.is_empty() || gather.file_uses || gather.clones || gather.vm_ids)
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
                if gather.clones {
                    input.clones.add(res);
                }
                if gather.vm_ids {
                    input.vm_ids.add(res);
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
    /// Full clones (PVE016).
    clones: bool,
    /// The guests' VM ids (PVE023).
    vm_ids: bool,
}

impl Gather {
    const ALL: Gather = Gather {
        file_uses: true,
        moves: true,
        clones: true,
        vm_ids: true,
    };
    /// Only the VM ids (the check across an MR's roots).
    const VM_IDS: Gather = Gather {
        file_uses: false,
        moves: false,
        clones: false,
        vm_ids: true,
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

/// One lint rule: its id in [`findings::RULES`] (which holds its severity and title) and the
/// check.
pub struct Rule {
    pub id: &'static str,
    pub check: Check,
}

impl Rule {
    /// The rule's severity and title.
    pub fn info(&self) -> &'static findings::Rule {
        findings::rule(self.id).expect("every lint rule is in findings::RULES")
    }
}

/// Every plan rule, in the order docs/proxmox.md lists them.
pub const RULES: &[Rule] = &[
    Rule {
        id: "PVE001",
        check: Check::Plan(download::pve001),
    },
    Rule {
        id: "PVE002",
        check: Check::Plan(download::pve002),
    },
    Rule {
        id: "PVE003",
        check: Check::Plan(download::pve003),
    },
    Rule {
        id: "PVE004",
        check: Check::Plan(download::pve004),
    },
    Rule {
        id: "PVE005",
        check: Check::Each(vm::pve005),
    },
    Rule {
        id: "PVE006",
        check: Check::Plan(download::pve006),
    },
    Rule {
        id: "PVE007",
        check: Check::Plan(download::pve007),
    },
    Rule {
        id: "PVE008",
        check: Check::Each(vm::pve008),
    },
    Rule {
        id: "PVE009",
        check: Check::Plan(download::pve009),
    },
    Rule {
        id: "PVE010",
        check: Check::Plan(refactor::pve010),
    },
    Rule {
        id: "PVE011",
        check: Check::Each(vm::pve011),
    },
    Rule {
        id: "PVE012",
        check: Check::Plan(snippets::pve012),
    },
    Rule {
        id: "PVE013",
        check: Check::Each(vm::pve013),
    },
    Rule {
        id: "PVE014",
        check: Check::Each(vm::pve014),
    },
    Rule {
        id: "PVE015",
        check: Check::Plan(snippets::pve015),
    },
    Rule {
        id: "PVE016",
        check: Check::Plan(together::pve016),
    },
    Rule {
        id: "PVE017",
        check: Check::Each(guests::pve017),
    },
    Rule {
        id: "PVE018",
        check: Check::Plan(sdn::pve018),
    },
    Rule {
        id: "PVE019",
        check: Check::Each(guests::pve019),
    },
    Rule {
        id: "PVE020",
        check: Check::Each(guests::pve020),
    },
    Rule {
        id: "PVE022",
        check: Check::Each(guests::pve022),
    },
    Rule {
        id: "PVE023",
        check: Check::Plan(together::pve023),
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
        .filter(|r| !is_disabled(r.id, disabled))
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
        clones: runs("PVE016"),
        vm_ids: runs("PVE023"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::proxmox::findings::{has_errors, unknown_rule_ids};

    #[test]
    fn rule_ids_are_unique_and_in_catalogue_order() {
        let ids: Vec<&str> = RULES.iter().map(|r| r.id).collect();
        let expected: Vec<String> = (1..=20)
            .chain([22, 23])
            .map(|i| format!("PVE{i:03}"))
            .collect();
        assert_eq!(ids, expected);
    }

    #[test]
    fn every_lint_rule_is_registered_as_one() {
        let ids: Vec<&str> = RULES.iter().map(|r| r.info().id).collect();
        let registered: Vec<&str> = findings::rules_of(findings::Source::Lint)
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, registered);
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
        let kept = findings::without_disabled(vec![f("PVE104"), f("PVE103")], &list);
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
