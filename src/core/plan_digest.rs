//! A secret-free digest of what a plan does, kept with the fingerprint so that a refused apply
//! can show, attribute by attribute, how the fresh plan differs from the reviewed one.
//!
//! The binary plan is never kept; this digest is: per changed resource its actions and every
//! planned attribute flattened by path (`disk[0].size`), with unknown values as
//! `(known after apply)` and sensitive values replaced by a keyed hash (so a change of a
//! secret shows as "sensitive value changed" without revealing it).

use crate::core::plan::{ActionKind, Plan};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Sha256;
use std::collections::BTreeMap;

/// Shown for a value the engine knows only after apply.
pub const UNKNOWN: &str = "(known after apply)";
const SENSITIVE_PREFIX: &str = "(sensitive value ";

/// What one resource change does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceDigest {
    pub actions: Vec<String>,
    #[serde(default)]
    pub previous_address: Option<String>,
    #[serde(default)]
    pub importing: bool,
    /// Planned attribute values by path, as display text.
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
}

/// The digest of a whole plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanDigest {
    /// Keyed by address (plus ` (deposed KEY)`).
    pub resources: BTreeMap<String, ResourceDigest>,
    /// Output name → planned value text.
    pub outputs: BTreeMap<String, String>,
}

impl PlanDigest {
    /// Digest the managed changes and output changes of `plan`; `key` hashes sensitive values.
    pub fn of(plan: &Plan, key: &[u8]) -> PlanDigest {
        let hasher = SensitiveHasher { key };
        let mut resources = BTreeMap::new();
        for rc in plan.managed_changes().filter(|rc| rc.has_change()) {
            let mut attributes = BTreeMap::new();
            let v = rc.change.after_values();
            flatten(
                "",
                &v.after,
                &v.after_unknown,
                &v.after_sensitive,
                &hasher,
                &mut attributes,
            );
            resources.insert(
                rc.display_address(),
                ResourceDigest {
                    actions: rc.change.actions.clone(),
                    previous_address: rc.previous_address.clone().filter(|p| *p != rc.address),
                    importing: rc.is_import(),
                    attributes,
                },
            );
        }
        let outputs = plan
            .output_changes
            .iter()
            .filter(|(_, oc)| oc.kind() != ActionKind::NoOp)
            .map(|(name, oc)| {
                let text = if oc.is_sensitive() {
                    hasher.hide(&oc.after)
                } else if oc.after_unknown == Value::Bool(true) {
                    UNKNOWN.to_string()
                } else {
                    compact(&oc.after)
                };
                (name.clone(), text)
            })
            .collect();
        PlanDigest { resources, outputs }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_json(text: &str) -> Option<PlanDigest> {
        serde_json::from_str(text).ok()
    }

    /// Every text of it (addresses, paths, values) scrubbed of every secret `scrubber` knows:
    /// a plain attribute may copy a secret the masks do not mark (a value passed through
    /// `nonsensitive()`, another root's secret), and the digest is written to the store.
    pub fn scrubbed(&self, scrubber: &dyn crate::core::templates::Scrub) -> PlanDigest {
        if scrubber.is_empty() {
            return self.clone();
        }
        let text = |t: &str| scrubber.scrub(t).into_owned();
        let texts = |m: &BTreeMap<String, String>| -> BTreeMap<String, String> {
            m.iter().map(|(k, v)| (text(k), text(v))).collect()
        };
        PlanDigest {
            resources: self
                .resources
                .iter()
                .map(|(address, r)| {
                    let r = ResourceDigest {
                        actions: r.actions.clone(),
                        previous_address: r.previous_address.as_deref().map(text),
                        importing: r.importing,
                        attributes: texts(&r.attributes),
                    };
                    (text(address), r)
                })
                .collect(),
            outputs: texts(&self.outputs),
        }
    }
}

struct SensitiveHasher<'a> {
    key: &'a [u8],
}

impl SensitiveHasher<'_> {
    fn hide(&self, value: &Value) -> String {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(self.key).expect("HMAC takes a key of any length");
        mac.update(b"planbot-digest-sensitive\0");
        mac.update(value.to_string().as_bytes());
        let tag = hex::encode(mac.finalize().into_bytes());
        format!("{SENSITIVE_PREFIX}#{})", &tag[..12])
    }
}

fn compact(value: &Value) -> String {
    match value {
        Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
        other => other.to_string(),
    }
}

fn child_path(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Flatten `value` into `path → text`, honouring the unknown and sensitive masks at every depth.
fn flatten(
    path: &str,
    value: &Value,
    unknown: &Value,
    sensitive: &Value,
    hasher: &SensitiveHasher<'_>,
    out: &mut BTreeMap<String, String>,
) {
    let name = if path.is_empty() { "(value)" } else { path };
    if sensitive == &Value::Bool(true) {
        out.insert(name.to_string(), hasher.hide(value));
        return;
    }
    if unknown == &Value::Bool(true) {
        out.insert(name.to_string(), UNKNOWN.to_string());
        return;
    }
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            // Unknown children may be absent from `after`.
            if let Value::Object(u) = unknown {
                keys.extend(u.keys().filter(|k| !map.contains_key(*k)));
            }
            keys.sort();
            keys.dedup();
            for k in keys {
                let v = map.get(k).unwrap_or(&Value::Null);
                flatten(
                    &child_path(path, k),
                    v,
                    unknown.get(k).unwrap_or(&Value::Null),
                    sensitive.get(k).unwrap_or(&Value::Null),
                    hasher,
                    out,
                );
            }
        }
        Value::Array(items) => {
            if items.is_empty() {
                out.insert(name.to_string(), "[]".to_string());
            }
            for (i, v) in items.iter().enumerate() {
                flatten(
                    &format!("{path}[{i}]"),
                    v,
                    unknown.get(i).unwrap_or(&Value::Null),
                    sensitive.get(i).unwrap_or(&Value::Null),
                    hasher,
                    out,
                );
            }
        }
        Value::Null => {}
        scalar => {
            out.insert(name.to_string(), compact(scalar));
        }
    }
}

/// How one attribute differs between the reviewed and the fresh plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttributeDelta {
    pub path: String,
    pub reviewed: Option<String>,
    pub fresh: Option<String>,
}

/// How one resource differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResourceDelta {
    pub address: String,
    /// `new` (only in the fresh plan), `gone` (only in the reviewed one) or `changed`.
    pub kind: &'static str,
    pub reviewed_actions: Vec<String>,
    pub fresh_actions: Vec<String>,
    pub attributes: Vec<AttributeDelta>,
}

/// Everything that differs between two digests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PlanDelta {
    pub resources: Vec<ResourceDelta>,
    pub outputs: Vec<AttributeDelta>,
}

impl PlanDelta {
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.outputs.is_empty()
    }
}

/// Compare the reviewed digest with the fresh one.
pub fn delta(reviewed: &PlanDigest, fresh: &PlanDigest) -> PlanDelta {
    let mut resources = Vec::new();
    let addresses: std::collections::BTreeSet<&String> = reviewed
        .resources
        .keys()
        .chain(fresh.resources.keys())
        .collect();
    for address in addresses {
        let (r, f) = (
            reviewed.resources.get(address),
            fresh.resources.get(address),
        );
        if r == f {
            continue;
        }
        let empty = BTreeMap::new();
        let r_attrs = r.map_or(&empty, |d| &d.attributes);
        let f_attrs = f.map_or(&empty, |d| &d.attributes);
        resources.push(ResourceDelta {
            address: address.clone(),
            kind: match (r, f) {
                (None, Some(_)) => "new",
                (Some(_), None) => "gone",
                _ => "changed",
            },
            reviewed_actions: r.map(|d| d.actions.clone()).unwrap_or_default(),
            fresh_actions: f.map(|d| d.actions.clone()).unwrap_or_default(),
            attributes: map_delta(r_attrs, f_attrs),
        });
    }
    PlanDelta {
        resources,
        outputs: map_delta(&reviewed.outputs, &fresh.outputs),
    }
}

fn map_delta(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<AttributeDelta> {
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| AttributeDelta {
            path: k.clone(),
            reviewed: a.get(k).map(|v| display(v)),
            fresh: b.get(k).map(|v| display(v)),
        })
        .collect()
}

/// Hashed sensitive values are shown as plain `(sensitive value)`: the hash only tells change.
fn display(text: &str) -> String {
    if text.starts_with(SENSITIVE_PREFIX) {
        "(sensitive value)".to_string()
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(after: &str, sensitive: &str) -> Plan {
        Plan::from_json(
            format!(
                r#"{{"format_version":"1.2","resource_changes":[
                {{"address":"terraform_data.vm","mode":"managed","change":{{"actions":["create"],
                  "after":{after},"after_unknown":{{"id":true,"output":true}},"after_sensitive":{sensitive}}}}},
                {{"address":"terraform_data.same","mode":"managed","change":{{"actions":["no-op"],"after":{{}}}}}}],
                "output_changes":{{"pw":{{"actions":["create"],"after":"s3cret-output","after_sensitive":true}}}}}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn digests_flatten_paths_and_hide_secrets() {
        let p = plan(
            r#"{"input":{"cores":2,"disk":[{"size":8}],"pw":"hunter2-secret"}}"#,
            r#"{"input":{"pw":true}}"#,
        );
        let d = PlanDigest::of(&p, b"k");
        let json = d.to_json();
        assert!(!json.contains("hunter2-secret"), "{json}");
        assert!(!json.contains("s3cret-output"), "{json}");
        let vm = &d.resources["terraform_data.vm"];
        assert_eq!(vm.attributes["input.cores"], "2");
        assert_eq!(vm.attributes["input.disk[0].size"], "8");
        assert_eq!(vm.attributes["id"], UNKNOWN);
        assert!(vm.attributes["input.pw"].starts_with(SENSITIVE_PREFIX));
        assert!(!d.resources.contains_key("terraform_data.same"));
        assert_eq!(PlanDigest::from_json(&json), Some(d));
    }

    #[test]
    fn delta_names_each_changed_attribute_and_never_a_secret() {
        let reviewed = PlanDigest::of(
            &plan(
                r#"{"input":{"cores":2,"pw":"old-secret-1"}}"#,
                r#"{"input":{"pw":true}}"#,
            ),
            b"k",
        );
        let fresh = PlanDigest::of(
            &plan(
                r#"{"input":{"cores":4,"pw":"new-secret-2"}}"#,
                r#"{"input":{"pw":true}}"#,
            ),
            b"k",
        );
        let d = delta(&reviewed, &fresh);
        assert_eq!(d.resources.len(), 1);
        let attrs = &d.resources[0].attributes;
        assert_eq!(
            attrs[0],
            AttributeDelta {
                path: "input.cores".into(),
                reviewed: Some("2".into()),
                fresh: Some("4".into())
            }
        );
        assert_eq!(attrs[1].path, "input.pw");
        assert_eq!(attrs[1].fresh.as_deref(), Some("(sensitive value)"));
        let text = serde_json::to_string(&d).unwrap();
        assert!(!text.contains("secret-"), "{text}");
        assert!(delta(&fresh, &fresh).is_empty());
    }
}
