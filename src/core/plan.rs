//! The plan model: a `show -json` document parsed into typed, tolerant Rust values.
//!
//! Every `format_version` from 0.1 to 1.2 parses; unknown fields are ignored, unknown actions
//! and reasons are kept as text. Only the parts planbot renders or fingerprints are typed;
//! `variables` and `configuration` are kept just enough to find sensitive variable values
//! (they are never rendered).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Why a document could not be read as a plan. Callers show this as one line (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum PlanParseError {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("not a plan document: {0}")]
    NotAPlan(String),
}

/// A parsed `show -json` plan.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Plan {
    #[serde(default)]
    pub format_version: String,
    #[serde(default)]
    pub terraform_version: Option<String>,
    #[serde(default)]
    pub resource_changes: Vec<ResourceChange>,
    #[serde(default)]
    pub resource_drift: Vec<ResourceChange>,
    #[serde(default)]
    pub output_changes: BTreeMap<String, OutputChange>,
    #[serde(default)]
    pub errored: bool,
    /// Terraform only; OpenTofu has no such field.
    #[serde(default)]
    pub applyable: Option<bool>,
    /// Input variable values, in clear. Never rendered; read only to collect secrets.
    #[serde(default)]
    pub variables: BTreeMap<String, VariableValue>,
    /// Only the sensitivity flags of root variables are read from `configuration`.
    #[serde(default)]
    pub configuration: Option<Configuration>,
    /// The state before the plan, in clear (masked only by `sensitive_values`). Never rendered;
    /// read only to collect secrets (e.g. sensitive attributes of data sources).
    #[serde(default)]
    pub prior_state: Option<Value>,
    /// The planned state, in clear (masked only by `sensitive_values`). Never rendered; read
    /// only to collect secrets.
    #[serde(default)]
    pub planned_values: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct VariableValue {
    #[serde(default)]
    pub value: Value,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Configuration {
    #[serde(default)]
    pub root_module: ConfigModule,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigModule {
    #[serde(default)]
    pub variables: BTreeMap<String, ConfigVariable>,
    #[serde(default)]
    pub outputs: BTreeMap<String, ConfigOutput>,
    /// Resource blocks as written (`expressions`, `references`); read by the lint rules to
    /// follow a reference when the value itself is only known after apply. Never rendered.
    #[serde(default)]
    pub resources: Vec<Value>,
    /// Child modules (their variables' sensitivity and defaults are read to collect secrets).
    #[serde(default)]
    pub module_calls: BTreeMap<String, ConfigModuleCall>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigModuleCall {
    #[serde(default)]
    pub module: ConfigModule,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigVariable {
    #[serde(default)]
    pub sensitive: bool,
    /// The declared default, in clear. Never rendered; read only to collect secrets.
    #[serde(default)]
    pub default: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigOutput {
    #[serde(default)]
    pub sensitive: bool,
}

/// Resource mode. OpenTofu also reports `ephemeral`, which planbot skips.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Managed,
    Data,
    Ephemeral,
    Other(String),
}

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.as_str() {
            "managed" => Mode::Managed,
            "data" => Mode::Data,
            "ephemeral" => Mode::Ephemeral,
            _ => Mode::Other(s),
        })
    }
}

/// One entry of `resource_changes` (or `resource_drift`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResourceChange {
    pub address: String,
    #[serde(default)]
    pub previous_address: Option<String>,
    #[serde(default)]
    pub module_address: Option<String>,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default, rename = "type")]
    pub resource_type: String,
    #[serde(default)]
    pub name: String,
    /// Number (count) or string (for_each), absent for single resources.
    #[serde(default)]
    pub index: Option<Value>,
    #[serde(default)]
    pub provider_name: Option<String>,
    #[serde(default)]
    pub deposed: Option<String>,
    #[serde(default)]
    pub action_reason: Option<String>,
    #[serde(default)]
    pub change: Change,
}

/// A planned change: before/after values with their unknown and sensitivity masks.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Change {
    #[serde(default)]
    pub actions: Vec<String>,
    #[serde(default)]
    pub before: Value,
    #[serde(default)]
    pub after: Value,
    #[serde(default)]
    pub after_unknown: Value,
    #[serde(default)]
    pub before_sensitive: Value,
    #[serde(default)]
    pub after_sensitive: Value,
    #[serde(default)]
    pub replace_paths: Option<Vec<Vec<Value>>>,
    /// Non-null when this change also imports the resource.
    #[serde(default)]
    pub importing: Option<Value>,
    #[serde(default)]
    pub generated_config: Option<String>,
}

/// A root output change. Sensitivity is one bool and a sensitive value is in clear in `after`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct OutputChange {
    #[serde(default)]
    pub actions: Vec<String>,
    #[serde(default)]
    pub before: Value,
    #[serde(default)]
    pub after: Value,
    #[serde(default)]
    pub after_unknown: Value,
    #[serde(default)]
    pub before_sensitive: Value,
    #[serde(default)]
    pub after_sensitive: Value,
}

impl OutputChange {
    pub fn kind(&self) -> ActionKind {
        ActionKind::from_actions(&self.actions)
    }

    /// A sensitive output is hidden whole (`before_sensitive`/`after_sensitive` are bools here,
    /// but tolerate any truthy mask).
    pub fn is_sensitive(&self) -> bool {
        mask_has_true(&self.before_sensitive) || mask_has_true(&self.after_sensitive)
    }
}

/// True when a sensitivity mask marks anything at all as sensitive.
pub fn mask_has_true(mask: &Value) -> bool {
    match mask {
        Value::Bool(b) => *b,
        Value::Array(items) => items.iter().any(mask_has_true),
        Value::Object(map) => map.values().any(mask_has_true),
        _ => false,
    }
}

/// The action list classified the way OpenTofu's own summary reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    NoOp,
    Create,
    Read,
    Update,
    /// `["delete","create"]`
    DeleteThenCreate,
    /// `["create","delete"]` (create_before_destroy)
    CreateThenDelete,
    Delete,
    Forget,
    /// OpenTofu `["forget","create"]`, Terraform `["create","forget"]`
    ForgetAndCreate,
    Unknown,
}

impl ActionKind {
    pub fn from_actions(actions: &[String]) -> Self {
        let a: Vec<&str> = actions.iter().map(String::as_str).collect();
        match a.as_slice() {
            ["no-op"] | [] => ActionKind::NoOp,
            ["create"] => ActionKind::Create,
            ["read"] => ActionKind::Read,
            ["update"] => ActionKind::Update,
            ["delete", "create"] => ActionKind::DeleteThenCreate,
            ["create", "delete"] => ActionKind::CreateThenDelete,
            ["delete"] => ActionKind::Delete,
            ["forget"] => ActionKind::Forget,
            ["forget", "create"] | ["create", "forget"] => ActionKind::ForgetAndCreate,
            _ => ActionKind::Unknown,
        }
    }

    pub fn is_replace(self) -> bool {
        matches!(
            self,
            ActionKind::DeleteThenCreate | ActionKind::CreateThenDelete
        )
    }

    /// Destroys or replaces something that exists.
    pub fn is_destructive(self) -> bool {
        self.is_replace() || self == ActionKind::Delete
    }

    /// The marker OpenTofu prints in front of a resource.
    pub fn symbol(self) -> &'static str {
        match self {
            ActionKind::NoOp => " ",
            ActionKind::Create => "+",
            ActionKind::Read => "<=",
            ActionKind::Update => "~",
            ActionKind::DeleteThenCreate => "-/+",
            ActionKind::CreateThenDelete => "+/-",
            ActionKind::Delete => "-",
            ActionKind::Forget => ".",
            ActionKind::ForgetAndCreate => "+/.",
            ActionKind::Unknown => "?",
        }
    }

    /// The verb used in notes ("will be **replaced**").
    pub fn verb(self) -> &'static str {
        match self {
            ActionKind::NoOp => "unchanged",
            ActionKind::Create => "created",
            ActionKind::Read => "read",
            ActionKind::Update => "updated in place",
            ActionKind::DeleteThenCreate => "replaced",
            ActionKind::CreateThenDelete => "replaced (create before destroy)",
            ActionKind::Delete => "destroyed",
            ActionKind::Forget => "forgotten (removed from state, not destroyed)",
            ActionKind::ForgetAndCreate => "forgotten and created anew",
            ActionKind::Unknown => "changed in a way planbot does not know",
        }
    }
}

impl ResourceChange {
    pub fn kind(&self) -> ActionKind {
        ActionKind::from_actions(&self.change.actions)
    }

    pub fn is_managed(&self) -> bool {
        self.mode == Mode::Managed
    }

    pub fn is_import(&self) -> bool {
        self.change.importing.as_ref().is_some_and(|v| !v.is_null())
    }

    pub fn is_move(&self) -> bool {
        self.previous_address
            .as_deref()
            .is_some_and(|p| p != self.address)
    }

    /// Whether this entry is worth showing: a real action, a move or an import.
    pub fn has_change(&self) -> bool {
        self.kind() != ActionKind::NoOp || self.is_move() || self.is_import()
    }

    /// `address` plus ` (deposed DEPOSED)`: unique within a plan.
    pub fn display_address(&self) -> String {
        match &self.deposed {
            Some(d) => format!("{} (deposed object {d})", self.address),
            None => self.address.clone(),
        }
    }
}

impl Plan {
    /// Parse a `show -json` document. Anything that is not a plan is an error, never a panic.
    ///
    /// The document is checked with a first pass that builds nothing, then deserialized straight
    /// into `Plan`: the parts planbot does not read (`planned_values`, `prior_state`, most of
    /// `configuration`) are skipped, never held in memory.
    pub fn from_json(bytes: &[u8]) -> Result<Plan, PlanParseError> {
        use serde::de::IgnoredAny;
        #[derive(Deserialize)]
        struct Probe {
            format_version: Option<IgnoredAny>,
            resource_changes: Option<IgnoredAny>,
            planned_values: Option<IgnoredAny>,
            output_changes: Option<IgnoredAny>,
            errored: Option<IgnoredAny>,
        }
        match serde_json::from_slice::<Probe>(bytes) {
            Ok(p)
                if p.format_version.is_some()
                    && (p.resource_changes.is_some()
                        || p.planned_values.is_some()
                        || p.output_changes.is_some()
                        || p.errored.is_some()) =>
            {
                serde_json::from_slice(bytes).map_err(|e| PlanParseError::NotAPlan(e.to_string()))
            }
            // Not a plan after all: the tree-building path words the reason.
            _ => {
                let value: Value = serde_json::from_slice(bytes)
                    .map_err(|e| PlanParseError::NotJson(e.to_string()))?;
                Plan::from_value(value)
            }
        }
    }

    pub fn from_value(value: Value) -> Result<Plan, PlanParseError> {
        let obj = value.as_object().ok_or_else(|| {
            PlanParseError::NotAPlan("the document is not a JSON object".to_string())
        })?;
        if !obj.contains_key("format_version") {
            return Err(PlanParseError::NotAPlan(
                "it has no \"format_version\" (expected the output of `tofu show -json PLANFILE`)"
                    .to_string(),
            ));
        }
        let looks_like_plan = [
            "resource_changes",
            "planned_values",
            "output_changes",
            "errored",
        ]
        .iter()
        .any(|k| obj.contains_key(*k));
        if !looks_like_plan {
            return Err(PlanParseError::NotAPlan(
                "it has none of \"resource_changes\", \"planned_values\", \"output_changes\" (is it a state file? run `show -json` on a plan file)"
                    .to_string(),
            ));
        }
        serde_json::from_value(value).map_err(|e| PlanParseError::NotAPlan(e.to_string()))
    }

    /// Managed resource changes, the ones summaries and notes are about.
    pub fn managed_changes(&self) -> impl Iterator<Item = &ResourceChange> {
        self.resource_changes.iter().filter(|rc| rc.is_managed())
    }

    /// The engine's name and version, for the footer ("OpenTofu 1.10.6" is not knowable from the
    /// JSON alone; callers that ran the engine know better).
    pub fn engine_version(&self) -> Option<&str> {
        self.terraform_version.as_deref()
    }

    /// Values of root variables declared `sensitive`: secrets to scrub.
    pub fn sensitive_variable_values(&self) -> Vec<&Value> {
        let Some(cfg) = &self.configuration else {
            return Vec::new();
        };
        cfg.root_module
            .variables
            .iter()
            .filter(|(_, v)| v.sensitive)
            .filter_map(|(name, _)| self.variables.get(name).map(|v| &v.value))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_every_documented_action_list() {
        let k = |a: &[&str]| {
            ActionKind::from_actions(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(k(&["no-op"]), ActionKind::NoOp);
        assert_eq!(k(&["create"]), ActionKind::Create);
        assert_eq!(k(&["read"]), ActionKind::Read);
        assert_eq!(k(&["update"]), ActionKind::Update);
        assert_eq!(k(&["delete", "create"]), ActionKind::DeleteThenCreate);
        assert_eq!(k(&["create", "delete"]), ActionKind::CreateThenDelete);
        assert_eq!(k(&["delete"]), ActionKind::Delete);
        assert_eq!(k(&["forget"]), ActionKind::Forget);
        assert_eq!(k(&["forget", "create"]), ActionKind::ForgetAndCreate);
        assert_eq!(k(&["create", "forget"]), ActionKind::ForgetAndCreate);
        assert_eq!(k(&["explode"]), ActionKind::Unknown);
    }

    #[test]
    fn rejects_documents_that_are_not_plans() {
        assert!(matches!(
            Plan::from_json(b"not json"),
            Err(PlanParseError::NotJson(_))
        ));
        assert!(matches!(
            Plan::from_json(b"[1,2]"),
            Err(PlanParseError::NotAPlan(_))
        ));
        assert!(matches!(
            Plan::from_json(br#"{"format_version":"1.0","values":{}}"#),
            Err(PlanParseError::NotAPlan(_))
        ));
        assert!(matches!(
            Plan::from_json(br#"{"format_version":"1.0","resource_changes":"x"}"#),
            Err(PlanParseError::NotAPlan(_))
        ));
    }

    #[test]
    fn tolerates_unknown_fields_actions_and_reasons() {
        let plan = Plan::from_json(
            br#"{"format_version":"9.9","brand_new":1,"resource_changes":[
              {"address":"a.b","mode":"future","type":"a","name":"b","change":{"actions":["teleport"],"wat":true},"action_reason":"because_reasons"}
            ]}"#,
        )
        .unwrap();
        let rc = &plan.resource_changes[0];
        assert_eq!(rc.kind(), ActionKind::Unknown);
        assert_eq!(rc.mode, Mode::Other("future".into()));
        assert_eq!(rc.action_reason.as_deref(), Some("because_reasons"));
    }

    #[test]
    fn finds_sensitive_variable_values_only() {
        let plan = Plan::from_json(
            br#"{"format_version":"1.2","resource_changes":[],
              "variables":{"pw":{"value":"hunter2"},"name":{"value":"web"}},
              "configuration":{"root_module":{"variables":{"pw":{"sensitive":true},"name":{}}}}}"#,
        )
        .unwrap();
        assert_eq!(
            plan.sensitive_variable_values(),
            vec![&Value::String("hunter2".into())]
        );
    }
}
