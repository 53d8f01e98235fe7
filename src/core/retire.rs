//! Which roots a change retires (docs/workflow.md, "Retiring a root"): a root of the config
//! before the change whose `[[roots]]` entry or directory the change removes is destroyed from
//! the code before it (`plan -destroy`, reviewed on the MR, applied after the merge), and a
//! root that keeps its directory under a new name is renamed, not destroyed. One decision for
//! the MR's plan (before: the default branch; after: the MR) and the apply (before: the commit
//! before the merge; after: the merged commit).

use crate::core::config::StateDefault;
use crate::core::repo_config::{RepoConfig, Root};
use crate::core::state;
use std::collections::BTreeSet;

/// A root the change removes: destroyed, then its GitLab-managed state deleted.
#[derive(Debug, Clone)]
pub struct Retired {
    /// The root as the config before the change has it (its directory, var files, state).
    pub root: Root,
    pub because: RetiredBecause,
}

/// Why a root is retired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetiredBecause {
    /// Its `[[roots]]` entry is gone; its directory stays (no root plans it any more).
    EntryRemoved,
    /// Its directory is gone. `entry_kept`: the config after the change still lists it (a
    /// mistake the MR's config check names: the entry must go too).
    DirectoryGone { entry_kept: bool },
}

/// A root whose directory stays under a new name: nothing is destroyed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renamed {
    pub from: String,
    pub to: String,
    pub dir: String,
    /// Its GitLab-managed state's name before and after (`None`: its own backend).
    pub state_before: Option<String>,
    pub state_after: Option<String>,
}

impl Renamed {
    /// Whether the new name reads another GitLab-managed state than the old one did: then
    /// `to` would start from an empty state unless its entry names the old one.
    pub fn state_moves(&self) -> bool {
        self.state_before.is_some() && self.state_before != self.state_after
    }
}

/// What a change does to the roots of the config before it.
#[derive(Debug, Clone, Default)]
pub struct Retirements {
    pub retired: Vec<Retired>,
    pub renamed: Vec<Renamed>,
}

impl Retirements {
    /// The retired root named `name`.
    pub fn retired(&self, name: &str) -> Option<&Retired> {
        self.retired.iter().find(|r| r.root.name == name)
    }

    pub fn is_empty(&self) -> bool {
        self.retired.is_empty() && self.renamed.is_empty()
    }
}

/// The trees a change goes between: every directory of each, and any other path of it a root's
/// `dir` names (a directory replaced by a file or a link is not removed: the plan refuses it as
/// what it is). Repo-relative; `.` is always there.
pub struct Trees<'a> {
    pub before: &'a BTreeSet<String>,
    pub after: &'a BTreeSet<String>,
}

/// The roots of `before` that the change retires or renames. `after`: the config after the
/// change (`None` when it cannot be read: then only a directory the change removes retires a
/// root). A `before` that is no file (the one root `default` at `.` planbot plans without a
/// `.planbot.toml`) retires nothing: writing the file names the roots for the first time.
pub fn retirements(
    before: &RepoConfig,
    after: Option<&RepoConfig>,
    trees: Trees<'_>,
    state_default: StateDefault,
) -> Retirements {
    let mut out = Retirements::default();
    if before.is_default {
        return out;
    }
    let has_dir = |dir: &str| dir == "." || trees.after.contains(dir);
    let had_dir = |dir: &str| dir == "." || trees.before.contains(dir);
    for root in &before.roots {
        let kept = after.and_then(|a| a.root(&root.name));
        // A directory the change removes (one that never was is the config's own mistake).
        if had_dir(&root.dir) && !has_dir(&root.dir) {
            // The same name over a directory that exists: the root moved, its state with it.
            if kept.is_some_and(|k| k.dir != root.dir && has_dir(&k.dir)) {
                continue;
            }
            let entry_kept = after.is_none() || kept.is_some();
            out.retired.push(Retired {
                root: root.clone(),
                because: RetiredBecause::DirectoryGone { entry_kept },
            });
            continue;
        }
        let Some(after) = after else { continue };
        if kept.is_some() {
            continue;
        }
        // A new name over the same directory: renamed.
        let new_name = after
            .roots
            .iter()
            .find(|r| r.dir == root.dir && before.root(&r.name).is_none());
        match new_name {
            Some(to) => out.renamed.push(Renamed {
                from: root.name.clone(),
                to: to.name.clone(),
                dir: root.dir.clone(),
                state_before: state::gitlab_state_name(root, state_default),
                state_after: state::gitlab_state_name(to, state_default),
            }),
            None => out.retired.push(Retired {
                root: root.clone(),
                because: RetiredBecause::EntryRemoved,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> RepoConfig {
        RepoConfig::parse(text).expect("a valid config")
    }

    fn dirs(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|d| d.to_string()).collect()
    }

    /// Every directory of the trees before the change.
    fn all() -> BTreeSet<String> {
        dirs(&["stacks", "stacks/infra", "stacks/old"])
    }

    /// `retirements` from the tree of [`all`] to `after_dirs`.
    fn retirements(
        before: &RepoConfig,
        after: Option<&RepoConfig>,
        after_dirs: &BTreeSet<String>,
        state_default: StateDefault,
    ) -> Retirements {
        let before_dirs = all();
        let trees = Trees {
            before: &before_dirs,
            after: after_dirs,
        };
        super::retirements(before, after, trees, state_default)
    }

    const TWO: &str = r#"
[[roots]]
name = "infra"
dir = "stacks/infra"

[[roots]]
name = "old"
dir = "stacks/old"
"#;

    const INFRA: &str = r#"
[[roots]]
name = "infra"
dir = "stacks/infra"
"#;

    fn names(r: &Retirements) -> Vec<(&str, RetiredBecause)> {
        r.retired
            .iter()
            .map(|r| (r.root.name.as_str(), r.because))
            .collect()
    }

    #[test]
    fn a_root_whose_entry_and_directory_go_is_retired() {
        let (before, after) = (config(TWO), config(INFRA));
        let r = retirements(
            &before,
            Some(&after),
            &dirs(&["stacks", "stacks/infra"]),
            StateDefault::Gitlab,
        );
        assert_eq!(
            names(&r),
            [("old", RetiredBecause::DirectoryGone { entry_kept: false })]
        );
        assert!(r.renamed.is_empty());
        assert_eq!(r.retired("old").unwrap().root.dir, "stacks/old");
    }

    #[test]
    fn an_entry_removed_over_a_directory_that_stays_is_retired() {
        let (before, after) = (config(TWO), config(INFRA));
        let all = dirs(&["stacks", "stacks/infra", "stacks/old"]);
        let r = retirements(&before, Some(&after), &all, StateDefault::Gitlab);
        assert_eq!(names(&r), [("old", RetiredBecause::EntryRemoved)]);
    }

    #[test]
    fn a_directory_gone_with_its_entry_kept_is_retired_and_said() {
        let before = config(TWO);
        let gone = dirs(&["stacks", "stacks/infra"]);
        for after in [Some(&before), None] {
            let r = retirements(&before, after, &gone, StateDefault::Gitlab);
            assert_eq!(
                names(&r),
                [("old", RetiredBecause::DirectoryGone { entry_kept: true })]
            );
        }
        // Nothing removed: nothing retired.
        let all = dirs(&["stacks", "stacks/infra", "stacks/old"]);
        assert!(retirements(&before, Some(&before), &all, StateDefault::Gitlab).is_empty());
        assert!(retirements(&before, None, &all, StateDefault::Gitlab).is_empty());
    }

    #[test]
    fn a_new_name_over_the_same_directory_is_a_rename_and_says_whether_the_state_moves() {
        let before = config(TWO);
        let renamed = config(
            r#"
[[roots]]
name = "infra"
dir = "stacks/infra"

[[roots]]
name = "legacy"
dir = "stacks/old"
"#,
        );
        let all = dirs(&["stacks", "stacks/infra", "stacks/old"]);
        let r = retirements(&before, Some(&renamed), &all, StateDefault::Gitlab);
        assert!(r.retired.is_empty());
        let rename = &r.renamed[0];
        assert_eq!(
            (rename.from.as_str(), rename.to.as_str()),
            ("old", "legacy")
        );
        assert_eq!(rename.state_before.as_deref(), Some("old"));
        assert_eq!(rename.state_after.as_deref(), Some("legacy"));
        assert!(rename.state_moves());
        // Its entry naming the old state: the state stays where it is.
        let kept = config(
            r#"
[[roots]]
name = "infra"
dir = "stacks/infra"

[[roots]]
name = "legacy"
dir = "stacks/old"
state = { gitlab = "old" }
"#,
        );
        let r = retirements(&before, Some(&kept), &all, StateDefault::Gitlab);
        assert!(!r.renamed[0].state_moves());
        // Under the root's own backend nothing planbot keeps moves.
        let r = retirements(&before, Some(&renamed), &all, StateDefault::Own);
        assert!(!r.renamed[0].state_moves());
    }

    #[test]
    fn a_root_moved_to_another_directory_keeps_its_name_and_is_not_retired() {
        let before = config(TWO);
        let moved = config(
            r#"
[[roots]]
name = "infra"
dir = "stacks/infra"

[[roots]]
name = "old"
dir = "stacks/legacy"
"#,
        );
        let d = dirs(&["stacks", "stacks/infra", "stacks/legacy"]);
        assert!(retirements(&before, Some(&moved), &d, StateDefault::Gitlab).is_empty());
    }

    #[test]
    fn the_top_directory_is_always_there() {
        let top = config("[[roots]]\nname = \"all\"\ndir = \".\"\n");
        assert!(retirements(&top, None, &dirs(&[]), StateDefault::Gitlab).is_empty());
    }

    #[test]
    fn a_directory_that_never_was_is_not_removed_by_the_change() {
        let typo = config("[[roots]]\nname = \"network\"\ndir = \"stacks/nework\"\n");
        assert!(retirements(&typo, Some(&typo), &all(), StateDefault::Gitlab).is_empty());
    }

    #[test]
    fn writing_the_first_planbot_toml_retires_nothing() {
        let first = RepoConfig::absent();
        let after = config(TWO);
        assert!(retirements(&first, Some(&after), &all(), StateDefault::Gitlab).is_empty());
    }
}
