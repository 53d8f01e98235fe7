//! The policy verdict of a plan reviewed on a merge request: what planbot records with the
//! plan's fingerprint, shows in the note's "Policies" section, and checks at apply time.
//!
//! A set that failed (or could not be evaluated) blocks the apply of that plan until an owner
//! of the set approves it for that plan: [`RecordedVerdict::first_unapproved`] is the gate's
//! whole decision, given the approvals recorded for the plan.

use super::{Outcome, Owner, PolicySetSpec, Verdict};
use serde::{Deserialize, Serialize};

/// At most this many messages of each kind are kept per set (the rest are counted).
pub const MAX_RECORDED: usize = 50;
/// At most this many messages of each kind are listed in the note per set.
pub const MAX_SHOWN: usize = 20;
/// A message longer than this is cut (a policy may quote a value the merge request chose).
pub const MAX_MESSAGE_CHARS: usize = 500;

/// Where a set comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SetOrigin {
    /// `.planbot.toml` of the default branch.
    Repository,
    /// planbot's own config: no repository can switch it off.
    Operator,
}

/// How a set ended on one plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SetState {
    Passed,
    Failed,
    /// It could not be evaluated; it blocks like a failure.
    Error,
}

/// One set's verdict on one plan, its messages scrubbed and cut to size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedSet {
    pub name: String,
    pub origin: SetOrigin,
    /// The directory of a repository's set (from the repository top); empty for the operator's.
    #[serde(default)]
    pub path: String,
    pub namespace: String,
    /// Who may approve a failure, as configured when the plan was reviewed.
    #[serde(default)]
    pub owners: Vec<Owner>,
    pub state: SetState,
    #[serde(default)]
    pub failures: Vec<String>,
    #[serde(default)]
    pub failures_more: usize,
    #[serde(default)]
    pub warnings: Vec<String>,
    #[serde(default)]
    pub warnings_more: usize,
    #[serde(default)]
    pub error: Option<String>,
}

impl RecordedSet {
    pub fn blocks(&self) -> bool {
        self.state != SetState::Passed
    }

    /// What the refusal and the note quote: the first failure, or the error.
    pub fn first_message(&self) -> String {
        match (&self.error, self.failures.first()) {
            (Some(e), _) => e.clone(),
            (None, Some(m)) => m.clone(),
            (None, None) => String::new(),
        }
    }
}

/// A set as it was evaluated: its configuration and where it came from.
#[derive(Debug, Clone, Copy)]
pub struct SetSource<'a> {
    pub spec: &'a PolicySetSpec,
    pub origin: SetOrigin,
}

/// Every set's verdict on one root's plan, in the order the sets were evaluated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedVerdict {
    pub sets: Vec<RecordedSet>,
}

impl RecordedVerdict {
    /// The verdict of `sources` (in the order they were evaluated), every message through
    /// `scrub` (the plan's secrets, the configured ones) before it is kept.
    pub fn record(
        verdict: &Verdict,
        sources: &[SetSource<'_>],
        scrub: &dyn Fn(&str) -> String,
    ) -> RecordedVerdict {
        let keep = |messages: &mut dyn Iterator<Item = &str>| -> (Vec<String>, usize) {
            let mut kept = Vec::new();
            let mut more = 0;
            for m in messages {
                if kept.len() < MAX_RECORDED {
                    kept.push(cut(&scrub(m)));
                } else {
                    more += 1;
                }
            }
            (kept, more)
        };
        let sets = verdict
            .sets
            .iter()
            .zip(sources)
            .map(|(v, source)| {
                let mut set = RecordedSet {
                    name: v.name.clone(),
                    origin: source.origin,
                    path: match source.origin {
                        SetOrigin::Repository => source.spec.path.clone(),
                        SetOrigin::Operator => String::new(),
                    },
                    namespace: v.namespace.clone(),
                    owners: source.spec.owners.clone(),
                    state: SetState::Passed,
                    failures: Vec::new(),
                    failures_more: 0,
                    warnings: Vec::new(),
                    warnings_more: 0,
                    error: None,
                };
                match &v.outcome {
                    Outcome::Checked(r) => {
                        (set.failures, set.failures_more) =
                            keep(&mut r.failures.iter().map(|m| m.msg.as_str()));
                        (set.warnings, set.warnings_more) =
                            keep(&mut r.warnings.iter().map(|m| m.msg.as_str()));
                        if !r.failures.is_empty() {
                            set.state = SetState::Failed;
                        }
                    }
                    Outcome::Error(e) => {
                        set.state = SetState::Error;
                        set.error = Some(cut(&scrub(&e.to_string())));
                    }
                }
                set
            })
            .collect();
        RecordedVerdict { sets }
    }

    /// The sets that block the apply (failed, or could not be evaluated).
    pub fn blocking(&self) -> impl Iterator<Item = &RecordedSet> {
        self.sets.iter().filter(|s| s.blocks())
    }

    /// The first blocking set no approval in `approved_sets` covers: what refuses the apply.
    pub fn first_unapproved<'a>(&'a self, approved_sets: &[&str]) -> Option<&'a RecordedSet> {
        self.blocking()
            .find(|s| !approved_sets.contains(&s.name.as_str()))
    }

    /// JSON, as stored.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a verdict serializes")
    }

    /// From stored JSON; `None` when it does not parse (then it counts as never recorded).
    pub fn from_json(text: &str) -> Option<RecordedVerdict> {
        serde_json::from_str(text).ok()
    }
}

/// `text` cut to [`MAX_MESSAGE_CHARS`] characters, on one line.
fn cut(text: &str) -> String {
    let one_line = text.replace(['\r', '\n'], " ");
    if one_line.chars().count() <= MAX_MESSAGE_CHARS {
        return one_line;
    }
    let mut s: String = one_line.chars().take(MAX_MESSAGE_CHARS).collect();
    s.push('…');
    s
}

/// Whether `username` is named among `owners` as a user (GitLab user names are unique
/// whatever their case). Groups need GitLab's answer: see [`Owner::Group`].
pub fn owned_by_user(owners: &[Owner], username: &str) -> bool {
    owners
        .iter()
        .any(|o| matches!(o, Owner::User(u) if u.eq_ignore_ascii_case(username)))
}

/// One approval that counts for the plan shown: a set and who approved it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApprovalView {
    pub set: String,
    pub approver: String,
}

/// An approval given for an earlier plan of the merge request: it no longer counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClearedApproval {
    pub set: String,
    pub approver: String,
    /// The head it was given for (8 characters).
    pub sha: String,
}

/// One set as the note lists it.
#[derive(Debug, Clone, Serialize)]
struct SetView {
    name: String,
    origin: SetOrigin,
    path: String,
    namespace: String,
    state: SetState,
    failures: Vec<String>,
    failures_more: usize,
    warnings: Vec<String>,
    warnings_more: usize,
    error: Option<String>,
    owners: Vec<Owner>,
    approved_by: Vec<String>,
}

/// One root's "Policies" section of the plan note.
#[derive(Debug, Clone, Serialize)]
pub struct PolicySection {
    sets: Vec<SetView>,
    /// Sets that block the apply and no approval covers.
    unapproved: usize,
    /// The default branch the repository's sets were read from.
    branch: String,
    /// Whether planbot's own (operator) sets are among them.
    operator: bool,
    cleared: Vec<ClearedApproval>,
}

impl PolicySection {
    /// The section for `verdict`, with the approvals that count for this plan and those that
    /// an earlier push left (shown only for sets that still block).
    pub fn new(
        verdict: &RecordedVerdict,
        approvals: &[ApprovalView],
        cleared: &[ClearedApproval],
        branch: &str,
    ) -> PolicySection {
        let approvers = |set: &str| -> Vec<String> {
            let mut names: Vec<String> = approvals
                .iter()
                .filter(|a| a.set == set)
                .map(|a| a.approver.clone())
                .collect();
            names.dedup();
            names
        };
        let sets: Vec<SetView> = verdict
            .sets
            .iter()
            .map(|s| {
                let show = |all: &[String], more: usize| {
                    let shown: Vec<String> = all.iter().take(MAX_SHOWN).cloned().collect();
                    let left = all.len() - shown.len() + more;
                    (shown, left)
                };
                let (failures, failures_more) = show(&s.failures, s.failures_more);
                let (warnings, warnings_more) = show(&s.warnings, s.warnings_more);
                SetView {
                    name: s.name.clone(),
                    origin: s.origin,
                    path: s.path.clone(),
                    namespace: s.namespace.clone(),
                    state: s.state,
                    failures,
                    failures_more,
                    warnings,
                    warnings_more,
                    error: s.error.clone(),
                    owners: s.owners.clone(),
                    approved_by: if s.blocks() {
                        approvers(&s.name)
                    } else {
                        Vec::new()
                    },
                }
            })
            .collect();
        let unapproved = sets
            .iter()
            .filter(|s| s.state != SetState::Passed && s.approved_by.is_empty())
            .count();
        let cleared = cleared
            .iter()
            .filter(|c| {
                sets.iter().any(|s| {
                    s.name == c.set && s.state != SetState::Passed && s.approved_by.is_empty()
                })
            })
            .cloned()
            .collect();
        PolicySection {
            operator: sets.iter().any(|s| s.origin == SetOrigin::Operator),
            sets,
            unapproved,
            branch: branch.to_string(),
            cleared,
        }
    }

    /// Whether a set blocks the apply without an approval.
    pub fn blocks(&self) -> bool {
        self.unapproved > 0
    }

    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// Whether a failing set is let through by its owners' approval: the apply may proceed,
    /// and the note says so in yellow, not green.
    pub fn overridden(&self) -> bool {
        self.sets
            .iter()
            .any(|s| s.state != SetState::Passed && !s.approved_by.is_empty())
    }

    /// Whether a set left a warning.
    pub fn has_warnings(&self) -> bool {
        self.sets
            .iter()
            .any(|s| !s.warnings.is_empty() || s.warnings_more > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::policy::{Message, PolicyError, Results, SetVerdict};

    fn spec(name: &str, owners: &[&str]) -> PolicySetSpec {
        PolicySetSpec {
            name: name.into(),
            path: "policies".into(),
            owners: owners.iter().map(|o| Owner::parse(o).unwrap()).collect(),
            roots: vec![],
            namespace: "main".into(),
        }
    }

    fn verdict() -> Verdict {
        Verdict {
            sets: vec![
                SetVerdict {
                    name: "no-deletes".into(),
                    namespace: "main".into(),
                    outcome: Outcome::Checked(Results {
                        failures: (0..60)
                            .map(|i| Message::new(format!("vm {i} destroyed, pw hunter2\nnext")))
                            .collect(),
                        ..Results::default()
                    }),
                },
                SetVerdict {
                    name: "sizes".into(),
                    namespace: "main".into(),
                    outcome: Outcome::Checked(Results {
                        successes: 2,
                        warnings: vec![Message::new("big")],
                        ..Results::default()
                    }),
                },
                SetVerdict {
                    name: "broken".into(),
                    namespace: "main".into(),
                    outcome: Outcome::Error(PolicyError::NoFiles),
                },
            ],
        }
    }

    #[test]
    fn a_recorded_verdict_keeps_scrubbed_messages_and_counts_the_rest() {
        let specs = [
            spec("no-deletes", &["alice"]),
            spec("sizes", &[]),
            spec("broken", &["group:infra/admins"]),
        ];
        let sources: Vec<SetSource<'_>> = specs
            .iter()
            .map(|spec| SetSource {
                spec,
                origin: SetOrigin::Repository,
            })
            .collect();
        let r = RecordedVerdict::record(&verdict(), &sources, &|m| m.replace("hunter2", "****"));
        assert_eq!(r.sets[0].state, SetState::Failed);
        assert_eq!(r.sets[0].failures.len(), MAX_RECORDED);
        assert_eq!(r.sets[0].failures_more, 10);
        assert_eq!(r.sets[0].failures[0], "vm 0 destroyed, pw **** next");
        assert_eq!(r.sets[1].state, SetState::Passed);
        assert_eq!(r.sets[2].state, SetState::Error);
        assert_eq!(
            r.blocking().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["no-deletes", "broken"]
        );
        assert_eq!(
            r.first_unapproved(&[]).map(|s| s.name.as_str()),
            Some("no-deletes")
        );
        assert_eq!(
            r.first_unapproved(&["no-deletes"]).map(|s| s.name.as_str()),
            Some("broken")
        );
        assert!(r.first_unapproved(&["no-deletes", "broken"]).is_none());
        assert_eq!(RecordedVerdict::from_json(&r.to_json()), Some(r.clone()));

        let section = PolicySection::new(
            &r,
            &[ApprovalView {
                set: "no-deletes".into(),
                approver: "alice".into(),
            }],
            &[
                ClearedApproval {
                    set: "broken".into(),
                    approver: "bob".into(),
                    sha: "1234abcd".into(),
                },
                ClearedApproval {
                    set: "no-deletes".into(),
                    approver: "alice".into(),
                    sha: "1234abcd".into(),
                },
            ],
            "main",
        );
        assert!(section.blocks(), "broken is not approved");
        assert_eq!(section.sets[0].failures.len(), MAX_SHOWN);
        assert_eq!(section.sets[0].failures_more, 40);
        assert_eq!(section.cleared.len(), 1, "only for a set that still blocks");
    }

    #[test]
    fn owners_by_user_name_whatever_the_case() {
        let owners = vec![Owner::User("Alice".into()), Owner::Group("alice".into())];
        assert!(owned_by_user(&owners, "alice"));
        assert!(!owned_by_user(&[Owner::Group("bob".into())], "bob"));
    }

    #[test]
    fn long_messages_are_cut_on_one_line() {
        let long = "x".repeat(MAX_MESSAGE_CHARS + 10);
        assert_eq!(cut(&long).chars().count(), MAX_MESSAGE_CHARS + 1);
        assert_eq!(cut("a\nb"), "a b");
    }
}
