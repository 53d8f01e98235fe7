//! Runs (one root of one plan, apply or drift check): started, finished with their scrubbed log,
//! note and fingerprint, and listed for the run pages.

use super::sql::{args, built, Arg, Conn, IntoArg, Row, Sql};
use super::types::{NewRun, QueueJobId, RunEnd, RunKind, RunQuery, RunRecord, RunState};
use super::{head_and_tail, now_ms, read, write, Store, STORED_LOG_MAX};
use crate::core::ids::{CommitSha, MrIid, ProjectId, RunId};
use anyhow::Result;

/// On PostgreSQL a run names its replica: when that one is gone, the run is over.
static START_RUN: Sql = Sql::each(
    "INSERT INTO runs (job_id, kind, project_id, project_path, mr_iid, root, sha, state,
                       started_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', ?8) RETURNING id",
    "INSERT INTO runs (job_id, kind, project_id, project_path, mr_iid, root, sha, state,
                       started_at, owner)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', ?8, ?9) RETURNING id",
);
static FINISH_RUN: Sql = Sql::both(
    "UPDATE runs SET state = ?2, finished_at = ?3, summary = ?4, log = ?5, note_markdown = ?6,
            fingerprint = ?7
     WHERE id = ?1",
);
macro_rules! run_select {
    () => {
        "SELECT id, job_id, kind, project_id, project_path, mr_iid, root, sha, state, started_at,
                finished_at, summary, log, note_markdown, fingerprint FROM runs"
    };
}
static RUN: Sql = Sql::both(concat!(run_select!(), " WHERE id = ?1"));
static RECENT_RUNS: Sql = Sql::both(concat!(run_select!(), " ORDER BY id DESC LIMIT ?1"));
static RUNS_OF_MR: Sql = Sql::both(concat!(
    run_select!(),
    " WHERE project_id = ?1 AND mr_iid = ?2 ORDER BY id DESC"
));
static RUN_PROJECTS: Sql = Sql::both(
    "SELECT project_id, MAX(project_path) FROM runs GROUP BY project_id ORDER BY 2 NULLS FIRST",
);

fn run_row(r: &Row) -> Result<RunRecord> {
    Ok(RunRecord {
        id: RunId(r.get::<i64>(0)? as u64),
        job: r.get::<Option<i64>>(1)?.map(QueueJobId),
        kind: RunKind::parse(&r.get::<String>(2)?),
        project: ProjectId(r.get::<i64>(3)? as u64),
        project_path: r.get(4)?,
        mr: r.get::<Option<i64>>(5)?.map(|m| MrIid(m as u64)),
        root: r.get(6)?,
        sha: CommitSha(r.get(7)?),
        state: RunState::parse(&r.get::<String>(8)?),
        started_at: r.get(9)?,
        finished_at: r.get(10)?,
        summary: r.get(11)?,
        log: r.get(12)?,
        note_markdown: r.get(13)?,
        fingerprint: r.get(14)?,
    })
}

fn run_rows(rows: Vec<Row>) -> Result<Vec<RunRecord>> {
    rows.iter().map(run_row).collect()
}

impl Store {
    /// Start a run (one root of one plan or apply); it shows as `running` until finished.
    pub async fn start_run(&self, run: NewRun) -> Result<RunId> {
        write!(self, |c| {
            let mut args = args![
                run.job,
                run.kind.as_str(),
                run.project,
                run.project_path,
                run.mr,
                run.root,
                &run.sha,
                now_ms()
            ];
            args.extend(c.replica());
            Ok(RunId(c.one(&START_RUN, &args).await?.get::<i64>(0)? as u64))
        })
    }

    /// Finish a run. Every text must already be scrubbed. A log longer than
    /// [`STORED_LOG_MAX`] keeps its head and tail, with a line saying what was left out.
    pub async fn finish_run(&self, id: RunId, mut end: RunEnd) -> Result<()> {
        if end.log.len() > STORED_LOG_MAX {
            end.log = head_and_tail(&end.log, STORED_LOG_MAX);
        }
        write!(self, |c| {
            let fingerprint = end.fingerprint.as_ref().map(|f| f.as_hex().to_string());
            let args = args![
                id,
                end.state.as_str(),
                now_ms(),
                end.summary,
                end.log,
                end.note_markdown,
                fingerprint
            ];
            c.execute(&FINISH_RUN, &args).await.map(drop)
        })
    }

    pub async fn run(&self, id: RunId) -> Result<Option<RunRecord>> {
        read!(self, |c| c
            .opt(&RUN, &args![id])
            .await?
            .as_ref()
            .map(run_row)
            .transpose())
    }

    /// The newest runs first.
    pub async fn recent_runs(&self, limit: u32) -> Result<Vec<RunRecord>> {
        read!(self, |c| run_rows(
            c.rows(&RECENT_RUNS, &args![limit]).await?
        ))
    }

    /// The projects that have runs, with their last known path (for the run pages' filter).
    pub async fn run_projects(&self) -> Result<Vec<(ProjectId, Option<String>)>> {
        read!(self, |c| {
            let rows = c.rows(&RUN_PROJECTS, &[]).await?;
            rows.iter()
                .map(|r| Ok((ProjectId(r.get::<i64>(0)? as u64), r.get(1)?)))
                .collect()
        })
    }

    /// One page of runs, newest first: only of `q.projects`, optionally one MR and one state,
    /// older than `q.before`; at most `q.limit`.
    pub async fn runs_page(&self, q: RunQuery) -> Result<Vec<RunRecord>> {
        if q.projects.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = q.projects.iter().map(|p| p.0.to_string()).collect();
        let mut text = format!("{} WHERE project_id IN ({})", run_select!(), ids.join(","));
        let mut args: Vec<Arg> = Vec::new();
        let mut filter = |column: &str, arg: Arg| {
            args.push(arg);
            text.push_str(&format!(" AND {column} ?{}", args.len()));
        };
        if let Some(mr) = q.mr {
            filter("mr_iid =", mr.into_arg());
        }
        if let Some(state) = q.state {
            filter("state =", state.as_str().into_arg());
        }
        if let Some(before) = q.before {
            filter("id <", before.into_arg());
        }
        args.push(q.limit.into_arg());
        text.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", args.len()));
        read!(self, |c| {
            let rows = c.query_text(&built(c.kind(), &text), &args, false).await?;
            run_rows(rows)
        })
    }

    /// Runs of one MR, newest first.
    pub async fn runs_for_mr(&self, project: ProjectId, mr: MrIid) -> Result<Vec<RunRecord>> {
        read!(self, |c| run_rows(
            c.rows(&RUNS_OF_MR, &args![project, mr]).await?
        ))
    }
}
