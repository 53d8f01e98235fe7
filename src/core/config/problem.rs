//! What loading a config found wrong: the error, where its value came from, and what was loaded.

use super::Config;
use std::collections::BTreeMap;

/// Why a config was rejected; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("config is not valid TOML: {0}")]
    Syntax(String),
    #[error("unknown config key `{key}`{hint}")]
    UnknownKey { key: String, hint: String },
    /// A `[section]` planbot does not have (the key is the section's dotted name).
    #[error("unknown config section `[{key}]`{hint}")]
    UnknownSection { key: String, hint: String },
    /// A `PLANBOT_*` environment variable no setting reads (a warning: the rest still loads).
    #[error("environment variable `{name}` sets nothing: no config key reads it{hint}")]
    UnknownVariable { name: String, hint: String },
    #[error("config key `{key}`: {message}")]
    Invalid { key: String, message: String },
    #[error("config key `{key}` is required: {hint}")]
    Missing { key: String, hint: String },
    #[error("config key `{key}` is given both directly and as `{key}_file`; keep one")]
    Both { key: String },
    #[error("config key `{key}_file`: cannot read {path}: {message}")]
    SecretFile {
        key: String,
        path: String,
        message: String,
    },
}

impl ConfigError {
    /// The dotted key the error is about (`None` for a syntax error).
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Syntax(_) | ConfigError::UnknownVariable { .. } => None,
            ConfigError::UnknownKey { key, .. }
            | ConfigError::UnknownSection { key, .. }
            | ConfigError::Invalid { key, .. }
            | ConfigError::Missing { key, .. }
            | ConfigError::Both { key }
            | ConfigError::SecretFile { key, .. } => Some(key),
        }
    }
}

/// Where a config value came from, so an error can send the reader to the right place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The config file, at this line when it could be found.
    File { line: Option<usize> },
    /// A `PLANBOT_*` environment variable.
    Env(String),
    /// A secret file, named by a `<key>_file` setting (or `PLANBOT_..._FILE`) that came from `via`.
    SecretFile { path: String, via: Box<Origin> },
}

impl Origin {
    /// `planbot.toml, line 7` / `environment variable PLANBOT_GITLAB_TOKEN` / `secret file ... (named in ...)`.
    pub fn describe(&self, file: &str) -> String {
        match self {
            Origin::File { line: Some(n) } => format!("{file}, line {n}"),
            Origin::File { line: None } => file.to_string(),
            Origin::Env(var) => format!("environment variable {var}"),
            Origin::SecretFile { path, via } => {
                format!("secret file {path} (named in {})", via.describe(file))
            }
        }
    }
}

/// One problem of a config and where the offending value came from (`None`: not set at all,
/// or a default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub error: ConfigError,
    pub origin: Option<Origin>,
}

impl Problem {
    /// The problem and, on a second line, where to fix it.
    pub fn describe(&self, file: &str) -> String {
        let whence = match (&self.origin, &self.error) {
            (Some(o), _) => format!("from {}", o.describe(file)),
            (None, ConfigError::Missing { .. }) => {
                format!("not set in {file} nor in the environment")
            }
            (None, ConfigError::Syntax(_)) => format!("in {file}"),
            (None, _) => "the default value".to_string(),
        };
        format!(
            "{}
    {whence}",
            self.error
        )
    }
}

/// What [`Config::load_all`] found: every problem, and the config built with fallbacks in place
/// of the bad values (for checks that do not depend on them; never to run with).
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Option<Config>,
    pub problems: Vec<Problem>,
    /// What loads but is likely a mistake (a misspelled `PLANBOT_*` variable): shown by
    /// `serve --check`, `doctor` and the service's log, never fatal.
    pub warnings: Vec<Problem>,
    pub(super) origins: BTreeMap<String, Origin>,
}

impl Loaded {
    /// Where `key` came from (`None`: not set, the default applies).
    pub fn origin(&self, key: &str) -> Option<&Origin> {
        self.origins.get(key)
    }

    /// The config when there was no problem.
    pub fn into_result(self) -> Result<Config, Vec<Problem>> {
        match self.config {
            Some(c) if self.problems.is_empty() => Ok(c),
            _ => Err(self.problems),
        }
    }
}
