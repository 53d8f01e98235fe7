//! The apply flow (design §9): verify the CI job with GitLab, re-plan the merged commit with the
//! apply credentials, and apply a root only if its fresh plan is the plan reviewed on the MR.
//!
//! The HTTP handler streams [`JobLog`] lines to the job as they come; the last line is always
//! the verdict (`planbot: apply succeeded` / `refused: ...` / `failed: ...`).

use crate::capabilities::engine::{EngineError, PlanRequest, PlannedRun};
use crate::capabilities::gitlab::{CommitStatus, GitLabError, MergeRequest, StatusState};
use crate::capabilities::store::{
    ApplyRecord, ApplyState, NewApply, NewRun, RunEnd, RunKind, RunState,
};
use crate::core::apply::{
    check_job, parity, parse_confirm, ApplyRefusal, GateFacts, JobFacts, Parity,
};
use crate::core::apply_note::{
    render_plan_changed, render_result, ApplyOutcome, PlanChangedNote, ResultNote, RootResult,
};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, JobId, MrIid, ProjectId, RunId};
use crate::core::plan::{ActionKind, Plan};
use crate::core::plan_digest::{delta, PlanDigest};
use crate::core::redact::Scrubber;
use crate::core::render::{render_note, NoteContext, RootOutcome, RootSection, NOTE_MARKER};
use crate::core::repo_config::{RepoConfig, Root};
use crate::core::summary::Summary;
use crate::flows::service::app::App;
use crate::flows::service::app::Trust;
use crate::flows::service::cpu::cpu_bound;
use crate::flows::service::locks::RootGuard;
use anyhow::{Context, Result};
use minijinja::context;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::mpsc;

/// The CI/CD component with the manual `planbot-apply` job (served at `/ci/planbot.gitlab-ci.yml`).
pub const CI_TEMPLATE: &str = crate::core::templates::APPLY_CI;

/// The commit status the apply sets on the merged commit.
pub const APPLY_STATUS: &str = "planbot/apply";

/// The request body of `POST /api/v1/apply` (all optional).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyBody {
    #[serde(default)]
    pub confirm: Option<String>,
    #[serde(default)]
    pub roots: Vec<String>,
}

/// The job log: every line is scrubbed before it leaves the process.
#[derive(Clone)]
pub struct JobLog {
    tx: mpsc::UnboundedSender<String>,
    scrubber: Arc<Scrubber>,
}

impl JobLog {
    pub fn new(scrubber: Scrubber) -> (JobLog, mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            JobLog {
                tx,
                scrubber: Arc::new(scrubber),
            },
            rx,
        )
    }

    pub fn line(&self, text: impl AsRef<str>) {
        for l in text.as_ref().lines() {
            let _ = self.tx.send(format!("{}\n", self.scrubber.scrub(l)));
        }
    }
}

/// How the whole request ended: the job log's last line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Succeeded,
    Refused(String),
    Failed(String),
}

impl Verdict {
    pub fn last_line(&self) -> String {
        match self {
            Verdict::Succeeded => log_text("succeeded", context! {}),
            Verdict::Refused(why) => log_text("refused", context! { why }),
            Verdict::Failed(why) => log_text("failed", context! { why }),
        }
    }
}

/// One line of the CI job's log (`templates/apply/log.txt.j2`).
fn log_text(kind: &str, ctx: minijinja::Value) -> String {
    crate::core::templates::text("apply/log.txt.j2", kind, ctx)
}

/// One short text of the apply (`templates/apply/status.txt.j2`).
fn say(kind: &str, ctx: minijinja::Value) -> String {
    crate::core::templates::text("apply/status.txt.j2", kind, ctx)
}

/// Run one apply request to its verdict, writing progress to `log` (the verdict last).
pub async fn run(app: Arc<App>, job_token: String, body: ApplyBody, log: JobLog) -> Verdict {
    let verdict = match verify_and_apply(&app, &job_token, &body, &log).await {
        Ok(v) => v,
        Err(e) => {
            let text = app.scrubber.scrub(&format!("{e:#}")).into_owned();
            tracing::error!(error = %text, "apply failed");
            Verdict::Failed(text)
        }
    };
    log.line(verdict.last_line());
    verdict
}

fn refuse(log: &JobLog, r: &ApplyRefusal) -> Verdict {
    log.line(log_text("hint", context! { hint => r.hint() }));
    Verdict::Refused(r.to_string())
}

/// The job and the gate, checked in order; then parity per root; then the applies.
async fn verify_and_apply(
    app: &Arc<App>,
    job_token: &str,
    body: &ApplyBody,
    log: &JobLog,
) -> Result<Verdict> {
    let confirm = match parse_confirm(body.confirm.as_deref()) {
        Ok(c) => c,
        Err(r) => return Ok(refuse(log, &r)),
    };
    let job = match app.gitlab.job_for_token(job_token).await {
        Ok(j) => j,
        Err(GitLabError::Unauthorized) | Err(GitLabError::Forbidden) => {
            return Ok(refuse(log, &ApplyRefusal::InvalidJobToken))
        }
        Err(e) => {
            app.metrics.gitlab_error("job_for_token");
            return Err(e).context("asking GitLab about the job (GET /api/v4/job)");
        }
    };
    let pipeline = job.pipeline.clone();
    let facts = JobFacts {
        job_id: job.id,
        job_name: job.name.clone(),
        status: job.status.clone(),
        git_ref: job.ref_.clone(),
        tag: job.tag,
        pipeline_project_id: pipeline.project_id,
        pipeline_sha: pipeline.sha.clone(),
        username: job.user.as_ref().map(|u| u.username.clone()),
    };
    log.line(log_text(
        "job",
        context! {
            job_id => facts.job_id,
            job_name => &facts.job_name,
            git_ref => &facts.git_ref,
            sha => facts.pipeline_sha.short(),
            user => &facts.username,
        },
    ));
    if facts.status != "running" {
        return Ok(refuse(
            log,
            &ApplyRefusal::JobNotRunning {
                status: facts.status.clone(),
            },
        ));
    }
    let project = match app
        .gitlab
        .project(&facts.pipeline_project_id.to_string())
        .await
    {
        Ok(p) => p,
        Err(GitLabError::NotFound) | Err(GitLabError::Forbidden) => {
            return Ok(refuse(
                log,
                &ApplyRefusal::ProjectNotAllowed {
                    project_id: facts.pipeline_project_id,
                },
            ))
        }
        Err(e) => return Err(e).context("GET /projects/:id"),
    };
    let allowed = app
        .config
        .gitlab
        .projects
        .allows(Some(project.id.0), Some(&project.path_with_namespace));
    let default_branch = project
        .default_branch
        .clone()
        .unwrap_or_else(|| "main".into());
    let (ref_protected, head) = if facts.tag {
        (false, CommitSha(String::new()))
    } else {
        match app.gitlab.branch(project.id, &facts.git_ref).await {
            Ok(b) => (b.protected, b.commit.id),
            Err(GitLabError::NotFound) => (false, CommitSha(String::new())),
            Err(e) => return Err(e).context("GET /repository/branches/:ref"),
        }
    };
    let default_head = if facts.git_ref == default_branch {
        head
    } else {
        app.gitlab
            .branch(project.id, &default_branch)
            .await
            .map(|b| b.commit.id)
            .context("GET /repository/branches/:default")?
    };
    let gate = GateFacts {
        allowed_projects: if allowed { vec![project.id] } else { vec![] },
        default_branch: default_branch.clone(),
        ref_protected,
        default_branch_head: default_head,
        expected_job_name: app.config.apply.job_name.clone(),
        job_already_applied: app.store.apply_for_job(facts.job_id).await?.is_some(),
    };
    if let Err(r) = check_job(&facts, &gate) {
        return Ok(refuse(log, &r));
    }
    let sha = facts.pipeline_sha.clone();

    // The MR that landed this commit: its plans are what was reviewed.
    let mr = app
        .gitlab
        .commit_merge_requests(project.id, &sha)
        .await
        .context("GET /repository/commits/:sha/merge_requests")?
        .into_iter()
        .find(|m| m.state == "merged" && m.landed_sha() == Some(&sha));
    match &mr {
        Some(m) => log.line(log_text(
            "from_mr",
            context! { sha => sha.short(), mr => m.iid },
        )),
        None => log.line(log_text("not_from_mr", context! { sha => sha.short() })),
    }

    // Workspace at the commit; the repo config of the default branch is this commit's.
    app.workspace
        .sync(project.id, &project.http_url_to_repo)
        .await
        .context("fetching the repository")?;
    let checkout = app
        .workspace
        .checkout(project.id, &sha)
        .await
        .context("checking out the commit")?;
    let config_text = std::fs::read_to_string(checkout.path().join(".planbot.toml")).ok();
    let repo_config = match RepoConfig::from_optional(config_text.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            return Ok(Verdict::Failed(say(
                "invalid_config",
                context! { branch => &default_branch, error => e.to_string() },
            )))
        }
    };
    let roots: Vec<&Root> = repo_config
        .roots
        .iter()
        .filter(|r| body.roots.is_empty() || body.roots.contains(&r.name))
        .collect();
    if roots.is_empty() {
        return Ok(Verdict::Refused(say(
            "no_root_matches",
            context! { roots => format!("{:?}", body.roots) },
        )));
    }

    let Some(apply_id) = app
        .store
        .begin_apply(NewApply {
            ci_job: facts.job_id,
            project: project.id,
            mr: mr.as_ref().map(|m| m.iid),
            sha: sha.clone(),
            roots: roots.iter().map(|r| r.name.clone()).collect(),
        })
        .await?
    else {
        return Ok(refuse(
            log,
            &ApplyRefusal::JobAlreadyApplied {
                job_id: facts.job_id,
            },
        ));
    };
    // One apply per project at a time, across replicas (held to the end of this apply).
    let _project_lock = app.store.lock_project(project.id).await?;
    let ctx = ApplyCtx {
        app: app.clone(),
        project: project.id,
        project_path: project.path_with_namespace.clone(),
        sha: sha.clone(),
        branch: default_branch.clone(),
        mr: mr.clone(),
        job_id: facts.job_id,
        user: facts.username.clone(),
        pipeline_id: Some(pipeline.id),
        log: log.clone(),
    };

    // 1. Plan every root (each under its lock) and decide; nothing is applied unless every
    //    root with changes is the reviewed plan: a half-applied main helps nobody.
    let mut decided: Vec<Decided> = Vec::new();
    for root in &roots {
        match ctx
            .plan_root(root, checkout.path(), confirm.as_deref())
            .await
        {
            Ok(d) => decided.push(d),
            Err(failure) => {
                let verdict = Verdict::Failed(failure.clone());
                ctx.finish(apply_id, &decided, &verdict, Some(&failure))
                    .await;
                return Ok(verdict);
            }
        }
    }
    if let Some(refusal) = decided.iter().find_map(|d| d.refusal.clone()) {
        for d in &decided {
            ctx.end_run(
                d.run,
                RunState::Refused,
                &say("refused", context! {}),
                &d.plan_log,
            )
            .await;
        }
        let verdict = refuse(log, &refusal);
        app.store
            .finish_apply(apply_id, ApplyState::Refused, Some(refusal.to_string()))
            .await?;
        // `failed`: the job did not apply. A retried job's `running` then starts a new status
        // (GitLab updates only a pending/running one), so the commit shows the retry's outcome.
        ctx.status(
            StatusState::Failed,
            &say(
                "refused_because",
                context! { refusal => refusal.to_string() },
            ),
        )
        .await;
        return Ok(verdict);
    }

    // 2. Apply the plan files that were just reviewed-checked, in config order.
    if decided.iter().any(|d| d.planned.is_some()) {
        ctx.status(StatusState::Running, &say("applying", context! {}))
            .await;
    }
    let mut results = Vec::new();
    let mut failure = None;
    for d in decided.iter_mut() {
        match d.planned.take() {
            None => {
                log.line(log_text("nothing_to_apply", context! { root => &d.root }));
                ctx.end_run(d.run, RunState::Succeeded, &no_changes(), &d.plan_log)
                    .await;
                results.push(RootResult {
                    name: d.root.clone(),
                    text: no_changes(),
                });
            }
            Some(planned) if failure.is_none() => {
                log.line(log_text(
                    "applying",
                    context! {
                        root => &d.root,
                        fingerprint => d.fingerprint.short(),
                        summary => d.summary.one_line(),
                    },
                ));
                let guard = d.guard.take().expect("a planned root holds its lock");
                match apply_root(&guard, planned, log).await {
                    Ok(out_log) => {
                        ctx.end_run(d.run, RunState::Succeeded, &d.summary.one_line(), &out_log)
                            .await;
                        results.push(RootResult {
                            name: d.root.clone(),
                            text: applied_words(&d.summary),
                        });
                    }
                    Err(e) => {
                        let report = e.report(40);
                        ctx.end_run(
                            d.run,
                            RunState::Failed,
                            &say("apply_failed", context! {}),
                            &report,
                        )
                        .await;
                        results.push(RootResult {
                            name: d.root.clone(),
                            text: say("apply_failed", context! {}),
                        });
                        failure = Some(say(
                            "root_failed",
                            context! { root => &d.root, error => first_error_line(&report) },
                        ));
                        d.error = Some(report);
                    }
                }
            }
            Some(_) => {
                let text = say("earlier_root_failed", context! {});
                ctx.end_run(d.run, RunState::Canceled, &text, "").await;
                results.push(RootResult {
                    name: d.root.clone(),
                    text,
                });
            }
        }
    }
    let verdict = match failure {
        None => Verdict::Succeeded,
        Some(f) => Verdict::Failed(f),
    };
    let error = decided.iter().find_map(|d| d.error.clone());
    ctx.report(apply_id, &results, &decided, &verdict, error.as_deref())
        .await;
    Ok(verdict)
}

/// Apply-style work needs the root's lock: the guard is the proof.
async fn apply_root(
    _guard: &RootGuard,
    planned: PlannedRun,
    log: &JobLog,
) -> Result<String, EngineError> {
    let out = planned.apply_streaming(|line| log.line(line)).await?;
    Ok(out.log)
}

fn applied_words(s: &Summary) -> String {
    say("applied", context! { s })
}

/// A root's (and a run's) text when there was nothing to apply.
fn no_changes() -> String {
    say("no_changes", context! {})
}

fn first_error_line(report: &str) -> String {
    report
        .lines()
        .find(|l| l.contains("Error"))
        .or_else(|| report.lines().next())
        .map(str::to_string)
        .unwrap_or_else(|| say("engine_failed", context! {}))
        .trim()
        .trim_start_matches(['│', '╷', '╵', ' '])
        .to_string()
}

/// Whether a plan changes anything at all (resources, moves, imports, outputs).
pub fn plan_has_changes(plan: &Plan) -> bool {
    plan.managed_changes().any(|rc| rc.has_change())
        || plan
            .output_changes
            .values()
            .any(|o| o.kind() != ActionKind::NoOp)
}

/// One root after planning.
struct Decided {
    root: String,
    run: RunId,
    fingerprint: Fingerprint,
    summary: Summary,
    plan_log: String,
    /// The plan to apply; `None` when there is nothing to apply.
    planned: Option<PlannedRun>,
    guard: Option<RootGuard>,
    refusal: Option<ApplyRefusal>,
    error: Option<String>,
}

struct ApplyCtx {
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
}

impl ApplyCtx {
    fn mr_iid(&self) -> Option<MrIid> {
        self.mr.as_ref().map(|m| m.iid)
    }

    async fn status(&self, state: StatusState, description: &str) {
        let status = CommitStatus {
            state,
            name: APPLY_STATUS.into(),
            description: Some(self.app.scrubber.scrub(description).into_owned()),
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

    /// Lock the root, plan it with the apply credentials, and decide by parity.
    async fn plan_root(
        &self,
        root: &Root,
        checkout: &Path,
        confirm: Option<&str>,
    ) -> Result<Decided, String> {
        let guard = match self.app.root_locks.try_lock(self.project, &root.name) {
            Some(g) => g,
            None => {
                self.log
                    .line(log_text("waiting", context! { root => &root.name }));
                self.app.root_locks.lock(self.project, &root.name).await
            }
        };
        let run = self
            .app
            .store
            .start_run(NewRun {
                job: None,
                kind: RunKind::Apply,
                project: self.project,
                project_path: Some(self.project_path.clone()),
                mr: self.mr_iid(),
                root: root.name.clone(),
                sha: self.sha.clone(),
            })
            .await
            .map_err(|e| format!("recording the run: {e:#}"))?;
        self.log.line(log_text(
            "planning",
            context! { root => &root.name, dir => &root.dir },
        ));
        let engine = self
            .app
            .engine(Trust::DefaultBranch)
            .map_err(|e| format!("{e:#}"))?;
        let request = PlanRequest {
            var_files: root.var_files.iter().map(Into::into).collect(),
            workspace: Some(root.workspace.clone()).filter(|w| !w.is_empty() && w != "default"),
            extra_secrets: self.app.config.secrets(),
            worktree: Some(checkout.to_path_buf()),
            ..PlanRequest::default()
        };
        let planned = match engine.plan(&checkout.join(&root.dir), &request).await {
            Ok(p) => p,
            Err(e) => {
                let report = self.app.scrubber.scrub(&e.report(40)).into_owned();
                self.end_run(
                    run,
                    RunState::Failed,
                    &say("plan_failed", context! {}),
                    &report,
                )
                .await;
                self.log.line(&report);
                return Err(say(
                    "root_plan_failed",
                    context! { root => &root.name, error => first_error_line(&report) },
                ));
            }
        };
        let key_bytes = self.app.config.fingerprint_key.expose().as_bytes();
        let fingerprint = cpu_bound(|| planned.fingerprint(key_bytes));
        let plan = planned.plan();
        let summary = Summary::of(plan);
        let has_changes = plan_has_changes(plan);
        self.log.line(log_text(
            "planned",
            context! {
                root => &root.name,
                summary => summary.one_line(),
                fingerprint => fingerprint.short(),
            },
        ));
        if plan.errored {
            let report = planned.log().to_string();
            self.end_run(
                run,
                RunState::Failed,
                &say("plan_errored", context! {}),
                &report,
            )
            .await;
            return Err(say("root_plan_errored", context! { root => &root.name }));
        }
        let reviewed = match &self.mr {
            Some(m) => self
                .app
                .store
                .last_shown_fingerprint(self.project, m.iid, &root.name)
                .await
                .map_err(|e| format!("{e:#}"))?,
            None => None,
        };
        let decision = parity(
            &root.name,
            &fingerprint,
            !has_changes,
            self.mr.is_some(),
            reviewed.as_ref().map(|r| &r.fingerprint),
            confirm,
            &self.sha,
        );
        let plan_log = planned.log().to_string();
        let mut decided = Decided {
            root: root.name.clone(),
            run,
            fingerprint: fingerprint.clone(),
            summary,
            plan_log,
            planned: None,
            guard: None,
            refusal: None,
            error: None,
        };
        let decision = match decision {
            Parity::Apply { .. } => {
                match self.preflight_refusal(&root.name, planned.plan()).await {
                    Some(refusal) => Parity::Refuse(refusal),
                    None => decision,
                }
            }
            other => other,
        };
        match decision {
            Parity::NothingToApply => {}
            Parity::Apply { confirmed } => {
                if confirmed {
                    self.log.line(log_text(
                        "confirmed",
                        context! { root => &root.name, fingerprint => fingerprint.short() },
                    ));
                } else {
                    self.log.line(log_text(
                        "reviewed",
                        context! {
                            root => &root.name,
                            mr => self.mr_iid().map(|m| m.0).unwrap_or_default(),
                        },
                    ));
                }
                decided.planned = Some(planned);
                decided.guard = Some(guard);
            }
            Parity::Refuse(refusal) => {
                self.print_plan(&planned, root);
                let changed = matches!(refusal, ApplyRefusal::PlanChanged { .. });
                if let (true, Some(mr), Some(reviewed)) = (changed, &self.mr, &reviewed) {
                    self.post_plan_changed(mr.iid, root, &planned, &fingerprint, reviewed)
                        .await;
                }
                decided.refusal = Some(refusal);
            }
        }
        Ok(decided)
    }

    /// The Proxmox preflight with the apply credentials, just before applying: an error
    /// finding refuses the apply (no endpoint configured: nothing to check).
    async fn preflight_refusal(&self, root: &str, plan: &Plan) -> Option<ApplyRefusal> {
        let config = &self.app.config;
        let endpoint = crate::flows::review::preflight::endpoint_from_config(
            &config.proxmox.for_apply(),
            &config.engine.env,
        );
        match crate::flows::review::preflight::before_apply(endpoint, plan).await {
            Ok(findings) => {
                for f in findings {
                    self.log.line(log_text(
                        "finding",
                        context! { rule => f.rule, address => &f.address, message => &f.message },
                    ));
                }
                None
            }
            Err(why) => Some(ApplyRefusal::PreflightFailed {
                root: root.to_string(),
                finding: why,
            }),
        }
    }

    /// Show the fresh plan in the job log (for a direct push, this is the only review).
    fn print_plan(&self, planned: &PlannedRun, root: &Root) {
        self.log
            .line(log_text("plan_is", context! { root => &root.name }));
        for rc in planned
            .plan()
            .managed_changes()
            .filter(|rc| rc.has_change())
        {
            self.log.line(log_text(
                "change",
                context! {
                    symbol => rc.kind().symbol(),
                    address => rc.display_address(),
                    verb => rc.kind().verb(),
                },
            ));
        }
    }

    async fn post_plan_changed(
        &self,
        mr: MrIid,
        root: &Root,
        planned: &PlannedRun,
        fresh: &Fingerprint,
        reviewed: &crate::capabilities::store::ShownFingerprint,
    ) {
        let key = self.app.config.fingerprint_key.expose().as_bytes();
        let fresh_digest = cpu_bound(|| PlanDigest::of(planned.plan(), key));
        let reviewed_digest = self
            .app
            .store
            .digest_for(self.project, mr, &root.name, &reviewed.sha)
            .await
            .ok()
            .flatten();
        let d = reviewed_digest
            .map(|r| delta(&r, &fresh_digest))
            .unwrap_or_default();
        let scrubber = planned.scrubber();
        let findings = cpu_bound(|| crate::core::lint::lint(planned.plan(), &root.lint_disable));
        let new_plan = cpu_bound(|| {
            render_note(
                &NoteContext {
                    sha: Some(self.sha.0.clone()),
                    engine: Some(planned.version().to_string()),
                    ..NoteContext::default()
                },
                &[RootSection {
                    name: root.name.clone(),
                    outcome: RootOutcome::Planned {
                        plan: planned.plan(),
                        findings: &findings,
                        fingerprint: fresh,
                    },
                }],
                scrubber,
            )
        })
        .replace(NOTE_MARKER, "");
        let body = render_plan_changed(
            &PlanChangedNote {
                root: &root.name,
                sha: self.sha.as_str(),
                job_name: &self.app.config.apply.job_name,
                user: self.user.as_deref(),
                reviewed_short: reviewed.fingerprint.short(),
                fresh_short: fresh.short(),
                delta: &d,
                new_plan: &new_plan,
            },
            scrubber,
        );
        let body = self.app.scrubber.scrub(&body).into_owned();
        if let Err(e) = self
            .app
            .gitlab
            .create_mr_note(self.project, mr, &body)
            .await
        {
            self.app.metrics.gitlab_error("create_mr_note");
            tracing::warn!(error = %e, "could not post the plan-changed note");
        }
    }

    /// Record, note, status after a failure before any apply ran.
    async fn finish(
        &self,
        apply_id: crate::capabilities::store::ApplyId,
        decided: &[Decided],
        verdict: &Verdict,
        error: Option<&str>,
    ) {
        let results: Vec<RootResult> = decided
            .iter()
            .map(|d| RootResult {
                name: d.root.clone(),
                text: say("not_applied", context! {}),
            })
            .collect();
        let canceled = say("other_root_failed", context! {});
        for d in decided {
            self.end_run(d.run, RunState::Canceled, &canceled, &d.plan_log)
                .await;
        }
        self.report(apply_id, &results, decided, verdict, error)
            .await;
    }

    /// The result on every surface: store, MR note, commit status, optionally an issue.
    async fn report(
        &self,
        apply_id: crate::capabilities::store::ApplyId,
        results: &[RootResult],
        decided: &[Decided],
        verdict: &Verdict,
        error: Option<&str>,
    ) {
        let (state, outcome) = match verdict {
            Verdict::Succeeded
                if decided.iter().all(|d| d.summary.is_empty())
                    && results.iter().all(|r| r.text == no_changes()) =>
            {
                (ApplyState::Succeeded, ApplyOutcome::Nothing)
            }
            Verdict::Succeeded => (ApplyState::Succeeded, ApplyOutcome::Applied),
            _ => (ApplyState::Failed, ApplyOutcome::Failed),
        };
        let detail = match verdict {
            Verdict::Succeeded => None,
            Verdict::Refused(w) | Verdict::Failed(w) => {
                Some(self.app.scrubber.scrub(w).into_owned())
            }
        };
        if let Err(e) = self.app.store.finish_apply(apply_id, state, detail).await {
            tracing::error!(error = %e, "could not record the end of the apply");
        }
        let nothing = no_changes();
        let summary = results
            .iter()
            .filter(|r| r.text != nothing)
            .map(|r| say("root_line", context! { root => &r.name, text => &r.text }))
            .collect::<Vec<_>>()
            .join("; ");
        let run_id = decided.first().map(|d| d.run);
        let run_url = run_id.and_then(|r| self.app.run_url(r));
        let scrubbed_error = error.map(|e| self.app.scrubber.scrub(e).into_owned());
        if let Some(mr) = self.mr_iid() {
            let body = render_result(
                &ResultNote {
                    outcome,
                    sha: self.sha.as_str(),
                    branch: &self.branch,
                    user: self.user.as_deref(),
                    summary: if summary.is_empty() {
                        &nothing
                    } else {
                        &summary
                    },
                    roots: results,
                    error: scrubbed_error.as_deref(),
                    log_excerpt: None,
                    job_name: &self.app.config.apply.job_name,
                    job_id: self.job_id.0,
                    run_id: run_id.map(|r| r.0),
                    run_url: run_url.as_deref(),
                },
                &self.app.scrubber,
            );
            if let Err(e) = self
                .app
                .gitlab
                .create_mr_note(self.project, mr, &body)
                .await
            {
                self.app.metrics.gitlab_error("create_mr_note");
                tracing::warn!(error = %e, "could not post the apply result");
            }
        }
        let (status, description) = match verdict {
            Verdict::Succeeded => (
                StatusState::Success,
                if summary.is_empty() {
                    nothing.clone()
                } else {
                    say("applied_roots", context! { summary => &summary })
                },
            ),
            Verdict::Refused(w) | Verdict::Failed(w) => (StatusState::Failed, w.clone()),
        };
        self.status(status, &description).await;
        if outcome == ApplyOutcome::Failed && self.app.config.apply.open_issue_on_failure {
            let issue = |kind| {
                crate::core::templates::text(
                    "apply/failure_issue.md.j2",
                    kind,
                    context! {
                        short_sha => self.sha.short(),
                        job_name => &self.app.config.apply.job_name,
                        job_id => self.job_id,
                        sha => &self.sha,
                        mr => self.mr_iid(),
                        error => scrubbed_error.as_deref().unwrap_or(""),
                        run => run_url
                            .clone()
                            .or_else(|| run_id.and_then(|r| self.app.run_hint(r))),
                    },
                )
            };
            let title = issue("title");
            let description = issue("body");
            let description = self.app.scrubber.scrub(&description).into_owned();
            if let Err(e) = self
                .app
                .gitlab
                .create_issue(self.project, &title, &description)
                .await
            {
                self.app.metrics.gitlab_error("create_issue");
                tracing::warn!(error = %e, "could not open the failure issue");
            }
        }
    }
}

/// At start-up: an apply a crash left `running` is reported as interrupted, never re-run.
pub async fn report_interrupted(app: &App, record: &ApplyRecord) {
    let text = say("interrupted", context! { roots => &record.roots });
    if let Some(mr) = record.mr {
        let roots: Vec<RootResult> = record
            .roots
            .iter()
            .map(|r| RootResult {
                name: r.clone(),
                text: say("root_interrupted", context! {}),
            })
            .collect();
        let body = render_result(
            &ResultNote {
                outcome: ApplyOutcome::Interrupted,
                sha: record.sha.as_str(),
                branch: "",
                user: None,
                summary: "",
                roots: &roots,
                error: None,
                log_excerpt: None,
                job_name: &app.config.apply.job_name,
                job_id: record.ci_job.0,
                run_id: None,
                run_url: None,
            },
            &app.scrubber,
        );
        if let Err(e) = app.gitlab.create_mr_note(record.project, mr, &body).await {
            app.metrics.gitlab_error("create_mr_note");
            tracing::warn!(error = %e, "could not report the interrupted apply on the MR");
        }
    }
    // The ref of the `running` status the interrupted apply left, so that this one moves it
    // to `failed` (GitLab updates a running status only for the same name, ref and user).
    let ref_ = match app
        .gitlab
        .commit_statuses(record.project, &record.sha)
        .await
    {
        Ok(rows) => rows
            .into_iter()
            .rev()
            .find(|r| r.name == APPLY_STATUS && matches!(r.status.as_str(), "running" | "pending"))
            .and_then(|r| r.ref_),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the interrupted apply's status");
            None
        }
    };
    let status = CommitStatus {
        state: StatusState::Failed,
        name: APPLY_STATUS.into(),
        description: Some(text),
        target_url: None,
        ref_,
        pipeline_id: None,
    };
    if let Err(e) = app
        .gitlab
        .set_commit_status(record.project, &record.sha, &status)
        .await
    {
        app.metrics.gitlab_error("set_commit_status");
        tracing::warn!(error = %e, "could not set the interrupted apply's status");
    }
}

/// How often the stream says it is still alive while the engine is quiet.
pub const KEEPALIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(20);

/// `POST /api/v1/apply`: take the job token and the optional body, start the apply, and stream
/// its log (with keep-alive lines) as plain text. The HTTP status is 200 once streaming starts;
/// a missing token or a body that is not the documented JSON is refused at once with 401/400.
pub async fn handler(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let plain = [(
        axum::http::header::CONTENT_TYPE,
        "text/plain; charset=utf-8",
    )];
    let Some(token) = headers
        .get("job-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .filter(|t| !t.is_empty())
    else {
        let line = Verdict::Refused(ApplyRefusal::InvalidJobToken.to_string()).last_line();
        return (
            axum::http::StatusCode::UNAUTHORIZED,
            plain,
            format!("{line}\n"),
        )
            .into_response();
    };
    let parsed: ApplyBody = if body.iter().all(u8::is_ascii_whitespace) {
        ApplyBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => {
                let line = Verdict::Refused(say("bad_body", context! { error => e.to_string() }))
                    .last_line();
                return (
                    axum::http::StatusCode::BAD_REQUEST,
                    plain,
                    format!("{line}\n"),
                )
                    .into_response();
            }
        }
    };
    let (log, rx) = JobLog::new(app.scrubber.clone());
    tokio::spawn(run(app, token, parsed, log));
    let stream = futures::stream::unfold(
        (
            rx,
            tokio::time::interval_at(
                tokio::time::Instant::now() + KEEPALIVE_EVERY,
                KEEPALIVE_EVERY,
            ),
            std::time::Instant::now(),
        ),
        |(mut rx, mut tick, started)| async move {
            let item = tokio::select! {
                line = rx.recv() => line?,
                _ = tick.tick() => log_text(
                    "still_working",
                    context! { seconds => started.elapsed().as_secs() },
                ) + "\n",
            };
            Some((Ok::<_, std::convert::Infallible>(item), (rx, tick, started)))
        },
    );
    (plain, axum::body::Body::from_stream(stream)).into_response()
}
