//! `[[policy_sets]]`: one policy set as configured (in a repository's `.planbot.toml` or in the
//! service's config), and the checks of its values that both files share.

use super::{PolicyFile, PolicySet};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// The package conftest reads when none is named.
pub const DEFAULT_NAMESPACE: &str = "main";

/// Who may approve a failure of a set: a GitLab user, or the members of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "name", rename_all = "lowercase")]
pub enum Owner {
    User(String),
    /// `group:infra/admins`: the group's full path.
    Group(String),
}

impl Owner {
    /// `alice` (or `@alice`), or `group:infra/admins`.
    pub fn parse(text: &str) -> Result<Owner, String> {
        let t = text.trim();
        let word = |w: &str| {
            !w.is_empty()
                && !w.starts_with(['-', '.'])
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        };
        if let Some(group) = t.strip_prefix("group:") {
            let group = group.trim_matches('/');
            if !group.is_empty() && group.split('/').all(word) {
                return Ok(Owner::Group(group.to_string()));
            }
            return Err(format!(
                "`{text}` is not a group: write `group:` and the group's full path, like `group:infra/admins`"
            ));
        }
        let user = t.strip_prefix('@').unwrap_or(t);
        if word(user) {
            Ok(Owner::User(user.to_string()))
        } else {
            Err(format!(
                "`{text}` is neither a GitLab user name (like `alice`) nor a group (like `group:infra/admins`)"
            ))
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::User(u) => f.write_str(u),
            Owner::Group(g) => write!(f, "group:{g}"),
        }
    }
}

/// One `[[policy_sets]]` entry, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySetSpec {
    pub name: String,
    /// A repository's set: relative to the repository top, normalised (`.` for the top); the
    /// service's: an absolute directory on planbot's host.
    pub path: String,
    /// Who may approve a failure (none: a failure cannot be approved, only fixed).
    pub owners: Vec<Owner>,
    /// The roots it checks; empty: every root.
    pub roots: Vec<String>,
    /// The Rego package of its rules.
    pub namespace: String,
}

impl PolicySetSpec {
    /// Whether the set checks the plans of root `root`.
    pub fn applies_to(&self, root: &str) -> bool {
        self.roots.is_empty() || self.roots.iter().any(|r| r == root)
    }

    /// Whether the set checks root `name` at `dir` of the config to apply, the set and
    /// `before` (every root's `(name, dir)`) being the default branch's before the merge: a
    /// merge request can rename a root or move its directory, so the root is checked by every
    /// set that checked a root of that name or of that directory before; a root that matches
    /// none by either (new, or renamed and moved at once) cannot be told apart from one that
    /// escaped its sets, and is checked by every set.
    pub fn covers(&self, name: &str, dir: &str, before: &[(String, String)]) -> bool {
        let matching: Vec<&str> = before
            .iter()
            .filter(|(n, d)| n == name || d == dir)
            .map(|(n, _)| n.as_str())
            .collect();
        matching.is_empty() || self.applies_to(name) || matching.iter().any(|n| self.applies_to(n))
    }

    /// The set ready to evaluate, with the `.rego` files read from its directory.
    pub fn with_files(&self, files: Vec<PolicyFile>, limit: Duration) -> PolicySet {
        PolicySet {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            files,
            limit,
        }
    }
}

/// A set's name: letters, digits, `-`, `_`, `.`; at most 64.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a valid policy set name (letters, digits, `-`, `_`, `.`; at most 64)"
        ))
    }
}

/// A Rego package path: identifiers joined by dots (`main`, `terraform.proxmox`).
pub fn check_namespace(namespace: &str) -> Result<(), String> {
    let ident = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if namespace.split('.').all(ident) {
        Ok(())
    } else {
        Err(format!(
            "`{namespace}` is not a Rego package (identifiers joined by dots, like `main` or `terraform.proxmox`)"
        ))
    }
}

/// What `check-repo-config` and `serve --check` show of the sets.
#[derive(Serialize)]
pub struct SetView<'a> {
    pub name: &'a str,
    pub path: &'a str,
    pub namespace: &'a str,
    pub owners: Vec<String>,
    pub roots: &'a [String],
}

pub fn views(sets: &[PolicySetSpec]) -> Vec<SetView<'_>> {
    sets.iter()
        .map(|s| SetView {
            name: &s.name,
            path: &s.path,
            namespace: &s.namespace,
            owners: s.owners.iter().map(|o| o.to_string()).collect(),
            roots: &s.roots,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_users_or_groups() {
        assert_eq!(Owner::parse("alice"), Ok(Owner::User("alice".into())));
        assert_eq!(
            Owner::parse("@bob.smith"),
            Ok(Owner::User("bob.smith".into()))
        );
        assert_eq!(
            Owner::parse("group:infra/admins"),
            Ok(Owner::Group("infra/admins".into()))
        );
        assert_eq!(
            Owner::parse("group:infra/admins").unwrap().to_string(),
            "group:infra/admins"
        );
        assert!(Owner::parse("group:").is_err());
        assert!(Owner::parse("group:infra//x").is_err());
        assert!(Owner::parse("two words").is_err());
        assert!(Owner::parse("").is_err());
    }

    #[test]
    fn namespaces_are_package_paths() {
        assert!(check_namespace("main").is_ok());
        assert!(check_namespace("terraform.proxmox_ve").is_ok());
        assert!(check_namespace("data.main.").is_err());
        assert!(check_namespace("1abc").is_err());
        assert!(check_namespace("a-b").is_err());
    }

    #[test]
    fn a_set_follows_a_root_through_a_rename_or_a_move_and_a_new_root_meets_every_set() {
        let set = |roots: &[&str]| PolicySetSpec {
            name: "s".into(),
            path: "policies".into(),
            owners: vec![],
            roots: roots.iter().map(|r| r.to_string()).collect(),
            namespace: "main".into(),
        };
        let before = vec![
            ("core".to_string(), "stacks/core".to_string()),
            ("dns".to_string(), "stacks/dns".to_string()),
        ];
        let core_only = set(&["core"]);
        // Unchanged, renamed (same dir), moved (same name).
        assert!(core_only.covers("core", "stacks/core", &before));
        assert!(core_only.covers("core2", "stacks/core", &before));
        assert!(core_only.covers("core", "elsewhere", &before));
        // Renamed and moved at once, or new: every set.
        assert!(core_only.covers("core2", "elsewhere", &before));
        // Another root the set never checked stays unchecked, also renamed.
        assert!(!core_only.covers("dns", "stacks/dns", &before));
        assert!(!core_only.covers("dns2", "stacks/dns", &before));
        // A root that takes dns's name but core's dir is checked (either match counts).
        assert!(core_only.covers("dns", "stacks/core", &before));
        assert!(set(&[]).covers("dns", "stacks/dns", &before));
        // No roots before (no `.planbot.toml`): every set checks everything.
        assert!(core_only.covers("x", ".", &[]));
    }
}
