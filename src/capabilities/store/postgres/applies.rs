//! SQL for apply records on PostgreSQL: one per CI job, so a job id applies once.

use super::queue::OWNER_GONE;
use super::{opt_u64, PgStore};
use crate::capabilities::store::now_ms;
use crate::capabilities::store::types::{ApplyId, ApplyRecord, ApplyState, NewApply};
use crate::core::ids::{CommitSha, JobId, MrIid, ProjectId};
use anyhow::Result;
use tokio_postgres::Row;

pub(super) const APPLY_COLS: &str =
    "id, ci_job_id, project_id, mr_iid, sha, roots, state, started_at, finished_at, detail";

pub(super) fn apply_row(r: &Row) -> ApplyRecord {
    ApplyRecord {
        id: ApplyId(r.get(0)),
        ci_job: JobId(r.get::<_, i64>(1) as u64),
        project: ProjectId(r.get::<_, i64>(2) as u64),
        mr: opt_u64(r, 3).map(MrIid),
        sha: CommitSha(r.get(4)),
        roots: serde_json::from_str(&r.get::<_, String>(5)).unwrap_or_default(),
        state: ApplyState::parse(&r.get::<_, String>(6)),
        started_at: r.get(7),
        finished_at: r.get(8),
        detail: r.get(9),
    }
}

pub(super) async fn begin(store: &PgStore, a: NewApply) -> Result<Option<ApplyId>> {
    let roots = serde_json::to_string(&a.roots)?;
    Ok(store
        .client()
        .await?
        .query_opt(
            "INSERT INTO applies (ci_job_id, project_id, mr_iid, sha, roots, state,
                                  started_at, owner)
             VALUES ($1, $2, $3, $4, $5, 'running', $6, $7)
             ON CONFLICT (ci_job_id) DO NOTHING RETURNING id",
            &[
                &(a.ci_job.0 as i64),
                &(a.project.0 as i64),
                &a.mr.map(|m| m.0 as i64),
                &a.sha.0,
                &roots,
                &now_ms(),
                &store.opts.replica,
            ],
        )
        .await?
        .map(|r| ApplyId(r.get(0))))
}

pub(super) async fn finish(
    store: &PgStore,
    id: ApplyId,
    state: ApplyState,
    detail: Option<String>,
) -> Result<()> {
    store
        .client()
        .await?
        .execute(
            "UPDATE applies SET state = $2, finished_at = $3, detail = $4 WHERE id = $1",
            &[&id.0, &state.as_str(), &now_ms(), &detail],
        )
        .await?;
    Ok(())
}

pub(super) async fn mark_interrupted(store: &PgStore) -> Result<Vec<ApplyRecord>> {
    Ok(store
        .client()
        .await?
        .query(
            &format!(
                "UPDATE applies SET state = 'interrupted', finished_at = $2
                 WHERE state = 'running' AND {OWNER_GONE} RETURNING {APPLY_COLS}"
            ),
            &[&store.opts.replica, &now_ms()],
        )
        .await?
        .iter()
        .map(apply_row)
        .collect())
}

pub(super) async fn for_job(store: &PgStore, ci_job: JobId) -> Result<Option<ApplyRecord>> {
    Ok(store
        .client()
        .await?
        .query_opt(
            &format!("SELECT {APPLY_COLS} FROM applies WHERE ci_job_id = $1"),
            &[&(ci_job.0 as i64)],
        )
        .await?
        .map(|r| apply_row(&r)))
}
