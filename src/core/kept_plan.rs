//! What of a root's plan may be kept outside the run that made it (in the store, for a later
//! push or another replica): its `show -json` with every secret replaced, and its secrets as
//! keyed digests ([`crate::core::redact::SecretDigests`]). Nothing kept holds a secret in clear.
//!
//! The redacted document reads as the plan did: every value a mask marks sensitive becomes a
//! token made of [`REDACTED`] and the value's keyed digest (two different secrets stay
//! different, so a changed password still shows as changed), every known secret inside any
//! other string is scrubbed, and a number that holds a known secret becomes a token too. Masks, actions, addresses and the shape of every value are kept, so the note, the lint
//! rules and the policies read it as they read the plan.

use crate::core::plan::mask_has_true;
use crate::core::redact::{DigestKey, Scrubber, REDACTED};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// `plan_json` (a `show -json` document) with every value its masks mark sensitive replaced,
/// and every secret `scrubber` knows (the plan's own, the run's, those of the plans it is shown
/// beside) scrubbed from every string, a number holding one replaced; the tokens are digests
/// under `key`.
///
/// The document is never held parsed whole: its objects are read as raw entries, and each
/// resource (of the changes, the drift, the planned values and the prior state, in every
/// module) is parsed, redacted and written out on its own; the other parts (the outputs, the
/// variables, the configuration) are parsed one part at a time.
pub fn redacted_document(
    plan_json: &[u8],
    scrubber: &Scrubber,
    key: DigestKey,
) -> Result<Vec<u8>, serde_json::Error> {
    let text = std::str::from_utf8(plan_json).map_err(serde::de::Error::custom)?;
    let doc: &RawValue = serde_json::from_str(text)?;
    let tokens = Tokens { key };
    let sensitive_vars = match entries(text)?.iter().find(|(k, _)| k == "configuration") {
        Some((_, raw)) => sensitive_variables(&serde_json::from_str(raw.get())?),
        None => Vec::new(),
    };
    let mut out = Writer::new(plan_json.len());
    tokens.object(doc, &mut out, scrubber, |name, raw, out| {
        match name {
            "resource_changes" | "resource_drift" => out.each(raw, |rc: &mut Value| {
                if let Some(change) = rc.get_mut("change").and_then(Value::as_object_mut) {
                    tokens.masked_pair(change, "before", "before_sensitive");
                    tokens.masked_pair(change, "after", "after_sensitive");
                }
                tokens.scrubbed(rc, scrubber);
            })?,
            "planned_values" => tokens.state_values(raw, out, scrubber)?,
            "prior_state" => tokens.object(raw, out, scrubber, |part, raw, out| {
                if part != "values" {
                    return Ok(false);
                }
                tokens.state_values(raw, out, scrubber)?;
                Ok(true)
            })?,
            "output_changes" => out.value(raw, |outputs| {
                if let Some(outputs) = outputs.as_object_mut() {
                    for change in outputs.values_mut().filter_map(Value::as_object_mut) {
                        tokens.masked_pair(change, "before", "before_sensitive");
                        tokens.masked_pair(change, "after", "after_sensitive");
                    }
                }
                tokens.scrubbed(outputs, scrubber);
            })?,
            "variables" => out.value(raw, |vars| {
                if let Some(vars) = vars.as_object_mut() {
                    for (name, var) in vars.iter_mut() {
                        if sensitive_vars.contains(name) {
                            if let Some(value) = var.get_mut("value") {
                                tokens.all(value);
                            }
                        }
                    }
                }
                tokens.scrubbed(vars, scrubber);
            })?,
            "configuration" => out.value(raw, |config| {
                if let Some(module) = config.get_mut("root_module") {
                    tokens.sensitive_defaults(module);
                }
                tokens.scrubbed(config, scrubber);
            })?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    Ok(out.into_bytes())
}

/// An object's entries as their raw JSON text, in order.
fn entries(text: &str) -> Result<Vec<(String, &RawValue)>, serde_json::Error> {
    struct Entries<'a>(Vec<(String, &'a RawValue)>);
    impl<'de> serde::Deserialize<'de> for Entries<'de> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Entries<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Entries<'de>, A::Error> {
                    let mut all = Vec::new();
                    while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                        all.push(entry);
                    }
                    Ok(Entries(all))
                }
            }
            d.deserialize_map(Visit)
        }
    }
    Ok(serde_json::from_str::<Entries>(text)?.0)
}

/// The redacted document as it is written, part after part.
struct Writer {
    out: Vec<u8>,
    /// Whether the object or array being written has had an item yet.
    first: Vec<bool>,
}

impl Writer {
    fn new(capacity: usize) -> Writer {
        Writer {
            out: Vec::with_capacity(capacity),
            first: Vec::new(),
        }
    }

    fn open(&mut self) {
        self.out.push(b'{');
        self.first.push(true);
    }

    fn close(&mut self) {
        self.out.push(b'}');
        self.first.pop();
    }

    fn comma(&mut self) {
        if let Some(first) = self.first.last_mut() {
            if !std::mem::replace(first, false) {
                self.out.push(b',');
            }
        }
    }

    /// An object's key, scrubbed.
    fn key(&mut self, name: &str, scrubber: &Scrubber) {
        self.comma();
        let name = scrubber.scrub(name);
        serde_json::to_writer(&mut self.out, name.as_ref()).expect("a string serialises");
        self.out.push(b':');
    }

    /// `raw` parsed, changed by `redact`, written.
    fn value(
        &mut self,
        raw: &RawValue,
        redact: impl FnOnce(&mut Value),
    ) -> Result<(), serde_json::Error> {
        let mut v: Value = serde_json::from_str(raw.get())?;
        redact(&mut v);
        serde_json::to_writer(&mut self.out, &v)
    }

    /// An array whose items are each parsed, changed by `redact` and written on their own (a
    /// value that is not an array is written as [`Writer::value`] would).
    fn each(
        &mut self,
        raw: &RawValue,
        mut redact: impl FnMut(&mut Value),
    ) -> Result<(), serde_json::Error> {
        let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(raw.get()) else {
            return self.value(raw, redact);
        };
        self.items(items, |item, out| out.value(item, &mut redact))
    }

    /// `items` as an array, each written by `write`.
    fn items<'a>(
        &mut self,
        items: Vec<&'a RawValue>,
        mut write: impl FnMut(&'a RawValue, &mut Writer) -> Result<(), serde_json::Error>,
    ) -> Result<(), serde_json::Error> {
        self.out.push(b'[');
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            write(item, self)?;
        }
        self.out.push(b']');
        Ok(())
    }

    fn into_bytes(self) -> Vec<u8> {
        self.out
    }
}

/// The names of the root variables declared `sensitive`, from the `configuration` part.
fn sensitive_variables(config: &Value) -> Vec<String> {
    config
        .pointer("/root_module/variables")
        .and_then(Value::as_object)
        .map(|vars| {
            vars.iter()
                .filter(|(_, v)| v.get("sensitive").and_then(Value::as_bool) == Some(true))
                .map(|(name, _)| name.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// What replaces a sensitive value: [`REDACTED`] with the value's digest.
struct Tokens {
    key: DigestKey,
}

impl Tokens {
    fn token(&self, leaf: &Value) -> Value {
        let digest = self.key.digest(leaf.to_string().as_bytes());
        Value::String(format!("{REDACTED} {digest:016x}"))
    }

    /// Every leaf of `value` (strings, numbers, booleans) a token; keys and nulls kept.
    fn all(&self, value: &mut Value) {
        match value {
            Value::Null => {}
            Value::Array(items) => items.iter_mut().for_each(|v| self.all(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.all(v)),
            leaf => *leaf = self.token(leaf),
        }
    }

    /// Every leaf of `value` that `mask` marks sensitive a token (the masks' reading of
    /// [`crate::core::plan::for_each_masked_leaf`]).
    fn masked(&self, value: &mut Value, mask: &Value) {
        match (mask, value) {
            (Value::Bool(true), v) => self.all(v),
            (Value::Object(m), Value::Object(v)) => {
                for (k, sub) in m {
                    if let Some(val) = v.get_mut(k) {
                        self.masked(val, sub);
                    }
                }
            }
            (Value::Array(m), Value::Array(v)) => {
                for (sub, val) in m.iter().zip(v.iter_mut()) {
                    self.masked(val, sub);
                }
            }
            (m, v) if mask_has_true(m) => self.all(v),
            _ => {}
        }
    }

    /// `change[value]` under `change[mask]`.
    fn masked_pair(&self, change: &mut Map<String, Value>, value: &str, mask: &str) {
        let Some(mask) = change.get(mask).cloned() else {
            return;
        };
        if let Some(v) = change.get_mut(value) {
            self.masked(v, &mask);
        }
    }

    /// An object written part by part: each part by `part`, or parsed and scrubbed when
    /// `part` leaves it (returns `false`); a value that is not an object, parsed and scrubbed.
    fn object<'a>(
        &self,
        raw: &'a RawValue,
        out: &mut Writer,
        scrubber: &Scrubber,
        mut part: impl FnMut(&str, &'a RawValue, &mut Writer) -> Result<bool, serde_json::Error>,
    ) -> Result<(), serde_json::Error> {
        let Ok(parts) = entries(raw.get()) else {
            return out.value(raw, |v| self.scrubbed(v, scrubber));
        };
        out.open();
        for (name, raw) in parts {
            out.key(&name, scrubber);
            if !part(&name, raw, out)? {
                out.value(raw, |v| self.scrubbed(v, scrubber))?;
            }
        }
        out.close();
        Ok(())
    }

    /// A state's values (`planned_values`, `prior_state.values`), written: sensitive outputs,
    /// and each resource's values under its `sensitive_values`, in every module, a resource at
    /// a time.
    fn state_values(
        &self,
        raw: &RawValue,
        out: &mut Writer,
        scrubber: &Scrubber,
    ) -> Result<(), serde_json::Error> {
        self.object(raw, out, scrubber, |part, raw, out| {
            match part {
                "outputs" => out.value(raw, |outputs| {
                    if let Some(outputs) = outputs.as_object_mut() {
                        for output in outputs.values_mut().filter_map(Value::as_object_mut) {
                            if output.get("sensitive").and_then(Value::as_bool) == Some(true) {
                                if let Some(v) = output.get_mut("value") {
                                    self.all(v);
                                }
                            }
                        }
                    }
                    self.scrubbed(outputs, scrubber);
                })?,
                "root_module" => self.state_module(raw, out, scrubber)?,
                _ => return Ok(false),
            }
            Ok(true)
        })
    }

    /// A state's module: each resource's values under its `sensitive_values`, a resource at a
    /// time, and its child modules the same way.
    fn state_module(
        &self,
        raw: &RawValue,
        out: &mut Writer,
        scrubber: &Scrubber,
    ) -> Result<(), serde_json::Error> {
        self.object(raw, out, scrubber, |part, raw, out| {
            match part {
                "resources" => out.each(raw, |resource| {
                    if let Some(r) = resource.as_object_mut() {
                        self.masked_pair(r, "values", "sensitive_values");
                    }
                    self.scrubbed(resource, scrubber);
                })?,
                "child_modules" => match serde_json::from_str::<Vec<&RawValue>>(raw.get()) {
                    Ok(children) => out.items(children, |child, out| {
                        self.state_module(child, out, scrubber)
                    })?,
                    Err(_) => return Ok(false),
                },
                _ => return Ok(false),
            }
            Ok(true)
        })
    }

    /// The defaults of the variables declared `sensitive` in a configuration module and the
    /// modules it calls.
    fn sensitive_defaults(&self, module: &mut Value) {
        if let Some(vars) = module.get_mut("variables").and_then(Value::as_object_mut) {
            for var in vars.values_mut().filter_map(Value::as_object_mut) {
                if var.get("sensitive").and_then(Value::as_bool) == Some(true) {
                    if let Some(default) = var.get_mut("default") {
                        self.all(default);
                    }
                }
            }
        }
        if let Some(calls) = module
            .get_mut("module_calls")
            .and_then(Value::as_object_mut)
        {
            for call in calls.values_mut() {
                if let Some(m) = call.get_mut("module") {
                    self.sensitive_defaults(m);
                }
            }
        }
    }

    /// Every string and key of `value` scrubbed of every secret; a number that holds one a
    /// token.
    fn scrubbed(&self, value: &mut Value, scrubber: &Scrubber) {
        match value {
            Value::String(s) => {
                if let std::borrow::Cow::Owned(clean) = scrubber.scrub(s) {
                    *s = clean;
                }
            }
            Value::Number(n) => {
                if scrubber.is_match(&n.to_string()) {
                    *value = self.token(value);
                }
            }
            Value::Bool(_) | Value::Null => {}
            Value::Array(items) => items.iter_mut().for_each(|v| self.scrubbed(v, scrubber)),
            Value::Object(map) => {
                let dirty = map.keys().any(|k| scrubber.is_match(k));
                if dirty {
                    let taken = std::mem::take(map);
                    *map = taken
                        .into_iter()
                        .map(|(k, v)| (scrubber.scrub(&k).into_owned(), v))
                        .collect();
                }
                map.values_mut().for_each(|v| self.scrubbed(v, scrubber));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fingerprint::Fingerprint;
    use crate::core::plan::Plan;
    use crate::core::redact::Secrets;
    use crate::core::render::{render_note, NoteContext, RootOutcome, RootSection};

    fn note(plan: &Plan, scrubber: &Scrubber) -> String {
        let fp = Fingerprint::from_hex(&"ab".repeat(32)).unwrap();
        let roots = [RootSection {
            name: "fleet".into(),
            outcome: RootOutcome::Planned {
                plan,
                findings: &[],
                fingerprint: &fp,
            },
        }];
        render_note(&NoteContext::default(), &roots, scrubber)
    }

    /// Every plan of the fixtures: the redacted document holds no secret of the plan in any
    /// form, and its note (scrubbed with its own secrets and the digests of the original's) is
    /// the original's, byte for byte.
    #[test]
    fn a_redacted_plan_holds_no_secret_and_reads_as_the_plan() {
        let key = DigestKey::derive(b"the fingerprint key");
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/plans");
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let json = std::fs::read(&path).unwrap();
            let plan = Plan::from_json(&json).unwrap();
            let mut secrets = Secrets::from_plan(&plan);
            secrets.add("a-configured-token-1234");
            let redacted = redacted_document(&json, &secrets.scrubber(), key).unwrap();
            let text = String::from_utf8(redacted.clone()).unwrap();
            assert!(
                !secrets.scrubber().is_match(&text),
                "{}: a secret is left in the redacted document",
                path.display()
            );
            let kept = Plan::from_json(&redacted).unwrap();
            let mut known = Secrets::from_plan(&kept);
            known.add_digests(key, &secrets.digests(key));
            assert_eq!(
                note(&kept, &known.scrubber()),
                note(&plan, &secrets.scrubber()),
                "{}",
                path.display()
            );
            checked += 1;
        }
        assert!(checked >= 15, "{checked} plans");
    }

    /// A changed sensitive value stays a change; an unchanged one stays unchanged.
    #[test]
    fn two_different_secrets_stay_different_and_one_stays_equal() {
        let key = DigestKey::derive(b"k");
        let json = br#"{"format_version":"1.2","resource_changes":[{"address":"a.b","mode":"managed","type":"a","name":"b","change":{"actions":["update"],
            "before":{"pw":"old-secret","same":"kept-secret","n":12345},"after":{"pw":"new-secret","same":"kept-secret","n":12345},
            "before_sensitive":{"pw":true,"same":true,"n":true},"after_sensitive":{"pw":true,"same":true,"n":true}}}]}"#;
        let plan = Plan::from_json(json).unwrap();
        let secrets = Secrets::from_plan(&plan);
        let doc: Value =
            serde_json::from_slice(&redacted_document(json, &secrets.scrubber(), key).unwrap())
                .unwrap();
        let change = &doc["resource_changes"][0]["change"];
        assert_ne!(change["before"]["pw"], change["after"]["pw"]);
        assert_eq!(change["before"]["same"], change["after"]["same"]);
        assert!(change["before"]["n"]
            .as_str()
            .unwrap()
            .starts_with(REDACTED));
        assert!(!doc.to_string().contains("secret") && !doc.to_string().contains("12345"));
    }
}
