//! Approvals before an apply (`[apply] approvals = N` in `.planbot.toml`), pure: which of a
//! merge request's approvals count, as GitLab told them.
//!
//! An approval counts when its approver is not the merge request's author, has the Developer
//! role or more on the project, and gave it after the merge request's last push. GitLab Free
//! keeps approvals across pushes, so when an approval was given is read from the system note
//! GitLab wrote for it ("approved this merge request", by the approver; the newest one, as an
//! approval withdrawn and given again writes another), and the last push from the newest of the
//! merge request's diff versions. A time planbot cannot read, or an approval it finds no note
//! of, never counts.

use crate::core::ids::UserId;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::HashMap;

/// The body of the system note GitLab writes when someone approves a merge request.
pub const APPROVED_NOTE: &str = "approved this merge request";

/// GitLab's Developer role (`access_level` 30): the least role whose approval counts.
pub const DEVELOPER: u32 = 30;

/// One person who approves the merge request now, as GitLab told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approver {
    pub id: UserId,
    pub username: String,
    /// When they approved: their newest approval note ([`approved_at`]), if found.
    pub approved_at: Option<DateTime<Utc>>,
    /// Their role on the project (`access_level`, inherited ones included); `None` when not a
    /// member, or not asked ([`needs_role`] says whose role matters).
    pub access: Option<u32>,
}

/// Why an approval counts or not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "standing", rename_all = "snake_case")]
pub enum Standing {
    /// It counts.
    Counts,
    /// The merge request's author approved their own change.
    Author,
    /// Given at or before the last push: it approved code that changed since.
    BeforePush,
    /// planbot found no note saying when it was given.
    WhenUnknown,
    /// The approver's role is below Developer (`role`: the role GitLab gives, or "no role").
    Role { role: String },
}

/// One approval of the merge request and whether it counts, as the refusal shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Approval {
    pub user: String,
    /// When it was given, as [`shown`] writes it.
    pub at: Option<String>,
    #[serde(flatten)]
    pub standing: Standing,
}

/// The approvals of a merge request, judged against what the apply waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// How many the apply waits for.
    pub needed: u32,
    /// How many count.
    pub counted: u32,
    /// The last push, as [`shown`] writes it.
    pub last_push: String,
    pub approvals: Vec<Approval>,
}

impl Judged {
    /// Enough approvals count for the apply to go on.
    pub fn enough(&self) -> bool {
        self.counted >= self.needed
    }
}

/// Whether a note is GitLab's record of an approval (a system note, [`APPROVED_NOTE`]).
pub fn is_approval(system: bool, body: &str) -> bool {
    system && body.trim() == APPROVED_NOTE
}

/// A time GitLab wrote (RFC 3339, `2026-12-07T09:12:40.123Z`); `None` when it cannot be read.
pub fn time(gitlab: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(gitlab.trim())
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// A time as planbot says it: `2026-12-07 09:12:40 UTC`.
pub fn shown(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// The last push: the newest `created_at` of the merge request's diff versions. An error (in
/// words) when there is none, or one cannot be read: the check cannot run without it.
pub fn last_push<'a>(
    created: impl IntoIterator<Item = Option<&'a str>>,
) -> Result<DateTime<Utc>, String> {
    let mut newest = None;
    for c in created {
        let c = c.unwrap_or("");
        let t = time(c).ok_or_else(|| {
            format!("a diff version's time `{c}` cannot be read, so the last push is not known")
        })?;
        newest = newest.max(Some(t));
    }
    newest.ok_or_else(|| "GitLab lists no diff version, so the last push is not known".into())
}

/// When each user last approved, from the merge request's notes (`(system, body, author,
/// created_at)`): their newest approval note whose time can be read.
pub fn approved_at<'a>(
    notes: impl IntoIterator<Item = (bool, &'a str, UserId, &'a str)>,
) -> HashMap<UserId, DateTime<Utc>> {
    let mut at: HashMap<UserId, DateTime<Utc>> = HashMap::new();
    for (system, body, author, created) in notes {
        if !is_approval(system, body) {
            continue;
        }
        if let Some(t) = time(created) {
            let e = at.entry(author).or_insert(t);
            *e = (*e).max(t);
        }
    }
    at
}

/// Whether the approver's role decides whether their approval counts (they are not the
/// author and approved after the last push): only theirs is worth asking GitLab for.
pub fn needs_role(author: UserId, last_push: DateTime<Utc>, a: &Approver) -> bool {
    a.id != author && a.approved_at.is_some_and(|t| t > last_push)
}

/// GitLab's name of a role (`access_level`).
pub fn role_name(access: Option<u32>) -> String {
    match access {
        None | Some(0) => "no role".into(),
        Some(5) => "Minimal Access".into(),
        Some(10) => "Guest".into(),
        Some(15) => "Planner".into(),
        Some(20) => "Reporter".into(),
        Some(30) => "Developer".into(),
        Some(40) => "Maintainer".into(),
        Some(50) => "Owner".into(),
        Some(n) => format!("access level {n}"),
    }
}

/// Each approval's standing, in the order GitLab listed the approvers: the author's own never
/// counts, then one given at or before the last push (or of unknown time), then one by a role
/// below Developer.
pub fn judge(
    needed: u32,
    author: UserId,
    last_push: DateTime<Utc>,
    approvers: &[Approver],
) -> Judged {
    let approvals: Vec<Approval> = approvers
        .iter()
        .map(|a| {
            let standing = if a.id == author {
                Standing::Author
            } else {
                match a.approved_at {
                    None => Standing::WhenUnknown,
                    Some(t) if t <= last_push => Standing::BeforePush,
                    Some(_) if a.access.unwrap_or(0) < DEVELOPER => Standing::Role {
                        role: role_name(a.access),
                    },
                    Some(_) => Standing::Counts,
                }
            };
            Approval {
                user: a.username.clone(),
                at: a.approved_at.map(shown),
                standing,
            }
        })
        .collect();
    let counted = approvals
        .iter()
        .filter(|a| a.standing == Standing::Counts)
        .count() as u32;
    Judged {
        needed,
        counted,
        last_push: shown(last_push),
        approvals,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUSH: &str = "2026-12-07T09:12:40.000Z";
    const ALICE: UserId = UserId(1);
    const BOB: UserId = UserId(2);
    const CAROL: UserId = UserId(3);

    fn t(s: &str) -> DateTime<Utc> {
        time(s).unwrap()
    }

    fn approver(id: UserId, name: &str, at: Option<&str>, access: Option<u32>) -> Approver {
        Approver {
            id,
            username: name.into(),
            approved_at: at.map(t),
            access,
        }
    }

    fn standings(j: &Judged) -> Vec<(&str, &Standing)> {
        j.approvals
            .iter()
            .map(|a| (a.user.as_str(), &a.standing))
            .collect()
    }

    #[test]
    fn only_another_developers_approval_after_the_last_push_counts() {
        let approvers = [
            approver(ALICE, "alice", Some("2026-12-07T09:00:00Z"), Some(40)),
            approver(BOB, "bob", Some("2026-12-07T09:20:00Z"), Some(30)),
            approver(CAROL, "carol", Some("2026-12-07T09:30:00Z"), Some(30)),
        ];
        // bob is the author: only carol's counts (alice's came before the push).
        let j = judge(1, BOB, t(PUSH), &approvers);
        assert_eq!(
            standings(&j),
            [
                ("alice", &Standing::BeforePush),
                ("bob", &Standing::Author),
                ("carol", &Standing::Counts)
            ]
        );
        assert_eq!((j.counted, j.enough()), (1, true));
        assert_eq!(j.last_push, "2026-12-07 09:12:40 UTC");
        assert_eq!(
            j.approvals[0].at.as_deref(),
            Some("2026-12-07 09:00:00 UTC")
        );
        assert!(!judge(2, BOB, t(PUSH), &approvers).enough());
    }

    #[test]
    fn an_approval_at_the_push_a_lower_role_or_an_unknown_time_does_not_count() {
        let approvers = [
            approver(ALICE, "alice", Some(PUSH), Some(40)),
            approver(BOB, "bob", Some("2026-12-07T10:00:00Z"), Some(20)),
            approver(CAROL, "carol", None, Some(40)),
            approver(UserId(4), "dave", Some("2026-12-07T10:00:00Z"), None),
        ];
        let j = judge(1, UserId(9), t(PUSH), &approvers);
        assert_eq!(
            standings(&j),
            [
                ("alice", &Standing::BeforePush),
                (
                    "bob",
                    &Standing::Role {
                        role: "Reporter".into()
                    }
                ),
                ("carol", &Standing::WhenUnknown),
                (
                    "dave",
                    &Standing::Role {
                        role: "no role".into()
                    }
                ),
            ]
        );
        assert_eq!((j.counted, j.enough()), (0, false));
        // None needed, none counted: enough.
        assert!(judge(0, UserId(9), t(PUSH), &[]).enough());
    }

    #[test]
    fn the_newest_approval_note_of_each_user_says_when() {
        let notes = [
            (true, APPROVED_NOTE, ALICE, "2026-12-07T08:00:00Z"),
            (
                true,
                "unapproved this merge request",
                ALICE,
                "2026-12-07T08:30:00Z",
            ),
            (true, APPROVED_NOTE, ALICE, "2026-12-07T09:30:00.5+01:00"),
            // Anyone may write the words in a comment: not GitLab's record.
            (false, APPROVED_NOTE, BOB, "2026-12-07T11:00:00Z"),
            (true, APPROVED_NOTE, CAROL, "yesterday"),
        ];
        let at = approved_at(notes);
        assert_eq!(at.get(&ALICE), Some(&t("2026-12-07T08:30:00.5Z")));
        assert_eq!(at.get(&BOB), None);
        assert_eq!(at.get(&CAROL), None);
        let alice = approver(ALICE, "alice", Some("2026-12-07T09:30:00Z"), None);
        assert!(needs_role(BOB, t(PUSH), &alice));
        assert!(!needs_role(ALICE, t(PUSH), &alice), "the author");
        assert!(
            !needs_role(BOB, t("2026-12-07T10:00:00Z"), &alice),
            "before the push"
        );
    }

    #[test]
    fn the_last_push_is_the_newest_diff_version_and_must_be_known() {
        let pushes = [
            Some("2026-12-07T09:12:40.000Z"),
            Some("2026-12-06T10:00:00Z"),
        ];
        assert_eq!(last_push(pushes), Ok(t(PUSH)));
        assert_eq!(
            last_push([]),
            Err("GitLab lists no diff version, so the last push is not known".into())
        );
        assert!(last_push([Some(PUSH), None]).is_err());
        assert!(last_push([Some("2026-13-01")]).is_err());
    }
}
