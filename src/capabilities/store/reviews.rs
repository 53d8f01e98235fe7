//! What was shown on an MR for review: each root's plan fingerprint and plan digest per head,
//! what GitLab's MR widgets show of it, and the id of planbot's note.

use super::sql::{args, Conn, Row, Sql};
use super::types::{ShownFingerprint, WidgetReports};
use super::{now_ms, read, write, Store};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, NoteId, ProjectId, RunId};
use crate::core::plan_digest::PlanDigest;
use crate::core::widgets::RootWidgets;
use anyhow::Result;

static RECORD_FINGERPRINT: Sql = Sql::both(
    "INSERT INTO fingerprints (project_id, mr_iid, root, sha, fingerprint, run_id, shown_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
     ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE
     SET fingerprint = excluded.fingerprint, run_id = excluded.run_id,
         shown_at = excluded.shown_at",
);
/// Ties on the time go to the later row: SQLite's rowid, PostgreSQL's `seq`.
static LAST_SHOWN: Sql = Sql::each(
    "SELECT project_id, mr_iid, root, sha, fingerprint, run_id FROM fingerprints
     WHERE project_id = ?1 AND mr_iid = ?2 AND root = ?3
     ORDER BY shown_at DESC, rowid DESC LIMIT 1",
    "SELECT project_id, mr_iid, root, sha, fingerprint, run_id FROM fingerprints
     WHERE project_id = ?1 AND mr_iid = ?2 AND root = ?3
     ORDER BY shown_at DESC, seq DESC LIMIT 1",
);
static FINGERPRINT_FOR: Sql = Sql::both(
    "SELECT project_id, mr_iid, root, sha, fingerprint, run_id FROM fingerprints
     WHERE project_id = ?1 AND mr_iid = ?2 AND root = ?3 AND sha = ?4",
);
static RECORD_DIGEST: Sql = Sql::both(
    "INSERT INTO plan_digests (project_id, mr_iid, root, sha, digest) VALUES (?1, ?2, ?3, ?4, ?5)
     ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE SET digest = excluded.digest",
);
static DIGEST_FOR: Sql = Sql::both(
    "SELECT digest FROM plan_digests
     WHERE project_id = ?1 AND mr_iid = ?2 AND root = ?3 AND sha = ?4",
);
static RECORD_WIDGETS: Sql = Sql::both(
    "INSERT INTO widget_reports (project_id, mr_iid, root, sha, report)
     VALUES (?1, ?2, ?3, ?4, ?5)
     ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE SET report = excluded.report",
);
/// Every root's report of a head, and (the row without a root) how many of its plan jobs are
/// still queued or running: one statement, so one snapshot.
static WIDGETS_FOR: Sql = Sql::both(
    "SELECT CAST(NULL AS TEXT), CAST(NULL AS TEXT), (SELECT COUNT(*) FROM jobs
         WHERE kind = 'plan' AND project_id = ?1 AND mr_iid = ?2 AND sha = ?3
           AND state IN ('queued', 'running'))
     UNION ALL
     SELECT root, report, 0 FROM widget_reports WHERE project_id = ?1 AND mr_iid = ?2 AND sha = ?3",
);
static SET_MR_NOTE: Sql = Sql::both(
    "INSERT INTO mr_notes (project_id, mr_iid, note_id, updated_at) VALUES (?1, ?2, ?3, ?4)
     ON CONFLICT (project_id, mr_iid) DO UPDATE
     SET note_id = excluded.note_id, updated_at = excluded.updated_at",
);
static MR_NOTE: Sql =
    Sql::both("SELECT note_id FROM mr_notes WHERE project_id = ?1 AND mr_iid = ?2");

/// A row whose fingerprint does not parse reads as no fingerprint.
fn fingerprint_row(r: Option<Row>) -> Result<Option<ShownFingerprint>> {
    let Some(r) = r else {
        return Ok(None);
    };
    let Some(fingerprint) = Fingerprint::from_hex(&r.get::<String>(4)?) else {
        return Ok(None);
    };
    Ok(Some(ShownFingerprint {
        project: ProjectId(r.get::<i64>(0)? as u64),
        mr: MrIid(r.get::<i64>(1)? as u64),
        root: r.get(2)?,
        sha: CommitSha(r.get(3)?),
        fingerprint,
        run: r.get::<Option<i64>>(5)?.map(|x| RunId(x as u64)),
    }))
}

impl Store {
    /// Record the fingerprint shown on the MR for (root, sha), when the note is posted.
    pub async fn record_fingerprint(&self, shown: ShownFingerprint) -> Result<()> {
        write!(self, |c| {
            let s = &shown;
            let args = args![
                s.project,
                s.mr,
                &s.root,
                &s.sha,
                s.fingerprint.as_hex(),
                s.run,
                now_ms()
            ];
            c.execute(&RECORD_FINGERPRINT, &args).await.map(drop)
        })
    }

    /// The last fingerprint shown on the MR for `root` (any head), what an apply must match.
    pub async fn last_shown_fingerprint(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
    ) -> Result<Option<ShownFingerprint>> {
        let args = args![project, mr, root];
        read!(self, |c| fingerprint_row(c.opt(&LAST_SHOWN, &args).await?))
    }

    /// The fingerprint shown for one exact (root, sha).
    pub async fn fingerprint_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
        sha: CommitSha,
    ) -> Result<Option<ShownFingerprint>> {
        let args = args![project, mr, root, &sha];
        read!(self, |c| fingerprint_row(
            c.opt(&FINGERPRINT_FOR, &args).await?
        ))
    }

    /// Keep the secret-free digest of the plan shown for (root, sha), recorded with its
    /// fingerprint, so a refused apply can show what changed since review.
    pub async fn record_digest(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
        sha: &CommitSha,
        digest: &PlanDigest,
    ) -> Result<()> {
        let args = args![project, mr, root, sha, digest.to_json()];
        self.write_one(&RECORD_DIGEST, args).await
    }

    /// The digest recorded for (root, sha), if any; one that does not parse reads as none.
    pub async fn digest_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
        sha: &CommitSha,
    ) -> Result<Option<PlanDigest>> {
        let args = args![project, mr, root, sha];
        let text: Option<String> = read!(self, |c| match c.opt(&DIGEST_FOR, &args).await? {
            Some(row) => row.get(0),
            None => Ok(None),
        })?;
        Ok(text.and_then(|t| PlanDigest::from_json(&t)))
    }

    /// Keep what GitLab's MR widgets show of the plan shown for (root, sha): its counts and
    /// findings ([`RootWidgets`], every text already scrubbed), recorded with its fingerprint.
    pub async fn record_widgets(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
        sha: &CommitSha,
        report: &RootWidgets,
    ) -> Result<()> {
        let args = args![project, mr, root, sha, report.to_json()];
        self.write_one(&RECORD_WIDGETS, args).await
    }

    /// The widgets' reports of every root planned for (mr, sha), and whether a plan of that
    /// head is still queued or running (then the reports may be incomplete). One snapshot.
    pub async fn widgets_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
    ) -> Result<WidgetReports> {
        let args = args![project, mr, &sha];
        let rows = read!(self, |c| c.rows(&WIDGETS_FOR, &args).await)?;
        let (mut pending, mut roots) = (false, Vec::new());
        for r in rows {
            match (r.get::<Option<String>>(0)?, r.get::<Option<String>>(1)?) {
                (Some(root), Some(report)) => roots.push((root, report)),
                _ => pending = r.get::<i64>(2)? > 0,
            }
        }
        roots.sort();
        Ok(WidgetReports::from_rows(pending, roots))
    }

    pub async fn set_mr_note(&self, project: ProjectId, mr: MrIid, note: NoteId) -> Result<()> {
        write!(self, |c| {
            let args = args![project, mr, note, now_ms()];
            c.execute(&SET_MR_NOTE, &args).await.map(drop)
        })
    }

    pub async fn mr_note(&self, project: ProjectId, mr: MrIid) -> Result<Option<NoteId>> {
        read!(
            self,
            |c| match c.opt(&MR_NOTE, &args![project, mr]).await? {
                Some(row) => Ok(Some(NoteId(row.get::<i64>(0)? as u64))),
                None => Ok(None),
            }
        )
    }
}
