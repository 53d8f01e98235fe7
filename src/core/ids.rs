//! Newtypes for the ids planbot passes around, so a project id is never taken for an MR iid.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! int_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

int_id!(
    /// A GitLab project's numeric id.
    ProjectId
);
int_id!(
    /// A merge request's per-project number (`iid`), what the API uses.
    MrIid
);
int_id!(
    /// A GitLab note's id.
    NoteId
);
int_id!(
    /// A GitLab user's id.
    UserId
);
int_id!(
    /// A CI job's id.
    JobId
);
int_id!(
    /// A planbot run (plan or apply) in the store.
    RunId
);

/// A full 40-hex git commit SHA.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CommitSha(pub String);

impl CommitSha {
    /// The first 8 characters, as notes show it.
    pub fn short(&self) -> &str {
        &self.0[..self.0.len().min(8)]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CommitSha {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
