//! What the store keeps of policy checks: the verdict recorded for each root's plan shown on a
//! merge request (with that plan's fingerprint), and the owners' approvals of a failing set for
//! one plan. The apply gate reads both; a new push shows a new plan, which no approval covers.

use super::backend::StoreBackend;
use super::types::{PolicyApproval, PolicyVerdictRecord};
use super::{on_backend, Backend, Store};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, ProjectId};
use crate::core::policy::review::RecordedVerdict;
use anyhow::Result;

impl Store {
    /// Record (or replace) the verdict of one root's plan shown for `sha`.
    pub async fn record_policy_verdict(&self, record: PolicyVerdictRecord) -> Result<()> {
        let json = record.verdict.to_json();
        on_backend!(self, b => b.record_policy_verdict(record, json).await)
    }

    /// The verdicts recorded for the plans shown for head `sha` of the MR, one per root. A row
    /// whose fingerprint or verdict does not parse reads as no verdict.
    pub async fn policy_verdicts(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: &CommitSha,
    ) -> Result<Vec<PolicyVerdictRecord>> {
        let rows = on_backend!(self, b => b.policy_verdicts(project, mr, sha.clone()).await)?;
        Ok(rows
            .into_iter()
            .filter_map(|(root, fingerprint, json)| {
                Some(PolicyVerdictRecord {
                    project,
                    mr,
                    root,
                    sha: sha.clone(),
                    fingerprint: Fingerprint::from_hex(&fingerprint)?,
                    verdict: RecordedVerdict::from_json(&json)?,
                })
            })
            .collect())
    }

    /// Record an approval; `false` when the same person had already approved that set of that
    /// plan (nothing changes then).
    pub async fn record_policy_approval(&self, approval: PolicyApproval) -> Result<bool> {
        on_backend!(self, b => b.record_policy_approval(approval).await)
    }

    /// Every approval given on the MR (any head), oldest first.
    pub async fn policy_approvals(
        &self,
        project: ProjectId,
        mr: MrIid,
    ) -> Result<Vec<PolicyApproval>> {
        on_backend!(self, b => b.policy_approvals(project, mr).await)
    }
}
