//! A plan as an MR's note shows it ([`ShownPlan`]): what is kept of a [`super::PlannedRun`] once
//! its binary plan file is gone (an MR's plan is never applied: the apply plans again). It holds
//! no file, no sandbox and no state gate, so it may outlive its job in memory (plan reuse
//! across pushes, `flows::context::plan_reuse`), never on disk.

use crate::core::fingerprint::Fingerprint;
use crate::core::plan::Plan;
use crate::core::redact::{Scrubber, Secrets};
use crate::core::state::Backend;
use crate::core::targeting::Targeting;
use std::fmt;

/// The plan, its JSON, the redacted log, its secrets and what its fingerprint binds.
pub struct ShownPlan {
    pub(super) plan: Plan,
    pub(super) plan_json: Vec<u8>,
    pub(super) log: String,
    pub(super) secrets: Secrets,
    pub(super) lock_file: Option<Vec<u8>>,
    pub(super) parallelism: Option<u16>,
    pub(super) targeting: Targeting,
    pub(super) backend: Backend,
    /// The scrubber of the plan's own secrets only, which the fingerprint binds.
    pub(super) plan_secrets: Scrubber,
}

impl fmt::Debug for ShownPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the JSON or the secrets.
        f.debug_struct("ShownPlan")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl ShownPlan {
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The `show -json` document as the engine printed it (holds secrets in clear: render it
    /// through the masks, never print it).
    pub fn plan_json(&self) -> &[u8] {
        &self.plan_json
    }

    /// The redacted combined output of init, plan and show.
    pub fn log(&self) -> &str {
        &self.log
    }

    /// Everything known to be secret in the run that made it.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// The dependency lock file as the plan left it (`None`: the root installs no provider).
    pub fn lock_file(&self) -> Option<&[u8]> {
        self.lock_file.as_deref()
    }

    /// The backend `init` configured.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The plan's fingerprint, as [`super::PlannedRun::fingerprint`] computes it.
    pub fn fingerprint(&self, key: &[u8]) -> Fingerprint {
        fingerprint(
            &self.plan,
            key,
            self.lock_file.as_deref(),
            self.parallelism,
            &self.targeting,
            &self.plan_secrets,
        )
    }

    /// How many bytes it keeps in memory (its JSON and log; the parsed plan keeps its values
    /// compressed).
    pub fn weight(&self) -> usize {
        self.plan_json.len() + self.log.len()
    }
}

#[cfg(test)]
impl ShownPlan {
    /// An empty plan whose JSON is `bytes` bytes long (for the reuse cache's bounds).
    pub fn of_size(bytes: usize) -> ShownPlan {
        ShownPlan {
            plan: Plan::from_json(br#"{"format_version":"1.2","resource_changes":[]}"#)
                .expect("an empty plan"),
            plan_json: vec![b' '; bytes],
            log: String::new(),
            secrets: Secrets::new(),
            lock_file: None,
            parallelism: None,
            targeting: Targeting::default(),
            backend: Backend::Remote("http".into()),
            plan_secrets: Secrets::new().scrubber(),
        }
    }
}

/// A plan's fingerprint, bound to the provider lock file, the `-parallelism` it is planned and
/// applied with, and its targeting: one computation for a plan run and a shown plan.
pub(super) fn fingerprint(
    plan: &Plan,
    key: &[u8],
    lock_file: Option<&[u8]>,
    parallelism: Option<u16>,
    targeting: &Targeting,
    plan_secrets: &Scrubber,
) -> Fingerprint {
    Fingerprint::of_with_plan_secrets(plan, key, lock_file, parallelism, plan_secrets)
        .with_targeting(key, targeting)
}
