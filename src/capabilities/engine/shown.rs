//! A plan as an MR's note shows it ([`ShownPlan`]): what is kept of a [`super::PlannedRun`] once
//! its binary plan file is gone (an MR's plan is never applied: the apply plans again). It holds
//! no file, no sandbox and no state gate. Kept for reuse across pushes
//! (`flows::context::plan_reuse`), it is written down redacted and read back with
//! [`ShownPlan::kept`]: then its document holds no secret, and its secrets are digests.

use crate::core::fingerprint::Fingerprint;
use crate::core::plan::{Plan, PlanParseError};
use crate::core::plan_digest::PlanDigest;
use crate::core::redact::{DigestKey, Scrubber, SecretDigests, Secrets};
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
    /// A kept plan's digest ([`ShownPlan::digest`]), made from the plan before it was redacted.
    pub(super) kept_digest: Option<PlanDigest>,
}

/// What a kept plan is read back from ([`ShownPlan::kept`]): nothing in it is secret.
pub struct KeptShown {
    /// The redacted `show -json` document (`core::kept_plan`).
    pub document: Vec<u8>,
    pub log: String,
    pub lock_file: Option<Vec<u8>>,
    pub parallelism: Option<u16>,
    pub targeting: Targeting,
    pub backend: Backend,
    /// The plan's secrets, as digests under `key`.
    pub digests: SecretDigests,
    pub key: DigestKey,
    /// The digest of the plan before it was redacted.
    pub digest: PlanDigest,
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

    /// The `-parallelism` it was planned with.
    pub fn parallelism(&self) -> Option<u16> {
        self.parallelism
    }

    /// The `-target`/`-exclude`/`-replace` flags it was planned with.
    pub fn targeting(&self) -> &Targeting {
        &self.targeting
    }

    /// The secret-free digest a refused apply compares with (a kept plan's was made before it
    /// was redacted).
    pub fn digest(&self, key: &[u8]) -> PlanDigest {
        match &self.kept_digest {
            Some(d) => d.clone(),
            None => PlanDigest::of(&self.plan, key),
        }
    }

    /// A plan kept for reuse, read back: its secrets are the tokens of its redacted document
    /// and the digests of the secrets it had, which scrub every text it is shown beside. Its
    /// fingerprint was kept with it (a redacted plan's own would not be the plan's).
    pub fn kept(kept: KeptShown) -> Result<ShownPlan, PlanParseError> {
        let plan = Plan::from_json(&kept.document)?;
        let mut secrets = Secrets::from_plan(&plan);
        secrets.add_digests(kept.key, &kept.digests);
        Ok(ShownPlan {
            plan_secrets: secrets.scrubber(),
            plan,
            plan_json: kept.document,
            log: kept.log,
            secrets,
            lock_file: kept.lock_file,
            parallelism: kept.parallelism,
            targeting: kept.targeting,
            backend: kept.backend,
            kept_digest: Some(kept.digest),
        })
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
