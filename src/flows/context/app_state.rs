//! The shared state of a running service (`App`): config, store, queue, metrics, scrubber, locks.

use crate::capabilities::engine::{CliConfig, Engine, ProviderMirror};
use crate::capabilities::gitlab::{GitLab, RetryPolicy};
use crate::capabilities::store::{PgOptions, QueueJobId, Store};
use crate::capabilities::workspace::Workspace;
use crate::core::config::{Config, StoreUrl};
use crate::core::ids::{MrIid, ProjectId, UserId};
use crate::core::redact::{Scrubber, Secrets};
use crate::core::webhook;
use crate::flows::confinement::credentials::{self, Trust};
use crate::flows::context::engine_slots::{EngineSlot, EngineSlots};
pub use crate::flows::context::locks::RootLocks;
use crate::flows::context::metrics::Metrics;
use crate::flows::context::queue::Queue;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Duration;

/// Everything the HTTP handlers, the workers and the flows share. Built once per process.
pub struct App {
    pub config: Config,
    pub store: Store,
    pub queue: Queue,
    pub metrics: Metrics,
    /// Scrubs every configured secret (tokens, engine env values, Proxmox tokens) from any text.
    pub scrubber: Scrubber,
    /// Applies and drift checks of the same (project, root) never run at the same time (MR
    /// plans take no lock: they only read).
    pub root_locks: RootLocks,
    /// The engines this process runs at once, every job's together: `plan.max_concurrent_plans`
    /// slots, of which one author's plans hold at most `plan.workers_per_author`. A root's plan
    /// (MR, drift) and an apply's plan and apply each hold one while the engine runs, never
    /// held while waiting for a lock, so the roots of one MR plan side by side without more
    /// engines than the memory is sized for.
    pub engine_slots: EngineSlots,
    /// Git mirrors and per-job checkouts under `data_dir` (the bot token authenticates git).
    pub workspace: Workspace,
    /// What the webhook intake accepts.
    pub webhook: webhook::Expected,
    /// The GitLab API client, acting as the bot.
    pub gitlab: GitLab,
    /// The same client without retries and with a short timeout: probes answer fast.
    gitlab_probe: GitLab,
    /// The bot user's id (`GET /user`), looked up once: its own notes are ignored.
    bot_user: tokio::sync::OnceCell<UserId>,
    /// Who may read the run pages: GitLab sign-in, sessions, membership cache.
    pub signin: crate::flows::context::session::SignIn,
    /// The bytes all request bodies being read or handled may hold at once.
    pub bodies: crate::flows::context::request_body::Budget,
    /// GitLab's last answer to the readiness check (`GET /user`) and when it came: probes
    /// within [`GITLAB_CHECK_TTL`] reuse it, concurrent ones wait for the one in flight.
    gitlab_check: tokio::sync::Mutex<Option<(std::time::Instant, Result<(), String>)>>,
    /// Projects a CI job asked about that planbot does not serve, and when GitLab said so:
    /// see [`App::served_project`].
    foreign_projects: std::sync::Mutex<std::collections::HashMap<u64, std::time::Instant>>,
    /// The comment commands and wrong job tokens accepted per minute (this replica's count).
    pub limits: crate::flows::context::limits::Limits,
    /// What the root units of one plan job running here at once share (one checkout each).
    pub unit_bases: crate::flows::context::by_job::ByJob,
}

/// How long a project found not to be one of `gitlab.projects` (or hidden from the bot) is
/// refused without asking GitLab again.
pub const FOREIGN_PROJECT_TTL: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// At most this many such projects are remembered (the oldest is forgotten first).
pub const FOREIGN_PROJECTS_KEPT: usize = 10_000;

/// How long `/readyz` (and the home page) reuse GitLab's answer to `GET /user`.
pub const GITLAB_CHECK_TTL: std::time::Duration = std::time::Duration::from_secs(10);

impl App {
    /// One of the [`App::engine_slots`] outside any author's share (an apply's), waited for:
    /// hold it while the engine runs.
    pub async fn engine_slot(&self) -> EngineSlot {
        self.engine_slots.any().await
    }

    /// One of the [`App::engine_slots`] for a plan of `author` (`None`: planbot's own work),
    /// within the author's share: hold it while the engine runs.
    pub async fn engine_slot_of(&self, author: Option<UserId>) -> EngineSlot {
        self.engine_slots.for_author(author).await
    }

    /// Open a SQLite store (creating `data_dir`) and assemble the state; a PostgreSQL
    /// `store.url` needs [`App::open`].
    pub fn new(config: Config) -> Result<App> {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("creating data_dir {}", config.data_dir.display()))?;
        let store = match &config.store.url {
            StoreUrl::Sqlite(path) => Store::open(path)?,
            StoreUrl::Postgres(_) => {
                anyhow::bail!("a PostgreSQL store.url is opened with App::open (async)")
            }
        };
        App::with_store(config, store)
    }

    /// Open the store `store.url` names (SQLite or PostgreSQL; creating `data_dir`) and
    /// assemble the state.
    pub async fn open(config: Config) -> Result<App> {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("creating data_dir {}", config.data_dir.display()))?;
        let password = config
            .store
            .password
            .as_ref()
            .map(|p| p.expose().to_string());
        let options = PgOptions {
            lease: config.store.lease,
            ..PgOptions::default()
        };
        let store = Store::connect_tls(
            &config.store.url,
            password.as_deref(),
            config.store.ca_file.as_deref(),
            options,
        )
        .await?;
        tracing::info!(store = %config.store.url, replica = store.replica(), "store opened");
        App::with_store(config, store)
    }

    /// Assemble the state around an opened store.
    pub fn with_store(config: Config, store: Store) -> Result<App> {
        let mut secrets = Secrets::new();
        secrets.extend(config.secrets());
        let webhook = webhook::Expected {
            webhook_secret: config
                .gitlab
                .webhook_secret
                .as_ref()
                .map(|s| s.expose().to_string()),
            signing_key: config
                .gitlab
                .signing_token
                .as_ref()
                .and_then(|t| webhook::decode_signing_token(t.expose())),
        };
        let gitlab = GitLab::new(&config.gitlab.url, config.gitlab.token.expose())
            .context("gitlab.url / gitlab.token")?;
        let workspace = Workspace::new(
            &config.data_dir.join("workspaces"),
            config.gitlab.token.expose(),
        )
        .context("preparing the git workspace")?
        // A checkout is a job's file too: no commit's files may take more than a job may write.
        .with_max_checkout(config.sandbox.disk_max);
        Ok(App {
            workspace,
            store,
            queue: Queue::new(),
            metrics: Metrics::new(),
            scrubber: secrets.scrubber(),
            root_locks: RootLocks::new(),
            engine_slots: EngineSlots::new(
                config.plan.max_concurrent_plans,
                config.plan.workers_per_author,
            ),
            webhook,
            gitlab_probe: gitlab
                .clone()
                .with_retry_policy(RetryPolicy {
                    max_attempts: 1,
                    ..RetryPolicy::default()
                })
                .with_timeout(std::time::Duration::from_secs(5))?,
            gitlab,
            bot_user: tokio::sync::OnceCell::new(),
            signin: crate::flows::context::session::SignIn::new(&config)
                .context("[gitlab.oauth] / public_url")?,
            bodies: crate::flows::context::request_body::Budget::new(
                crate::flows::context::request_body::BUDGET_BYTES,
            ),
            gitlab_check: tokio::sync::Mutex::new(None),
            foreign_projects: std::sync::Mutex::default(),
            unit_bases: Default::default(),
            limits: Default::default(),
            config,
        })
    }

    /// `<data_dir>/tmp`: the private (0700) temp root for plan files; wiped at start-up.
    pub fn temp_root(&self) -> PathBuf {
        self.config.data_dir.join("tmp")
    }

    /// The engine runner for a plan of MR `mr`: untrusted code, the plan credentials, the
    /// MR's own plugin cache (see [`crate::flows::confinement::credentials`]).
    pub fn mr_engine(&self, project: ProjectId, mr: MrIid) -> Result<Engine> {
        self.engine(Trust::MergeRequest, self.mr_plugin_cache_dir(project, mr))
    }

    /// The engine runner of the default branch's plans and applies: reviewed code, the apply
    /// credentials, the plugin cache no MR can write.
    pub fn default_branch_engine(&self) -> Result<Engine> {
        let cache = self.config.data_dir.join("plugin-cache").join("main");
        self.engine(Trust::DefaultBranch, cache)
    }

    /// The engine runner of drift checks: the default branch's reviewed code, but read-only:
    /// the plan credentials and the MR plans' sandbox (the state is only read, never locked),
    /// and the default branch's plugin cache.
    pub fn drift_engine(&self) -> Result<Engine> {
        let cache = self.config.data_dir.join("plugin-cache").join("main");
        self.engine(Trust::MergeRequest, cache)
    }

    /// Each MR has its own plugin cache (untrusted code: what one MR's plan puts there reaches
    /// no other MR's plan), and the default branch's plans and applies share one that no MR can
    /// write, so an MR can never put a provider where an apply installs from. An MR's cache is
    /// removed when it is merged or closed.
    fn mr_plugin_cache_dir(&self, project: ProjectId, mr: MrIid) -> PathBuf {
        self.config
            .data_dir
            .join("plugin-cache")
            .join("mr")
            .join(format!("p{}-mr{}", project.0, mr.0))
    }

    fn engine(&self, trust: Trust, plugin_cache: PathBuf) -> Result<Engine> {
        let engine = &self.config.engine;
        let binary = crate::capabilities::engine::configured_binary(engine.binary.as_deref())
            .context("engine.binary")?;
        Engine::builder(binary, self.temp_root())
            .timeout(engine.timeout)
            // A grace longer than the timeout itself makes no sense; zero would skip SIGTERM.
            .grace(engine.grace.min(engine.timeout).max(Duration::from_secs(1)))
            .lock_timeout(engine.lock_timeout)
            .max_plan_json(engine.max_plan_json_mib * 1024 * 1024)
            .disk_max(Some(self.config.sandbox.disk_max))
            .job_cgroups(crate::flows::confinement::sandbox::job_cgroups(
                &self.config,
            ))
            .env(credentials::engine_env(&self.config, trust))
            .secret_env(engine.secret_env.clone())
            .plugin_cache_dir(plugin_cache)
            .cli_config(CliConfig::Owned {
                provider_mirror: engine.provider_mirror.as_ref().map(|m| {
                    if m.starts_with('/') {
                        ProviderMirror::Filesystem(m.into())
                    } else {
                        ProviderMirror::Network(m.clone())
                    }
                }),
            })
            .sandbox(crate::flows::confinement::sandbox::service_mode(
                &self.config,
                trust,
            ))
            .build()
            .with_context(|| match &engine.binary {
                Some(b) => format!("engine.binary = {b:?}"),
                None => "engine.binary".to_string(),
            })
    }

    /// Remove an MR's plugin cache (it is merged or closed: no plan of it will run again).
    pub fn drop_mr_plugin_cache(&self, project: ProjectId, mr: MrIid) {
        let dir = self.mr_plugin_cache_dir(project, mr);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(project = project.0, mr = mr.0, "MR plugin cache removed"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "removing an MR plugin cache")
            }
        }
    }

    /// `<data_dir>/workspaces`: git mirrors and per-job worktrees.
    pub fn workspaces_dir(&self) -> PathBuf {
        self.config.data_dir.join("workspaces")
    }

    /// Enqueue a job from inside the service (commands, reconcile, re-plans) and wake a worker;
    /// the running jobs the new one supersedes (as the store decides) are cancelled.
    pub async fn enqueue(&self, job: crate::core::events::Job) -> Result<Option<QueueJobId>> {
        let (kind, mr) = (job.kind(), job.mr());
        let e = self.store.enqueue(job).await?;
        if let Some(id) = e.id {
            tracing::info!(
                job = id.0,
                kind,
                project = mr.map(|m| m.0 .0),
                mr = mr.map(|m| m.1 .0),
                "job queued"
            );
        }
        self.queue.cancel(&e.cancel_running);
        if e.id.is_some() {
            self.queue.jobs_added(1);
        }
        Ok(e.id)
    }

    /// The run page's absolute URL, when `public_url` is set and the page can be opened by the
    /// note's readers (not with the loopback-only default: see [`App::run_hint`]).
    pub fn run_url(&self, run: crate::core::ids::RunId) -> Option<String> {
        self.page_url(&format!("/runs/{run}"))
    }

    /// A page's absolute URL (`path` below `public_url`, its prefix kept), when `public_url` is
    /// set and the pages can be opened by the note's readers.
    pub fn page_url(&self, path: &str) -> Option<String> {
        if !self.config.pages.auth.links_are_readable() {
            return None;
        }
        self.config.public_url.as_ref().map(|u| u.at(path))
    }

    /// Where a run's page can be read when it cannot be linked (loopback-only pages): the
    /// address on the planbot host itself, e.g. `http://localhost:8080/runs/12`.
    pub fn run_hint(&self, run: crate::core::ids::RunId) -> Option<String> {
        (!self.config.pages.auth.links_are_readable())
            .then(|| crate::core::links::on_the_host(self.config.listen.port(), run.0))
    }

    /// The project of a CI job that called planbot (`GET /projects/:id` with the bot token),
    /// when it is one of `gitlab.projects`; `None` when it is not, or the bot cannot see it.
    /// Any running job of the GitLab instance holds a valid job token, so anyone with a
    /// pipeline of their own could otherwise make planbot spend a bot-token call (and GitLab's
    /// per-user rate limit) on every request: a project found foreign is refused from memory
    /// for [`FOREIGN_PROJECT_TTL`]. A served project is always asked (its default branch and
    /// path are read fresh).
    pub async fn served_project(
        &self,
        id: crate::core::ids::ProjectId,
    ) -> Result<
        Option<crate::capabilities::gitlab::Project>,
        crate::capabilities::gitlab::GitLabError,
    > {
        use crate::capabilities::gitlab::GitLabError;
        let now = std::time::Instant::now();
        {
            let mut foreign = self
                .foreign_projects
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match foreign.get(&id.0) {
                Some(at) if now.duration_since(*at) < FOREIGN_PROJECT_TTL => return Ok(None),
                Some(_) => {
                    foreign.remove(&id.0);
                }
                None => {}
            }
        }
        let served = match self.gitlab.project(&id.to_string()).await {
            Ok(p) => (p.id == id
                && self
                    .config
                    .gitlab
                    .projects
                    .allows(Some(p.id.0), Some(&p.path_with_namespace)))
            .then_some(p),
            Err(GitLabError::NotFound) | Err(GitLabError::Forbidden) => None,
            Err(e) => return Err(e),
        };
        if served.is_none() {
            let mut foreign = self
                .foreign_projects
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if foreign.len() >= FOREIGN_PROJECTS_KEPT {
                foreign.retain(|_, at| now.duration_since(*at) < FOREIGN_PROJECT_TTL);
            }
            if foreign.len() >= FOREIGN_PROJECTS_KEPT {
                if let Some(oldest) = foreign.iter().min_by_key(|(_, at)| **at).map(|(k, _)| *k) {
                    foreign.remove(&oldest);
                }
            }
            foreign.insert(id.0, now);
        }
        Ok(served)
    }

    /// Whether GitLab answers with our token (`GET /user`, asked every time): for `/readyz`.
    /// Whether GitLab answers the bot's `GET /user`: asked at most once per
    /// [`GITLAB_CHECK_TTL`] however many probes come (they share the call in flight), so an
    /// unauthenticated client cannot make planbot call GitLab with the bot token.
    pub async fn gitlab_reachable(&self) -> Result<()> {
        let mut last = self.gitlab_check.lock().await;
        if let Some((at, answer)) = last.as_ref() {
            if at.elapsed() < GITLAB_CHECK_TTL {
                return answer.clone().map_err(anyhow::Error::msg);
            }
        }
        let answer = self.ask_gitlab().await.map_err(|e| format!("{e:#}"));
        *last = Some((std::time::Instant::now(), answer.clone()));
        answer.map_err(anyhow::Error::msg)
    }

    async fn ask_gitlab(&self) -> Result<()> {
        match self.gitlab_probe.current_user().await {
            Ok(u) => {
                let _ = self.bot_user.set(u.id);
                Ok(())
            }
            Err(e) => {
                self.metrics.gitlab_error("current_user");
                Err(anyhow::Error::new(e).context("GET /user"))
            }
        }
    }

    /// The bot user's id (cached after the first successful `GET /user`).
    pub async fn bot_user(&self) -> Result<UserId> {
        let id = self
            .bot_user
            .get_or_try_init(|| async {
                match self.gitlab_probe.current_user().await {
                    Ok(u) => Ok(u.id),
                    Err(e) => {
                        self.metrics.gitlab_error("current_user");
                        Err(e)
                    }
                }
            })
            .await
            .context("GET /user")?;
        Ok(*id)
    }

    /// planbot's own comment on an MR that holds `marker`: the one the store remembers for the
    /// plan note ([`crate::core::render::NOTE_MARKER`]), else the first one the bot user wrote
    /// with the marker (a look-alike another user wrote is never planbot's). The whole note,
    /// with when GitLab last saw it edited.
    pub async fn planbot_note(
        &self,
        project: ProjectId,
        mr: MrIid,
        marker: &str,
    ) -> Result<Option<crate::capabilities::gitlab::Note>> {
        let bot = self.bot_user().await?;
        let notes = match self.gitlab.mr_notes(project, mr).await {
            Ok(notes) => notes,
            Err(e) => {
                self.metrics.gitlab_error("mr_notes");
                return Err(anyhow::Error::new(e).context("mr_notes"));
            }
        };
        let cached = if marker == crate::core::render::NOTE_MARKER {
            self.store.mr_note(project, mr).await?
        } else {
            None
        };
        let found = notes.iter().find(|n| Some(n.id) == cached).or_else(|| {
            notes.iter().find(|n| {
                !n.system
                    && n.author.as_ref().is_some_and(|a| a.id == bot)
                    && n.body.contains(marker)
            })
        });
        Ok(found.cloned())
    }
}

/// At start-up: delete every run directory a crash left in the private (0700) temp root, so no
/// plan file outlives its job; the engine runner owns what a run directory is.
pub fn wipe_temp_root(dir: &std::path::Path) -> Result<()> {
    let removed = crate::capabilities::engine::wipe_temp_root(dir)
        .with_context(|| format!("wiping the private temp root {}", dir.display()))?;
    if removed > 0 {
        tracing::warn!(
            removed,
            "removed run directories (plan files) left by a crash"
        );
    }
    Ok(())
}
