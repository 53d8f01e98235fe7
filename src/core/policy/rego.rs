//! One set in the `regorus` interpreter, conftest's way: every `.rego` file loaded (Rego v1, or
//! the older syntax when a file is not v1), the namespace's `deny*`/`violation*`/`warn*` rules
//! evaluated one by one within the set's time budget, their values read as messages.

use super::{InputReads, Message, PolicyError, PolicyFile, PolicySet, Results};
use crate::core::proxmox::findings::Finding;
use regorus::utils::limits::ExecutionTimerConfig;
use regorus::{Engine, LimitError, Value};
use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

/// Interpreter steps between two looks at the clock (a look costs a few tens of nanoseconds).
const STEPS_PER_CLOCK_CHECK: u32 = 16;

/// The plan document read into the interpreter's values: the costly part of an evaluation
/// (a 5,000-resource plan takes longer to read than its rules take to run), done once per
/// plan and shared by every set, and free to run before planbot's findings are known.
#[derive(Clone)]
pub struct PlanDocument {
    input: Value,
}

impl std::fmt::Debug for PlanDocument {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values: the plan holds secrets in clear.
        f.write_str("PlanDocument")
    }
}

impl PlanDocument {
    /// Read a `show -json` document, all of it.
    pub fn read(plan_json: &str) -> Result<PlanDocument, PolicyError> {
        PlanDocument::read_for(plan_json, &InputReads::Whole)
    }

    /// Read the parts of a `show -json` document the policies can read (`reads`, from their
    /// text): the other top-level keys are skipped, unparsed, and are absent from `input`.
    pub fn read_for(plan_json: &str, reads: &InputReads) -> Result<PlanDocument, PolicyError> {
        let input = match reads {
            InputReads::Whole => Value::from_json_str(plan_json),
            InputReads::Keys(_) => {
                let top: BTreeMap<String, &serde_json::value::RawValue> =
                    serde_json::from_str(plan_json)
                        .map_err(|e| PolicyError::Input(e.to_string()))?;
                let mut kept = String::with_capacity(plan_json.len());
                kept.push('{');
                for (key, value) in top.iter().filter(|(key, _)| reads.reads(key)) {
                    if kept.len() > 1 {
                        kept.push(',');
                    }
                    let key = serde_json::to_string(key)
                        .map_err(|e| PolicyError::Input(e.to_string()))?;
                    kept.push_str(&key);
                    kept.push(':');
                    kept.push_str(value.get());
                }
                kept.push('}');
                Value::from_json_str(&kept)
            }
        }
        .map_err(|e| PolicyError::Input(e.to_string()))?;
        Ok(PlanDocument { input })
    }
}

/// The plan document and `data.planbot`, as every set of one evaluation sees them.
pub(super) struct Document<'a> {
    plan: &'a PlanDocument,
    data: Value,
}

impl<'a> Document<'a> {
    pub(super) fn new(
        plan: &'a PlanDocument,
        findings: &[Finding],
        root: &str,
        capacity: Option<&serde_json::Value>,
    ) -> Document<'a> {
        let data = serde_json::json!({
            "planbot": super::planbot_data_with(findings, root, capacity),
        });
        Document {
            plan,
            data: Value::from(data),
        }
    }
}

/// A rule conftest reads: `deny`, `violation` (failures) or `warn` (warnings), alone or with
/// `_suffix`es (`deny_public_ip`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Failure,
    Warning,
}

fn kind_of(rule: &str) -> Option<Kind> {
    let suffixes_ok = |rest: &str| {
        rest.is_empty()
            || rest.strip_prefix('_').is_some_and(|r| {
                r.split('_')
                    .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric()))
            })
    };
    for (prefix, kind) in [
        ("deny", Kind::Failure),
        ("violation", Kind::Failure),
        ("warn", Kind::Warning),
    ] {
        if let Some(rest) = rule.strip_prefix(prefix) {
            if suffixes_ok(rest) {
                return Some(kind);
            }
        }
    }
    None
}

/// The parse work a file of nested `[` and `{` may cost, at most: regorus's parser backtracks
/// on them (an array or a comprehension, an object or a set), so its time grows about twofold
/// per level — an array literal 16 deep took 1.3 s of a debug build, 30 deep would take an
/// hour, and every plan loads the default branch's sets. [`parse_cost`] counts `2^(depth-1)`
/// for each `[` or `{` opened `depth` deep.
pub const MAX_PARSE_COST: u64 = 1 << 18;

/// Whether `text` stays within [`MAX_PARSE_COST`]; otherwise the line where it went past.
/// Strings (`"…"`, `` `…` ``) and comments (`#`) are skipped; a stray closer never lowers the
/// depth below zero.
pub fn parse_cost(text: &str) -> Result<u64, usize> {
    let b = text.as_bytes();
    let (mut depth, mut cost, mut line, mut i) = (0u32, 0u64, 1usize, 0usize);
    while i < b.len() {
        match b[i] {
            b'\n' => line += 1,
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'`' => {
                i += 1;
                while i < b.len() && b[i] != b'`' {
                    if b[i] == b'\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
            b'[' | b'{' => {
                depth += 1;
                cost = cost.saturating_add(1u64 << (depth - 1).min(62));
                if cost > MAX_PARSE_COST {
                    return Err(line);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(cost)
}

/// Load one file: as Rego v1 first, then in the older syntax (`deny[msg] { … }`). When both
/// fail, the error of the parse that got further is the one shown. A file whose nesting would
/// cost the parser more than [`MAX_PARSE_COST`] is refused unparsed.
fn load(engine: &mut Engine, file: &PolicyFile) -> Result<(), PolicyError> {
    if let Err(line) = parse_cost(&file.text) {
        return Err(PolicyError::Parse {
            file: file.path.clone(),
            message: format!(
                "line {line}: `[` and `{{` nest too deeply, or too often deeply, for planbot to parse (the policy parser's time doubles with each level): refused unparsed"
            ),
        });
    }
    engine.set_rego_v0(false);
    let v1 = match engine.add_policy(file.path.clone(), file.text.clone()) {
        Ok(_) => return Ok(()),
        Err(e) => e.to_string(),
    };
    engine.set_rego_v0(true);
    let v0 = engine.add_policy(file.path.clone(), file.text.clone());
    engine.set_rego_v0(false);
    match v0 {
        Ok(_) => Ok(()),
        Err(v0) => {
            let v0 = v0.to_string();
            let message = if position(&v0) > position(&v1) {
                v0
            } else {
                v1
            };
            Err(PolicyError::Parse {
                file: file.path.clone(),
                message: message.trim().to_string(),
            })
        }
    }
}

/// The `line:column` regorus puts after the file name of an error (`p.rego:3:7: error: …`).
fn position(message: &str) -> (u32, u32) {
    let mut numbers = message
        .split(':')
        .skip(1)
        .map_while(|part| part.trim().parse::<u32>().ok());
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}

/// The rules of the namespace's modules conftest reads, each with its number of definitions
/// (conftest counts a success per definition that produced nothing), in the order of the
/// files; whether the namespace has an `exception` rule; and every package seen.
struct Rules {
    counted: Vec<(String, usize)>,
    has_exception: bool,
    packages: Vec<String>,
}

/// regorus has no stable listing of a package's rules: its (unstable) syntax tree is read,
/// through the version `Cargo.lock` pins; a change there fails the build, not the behaviour.
fn rules(engine: &mut Engine, namespace: &str) -> Rules {
    use regorus::unstable::{Rule, RuleHead};
    let packages = engine.get_packages().unwrap_or_default();
    let wanted = format!("data.{namespace}");
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut has_exception = false;
    for (module, package) in engine.get_modules().iter().zip(&packages) {
        if *package != wanted {
            continue;
        }
        for rule in &module.policy {
            let refr = match rule.as_ref() {
                Rule::Spec {
                    head: RuleHead::Compr { refr, .. } | RuleHead::Set { refr, .. },
                    ..
                } => refr,
                Rule::Default { refr, .. } => refr,
                Rule::Spec {
                    head: RuleHead::Func { .. },
                    ..
                } => continue,
            };
            let text = refr.span().text();
            let name: String = text
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name == "exception" {
                has_exception = true;
            }
            if kind_of(&name).is_none() {
                continue;
            }
            if !counts.contains_key(&name) {
                order.push(name.clone());
            }
            *counts.entry(name).or_default() += 1;
        }
    }
    let mut seen: Vec<String> = Vec::new();
    for p in packages {
        let p = p.strip_prefix("data.").unwrap_or(&p).to_string();
        if !seen.contains(&p) {
            seen.push(p);
        }
    }
    Rules {
        counted: order
            .into_iter()
            .map(|n| {
                let c = counts[&n];
                (n, c)
            })
            .collect(),
        has_exception,
        packages: seen,
    }
}

/// A set's files loaded into a fresh interpreter, and the rules of its namespace; every
/// problem that does not need a plan (no file, a parse error, no rule) is found here.
fn load_set(set: &PolicySet) -> Result<(Engine, Rules), PolicyError> {
    if set.files.is_empty() {
        return Err(PolicyError::NoFiles);
    }
    let mut engine = Engine::new();
    // As OPA (and so conftest) by default: a builtin's error makes its expression undefined
    // instead of stopping the evaluation (regorus still stops on some type errors).
    engine.set_strict_builtin_errors(false);
    // `print()` output is kept in the engine and dropped, never written to planbot's stderr.
    engine.set_gather_prints(true);
    for file in &set.files {
        load(&mut engine, file)?;
    }
    let rules = rules(&mut engine, &set.namespace);
    if rules.counted.is_empty() {
        return Err(PolicyError::NoRules {
            namespace: set.namespace.clone(),
            found: if rules.packages.is_empty() {
                "none".into()
            } else {
                rules.packages.join(", ")
            },
        });
    }
    Ok((engine, rules))
}

/// Whether a set can be evaluated at all: its files parse and its package has rules.
pub(super) fn check_set(set: &PolicySet) -> Result<(), PolicyError> {
    load_set(set).map(|_| ())
}

/// Evaluate one set over the document.
pub(super) fn evaluate_set(doc: &Document<'_>, set: &PolicySet) -> Result<Results, PolicyError> {
    let (mut engine, rules) = load_set(set)?;
    engine
        .add_data(doc.data.clone())
        .map_err(|e| PolicyError::Eval {
            rule: "data.planbot".into(),
            message: e.to_string(),
        })?;
    engine.set_input(doc.plan.input.clone());
    let budget = Budget {
        started: Instant::now(),
        limit: set.limit,
    };
    let exceptions = if rules.has_exception {
        let rule = format!("data.{}.exception", set.namespace);
        budget.arm(&mut engine)?;
        let value = engine
            .eval_rule(rule.clone())
            .map_err(|e| budget.error(&rule, e))?;
        excepted_names(&value)
    } else {
        Vec::new()
    };
    let mut results = Results::default();
    for (rule, definitions) in &rules.counted {
        let path = format!("data.{}.{rule}", set.namespace);
        budget.arm(&mut engine)?;
        let value = engine
            .eval_rule(path.clone())
            .map_err(|e| budget.error(&path, e))?;
        let messages = messages(&path, value)?;
        let name = rule
            .strip_prefix("deny_")
            .or_else(|| rule.strip_prefix("violation_"))
            .unwrap_or(rule);
        let excepted = exceptions.iter().filter(|n| *n == name).count();
        let produced = if excepted > 0 {
            let query = format!("data.{}.exception[_][_] == {:?}", set.namespace, name);
            results
                .exceptions
                .extend((0..excepted).map(|_| Message::new(query.clone())));
            excepted
        } else {
            let n = messages.len();
            match kind_of(rule) {
                Some(Kind::Failure) => results.failures.extend(messages),
                _ => results.warnings.extend(messages),
            }
            n
        };
        results.successes += definitions.saturating_sub(produced);
    }
    Ok(results)
}

/// The set's wall-clock budget, handed to regorus's cooperative timer before each rule.
struct Budget {
    started: Instant,
    limit: Duration,
}

impl Budget {
    fn arm(&self, engine: &mut Engine) -> Result<(), PolicyError> {
        let left = self.limit.saturating_sub(self.started.elapsed());
        if left.is_zero() {
            return Err(PolicyError::Limit { limit: self.limit });
        }
        engine.set_execution_timer_config(ExecutionTimerConfig {
            limit: left,
            check_interval: NonZeroU32::new(STEPS_PER_CLOCK_CHECK).unwrap_or(NonZeroU32::MIN),
        });
        Ok(())
    }

    fn error(&self, rule: &str, e: anyhow::Error) -> PolicyError {
        let over = e.chain().any(|c| {
            matches!(
                c.downcast_ref::<LimitError>(),
                Some(LimitError::TimeLimitExceeded { .. })
            )
        });
        if over || self.started.elapsed() > self.limit {
            PolicyError::Limit { limit: self.limit }
        } else {
            PolicyError::Eval {
                rule: rule.to_string(),
                message: e.to_string().trim().to_string(),
            }
        }
    }
}

/// The rule names an `exception` rule lists (a set of arrays of names, conftest's shape).
fn excepted_names(value: &Value) -> Vec<String> {
    let mut names = Vec::new();
    let mut each = |v: &Value| {
        for inner in elements(v) {
            if let Value::String(s) = inner {
                names.push(s.to_string());
            }
        }
    };
    for v in elements(value) {
        each(&v);
    }
    names
}

/// The members of a set or an array (nothing for anything else).
fn elements(value: &Value) -> Vec<Value> {
    match value {
        Value::Set(s) => s.iter().cloned().collect(),
        Value::Array(a) => a.iter().cloned().collect(),
        _ => Vec::new(),
    }
}

/// A rule's value as conftest reads it: a set (or array) of strings or of objects with a string
/// `msg`. Undefined or empty is no message. Anything else is an error, never a pass: conftest
/// would quietly count `deny if { … }` (a boolean) as a success.
fn messages(rule: &str, value: Value) -> Result<Vec<Message>, PolicyError> {
    let bad = |found: String| PolicyError::BadResult {
        rule: rule.to_string(),
        found,
    };
    let items = match &value {
        Value::Undefined => return Ok(Vec::new()),
        Value::Set(_) | Value::Array(_) => elements(&value),
        other => return Err(bad(describe(other))),
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match &item {
            Value::String(s) => out.push(Message::new(s.to_string())),
            Value::Object(_) => {
                let json: serde_json::Value = serde_json::to_value(&item)
                    .map_err(|e| bad(format!("an object that is not JSON ({e})")))?;
                let serde_json::Value::Object(mut map) = json else {
                    return Err(bad(describe(&item)));
                };
                let Some(serde_json::Value::String(msg)) = map.remove("msg") else {
                    return Err(bad("an object without a string \"msg\"".into()));
                };
                map.remove("_loc");
                out.push(Message { msg, metadata: map });
            }
            other => return Err(bad(format!("a set holding {}", describe(other)))),
        }
    }
    Ok(out)
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(_) => "a number".into(),
        Value::String(_) => "a string".into(),
        Value::Array(_) => "an array".into(),
        Value::Set(_) => "a set".into(),
        Value::Object(_) => "an object".into(),
        Value::Undefined => "nothing".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conftest_rule_names() {
        assert_eq!(kind_of("deny"), Some(Kind::Failure));
        assert_eq!(kind_of("deny_public_ip"), Some(Kind::Failure));
        assert_eq!(kind_of("violation"), Some(Kind::Failure));
        assert_eq!(kind_of("warn_big_vm2"), Some(Kind::Warning));
        assert_eq!(kind_of("denylist"), None);
        assert_eq!(kind_of("warning"), None);
        assert_eq!(kind_of("deny_"), None);
        assert_eq!(kind_of("deny__x"), None);
    }

    #[test]
    fn regorus_error_positions() {
        assert_eq!(position("p.rego:3:7: error: x"), (3, 7));
        assert_eq!(position("no position"), (0, 0));
    }

    #[test]
    fn deeply_nested_literals_are_refused_unparsed_and_real_policies_pass() {
        // 30 deep: an hour of the parser's time (16 deep took 1.3 s); refused at once.
        let deep = format!(
            "package x\nimport rego.v1\nv := {}1{}\n",
            "[".repeat(30),
            "]".repeat(30)
        );
        let file = PolicyFile {
            path: "deep.rego".into(),
            text: deep,
        };
        let mut engine = Engine::new();
        let err = load(&mut engine, &file).unwrap_err().to_string();
        assert!(err.contains("line 3: `[` and `{` nest too deeply"), "{err}");
        // Brackets in strings, raw strings and comments are not nesting.
        let hidden = format!(
            "package x\n# {}\nv := \"{}\"\nw := `{}`\n",
            "[".repeat(40),
            "{".repeat(40),
            "[".repeat(40)
        );
        assert_eq!(parse_cost(&hidden), Ok(0));
        // Closers in strings do not hide nesting.
        let sneaky = format!("v := {}1{}\n", "[\"]\", ".repeat(30), "]".repeat(30));
        assert!(parse_cost(&sneaky).is_err());
        // A real policy costs a few hundred.
        let real = r#"package planbot.backups
import rego.v1
deny contains msg if {
  some r in input.resource_changes
  r.type == "proxmox_virtual_environment_vm"
  not r.change.after.tags[_] == "backup"
  msg := sprintf("%s has no backup tag", [r.address])
}
allowed := {"a": ["x", "y"], "b": {"c": [1, 2]}}
"#;
        let cost = parse_cost(real).unwrap();
        assert!(cost < 100, "{cost}");
        load(
            &mut Engine::new(),
            &PolicyFile {
                path: "real.rego".into(),
                text: real.into(),
            },
        )
        .unwrap();
    }
}
