//! The apply gate (docs/workflow.md, "Apply from main"): a manual CI job on protected `main`
//! asks planbot to apply; planbot applies a root only if its fresh plan is the plan reviewed on
//! the MR. In named stages:
//!
//! 1. [`verify::verify_job`]: who the job is (GitLab `GET /job`), checked against the gate.
//! 2. [`verify::find_reviewed_mr`]: the merged MR that landed the commit.
//! 3. [`checkout`]: the workspace and the repo config at that commit; the apply is recorded
//!    once per CI job.
//! 4. [`parity::plan_and_decide`]: every root re-planned with the apply credentials, upstream
//!    roots first (`depends_on`), each fingerprint compared with the reviewed one.
//! 5. [`run::apply_all`]: the checked plan files applied upstream roots first; a root whose
//!    upstream applied is planned again and decided again ([`order`]); a failure stops the
//!    roots below it, not the others.
//! 6. [`ApplyCtx::report`]: store, MR note, commit status, failure issue.
//!
//! [`endpoint::handler`] streams [`JobLog`] lines to the job as they come; the last line is always
//! the verdict (`planbot: apply succeeded` / `refused: ...` / `failed: ...`).

mod endpoint;
mod order;
mod parity;
mod policy;
mod report;
mod run;
mod verify;

pub use endpoint::{handler, KEEPALIVE_EVERY};
pub use parity::plan_has_changes;
pub use report::report_interrupted;

use crate::capabilities::gitlab::{CommitStatus, MergeRequest, StatusState};
use crate::capabilities::state_gate::GateProject;
use crate::capabilities::store::{NewApply, RunEnd, RunState};
use crate::core::apply::{parse_confirm, ApplyRefusal};
use crate::core::apply_note::{Reliance, Relied};
use crate::core::ids::{CommitSha, JobId, MrIid, ProjectId, RunId};
use crate::core::redact::Scrubber;
use crate::core::repo_config::{RepoConfig, Root};
use crate::flows::confinement::credentials::Trust;
use crate::flows::confinement::plan_request::JobRuns;
use crate::flows::context::app_state::App;
use anyhow::{Context, Result};
use minijinja::context;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// The CI/CD component with the manual `planbot-apply` job (served at `/ci/planbot.gitlab-ci.yml`).
pub const CI_TEMPLATE: &str = crate::core::templates::APPLY_CI;

/// The request body of `POST /api/v1/apply` (all optional).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyBody {
    #[serde(default)]
    pub confirm: Option<String>,
    #[serde(default)]
    pub roots: Vec<String>,
}

/// The job log. The engine's lines (and any other text from outside planbot) are scrubbed
/// whole; planbot's own lines ([`JobLog::say`], the verdict) are rendered with their values
/// scrubbed and their words intact, so no secret can alter `planbot: apply succeeded`.
#[derive(Clone)]
pub struct JobLog {
    tx: mpsc::UnboundedSender<String>,
    scrubber: Arc<Scrubber>,
    /// Bytes sent and not yet taken by the job's connection ([`JobLogLines::recv`]).
    pending: Arc<AtomicUsize>,
    /// Outside lines not sent since the last one that was: the connection did not read them.
    dropped: Arc<AtomicUsize>,
}

/// The most bytes of the job's log planbot holds for a connection that does not read them
/// (a client that stays connected and stops reading): past it the engine's lines are counted,
/// not kept, and the log says how many; planbot's own lines and the verdict always go.
pub const JOB_LOG_PENDING_MAX: usize = 8 << 20;

/// The receiving end of a [`JobLog`], for the job's connection.
pub struct JobLogLines {
    rx: mpsc::UnboundedReceiver<String>,
    pending: Arc<AtomicUsize>,
}

impl JobLogLines {
    /// The next line, once written; `None` when the log is closed.
    pub async fn recv(&mut self) -> Option<String> {
        let line = self.rx.recv().await?;
        self.pending.fetch_sub(line.len(), Ordering::Relaxed);
        Some(line)
    }
}

impl JobLog {
    pub fn new(scrubber: Scrubber) -> (JobLog, JobLogLines) {
        let (tx, rx) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        (
            JobLog {
                tx,
                scrubber: Arc::new(scrubber),
                pending: pending.clone(),
                dropped: Arc::new(AtomicUsize::new(0)),
            },
            JobLogLines { rx, pending },
        )
    }

    /// Lines from outside planbot (the engine's output, its error report): scrubbed whole, and
    /// each kept one line that cannot read as planbot's ([`crate::core::defuse::ci_log_outside`]:
    /// control characters shown, a gutter before a line that would start with `planbot`).
    /// While the connection holds [`JOB_LOG_PENDING_MAX`] unread, they are counted instead.
    pub fn line(&self, text: impl AsRef<str>) {
        for l in text.as_ref().lines() {
            let l = crate::core::defuse::ci_log_outside(&self.scrubber.scrub(l));
            let line = format!("{l}\n");
            if self.pending.load(Ordering::Relaxed) + line.len() > JOB_LOG_PENDING_MAX {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.say_dropped();
            self.send(line);
        }
    }

    /// One of planbot's own lines (`templates/apply/log.txt.j2`), its values scrubbed.
    pub fn say(&self, kind: &str, ctx: minijinja::Value) {
        self.say_dropped();
        self.planbot_text(&crate::core::templates::scrubbing(&self.scrubber, || {
            log_text(kind, ctx)
        }));
    }

    /// The verdict, the log's last line: its reason was scrubbed when it was written.
    pub fn verdict(&self, verdict: &Verdict) {
        self.say_dropped();
        self.planbot_text(&verdict.last_line());
    }

    /// How many outside lines were not sent since the last that was, when any.
    fn say_dropped(&self) {
        let n = self.dropped.swap(0, Ordering::Relaxed);
        if n > 0 {
            self.planbot_text(&log_text("lines_not_sent", context! { n => n }));
        }
    }

    /// One of planbot's lines: a template kind is one line, so a line break a value brought
    /// stays in it, shown ([`crate::core::defuse::ci_log_own`]).
    fn planbot_text(&self, text: &str) {
        self.send(format!("{}\n", crate::core::defuse::ci_log_own(text)));
    }

    fn send(&self, line: String) {
        // Counted before it can be taken, so the count never goes below zero.
        let len = line.len();
        self.pending.fetch_add(len, Ordering::Relaxed);
        if self.tx.send(line).is_err() {
            self.pending.fetch_sub(len, Ordering::Relaxed);
        }
    }
}

/// How the whole request ended: the job log's last line. A reason is planbot's text with its
/// values already scrubbed (see [`say`]), or an error already scrubbed whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Succeeded,
    Refused(String),
    Failed(String),
}

impl Verdict {
    /// The line itself: one line, whatever its reason holds (a line break, a carriage return
    /// or a terminal escape from outside is shown, never acted on).
    pub fn last_line(&self) -> String {
        let safe = |why: &str| minijinja::Value::from_safe_string(why.to_string());
        crate::core::defuse::ci_log_own(&match self {
            Verdict::Succeeded => log_text("succeeded", context! {}),
            Verdict::Refused(why) => log_text("refused", context! { why => safe(why) }),
            Verdict::Failed(why) => log_text("failed", context! { why => safe(why) }),
        })
    }
}

/// One line of the CI job's log (`templates/apply/log.txt.j2`), exactly as the template writes
/// it (see [`JobLog::say`] for the scrubbed one).
fn log_text(kind: &str, ctx: minijinja::Value) -> String {
    crate::core::templates::text("apply/log.txt.j2", kind, ctx)
}

/// One short text of the apply (`templates/apply/status.txt.j2`), its values scrubbed with
/// `scrubber` and its words intact.
fn say(scrubber: &Scrubber, kind: &str, ctx: minijinja::Value) -> String {
    crate::core::templates::scrubbing(scrubber, || {
        crate::core::templates::text("apply/status.txt.j2", kind, ctx)
    })
}

/// Run one apply request to its verdict, writing progress to `log` (the verdict last).
pub async fn run(app: Arc<App>, job_token: String, body: ApplyBody, log: JobLog) -> Verdict {
    let mut job = JobSeen::default();
    let verdict = match verify_and_apply(&app, &job_token, &body, &log, &mut job).await {
        Ok(v) => v,
        Err(e) => Verdict::Failed(app.scrubber.scrub(&format!("{e:#}")).into_owned()),
    };
    job.log_verdict(&verdict);
    app.metrics.apply_finished(match &verdict {
        Verdict::Succeeded => "succeeded",
        Verdict::Refused(_) => "refused",
        Verdict::Failed(_) => "failed",
    });
    log.verdict(&verdict);
    verdict
}

/// Who asked for an apply, once GitLab said so: the ids of the log's verdict line.
#[derive(Default)]
struct JobSeen {
    ci_job: Option<u64>,
    project: Option<u64>,
    sha: Option<String>,
}

impl JobSeen {
    /// The log's line for the verdict: info when applied, a warning when refused or failed.
    fn log_verdict(&self, verdict: &Verdict) {
        let (ci_job, project, sha) = (self.ci_job, self.project, self.sha.as_deref());
        match verdict {
            Verdict::Succeeded => {
                tracing::info!(
                    ci_job,
                    project,
                    sha,
                    verdict = "succeeded",
                    "apply succeeded"
                )
            }
            Verdict::Refused(why) => {
                tracing::warn!(ci_job, project, sha, verdict = "refused", reason = %why, "apply refused")
            }
            Verdict::Failed(why) => {
                tracing::warn!(ci_job, project, sha, verdict = "failed", error = %why, "apply failed")
            }
        }
    }
}

/// The refusal's hint in the log, and its verdict (its values scrubbed, its words intact).
fn refuse(log: &JobLog, r: &ApplyRefusal) -> Verdict {
    let (why, hint) =
        crate::core::templates::scrubbing(&log.scrubber, || (r.to_string(), r.hint()));
    log.say(
        "hint",
        context! { hint => minijinja::Value::from_safe_string(hint) },
    );
    Verdict::Refused(why)
}

/// The stages in order; each returns early with its verdict when the apply ends there.
async fn verify_and_apply(
    app: &Arc<App>,
    job_token: &str,
    body: &ApplyBody,
    log: &JobLog,
    seen: &mut JobSeen,
) -> Result<Verdict> {
    let confirm = match parse_confirm(body.confirm.as_deref()) {
        Ok(c) => c,
        Err(r) => return Ok(refuse(log, &r)),
    };
    let job = match verify::verify_job(app, job_token, log).await? {
        Ok(j) => j,
        Err(verdict) => return Ok(verdict),
    };
    let sha = job.facts.pipeline_sha.clone();
    *seen = JobSeen {
        ci_job: Some(job.facts.job_id.0),
        project: Some(job.project.id.0),
        sha: Some(sha.short().to_string()),
    };
    tracing::info!(
        ci_job = job.facts.job_id.0,
        project = job.project.id.0,
        sha = sha.short(),
        user = job.facts.username.as_deref(),
        "apply requested"
    );
    let mr = verify::find_reviewed_mr(app, job.project.id, &sha, log).await?;
    let (checkout, repo_config) = match checkout(app, &job, &sha).await? {
        Ok(c) => c,
        Err(verdict) => return Ok(verdict),
    };
    // The policy sets as the default branch had them before the merge (and planbot's own).
    let policy =
        match policy::PolicyGate::load(app, job.project.id, &job.default_branch, &sha, mr.as_ref())
            .await?
        {
            Ok(p) => p,
            Err(verdict) => return Ok(verdict),
        };
    let order = dependency_order(&repo_config, &body.roots);
    let roots = &order.roots;
    if roots.is_empty() {
        return Ok(Verdict::Refused(say(
            &app.scrubber,
            "no_root_matches",
            context! { roots => format!("{:?}", body.roots) },
        )));
    }
    let Some(apply_id) = app
        .store
        .begin_apply(NewApply {
            ci_job: job.facts.job_id,
            project: job.project.id,
            mr: mr.as_ref().map(|m| m.iid),
            sha: sha.clone(),
            roots: roots.iter().map(|r| r.name.clone()).collect(),
        })
        .await?
    else {
        return Ok(refuse(
            log,
            &ApplyRefusal::JobAlreadyApplied {
                job_id: job.facts.job_id,
            },
        ));
    };
    // One apply per project at a time, across replicas (held to the end of this apply, and
    // freed before the job hears the verdict).
    let project_lock = match app.store.try_lock_project(job.project.id).await? {
        Some(lock) => lock,
        None => {
            log.say("project_waiting", context! {});
            app.store.lock_project(job.project.id).await?
        }
    };
    // The apply credentials, and the job's one state gate for every root's plan and apply.
    let runs = JobRuns::new(
        &app.config,
        Trust::DefaultBranch,
        GateProject {
            id: job.project.id.0,
            path: Some(job.project.path_with_namespace.clone()),
        },
        &sha,
        checkout.path(),
    );
    let ctx = ApplyCtx {
        runs,
        app: app.clone(),
        project: job.project.id,
        project_path: job.project.path_with_namespace.clone(),
        sha,
        branch: job.default_branch.clone(),
        mr,
        job_id: job.facts.job_id,
        user: job.facts.username.clone(),
        pipeline_id: Some(job.pipeline_id),
        log: log.clone(),
        policy,
        relied: Default::default(),
        left: Default::default(),
    };
    let verdict = async {
        let mut decided = match parity::plan_and_decide(
            &ctx,
            apply_id,
            roots,
            checkout.path(),
            confirm.as_deref(),
            log,
        )
        .await?
        {
            Ok(d) => d,
            Err(verdict) => return Ok(verdict),
        };
        let stage = run::Stage {
            order: &order,
            checkout: checkout.path(),
            confirm: confirm.as_deref(),
        };
        let (results, verdict) = run::apply_all(&ctx, &mut decided, &stage, log).await;
        let error = decided.iter().find_map(|d| d.error.clone());
        ctx.report(apply_id, &results, &decided, &verdict, error.as_deref())
            .await;
        Ok(verdict)
    }
    .await;
    project_lock.release().await;
    verdict
}

/// The roots this apply asked for (`only`: by name; empty: all), upstream roots first
/// (`depends_on`; among roots with no path between them, the config's order), each with what
/// it depends on directly and transitively.
fn dependency_order<'a>(config: &'a RepoConfig, only: &[String]) -> run::Order<'a> {
    let graph = config.graph();
    let asked = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let roots: Vec<&Root> = graph
        .order()
        .into_iter()
        .filter(|name| asked(name))
        .filter_map(|name| config.roots.iter().find(|r| r.name == name))
        .collect();
    let names = |list: Vec<&str>| list.into_iter().map(str::to_string).collect::<Vec<_>>();
    run::Order {
        upstreams: roots
            .iter()
            .map(|r| (r.name.clone(), names(graph.depends_on(&r.name))))
            .collect(),
        above: roots
            .iter()
            .map(|r| (r.name.clone(), names(graph.upstream_of(&r.name))))
            .collect(),
        roots,
    }
}

/// Stage 3: the workspace at the merged commit, and the repo config of the default branch,
/// which is this commit's.
async fn checkout(
    app: &App,
    job: &verify::VerifiedJob,
    sha: &CommitSha,
) -> Result<Result<(crate::capabilities::workspace::Checkout, RepoConfig), Verdict>> {
    let project = &job.project;
    let default_branch = &job.default_branch;
    app.workspace
        .sync(project.id, &project.http_url_to_repo)
        .await
        .context("fetching the repository")?;
    let checkout = app
        .workspace
        .checkout(project.id, sha)
        .await
        .context("checking out the commit")?;
    // From git, as the plan flow reads it: never through the checkout's file system, where a
    // committed symbolic link would be followed.
    let repo_config = match app
        .workspace
        .repo_config_at(project.id, sha.as_str())
        .await
        .context("reading .planbot.toml")?
    {
        Ok(c) => c,
        Err(e) => {
            return Ok(Err(Verdict::Failed(say(
                &app.scrubber,
                "invalid_config",
                context! { branch => default_branch, error => e.to_string() },
            ))))
        }
    };
    Ok(Ok((checkout, repo_config)))
}

/// What every stage after the gate works with: the verified job, its project and commit.
struct ApplyCtx {
    /// Every root's plan request (`flows::confinement::plan_request`).
    runs: JobRuns,
    app: Arc<App>,
    project: ProjectId,
    project_path: String,
    sha: CommitSha,
    branch: String,
    mr: Option<MergeRequest>,
    job_id: JobId,
    user: Option<String>,
    pipeline_id: Option<u64>,
    log: JobLog,
    /// The policy sets that judge the apply: the default branch's before the merge, and
    /// planbot's own.
    policy: policy::PolicyGate,
    /// The policy verdicts and approvals the apply relied on, one line each (as the job's log
    /// says them) with what it is: the result note lists the lines, the status counts the
    /// approvals by their [`Reliance`], never by a line's text.
    relied: std::sync::Mutex<Vec<Relied>>,
    /// The roots whose plan right after their apply was not empty, and those where that plan
    /// could not run ([`run::left_changes`]): the status text leads with them.
    left: std::sync::Mutex<Left>,
}

/// The roots an apply left changes in, and those it could not check.
#[derive(Debug, Default, Clone)]
struct Left {
    changes: Vec<String>,
    unknown: Vec<String>,
}

impl ApplyCtx {
    /// Say a policy verdict or approval (`reliance`) the apply relies on: in the job's log, and
    /// kept for the result note and the status.
    fn relied_on(&self, reliance: Reliance, kind: &str, ctx: minijinja::Value) {
        let line =
            crate::core::templates::scrubbing(&self.log.scrubber, || log_text(kind, ctx.clone()));
        self.log.say(kind, ctx);
        let line = line.trim();
        let line = line.strip_prefix("planbot: ").unwrap_or(line).to_string();
        self.relied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Relied { reliance, line });
    }

    fn mr_iid(&self) -> Option<MrIid> {
        self.mr.as_ref().map(|m| m.iid)
    }

    /// The line of an (already scrubbed) engine report that says what went wrong.
    fn first_error_line(&self, report: &str) -> String {
        report
            .lines()
            .find(|l| l.contains("Error"))
            .or_else(|| report.lines().next())
            .map(str::to_string)
            .unwrap_or_else(|| self.say("engine_failed", context! {}))
            .trim()
            .trim_start_matches(['│', '╷', '╵', ' '])
            .to_string()
    }

    /// One short text of the apply, its values scrubbed (see [`say`]).
    fn say(&self, kind: &str, ctx: minijinja::Value) -> String {
        say(&self.app.scrubber, kind, ctx)
    }

    /// The `planbot/apply` status; `description` is planbot's text whose values were scrubbed
    /// when it was rendered ([`ApplyCtx::say`]), or a scrubbed error.
    async fn status(&self, state: StatusState, description: &str) {
        let status = CommitStatus {
            state,
            name: crate::core::commit_status::APPLY.into(),
            description: Some(description.to_string()),
            target_url: None,
            ref_: Some(self.branch.clone()),
            pipeline_id: self.pipeline_id,
        };
        if let Err(e) = self
            .app
            .gitlab
            .set_commit_status(self.project, &self.sha, &status)
            .await
        {
            self.app.metrics.gitlab_error("set_commit_status");
            tracing::warn!(error = %e, "could not set the planbot/apply status");
        }
    }

    async fn end_run(&self, run: RunId, state: RunState, summary: &str, log: &str) {
        let end = RunEnd {
            state,
            summary: Some(summary.to_string()),
            log: self.app.scrubber.scrub(log).into_owned(),
            note_markdown: None,
            fingerprint: None,
        };
        if let Err(e) = self.app.store.finish_run(run, end).await {
            tracing::error!(error = %e, "could not record the end of an apply run");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_that_does_not_read_holds_a_bounded_log_and_still_gets_the_verdict() {
        let (log, mut lines) = JobLog::new(crate::core::redact::Secrets::default().scrubber());
        // 20 MiB of engine output (lines of 1 KiB with their newline), none read meanwhile.
        let line = "x".repeat(1023);
        for _ in 0..20_000 {
            log.line(&line);
        }
        assert!(log.pending.load(Ordering::Relaxed) <= JOB_LOG_PENDING_MAX);
        log.verdict(&Verdict::Succeeded);
        drop(log);
        let mut got = Vec::new();
        while let Some(l) = lines.recv().await {
            got.push(l);
        }
        // What fitted, then how many were not sent, then the verdict: always the last line.
        assert_eq!(got.len(), 8192 + 2);
        assert!(got[..8192].iter().all(|l| l.len() == 1024));
        assert!(
            got[8192].starts_with(
                "planbot: 11808 lines of the engine's output not sent here: this connection did not read them"
            ),
            "{}",
            got[8192]
        );
        assert_eq!(got[8193], "planbot: apply succeeded\n");
    }

    #[tokio::test]
    async fn lines_flow_again_once_read_and_the_gap_is_said_where_it_was() {
        let (log, mut lines) = JobLog::new(crate::core::redact::Secrets::default().scrubber());
        let line = "y".repeat(1023);
        for _ in 0..8193 {
            log.line(&line);
        }
        // The connection reads one line: room for the next.
        assert_eq!(lines.recv().await.unwrap().len(), 1024);
        log.line("after the gap");
        drop(log);
        let mut rest = Vec::new();
        while let Some(l) = lines.recv().await {
            rest.push(l);
        }
        assert_eq!(rest.len(), 8191 + 2);
        assert!(rest[8191].starts_with("planbot: 1 line of the engine's output not sent here"));
        assert_eq!(rest[8192], "after the gap\n");
    }
}
