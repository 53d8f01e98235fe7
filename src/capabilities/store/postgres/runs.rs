//! SQL for runs on PostgreSQL (one root of one plan or apply) and their logs, notes and fingerprints as shown.

use super::{opt_u64, PgStore};
use crate::capabilities::store::now_ms;
use crate::capabilities::store::types::{
    NewRun, QueueJobId, RunEnd, RunKind, RunQuery, RunRecord, RunState,
};
use crate::core::ids::{CommitSha, MrIid, ProjectId, RunId};
use anyhow::Result;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

pub(super) const RUN_SELECT: &str =
    "SELECT id, job_id, kind, project_id, project_path, mr_iid, root, sha, \
    state, started_at, finished_at, summary, log, note_markdown, fingerprint FROM runs";

pub(super) fn run_row(r: &Row) -> RunRecord {
    RunRecord {
        id: RunId(r.get::<_, i64>(0) as u64),
        job: r.get::<_, Option<i64>>(1).map(QueueJobId),
        kind: RunKind::parse(&r.get::<_, String>(2)),
        project: ProjectId(r.get::<_, i64>(3) as u64),
        project_path: r.get(4),
        mr: opt_u64(r, 5).map(MrIid),
        root: r.get(6),
        sha: CommitSha(r.get(7)),
        state: RunState::parse(&r.get::<_, String>(8)),
        started_at: r.get(9),
        finished_at: r.get(10),
        summary: r.get(11),
        log: r.get(12),
        note_markdown: r.get(13),
        fingerprint: r.get(14),
    }
}

pub(super) async fn start(store: &PgStore, run: NewRun) -> Result<RunId> {
    let row = store
        .client()
        .await?
        .query_one(
            "INSERT INTO runs (job_id, kind, project_id, project_path, mr_iid, root, sha,
                               state, started_at, owner)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'running', $8, $9) RETURNING id",
            &[
                &run.job.map(|j| j.0),
                &run.kind.as_str(),
                &(run.project.0 as i64),
                &run.project_path,
                &run.mr.map(|m| m.0 as i64),
                &run.root,
                &run.sha.0,
                &now_ms(),
                &store.opts.replica,
            ],
        )
        .await?;
    Ok(RunId(row.get::<_, i64>(0) as u64))
}

pub(super) async fn finish(store: &PgStore, id: RunId, end: RunEnd) -> Result<()> {
    store
        .client()
        .await?
        .execute(
            "UPDATE runs SET state = $2, finished_at = $3, summary = $4, log = $5,
                    note_markdown = $6, fingerprint = $7
             WHERE id = $1",
            &[
                &(id.0 as i64),
                &end.state.as_str(),
                &now_ms(),
                &end.summary,
                &end.log,
                &end.note_markdown,
                &end.fingerprint.as_ref().map(|f| f.as_hex().to_string()),
            ],
        )
        .await?;
    Ok(())
}

pub(super) async fn get(store: &PgStore, id: RunId) -> Result<Option<RunRecord>> {
    Ok(store
        .client()
        .await?
        .query_opt(&format!("{RUN_SELECT} WHERE id = $1"), &[&(id.0 as i64)])
        .await?
        .map(|r| run_row(&r)))
}

pub(super) async fn recent(store: &PgStore, limit: u32) -> Result<Vec<RunRecord>> {
    Ok(store
        .client()
        .await?
        .query(
            &format!("{RUN_SELECT} ORDER BY id DESC LIMIT $1"),
            &[&i64::from(limit)],
        )
        .await?
        .iter()
        .map(run_row)
        .collect())
}

pub(super) async fn projects(store: &PgStore) -> Result<Vec<(ProjectId, Option<String>)>> {
    Ok(store
        .client()
        .await?
        .query(
            "SELECT project_id, MAX(project_path) FROM runs GROUP BY project_id
             ORDER BY 2 NULLS FIRST",
            &[],
        )
        .await?
        .iter()
        .map(|r| (ProjectId(r.get::<_, i64>(0) as u64), r.get(1)))
        .collect())
}

pub(super) async fn page(store: &PgStore, q: RunQuery) -> Result<Vec<RunRecord>> {
    if q.projects.is_empty() {
        return Ok(Vec::new());
    }
    let projects: Vec<i64> = q.projects.iter().map(|p| p.0 as i64).collect();
    let mut args: Vec<Box<dyn ToSql + Sync + Send>> = vec![Box::new(projects)];
    let mut sql = format!("{RUN_SELECT} WHERE project_id = ANY($1)");
    if let Some(mr) = q.mr {
        args.push(Box::new(mr.0 as i64));
        sql.push_str(&format!(" AND mr_iid = ${}", args.len()));
    }
    if let Some(state) = q.state {
        args.push(Box::new(state.as_str().to_string()));
        sql.push_str(&format!(" AND state = ${}", args.len()));
    }
    if let Some(before) = q.before {
        args.push(Box::new(before.0 as i64));
        sql.push_str(&format!(" AND id < ${}", args.len()));
    }
    args.push(Box::new(i64::from(q.limit)));
    sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", args.len()));
    let refs: Vec<&(dyn ToSql + Sync)> = args
        .iter()
        .map(|a| a.as_ref() as &(dyn ToSql + Sync))
        .collect();
    Ok(store
        .client()
        .await?
        .query(&sql, &refs)
        .await?
        .iter()
        .map(run_row)
        .collect())
}

pub(super) async fn for_mr(
    store: &PgStore,
    project: ProjectId,
    mr: MrIid,
) -> Result<Vec<RunRecord>> {
    Ok(store
        .client()
        .await?
        .query(
            &format!("{RUN_SELECT} WHERE project_id = $1 AND mr_iid = $2 ORDER BY id DESC"),
            &[&(project.0 as i64), &(mr.0 as i64)],
        )
        .await?
        .iter()
        .map(run_row)
        .collect())
}
