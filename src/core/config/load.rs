//! From the file's text, the environment and the secret files to one value per key, each with
//! where it came from: unknown keys, sections and `PLANBOT_*` variables are found here.

use super::build::{self, Values, FALLBACK_SECRET};
use super::keys::{self, env_value, Kind, KEYS, POLICY_SETS};
use super::problem::{ConfigError, Loaded, Origin, Problem};
use crate::core::suggest;
use std::collections::BTreeMap;
use toml::Value;

/// The literal placeholder the example config and manifests ship: never a real value.
pub const PLACEHOLDER: &str = "change-me";

/// Every problem of `text` with `env` and the secret files `read_file` reads, and the config
/// built with fallbacks in place of the bad values.
pub(super) fn load_all(
    text: &str,
    env: &[(String, String)],
    read_file: &dyn Fn(&str) -> Result<String, String>,
) -> Loaded {
    let root: toml::Table = match text.parse() {
        Ok(root) => root,
        Err(e) => {
            let e: toml::de::Error = e;
            let line = e.span().map(|span| line_at(text, span.start));
            return Loaded {
                config: None,
                problems: vec![Problem {
                    error: ConfigError::Syntax(e.message().to_string()),
                    origin: Some(Origin::File { line }),
                }],
                warnings: Vec::new(),
                origins: BTreeMap::new(),
            };
        }
    };
    let lines = key_lines(text);
    let mut errors: Vec<(ConfigError, Option<Origin>)> = Vec::new();
    let mut flat: BTreeMap<String, Value> = BTreeMap::new();
    flatten("", root, &mut flat, &mut |error| {
        let line = error.key().and_then(|k| lines.get(k).copied());
        errors.push((error, Some(Origin::File { line })));
    });
    // Every key the file sets, every entry of a table, every `[[policy_sets]]` and its keys.
    let mut origins: BTreeMap<String, Origin> = lines
        .iter()
        .map(|(k, line)| (k.clone(), Origin::File { line: Some(*line) }))
        .collect();
    let warnings = apply_env(env, &mut flat, &mut origins, &mut errors);
    resolve_files(&mut flat, env, read_file, &mut origins, &mut errors);
    check_values(&mut flat, &mut errors);
    let mut values = Values::new(flat);
    let config = build::build(&mut values);
    errors.extend(values.into_problems().into_iter().map(|e| (e, None)));
    let mut problems: Vec<Problem> = Vec::new();
    for (error, origin) in errors {
        let origin = origin.or_else(|| origin_of(&origins, &error));
        let problem = Problem { error, origin };
        if !problems.contains(&problem) {
            problems.push(problem);
        }
    }
    Loaded {
        config: Some(config),
        problems,
        warnings,
        origins,
    }
}

/// The line (1-based) of byte `offset` in `text`.
fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The line of every key the file writes, by dotted path, as the TOML parser read it: tables
/// (`[engine.plan]`, dotted keys, inline tables) and arrays of tables (`policy_sets[1].name`).
fn key_lines(text: &str) -> BTreeMap<String, usize> {
    fn walk(
        text: &str,
        prefix: &str,
        table: &dyn toml_edit::TableLike,
        out: &mut BTreeMap<String, usize>,
    ) {
        for (name, item) in table.iter() {
            let path = if prefix.is_empty() {
                name.to_string()
            } else {
                format!("{prefix}.{name}")
            };
            let span = table
                .key(name)
                .and_then(|k| k.span())
                .or_else(|| item.span());
            if let Some(span) = span {
                out.entry(path.clone())
                    .or_insert_with(|| line_at(text, span.start));
            }
            match item {
                toml_edit::Item::ArrayOfTables(array) => {
                    for (i, t) in array.iter().enumerate() {
                        let at = format!("{path}[{i}]");
                        if let Some(span) = t.span() {
                            out.insert(at.clone(), line_at(text, span.start));
                        }
                        walk(text, &at, t, out);
                    }
                }
                other => {
                    if let Some(t) = other.as_table_like() {
                        walk(text, &path, t, out);
                    }
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(doc) = toml_edit::ImDocument::parse(text) {
        walk(text, "", doc.as_table(), &mut out);
    }
    out
}

/// Whether `path` is one of the free-form tables of engine variables (`engine.env`, …).
fn is_table(path: &str) -> bool {
    keys::key(path).is_some_and(|k| k.kind == Kind::Table)
}

/// Whether `path` is a key, or the `<key>_file` of a secret one.
fn is_key(path: &str) -> bool {
    keys::key(path).is_some()
        || path
            .strip_suffix("_file")
            .and_then(keys::key)
            .is_some_and(|k| k.secret)
}

/// The file's keys as dotted paths; an unknown key or section goes to `unknown`, with the
/// nearest known one.
fn flatten(
    prefix: &str,
    table: toml::Table,
    out: &mut BTreeMap<String, Value>,
    unknown: &mut dyn FnMut(ConfigError),
) {
    for (k, v) in table {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if path == POLICY_SETS || is_key(&path) {
            out.insert(path, v);
            continue;
        }
        match v {
            Value::Table(t) if keys::is_section(&path) => flatten(&path, t, out, unknown),
            Value::Table(_) => unknown(unknown_section(&path)),
            _ => unknown(unknown_key(&path)),
        }
    }
}

/// `[gitlb]`: the nearest section, else the known ones at that level.
fn unknown_section(path: &str) -> ConfigError {
    let sections = keys::sections();
    let hint = match suggest::nearest(path, sections.iter().copied()) {
        Some(s) => format!(" (did you mean `[{s}]`?)"),
        None => {
            let parent = path.rsplit_once('.').map_or("", |(p, _)| p);
            let here: Vec<String> = sections
                .iter()
                .filter(|s| s.rsplit_once('.').map_or("", |(p, _)| p) == parent)
                .map(|s| format!("[{s}]"))
                .collect();
            format!(" (known sections: {})", here.join(", "))
        }
    };
    ConfigError::UnknownSection {
        key: path.to_string(),
        hint,
    }
}

/// `engine.binray`: the nearest key of the same section (or the same name in another
/// section), else the section's keys.
fn unknown_key(path: &str) -> ConfigError {
    let (section, name) = path.rsplit_once('.').unwrap_or(("", path));
    let here: Vec<&str> = KEYS
        .iter()
        .filter(|k| k.section() == section)
        .map(|k| k.path)
        .collect();
    let files: Vec<String> = KEYS
        .iter()
        .filter(|k| k.section() == section && k.secret)
        .map(|k| format!("{}_file", k.path))
        .collect();
    let elsewhere = KEYS
        .iter()
        .find(|k| k.path.rsplit('.').next() == Some(name))
        .map(|k| k.path);
    let candidates = here.iter().copied().chain(files.iter().map(String::as_str));
    let hint = match suggest::nearest(path, candidates).or(elsewhere) {
        Some(k) => format!(" (did you mean `{k}`?)"),
        None if here.is_empty() => String::new(),
        None => format!(" (known keys here: {})", here.join(", ")),
    };
    ConfigError::UnknownKey {
        key: path.to_string(),
        hint,
    }
}

/// Where the value an error is about came from: its key, or the nearest enclosing one
/// (`engine.env.NAME` → `engine.env`), or the `_file` key that named it.
fn origin_of(origins: &BTreeMap<String, Origin>, error: &ConfigError) -> Option<Origin> {
    let key = error.key()?;
    if matches!(error, ConfigError::Missing { .. }) {
        return None;
    }
    let mut k = key;
    loop {
        if let Some(o) = origins.get(k).or_else(|| origins.get(&format!("{k}_file"))) {
            return Some(o.clone());
        }
        k = k.rsplit_once('.')?.0;
    }
}

/// `PLANBOT_*` variables that are not settings of the service: the apply job's
/// (`PLANBOT_URL`, `PLANBOT_CONFIRM`, `PLANBOT_ROOTS`), the Compose file's `PLANBOT_HOST`.
const OTHER_VARIABLES: &[&str] = &[
    "PLANBOT_URL",
    "PLANBOT_CONFIRM",
    "PLANBOT_ROOTS",
    "PLANBOT_HOST",
];

/// Prefixes of the variables planbot's own tests and benchmarks read.
const DEVELOPER_PREFIXES: &[&str] = &[
    "PLANBOT_TEST_",
    "PLANBOT_BENCH_",
    "PLANBOT_UPDATE_",
    "PLANBOT_SKIP_",
    "PLANBOT_STORY_",
];

/// Apply the `PLANBOT_*` overrides; a variable that sets nothing is a warning naming the
/// nearest one that does.
fn apply_env(
    env: &[(String, String)],
    flat: &mut BTreeMap<String, Value>,
    origins: &mut BTreeMap<String, Origin>,
    errors: &mut Vec<(ConfigError, Option<Origin>)>,
) -> Vec<Problem> {
    let mut warnings = Vec::new();
    for (name, value) in env {
        if !name.starts_with("PLANBOT_") {
            continue;
        }
        let origin = Origin::Env(name.clone());
        // PLANBOT_ENGINE_ENV_<NAME>=value sets engine.env.NAME (likewise
        // PLANBOT_ENGINE_PLAN_ENV_<NAME>, PLANBOT_ENGINE_APPLY_ENV_<NAME>).
        let table_entry = KEYS.iter().filter(|k| k.kind == Kind::Table).find_map(|k| {
            let var = name.strip_prefix(&format!("{}_", keys::env_name(k.path)))?;
            Some((k.path, var))
        });
        if let Some((path, var)) = table_entry {
            let mut t = match flat.remove(path) {
                Some(Value::Table(t)) => t,
                _ => toml::Table::new(),
            };
            t.insert(var.to_string(), Value::String(value.clone()));
            flat.insert(path.to_string(), Value::Table(t));
            origins.insert(format!("{path}.{var}"), origin);
        } else if let Some(k) = KEYS.iter().find(|k| keys::env_name(k.path) == *name) {
            flat.remove(&format!("{}_file", k.path));
            origins.insert(k.path.to_string(), origin.clone());
            match env_value(k.path, k.kind, value) {
                Ok(v) => {
                    flat.insert(k.path.to_string(), v);
                }
                Err(e) => {
                    flat.remove(k.path);
                    errors.push((e, Some(origin)));
                }
            }
        } else if let Some(k) = KEYS
            .iter()
            .find(|k| k.secret && format!("{}_FILE", keys::env_name(k.path)) == *name)
        {
            flat.remove(k.path);
            flat.insert(format!("{}_file", k.path), Value::String(value.clone()));
            origins.insert(format!("{}_file", k.path), origin);
        } else if !OTHER_VARIABLES.contains(&name.as_str())
            && !DEVELOPER_PREFIXES.iter().any(|p| name.starts_with(p))
        {
            let known: Vec<String> = KEYS
                .iter()
                .filter(|k| k.kind != Kind::Table)
                .flat_map(|k| {
                    let env = keys::env_name(k.path);
                    let file = k.secret.then(|| format!("{env}_FILE"));
                    std::iter::once(env).chain(file)
                })
                .collect();
            warnings.push(Problem {
                error: ConfigError::UnknownVariable {
                    name: name.clone(),
                    hint: suggest::did_you_mean(name, known.iter().map(String::as_str)),
                },
                origin: Some(origin),
            });
        }
    }
    warnings
}

/// The directory systemd's `LoadCredential=` fills (and any other secret mount may name).
pub const CREDENTIALS_DIRECTORY: &str = "CREDENTIALS_DIRECTORY";

/// Where a `<key>_file` path points: an absolute path as is; a relative one is a file name in
/// `$CREDENTIALS_DIRECTORY` (systemd's `LoadCredential=`), and an error when that is not set.
fn secret_file_path(
    key: &str,
    path: &str,
    env: &[(String, String)],
) -> Result<String, ConfigError> {
    if path.starts_with('/') {
        return Ok(path.to_string());
    }
    let dir = env
        .iter()
        .rev()
        .find(|(k, _)| k == CREDENTIALS_DIRECTORY)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty());
    match dir {
        Some(dir) => Ok(format!("{}/{path}", dir.trim_end_matches('/'))),
        None => Err(ConfigError::SecretFile {
            key: key.to_string(),
            path: path.to_string(),
            message: "a relative path names a file in $CREDENTIALS_DIRECTORY (systemd's LoadCredential=), which is not set; write an absolute path".into(),
        }),
    }
}

fn resolve_files(
    flat: &mut BTreeMap<String, Value>,
    env: &[(String, String)],
    read_file: &dyn Fn(&str) -> Result<String, String>,
    origins: &mut BTreeMap<String, Origin>,
    errors: &mut Vec<(ConfigError, Option<Origin>)>,
) {
    let file_keys: Vec<String> = flat
        .keys()
        .filter(|k| k.ends_with("_file"))
        .cloned()
        .collect();
    for fk in file_keys {
        if keys::key(&fk).is_some() {
            continue; // a plain key that happens to end in `_file` (proxmox.ca_file)
        }
        let key = fk.trim_end_matches("_file").to_string();
        let via = origins.remove(&fk).unwrap_or(Origin::File { line: None });
        if flat.contains_key(&key) {
            flat.remove(&fk);
            errors.push((ConfigError::Both { key }, Some(via)));
            continue;
        }
        // On a problem the key gets a stand-in value, so it is not also reported as missing.
        let stand_in = if is_table(&key) {
            Value::Table(toml::Table::new())
        } else {
            Value::String(FALLBACK_SECRET.into())
        };
        let Some(Value::String(path)) = flat.remove(&fk) else {
            errors.push((
                ConfigError::Invalid {
                    key: fk,
                    message: "expected a file path (string)".into(),
                },
                Some(via),
            ));
            flat.insert(key, stand_in);
            continue;
        };
        let read = secret_file_path(&key, &path, env).and_then(|path| {
            read_file(&path)
                .map(|text| (text, path.clone()))
                .map_err(|message| ConfigError::SecretFile {
                    key: key.clone(),
                    path,
                    message,
                })
        });
        let (text, path) = match read {
            Ok(read) => read,
            Err(e) => {
                errors.push((e, Some(via)));
                flat.insert(key, stand_in);
                continue;
            }
        };
        let origin = Origin::SecretFile {
            path,
            via: Box::new(via),
        };
        let text = text.trim_end_matches(['\n', '\r']).to_string();
        if is_table(&key) {
            // engine.env_file: a file of NAME=value lines.
            let mut t = toml::Table::new();
            for l in text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
            {
                let Some((k, v)) = l.split_once('=') else {
                    errors.push((
                        ConfigError::Invalid {
                            key: format!("{key}_file"),
                            message: "expected NAME=value lines".into(),
                        },
                        Some(origin.clone()),
                    ));
                    continue;
                };
                let k = k.trim().to_string();
                origins.insert(format!("{key}.{k}"), origin.clone());
                t.insert(k, Value::String(v.to_string()));
            }
            flat.insert(key.clone(), Value::Table(t));
        } else {
            flat.insert(key.clone(), Value::String(text));
        }
        origins.insert(key, origin);
    }
}

/// Checks of values that parse but cannot work: empty secrets, the example's placeholder, and
/// Proxmox API tokens not of the form `user@realm!tokenid=secret`. A bad value is reported and
/// replaced by a stand-in, so it is not also reported as missing.
fn check_values(
    flat: &mut BTreeMap<String, Value>,
    errors: &mut Vec<(ConfigError, Option<Origin>)>,
) {
    let check = |key: &str, value: &str, secret: bool| -> Option<String> {
        if secret && value.trim().is_empty() {
            return Some("is empty".into());
        }
        if value.trim().eq_ignore_ascii_case(PLACEHOLDER) {
            return Some(format!(
                "is still the example's placeholder `{PLACEHOLDER}`: put the real value here"
            ));
        }
        let is_pve_token = key.starts_with("proxmox.") && key.ends_with(".api_token")
            || key == "proxmox.api_token"
            || key.ends_with(".env.PROXMOX_VE_API_TOKEN");
        if is_pve_token {
            return pve_token_problem(value);
        }
        None
    };
    let keys: Vec<String> = flat.keys().cloned().collect();
    for key in keys {
        match flat.get_mut(&key) {
            Some(Value::String(v)) => {
                let secret = keys::key(&key).is_some_and(|k| k.secret);
                if let Some(message) = check(&key, v, secret) {
                    *v = if key.ends_with("api_token") {
                        "planbot@pve!fallback=fallback".into()
                    } else {
                        FALLBACK_SECRET.into()
                    };
                    errors.push((ConfigError::Invalid { key, message }, None));
                }
            }
            Some(Value::Table(t)) if is_table(&key) => {
                for (name, v) in t.iter_mut() {
                    let Value::String(text) = v else { continue };
                    let full = format!("{key}.{name}");
                    if let Some(message) = check(&full, text, true) {
                        *text = FALLBACK_SECRET.into();
                        errors.push((ConfigError::Invalid { key: full, message }, None));
                    }
                }
            }
            _ => {}
        }
    }
}

/// Why `value` is not a Proxmox API token `user@realm!tokenid=secret` (never quoting the secret).
pub fn pve_token_problem(value: &str) -> Option<String> {
    const FORM: &str =
        "write it as user@realm!tokenid=secret, e.g. planbot@pve!plan=<the UUID pveum printed>";
    let value = value.trim();
    if value.starts_with("PVEAPIToken") {
        return Some(format!(
            "starts with `PVEAPIToken=`, which is the HTTP header's prefix, not part of the token: {FORM}"
        ));
    }
    let Some((id, secret)) = value.split_once('=') else {
        return Some(format!("has no `=secret` part: {FORM}"));
    };
    let Some((user, token_name)) = id.split_once('!') else {
        return Some(format!("has no `!tokenid` part: {FORM}"));
    };
    let Some((name, realm)) = user.rsplit_once('@') else {
        return Some(format!("the user has no `@realm`: {FORM}"));
    };
    let word = |w: &str| {
        w.starts_with(|c: char| c.is_ascii_alphabetic())
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    };
    if name.is_empty() || name.contains(char::is_whitespace) || !word(realm) {
        return Some(format!("the user `user@realm` is malformed: {FORM}"));
    }
    if !word(token_name) {
        return Some(format!(
            "the token id `{token_name}` is malformed (a letter, then letters, digits, `.`, `-`, `_`): {FORM}"
        ));
    }
    if secret.is_empty() || secret.contains(char::is_whitespace) {
        return Some(format!(
            "the secret after `=` is empty or has spaces: {FORM}"
        ));
    }
    None
}
