//! The plan model: a `show -json` document parsed into typed, tolerant Rust values.
//!
//! Every `format_version` from 0.1 to 1.2 parses; unknown fields are ignored, unknown actions
//! and reasons are kept as text. Only the parts planbot renders or fingerprints are typed;
//! `variables` and `configuration` are kept just enough to find sensitive variable values
//! (they are never rendered).
//!
//! Memory: a plan is mostly its changes' `before`/`after` values. A value tree costs about 14
//! times its JSON text, so the model keeps each change's values as the JSON text the engine wrote
//! ([`RawValue`]) and parses them one resource at a time ([`Change::values`]) where they are
//! read. `prior_state` and `planned_values` (a second and third copy of every value) are read
//! while parsing, one resource at a time, only for the secrets they reveal.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// The largest document [`Plan::from_json_reader`] reads whole before parsing it. Parsing in
/// memory takes about a fifth less time than through a reader, which serde_json reads a byte at
/// a time; the document's size is held while it is parsed, which for a plan of many resources
/// is under what the note's render takes afterwards (the 10,000-resource benchmark plan: 12 MiB
/// of JSON, a peak of 60 MiB either way). A larger document is parsed as it is read.
pub const READ_WHOLE_UP_TO: usize = 32 << 20;

/// Why a document could not be read as a plan. Callers show this as one line (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum PlanParseError {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("not a plan document: {0}")]
    NotAPlan(String),
    /// Over the value budget ([`crate::core::plan_budget`]): refused before it was read.
    #[error("over planbot's value budget: {0}")]
    TooManyValues(#[from] crate::core::plan_budget::OverBudget),
}

fn no_format_version() -> PlanParseError {
    PlanParseError::NotAPlan(
        "it has no \"format_version\" (expected the output of `tofu show -json PLANFILE`)"
            .to_string(),
    )
}

/// A `show -json` document as read: [`Plan`], with the fields that tell a plan from another
/// document (a state file has `format_version` and `values`) kept optional.
#[derive(Deserialize)]
#[serde(expecting = "a plan document (a JSON object)")]
struct PlanWire {
    format_version: Option<String>,
    #[serde(default)]
    terraform_version: Option<String>,
    resource_changes: Option<Vec<ResourceChange>>,
    #[serde(default)]
    resource_drift: Vec<ResourceChange>,
    output_changes: Option<BTreeMap<String, OutputChange>>,
    errored: Option<bool>,
    #[serde(default)]
    applyable: Option<bool>,
    #[serde(default)]
    complete: Option<bool>,
    #[serde(default)]
    timestamp: Option<String>,
    #[serde(default)]
    variables: BTreeMap<String, VariableValue>,
    #[serde(default)]
    configuration: Option<Configuration>,
    #[serde(default)]
    prior_state: PriorStateSecrets,
    planned_values: Option<StateSecrets>,
    #[serde(default)]
    checks: Option<Box<RawValue>>,
}

impl PlanWire {
    fn into_plan(self) -> Result<Plan, PlanParseError> {
        let Some(format_version) = self.format_version else {
            return Err(no_format_version());
        };
        if self.resource_changes.is_none()
            && self.planned_values.is_none()
            && self.output_changes.is_none()
            && self.errored.is_none()
        {
            return Err(PlanParseError::NotAPlan(
                "it has none of \"resource_changes\", \"planned_values\", \"output_changes\" (is it a state file? run `show -json` on a plan file)"
                    .to_string(),
            ));
        }
        // The lists grew by doubling while they were read: give back the unused half.
        let mut resource_changes = self.resource_changes.unwrap_or_default();
        resource_changes.shrink_to_fit();
        let mut resource_drift = self.resource_drift;
        resource_drift.shrink_to_fit();
        Ok(Plan {
            format_version,
            terraform_version: self.terraform_version,
            resource_changes,
            resource_drift,
            output_changes: self.output_changes.unwrap_or_default(),
            errored: self.errored.unwrap_or_default(),
            applyable: self.applyable,
            complete: self.complete,
            timestamp: self.timestamp,
            variables: self.variables,
            configuration: self.configuration,
            prior_state_secrets: self.prior_state,
            planned_values_secrets: self.planned_values.unwrap_or_default(),
            checks: self.checks,
        })
    }
}

/// The newest `format_version` (major, minor) planbot knows: a plan of a later one is read
/// as tolerantly as any, and the note and the terminal say that parts of it may be unknown.
pub const KNOWN_FORMAT: (u64, u64) = (1, 2);

/// A parsed `show -json` plan.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub format_version: String,
    pub terraform_version: Option<String>,
    pub resource_changes: Vec<ResourceChange>,
    pub resource_drift: Vec<ResourceChange>,
    pub output_changes: BTreeMap<String, OutputChange>,
    pub errored: bool,
    /// Terraform only (1.8 and later); OpenTofu has no such field.
    pub applyable: Option<bool>,
    /// Terraform only, like `applyable`.
    pub complete: Option<bool>,
    /// When the plan was made (both engines write it; read only to tell them apart).
    pub timestamp: Option<String>,
    /// Input variable values, in clear. Never rendered; read only to collect secrets.
    pub variables: BTreeMap<String, VariableValue>,
    /// Only the sensitivity flags of root variables are read from `configuration`.
    pub configuration: Option<Configuration>,
    /// The secrets of the state before the plan (e.g. sensitive attributes of data sources):
    /// `prior_state.values` is read while parsing, never kept.
    pub prior_state_secrets: PriorStateSecrets,
    /// The secrets of the planned state: `planned_values` is read while parsing, never kept.
    pub planned_values_secrets: StateSecrets,
    /// The `checks` results (`check {}` blocks and conditions) as the JSON text the engine
    /// wrote, kept from the one parse of the document for [`crate::core::engine_checks`]
    /// (small: one entry per checkable object).
    pub checks: Option<Box<RawValue>>,
}

impl Plan {
    /// The JSON text of the plan's `checks` (`[]` when it has none).
    pub fn checks_json(&self) -> &[u8] {
        self.checks
            .as_deref()
            .map_or(b"[]", |raw| raw.get().as_bytes())
    }

    /// The plan's `format_version` when it is newer than [`KNOWN_FORMAT`] (one that does not
    /// read as `major.minor` counts as newer: planbot cannot tell what it holds).
    pub fn newer_format(&self) -> Option<&str> {
        let mut parts = self.format_version.split('.').map(|p| p.parse::<u64>());
        let newer = match (parts.next(), parts.next()) {
            (Some(Ok(major)), Some(Ok(minor))) => (major, minor) > KNOWN_FORMAT,
            (Some(Ok(major)), None) => major > KNOWN_FORMAT.0,
            _ => true,
        };
        newer.then_some(self.format_version.as_str())
    }
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
    /// The providers by configuration key; only their full names are read (to tell the
    /// engines apart).
    #[serde(default)]
    pub provider_config: BTreeMap<String, ConfigProvider>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigProvider {
    #[serde(default)]
    pub full_name: Option<String>,
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
    /// Number (count) or string (for_each), absent for single resources (boxed: most plans have
    /// thousands of changes, and a `Value` inline is ten times the size of a pointer).
    #[serde(default)]
    pub index: Option<Box<Value>>,
    #[serde(default)]
    pub provider_name: Option<String>,
    #[serde(default)]
    pub deposed: Option<String>,
    #[serde(default)]
    pub action_reason: Option<String>,
    #[serde(default)]
    pub change: Change,
}

/// A planned change: its actions, and its before/after values with their unknown and
/// sensitivity masks as the JSON text of the plan, packed (parsed on demand by
/// [`Change::values`]).
#[derive(Debug, Clone, Default)]
pub struct Change {
    pub actions: Vec<String>,
    values: PackedValues,
    pub replace_paths: Option<Vec<Vec<Value>>>,
    /// Non-null when this change also imports the resource (boxed: most plans have thousands
    /// of changes, and a `Value` inline is ten times the size of a pointer).
    pub importing: Option<Box<Value>>,
    pub generated_config: Option<String>,
}

/// The JSON text of a change's `before`, `after`, `after_unknown`, `before_sensitive` and
/// `after_sensitive`, one after the other, LZ4-compressed against a dictionary shared by the
/// plan's changes: these values are most of a plan, and the resources of a plan repeat their
/// attribute names and most values, so against the first few KiB of the plan's value text a
/// resource compresses to a fraction (a 10,000-VM plan: 9 MB of value text to 1 MB, where
/// each alone compresses to 5 MB). Decompressing a resource takes far less time than parsing it.
#[derive(Debug, Clone, Default)]
struct PackedValues {
    compressed: Box<[u8]>,
    /// Where each of the five texts ends in the decompressed text (an absent value is empty).
    ends: [u32; 5],
    /// The dictionary it was compressed against (none for the first changes of a plan).
    dict: Option<Arc<[u8]>>,
}

/// How many bytes of the first changes' value text make the dictionary of a plan (compressing
/// against it costs a pass over it per change).
const DICT_BYTES: usize = 4096;

/// The dictionary of the plan being read on this thread: built from the first changes, then
/// shared by the others. Each change keeps a reference to its own dictionary, so a change read
/// outside a plan, or on another thread, still decompresses right; [`PackingScope`] starts a
/// fresh dictionary for each plan read.
#[derive(Default)]
struct Packing {
    building: Vec<u8>,
    dict: Option<Arc<[u8]>>,
}

thread_local! {
    static PACKING: std::cell::RefCell<Packing> = std::cell::RefCell::new(Packing::default());
}

/// While a plan is read: its changes share a dictionary of their own (reset on drop too, so an
/// error or a panic leaves nothing of it behind).
struct PackingScope;

impl PackingScope {
    fn start() -> PackingScope {
        PACKING.with(|p| *p.borrow_mut() = Packing::default());
        PackingScope
    }
}

impl Drop for PackingScope {
    fn drop(&mut self) {
        PACKING.with(|p| *p.borrow_mut() = Packing::default());
    }
}

/// The five value fields of a change, in packing order.
const VALUE_FIELDS: [&str; 5] = [
    "before",
    "after",
    "after_unknown",
    "before_sensitive",
    "after_sensitive",
];

impl PackedValues {
    fn pack(texts: &[Option<Box<RawValue>>; 5]) -> PackedValues {
        let mut text = String::new();
        let mut ends = [0u32; 5];
        for (end, raw) in ends.iter_mut().zip(texts) {
            if let Some(raw) = raw {
                text.push_str(raw.get());
            }
            *end = u32::try_from(text.len()).unwrap_or(u32::MAX);
        }
        let bytes = text.as_bytes();
        let (compressed, dict) = PACKING.with(|p| {
            let mut p = p.borrow_mut();
            if let Some(dict) = &p.dict {
                let compressed = lz4_flex::block::compress_with_dict(bytes, dict);
                return (compressed, Some(Arc::clone(dict)));
            }
            let room = DICT_BYTES - p.building.len();
            p.building
                .extend_from_slice(&bytes[..bytes.len().min(room)]);
            if p.building.len() >= DICT_BYTES {
                let dict: Arc<[u8]> = Arc::from(std::mem::take(&mut p.building));
                p.dict = Some(dict);
            }
            (lz4_flex::block::compress(bytes), None)
        });
        PackedValues {
            compressed: compressed.into_boxed_slice(),
            ends,
            dict,
        }
    }

    /// Parse the values at these positions (0..5 as in [`VALUE_FIELDS`]); the others are null.
    /// One allocation holds the decompressed text, and the values borrow their strings from it.
    fn parse(&self, wanted: [bool; 5]) -> ChangeValues {
        let Some(text) = self.decompressed() else {
            return ChangeValues::default();
        };
        let ranges = self.ranges();
        ChangeValues::new(text, |text| {
            let mut out: [Json<'_>; 5] = Default::default();
            for (n, value) in out.iter_mut().enumerate() {
                let part = text.get(ranges[n].clone()).unwrap_or_default();
                if wanted[n] && !part.is_empty() {
                    // The text was valid JSON when the plan was parsed.
                    *value = serde_json::from_slice(part).unwrap_or_default();
                }
            }
            let [before, after, after_unknown, before_sensitive, after_sensitive] = out;
            Values {
                before,
                after,
                after_unknown,
                before_sensitive,
                after_sensitive,
            }
        })
    }

    /// Where each of the five texts lies in the decompressed text (an absent one is empty).
    fn ranges(&self) -> [std::ops::Range<usize>; 5] {
        let mut start = 0;
        self.ends.map(|end| {
            let end = end as usize;
            let range = start..end.max(start);
            start = end.max(start);
            range
        })
    }

    /// The five texts, decompressed into one buffer (`None` when there are none).
    fn decompressed(&self) -> Option<Vec<u8>> {
        let total = self.ends[4] as usize;
        if total == 0 {
            return None;
        }
        // The text was valid JSON when the plan was parsed and is only read back here.
        match &self.dict {
            Some(dict) => lz4_flex::block::decompress_with_dict(&self.compressed, total, dict),
            None => lz4_flex::block::decompress(&self.compressed, total),
        }
        .ok()
    }

    /// Call `read` with the JSON texts of the five values (empty for an absent one).
    fn with_texts(&self, read: impl FnOnce([&[u8]; 5])) {
        let Some(bytes) = self.decompressed() else {
            return;
        };
        read(self.ranges().map(|r| bytes.get(r).unwrap_or_default()));
    }
}

impl<'de> Deserialize<'de> for Change {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        object(d)
    }
}

impl FromObject for Change {
    fn from_object<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut change = Change::default();
        let mut texts: [Option<Box<RawValue>>; 5] = Default::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key.as_str() {
                "actions" => change.actions = map.next_value::<Option<_>>()?.unwrap_or_default(),
                "replace_paths" => change.replace_paths = map.next_value()?,
                "importing" => change.importing = map.next_value()?,
                "generated_config" => change.generated_config = map.next_value()?,
                k => match VALUE_FIELDS.iter().position(|f| *f == k) {
                    Some(n) => texts[n] = map.next_value()?,
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                },
            }
        }
        change.values = PackedValues::pack(&texts);
        Ok(change)
    }
}

/// A JSON value read from a change's text, its strings borrowed from it where they hold no
/// escape, its objects lists of pairs in the document's order: a fraction of the allocations
/// of a [`Value`]; every resource of a plan is read this way by the lint rules, the note's
/// diffs, the capacity and the drift issue.
pub type Json<'t> = serde_json_borrow::Value<'t>;

/// One change's five values, borrowed from the text they were read from ([`ChangeValues`]).
/// Absent fields are `null`.
#[derive(Debug, Default)]
pub struct Values<'t> {
    pub before: Json<'t>,
    pub after: Json<'t>,
    pub after_unknown: Json<'t>,
    pub before_sensitive: Json<'t>,
    pub after_sensitive: Json<'t>,
}

self_cell::self_cell!(
    /// One change's values, parsed: what [`Change::values`] returns, holding the decompressed
    /// text its [`Values`] borrow from ([`ChangeValues::get`]).
    pub struct ChangeValues {
        owner: Vec<u8>,
        #[covariant]
        dependent: Values,
    }
    impl {Debug}
);

impl Default for ChangeValues {
    fn default() -> ChangeValues {
        ChangeValues::new(Vec::new(), |_| Values::default())
    }
}

impl ChangeValues {
    /// The five values.
    pub fn get(&self) -> &Values<'_> {
        self.borrow_dependent()
    }
}

/// A change's `after` and its masks ([`Change::after_values`]); absent fields are `null`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AfterValues {
    pub after: Value,
    pub after_unknown: Value,
    pub after_sensitive: Value,
}

impl Change {
    /// Parse this change's before/after values and masks (a few microseconds per resource; the
    /// caller drops them when done with the resource).
    pub fn values(&self) -> ChangeValues {
        self.values.parse([true; 5])
    }

    /// Parse only what applying this change sets: `after`, `after_unknown` and
    /// `after_sensitive` (the others null), as the fingerprint reads them.
    pub fn applied_values(&self) -> ChangeValues {
        self.values.parse([false, true, true, false, true])
    }

    /// Call `leaf` on every string and number of `before` and `after` that their masks mark
    /// sensitive (as [`for_each_masked_leaf`]), reading the values' JSON text once: only what
    /// lies under a mask that marks something is parsed, the rest is skipped.
    pub fn for_each_sensitive_leaf(&self, leaf: &mut dyn FnMut(String)) {
        self.values
            .with_texts(|[before, after, _, before_sensitive, after_sensitive]| {
                for (text, mask) in [(before, before_sensitive), (after, after_sensitive)] {
                    if text.is_empty() || mask.is_empty() {
                        continue;
                    }
                    let mask: Value = serde_json::from_slice(mask).unwrap_or(Value::Null);
                    if !mask_has_true(&mask) {
                        continue;
                    }
                    let mut de = serde_json::Deserializer::from_slice(text);
                    // The text was valid JSON when the plan was parsed.
                    let _ = MaskedLeaves {
                        mask: &mask,
                        leaf: &mut *leaf,
                    }
                    .deserialize(&mut de);
                }
            });
    }

    /// Only `after` and its masks, as whole values (the fingerprint, the digest and the apply's
    /// comparison with the reviewed plan read them so).
    pub fn after_values(&self) -> AfterValues {
        let mut out = AfterValues::default();
        self.values
            .with_texts(|[_, after, after_unknown, _, after_sensitive]| {
                for (value, text) in [
                    (&mut out.after, after),
                    (&mut out.after_unknown, after_unknown),
                    (&mut out.after_sensitive, after_sensitive),
                ] {
                    if !text.is_empty() {
                        // The text was valid JSON when the plan was parsed.
                        *value = serde_json::from_slice(text).unwrap_or(Value::Null);
                    }
                }
            });
        out
    }
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

/// Call `leaf` on every string and number inside `value` (object keys are not values).
pub fn for_each_leaf(value: &Value, leaf: &mut dyn FnMut(String)) {
    match value {
        Value::String(s) => leaf(s.clone()),
        Value::Number(n) => leaf(n.to_string()),
        Value::Array(items) => items.iter().for_each(|v| for_each_leaf(v, leaf)),
        Value::Object(map) => map.values().for_each(|v| for_each_leaf(v, leaf)),
        Value::Bool(_) | Value::Null => {}
    }
}

/// Call `leaf` on every string and number of `value` that `mask` marks sensitive. Objects are
/// masked by key, lists and sets (both JSON arrays) by position, `true` masks the whole value
/// below it; a mask whose shape does not fit the value but marks something takes it all.
pub fn for_each_masked_leaf(value: &Value, mask: &Value, leaf: &mut dyn FnMut(String)) {
    match (mask, value) {
        (Value::Bool(true), v) => for_each_leaf(v, leaf),
        (Value::Object(m), Value::Object(v)) => {
            for (k, sub) in m {
                if let Some(val) = v.get(k) {
                    for_each_masked_leaf(val, sub, leaf);
                }
            }
        }
        (Value::Array(m), Value::Array(v)) => {
            for (sub, val) in m.iter().zip(v) {
                for_each_masked_leaf(val, sub, leaf);
            }
        }
        (m, v) if mask_has_true(m) => for_each_leaf(v, leaf),
        _ => {}
    }
}

/// [`for_each_masked_leaf`] on a value still in JSON text: parses only what `mask` marks (a
/// mask that marks nothing below it skips the value unparsed).
struct MaskedLeaves<'m, 'f> {
    mask: &'m Value,
    leaf: &'f mut dyn FnMut(String),
}

impl<'de> DeserializeSeed<'de> for MaskedLeaves<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.mask {
            Value::Bool(true) => d.deserialize_any(AllLeaves(self.leaf)),
            m if mask_has_true(m) => d.deserialize_any(self),
            _ => IgnoredAny::deserialize(d).map(|_| ()),
        }
    }
}

/// A value under a mask that is an object or a list and marks something below it.
impl<'de> Visitor<'de> for MaskedLeaves<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Value::Object(mask) = self.mask else {
            // A mask of another shape that marks something takes the whole value.
            return AllLeaves(self.leaf).visit_map(map);
        };
        while let Some(key) = map.next_key::<Key>()? {
            match mask.get(key.as_str()) {
                Some(sub) => map.next_value_seed(MaskedLeaves {
                    mask: sub,
                    leaf: &mut *self.leaf,
                })?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Value::Array(mask) = self.mask else {
            return AllLeaves(self.leaf).visit_seq(seq);
        };
        let mut masks = mask.iter();
        loop {
            let more = match masks.next() {
                Some(sub) => seq
                    .next_element_seed(MaskedLeaves {
                        mask: sub,
                        leaf: &mut *self.leaf,
                    })?
                    .is_some(),
                None => seq.next_element::<IgnoredAny>()?.is_some(),
            };
            if !more {
                return Ok(());
            }
        }
    }

    // A scalar under such a mask: taken whole, as a mismatched shape.
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        AllLeaves(self.leaf).visit_str(v)
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        AllLeaves(self.leaf).visit_u64(v)
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        AllLeaves(self.leaf).visit_i64(v)
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        AllLeaves(self.leaf).visit_f64(v)
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// [`for_each_leaf`] on a value still in JSON text.
struct AllLeaves<'f>(&'f mut dyn FnMut(String));

impl<'de> DeserializeSeed<'de> for AllLeaves<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for AllLeaves<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Object keys are not values.
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(AllLeaves(&mut *self.0))?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(AllLeaves(&mut *self.0))?.is_some() {}
        Ok(())
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        (self.0)(v.to_string());
        Ok(())
    }
    // Numbers as `serde_json::Number` prints them (what `for_each_leaf` gives).
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        (self.0)(serde_json::Number::from(v).to_string());
        Ok(())
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        (self.0)(serde_json::Number::from(v).to_string());
        Ok(())
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        if let Some(n) = serde_json::Number::from_f64(v) {
            (self.0)(n.to_string());
        }
        Ok(())
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// The sensitive values of a state values object (`{"outputs": {...}, "root_module": {...}}`,
/// as in `planned_values` and `prior_state.values`): sensitive outputs, and every resource value
/// under a `true` mask of its `sensitive_values`. Collected while the plan is parsed, one
/// resource at a time; the state itself is never kept. Anything of another shape is skipped.
#[derive(Debug, Clone, Default)]
pub struct StateSecrets(pub Vec<String>);

/// The sensitive values of `prior_state` (its `values` object, see [`StateSecrets`]).
#[derive(Debug, Clone, Default)]
pub struct PriorStateSecrets(pub Vec<String>);

/// A type read from a JSON object by a streaming visitor; any other JSON is skipped as empty.
trait FromObject: Default {
    fn from_object<'de, A: MapAccess<'de>>(map: A) -> Result<Self, A::Error>;
}

struct ObjectVisitor<T>(std::marker::PhantomData<T>);

/// Visitor methods that skip a scalar of the wrong type as the empty value.
macro_rules! skip_as_default {
    ($ret:ty; $($name:ident: $t:ty),*) => {
        fn visit_unit<E: serde::de::Error>(self) -> Result<$ret, E> {
            Ok(<$ret>::default())
        }
        $(fn $name<E: serde::de::Error>(self, _: $t) -> Result<$ret, E> {
            Ok(<$ret>::default())
        })*
    };
}

impl<'de, T: FromObject> Visitor<'de> for ObjectVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::from_object(map)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(T::default())
    }
    skip_as_default!(T; visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str);
}

fn object<'de, D: Deserializer<'de>, T: FromObject>(d: D) -> Result<T, D::Error> {
    d.deserialize_any(ObjectVisitor(std::marker::PhantomData))
}

/// A list whose items are read one by one into `T` (anything but a list is skipped as empty).
#[derive(Default)]
struct Items<T>(Vec<T>);

impl<'de, T: FromObject> Deserialize<'de> for Items<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ItemsVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: FromObject> Visitor<'de> for ItemsVisitor<T> {
            type Value = Items<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items<T>, A::Error> {
                let mut out = Vec::new();
                while let Some(item) = seq.next_element::<Wrapped<T>>()? {
                    out.push(item.0);
                }
                Ok(Items(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Items<T>, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Items(Vec::new()))
            }
            skip_as_default!(Items<T>; visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str);
        }
        d.deserialize_any(ItemsVisitor(std::marker::PhantomData))
    }
}

/// `T` read with [`object`] (so that it can be a `Deserialize` item of a list or map).
struct Wrapped<T>(T);

impl<'de, T: FromObject> Deserialize<'de> for Wrapped<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        object(d).map(Wrapped)
    }
}

/// One resource of a state module: only its sensitive values are kept.
#[derive(Default)]
struct StateResource(Vec<String>);

impl FromObject for StateResource {
    fn from_object<'de, A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let [values, mask] = two_fields(map, ["values", "sensitive_values"])?;
        let mut out = Vec::new();
        for_each_masked_leaf(&values, &mask, &mut |s| out.push(s));
        Ok(StateResource(out))
    }
}

/// An object's key as read: borrowed from the document where it holds no escape (most do), so
/// reading a plan's keys allocates nothing.
struct Key<'de>(std::borrow::Cow<'de, str>);

impl Key<'_> {
    fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> serde::de::Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v.to_string())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// The values of two keys of an object (null when absent); every other key is skipped.
fn two_fields<'de, A: MapAccess<'de>>(mut map: A, keys: [&str; 2]) -> Result<[Value; 2], A::Error> {
    let mut out = [Value::Null, Value::Null];
    while let Some(key) = map.next_key::<Key>()? {
        match keys.iter().position(|k| *k == key.as_str()) {
            Some(n) => out[n] = map.next_value()?,
            None => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    Ok(out)
}

/// A state module (`root_module` or a `child_modules` entry): its resources' sensitive values.
#[derive(Default)]
struct StateModule(Vec<String>);

impl FromObject for StateModule {
    fn from_object<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<Key>()? {
            match key.as_str() {
                "resources" => {
                    let items: Items<StateResource> = map.next_value()?;
                    out.extend(items.0.into_iter().flat_map(|r| r.0));
                }
                "child_modules" => {
                    let items: Items<StateModule> = map.next_value()?;
                    out.extend(items.0.into_iter().flat_map(|m| m.0));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(StateModule(out))
    }
}

/// A state output: its value when it is sensitive.
#[derive(Default)]
struct StateOutput(Vec<String>);

impl FromObject for StateOutput {
    fn from_object<'de, A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let [value, sensitive] = two_fields(map, ["value", "sensitive"])?;
        let mut out = Vec::new();
        if sensitive == Value::Bool(true) {
            for_each_leaf(&value, &mut |s| out.push(s));
        }
        Ok(StateOutput(out))
    }
}

/// The `outputs` object of a state: the sensitive outputs' values.
#[derive(Default)]
struct StateOutputs(Vec<String>);

impl FromObject for StateOutputs {
    fn from_object<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut out = Vec::new();
        while let Some((_, o)) = map.next_entry::<IgnoredAny, Wrapped<StateOutput>>()? {
            out.extend(o.0 .0);
        }
        Ok(StateOutputs(out))
    }
}

impl FromObject for StateSecrets {
    fn from_object<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<Key>()? {
            match key.as_str() {
                "outputs" => out.extend(map.next_value::<Wrapped<StateOutputs>>()?.0 .0),
                "root_module" => out.extend(map.next_value::<Wrapped<StateModule>>()?.0 .0),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(StateSecrets(out))
    }
}

impl FromObject for PriorStateSecrets {
    fn from_object<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<Key>()? {
            if key.as_str() == "values" {
                out.extend(map.next_value::<Wrapped<StateSecrets>>()?.0 .0);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(PriorStateSecrets(out))
    }
}

impl<'de> Deserialize<'de> for StateSecrets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        object(d)
    }
}

impl<'de> Deserialize<'de> for PriorStateSecrets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        object(d)
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
        // Told without allocating: it is asked for every change many times over.
        match actions {
            [] => ActionKind::NoOp,
            [one] => match one.as_str() {
                "no-op" => ActionKind::NoOp,
                "create" => ActionKind::Create,
                "read" => ActionKind::Read,
                "update" => ActionKind::Update,
                "delete" => ActionKind::Delete,
                "forget" => ActionKind::Forget,
                _ => ActionKind::Unknown,
            },
            [first, second] => match (first.as_str(), second.as_str()) {
                ("delete", "create") => ActionKind::DeleteThenCreate,
                ("create", "delete") => ActionKind::CreateThenDelete,
                ("forget", "create") | ("create", "forget") => ActionKind::ForgetAndCreate,
                _ => ActionKind::Unknown,
            },
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
    /// One pass deserializes straight into the plan: the parts planbot does not read (most of
    /// `configuration`) are skipped, the changes' values kept as text, `planned_values` and
    /// `prior_state` read for their secrets only; nothing of them is held in memory. A document
    /// that fails is read once more as a tree, only to say why it is not a plan.
    ///
    /// A document over the value budget ([`crate::core::plan_budget`]) is refused first, from a
    /// scan of its bytes: nothing of it is built.
    pub fn from_json(bytes: &[u8]) -> Result<Plan, PlanParseError> {
        crate::core::plan_budget::Budget::check(bytes)?;
        let _packing = PackingScope::start();
        match serde_json::from_slice::<PlanWire>(bytes) {
            Ok(wire) => wire.into_plan(),
            Err(_) => {
                let value: Value = serde_json::from_slice(bytes)
                    .map_err(|e| PlanParseError::NotJson(e.to_string()))?;
                Plan::from_value(value)
            }
        }
    }

    /// [`Plan::from_json`] from a reader (a file, stdin). A document of up to
    /// [`READ_WHOLE_UP_TO`] bytes is read whole and parsed in memory, as [`Plan::from_json`]
    /// does; a larger one is parsed as it is read, so that it is never held whole.
    pub fn from_json_reader<R: std::io::Read>(reader: R) -> Result<Plan, PlanParseError> {
        Plan::read_whole_up_to(reader, READ_WHOLE_UP_TO)
    }

    /// [`Plan::from_json_reader`] with the size read whole as an argument.
    fn read_whole_up_to<R: std::io::Read>(
        mut reader: R,
        limit: usize,
    ) -> Result<Plan, PlanParseError> {
        use std::io::Read;
        let mut head = Vec::new();
        (&mut reader)
            .take(limit as u64 + 1)
            .read_to_end(&mut head)
            .map_err(|e| PlanParseError::NotJson(e.to_string()))?;
        if head.len() <= limit {
            return Plan::from_json(&head);
        }
        Plan::from_json_stream(std::io::Cursor::new(head).chain(reader))
    }

    /// A document parsed as it is read; the value budget is counted as it comes.
    fn from_json_stream<R: std::io::Read>(reader: R) -> Result<Plan, PlanParseError> {
        let _packing = PackingScope::start();
        use serde_json::error::Category;
        // Counted in large pieces: serde_json reads a byte at a time.
        let mut reader =
            std::io::BufReader::new(crate::core::plan_budget::BudgetReader::new(reader));
        match serde_json::from_reader::<_, PlanWire>(&mut reader) {
            Ok(wire) => wire.into_plan(),
            Err(_) if reader.get_ref().over().is_some() => Err(PlanParseError::TooManyValues(
                reader.get_ref().over().cloned().expect("checked"),
            )),
            Err(e) => Err(match e.classify() {
                Category::Data => PlanParseError::NotAPlan(e.to_string()),
                Category::Io | Category::Syntax | Category::Eof => {
                    PlanParseError::NotJson(e.to_string())
                }
            }),
        }
    }

    /// Read a plan from a parsed document (said why it is not a plan, if it is not one).
    pub fn from_value(value: Value) -> Result<Plan, PlanParseError> {
        let _packing = PackingScope::start();
        let obj = value.as_object().ok_or_else(|| {
            PlanParseError::NotAPlan("the document is not a JSON object".to_string())
        })?;
        if !obj.contains_key("format_version") {
            return Err(no_format_version());
        }
        // The values of changes are kept as JSON text, which only a text parser gives.
        match serde_json::from_str::<PlanWire>(&value.to_string()) {
            Ok(wire) => wire.into_plan(),
            Err(e) => Err(PlanParseError::NotAPlan(e.to_string())),
        }
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

    /// The write-only attributes a change sets (Terraform 1.11, OpenTofu 1.11: `password_wo`):
    /// the engine never keeps their values, so `after` has them as `null`, and neither engine's
    /// `show -json` marks them (only the provider's schema, `providers schema -json`, does). A
    /// top-level attribute is taken as write-only when its resource block sets it (an expression
    /// in `configuration`) while the planned value is `null` and known, and either the block sets
    /// it to a constant that is not `null` (the engine plans a configured constant as it is
    /// written, unless the attribute is write-only) or its name ends in `_wo` (the providers'
    /// convention for write-only attributes, the one way to tell a reference to a write-only
    /// value from a reference that is `null`). Only managed resources that will exist after the
    /// apply have any; sorted.
    pub fn write_only_attributes(&self, rc: &ResourceChange) -> Vec<String> {
        let v = rc.change.values.parse([false, true, true, false, false]);
        self.write_only_attributes_of(rc, &v.get().after, &v.get().after_unknown)
    }

    /// [`Plan::write_only_attributes`] given the change's `after` and `after_unknown`, already
    /// parsed.
    pub fn write_only_attributes_of(
        &self,
        rc: &ResourceChange,
        after: &Json,
        after_unknown: &Json,
    ) -> Vec<String> {
        if rc.mode != Mode::Managed {
            return Vec::new();
        }
        let Some(after) = after.as_object() else {
            return Vec::new();
        };
        let Some(block) = self.config_block(rc) else {
            return Vec::new();
        };
        let Some(expressions) = block.get("expressions").and_then(Value::as_object) else {
            return Vec::new();
        };
        let mut out: Vec<String> = expressions
            .iter()
            .filter(|(name, expr)| {
                let constant = expr.get("constant_value");
                after.get(name.as_str()).is_some_and(Json::is_null)
                    && after_unknown.get(name.as_str()) != &Json::Bool(true)
                    && expr.is_object()
                    && (constant.is_some_and(|c| !c.is_null())
                        || (constant.is_none() && name.ends_with("_wo")))
            })
            .map(|(name, _)| name.clone())
            .collect();
        out.sort();
        out
    }

    /// The resource block of `configuration` a change comes from (its module found by the call
    /// names of its module address, the block by mode, type and name).
    fn config_block(&self, rc: &ResourceChange) -> Option<&Value> {
        let mut module = &self.configuration.as_ref()?.root_module;
        for call in module_call_names(rc.module_address.as_deref().unwrap_or_default()) {
            module = &module.module_calls.get(&call)?.module;
        }
        let mode = match rc.mode {
            Mode::Managed => "managed",
            Mode::Data => "data",
            Mode::Ephemeral => "ephemeral",
            Mode::Other(_) => return None,
        };
        module.resources.iter().find(|r| {
            r.get("mode").and_then(Value::as_str) == Some(mode)
                && r.get("type").and_then(Value::as_str) == Some(rc.resource_type.as_str())
                && r.get("name").and_then(Value::as_str) == Some(rc.name.as_str())
        })
    }

    /// The ephemeral resources of the plan (OpenTofu 1.11, Terraform 1.11): opened for the run
    /// and closed after it, never in the plan's changes nor in the state. OpenTofu lists their
    /// blocks in `configuration` (`"mode": "ephemeral"`), Terraform 1.11 leaves them out of
    /// `show -json` altogether; a change of mode `ephemeral` in `resource_changes` (written by no
    /// released engine, but the format allows it) is one too. Their addresses, in order, once.
    pub fn ephemeral_resources(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(cfg) = &self.configuration {
            collect_ephemeral(&cfg.root_module, "", &mut out);
        }
        for rc in &self.resource_changes {
            if rc.mode == Mode::Ephemeral {
                // Its block, when listed, names it without the instance key: the change says more.
                let block = match &rc.module_address {
                    Some(m) if !m.is_empty() => format!(
                        "{}.ephemeral.{}.{}",
                        module_call_names(m)
                            .iter()
                            .map(|c| format!("module.{c}"))
                            .collect::<Vec<_>>()
                            .join("."),
                        rc.resource_type,
                        rc.name
                    ),
                    _ => format!("ephemeral.{}.{}", rc.resource_type, rc.name),
                };
                out.retain(|a| *a != block);
                out.push(rc.address.clone());
            }
        }
        out.sort();
        out.dedup();
        out
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

/// The module call names of a module address: `module.a["x"].module.b` is `["a", "b"]` (an
/// instance key, quoted or not, is skipped).
fn module_call_names(address: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = address;
    while let Some(after) = rest.strip_prefix("module.") {
        let end = after.find(['.', '[']).unwrap_or(after.len());
        names.push(after[..end].to_string());
        rest = &after[end..];
        if rest.starts_with('[') {
            // Skip the key: a number, or a JSON string (which may hold `]` and `"`).
            let key = &rest[1..];
            let len = if let Some(quoted) = key.strip_prefix('"') {
                let mut escaped = false;
                quoted
                    .char_indices()
                    .find(|&(_, c)| {
                        let end = c == '"' && !escaped;
                        escaped = c == '\\' && !escaped;
                        end
                    })
                    .map_or(key.len(), |(i, _)| i + 2)
            } else {
                key.find(']').unwrap_or(key.len())
            };
            rest = key.get(len..).unwrap_or_default();
            rest = rest.strip_prefix(']').unwrap_or(rest);
        }
        rest = rest.strip_prefix('.').unwrap_or(rest);
    }
    names
}

/// The ephemeral resource blocks of a configuration module and its calls, by address.
fn collect_ephemeral(module: &ConfigModule, prefix: &str, out: &mut Vec<String>) {
    for r in &module.resources {
        if r.get("mode").and_then(Value::as_str) == Some("ephemeral") {
            let (Some(t), Some(n)) = (
                r.get("type").and_then(Value::as_str),
                r.get("name").and_then(Value::as_str),
            ) else {
                continue;
            };
            out.push(format!("{prefix}ephemeral.{t}.{n}"));
        }
    }
    for (name, call) in &module.module_calls {
        collect_ephemeral(&call.module, &format!("{prefix}module.{name}."), out);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_format_past_the_known_one_is_newer_and_the_known_ones_are_not() {
        let of = |v: &str| Plan {
            format_version: v.into(),
            ..Plan::default()
        };
        for known in ["0.1", "0.2", "1.0", "1.1", "1.2", "1"] {
            assert_eq!(of(known).newer_format(), None, "{known}");
        }
        for newer in ["1.3", "1.10", "2.0", "2", "1.x", ""] {
            assert_eq!(of(newer).newer_format(), Some(newer), "{newer}");
        }
    }
    use serde_json::json;

    /// Numbers below `n` from a seed (a linear congruential generator): the same every run.
    pub(crate) fn seeded(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut state = seed;
        move |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n.max(1)
        }
    }

    /// A random JSON value: nested objects and lists, strings with escapes and characters
    /// outside ASCII (keys too), numbers of every kind.
    pub(crate) fn random_value(next: &mut dyn FnMut(u64) -> u64, depth: u32) -> Value {
        const PIECES: &[&str] = &[
            "a",
            "\"",
            "\\",
            "\n",
            "<",
            "&",
            "é",
            "ключ",
            "\u{1F600}",
            " ",
            "\u{0}",
            "/",
        ];
        let text = |next: &mut dyn FnMut(u64) -> u64| {
            (0..next(5))
                .map(|_| PIECES[next(PIECES.len() as u64) as usize])
                .collect::<String>()
        };
        match next(if depth == 0 { 6 } else { 8 }) {
            0 => Value::Null,
            1 => Value::Bool(next(2) == 1),
            2 => json!(next(1 << 40)),
            3 => json!(-(next(1 << 40) as i64) - 1),
            4 => json!([1.0, 0.5, 2.5e-7, 1e21, -3.25, u64::MAX as f64][next(6) as usize]),
            5 => Value::String(text(next)),
            6 => Value::Array(
                (0..next(4))
                    .map(|_| random_value(next, depth - 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..next(4))
                    .map(|_| (text(next), random_value(next, depth - 1)))
                    .collect(),
            ),
        }
    }

    #[test]
    fn random_values_read_borrowed_as_serde_json_reads_them() {
        let mut next = seeded(0x5eed);
        for round in 0..300 {
            let values: Vec<Value> = (0..5).map(|_| random_value(&mut next, 4)).collect();
            let doc = json!({"address": "t.x", "mode": "managed", "change": {
                "actions": ["update"], "before": values[0], "after": values[1],
                "after_unknown": values[2], "before_sensitive": values[3],
                "after_sensitive": values[4]}});
            let rc: ResourceChange = serde_json::from_str(&doc.to_string()).unwrap();
            let read = rc.change.values();
            let read = read.get();
            for (n, got) in [
                &read.before,
                &read.after,
                &read.after_unknown,
                &read.before_sensitive,
                &read.after_sensitive,
            ]
            .into_iter()
            .enumerate()
            {
                assert_eq!(
                    serde_json::to_string(got).unwrap(),
                    serde_json::to_string(&values[n]).unwrap(),
                    "round {round}, value {n}"
                );
            }
        }
    }

    #[test]
    fn a_document_over_the_size_read_whole_is_read_as_it_comes_into_the_same_plan() {
        let doc = json!({"format_version": "1.2", "resource_changes": (0..50).map(|i| json!({
            "address": format!("t.x[{i}]"), "mode": "managed", "change": {"actions": ["create"],
            "after": {"name": format!("vm-{i}"), "pw": "p4ss"}, "after_sensitive": {"pw": true}}}))
            .collect::<Vec<_>>()})
        .to_string();
        let shown = |p: &Plan| {
            p.resource_changes
                .iter()
                .map(|rc| {
                    let v = rc.change.values();
                    format!(
                        "{} {}",
                        rc.address,
                        serde_json::to_string(&v.get().after).unwrap()
                    )
                })
                .collect::<Vec<_>>()
        };
        let whole = Plan::read_whole_up_to(doc.as_bytes(), doc.len()).unwrap();
        for limit in [0, 1, doc.len() / 2, doc.len() - 1] {
            let streamed = Plan::read_whole_up_to(doc.as_bytes(), limit).unwrap();
            assert_eq!(shown(&streamed), shown(&whole), "limit {limit}");
        }
        assert_eq!(shown(&whole).len(), 50);
        // Not a plan, either way.
        for bad in ["{\"resource_changes\": []}", "[1, 2", "{}"] {
            for limit in [0, READ_WHOLE_UP_TO] {
                assert!(
                    Plan::read_whole_up_to(bad.as_bytes(), limit).is_err(),
                    "{bad} {limit}"
                );
            }
        }
    }

    #[test]
    fn a_changes_values_read_as_the_whole_document_reads_them_escapes_and_numbers_included() {
        // Keys and strings with escapes (Go writes `<`, `>` and `&` as `\u003c`…), numbers of
        // every kind, nesting: each value reads as serde_json reads it, none turns to null.
        let text = r#"{"address": "t.x", "mode": "managed", "change": {"actions": ["update"],
            "before": {"a\"b": "x\ny", "\u003ctag\u003e": "\u0026", "n": 1.0, "big": 18446744073709551615,
                       "neg": -3, "f": 2.5e-7, "e": 1e21, "list": [[], {}, null, true]},
            "after": {"ключ": "значение\t", "nested": [{"k\\": [1, 2.0, "3"]}]},
            "after_unknown": {"nested": [{"k\\": [false, true]}]},
            "before_sensitive": {"a\"b": true}, "after_sensitive": {}}}"#;
        let want: Value = serde_json::from_str(text).unwrap();
        let rc: ResourceChange = serde_json::from_str(text).unwrap();
        let v = rc.change.values();
        let v = v.get();
        for (name, read) in [
            ("before", &v.before),
            ("after", &v.after),
            ("after_unknown", &v.after_unknown),
            ("before_sensitive", &v.before_sensitive),
            ("after_sensitive", &v.after_sensitive),
        ] {
            assert_eq!(
                serde_json::to_value(read).unwrap(),
                want["change"][name],
                "{name}"
            );
            assert_eq!(
                serde_json::to_string(read).unwrap(),
                serde_json::to_string(&want["change"][name]).unwrap(),
                "{name}: the same text, number by number"
            );
        }
        assert_eq!(v.before.get("a\"b").as_str(), Some("x\ny"));
        assert_eq!(v.before.get("<tag>").as_str(), Some("&"));
    }

    #[test]
    fn values_read_back_exactly_before_and_after_the_plan_dictionary_is_built() {
        // Enough changes that the first ones build the dictionary and the rest use it; two
        // plans read in turn on one thread, each with its own.
        let doc = |tag: &str| {
            let changes: Vec<Value> = (0..200)
                .map(|i| {
                    json!({"address": format!("t.x[{i}]"), "mode": "managed", "change": {
                        "actions": ["update"],
                        "before": {"name": format!("{tag}-{i}"), "cores": 2, "tags": ["a", "b"]},
                        "after": {"name": format!("{tag}-{i}"), "cores": 4, "tags": ["a", "b", tag]},
                        "after_unknown": {"id": true}, "before_sensitive": {}, "after_sensitive": {}}})
                })
                .collect();
            json!({"format_version": "1.2", "resource_changes": changes})
        };
        for tag in ["first", "second"] {
            let d = doc(tag);
            let plan = Plan::from_json(d.to_string().as_bytes()).unwrap();
            for (rc, want) in plan
                .resource_changes
                .iter()
                .zip(d["resource_changes"].as_array().unwrap())
            {
                let v = rc.change.values();
                let read = |v: &Json| serde_json::to_value(v).unwrap();
                assert_eq!(
                    read(&v.get().before),
                    want["change"]["before"],
                    "{}",
                    rc.address
                );
                assert_eq!(
                    read(&v.get().after),
                    want["change"]["after"],
                    "{}",
                    rc.address
                );
                assert_eq!(
                    read(&v.get().after_unknown),
                    want["change"]["after_unknown"]
                );
            }
            assert!(plan
                .resource_changes
                .last()
                .unwrap()
                .change
                .values
                .dict
                .is_some());
        }
        // A change read on its own (no plan being read) still reads back.
        let rc: ResourceChange = serde_json::from_value(
            json!({"address": "a.b", "change": {"actions": ["create"], "after": {"k": "v"}}}),
        )
        .unwrap();
        let v = rc.change.values();
        assert_eq!(
            serde_json::to_value(&v.get().after).unwrap(),
            json!({"k": "v"})
        );
    }

    #[test]
    fn sensitive_leaves_read_from_the_text_are_those_the_masks_mark_in_the_parsed_values() {
        // Masks of every shape against values of every shape, fitting or not.
        let cases = [
            (
                json!({"a": "x", "b": {"c": "deep", "d": 7}}),
                json!({"b": {"c": true}}),
            ),
            (
                json!({"l": ["l0", "l1", "l2"], "n": 2.5}),
                json!({"l": [false, true], "n": true}),
            ),
            (
                json!({"w": {"k": "whole", "n": [1, -2, 1e100, null, true]}}),
                json!({"w": true}),
            ),
            (
                json!({"s": [{"p": "open"}, {"p": "set"}]}),
                json!({"s": [{}, {"p": true}]}),
            ),
            (json!({"o": {"k": "v"}}), json!({"o": [true]})),
            (json!({"o": ["a", "b"]}), json!({"o": {"x": true}})),
            (json!({"o": "scalar"}), json!({"o": {"x": true}})),
            (json!({"o": "scalar"}), json!({"o": {"x": false}})),
            (json!("top"), json!(true)),
            (json!({"k": "v"}), json!(false)),
            (json!({"k": "v"}), json!({})),
        ];
        for (value, mask) in cases {
            let mut want = Vec::new();
            for_each_masked_leaf(&value, &mask, &mut |s| want.push(s));
            let plan = Plan::from_value(json!({"format_version": "1.2", "resource_changes": [
                {"address": "x.y", "mode": "managed", "change": {"actions": ["update"],
                  "before": value, "after": value, "before_sensitive": mask, "after_sensitive": mask}}]}))
            .unwrap();
            let mut got = Vec::new();
            plan.resource_changes[0]
                .change
                .for_each_sensitive_leaf(&mut |s| got.push(s));
            want.extend(want.clone());
            want.sort();
            got.sort();
            assert_eq!(got, want, "value {value} mask {mask}");
        }
    }

    #[test]
    fn keys_spelt_with_escapes_read_as_the_keys_they_spell() {
        // Keys are borrowed from the document where they hold no escape; one that holds an
        // escape (any key may) reads the same, read whole or as it comes.
        let plain = r#"{"format_version":"1.2","resource_changes":[{"address":"x.y","mode":"managed",
              "change":{"actions":["delete","create"],"after":{"key":"change-secret","open":"o"},
                "after_sensitive":{"key":true}}}],
              "prior_state":{"values":{"outputs":{"o":{"sensitive":true,"value":"output-secret"}},
                "root_module":{"resources":[{"values":{"key":"state-secret"},"sensitive_values":{"key":true}}],
                  "child_modules":[{"resources":[{"values":{"k":["open","child-secret"]},"sensitive_values":{"k":[false,true]}}]}]}}}}"#;
        let escaped = plain
            .replace(r#""actions""#, r#""\u0061ctions""#)
            .replace(r#""after_sensitive""#, r#""after_sensitiv\u0065""#)
            .replace(r#""key""#, r#""k\u0065y""#)
            .replace(r#""sensitive_values""#, r#""sensitive_v\u0061lues""#)
            .replace(r#""child_modules""#, r#""child\u005fmodules""#)
            .replace(r#""root_module""#, r#""root_modul\u0065""#)
            .replace(r#""values""#, r#""v\u0061lues""#);
        assert_eq!(escaped.matches(r"\u00").count(), 13, "{escaped}");
        let read = |doc: &str, limit: usize| {
            let plan = Plan::read_whole_up_to(doc.as_bytes(), limit).unwrap();
            let secrets = crate::core::redact::Secrets::from_plan(&plan);
            let kind = plan.resource_changes[0].kind();
            (secrets.iter().map(str::to_string).collect::<Vec<_>>(), kind)
        };
        let want = (
            [
                "change-secret",
                "child-secret",
                "output-secret",
                "state-secret",
            ]
            .map(String::from)
            .to_vec(),
            ActionKind::DeleteThenCreate,
        );
        for doc in [plain, escaped.as_str()] {
            assert_eq!(read(doc, doc.len()), want, "read whole: {doc}");
            assert_eq!(read(doc, 16), want, "read as it comes: {doc}");
        }
    }

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
        // No action is no change; any other list is unknown, never a neighbour's kind.
        assert_eq!(k(&[]), ActionKind::NoOp);
        for other in [
            &["delete", "forget"][..],
            &["create", "create"],
            &["update", "create"],
            &["no-op", "create"],
            &["delete", "create", "delete"],
            &[""],
        ] {
            assert_eq!(k(other), ActionKind::Unknown, "{other:?}");
        }
    }

    #[test]
    fn module_call_names_skip_instance_keys() {
        assert_eq!(module_call_names(""), Vec::<String>::new());
        assert_eq!(module_call_names("module.a"), vec!["a"]);
        assert_eq!(
            module_call_names(r#"module.a["x.y]\"z"].module.b[3].module.c"#),
            vec!["a", "b", "c"]
        );
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
