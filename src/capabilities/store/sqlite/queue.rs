//! SQL for planbot's durable job queue: enqueue (with supersede), claim, finish, cancel, list.

use crate::capabilities::store::types::{
    superseded_kinds, ClaimedJob, Enqueued, JobEnd, JobRow, QueueJobId, QueueJobKind, QueueJobState,
};
use crate::core::events::{Job, Redundant, AUTHOR_FIELDS};
use crate::core::ids::{CommitSha, MrIid, ProjectId};
use anyhow::Result;
use rusqlite::{params, Connection, OptionalExtension};

/// Add a job (from a delivery, or not). An identical job already queued makes this a no-op;
/// otherwise the jobs it supersedes are canceled first (see [`Job::supersedes`]).
pub(super) fn enqueue(
    conn: &Connection,
    job: &Job,
    delivery: Option<i64>,
    now: i64,
) -> Result<Enqueued> {
    let (project, mr) = job
        .mr()
        .map(|(p, m)| (Some(p), Some(m)))
        .unwrap_or((None, None));
    let sha = job.sha().map(|s| s.0.clone());
    let payload = serde_json::to_string(job)?;
    // An identical job already waiting: nothing to add (and nothing to supersede).
    let same: Option<i64> = conn
        .query_row(
            "SELECT id FROM jobs WHERE project_id IS ?1 AND mr_iid IS ?2 AND state = 'queued' AND payload = ?3 LIMIT 1",
            params![project.map(|p| p.0 as i64), mr.map(|m| m.0 as i64), &payload],
            |r| r.get(0),
        )
        .optional()?;
    if same.is_some() || redundant(conn, job)? {
        return Ok(Enqueued::default());
    }
    let mut cancel_running = Vec::new();
    if let (Some(p), Some(m), Some(kind)) = (project, mr, superseded_kinds(job)) {
        cancel_running = cancel(conn, p, m, kind, &job.supersede_reason(), now)?;
    }
    conn.execute(
        "INSERT INTO jobs (kind, project_id, mr_iid, sha, payload, state, delivery_id, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            QueueJobKind::of(job).as_str(),
            project.map(|p| p.0 as i64),
            mr.map(|m| m.0 as i64),
            sha,
            payload,
            QueueJobState::Queued.as_str(),
            delivery,
            now
        ],
    )?;
    Ok(Enqueued {
        id: Some(QueueJobId(conn.last_insert_rowid())),
        cancel_running,
    })
}

/// Cancel queued and running jobs of an MR (of one kind, or all); returns the running ones.
pub(super) fn cancel(
    conn: &Connection,
    p: ProjectId,
    m: MrIid,
    kind: Option<QueueJobKind>,
    why: &str,
    now: i64,
) -> Result<Vec<QueueJobId>> {
    let kind = kind.map(QueueJobKind::as_str);
    let args = params![p.0 as i64, m.0 as i64, kind];
    let filter = "project_id = ?1 AND mr_iid = ?2 AND (?3 IS NULL OR kind = ?3)";
    let running = conn
        .prepare_cached(&format!(
            "SELECT id FROM jobs WHERE {filter} AND state = 'running'"
        ))?
        .query_map(args, |r| r.get::<_, i64>(0).map(QueueJobId))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    conn.prepare_cached(&format!(
        "UPDATE jobs SET state = 'canceled', detail = ?4, finished_at = ?5
         WHERE {filter} AND state IN ('queued', 'running')"
    ))?
    .execute(params![p.0 as i64, m.0 as i64, kind, why, now])?;
    Ok(running)
}

/// Take the oldest queued job of an author and an MR that hold fewer than `share` running
/// jobs, and mark it running. A payload this version cannot read is failed rather than
/// retried forever.
pub(super) fn claim_next(conn: &Connection, now: i64, share: usize) -> Result<Option<ClaimedJob>> {
    let share = i64::try_from(share).unwrap_or(i64::MAX);
    let row = conn
        .prepare_cached(&claim_sql())?
        .query_row(params![now, share], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .optional()?;
    let Some((id, payload, attempts)) = row else {
        return Ok(None);
    };
    match serde_json::from_str::<Job>(&payload) {
        Ok(job) => Ok(Some(ClaimedJob {
            id: QueueJobId(id),
            job,
            attempts: attempts as u32,
        })),
        Err(e) => {
            conn.execute(
                "UPDATE jobs SET state = 'failed', finished_at = ?2, detail = ?3 WHERE id = ?1",
                params![id, now, format!("unreadable job payload: {e}")],
            )?;
            Ok(None)
        }
    }
}

/// The claim: the oldest queued job whose author (NULL: planbot's own work, one bucket) and
/// whose MR each hold fewer than `?2` running jobs. The author is read from the payload
/// ([`AUTHOR_FIELDS`]), so the queue needs no column of its own for it.
fn claim_sql() -> String {
    let author = |t: &str| {
        let [a, b] = AUTHOR_FIELDS;
        format!("COALESCE(json_extract({t}.payload, '$.{a}'), json_extract({t}.payload, '$.{b}'))")
    };
    format!(
        "UPDATE jobs SET state = 'running', started_at = ?1, attempts = attempts + 1
         WHERE id = (
             SELECT q.id FROM jobs q WHERE q.state = 'queued'
               AND (SELECT COUNT(*) FROM jobs r WHERE r.state = 'running' AND {ar} IS {aq}) < ?2
               AND (q.mr_iid IS NULL OR (SELECT COUNT(*) FROM jobs r WHERE r.state = 'running'
                      AND r.project_id IS q.project_id AND r.mr_iid = q.mr_iid) < ?2)
             ORDER BY q.id LIMIT 1)
         RETURNING id, payload, attempts",
        ar = author("r"),
        aq = author("q"),
    )
}

/// Record how a running job ended; a job canceled meanwhile stays canceled.
pub(super) fn finish(conn: &Connection, id: QueueJobId, end: &JobEnd, now: i64) -> Result<()> {
    conn.execute(
        "UPDATE jobs SET state = ?2, detail = COALESCE(?3, detail), finished_at = ?4
         WHERE id = ?1 AND state = 'running'",
        params![id.0, end.state().as_str(), end.detail(), now],
    )?;
    Ok(())
}

/// Jobs left `running` by a dead process go back to the queue; returns how many.
pub(super) fn requeue_running(conn: &Connection) -> Result<usize> {
    Ok(conn.execute(
        "UPDATE jobs SET state = 'queued', detail = 'interrupted by a restart; re-run' WHERE state = 'running'",
        [],
    )?)
}

pub(super) fn depth(conn: &Connection) -> Result<u64> {
    Ok(conn.query_row(
        "SELECT COUNT(*) FROM jobs WHERE state = 'queued'",
        [],
        |r| r.get::<_, i64>(0),
    )? as u64)
}

pub(super) fn get(conn: &Connection, id: QueueJobId) -> Result<Option<JobRow>> {
    Ok(conn
        .query_row(&format!("{JOB_SELECT} WHERE id = ?1"), [id.0], job_row)
        .optional()?)
}

/// The newest jobs first.
pub(super) fn recent(conn: &Connection, limit: u32) -> Result<Vec<JobRow>> {
    let mut st = conn.prepare(&format!("{JOB_SELECT} ORDER BY id DESC LIMIT ?1"))?;
    let rows = st
        .query_map([limit], job_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// Whether this head has a plan: a plan job queued/running/done, or a finished plan run.
/// Whether `job` adds nothing to the plans of its head already here ([`Job::redundant`]).
fn redundant(conn: &Connection, job: &Job) -> Result<bool> {
    let (Some((p, m)), Some(sha)) = (job.mr(), job.sha()) else {
        return Ok(false);
    };
    match job.redundant() {
        Redundant::Never => Ok(false),
        Redundant::OnceHeadPlanned => head_has_plan(conn, p, m, sha),
        Redundant::WhileHeadQueuedOrRunning => {
            let n: i64 = conn.query_row(
                "SELECT COUNT(*) FROM jobs WHERE kind = 'plan' AND project_id = ?1 AND mr_iid = ?2
                   AND sha = ?3 AND state IN ('queued', 'running')",
                params![p.0 as i64, m.0 as i64, sha.0],
                |r| r.get(0),
            )?;
            Ok(n > 0)
        }
    }
}

pub(super) fn head_has_plan(
    conn: &Connection,
    project: ProjectId,
    mr: MrIid,
    sha: &CommitSha,
) -> Result<bool> {
    let n: i64 = conn.query_row(
        "SELECT (SELECT COUNT(*) FROM jobs WHERE kind = 'plan' AND project_id = ?1 AND mr_iid = ?2
                   AND sha = ?3 AND state IN ('queued', 'running', 'done'))
              + (SELECT COUNT(*) FROM runs WHERE kind = 'plan' AND project_id = ?1 AND mr_iid = ?2
                   AND sha = ?3 AND state IN ('succeeded', 'failed'))",
        params![project.0 as i64, mr.0 as i64, sha.0],
        |r| r.get(0),
    )?;
    Ok(n > 0)
}

const JOB_SELECT: &str =
    "SELECT id, kind, project_id, mr_iid, sha, state, attempts, detail, created_at, started_at, finished_at, payload FROM jobs";

fn job_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<JobRow> {
    Ok(JobRow {
        id: QueueJobId(r.get(0)?),
        kind: r.get(1)?,
        project: r.get::<_, Option<i64>>(2)?.map(|p| ProjectId(p as u64)),
        mr: r.get::<_, Option<i64>>(3)?.map(|m| MrIid(m as u64)),
        sha: r.get(4)?,
        state: r.get(5)?,
        attempts: r.get::<_, i64>(6)? as u32,
        detail: r.get(7)?,
        created_at: r.get(8)?,
        started_at: r.get(9)?,
        finished_at: r.get(10)?,
        job: serde_json::from_str(&r.get::<_, String>(11)?).ok(),
    })
}
