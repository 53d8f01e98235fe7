//! One world for every story: the fake GitLab with the repository (real git commits), planbot's
//! config (one builder of its text), and planbot itself (in process, or its `App`); then what a
//! user does (open an MR, comment, click the apply job) and what a user sees (the note, a status,
//! the job's log). `World::builder().engine(&e).managed_state().file("main.tf", tf).build()`.

use crate::support::fake_gitlab::{
    FakeGitLab, FakeJob, FakeProject, FakeStatus, FakeUser, DEVELOPER, MAINTAINER,
};
use crate::support::service::{token_headers, TestService, METRICS_TOKEN, WEBHOOK_SECRET};
use planbot::core::config::Config;
use planbot::core::events::{PlanJob, PlanReason};
use planbot::core::ids::{CommitSha, MrIid, ProjectId};
use planbot::flows::context::app_state::App;
use planbot::flows::service::server::Options;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The project of most stories.
pub const INFRA: &str = "infra/homelab";
/// The fingerprint key of the tests' configs.
pub const FINGERPRINT_KEY: &str = "test-fingerprint-key-0123456789";

/// planbot's config file as the tests write it: the keys of each table, in the order set (a key
/// set again replaces the earlier value), `[[policy_sets]]`, then raw TOML; the environment and
/// secret files it is loaded with.
#[derive(Clone, Default)]
pub struct PlanbotConfig {
    tables: Vec<(String, Vec<(String, String)>)>,
    policy_sets: Vec<(String, String)>,
    raw: String,
    env: Vec<(String, String)>,
    files: BTreeMap<String, String>,
}

fn quoted(s: &str) -> String {
    format!("\"{s}\"")
}

impl PlanbotConfig {
    /// The fewest keys: the fingerprint key and `[gitlab]` (`url`, the bot's `token`, the
    /// webhook secret, `projects = ["infra/homelab"]`).
    pub fn for_gitlab(url: &str, token: &str) -> PlanbotConfig {
        PlanbotConfig::default()
            .set("", "fingerprint_key", &quoted(FINGERPRINT_KEY))
            .set("gitlab", "url", &quoted(url))
            .set("gitlab", "token", &quoted(token))
            .set("gitlab", "webhook_secret", &quoted(WEBHOOK_SECRET))
            .projects(&[INFRA])
    }

    /// [`PlanbotConfig::for_gitlab`] of a service: listening on 127.0.0.1:0, its data in
    /// `data_dir`, its public URL `http://planbot.test`.
    pub fn serving(url: &str, token: &str, data_dir: &Path) -> PlanbotConfig {
        PlanbotConfig::for_gitlab(url, token)
            .set("", "listen", &quoted("127.0.0.1:0"))
            .set("", "data_dir", &quoted(&data_dir.display().to_string()))
            .set("", "public_url", &quoted("http://planbot.test"))
    }

    /// [`PlanbotConfig::for_gitlab`] as an operator deploys it at `https://planbot.example.com`
    /// (a long fingerprint key, its own webhook secret), its data in `dir/data`.
    pub fn deployed(url: &str, token: &str, dir: &Path) -> PlanbotConfig {
        PlanbotConfig::for_gitlab(url, token)
            .set(
                "",
                "data_dir",
                &quoted(&dir.join("data").display().to_string()),
            )
            .set("", "public_url", &quoted("https://planbot.example.com"))
            .set(
                "",
                "fingerprint_key",
                &quoted("a-long-random-server-secret-0123456789"),
            )
            .set("gitlab", "webhook_secret", &quoted("hook-secret-5f3a"))
    }

    /// The README's five-minute start (its step 3) as an operator runs it in the directory
    /// `dir`: `deploy/planbot.toml` copied, with the edits the README names
    /// ([`five_minute_edits`]: `gitlab.url` the fake GitLab, `projects` the project); its
    /// secrets as files in `dir/credentials` (`$CREDENTIALS_DIRECTORY`): the fingerprint key,
    /// the webhook secret (the tests' [`WEBHOOK_SECRET`]), the bot's token, a Developer's token
    /// for MR plans to read the state and a Maintainer's for applies to write it
    /// (`state-reader`, `state-writer`); its data in `dir/data` (`$PLANBOT_DATA_DIR`). The
    /// engine is the one planbot finds on `PATH`, as the starting config names none.
    pub fn five_minute_start(
        gitlab: &FakeGitLab,
        project: &FakeProject,
        dir: &Path,
    ) -> PlanbotConfig {
        let copied = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/planbot.toml"),
        )
        .unwrap();
        let mut toml: toml::Table = copied.parse().unwrap();
        five_minute_edits(
            &mut toml,
            gitlab.url(),
            "https://planbot.corp.test",
            &[&project.path],
        );
        let reader = gitlab.member_with_role(project, "state-reader", DEVELOPER);
        let writer = gitlab.member_with_role(project, "state-writer", MAINTAINER);
        let (credentials, data) = (dir.join("credentials"), dir.join("data"));
        for d in [&credentials, &data] {
            std::fs::create_dir_all(d).unwrap();
        }
        for (file, secret) in [
            ("fingerprint-key", FINGERPRINT_KEY),
            ("webhook-secret", WEBHOOK_SECRET),
            ("gitlab-token", gitlab.bot_token()),
            ("state-plan-token", &reader.token),
            ("state-apply-token", &writer.token),
        ] {
            std::fs::write(credentials.join(file), format!("{secret}\n")).unwrap();
        }
        let mut config = PlanbotConfig::from_toml(&toml);
        config.env = vec![
            (
                "CREDENTIALS_DIRECTORY".into(),
                credentials.display().to_string(),
            ),
            ("PLANBOT_DATA_DIR".into(), data.display().to_string()),
        ];
        config
    }

    /// A config file as `toml` reads it, key by key (top-level keys first, then each table,
    /// `[a.b]` as table "a.b"); arrays of tables are not taken.
    pub fn from_toml(toml: &toml::Table) -> PlanbotConfig {
        fn keys(mut config: PlanbotConfig, table: &str, t: &toml::Table) -> PlanbotConfig {
            for (k, v) in t.iter().filter(|(_, v)| !v.is_table()) {
                let tables = v.as_array().is_some_and(|a| a.iter().any(|x| x.is_table()));
                assert!(!tables, "an array of tables: {table}.{k}");
                config = config.set(table, k, &v.to_string());
            }
            for (k, v) in t {
                if let Some(sub) = v.as_table() {
                    let name = match table {
                        "" => k.clone(),
                        _ => format!("{table}.{k}"),
                    };
                    config = keys(config, &name, sub);
                }
            }
            config
        }
        keys(PlanbotConfig::default(), "", toml)
    }

    /// `key = value` (value as TOML) in `table` ("" for the top level, e.g. "engine.env").
    pub fn set(mut self, table: &str, key: &str, value: &str) -> PlanbotConfig {
        let i = match self.tables.iter().position(|(t, _)| t == table) {
            Some(i) => i,
            None => {
                self.tables.push((table.to_string(), Vec::new()));
                self.tables.len() - 1
            }
        };
        let keys = &mut self.tables[i].1;
        match keys.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = value.to_string(),
            None => keys.push((key.to_string(), value.to_string())),
        }
        self
    }

    /// Without `key` in `table`.
    pub fn unset(mut self, table: &str, key: &str) -> PlanbotConfig {
        for (t, keys) in &mut self.tables {
            if t == table {
                keys.retain(|(k, _)| k != key);
            }
        }
        self
    }

    /// Each `key = value` line of `lines` in `table` (lines that are no such pair are refused).
    pub fn lines(mut self, table: &str, lines: &str) -> PlanbotConfig {
        for line in lines.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (k, v) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("not a `key = value` line: {line}"));
            self = self.set(table, k.trim(), v.trim());
        }
        self
    }

    /// More TOML after everything else (whole tables).
    pub fn raw(mut self, toml: &str) -> PlanbotConfig {
        self.raw.push('\n');
        self.raw.push_str(toml);
        self
    }

    /// `[gitlab] projects`.
    pub fn projects(self, projects: &[&str]) -> PlanbotConfig {
        let list: Vec<String> = projects.iter().map(|p| quoted(p)).collect();
        self.set("gitlab", "projects", &format!("[{}]", list.join(", ")))
    }

    /// Deliveries signed with [`crate::support::service::SIGNING_TOKEN`].
    pub fn signing(self) -> PlanbotConfig {
        self.set(
            "gitlab",
            "signing_token",
            &quoted(crate::support::service::SIGNING_TOKEN),
        )
    }

    /// `[engine] binary` (and a timeout of 5 minutes).
    pub fn engine(self, binary: &Path) -> PlanbotConfig {
        self.set("engine", "binary", &quoted(&binary.display().to_string()))
            .set("engine", "timeout", &quoted("5m"))
    }

    /// `[plan] max_concurrent_plans`.
    pub fn plan_slots(self, n: usize) -> PlanbotConfig {
        self.set("plan", "max_concurrent_plans", &n.to_string())
    }

    /// `/metrics` behind [`METRICS_TOKEN`].
    pub fn metrics(self) -> PlanbotConfig {
        self.set("metrics", "token", &quoted(METRICS_TOKEN))
    }

    /// The engine's sandbox may also connect to `port` (beside 443).
    pub fn sandbox_reaches(self, port: u16) -> PlanbotConfig {
        self.set("sandbox", "connect_ports", &format!("[443, {port}]"))
    }

    /// GitLab-managed state for `project`, as the README sets it up (`[state]` with a
    /// Developer's token for MR plans, a Maintainer's for applies).
    pub fn managed_state(self, gitlab: &FakeGitLab, project: &FakeProject) -> PlanbotConfig {
        self.raw(&gitlab.managed_state_config(project))
    }

    /// The documented state recipe of docs/workflow.md as written: its token files in
    /// `$CREDENTIALS_DIRECTORY` (as systemd's `LoadCredential=` fills it) hold a Developer's and
    /// a Maintainer's token.
    pub fn documented_state(mut self, gitlab: &FakeGitLab, project: &FakeProject) -> PlanbotConfig {
        let reader = gitlab.member_with_role(project, "state-reader", DEVELOPER);
        let writer = gitlab.member_with_role(project, "state-writer", MAINTAINER);
        let dir = "/run/credentials/planbot.service";
        self.env.push(("CREDENTIALS_DIRECTORY".into(), dir.into()));
        self.files.insert(
            format!("{dir}/state-plan-token"),
            format!("{}\n", reader.token),
        );
        self.files.insert(
            format!("{dir}/state-apply-token"),
            format!("{}\n", writer.token),
        );
        self.raw(&documented_block("state recipe: planbot.toml"))
    }

    /// The `http` backend of state `core` configured by hand, least privilege per trust level:
    /// MR plans read it with a Developer's token (and never lock it), applies write it with a
    /// Maintainer's; the engine's sandbox reaches the fake GitLab's port and nothing else.
    pub fn state_by_hand(self, gitlab: &FakeGitLab, project: &FakeProject) -> PlanbotConfig {
        let state = format!(
            "{}/api/v4/projects/{}/terraform/state/core",
            gitlab.url(),
            project.id
        );
        let reader = gitlab.member_with_role(project, "state-reader", DEVELOPER);
        let writer = gitlab.member_with_role(project, "state-writer", MAINTAINER);
        let port = url::Url::parse(gitlab.url()).unwrap().port().unwrap();
        self.http_backend(&state)
            .set(
                "engine.plan.env",
                "TF_HTTP_PASSWORD",
                &quoted(&reader.token),
            )
            .set(
                "engine.apply.env",
                "TF_HTTP_PASSWORD",
                &quoted(&writer.token),
            )
            .sandbox_reaches(port)
    }

    /// The engine's `http` backend at `address` (its lock at `…/lock`) as user `planbot`, in
    /// `[engine.env]`; the password is the caller's to set.
    pub fn http_backend(self, address: &str) -> PlanbotConfig {
        let lock = quoted(&format!("{address}/lock"));
        self.set("engine.env", "TF_HTTP_ADDRESS", &quoted(address))
            .set("engine.env", "TF_HTTP_LOCK_ADDRESS", &lock)
            .set("engine.env", "TF_HTTP_UNLOCK_ADDRESS", &lock)
            .set("engine.env", "TF_HTTP_LOCK_METHOD", &quoted("POST"))
            .set("engine.env", "TF_HTTP_UNLOCK_METHOD", &quoted("DELETE"))
            // A user name is no secret: "planbot" stays in every note and in the verdict line.
            .set("engine.env", "TF_HTTP_USERNAME", &quoted("planbot"))
    }

    /// One of planbot's own (operator) policy sets.
    pub fn policy_set(mut self, name: &str, path: &Path) -> PlanbotConfig {
        self.policy_sets
            .push((name.to_string(), path.display().to_string()));
        self
    }

    /// `[proxmox]`: its API at `endpoint` with the apply's `api_token` (`ID=SECRET`).
    pub fn proxmox(self, endpoint: &str, api_token: &str) -> PlanbotConfig {
        self.set(
            "proxmox",
            "endpoint",
            &quoted(endpoint.trim_end_matches('/')),
        )
        .set("proxmox", "api_token", &quoted(api_token))
    }

    /// The config file's text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (table, keys) in &self.tables {
            if !table.is_empty() {
                out.push_str(&format!("\n[{table}]\n"));
            }
            for (k, v) in keys {
                out.push_str(&format!("{k} = {v}\n"));
            }
        }
        for (name, path) in &self.policy_sets {
            out.push_str(&format!(
                "\n[[policy_sets]]\nname = {}\npath = {}\n",
                quoted(name),
                quoted(path)
            ));
        }
        out.push_str(&self.raw);
        out
    }

    /// The config as `serve` loads it (with its environment and secret files; any other file
    /// is read from disk). Panics quoting the text when it is not valid.
    pub fn load(&self) -> Config {
        let text = self.text();
        let read = |path: &str| match self.files.get(path) {
            Some(t) => Ok(t.clone()),
            None => std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}")),
        };
        Config::load(&text, &self.env, &read)
            .unwrap_or_else(|e| panic!("the test config is not valid: {e}\n{text}"))
    }

    /// Write the text to `dir/planbot.toml` and return that path.
    pub fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("planbot.toml");
        std::fs::write(&path, self.text()).unwrap();
        path
    }
}

/// The edits the README's five-minute start asks of the copied `deploy/planbot.toml` ("edit:
/// gitlab.url, public_url, projects"), and `listen` on a port of its own (the machine runs
/// other services).
pub fn five_minute_edits(
    toml: &mut toml::Table,
    gitlab_url: &str,
    public_url: &str,
    projects: &[&str],
) {
    toml["gitlab"]["url"] = gitlab_url.into();
    toml["gitlab"]["projects"] = projects.to_vec().into();
    toml["public_url"] = public_url.into();
    toml["listen"] = "127.0.0.1:0".into();
}

/// The fenced block right after `<!-- {marker} -->` in docs/workflow.md: the recipe as written.
pub fn documented_block(marker: &str) -> String {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/workflow.md"))
            .unwrap();
    let (_, after) = page
        .split_once(&format!("<!-- {marker} -->"))
        .unwrap_or_else(|| panic!("docs/workflow.md has no `<!-- {marker} -->`"));
    let body = after
        .split_once("```")
        .and_then(|(_, b)| b.split_once('\n'))
        .map(|(_, b)| b)
        .unwrap();
    body.split_once("\n```").unwrap().0.to_string()
}

/// How the engine's state is set up (see the [`PlanbotConfig`] method of each).
#[derive(Clone, Copy, PartialEq)]
enum State {
    None,
    /// The whole config is the README's ([`PlanbotConfig::five_minute_start`]).
    FiveMinuteStart,
    Managed,
    Documented,
    ByHand,
}

/// What the repository gets before its first commit when the fake GitLab runs (files and
/// config that name it).
pub struct Prepared {
    pub project: FakeProject,
    pub files: Vec<(String, String)>,
    pub config: PlanbotConfig,
}

type Prepare<'a> = Box<dyn FnOnce(&FakeGitLab, &mut Prepared) + 'a>;

/// What a story sets up, said in order; [`WorldBuilder::build`] makes it.
pub struct WorldBuilder<'a> {
    project: String,
    members: Vec<(String, u32)>,
    groups: Vec<(String, String, u32)>,
    files: Vec<(String, String)>,
    engine: Option<PathBuf>,
    state: State,
    signin: bool,
    operator_policies: Vec<(String, Vec<(String, String)>)>,
    config: Vec<Box<dyn FnOnce(PlanbotConfig) -> PlanbotConfig + 'a>>,
    prepare: Vec<Prepare<'a>>,
}

/// A story's world: the fake GitLab, its project `infra/homelab` (alice a Maintainer unless said
/// otherwise), planbot's config (`config`, loaded from `planbot`) and its data dir.
pub struct World {
    pub gitlab: FakeGitLab,
    pub project: FakeProject,
    pub config: Config,
    /// The config's text and how it loads: to write it as a file, or vary it.
    pub planbot: PlanbotConfig,
    app: std::sync::OnceLock<App>,
    _dirs: Vec<tempfile::TempDir>,
}

impl World {
    pub fn builder<'a>() -> WorldBuilder<'a> {
        WorldBuilder {
            project: INFRA.to_string(),
            members: vec![("alice".into(), MAINTAINER)],
            groups: Vec::new(),
            files: Vec::new(),
            engine: None,
            state: State::None,
            signin: false,
            operator_policies: Vec::new(),
            config: Vec::new(),
            prepare: Vec::new(),
        }
    }
}

impl World {
    /// The apply stories' world: `main.tf` of [`crate::support::infra_main_tf`] with the VM
    /// `blocky` on `main`, run by `engine`, its state `core` by hand
    /// ([`PlanbotConfig::state_by_hand`]).
    pub fn homelab<'a>(engine: &Path) -> WorldBuilder<'a> {
        World::builder()
            .engine(engine)
            .state_by_hand()
            .file("main.tf", &crate::support::infra_main_tf(&["blocky"]))
    }
}

impl<'a> WorldBuilder<'a> {
    /// The project's path (default `infra/homelab`).
    pub fn project(mut self, path: &str) -> Self {
        self.project = path.to_string();
        self
    }

    /// `username` a member of the project with the role `level` (alice is a Maintainer unless
    /// said otherwise).
    pub fn member(mut self, username: &str, level: u32) -> Self {
        self.members.retain(|(u, _)| u != username);
        self.members.push((username.to_string(), level));
        self
    }

    /// No member at all (not even alice).
    pub fn no_members(mut self) -> Self {
        self.members.clear();
        self
    }

    /// `username` a member of the (internal) group `group` with the role `level`, and no role
    /// on the project.
    pub fn group_member(mut self, group: &str, username: &str, level: u32) -> Self {
        self.groups
            .push((group.to_string(), username.to_string(), level));
        self
    }

    /// A file on `main` (all of them in the first commit).
    pub fn file(mut self, path: &str, text: &str) -> Self {
        self.files.push((path.to_string(), text.to_string()));
        self
    }

    /// Files on `main`.
    pub fn files(mut self, files: &[(&str, &str)]) -> Self {
        for (p, t) in files {
            self = self.file(p, t);
        }
        self
    }

    /// The repository's `.planbot.toml` (its roots, policy sets) on `main`.
    pub fn planbot_toml(self, text: &str) -> Self {
        self.file(".planbot.toml", text)
    }

    /// planbot runs `engine` (`[engine] binary`).
    pub fn engine(mut self, engine: &Path) -> Self {
        self.engine = Some(engine.to_path_buf());
        self
    }

    /// planbot's config is the README's five-minute start, state included
    /// ([`PlanbotConfig::five_minute_start`]); nothing of the tests' own is added (no engine
    /// binary unless [`WorldBuilder::engine`] names one, no plan slots, no metrics token).
    pub fn five_minute_start(mut self) -> Self {
        self.state = State::FiveMinuteStart;
        self
    }

    /// GitLab-managed state ([`PlanbotConfig::managed_state`]).
    pub fn managed_state(mut self) -> Self {
        self.state = State::Managed;
        self
    }

    /// The documented state recipe ([`PlanbotConfig::documented_state`]).
    pub fn documented_state(mut self) -> Self {
        self.state = State::Documented;
        self
    }

    /// The `http` backend by hand ([`PlanbotConfig::state_by_hand`]).
    pub fn state_by_hand(mut self) -> Self {
        self.state = State::ByHand;
        self
    }

    /// planbot registered in GitLab as an OAuth application (`[gitlab.oauth]`): run pages need
    /// a sign-in.
    pub fn signin(mut self) -> Self {
        self.signin = true;
        self
    }

    /// planbot's own policy set `name` of `files` (in a folder the world keeps).
    pub fn operator_policy(mut self, name: &str, files: &[(&str, &str)]) -> Self {
        let files = files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect();
        self.operator_policies.push((name.to_string(), files));
        self
    }

    /// Anything else of planbot's config.
    pub fn config(mut self, f: impl FnOnce(PlanbotConfig) -> PlanbotConfig + 'a) -> Self {
        self.config.push(Box::new(f));
        self
    }

    /// Keys of `[engine]` (`key = value` lines).
    pub fn engine_lines(self, lines: &'a str) -> Self {
        self.config(move |c| c.lines("engine", lines))
    }

    /// More config, whole tables of TOML.
    pub fn extra_toml(self, toml: &'a str) -> Self {
        self.config(move |c| c.raw(toml))
    }

    /// Once the fake GitLab runs, before the first commit: more files and config that name it.
    pub fn prepare(mut self, f: impl FnOnce(&FakeGitLab, &mut Prepared) + 'a) -> Self {
        self.prepare.push(Box::new(f));
        self
    }

    /// The fake GitLab, the project with its members and its first commit on `main`, and
    /// planbot's config; planbot does not run yet (see [`World::serve`], [`World::app`]).
    pub fn build(self) -> World {
        let gitlab = FakeGitLab::start();
        let project = gitlab.create_project(&self.project);
        for (username, level) in &self.members {
            gitlab.member_with_role(&project, username, *level);
        }
        for (group, username, level) in &self.groups {
            // A group the bot can see (internal), as docs/policies.md asks of an owning group.
            gitlab.create_group(group, "internal");
            let user = gitlab
                .user_named(username)
                .unwrap_or_else(|| gitlab.create_user(username));
            gitlab.add_group_member(group, &user, *level);
        }
        let data = tempfile::tempdir().unwrap();
        let config = match self.state {
            State::FiveMinuteStart => {
                PlanbotConfig::five_minute_start(&gitlab, &project, data.path())
            }
            _ => PlanbotConfig::serving(gitlab.url(), gitlab.bot_token(), data.path())
                .projects(&[&self.project]),
        };
        let mut prepared = Prepared {
            project: project.clone(),
            files: self.files,
            config,
        };
        for f in self.prepare {
            f(&gitlab, &mut prepared);
        }
        if !prepared.files.is_empty() {
            let files: Vec<(&str, &str)> = prepared
                .files
                .iter()
                .map(|(p, t)| (p.as_str(), t.as_str()))
                .collect();
            gitlab.commit_files(&project, "main", &files);
        }
        let mut config = prepared.config;
        if let Some(engine) = &self.engine {
            config = config.engine(engine);
        }
        config = match self.state {
            State::None | State::FiveMinuteStart => config,
            State::Managed => config.managed_state(&gitlab, &project),
            State::Documented => config.documented_state(&gitlab, &project),
            State::ByHand => config.state_by_hand(&gitlab, &project),
        };
        if self.state != State::FiveMinuteStart {
            config = config.plan_slots(2).metrics();
        }
        if self.signin {
            let o = gitlab.register_oauth_app("http://planbot.test/auth/callback", &["read_user"]);
            config = config
                .set("gitlab.oauth", "client_id", &quoted(&o.client_id))
                .set("gitlab.oauth", "client_secret", &quoted(&o.secret));
        }
        let mut dirs = vec![data];
        for (name, files) in self.operator_policies {
            let dir = tempfile::tempdir().unwrap();
            for (p, t) in files {
                std::fs::write(dir.path().join(p), t).unwrap();
            }
            config = config.policy_set(&name, dir.path());
            dirs.push(dir);
        }
        for f in self.config {
            config = f(config);
        }
        World {
            config: config.load(),
            planbot: config,
            gitlab,
            project,
            app: std::sync::OnceLock::new(),
            _dirs: dirs,
        }
    }

    /// [`WorldBuilder::build`], and planbot serving in process with its workers.
    pub async fn start(self) -> (World, TestService) {
        let w = self.build();
        let s = w.serve(with_workers()).await;
        (w, s)
    }
}

/// planbot's workers run (no start-up reconciliation: the story delivers the hooks).
pub fn with_workers() -> Options {
    Options {
        workers: true,
        reconcile: false,
    }
}

/// planbot serves, but runs no job (a story that calls a flow itself).
pub fn no_workers() -> Options {
    Options {
        workers: false,
        reconcile: false,
    }
}

impl World {
    /// planbot serving in process with this world's config.
    pub async fn serve(&self, options: Options) -> TestService {
        TestService::start(self.config.clone(), options).await
    }

    /// planbot's `App` without a server (made once), for a story that runs a flow itself.
    pub fn app(&self) -> &App {
        self.app.get_or_init(|| {
            let app = App::new(self.config.clone()).expect("app");
            planbot::flows::context::app_state::wipe_temp_root(&app.temp_root()).unwrap();
            app
        })
    }

    /// The plan job of MR `iid`'s head, as a push queues it.
    pub fn job(&self, iid: u64) -> PlanJob {
        PlanJob {
            project: ProjectId(self.project.id),
            project_path: Some(self.project.path.clone()),
            mr: MrIid(iid),
            head: CommitSha(self.gitlab.mr_sha(&self.project, iid)),
            target_branch: Some("main".into()),
            source_project: Some(ProjectId(self.project.id)),
            fork: false,
            draft: false,
            reason: PlanReason::NewCommits,
            requested_by: None,
        }
    }

    /// Run the plan flow for MR `iid`'s head in [`World::app`], as a worker runs it.
    pub async fn plan(&self, iid: u64) {
        planbot::flows::review::plan::run(
            self.app(),
            &self.job(iid),
            None,
            &tokio_util::sync::CancellationToken::new(),
        )
        .await
        .expect("plan flow");
    }

    /// Run the plan flow for MR `iid`'s head and return the MR's one note (of any author).
    pub async fn plan_note(&self, iid: u64) -> String {
        self.plan(iid).await;
        let notes = self.gitlab.notes(&self.project, iid);
        assert_eq!(notes.len(), 1, "one note");
        notes[0].body.clone()
    }

    /// planbot's `data_dir` (the store, workspaces).
    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    /// A member of the project (or of a group) by name.
    pub fn user(&self, username: &str) -> FakeUser {
        self.gitlab
            .user_named(username)
            .unwrap_or_else(|| panic!("no user {username} in this world"))
    }

    /// Alice: opens the MRs, merges them, clicks the apply job.
    pub fn alice(&self) -> FakeUser {
        self.user("alice")
    }

    /// The head of `branch`.
    pub fn head(&self, branch: &str) -> String {
        self.gitlab
            .branch_head(&self.project, branch)
            .unwrap_or_else(|| panic!("no branch {branch}"))
    }

    /// GitLab delivers `body` as `event` (token-authenticated); planbot answers 200.
    pub async fn hook(&self, s: &TestService, event: &str, key: &str, body: &[u8]) {
        let headers = token_headers(event, key, WEBHOOK_SECRET);
        let status = s
            .deliver(std::str::from_utf8(body).unwrap(), &headers)
            .await;
        assert_eq!(status, 200, "{event} {key}");
    }

    /// Alice pushes `files` on `branch`, opens an MR, and GitLab delivers the webhook.
    pub async fn open_mr(&self, s: &TestService, branch: &str, files: &[(&str, &str)]) -> u64 {
        self.open_mr_by(s, &self.alice(), branch, files).await
    }

    /// `author` pushes `files` on `branch`, opens an MR, and GitLab delivers the webhook.
    pub async fn open_mr_by(
        &self,
        s: &TestService,
        author: &FakeUser,
        branch: &str,
        files: &[(&str, &str)],
    ) -> u64 {
        self.gitlab.commit_files(&self.project, branch, files);
        let iid = self
            .gitlab
            .open_mr_by(&self.project, branch, "main", author);
        let body = self
            .gitlab
            .mr_webhook(&self.project, iid)
            .action("open")
            .body();
        s.deliver_mr_opened(&body, iid).await;
        iid
    }

    /// Alice pushes `files` to the MR's branch; GitLab delivers the update.
    pub async fn push(&self, s: &TestService, iid: u64, branch: &str, files: &[(&str, &str)]) {
        let old = self.gitlab.mr_sha(&self.project, iid);
        self.gitlab.push(&self.project, branch, files);
        let body = self
            .gitlab
            .mr_webhook(&self.project, iid)
            .action("update")
            .oldrev(&old)
            .body();
        self.hook(s, "Merge Request Hook", &format!("push-{iid}-{old}"), &body)
            .await;
    }

    /// `username` approves the MR in GitLab (its system note says when); planbot hears of it
    /// only when an apply asks GitLab.
    pub fn approve(&self, iid: u64, username: &str) {
        self.gitlab
            .approve(&self.project, iid, &self.user(username));
    }

    /// `user` writes `text` on the MR; GitLab delivers the Note Hook.
    pub async fn say(&self, s: &TestService, iid: u64, user: &FakeUser, text: &str) {
        let hook = self.gitlab.note_webhook(&self.project, iid, user, text);
        let key = format!("note-{}", hook["object_attributes"]["id"]);
        self.hook(s, "Note Hook", &key, hook.to_string().as_bytes())
            .await;
    }

    /// `user` comments `text` on the MR; planbot's reply (a note mentioning them after it).
    pub async fn comment(&self, s: &TestService, iid: u64, user: &FakeUser, text: &str) -> String {
        let before = self.gitlab.notes(&self.project, iid).len();
        self.say(s, iid, user, text).await;
        let mention = format!("@{} ", user.username);
        let (gitlab, project) = (&self.gitlab, &self.project);
        s.after_job_ends("planbot's reply", 60, || async {
            gitlab
                .notes(project, iid)
                .iter()
                .skip(before + 1)
                .any(|n| n.body.starts_with(&mention))
        })
        .await;
        self.gitlab
            .notes(&self.project, iid)
            .into_iter()
            .skip(before + 1)
            .find(|n| n.body.starts_with(&mention))
            .unwrap()
            .body
    }

    /// Wait until each of the statuses `names` on `sha` is no longer pending or running.
    pub async fn final_statuses(&self, s: &TestService, sha: &str, names: &[&str]) {
        let (gitlab, project) = (&self.gitlab, &self.project);
        s.after_job_ends(&format!("final {names:?} on {sha}"), 120, || async {
            names.iter().all(|name| {
                gitlab
                    .status(project, sha, name)
                    .is_some_and(|st| !matches!(st.state.as_str(), "pending" | "running"))
            })
        })
        .await;
    }

    /// The plan note of the MR's head once its `planbot/plan` status is final.
    pub async fn wait_for_plan(&self, s: &TestService, iid: u64) -> String {
        self.plan_of(s, iid).await.0
    }

    /// The plan note once the MR head's `planbot/plan` status is final, and what that status
    /// says (`state: description`).
    pub async fn plan_of(&self, s: &TestService, iid: u64) -> (String, String) {
        let head = self.gitlab.mr_sha(&self.project, iid);
        self.final_statuses(s, &head, &["planbot/plan"]).await;
        (self.note(iid), self.status_says(&head, "planbot/plan"))
    }

    /// The MR's notes that contain `text`.
    pub fn notes_containing(&self, iid: u64, text: &str) -> Vec<String> {
        self.gitlab
            .notes(&self.project, iid)
            .into_iter()
            .map(|n| n.body)
            .filter(|b| b.contains(text))
            .collect()
    }

    /// The note shows: the MR's one planbot note (the bot's, with the hidden marker). Panics,
    /// quoting every note of the MR, when there is none or more than one.
    pub fn note(&self, iid: u64) -> String {
        let notes = self.gitlab.notes(&self.project, iid);
        let bot = self.gitlab.bot().id;
        let planbot: Vec<&str> = notes
            .iter()
            .filter(|n| n.author_id == bot)
            .map(|n| n.body.as_str())
            .filter(|b| b.contains(planbot::core::render::NOTE_MARKER))
            .collect();
        assert!(
            planbot.len() == 1,
            "MR !{iid} has {} planbot notes (one expected); its notes:\n{}",
            planbot.len(),
            notes
                .iter()
                .map(|n| n.body.as_str())
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        planbot[0].to_string()
    }

    /// The status `name` of `sha`, if GitLab has one.
    pub fn status(&self, sha: &str, name: &str) -> Option<FakeStatus> {
        self.gitlab.status(&self.project, sha, name)
    }

    /// The status `name` of `sha` as `(state, description)`, if GitLab has one.
    pub fn status_of(&self, sha: &str, name: &str) -> Option<(String, String)> {
        self.status(sha, name)
            .map(|st| (st.state, st.description.unwrap_or_default()))
    }

    /// The status says: `state: description` of the status `name` of `sha`. Panics, naming the
    /// statuses `sha` has, when it has no `name`.
    pub fn status_says(&self, sha: &str, name: &str) -> String {
        let st = self.status(sha, name).unwrap_or_else(|| {
            let names: Vec<String> = self
                .gitlab
                .statuses(&self.project, sha)
                .into_iter()
                .map(|s| format!("{} {}", s.name, s.state))
                .collect();
            panic!("{sha} has no {name} status; it has {names:?}")
        });
        format!("{}: {}", st.state, st.description.unwrap_or_default())
    }

    /// A running manual `planbot-apply` job of the newest pipeline on `main`, clicked by alice
    /// (not yet known to GitLab: see [`World::click_apply`]).
    pub fn apply_job(&self, id: u64) -> FakeJob {
        FakeJob::apply(id, &self.project, &self.alice(), &self.head("main"))
    }

    /// Alice clicks the apply job `id` of `main`'s head: the job, known to GitLab.
    pub fn click_apply(&self, id: u64) -> FakeJob {
        let job = self.apply_job(id);
        self.gitlab.register_job(job.clone());
        job
    }

    /// Merge the MR as alice and run the apply job `job_id` of `main`'s new head: its log
    /// (planbot answers 200 and streams it).
    pub async fn merge_and_apply(&self, s: &TestService, iid: u64, job_id: u64) -> String {
        self.gitlab
            .merge_mr(&self.project, iid, Some(&self.alice()));
        let job = self.click_apply(job_id);
        let (status, log) = call_apply(s, &job.token, "").await;
        assert_eq!(status, 200, "{log}");
        log
    }

    /// The stored state `name` (its latest version), if any.
    pub fn state(&self, name: &str) -> Option<String> {
        self.gitlab
            .terraform_state(&self.project, name)
            .0
            .map(|s| String::from_utf8(s).unwrap())
    }

    /// The address of the project's state `name` in the fake GitLab.
    pub fn state_url(&self, name: &str) -> String {
        format!(
            "{}/api/v4/projects/{}/terraform/state/{name}",
            self.gitlab.url(),
            self.project.id
        )
    }

    /// The state API's requests so far, as `method target user status`.
    pub fn state_calls(&self) -> Vec<String> {
        self.gitlab
            .state_requests()
            .iter()
            .map(|r| {
                format!(
                    "{} {} {} {}",
                    r.method,
                    r.target,
                    r.user.as_deref().unwrap_or("-"),
                    r.status
                )
            })
            .collect()
    }

    /// Someone changes the managed state `core` behind OpenTofu's back (drift): the VM `vm`
    /// gets `cores` in state, as a hand edit on the Proxmox UI would show up on refresh.
    pub async fn drift(&self, vm: &str, cores: u64) {
        self.edit_state(|state| {
            for r in state["resources"].as_array_mut().unwrap() {
                for i in r["instances"].as_array_mut().unwrap() {
                    if i["index_key"] == vm {
                        i["attributes"]["input"]["value"]["cores"] = cores.into();
                    }
                }
            }
        })
        .await;
    }

    /// Edit the managed state `core` by hand (a new serial), as alice.
    pub async fn edit_state(&self, edit: impl FnOnce(&mut serde_json::Value)) {
        let (state, _) = self.gitlab.terraform_state(&self.project, "core");
        let mut state: serde_json::Value =
            serde_json::from_slice(&state.expect("a state")).unwrap();
        state["serial"] = (state["serial"].as_u64().unwrap() + 1).into();
        edit(&mut state);
        let r = reqwest::Client::new()
            .post(self.state_url("core"))
            .basic_auth("alice", Some(&self.alice().token))
            .json(&state)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }
}

/// What the CI job sees: the HTTP status and the streamed log of `POST /api/v1/apply`.
pub async fn call_apply(s: &TestService, token: &str, body: &str) -> (u16, String) {
    let r = s
        .http
        .post(s.url("/api/v1/apply"))
        .header("JOB-TOKEN", token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("POST /api/v1/apply");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

/// The job log's verdict: its last line that is not a keep-alive.
pub fn verdict(log: &str) -> &str {
    log.lines()
        .rev()
        .find(|l| !l.starts_with("planbot: still working"))
        .unwrap_or("")
}

/// The log shows: each of `texts` is in `log` (a job's log, or planbot's own lines joined);
/// panics quoting the log when one is not.
pub fn log_shows(log: &str, texts: &[&str]) {
    for text in texts {
        assert!(log.contains(text), "the log does not show {text:?}:\n{log}");
    }
}
