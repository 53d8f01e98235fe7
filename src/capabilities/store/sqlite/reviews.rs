//! SQL for what was shown on an MR for review: plan fingerprints, plan digests, the note's id.

use crate::capabilities::store::types::{ShownFingerprint, WidgetReports};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, NoteId, ProjectId, RunId};
use crate::core::plan_digest::PlanDigest;
use anyhow::Result;
use rusqlite::{params, Connection, OptionalExtension};

/// Record (or replace) the fingerprint shown for (root, sha).
pub(super) fn record_fingerprint(
    conn: &Connection,
    shown: &ShownFingerprint,
    now: i64,
) -> Result<()> {
    conn.execute(
        "INSERT INTO fingerprints (project_id, mr_iid, root, sha, fingerprint, run_id, shown_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE
         SET fingerprint = excluded.fingerprint, run_id = excluded.run_id, shown_at = excluded.shown_at",
        params![
            shown.project.0 as i64,
            shown.mr.0 as i64,
            shown.root,
            shown.sha.0,
            shown.fingerprint.as_hex(),
            shown.run.map(|r| r.0 as i64),
            now
        ],
    )?;
    Ok(())
}

/// The last fingerprint shown for `root` on the MR, any head.
pub(super) fn last_shown_fingerprint(
    conn: &Connection,
    project: ProjectId,
    mr: MrIid,
    root: &str,
) -> Result<Option<ShownFingerprint>> {
    Ok(conn
        .query_row(
            "SELECT project_id, mr_iid, root, sha, fingerprint, run_id FROM fingerprints
             WHERE project_id = ?1 AND mr_iid = ?2 AND root = ?3 ORDER BY shown_at DESC, rowid DESC LIMIT 1",
            params![project.0 as i64, mr.0 as i64, root],
            fingerprint_row,
        )
        .optional()?
        .flatten())
}

/// The fingerprint shown for one exact (root, sha).
pub(super) fn fingerprint_for(
    conn: &Connection,
    project: ProjectId,
    mr: MrIid,
    root: &str,
    sha: &CommitSha,
) -> Result<Option<ShownFingerprint>> {
    Ok(conn
        .query_row(
            "SELECT project_id, mr_iid, root, sha, fingerprint, run_id FROM fingerprints
             WHERE project_id = ?1 AND mr_iid = ?2 AND root = ?3 AND sha = ?4",
            params![project.0 as i64, mr.0 as i64, root, sha.0],
            fingerprint_row,
        )
        .optional()?
        .flatten())
}

/// A row whose fingerprint does not parse reads as no fingerprint.
fn fingerprint_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Option<ShownFingerprint>> {
    let hex: String = r.get(4)?;
    Ok(
        Fingerprint::from_hex(&hex).map(|fingerprint| ShownFingerprint {
            project: ProjectId(r.get::<_, i64>(0).unwrap_or(0) as u64),
            mr: MrIid(r.get::<_, i64>(1).unwrap_or(0) as u64),
            root: r.get(2).unwrap_or_default(),
            sha: CommitSha(r.get(3).unwrap_or_default()),
            fingerprint,
            run: r
                .get::<_, Option<i64>>(5)
                .ok()
                .flatten()
                .map(|x| RunId(x as u64)),
        }),
    )
}

/// Record (or replace) the digest of the plan shown for (root, sha).
pub(super) fn record_digest(
    conn: &Connection,
    project: ProjectId,
    mr: MrIid,
    root: &str,
    sha: &CommitSha,
    digest_json: &str,
) -> Result<()> {
    conn.execute(
        "INSERT INTO plan_digests (project_id, mr_iid, root, sha, digest) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE SET digest = excluded.digest",
        params![project.0 as i64, mr.0 as i64, root, sha.0, digest_json],
    )?;
    Ok(())
}

/// The digest recorded for (root, sha); one that does not parse reads as none.
pub(super) fn digest_for(
    conn: &Connection,
    project: ProjectId,
    mr: MrIid,
    root: &str,
    sha: &CommitSha,
) -> Result<Option<PlanDigest>> {
    Ok(conn
        .query_row(
            "SELECT digest FROM plan_digests WHERE project_id = ?1 AND mr_iid = ?2 AND root = ?3 AND sha = ?4",
            params![project.0 as i64, mr.0 as i64, root, sha.0],
            |r| r.get::<_, String>(0),
        )
        .optional()?
        .and_then(|text| PlanDigest::from_json(&text)))
}

/// Record (or replace) the widgets' report of the plan shown for (root, sha).
pub(super) fn record_widgets(
    conn: &Connection,
    project: ProjectId,
    mr: MrIid,
    root: &str,
    sha: &CommitSha,
    report_json: &str,
) -> Result<()> {
    conn.execute(
        "INSERT INTO widget_reports (project_id, mr_iid, root, sha, report) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE SET report = excluded.report",
        params![project.0 as i64, mr.0 as i64, root, sha.0, report_json],
    )?;
    Ok(())
}

/// Every root's widgets report for (mr, sha), by root name, and whether a plan job of that
/// head is still queued or running (then the reports may be incomplete). One read.
pub(super) fn widgets_for(
    conn: &Connection,
    project: ProjectId,
    mr: MrIid,
    sha: &CommitSha,
) -> Result<WidgetReports> {
    let tx = conn.unchecked_transaction()?;
    let pending: i64 = tx.query_row(
        "SELECT COUNT(*) FROM jobs WHERE kind = 'plan' AND project_id = ?1 AND mr_iid = ?2
           AND sha = ?3 AND state IN ('queued', 'running')",
        params![project.0 as i64, mr.0 as i64, sha.0],
        |r| r.get(0),
    )?;
    let mut stmt = tx.prepare(
        "SELECT root, report FROM widget_reports WHERE project_id = ?1 AND mr_iid = ?2 AND sha = ?3
         ORDER BY root",
    )?;
    let roots = stmt
        .query_map(params![project.0 as i64, mr.0 as i64, sha.0], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    drop(stmt);
    tx.commit()?;
    Ok(WidgetReports::from_rows(pending > 0, roots))
}

pub(super) fn set_mr_note(
    conn: &Connection,
    project: ProjectId,
    mr: MrIid,
    note: NoteId,
    now: i64,
) -> Result<()> {
    conn.execute(
        "INSERT INTO mr_notes (project_id, mr_iid, note_id, updated_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (project_id, mr_iid) DO UPDATE SET note_id = excluded.note_id, updated_at = excluded.updated_at",
        params![project.0 as i64, mr.0 as i64, note.0 as i64, now],
    )?;
    Ok(())
}

pub(super) fn mr_note(conn: &Connection, project: ProjectId, mr: MrIid) -> Result<Option<NoteId>> {
    Ok(conn
        .query_row(
            "SELECT note_id FROM mr_notes WHERE project_id = ?1 AND mr_iid = ?2",
            params![project.0 as i64, mr.0 as i64],
            |r| r.get::<_, i64>(0),
        )
        .optional()?
        .map(|n| NoteId(n as u64)))
}
