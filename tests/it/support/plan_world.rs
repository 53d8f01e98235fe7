//! A plan-flow world: the fake GitLab with one project on GitLab-managed state (as users run
//! it: a root's local state is refused), planbot's `App` configured against it with the real
//! engine, and the plan flow run for an MR head, as the worker runs it.

use crate::support::fake_gitlab::{FakeGitLab, FakeProject};
use planbot::core::config::Config;
use planbot::core::events::{PlanJob, PlanReason};
use planbot::core::ids::{CommitSha, MrIid, ProjectId};
use planbot::flows::context::app_state::App;
use tokio_util::sync::CancellationToken;

pub struct PlanWorld {
    pub fake: FakeGitLab,
    pub project: FakeProject,
    pub app: App,
    _data: tempfile::TempDir,
}

impl PlanWorld {
    /// `project_path` with `files` committed on `main`; `engine_lines` are added to the
    /// service config's `[engine]` table (e.g. an `env = { … }` line), "" for none.
    pub fn start(
        engine: &std::path::Path,
        project_path: &str,
        files: &[(&str, &str)],
        engine_lines: &str,
    ) -> PlanWorld {
        let fake = FakeGitLab::start();
        let project = fake.create_project(project_path);
        fake.commit_files(&project, "main", files);
        let data = tempfile::tempdir().unwrap();
        let text = format!(
            r#"
listen = "127.0.0.1:0"
data_dir = "{}"
public_url = "http://planbot.test"
fingerprint_key = "test-fingerprint-key-0123456789"

[gitlab]
url = "{}"
token = "{}"
webhook_secret = "whatever-secret-value"
projects = ["{project_path}"]

[engine]
binary = "{}"
timeout = "5m"
{engine_lines}
{}"#,
            data.path().display(),
            fake.url(),
            fake.bot_token(),
            engine.display(),
            fake.managed_state_config(&project)
        );
        let config = Config::load(&text, &[], &|_| Err("no files".into())).expect("config");
        let app = App::new(config).expect("app");
        planbot::flows::context::app_state::wipe_temp_root(&app.temp_root()).unwrap();
        PlanWorld {
            fake,
            project,
            app,
            _data: data,
        }
    }

    /// planbot's `data_dir` (the store, workspaces).
    pub fn data_dir(&self) -> &std::path::Path {
        self._data.path()
    }

    /// The plan job of MR `iid`'s head, as a push queues it.
    pub fn job(&self, iid: u64) -> PlanJob {
        PlanJob {
            project: ProjectId(self.project.id),
            project_path: Some(self.project.path.clone()),
            mr: MrIid(iid),
            head: CommitSha(self.fake.mr_sha(&self.project, iid)),
            target_branch: Some("main".into()),
            source_project: Some(ProjectId(self.project.id)),
            fork: false,
            draft: false,
            reason: PlanReason::NewCommits,
            requested_by: None,
        }
    }

    /// Run the plan flow for MR `iid`'s head.
    pub async fn plan(&self, iid: u64) {
        planbot::flows::review::plan::run(
            &self.app,
            &self.job(iid),
            None,
            &CancellationToken::new(),
        )
        .await
        .expect("plan flow");
    }

    /// Run the plan flow for MR `iid`'s head and return its one note.
    pub async fn plan_note(&self, iid: u64) -> String {
        self.plan(iid).await;
        let notes = self.fake.notes(&self.project, iid);
        assert_eq!(notes.len(), 1, "one note");
        notes[0].body.clone()
    }
}
