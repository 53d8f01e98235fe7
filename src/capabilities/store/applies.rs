//! Applies: one record per CI job, so a job id applies once (on any replica), and on PostgreSQL
//! the per-project lock that keeps two applies of a project apart across replicas.

use super::queue::owner_gone;
use super::sql::{args, Conn, Row, Sql};
use super::types::{ApplyId, ApplyRecord, ApplyState, NewApply};
use super::{now_ms, postgres, read, write, Db, Store};
use crate::core::ids::{CommitSha, JobId, MrIid, ProjectId};
use anyhow::Result;
use std::time::Duration;

/// `None` when this CI job has an apply already; on PostgreSQL an apply names its replica.
static BEGIN_APPLY: Sql = Sql::each(
    "INSERT INTO applies (ci_job_id, project_id, mr_iid, sha, roots, state, started_at)
     VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6) ON CONFLICT (ci_job_id) DO NOTHING RETURNING id",
    "INSERT INTO applies (ci_job_id, project_id, mr_iid, sha, roots, state, started_at, owner)
     VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6, ?7)
     ON CONFLICT (ci_job_id) DO NOTHING RETURNING id",
);
static FINISH_APPLY: Sql =
    Sql::both("UPDATE applies SET state = ?2, finished_at = ?3, detail = ?4 WHERE id = ?1");
macro_rules! apply_cols {
    () => {
        "id, ci_job_id, project_id, mr_iid, sha, roots, state, started_at, finished_at, detail"
    };
}
/// On PostgreSQL only the applies of replicas that are gone.
static MARK_INTERRUPTED: Sql = Sql::each(
    concat!(
        "UPDATE applies SET state = 'interrupted', finished_at = ?1 WHERE state = 'running'
         RETURNING ",
        apply_cols!()
    ),
    concat!(
        "UPDATE applies SET state = 'interrupted', finished_at = ?1 WHERE state = 'running' AND ",
        owner_gone!(),
        " RETURNING ",
        apply_cols!()
    ),
);
static APPLY_FOR_JOB: Sql = Sql::both(concat!(
    "SELECT ",
    apply_cols!(),
    " FROM applies WHERE ci_job_id = ?1"
));
/// Take the project's lock row if it is free, or held by a replica that is gone.
static TAKE_PROJECT_LOCK: Sql = Sql::postgres(
    "INSERT INTO project_locks (project_id, owner, token, acquired_at) VALUES (?1, ?2, ?3, ?4)
     ON CONFLICT (project_id) DO UPDATE
     SET owner = excluded.owner, token = excluded.token, acquired_at = excluded.acquired_at
     WHERE project_locks.owner NOT IN (SELECT owner FROM replicas WHERE expires_at >= ?4)
     RETURNING token",
);

fn apply_row(r: &Row) -> Result<ApplyRecord> {
    Ok(ApplyRecord {
        id: ApplyId(r.get(0)?),
        ci_job: JobId(r.get::<i64>(1)? as u64),
        project: ProjectId(r.get::<i64>(2)? as u64),
        mr: r.get::<Option<i64>>(3)?.map(|m| MrIid(m as u64)),
        sha: CommitSha(r.get(4)?),
        roots: serde_json::from_str(&r.get::<String>(5)?).unwrap_or_default(),
        state: ApplyState::parse(&r.get::<String>(6)?),
        started_at: r.get(7)?,
        finished_at: r.get(8)?,
        detail: r.get(9)?,
    })
}

impl Store {
    /// Start an apply for a CI job. `None` if this CI job has applied (or tried to) before, on
    /// any replica: one job id applies once.
    pub async fn begin_apply(&self, a: NewApply) -> Result<Option<ApplyId>> {
        let roots = serde_json::to_string(&a.roots)?;
        write!(self, |c| {
            let mut args = args![a.ci_job, a.project, a.mr, &a.sha, roots, now_ms()];
            args.extend(c.replica());
            match c.opt(&BEGIN_APPLY, &args).await? {
                Some(row) => Ok(Some(ApplyId(row.get(0)?))),
                None => Ok(None),
            }
        })
    }

    /// Finish an apply (`detail` already scrubbed).
    pub async fn finish_apply(
        &self,
        id: ApplyId,
        state: ApplyState,
        detail: Option<String>,
    ) -> Result<()> {
        write!(self, |c| {
            let args = args![id, state.as_str(), now_ms(), detail];
            c.execute(&FINISH_APPLY, &args).await.map(drop)
        })
    }

    /// At start-up: applies left `running` by a dead process become `interrupted` (never
    /// re-run); returns them so they can be reported.
    pub async fn mark_interrupted_applies(&self) -> Result<Vec<ApplyRecord>> {
        write!(self, |c| {
            let mut args = args![now_ms()];
            args.extend(c.replica());
            let rows = c.rows(&MARK_INTERRUPTED, &args).await?;
            rows.iter().map(apply_row).collect()
        })
    }

    pub async fn apply_for_job(&self, ci_job: JobId) -> Result<Option<ApplyRecord>> {
        read!(self, |c| {
            let row = c.opt(&APPLY_FOR_JOB, &args![ci_job]).await?;
            row.as_ref().map(apply_row).transpose()
        })
    }

    /// On PostgreSQL, wait until this caller alone applies to `project`, across every replica;
    /// the lock is held until the returned value is dropped (or its replica dies). On SQLite
    /// it returns at once (one process: the root locks serialise applies of a root).
    pub async fn lock_project(&self, project: ProjectId) -> Result<ProjectLock> {
        let mut waited = false;
        loop {
            if let Some(lock) = self.try_lock_project(project).await? {
                return Ok(lock);
            }
            if !waited {
                tracing::info!(
                    project = project.0,
                    "another apply of this project runs (maybe on another replica); waiting"
                );
                waited = true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// [`Store::lock_project`] without waiting: `None` while another apply of `project` holds it.
    pub async fn try_lock_project(&self, project: ProjectId) -> Result<Option<ProjectLock>> {
        let Db::Postgres(db) = &self.db else {
            // One process owns the file: its root locks (`flows::context::locks`) already keep
            // two applies of a root apart, and applies of different roots may run side by side.
            return Ok(Some(ProjectLock {
                held: Held::Nothing,
            }));
        };
        let token = format!("{}-{:016x}", db.replica(), rand::random::<u64>());
        let args = args![project, db.replica(), &token, now_ms()];
        let got = read!(self, |c| c.opt(&TAKE_PROJECT_LOCK, &args).await)?;
        Ok(got.map(|_| ProjectLock {
            held: Held::Row {
                pool: db.pool(),
                project: project.0 as i64,
                token,
            },
        }))
    }
}

/// On PostgreSQL, held while one apply of a project runs: the next waits (on any replica).
/// Released on drop. On SQLite (one process) it holds nothing: the root locks suffice there.
pub struct ProjectLock {
    held: Held,
}

enum Held {
    /// SQLite: one process owns the store; its root locks serialise applies of a root.
    Nothing,
    /// PostgreSQL: a row in `project_locks`, deleted on drop.
    Row {
        pool: deadpool_postgres::Pool,
        project: i64,
        token: String,
    },
}

impl ProjectLock {
    /// Free the lock now (dropping it frees it soon after, from a spawned task): the next
    /// apply of the project, on any replica, may start once this returns.
    pub async fn release(mut self) {
        if let Held::Row {
            pool,
            project,
            token,
        } = std::mem::replace(&mut self.held, Held::Nothing)
        {
            postgres::release_project_lock(pool, project, token).await;
        }
    }
}

impl Drop for ProjectLock {
    fn drop(&mut self) {
        if let Held::Row {
            pool,
            project,
            token,
        } = &self.held
        {
            // Without a runtime (process exit) the row frees when this replica's lease expires.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(postgres::release_project_lock(
                    pool.clone(),
                    *project,
                    token.clone(),
                ));
            }
        }
    }
}
