//! GitLab webhook payloads: only what planbot reads. Every field is optional (unknown fields are
//! ignored, missing ones are `None`); timestamps stay strings (GitLab mixes formats).

use crate::core::ids::CommitSha;
use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct User {
    pub id: Option<u64>,
    pub username: Option<String>,
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Project {
    pub id: Option<u64>,
    pub path_with_namespace: Option<String>,
    pub default_branch: Option<String>,
    pub web_url: Option<String>,
    pub git_http_url: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Commit {
    pub id: Option<serde_json::Value>,
    pub timestamp: Option<String>,
}

impl Commit {
    /// The commit SHA, when `id` is a 40-hex string (it is a number in some job payloads).
    pub fn sha(&self) -> Option<CommitSha> {
        match &self.id {
            Some(serde_json::Value::String(s)) if is_sha(s) => {
                Some(CommitSha(s.to_ascii_lowercase()))
            }
            _ => None,
        }
    }
}

pub(super) fn is_sha(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct MrAttributes {
    pub id: Option<u64>,
    pub iid: Option<u64>,
    pub action: Option<String>,
    pub state: Option<String>,
    pub draft: Option<bool>,
    pub work_in_progress: Option<bool>,
    pub source_project_id: Option<u64>,
    pub target_project_id: Option<u64>,
    pub source_branch: Option<String>,
    pub target_branch: Option<String>,
    pub last_commit: Option<Commit>,
    pub oldrev: Option<String>,
    pub merge_commit_sha: Option<String>,
    pub system: Option<bool>,
    pub url: Option<String>,
    pub title: Option<String>,
    /// The MR's author (the user whose work the MR is: the queue's fair share counts by it).
    pub author_id: Option<u64>,
}

/// One `changes` entry: `{previous, current}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Change {
    pub previous: serde_json::Value,
    pub current: serde_json::Value,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct MrChanges {
    pub draft: Option<Change>,
    pub target_branch: Option<Change>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct MergeRequestHook {
    pub object_kind: Option<String>,
    pub user: Option<User>,
    pub project: Option<Project>,
    pub object_attributes: Option<MrAttributes>,
    pub changes: Option<MrChanges>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct NoteAttributes {
    pub id: Option<u64>,
    pub note: Option<String>,
    pub noteable_type: Option<String>,
    pub author_id: Option<u64>,
    pub system: Option<bool>,
    pub action: Option<String>,
    /// When the note was written, on GitLab's clock (`2015-05-17 18:21:36 UTC` or RFC 3339).
    pub created_at: Option<String>,
}

/// A GitLab timestamp in unix milliseconds: RFC 3339 (`2019-06-05T14:32:20.211Z`) or the
/// webhooks' `2015-05-17 18:21:36 UTC` / `2015-05-17 18:21:36 +0200`; `None` for anything else.
pub fn gitlab_time_ms(text: &str) -> Option<i64> {
    let text = text.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(t.timestamp_millis());
    }
    if let Some(utc) = text.strip_suffix(" UTC") {
        return chrono::NaiveDateTime::parse_from_str(utc, "%Y-%m-%d %H:%M:%S%.f")
            .ok()
            .map(|t| t.and_utc().timestamp_millis());
    }
    chrono::DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f %z")
        .ok()
        .map(|t| t.timestamp_millis())
}

#[cfg(test)]
mod time_tests {
    use super::gitlab_time_ms;

    #[test]
    fn gitlab_timestamps_parse_in_each_format_and_nothing_else() {
        let utc = 1_431_886_896_000; // 2015-05-17 18:21:36 UTC
        assert_eq!(gitlab_time_ms("2015-05-17 18:21:36 UTC"), Some(utc));
        assert_eq!(gitlab_time_ms("2015-05-17T18:21:36Z"), Some(utc));
        assert_eq!(gitlab_time_ms("2015-05-17T18:21:36.211Z"), Some(utc + 211));
        assert_eq!(gitlab_time_ms("2015-05-17 20:21:36 +0200"), Some(utc));
        assert_eq!(gitlab_time_ms("2015-05-17T20:21:36+02:00"), Some(utc));
        for bad in ["", "yesterday", "2015-05-17", "1431886896"] {
            assert_eq!(gitlab_time_ms(bad), None, "{bad}");
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct NoteHook {
    pub object_kind: Option<String>,
    pub user: Option<User>,
    pub project_id: Option<u64>,
    pub project: Option<Project>,
    pub object_attributes: Option<NoteAttributes>,
    pub merge_request: Option<MrAttributes>,
}
