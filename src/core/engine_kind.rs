//! OpenTofu or Terraform: the two engines, and which one wrote a `show -json` plan, told
//! conservatively from the document alone (for `planbot render`, which never ran the engine).

use crate::core::plan::Plan;
use std::fmt;

/// Which engine a binary is, or wrote a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    OpenTofu,
    Terraform,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::OpenTofu => "OpenTofu",
            EngineKind::Terraform => "Terraform",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// OpenTofu's provider registry: `tofu` resolves `bpg/proxmox` to `registry.opentofu.org/bpg/proxmox`
/// (Terraform to `registry.terraform.io/…`, which OpenTofu also keeps when a source says so,
/// so only this host is evidence).
const OPENTOFU_REGISTRY: &str = "registry.opentofu.org/";

/// Which engine wrote `plan_json`, when the document says so clearly; `None` when unsure.
///
/// - Terraform writes `applyable` and `complete` (always, since 1.8); OpenTofu has neither.
/// - A provider from `registry.opentofu.org` was resolved by OpenTofu.
/// - A document with a `timestamp` (both engines write one) from version 1.8 or later but
///   without `applyable`/`complete` cannot be Terraform's: OpenTofu.
/// - Evidence for both (a hand-edited document, or a Terraform config sourcing providers from
///   OpenTofu's registry) is no evidence: `None`. So is a document without any of it.
pub fn detect(plan_json: &[u8]) -> Option<EngineKind> {
    detect_plan(&Plan::from_json(plan_json).ok()?)
}

/// [`detect`] on a parsed plan (which keeps what tells the engines apart).
pub fn detect_plan(plan: &Plan) -> Option<EngineKind> {
    let terraform_fields = plan.applyable.is_some() || plan.complete.is_some();
    let opentofu_registry = plan
        .resource_changes
        .iter()
        .chain(&plan.resource_drift)
        .filter_map(|c| c.provider_name.as_deref())
        .chain(
            plan.configuration
                .iter()
                .flat_map(|c| c.provider_config.values())
                .filter_map(|p| p.full_name.as_deref()),
        )
        .any(|addr| {
            addr.len() >= OPENTOFU_REGISTRY.len()
                && addr[..OPENTOFU_REGISTRY.len()].eq_ignore_ascii_case(OPENTOFU_REGISTRY)
        });
    match (terraform_fields, opentofu_registry) {
        (true, true) => None,
        (true, false) => Some(EngineKind::Terraform),
        (false, true) => Some(EngineKind::OpenTofu),
        (false, false) => {
            let modern = plan
                .terraform_version
                .as_deref()
                .is_some_and(writes_applyable_if_terraform);
            (plan.timestamp.is_some() && modern).then_some(EngineKind::OpenTofu)
        }
    }
}

/// Whether a Terraform of `version` always writes `applyable`/`complete`: 1.8.0 and later
/// (a 1.8.0 pre-release may predate them).
fn writes_applyable_if_terraform(version: &str) -> bool {
    let (release, pre) = match version.split_once('-') {
        Some((r, _)) => (r, true),
        None => (version, false),
    };
    let mut parts = release.split('.').map(|p| p.parse::<u64>().ok());
    let (Some(Some(major)), Some(Some(minor)), patch) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let patch = patch.flatten().unwrap_or(0);
    (major, minor, patch) > (1, 8, 0) || ((major, minor, patch) == (1, 8, 0) && !pre)
}

/// The footer's engine text: "OpenTofu 1.10.6", "Terraform", or the neutral "engine 1.11.4"
/// when only the version is known.
pub fn footer_text(kind: Option<EngineKind>, version: Option<&str>) -> Option<String> {
    match (kind, version) {
        (Some(k), Some(v)) => Some(format!("{k} {v}")),
        (Some(k), None) => Some(k.to_string()),
        (None, Some(v)) => Some(format!("engine {v}")),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(extra: &str) -> Vec<u8> {
        format!(r#"{{"format_version":"1.2","terraform_version":"1.10.6","errored":false{extra}}}"#)
            .into_bytes()
    }

    const TOFU_PROVIDER: &str = r#","resource_changes":[{"address":"proxmox_virtual_environment_vm.a","provider_name":"registry.opentofu.org/bpg/proxmox","change":{"actions":["create"]}}]"#;
    const TERRAFORM_FIELDS: &str = r#","applyable":true,"complete":true"#;

    #[test]
    fn terraform_fields_say_terraform() {
        assert_eq!(detect(&doc(TERRAFORM_FIELDS)), Some(EngineKind::Terraform));
        assert_eq!(
            detect(&doc(r#","complete":false"#)),
            Some(EngineKind::Terraform)
        );
    }

    #[test]
    fn a_provider_from_the_opentofu_registry_says_opentofu() {
        assert_eq!(detect(&doc(TOFU_PROVIDER)), Some(EngineKind::OpenTofu));
        let in_config = r#","configuration":{"provider_config":{"proxmox":{"name":"proxmox","full_name":"registry.opentofu.org/bpg/proxmox"}}}"#;
        assert_eq!(detect(&doc(in_config)), Some(EngineKind::OpenTofu));
        let drift = TOFU_PROVIDER.replace("resource_changes", "resource_drift");
        assert_eq!(detect(&doc(&drift)), Some(EngineKind::OpenTofu));
    }

    #[test]
    fn a_modern_timestamped_plan_without_terraform_fields_is_opentofu() {
        let ts = r#","timestamp":"2025-06-01T10:00:00Z""#;
        assert_eq!(detect(&doc(ts)), Some(EngineKind::OpenTofu));
        let old = format!(
            r#"{{"format_version":"1.2","errored":false,"terraform_version":"1.7.5"{ts}}}"#
        );
        assert_eq!(
            detect(old.as_bytes()),
            None,
            "Terraform 1.7 had no applyable"
        );
        let pre = format!(
            r#"{{"format_version":"1.2","errored":false,"terraform_version":"1.8.0-alpha20240131"{ts}}}"#
        );
        assert_eq!(detect(pre.as_bytes()), None);
        let later = format!(
            r#"{{"format_version":"1.2","errored":false,"terraform_version":"1.8.1"{ts}}}"#
        );
        assert_eq!(detect(later.as_bytes()), Some(EngineKind::OpenTofu));
    }

    #[test]
    fn unsure_stays_unsure() {
        // Nothing either way (a minimal or hand-made document).
        assert_eq!(detect(&doc("")), None);
        // Evidence for both.
        assert_eq!(
            detect(&doc(&format!("{TERRAFORM_FIELDS}{TOFU_PROVIDER}"))),
            None
        );
        // Terraform's registry is no evidence: OpenTofu keeps it where a source names it.
        let tf_registry = TOFU_PROVIDER.replace("registry.opentofu.org", "registry.terraform.io");
        assert_eq!(detect(&doc(&tf_registry)), None);
        assert_eq!(detect(b"not json"), None);
    }

    #[test]
    fn the_footer_names_what_is_known() {
        assert_eq!(
            footer_text(Some(EngineKind::OpenTofu), Some("1.10.6")).as_deref(),
            Some("OpenTofu 1.10.6")
        );
        assert_eq!(
            footer_text(Some(EngineKind::Terraform), None).as_deref(),
            Some("Terraform")
        );
        assert_eq!(
            footer_text(None, Some("1.11.4")).as_deref(),
            Some("engine 1.11.4")
        );
        assert_eq!(footer_text(None, None), None);
    }
}
