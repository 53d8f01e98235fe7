//! What the lint rules and the preflight checks report: [`Finding`], [`Severity`], the registry
//! of every rule id (lint PVE001–PVE023, preflight PVE101–PVE114, the state rule STATE001), the
//! `[lint] disable` lists, and the texts of `templates/lint.j2`. Lint and preflight both build on this module and not
//! on each other.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// How bad a finding is. Errors fail the commit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
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

/// A finding as read back (a kept plan's): its rule must be one of [`RULES`].
#[derive(Deserialize)]
struct FindingRead {
    rule: String,
    severity: Severity,
    address: String,
    message: String,
    fix: String,
}

impl<'de> Deserialize<'de> for Finding {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Finding, D::Error> {
        let f = FindingRead::deserialize(d)?;
        let rule = RULES
            .iter()
            .find(|r| r.id == f.rule)
            .map(|r| r.id)
            .ok_or_else(|| {
                serde::de::Error::custom(format!("no rule `{}` in the catalogue", f.rule))
            })?;
        Ok(Finding {
            rule,
            severity: f.severity,
            address: f.address,
            message: f.message,
            fix: f.fix,
        })
    }
}

/// Facts about the Proxmox cluster that sharpen some lint rules when the API is reachable
/// (lint without them is still correct, only less precise); the preflight reads them.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// Storage ids marked `shared` (a snippet there is visible from every node).
    pub shared_storages: BTreeSet<String>,
    /// Storage id → its type (`lvmthin`, `zfspool`, `lvm`, `dir`, …), for rules that name it.
    pub storage_types: std::collections::BTreeMap<String, String>,
    /// Whether the apply will have SSH credentials for the bpg provider (snippet uploads go
    /// over SSH); `None` when unknown (a local run), which makes PVE015 stay silent.
    pub apply_ssh: Option<bool>,
    /// The root's `parallelism` (`.planbot.toml`): how many changes the engine makes at once.
    /// `Some(1)` makes PVE016 (several full clones at once) stay silent; `None` is the engine's
    /// default (10).
    pub parallelism: Option<u16>,
}

/// Which pass reports a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A lint rule over the plan alone (`core::proxmox::lint`).
    Lint,
    /// A preflight check against the Proxmox API (`core::proxmox::preflight`).
    Preflight,
    /// Where the root's state lives, learnt after `init` (`core::state`); never switched off.
    State,
}

/// One rule a finding can name: its stable id, severity and title.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub id: &'static str,
    pub severity: Severity,
    pub title: &'static str,
    pub source: Source,
}

const fn lint(id: &'static str, severity: Severity, title: &'static str) -> Rule {
    Rule {
        id,
        severity,
        title,
        source: Source::Lint,
    }
}

const fn preflight(id: &'static str, title: &'static str) -> Rule {
    Rule {
        id,
        severity: Severity::Error,
        title,
        source: Source::Preflight,
    }
}

const fn preflight_warning(id: &'static str, title: &'static str) -> Rule {
    Rule {
        severity: Severity::Warning,
        ..preflight(id, title)
    }
}

/// Every rule, in the order docs/proxmox.md lists them: the lint rules, then the preflight
/// checks.
pub const RULES: &[Rule] = &[
    lint(
        "PVE001",
        Severity::Error,
        "import download with a name Proxmox refuses",
    ),
    lint(
        "PVE002",
        Severity::Error,
        "iso/vztmpl download with the wrong extension",
    ),
    lint(
        "PVE003",
        Severity::Error,
        "decompression is only supported for iso downloads",
    ),
    lint(
        "PVE004",
        Severity::Error,
        "checksum without checksum_algorithm (or the reverse)",
    ),
    lint(
        "PVE005",
        Severity::Error,
        "VM disk imported from an iso volume",
    ),
    lint(
        "PVE006",
        Severity::Warning,
        "floating download URL without checksum",
    ),
    lint(
        "PVE007",
        Severity::Warning,
        "floating download URL with overwrite",
    ),
    lint("PVE008", Severity::Warning, "VM replaced or destroyed"),
    lint("PVE009", Severity::Warning, "downloaded image replaced"),
    lint(
        "PVE010",
        Severity::Info,
        "destroy + create where a moved block would do",
    ),
    lint(
        "PVE011",
        Severity::Warning,
        "cloud-init file that is not a snippet on the VM's node",
    ),
    lint(
        "PVE012",
        Severity::Warning,
        "Ignition spec newer than 3.5.0 in a snippet",
    ),
    lint(
        "PVE013",
        Severity::Info,
        "needs Sys.Modify on / (privileged container, VM startup)",
    ),
    lint(
        "PVE014",
        Severity::Info,
        "imported disk without an explicit size",
    ),
    lint(
        "PVE015",
        Severity::Warning,
        "snippet upload without SSH credentials for the apply",
    ),
    lint(
        "PVE016",
        Severity::Warning,
        "several full clones onto one storage in one apply",
    ),
    lint(
        "PVE017",
        Severity::Warning,
        "disk shrunk (an error) or moved to another storage",
    ),
    lint(
        "PVE018",
        Severity::Warning,
        "SDN change that nothing in the plan applies",
    ),
    lint(
        "PVE019",
        Severity::Warning,
        "CPU or memory change that waits for a reboot",
    ),
    lint("PVE020", Severity::Warning, "UEFI without an EFI disk"),
    lint(
        "PVE022",
        Severity::Error,
        "VM name or container hostname that is not a DNS name",
    ),
    lint(
        "PVE023",
        Severity::Error,
        "one vm_id asked for twice (in the plan or across the MR's roots)",
    ),
    preflight("PVE101", "API reachable, release supports import"),
    preflight("PVE102", "node exists and is online"),
    preflight(
        "PVE103",
        "storage exists, is enabled on the node and allows the content",
    ),
    preflight("PVE104", "token may download files"),
    preflight("PVE105", "token may upload snippets"),
    preflight("PVE106", "fixed VM id is free"),
    preflight("PVE107", "token has Sys.Modify on / where needed"),
    preflight_warning("PVE108", "the plan takes more than the cluster has free"),
    preflight("PVE109", "bridge exists on the guest's node"),
    preflight(
        "PVE110",
        "container feature flags other than nesting need root@pam",
    ),
    preflight("PVE111", "clone from a template on another node"),
    preflight(
        "PVE112",
        "an HA-managed guest moved to another node (through HA)",
    ),
    preflight_warning("PVE113", "an HA group created on Proxmox VE 9 (rules)"),
    preflight(
        "PVE114",
        "SDN VNet applied and usable by the apply (SDN.Use)",
    ),
    Rule {
        id: STATE_IN_CHECKOUT,
        severity: Severity::Error,
        title: "state kept in the checkout, lost after an apply",
        source: Source::State,
    },
];

/// The rule of a root whose state is a file in the checkout (a `local` backend, or none): in
/// a service run the checkout is thrown away, and the state with it. An error there (the plan
/// status fails, the apply is refused), a warning for `planbot plan`. No disable list turns it
/// off.
pub const STATE_IN_CHECKOUT: &str = "STATE001";

/// The rule with this id (exact spelling).
pub fn rule(id: &str) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.id == id)
}

/// The rules one pass reports, in catalogue order.
pub fn rules_of(source: Source) -> impl Iterator<Item = &'static Rule> {
    RULES.iter().filter(move |r| r.source == source)
}

// ----- disable lists ---------------------------------------------------------------------------

/// Whether `disabled` (a root's `[lint] disable` list) names rule `id` (case and surrounding
/// blanks ignored).
pub fn is_disabled(id: &str, disabled: &[String]) -> bool {
    disabled.iter().any(|d| d.trim().eq_ignore_ascii_case(id))
}

/// Whether `id` is a rule a root may disable (a lint rule or a preflight check).
pub fn is_known_rule(id: &str) -> bool {
    let id = id.trim();
    RULES.iter().any(|r| r.id.eq_ignore_ascii_case(id))
}

/// The entries of a `[lint] disable = [...]` list that name no rule (for `check-repo-config`:
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
        .filter(|f| !is_disabled(f.rule, disabled))
        .collect()
}

// ----- order -----------------------------------------------------------------------------------

/// Errors first, then warnings, then info; by rule id and address within.
pub fn sort_findings(findings: &mut [Finding]) {
    findings
        .sort_by(|a, b| (a.severity, a.rule, &a.address).cmp(&(b.severity, b.rule, &b.address)));
}

/// Whether any finding is an error (the commit status is then `failed`).
pub fn has_errors(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.severity == Severity::Error)
}

// ----- texts -----------------------------------------------------------------------------------

/// Call one macro of `templates/lint.j2` with `details` as its argument.
pub fn render_macro(name: &str, details: &serde_json::Value) -> String {
    call_macro(name, &minijinja::Value::from_serialize(details))
}

fn call_macro(name: &str, arg: &minijinja::Value) -> String {
    crate::core::templates::call_macro("lint.j2", name, arg)
        .unwrap_or_else(|e| panic!("lint.j2 macro {name}: {e}"))
        .trim()
        .to_string()
}

/// Build a finding for `rule_id` on `address`: message and fix rendered from the rule's macros
/// (`<ID>_message`, `<ID>_fix`) with `details` (which also gets `address`), severity from
/// [`RULES`].
pub fn finding(rule_id: &'static str, address: &str, details: serde_json::Value) -> Finding {
    let severity = rule(rule_id).map_or(Severity::Info, |r| r.severity);
    finding_with(rule_id, severity, address, details)
}

/// [`finding`] with an explicit severity.
pub fn finding_with(
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
    fn ids_are_unique_and_in_catalogue_order() {
        let ids: Vec<&str> = RULES.iter().map(|r| r.id).collect();
        let mut expected: Vec<String> = (1..=20)
            .chain([22, 23])
            .chain(101..=114)
            .map(|i| format!("PVE{i:03}"))
            .collect();
        expected.push(STATE_IN_CHECKOUT.to_string());
        assert_eq!(ids, expected);
        assert!(rules_of(Source::Preflight).all(|r| r.id >= "PVE101"));
    }

    #[test]
    fn every_rule_has_its_texts() {
        for r in RULES {
            let f = finding(r.id, "x.y", serde_json::json!({}));
            assert_eq!(f.severity, r.severity);
        }
    }

    #[test]
    fn disable_lists_are_checked_and_applied() {
        let list = vec![
            "PVE012".to_string(),
            " pve104".to_string(),
            "PVE999".to_string(),
        ];
        assert_eq!(unknown_rule_ids(&list), vec!["PVE999".to_string()]);
        assert!(is_disabled("PVE104", &list));
        assert!(!is_disabled("PVE103", &list));
    }
}
