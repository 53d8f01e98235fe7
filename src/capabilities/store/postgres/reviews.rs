//! SQL for what was shown on an MR for review, on PostgreSQL: plan fingerprints, plan digests, the note's id.

use super::{opt_u64, PgStore};
use crate::capabilities::store::now_ms;
use crate::capabilities::store::types::{ShownFingerprint, WidgetReports};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, NoteId, ProjectId, RunId};
use crate::core::plan_digest::PlanDigest;
use anyhow::Result;
use tokio_postgres::Row;

/// A row whose fingerprint does not parse reads as no fingerprint.
pub(super) fn fingerprint_row(r: &Row) -> Option<ShownFingerprint> {
    Fingerprint::from_hex(&r.get::<_, String>(4)).map(|fingerprint| ShownFingerprint {
        project: ProjectId(r.get::<_, i64>(0) as u64),
        mr: MrIid(r.get::<_, i64>(1) as u64),
        root: r.get(2),
        sha: CommitSha(r.get(3)),
        fingerprint,
        run: opt_u64(r, 5).map(RunId),
    })
}

pub(super) async fn record_fingerprint(store: &PgStore, shown: ShownFingerprint) -> Result<()> {
    store.client()
        .await?
        .execute(
            "INSERT INTO fingerprints (project_id, mr_iid, root, sha, fingerprint, run_id, shown_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE
             SET fingerprint = excluded.fingerprint, run_id = excluded.run_id,
                 shown_at = excluded.shown_at",
            &[
                &(shown.project.0 as i64),
                &(shown.mr.0 as i64),
                &shown.root,
                &shown.sha.0,
                &shown.fingerprint.as_hex(),
                &shown.run.map(|r| r.0 as i64),
                &now_ms(),
            ],
        )
        .await?;
    Ok(())
}

pub(super) async fn last_shown_fingerprint(
    store: &PgStore,
    project: ProjectId,
    mr: MrIid,
    root: String,
) -> Result<Option<ShownFingerprint>> {
    Ok(store
        .client()
        .await?
        .query_opt(
            "SELECT project_id, mr_iid, root, sha, fingerprint, run_id FROM fingerprints
             WHERE project_id = $1 AND mr_iid = $2 AND root = $3
             ORDER BY shown_at DESC, seq DESC LIMIT 1",
            &[&(project.0 as i64), &(mr.0 as i64), &root],
        )
        .await?
        .and_then(|r| fingerprint_row(&r)))
}

pub(super) async fn fingerprint_for(
    store: &PgStore,
    project: ProjectId,
    mr: MrIid,
    root: String,
    sha: CommitSha,
) -> Result<Option<ShownFingerprint>> {
    Ok(store
        .client()
        .await?
        .query_opt(
            "SELECT project_id, mr_iid, root, sha, fingerprint, run_id FROM fingerprints
             WHERE project_id = $1 AND mr_iid = $2 AND root = $3 AND sha = $4",
            &[&(project.0 as i64), &(mr.0 as i64), &root, &sha.0],
        )
        .await?
        .and_then(|r| fingerprint_row(&r)))
}

pub(super) async fn record_digest(
    store: &PgStore,
    project: ProjectId,
    mr: MrIid,
    root: String,
    sha: CommitSha,
    digest_json: String,
) -> Result<()> {
    store
        .client()
        .await?
        .execute(
            "INSERT INTO plan_digests (project_id, mr_iid, root, sha, digest)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE SET digest = excluded.digest",
            &[
                &(project.0 as i64),
                &(mr.0 as i64),
                &root,
                &sha.0,
                &digest_json,
            ],
        )
        .await?;
    Ok(())
}

pub(super) async fn digest_for(
    store: &PgStore,
    project: ProjectId,
    mr: MrIid,
    root: String,
    sha: CommitSha,
) -> Result<Option<PlanDigest>> {
    Ok(store
        .client()
        .await?
        .query_opt(
            "SELECT digest FROM plan_digests
             WHERE project_id = $1 AND mr_iid = $2 AND root = $3 AND sha = $4",
            &[&(project.0 as i64), &(mr.0 as i64), &root, &sha.0],
        )
        .await?
        .and_then(|r| PlanDigest::from_json(&r.get::<_, String>(0))))
}

pub(super) async fn record_widgets(
    store: &PgStore,
    project: ProjectId,
    mr: MrIid,
    root: String,
    sha: CommitSha,
    report_json: String,
) -> Result<()> {
    store
        .client()
        .await?
        .execute(
            "INSERT INTO widget_reports (project_id, mr_iid, root, sha, report)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE SET report = excluded.report",
            &[
                &(project.0 as i64),
                &(mr.0 as i64),
                &root,
                &sha.0,
                &report_json,
            ],
        )
        .await?;
    Ok(())
}

/// Every root's widgets report for (mr, sha), and whether a plan job of that head is still
/// queued or running; in one statement, so one snapshot.
pub(super) async fn widgets_for(
    store: &PgStore,
    project: ProjectId,
    mr: MrIid,
    sha: CommitSha,
) -> Result<WidgetReports> {
    let rows = store
        .client()
        .await?
        .query(
            "SELECT NULL::TEXT, NULL::TEXT, (SELECT COUNT(*) FROM jobs WHERE kind = 'plan'
                 AND project_id = $1 AND mr_iid = $2 AND sha = $3 AND state IN ('queued', 'running'))
             UNION ALL
             SELECT root, report, 0::BIGINT FROM widget_reports
             WHERE project_id = $1 AND mr_iid = $2 AND sha = $3",
            &[&(project.0 as i64), &(mr.0 as i64), &sha.0],
        )
        .await?;
    let mut pending = false;
    let mut roots = Vec::new();
    for r in rows {
        match (r.get::<_, Option<String>>(0), r.get::<_, Option<String>>(1)) {
            (Some(root), Some(report)) => roots.push((root, report)),
            _ => pending = r.get::<_, i64>(2) > 0,
        }
    }
    roots.sort();
    Ok(WidgetReports::from_rows(pending, roots))
}

pub(super) async fn set_mr_note(
    store: &PgStore,
    project: ProjectId,
    mr: MrIid,
    note: NoteId,
) -> Result<()> {
    store
        .client()
        .await?
        .execute(
            "INSERT INTO mr_notes (project_id, mr_iid, note_id, updated_at)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (project_id, mr_iid) DO UPDATE
             SET note_id = excluded.note_id, updated_at = excluded.updated_at",
            &[
                &(project.0 as i64),
                &(mr.0 as i64),
                &(note.0 as i64),
                &now_ms(),
            ],
        )
        .await?;
    Ok(())
}

pub(super) async fn mr_note(
    store: &PgStore,
    project: ProjectId,
    mr: MrIid,
) -> Result<Option<NoteId>> {
    Ok(store
        .client()
        .await?
        .query_opt(
            "SELECT note_id FROM mr_notes WHERE project_id = $1 AND mr_iid = $2",
            &[&(project.0 as i64), &(mr.0 as i64)],
        )
        .await?
        .map(|r| NoteId(r.get::<_, i64>(0) as u64)))
}
