//! One plan request per trust level: what every engine plan of a root is asked, whoever asks
//! (an MR's plan, the apply's plan and its re-plan after an upstream applied, a drift check,
//! `planbot plan`). "Applied == reviewed" rests on the MR's plan and the apply's plan being the
//! same request but for credentials; this module is the one place that builds it.
//!
//! [`root_request`] is what a plan of a root *is* (its var files, workspace, parallelism,
//! targeting; whether it only reads the state). [`JobRuns`] adds what a job's runs are given by
//! their trust level: the checkout they run in, the secrets to scrub, the module credentials
//! for `init`, and the job's state gate (one per job, started on first use) with a pass per
//! run; the overrides that point GitLab-managed state at the gate are written into the
//! checkout here too (`core::state`, `core::state::remote`).

use crate::capabilities::engine::{CancelToken, EngineError, PlanRequest};
use crate::capabilities::state_gate::{GatePass, GateProject, StateGate};
use crate::capabilities::workspace::{self, RootFiles};
use crate::core::config::{Config, GitlabCredential, StateDefault};
use crate::core::ids::CommitSha;
use crate::core::repo_config::Root;
use crate::core::state::{self, remote, GateAccess};
use crate::core::targeting::Targeting;
use crate::flows::confinement::credentials::{self, Trust};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How many lines of the engine's output a failed plan's report keeps.
pub const REPORT_LINES: usize = 60;

/// The request of a plan of `root`, as every trust level makes it: `reads_only` for the plans
/// that never lock or write the state (an MR's, a drift check's). Credentials are added by
/// [`JobRuns::request`].
pub fn root_request(root: &Root, targeting: &Targeting, reads_only: bool) -> PlanRequest {
    PlanRequest {
        var_files: root.var_files.iter().map(PathBuf::from).collect(),
        workspace: Some(root.workspace.clone()).filter(|w| !w.is_empty() && w != "default"),
        parallelism: root.parallelism,
        targeting: targeting.clone(),
        no_lock: reads_only,
        ..PlanRequest::default()
    }
}

/// Why a root cannot be planned at all (said in the note, the run, the job's log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotPlanned {
    /// Its directory is not in the commit.
    #[error("{}", text("no_directory", minijinja::context! { dir => dir, sha => sha }))]
    NoDirectory { dir: String, sha: String },
    /// Its state is GitLab-managed and this trust level has no token (the text says which).
    #[error("{0}")]
    NoStateToken(String),
    /// Its directory leaves the checkout, or planbot's files or the state gate could not be
    /// set up (the reason has no path of the server's disk).
    #[error("{}", text("not_prepared", minijinja::context! { root => root, why => why }))]
    NotPrepared { root: String, why: String },
}

fn text(kind: &str, ctx: minijinja::Value) -> String {
    crate::core::templates::text("plan_request.txt.j2", kind, ctx)
}

/// A root's run, ready: where the engine runs and what it is asked.
#[derive(Debug)]
pub struct RootRun {
    pub dir: PathBuf,
    pub request: PlanRequest,
}

/// What every run of one job shares: whose code it is (the trust level), the project and the
/// commit, the checkout, the credentials of that trust level, and the job's state gate.
pub struct JobRuns {
    trust: Trust,
    project: GateProject,
    sha: CommitSha,
    checkout: PathBuf,
    gitlab_url: String,
    state_default: StateDefault,
    state_token: Option<GitlabCredential>,
    module_env: BTreeMap<String, String>,
    secrets: Vec<String>,
    /// The ports every engine run may connect to: the gate takes none of them.
    sandbox_ports: Vec<u16>,
    cancel: Option<CancelToken>,
    gate: tokio::sync::OnceCell<Arc<StateGate>>,
}

impl JobRuns {
    /// The runs of a job of `trust` over `project`'s commit `sha`, checked out at `checkout`.
    pub fn new(
        config: &Config,
        trust: Trust,
        project: GateProject,
        sha: &CommitSha,
        checkout: &Path,
    ) -> JobRuns {
        JobRuns {
            trust,
            project,
            sha: sha.clone(),
            checkout: checkout.to_path_buf(),
            gitlab_url: config.gitlab.url.clone(),
            state_default: config.state.default,
            state_token: match trust {
                Trust::MergeRequest => config.state.plan.clone(),
                Trust::DefaultBranch => config.state.apply.clone(),
            },
            module_env: credentials::module_env(config, trust),
            secrets: config.secrets(),
            sandbox_ports: super::network::sandbox_ports(config),
            cancel: None,
            gate: tokio::sync::OnceCell::new(),
        }
    }

    /// Every run of the job stops when `cancel` fires.
    pub fn cancelled_by(mut self, cancel: CancelToken) -> JobRuns {
        self.cancel = Some(cancel);
        self
    }

    /// Whether the job's runs only read the state (the plan credentials).
    pub fn reads_only(&self) -> bool {
        self.trust == Trust::MergeRequest
    }

    /// The run of one `fmt -check` over the job's roots from the checkout's top
    /// (`Engine::fmt_of_roots`): the checkout, the job's cancel and secrets; no credentials and
    /// no state gate (it plans nothing).
    pub fn checkout_request(&self) -> PlanRequest {
        PlanRequest {
            extra_secrets: self.secrets.clone(),
            worktree: Some(self.checkout.clone()),
            cancel: self.cancel.clone(),
            no_lock: self.reads_only(),
            ..PlanRequest::default()
        }
    }

    /// Whether `path` (repo-relative) is a directory (`dir`) or else a regular file of the
    /// checkout, also once every symbolic link is followed: what a run of the checkout may read.
    pub fn in_checkout(&self, path: &str, dir: bool) -> bool {
        let (Ok(top), Ok(real)) = (
            std::fs::canonicalize(&self.checkout),
            std::fs::canonicalize(self.checkout.join(path)),
        ) else {
            return false;
        };
        real.starts_with(top) && if dir { real.is_dir() } else { real.is_file() }
    }

    /// The run of `root` with `targeting`: [`root_request`] with the job's credentials, and for
    /// GitLab-managed state a pass through the job's gate, the root's backend override and the
    /// overrides that read other states through the gate.
    pub async fn request(&self, root: &Root, targeting: &Targeting) -> Result<RootRun, NotPlanned> {
        let dir = if root.dir == "." {
            self.checkout.clone()
        } else {
            self.checkout.join(&root.dir)
        };
        if !dir.is_dir() {
            return Err(NotPlanned::NoDirectory {
                dir: root.dir.clone(),
                sha: self.sha.short().to_string(),
            });
        }
        let mut request = PlanRequest {
            extra_secrets: self.secrets.clone(),
            worktree: Some(self.checkout.clone()),
            init_env: self.module_env.clone(),
            cancel: self.cancel.clone(),
            ..root_request(root, targeting, self.reads_only())
        };
        if let Some(pass) = self.state_pass(root).await? {
            request.extra_env = pass.env();
            request.state_gate = Some(pass);
        }
        Ok(RootRun { dir, request })
    }

    /// The run's pass through the job's gate when `root`'s state is GitLab-managed (`None`
    /// when it keeps its own backend), with the checkout's overrides written.
    async fn state_pass(&self, root: &Root) -> Result<Option<Arc<GatePass>>, NotPlanned> {
        let Some(name) = state::gitlab_state_name(root, self.state_default) else {
            return Ok(None);
        };
        let not_prepared = |why: String| NotPlanned::NotPrepared {
            root: root.name.clone(),
            why,
        };
        let Some(token) = &self.state_token else {
            return Err(NotPlanned::NoStateToken(crate::core::templates::text(
                "state.txt.j2",
                "no_token",
                minijinja::context! {
                    root => &root.name,
                    name => &name,
                    use => if self.reads_only() { "plan" } else { "apply" },
                },
            )));
        };
        let access = if self.reads_only() {
            GateAccess::Read
        } else {
            GateAccess::ReadWrite
        };
        let gate = self
            .gate
            .get_or_try_init(|| {
                StateGate::start(
                    self.project.clone(),
                    access,
                    &self.gitlab_url,
                    token,
                    &self.sandbox_ports,
                )
            })
            .await
            .map_err(|e| not_prepared(format!("starting the state gate on 127.0.0.1: {e}")))?;
        let pass = gate.pass(&name);
        let (checkout, dir, gitlab_url, gate_url) = (
            self.checkout.clone(),
            root.dir.clone(),
            self.gitlab_url.clone(),
            gate.url(),
        );
        tokio::task::spawn_blocking(move || {
            write_overrides(&checkout, &dir, &gitlab_url, &gate_url)
        })
        .await
        .map_err(|e| not_prepared(e.to_string()))?
        .map_err(|e| not_prepared(format!("{e:#}")))?;
        Ok(Some(pass))
    }
}

/// Write into the checkout what makes root `dir` use its GitLab-managed state through the
/// gate at `gate_url`: the backend override in the root, and in the root and every local
/// module it reaches, an override for each `terraform_remote_state` that reads GitLab's state
/// API. The same text for every run of the job: roots sharing a module write it alike.
fn write_overrides(
    checkout: &Path,
    dir: &str,
    gitlab_url: &str,
    gate_url: &str,
) -> anyhow::Result<()> {
    RootFiles::open(checkout, dir)?.write(state::OVERRIDE_FILE, state::OVERRIDE_TEXT)?;
    let Some(redirect) = remote::StateRedirect::new(gitlab_url, gate_url) else {
        return Ok(());
    };
    let graph = workspace::module_graph(checkout, &[dir.to_string()]);
    let modules = graph.uses(dir).modules.into_iter().map(|m| m.dir);
    for reached in std::iter::once(dir.to_string()).chain(modules) {
        // A directory that cannot be read is the engine's to report.
        let Ok(files) = RootFiles::open(checkout, &reached) else {
            continue;
        };
        let Ok(mut read) = files.config_files_within(crate::core::reach::MAX_DIR_BYTES) else {
            continue;
        };
        read.retain(|(name, _)| name != remote::OVERRIDE_FILE && name != state::OVERRIDE_FILE);
        if let Some(text) = remote::remote_state_override(&read, &redirect) {
            files.write(remote::OVERRIDE_FILE, &text)?;
        }
    }
    Ok(())
}

/// A failed plan's report: the engine's error with the end of its output, and what the run's
/// state gate refused and why (or what its credential is, when a state endpoint refused it).
pub fn failure_report(request: &PlanRequest, error: &EngineError) -> String {
    let report = error.report(REPORT_LINES);
    let refused = credentials::gate_explanation(request.state_gate.as_deref(), &report);
    if refused.is_empty() {
        report
    } else {
        format!("{report}\n\n{refused}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::repo_config::RepoConfig;

    fn config() -> Config {
        let text = r#"
fingerprint_key = "0123456789abcdef0123"
[gitlab]
url = "https://gitlab.example.com/"
token = "glpat-bot-token"
webhook_secret = "hook-secret"
projects = ["infra/homelab"]
[state]
default = "gitlab"
[state.plan]
token = "glpat-plan-token"
[state.apply]
token = "glpat-apply-token"
[modules.plan]
token = "glpat-modules-plan"
[modules.apply]
token = "glpat-modules-apply"
"#;
        Config::load(text, &[], &|_| Err("no files".into())).unwrap()
    }

    /// What a request asks the engine to plan, credentials left out.
    fn planned(r: &PlanRequest) -> String {
        format!(
            "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
            r.var_files,
            r.operator_var_files,
            r.vars,
            r.workspace,
            r.worktree,
            r.parallelism,
            r.targeting,
            r.extra_secrets
        )
    }

    #[tokio::test]
    async fn an_mr_plan_and_the_apply_ask_the_same_plan_but_for_credentials() {
        let checkout = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(checkout.path().join("stacks/vms")).unwrap();
        std::fs::write(checkout.path().join("stacks/vms/main.tf"), "").unwrap();
        let repo = RepoConfig::parse(
            r#"
[[roots]]
name = "vms"
dir = "stacks/vms"
var_files = ["prod.tfvars"]
workspace = "blue"
parallelism = 4
"#,
        )
        .unwrap();
        let root = &repo.roots[0];
        let targeting = Targeting::parse(&["-target=null_resource.a".to_string()]).unwrap();
        let config = config();
        let project = GateProject {
            id: 7,
            path: Some("infra/homelab".into()),
        };
        let sha = CommitSha("a".repeat(40));
        let runs = |trust| JobRuns::new(&config, trust, project.clone(), &sha, checkout.path());
        let (mr, apply) = (runs(Trust::MergeRequest), runs(Trust::DefaultBranch));
        let mr = mr.request(root, &targeting).await.unwrap();
        let apply = apply.request(root, &targeting).await.unwrap();
        assert_eq!(mr.dir, apply.dir);
        assert_eq!(planned(&mr.request), planned(&apply.request));
        assert!(planned(&mr.request).contains("\"prod.tfvars\""));
        assert!(planned(&mr.request).contains("Some(\"blue\")"));
        assert!(planned(&mr.request).contains("Some(4)"));
        // The credentials: the plan's read, the apply's lock and write.
        assert!(mr.request.no_lock && !apply.request.no_lock);
        assert_ne!(mr.request.init_env, apply.request.init_env);
        let (mr_gate, apply_gate) = (
            mr.request.state_gate.as_ref().unwrap(),
            apply.request.state_gate.as_ref().unwrap(),
        );
        assert_ne!(mr_gate.password(), apply_gate.password());
        assert_eq!(
            mr.request.extra_env["TF_HTTP_ADDRESS"],
            format!(
                "http://127.0.0.1:{}/api/v4/projects/7/terraform/state/vms",
                mr_gate.port()
            )
        );
        for request in [&mr.request, &apply.request] {
            let env = format!("{:?} {:?}", request.extra_env, request.init_env);
            assert!(!env.contains("glpat-plan-token") && !env.contains("glpat-apply-token"));
        }
    }

    #[tokio::test]
    async fn the_roots_of_a_job_share_its_gate_and_each_has_its_own_pass() {
        let checkout = tempfile::tempdir().unwrap();
        for d in ["stacks/a", "stacks/b", "modules/m"] {
            std::fs::create_dir_all(checkout.path().join(d)).unwrap();
        }
        let call = "module \"m\" {\n  source = \"../../modules/m\"\n}\n";
        std::fs::write(checkout.path().join("stacks/a/main.tf"), call).unwrap();
        std::fs::write(checkout.path().join("stacks/b/main.tf"), call).unwrap();
        std::fs::write(
            checkout.path().join("modules/m/main.tf"),
            "data \"terraform_remote_state\" \"net\" {\n  backend = \"http\"\n  config = {\n    address = \"https://gitlab.example.com/api/v4/projects/7/terraform/state/net\"\n  }\n}\n",
        )
        .unwrap();
        let repo = RepoConfig::parse(
            "[[roots]]\nname = \"a\"\ndir = \"stacks/a\"\n[[roots]]\nname = \"b\"\ndir = \"stacks/b\"\n",
        )
        .unwrap();
        let config = config();
        let project = GateProject { id: 7, path: None };
        let sha = CommitSha("b".repeat(40));
        let runs = JobRuns::new(&config, Trust::MergeRequest, project, &sha, checkout.path());
        let targeting = Targeting::default();
        let (a, b) = futures::join!(
            runs.request(&repo.roots[0], &targeting),
            runs.request(&repo.roots[1], &targeting)
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        let (ga, gb) = (a.request.state_gate.unwrap(), b.request.state_gate.unwrap());
        assert_eq!(ga.port(), gb.port());
        assert_ne!(ga.password(), gb.password());
        let written = std::fs::read_to_string(
            checkout
                .path()
                .join("modules/m")
                .join(remote::OVERRIDE_FILE),
        )
        .unwrap();
        assert!(
            written.contains(&format!(
                "\"http://127.0.0.1:{}/api/v4/projects/\"",
                ga.port()
            )),
            "{written}"
        );
        for root in ["stacks/a", "stacks/b"] {
            let backend = checkout.path().join(root).join(state::OVERRIDE_FILE);
            assert_eq!(
                std::fs::read_to_string(backend).unwrap(),
                state::OVERRIDE_TEXT
            );
        }
    }

    #[tokio::test]
    async fn a_root_that_cannot_be_planned_says_why() {
        let checkout = tempfile::tempdir().unwrap();
        let repo = RepoConfig::parse("[[roots]]\nname = \"net\"\ndir = \"stacks/net\"\n").unwrap();
        let config = config();
        let sha = CommitSha("c".repeat(40));
        let project = GateProject { id: 7, path: None };
        let runs = JobRuns::new(&config, Trust::MergeRequest, project, &sha, checkout.path());
        let err = runs
            .request(&repo.roots[0], &Targeting::default())
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the root directory `stacks/net` does not exist at cccccccc"
        );
    }
}
