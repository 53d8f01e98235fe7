//! A fake GitLab for tests: an in-process axum server on 127.0.0.1:0 that keeps state, speaks
//! GitLab's JSON shapes, serves REAL bare git repositories through `git http-backend`, and
//! implements the GitLab-managed Terraform state API (with locking).
//!
//! The server runs on its own thread and runtime, so every helper here is a plain (blocking)
//! function usable from any kind of test, and a blocking `git clone` against it cannot deadlock.
//!
//! Story helpers: [`FakeGitLab::create_project`], [`FakeGitLab::commit_files`] (real commits in
//! the bare repo; updates the MR refs of MRs from that branch), [`FakeGitLab::open_mr`],
//! [`FakeGitLab::merge_mr`], [`FakeGitLab::notes`], [`FakeGitLab::statuses`],
//! [`FakeGitLab::register_job`], [`FakeGitLab::mr_webhook`], [`FakeGitLab::note_webhook`].
//! Faults: [`FakeGitLab::fail_next`] answers a route with an error N times (before it does
//! anything), [`FakeGitLab::fail_next_after_write`] does the work and then answers with an error
//! (a 502 from a proxy after GitLab stored the note); [`FakeGitLab::calls`] counts calls per
//! route. Routes are named `"METHOD /api/v4/path/{param}"` as registered below, e.g.
//! `"POST /api/v4/projects/{id}/merge_requests/{iid}/notes"`.
//!
//! GitLab behaviours followed, each with the page it follows (also cited at the handler):
//! - commit statuses (<https://docs.gitlab.com/api/commits/#set-the-pipeline-status-of-a-commit>,
//!   `Ci::CreateCommitStatusService`): a pending/running status of the same name, ref and user
//!   is updated, anything else creates a new status (a final status is never changed, and a new
//!   one may follow it); the same state again on a pending/running status is a 400 "Cannot
//!   transition status"; without `ref` the first branch holding the commit is used, and a
//!   commit on no branch is a 404 "References for commit"; the list answers the latest status
//!   per name and ref unless `all=true`
//!   (<https://docs.gitlab.com/api/commits/#list-the-statuses-of-a-commit>);
//! - notes (<https://docs.gitlab.com/api/notes/#list-all-merge-request-notes>): `sort`
//!   (default `desc`) and `order_by` (`created_at`, default, or `updated_at`), offset
//!   pagination (<https://docs.gitlab.com/api/rest/#offset-based-pagination>), 404 for a deleted
//!   note;
//! - issues (<https://docs.gitlab.com/api/issues/#list-project-issues>): `author_id`,
//!   `order_by=created_at`, `sort`, `state` (`opened`, `closed`, default all), `labels` (every
//!   one listed); labels given comma-separated on create and edit
//!   (<https://docs.gitlab.com/api/issues/#edit-an-issue>: the author or a Reporter, `state_event`
//!   `close`/`reopen`); issue notes
//!   (<https://docs.gitlab.com/api/notes/#create-new-issue-note>, listed newest first);
//! - merge methods (<https://docs.gitlab.com/user/project/merge_requests/methods/>): a merge
//!   commit by default, semi-linear and fast-forward only on a rebased branch, squash
//!   (<https://docs.gitlab.com/user/project/merge_requests/squash_and_merge/>), with
//!   `merge_commit_sha`/`squash_commit_sha` set as GitLab sets them; rebase
//!   (<https://docs.gitlab.com/api/merge_requests/#rebase-a-merge-request>);
//! - merge refs computed in the background when asked
//!   (<https://docs.gitlab.com/api/merge_requests/#merge-status>: `checking` until done);
//! - quick actions (<https://docs.gitlab.com/user/project/quick_actions/>): a note or issue
//!   description received through the API has its quick actions run and removed, found by the
//!   rule of GitLab's extractor (ported in `support::gitlab_reading`). The fake runs none, but
//!   records each, with every `@all`/`@here` and unclosed `<!--` of any note, issue or status
//!   posted or edited ([`FakeGitLab::hazards`]); a fake dropped with one on record fails its
//!   test, so every story checks that planbot posts nothing GitLab would act on.

// Handlers answer errors as ready `Response`s; their size does not matter in a test fake.
#![allow(clippy::result_large_err)]

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post, put};
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path as FsPath, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::io::AsyncWriteExt;

/// GitLab's access levels.
pub const GUEST: u32 = 10;
pub const REPORTER: u32 = 20;
pub const DEVELOPER: u32 = 30;
pub const MAINTAINER: u32 = 40;
pub const OWNER: u32 = 50;

/// A user of the fake instance, with its personal access token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeUser {
    pub id: u64,
    pub username: String,
    pub name: String,
    pub token: String,
}

/// A project of the fake instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeProject {
    pub id: u64,
    pub path: String,
}

/// A note as the fake stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeNote {
    pub id: u64,
    pub body: String,
    pub author_id: u64,
    pub system: bool,
    /// How many times it was edited through the API.
    pub edits: u32,
    /// Logical times (the fake's id counter): created, last edited.
    pub created: u64,
    pub updated: u64,
}

/// A commit status: a row as GitLab stores it ([`FakeGitLab::status_rows`]), or one accepted
/// post as the row stood after it ([`FakeGitLab::statuses`], the history).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeStatus {
    pub id: u64,
    pub sha: String,
    pub name: String,
    pub state: String,
    pub description: Option<String>,
    pub target_url: Option<String>,
    /// Always set once stored: the given ref, or the branch GitLab picked.
    pub ref_: Option<String>,
    pub pipeline_id: Option<u64>,
    pub author_id: u64,
}

/// A CI job whose token tests hand to planbot (`GET /api/v4/job`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeJob {
    pub token: String,
    pub id: u64,
    pub name: String,
    /// `running` while valid; any other status makes the token answer 401, as on GitLab.
    pub status: String,
    pub ref_: String,
    pub tag: bool,
    /// Who started (clicked) the job.
    pub user: Option<FakeUser>,
    pub pipeline_id: u64,
    pub project_id: u64,
    pub sha: String,
}

/// An issue opened through the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeIssue {
    pub id: u64,
    pub iid: u64,
    pub title: String,
    pub description: String,
    pub author_id: u64,
    /// `opened` or `closed`.
    pub state: String,
    pub labels: Vec<String>,
    /// The issue's comments: (id, author id, body), oldest first.
    pub notes: Vec<(u64, u64, String)>,
    pub created_at: String,
}

/// One request the git HTTP endpoint saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRequest {
    pub method: String,
    pub path: String,
    pub query: String,
    /// The Basic-auth user name, when the Authorization header was valid.
    pub auth_user: Option<String>,
    pub status: u16,
}

#[derive(Debug, Clone)]
struct FMr {
    id: u64,
    iid: u64,
    title: String,
    state: String,
    source_project: u64,
    source_branch: String,
    target_branch: String,
    author: u64,
    draft: bool,
    sha: String,
    /// Every head this MR ever had (for `commits/:sha/merge_requests`).
    shas: Vec<String>,
    merge_commit_sha: Option<String>,
    /// Squash on merge (the MR's "Squash commits" box).
    squash: bool,
    /// The merge ref is not yet computed for the current head (GitLab's mergeability check
    /// runs in the background).
    merge_ref_pending: bool,
    squash_commit_sha: Option<String>,
    merged_by: Option<u64>,
    notes: Vec<FakeNote>,
    approved_by: Vec<u64>,
}

/// A GitLab-managed state: its versions (each write is one) and its lock.
#[derive(Debug, Clone, Default)]
struct TfState {
    versions: Vec<TfVersion>,
    lock: Option<TfLock>,
}

#[derive(Debug, Clone)]
struct TfVersion {
    serial: u64,
    data: Vec<u8>,
}

/// A held lock: its id, the GitLab user who took it and when.
#[derive(Debug, Clone)]
struct TfLock {
    id: String,
    who: String,
    created: String,
}

#[derive(Debug)]
struct FProject {
    id: u64,
    path: String,
    default_branch: String,
    /// `merge` (GitLab's default), `rebase_merge` (semi-linear) or `ff`.
    merge_method: String,
    members: BTreeMap<u64, u32>,
    protected: BTreeSet<String>,
    mrs: BTreeMap<u64, FMr>,
    /// GitLab's status rows.
    statuses: Vec<FakeStatus>,
    /// Every accepted status post, as the row stood after it.
    status_posts: Vec<FakeStatus>,
    issues: Vec<FakeIssue>,
    hooks: Vec<Value>,
    tf: BTreeMap<String, TfState>,
}

/// A group: its direct members (user id → access level) and who may see it.
#[derive(Debug)]
struct FGroup {
    id: u64,
    members: BTreeMap<u64, u32>,
    /// `private` (seen by its members, inherited ones included), `internal` (by any signed-in
    /// user) or `public`.
    visibility: String,
}

#[derive(Debug, Default)]
struct Faults {
    remaining: u32,
    status: u16,
    retry_after: Option<u64>,
    /// Do the work first, then answer the error.
    after_write: bool,
}

#[derive(Debug)]
struct StateInner {
    base_url: String,
    git_root: PathBuf,
    next_id: u64,
    users: BTreeMap<u64, FakeUser>,
    projects: BTreeMap<u64, FProject>,
    jobs: HashMap<String, FakeJob>,
    faults: HashMap<String, Faults>,
    calls: HashMap<String, u32>,
    /// Merge refs are computed only by [`FakeGitLab::compute_merge_refs`], as GitLab's
    /// background mergeability check does.
    async_merge_refs: bool,
    git_requests: Vec<GitRequest>,
    tf_requests: Vec<StateRequest>,
    /// Groups by full path (`infra/admins`).
    groups: BTreeMap<String, FGroup>,
    /// Sign-in with GitLab (see the OAuth section at the end of this file).
    oauth: OAuthState,
    /// What GitLab would have acted on in the texts posted through the API.
    hazards: Vec<Hazard>,
}

/// Something GitLab would act on (a quick action it runs, a mass mention it notifies, a
/// comment that hides the rest) in a text posted through the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hazard {
    /// The route, e.g. `POST /api/v4/projects/{id}/merge_requests/{iid}/notes`.
    pub route: String,
    /// What, in words: "quick action `/approve`".
    pub what: String,
    /// The text as posted.
    pub text: String,
}

impl StateInner {
    /// Look at a text posted through `route` the way GitLab does; record what it would act on.
    fn inspect(&mut self, route: &str, text: &str) {
        for what in super::gitlab_reading::hazards(text) {
            self.hazards.push(Hazard {
                route: route.to_string(),
                what,
                text: text.to_string(),
            });
        }
    }
}

impl StateInner {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn user_by_token(&self, token: &str) -> Option<&FakeUser> {
        self.users.values().find(|u| u.token == token)
    }

    fn project_ref(&self, key: &str) -> Option<u64> {
        if let Ok(id) = key.parse::<u64>() {
            return self.projects.contains_key(&id).then_some(id);
        }
        self.projects.values().find(|p| p.path == key).map(|p| p.id)
    }

    /// The group at `key` (its id, or its full path) and its ancestors, nearest first.
    fn group_chain(&self, key: &str) -> Vec<&FGroup> {
        let path = match key.parse::<u64>() {
            Ok(id) => match self.groups.iter().find(|(_, g)| g.id == id) {
                Some((p, _)) => p.clone(),
                None => return Vec::new(),
            },
            Err(_) => key.to_string(),
        };
        if !self.groups.contains_key(&path) {
            return Vec::new();
        }
        let mut chain = Vec::new();
        let mut at = Some(path.as_str());
        while let Some(p) = at {
            if let Some(g) = self.groups.get(p) {
                chain.push(g);
            }
            at = p.rsplit_once('/').map(|(parent, _)| parent);
        }
        chain
    }

    fn repo(&self, project: u64) -> PathBuf {
        let p = &self.projects[&project];
        self.git_root.join(format!("{}.git", p.path))
    }
}

type Shared = Arc<Mutex<StateInner>>;

/// The fake instance. Dropping it stops the server and deletes the repositories.
pub struct FakeGitLab {
    url: String,
    state: Shared,
    bot: FakeUser,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for FakeGitLab {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let hazards = std::mem::take(&mut self.lock().hazards);
        if !hazards.is_empty() && !std::thread::panicking() {
            let list: Vec<String> = hazards
                .iter()
                .map(|h| format!("- {} in {}:\n{}", h.what, h.route, h.text))
                .collect();
            panic!(
                "planbot posted what GitLab would act on ({} found; a test that means it takes \
                 them with FakeGitLab::take_hazards):\n{}",
                hazards.len(),
                list.join("\n")
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// git plumbing (blocking; used by the helpers)
// ---------------------------------------------------------------------------------------------

fn git_env(cmd: &mut std::process::Command) {
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::temp_dir())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_AUTHOR_NAME", "Fake Dev")
        .env("GIT_AUTHOR_EMAIL", "dev@fake.gitlab")
        .env("GIT_COMMITTER_NAME", "Fake GitLab")
        .env("GIT_COMMITTER_EMAIL", "gitlab@fake.gitlab");
}

/// Run git in `repo`; panics with git's stderr on failure (test helpers).
fn git(
    repo: &FsPath,
    args: &[&str],
    extra_env: &[(&str, &FsPath)],
    stdin: Option<&[u8]>,
) -> String {
    try_git(repo, args, extra_env, stdin)
        .unwrap_or_else(|e| panic!("fake gitlab: git {args:?} in {}: {e}", repo.display()))
}

fn try_git(
    repo: &FsPath,
    args: &[&str],
    extra_env: &[(&str, &FsPath)],
    stdin: Option<&[u8]>,
) -> Result<String, String> {
    use std::io::Write;
    let mut cmd = std::process::Command::new("git");
    git_env(&mut cmd);
    cmd.arg("-C").arg(repo).args(args);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input)
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "exit {:?}: {}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

fn rev_parse(repo: &FsPath, rev: &str) -> Option<String> {
    try_git(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ],
        &[],
        None,
    )
    .ok()
    .filter(|s| !s.is_empty())
}

fn is_ancestor(repo: &FsPath, a: &str, b: &str) -> bool {
    try_git(repo, &["merge-base", "--is-ancestor", a, b], &[], None).is_ok()
}

/// One real commit on `branch` of the bare repo, changing `files` (content `None` = delete).
fn commit_in_bare(
    repo: &FsPath,
    branch: &str,
    base_if_new: Option<&str>,
    files: &[(&str, Option<&str>)],
    message: &str,
) -> String {
    let index_dir = tempfile::tempdir().expect("tempdir");
    let index = index_dir.path().join("index");
    let env = [("GIT_INDEX_FILE", index.as_path())];
    let parent = rev_parse(repo, &format!("refs/heads/{branch}"))
        .or_else(|| base_if_new.and_then(|b| rev_parse(repo, b)));
    match &parent {
        Some(p) => git(repo, &["read-tree", p], &env, None),
        None => git(repo, &["read-tree", "--empty"], &env, None),
    };
    for (path, content) in files {
        match content {
            Some(c) => {
                let oid = git(
                    repo,
                    &["hash-object", "-w", "--stdin"],
                    &[],
                    Some(c.as_bytes()),
                );
                git(
                    repo,
                    &[
                        "update-index",
                        "--add",
                        "--cacheinfo",
                        &format!("100644,{oid},{path}"),
                    ],
                    &env,
                    None,
                );
            }
            None => {
                let line = format!("0 {}\t{path}\n", "0".repeat(40));
                git(
                    repo,
                    &["update-index", "--index-info"],
                    &env,
                    Some(line.as_bytes()),
                );
            }
        }
    }
    let tree = git(repo, &["write-tree"], &env, None);
    let mut args = vec!["commit-tree", tree.as_str(), "-m", message];
    if let Some(p) = &parent {
        args.push("-p");
        args.push(p);
    }
    let sha = git(repo, &args, &[], None);
    git(
        repo,
        &["update-ref", &format!("refs/heads/{branch}"), &sha],
        &[],
        None,
    );
    sha
}

/// A commit on `branch` (which must exist) applying raw `git update-index --index-info` lines.
fn commit_in_bare_with_index_lines(repo: &FsPath, branch: &str, lines: &[String]) -> String {
    let index_dir = tempfile::tempdir().expect("tempdir");
    let index = index_dir.path().join("index");
    let env = [("GIT_INDEX_FILE", index.as_path())];
    let parent = rev_parse(repo, &format!("refs/heads/{branch}")).expect("branch exists");
    git(repo, &["read-tree", &parent], &env, None);
    for line in lines {
        git(
            repo,
            &["update-index", "--index-info"],
            &env,
            Some(line.as_bytes()),
        );
    }
    let tree = git(repo, &["write-tree"], &env, None);
    let sha = git(
        repo,
        &[
            "commit-tree",
            tree.as_str(),
            "-m",
            "Change modes",
            "-p",
            &parent,
        ],
        &[],
        None,
    );
    git(
        repo,
        &["update-ref", &format!("refs/heads/{branch}"), &sha],
        &[],
        None,
    );
    sha
}

/// Recompute `refs/merge-requests/IID/{head,merge}` in the target repo for one MR; without
/// `compute_merge`, only the head (the merge ref is left as it was, marked pending).
fn refresh_mr_refs(target_repo: &FsPath, source_repo: &FsPath, mr: &mut FMr, compute_merge: bool) {
    let head_ref = format!("refs/merge-requests/{}/head", mr.iid);
    let merge_ref = format!("refs/merge-requests/{}/merge", mr.iid);
    if source_repo != target_repo {
        git(
            target_repo,
            &[
                "fetch",
                "--quiet",
                "--no-tags",
                &source_repo.to_string_lossy(),
                &format!("+refs/heads/{}:{}", mr.source_branch, head_ref),
            ],
            &[],
            None,
        );
    } else {
        let sha = rev_parse(target_repo, &format!("refs/heads/{}", mr.source_branch))
            .expect("source branch exists");
        git(target_repo, &["update-ref", &head_ref, &sha], &[], None);
    }
    let head = rev_parse(target_repo, &head_ref).expect("head ref");
    if mr.sha != head {
        mr.sha = head.clone();
        if !mr.shas.contains(&head) {
            mr.shas.push(head.clone());
        }
    }
    if !compute_merge {
        mr.merge_ref_pending = true;
        return;
    }
    mr.merge_ref_pending = false;
    let target = match rev_parse(target_repo, &format!("refs/heads/{}", mr.target_branch)) {
        Some(t) => t,
        None => return,
    };
    match try_git(
        target_repo,
        &[
            "merge-tree",
            "--write-tree",
            "--no-messages",
            &target,
            &head,
        ],
        &[],
        None,
    ) {
        Ok(out) => {
            let tree = out.lines().next().unwrap_or("").to_string();
            let msg = format!(
                "Merge branch '{}' into '{}'\n\nSee merge request !{}",
                mr.source_branch, mr.target_branch, mr.iid
            );
            let commit = git(
                target_repo,
                &["commit-tree", &tree, "-p", &target, "-p", &head, "-m", &msg],
                &[],
                None,
            );
            git(target_repo, &["update-ref", &merge_ref, &commit], &[], None);
        }
        Err(_) => {
            // Conflicts: GitLab has no merge ref then.
            let _ = try_git(target_repo, &["update-ref", "-d", &merge_ref], &[], None);
        }
    }
}

fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

// ---------------------------------------------------------------------------------------------
// The public helpers
// ---------------------------------------------------------------------------------------------

impl FakeGitLab {
    /// Start the fake with one bot user (`planbot-bot`) whose token [`FakeGitLab::bot_token`] is.
    pub fn start() -> FakeGitLab {
        let dir = tempfile::tempdir().expect("tempdir");
        let git_root = dir.path().join("git");
        std::fs::create_dir_all(&git_root).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let url = format!("http://{addr}");
        let state: Shared = Arc::new(Mutex::new(StateInner {
            base_url: url.clone(),
            git_root,
            next_id: 100,
            users: BTreeMap::new(),
            projects: BTreeMap::new(),
            jobs: HashMap::new(),
            faults: HashMap::new(),
            calls: HashMap::new(),
            async_merge_refs: false,
            git_requests: Vec::new(),
            tf_requests: Vec::new(),
            groups: BTreeMap::new(),
            oauth: OAuthState::default(),
            hazards: Vec::new(),
        }));
        let app = router(state.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = rx.await;
                    })
                    .await
                    .unwrap();
            });
        });
        let mut fake = FakeGitLab {
            url,
            state,
            bot: FakeUser {
                id: 0,
                username: String::new(),
                name: String::new(),
                token: String::new(),
            },
            shutdown: Some(tx),
            thread: Some(thread),
            _dir: dir,
        };
        fake.bot = fake.create_user("planbot-bot");
        fake
    }

    fn lock(&self) -> MutexGuard<'_, StateInner> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The instance URL (`http://127.0.0.1:PORT`), what `GitLab::new` takes.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn bot(&self) -> &FakeUser {
        &self.bot
    }

    pub fn bot_token(&self) -> &str {
        &self.bot.token
    }

    /// A new user with a personal access token `glpat-fake-<username>-<id>`.
    pub fn create_user(&self, username: &str) -> FakeUser {
        let mut s = self.lock();
        let id = s.id();
        let user = FakeUser {
            id,
            username: username.to_string(),
            name: format!("{username} (fake)"),
            token: format!("glpat-fake-{username}-{id}"),
        };
        s.users.insert(id, user.clone());
        user
    }

    /// A project with a bare repo whose `main` has one commit (a README); the bot is Developer.
    pub fn create_project(&self, path: &str) -> FakeProject {
        let (id, repo, bot) = {
            let mut s = self.lock();
            let id = s.id();
            let repo = s.git_root.join(format!("{path}.git"));
            s.projects.insert(
                id,
                FProject {
                    id,
                    path: path.to_string(),
                    default_branch: "main".into(),
                    merge_method: "merge".into(),
                    members: BTreeMap::new(),
                    protected: ["main".to_string()].into_iter().collect(),
                    mrs: BTreeMap::new(),
                    statuses: Vec::new(),
                    status_posts: Vec::new(),
                    issues: Vec::new(),
                    hooks: Vec::new(),
                    tf: BTreeMap::new(),
                },
            );
            (id, repo, self.bot.id)
        };
        std::fs::create_dir_all(&repo).unwrap();
        git(
            &repo,
            &["init", "--quiet", "--bare", "--initial-branch=main"],
            &[],
            None,
        );
        commit_in_bare(
            &repo,
            "main",
            None,
            &[("README.md", Some(&format!("# {path}\n")))],
            "Initial commit",
        );
        let project = FakeProject {
            id,
            path: path.to_string(),
        };
        if bot != 0 {
            self.add_member(&project, &self.bot.clone(), DEVELOPER);
        }
        project
    }

    /// A fork of `of` at `path` (same history, its own bare repo); the bot is not a member.
    pub fn fork_project(&self, of: &FakeProject, path: &str) -> FakeProject {
        let (id, src, dst) = {
            let mut s = self.lock();
            let id = s.id();
            let src = s.repo(of.id);
            let dst = s.git_root.join(format!("{path}.git"));
            s.projects.insert(
                id,
                FProject {
                    id,
                    path: path.to_string(),
                    default_branch: "main".into(),
                    merge_method: "merge".into(),
                    members: BTreeMap::new(),
                    protected: BTreeSet::new(),
                    mrs: BTreeMap::new(),
                    statuses: Vec::new(),
                    status_posts: Vec::new(),
                    issues: Vec::new(),
                    hooks: Vec::new(),
                    tf: BTreeMap::new(),
                },
            );
            (id, src, dst)
        };
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        git(
            src.parent().unwrap(),
            &[
                "clone",
                "--quiet",
                "--bare",
                &src.to_string_lossy(),
                &dst.to_string_lossy(),
            ],
            &[],
            None,
        );
        FakeProject {
            id,
            path: path.to_string(),
        }
    }

    /// A group at `path` (`infra/admins`: its parent `infra` is made too when missing), with
    /// `visibility` `private`, `internal` or `public`.
    pub fn create_group(&self, path: &str, visibility: &str) {
        let mut s = self.lock();
        let mut at = String::new();
        for part in path.split('/') {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            if !s.groups.contains_key(&at) {
                let id = s.id();
                s.groups.insert(
                    at.clone(),
                    FGroup {
                        id,
                        members: BTreeMap::new(),
                        visibility: visibility.to_string(),
                    },
                );
            }
        }
    }

    /// `user` becomes a direct member of the group at `path` with `level`.
    pub fn add_group_member(&self, path: &str, user: &FakeUser, level: u32) {
        self.lock()
            .groups
            .get_mut(path)
            .expect("group")
            .members
            .insert(user.id, level);
    }

    pub fn add_member(&self, project: &FakeProject, user: &FakeUser, level: u32) {
        self.lock()
            .projects
            .get_mut(&project.id)
            .expect("project")
            .members
            .insert(user.id, level);
    }

    pub fn remove_member(&self, project: &FakeProject, user: &FakeUser) {
        self.lock()
            .projects
            .get_mut(&project.id)
            .expect("project")
            .members
            .remove(&user.id);
    }

    pub fn protect_branch(&self, project: &FakeProject, branch: &str, protected: bool) {
        let mut s = self.lock();
        let p = s.projects.get_mut(&project.id).expect("project");
        if protected {
            p.protected.insert(branch.to_string());
        } else {
            p.protected.remove(branch);
        }
    }

    /// The bare repository on disk (for assertions such as "the token is not in its config").
    pub fn repo_path(&self, project: &FakeProject) -> PathBuf {
        self.lock().repo(project.id)
    }

    /// The clone URL (`http_url_to_repo`).
    pub fn clone_url(&self, project: &FakeProject) -> String {
        format!("{}/{}.git", self.url, project.path)
    }

    /// Where `branch` points, if it exists.
    pub fn branch_head(&self, project: &FakeProject, branch: &str) -> Option<String> {
        rev_parse(&self.repo_path(project), &format!("refs/heads/{branch}"))
    }

    /// Any ref (`refs/merge-requests/3/merge`...).
    pub fn ref_sha(&self, project: &FakeProject, r: &str) -> Option<String> {
        rev_parse(&self.repo_path(project), r)
    }

    /// A real commit on `branch` (created from the default branch if new) writing `files`;
    /// then, like a push, refreshes the refs and head of every open MR from or into that branch.
    pub fn commit_files(
        &self,
        project: &FakeProject,
        branch: &str,
        files: &[(&str, &str)],
    ) -> String {
        let changes: Vec<(&str, Option<&str>)> =
            files.iter().map(|(p, c)| (*p, Some(*c))).collect();
        self.commit_changes(
            project,
            branch,
            &changes,
            &format!("Change {} file(s)", files.len()),
        )
    }

    /// A commit of one entry with an explicit git mode: `"120000"` makes `path` a symbolic
    /// link to `content`, `"100755"` an executable file (what an author can push).
    pub fn commit_with_mode(
        &self,
        project: &FakeProject,
        branch: &str,
        path: &str,
        mode: &str,
        content: &str,
    ) -> String {
        let repo = self.repo_path(project);
        let oid = git(
            &repo,
            &["hash-object", "-w", "--stdin"],
            &[],
            Some(content.as_bytes()),
        );
        // Stage the entry through the index-info form, which takes any mode.
        let line = format!("{mode} {oid}\t{path}\n");
        let sha = commit_in_bare_with_index_lines(&repo, branch, &[line]);
        self.refresh_after_push(project.id, branch);
        sha
    }

    /// The documented Merge Request Hook payload (`webhooks/merge_request_open.json`), pointed
    /// at project `p`'s MR `iid` and its current head, with `action` (`merge` also carries the
    /// merge commit).
    pub fn merge_request_hook(&self, p: &FakeProject, iid: u64, action: &str) -> String {
        let mut v: Value =
            serde_json::from_str(&super::gitlab_fixture("webhooks/merge_request_open.json"))
                .unwrap();
        v["project"]["id"] = p.id.into();
        v["project"]["path_with_namespace"] = p.path.clone().into();
        let a = &mut v["object_attributes"];
        a["iid"] = iid.into();
        a["action"] = action.into();
        a["source_project_id"] = p.id.into();
        a["target_project_id"] = p.id.into();
        a["target_branch"] = "main".into();
        a["last_commit"]["id"] = self.mr_sha(p, iid).into();
        if action == "merge" {
            a["merge_commit_sha"] = self.mr_json(p, iid)["merge_commit_sha"].clone();
        }
        v.to_string()
    }

    /// planbot's plan note on MR `iid` (found by its hidden marker), if posted.
    pub fn plan_note(&self, p: &FakeProject, iid: u64) -> Option<String> {
        self.notes(p, iid)
            .into_iter()
            .find(|n| n.body.contains(planbot::core::render::NOTE_MARKER))
            .map(|n| n.body)
    }

    /// Same as [`FakeGitLab::commit_files`] (reads better in a story: "the author pushes").
    pub fn push(&self, project: &FakeProject, branch: &str, files: &[(&str, &str)]) -> String {
        self.commit_files(project, branch, files)
    }

    /// A commit with explicit changes (`None` deletes the file) and message.
    pub fn commit_changes(
        &self,
        project: &FakeProject,
        branch: &str,
        changes: &[(&str, Option<&str>)],
        message: &str,
    ) -> String {
        let repo = self.repo_path(project);
        let default = self.lock().projects[&project.id].default_branch.clone();
        let sha = commit_in_bare(
            &repo,
            branch,
            Some(&format!("refs/heads/{default}")),
            changes,
            message,
        );
        self.refresh_after_push(project.id, branch);
        sha
    }

    fn refresh_after_push(&self, project: u64, branch: &str) {
        let mut s = self.lock();
        let mut todo = Vec::new();
        for p in s.projects.values() {
            for mr in p.mrs.values() {
                if mr.state != "opened" {
                    continue;
                }
                let from = mr.source_project == project && mr.source_branch == branch;
                let into = p.id == project && mr.target_branch == branch;
                if from || into {
                    todo.push((p.id, mr.iid));
                }
            }
        }
        for (pid, iid) in todo {
            let target_repo = s.repo(pid);
            let src_pid = s.projects[&pid].mrs[&iid].source_project;
            let source_repo = s.repo(src_pid);
            let compute = !s.async_merge_refs;
            let mr = s.projects.get_mut(&pid).unwrap().mrs.get_mut(&iid).unwrap();
            refresh_mr_refs(&target_repo, &source_repo, mr, compute);
        }
    }

    /// Open an MR from `source_branch` into `target_branch` of the same project, authored by a
    /// fresh Developer user `dev` (created once). Returns the iid.
    pub fn open_mr(&self, project: &FakeProject, source_branch: &str, target_branch: &str) -> u64 {
        let dev = self
            .user_named("dev")
            .unwrap_or_else(|| self.create_user("dev"));
        if self.member_level(project, &dev).is_none() {
            self.add_member(project, &dev, DEVELOPER);
        }
        self.open_mr_by(project, source_branch, target_branch, &dev)
    }

    pub fn user_named(&self, username: &str) -> Option<FakeUser> {
        self.lock()
            .users
            .values()
            .find(|u| u.username == username)
            .cloned()
    }

    /// The project at `path`, when it exists.
    pub fn project_named(&self, path: &str) -> Option<FakeProject> {
        let s = self.lock();
        s.projects
            .values()
            .find(|p| p.path == path)
            .map(|p| FakeProject {
                id: p.id,
                path: p.path.clone(),
            })
    }

    /// planbot's `[state]` config for GitLab-managed state of `project`, as the README sets it
    /// up: every root gets the project's state named after it; MR plans read it with a
    /// Developer's token (`state-reader`), the default branch writes it with a Maintainer's
    /// (`state-writer`).
    pub fn managed_state_config(&self, project: &FakeProject) -> String {
        let reader = self.member_with_role(project, "state-reader", DEVELOPER);
        let writer = self.member_with_role(project, "state-writer", MAINTAINER);
        format!(
            "\n[state]\ndefault = \"gitlab\"\n\n[state.plan]\ntoken = \"{}\"\n\n[state.apply]\ntoken = \"{}\"\n",
            reader.token, writer.token
        )
    }

    /// The user `username` (created the first time) with the role `level` on `project`: e.g.
    /// the owner of a state token with exactly the role a test needs.
    pub fn member_with_role(&self, project: &FakeProject, username: &str, level: u32) -> FakeUser {
        let user = self
            .user_named(username)
            .unwrap_or_else(|| self.create_user(username));
        self.add_member(project, &user, level);
        user
    }

    fn member_level(&self, project: &FakeProject, user: &FakeUser) -> Option<u32> {
        self.lock().projects[&project.id]
            .members
            .get(&user.id)
            .copied()
    }

    pub fn open_mr_by(
        &self,
        project: &FakeProject,
        source_branch: &str,
        target_branch: &str,
        author: &FakeUser,
    ) -> u64 {
        self.open_mr_from(project, source_branch, project, target_branch, author)
    }

    /// An MR from `source_project` (a fork, or the same project) into `target_project`.
    pub fn open_mr_from(
        &self,
        source_project: &FakeProject,
        source_branch: &str,
        target_project: &FakeProject,
        target_branch: &str,
        author: &FakeUser,
    ) -> u64 {
        let mut s = self.lock();
        let id = s.id();
        let compute = !s.async_merge_refs;
        let target_repo = s.repo(target_project.id);
        let source_repo = s.repo(source_project.id);
        let p = s.projects.get_mut(&target_project.id).expect("project");
        let iid = p.mrs.keys().max().copied().unwrap_or(0) + 1;
        let mut mr = FMr {
            id,
            iid,
            title: format!("Change from {source_branch}"),
            state: "opened".into(),
            source_project: source_project.id,
            source_branch: source_branch.into(),
            target_branch: target_branch.into(),
            author: author.id,
            draft: false,
            sha: String::new(),
            shas: Vec::new(),
            merge_commit_sha: None,
            squash: false,
            merge_ref_pending: false,
            squash_commit_sha: None,
            merged_by: None,
            notes: Vec::new(),
            approved_by: Vec::new(),
        };
        refresh_mr_refs(&target_repo, &source_repo, &mut mr, compute);
        p.mrs.insert(iid, mr);
        iid
    }

    pub fn set_draft(&self, project: &FakeProject, iid: u64, draft: bool) {
        self.with_mr(project, iid, |mr| mr.draft = draft);
    }

    pub fn set_target_branch(&self, project: &FakeProject, iid: u64, target: &str) {
        self.with_mr(project, iid, |mr| mr.target_branch = target.to_string());
        self.refresh_after_push(project.id, target);
    }

    fn with_mr<R>(&self, project: &FakeProject, iid: u64, f: impl FnOnce(&mut FMr) -> R) -> R {
        let mut s = self.lock();
        let mr = s
            .projects
            .get_mut(&project.id)
            .expect("project")
            .mrs
            .get_mut(&iid)
            .expect("mr");
        f(mr)
    }

    /// The MR's head commit.
    pub fn mr_sha(&self, project: &FakeProject, iid: u64) -> String {
        self.with_mr(project, iid, |mr| mr.sha.clone())
    }

    /// The MR as `GET /merge_requests/:iid` shows it.
    pub fn mr_json(&self, project: &FakeProject, iid: u64) -> Value {
        let s = self.lock();
        mr_json(&s, project.id, &s.projects[&project.id].mrs[&iid])
    }

    /// Compute merge refs in the background, as GitLab does: after a push the MR's head ref
    /// moves at once, but `refs/merge-requests/IID/merge` stays as it was (and
    /// `detailed_merge_status` is `checking`) until [`FakeGitLab::compute_merge_refs`].
    /// <https://docs.gitlab.com/api/merge_requests/#merge-status>
    pub fn set_async_merge_refs(&self, on: bool) {
        self.lock().async_merge_refs = on;
    }

    /// GitLab's mergeability check catches up: every pending merge ref is computed.
    pub fn compute_merge_refs(&self) {
        let mut s = self.lock();
        let mut todo = Vec::new();
        for p in s.projects.values() {
            for mr in p.mrs.values().filter(|m| m.merge_ref_pending) {
                todo.push((p.id, mr.iid, mr.source_project));
            }
        }
        for (pid, iid, src) in todo {
            let (target_repo, source_repo) = (s.repo(pid), s.repo(src));
            let mr = s.projects.get_mut(&pid).unwrap().mrs.get_mut(&iid).unwrap();
            refresh_mr_refs(&target_repo, &source_repo, mr, true);
        }
    }

    /// The project's merge method (Settings → Merge requests), as GitLab names it in the
    /// projects API: `merge` (the default: always a merge commit), `rebase_merge` (a merge
    /// commit, only when the source is rebased on the target) or `ff` (fast-forward only).
    /// <https://docs.gitlab.com/user/project/merge_requests/methods/>
    pub fn set_merge_method(&self, project: &FakeProject, method: &str) {
        assert!(
            ["merge", "rebase_merge", "ff"].contains(&method),
            "{method}"
        );
        self.lock()
            .projects
            .get_mut(&project.id)
            .unwrap()
            .merge_method = method.to_string();
    }

    /// Tick "Squash commits when merge request is accepted" on the MR.
    /// <https://docs.gitlab.com/user/project/merge_requests/squash_and_merge/>
    pub fn set_squash(&self, project: &FakeProject, iid: u64, squash: bool) {
        self.with_mr(project, iid, |mr| mr.squash = squash);
    }

    /// "Rebase" on the MR (<https://docs.gitlab.com/api/merge_requests/#rebase-a-merge-request>):
    /// the source branch is put on top of the target. The fake replays the branch as one
    /// commit with the merged tree (the content a real rebase gives without conflicts).
    /// Returns the new head; MR refs are refreshed as after a push.
    pub fn rebase_mr(&self, project: &FakeProject, iid: u64) -> String {
        let repo = self.repo_path(project);
        let (target_branch, source_branch, head) = self.with_mr(project, iid, |mr| {
            (
                mr.target_branch.clone(),
                mr.source_branch.clone(),
                mr.sha.clone(),
            )
        });
        let target = rev_parse(&repo, &format!("refs/heads/{target_branch}")).expect("target");
        let out = try_git(
            &repo,
            &[
                "merge-tree",
                "--write-tree",
                "--no-messages",
                &target,
                &head,
            ],
            &[],
            None,
        )
        .expect("rebase without conflicts");
        let tree = out.lines().next().unwrap_or("").to_string();
        let commit = git(
            &repo,
            &["commit-tree", &tree, "-p", &target, "-m", "rebased"],
            &[],
            None,
        );
        git(
            &repo,
            &[
                "update-ref",
                &format!("refs/heads/{source_branch}"),
                &commit,
            ],
            &[],
            None,
        );
        self.refresh_after_push(project.id, &source_branch);
        commit
    }

    /// Merge as GitLab does for the project's merge method (panics when GitLab would refuse;
    /// see [`FakeGitLab::try_merge_mr`]). Returns the SHA that landed on the target branch.
    pub fn merge_mr(&self, project: &FakeProject, iid: u64, by: Option<&FakeUser>) -> String {
        self.try_merge_mr(project, iid, by)
            .unwrap_or_else(|e| panic!("GitLab refuses the merge: {e}"))
    }

    /// Merge per <https://docs.gitlab.com/user/project/merge_requests/methods/>:
    /// - `merge`: a merge commit of the target and the head (also when a fast-forward would
    ///   do); `rebase_merge`: the same, but only when the head contains the target; `ff`: the
    ///   target moves to the head, only when the head contains the target;
    /// - with squash, the MR's commits first become one squash commit on their merge base
    ///   (<https://docs.gitlab.com/user/project/merge_requests/squash_and_merge/>), which is
    ///   then merged (or fast-forwarded) the same way.
    ///
    /// Sets `merged`, `merge_commit_sha` (none for a fast-forward), `squash_commit_sha`,
    /// `merged_by`, and refreshes the merge refs of the other open MRs into that branch.
    /// `Err` is GitLab's reason to refuse (conflicts, a rebase needed).
    pub fn try_merge_mr(
        &self,
        project: &FakeProject,
        iid: u64,
        by: Option<&FakeUser>,
    ) -> Result<String, String> {
        let repo = self.repo_path(project);
        let method = self.lock().projects[&project.id].merge_method.clone();
        let (target_branch, source_branch, head, squash, title) =
            self.with_mr(project, iid, |mr| {
                (
                    mr.target_branch.clone(),
                    mr.source_branch.clone(),
                    mr.sha.clone(),
                    mr.squash,
                    mr.title.clone(),
                )
            });
        let target = rev_parse(&repo, &format!("refs/heads/{target_branch}")).expect("target");
        let rebased = is_ancestor(&repo, &target, &head);
        if method != "merge" && !rebased {
            return Err("the source branch is behind the target: rebase needed".into());
        }
        // The squash commit: the head's tree on the merge base, one commit.
        let squashed = if squash {
            let base = git(&repo, &["merge-base", &target, &head], &[], None);
            let tree = git(
                &repo,
                &["rev-parse", &format!("{head}^{{tree}}")],
                &[],
                None,
            );
            Some(git(
                &repo,
                &["commit-tree", &tree, "-p", &base, "-m", &title],
                &[],
                None,
            ))
        } else {
            None
        };
        let tip = squashed.clone().unwrap_or_else(|| head.clone());
        let (landed, merge_commit) = if method == "ff" {
            (tip.clone(), None)
        } else {
            let out = try_git(
                &repo,
                &["merge-tree", "--write-tree", "--no-messages", &target, &tip],
                &[],
                None,
            )
            .map_err(|_| "merge conflicts".to_string())?;
            let tree = out.lines().next().unwrap_or("").to_string();
            let msg = format!(
                "Merge branch '{source_branch}' into '{target_branch}'\n\n{title}\n\nSee merge request !{iid}"
            );
            let commit = git(
                &repo,
                &["commit-tree", &tree, "-p", &target, "-p", &tip, "-m", &msg],
                &[],
                None,
            );
            (commit.clone(), Some(commit))
        };
        git(
            &repo,
            &[
                "update-ref",
                &format!("refs/heads/{target_branch}"),
                &landed,
                &target,
            ],
            &[],
            None,
        );
        let by_id = by.map(|u| u.id);
        self.with_mr(project, iid, |mr| {
            mr.state = "merged".into();
            mr.merge_commit_sha = merge_commit.clone();
            mr.squash_commit_sha = squashed.clone();
            mr.merged_by = by_id.or(Some(mr.author));
        });
        self.refresh_after_push(project.id, &target_branch);
        Ok(landed)
    }

    pub fn close_mr(&self, project: &FakeProject, iid: u64) {
        self.with_mr(project, iid, |mr| mr.state = "closed".into());
    }

    pub fn reopen_mr(&self, project: &FakeProject, iid: u64) {
        self.with_mr(project, iid, |mr| mr.state = "opened".into());
        let branch = self.with_mr(project, iid, |mr| mr.source_branch.clone());
        let src = self.with_mr(project, iid, |mr| mr.source_project);
        self.refresh_after_push(src, &branch);
    }

    /// What GitLab would have acted on in the texts posted so far (quick actions, mass
    /// mentions, unclosed comments), taken off the record (see the Drop check).
    pub fn take_hazards(&self) -> Vec<Hazard> {
        std::mem::take(&mut self.lock().hazards)
    }

    /// The MR's notes, oldest first.
    pub fn notes(&self, project: &FakeProject, iid: u64) -> Vec<FakeNote> {
        self.with_mr(project, iid, |mr| mr.notes.clone())
    }

    /// A note written by `user` (a human comment, or the bot's).
    pub fn add_note(&self, project: &FakeProject, iid: u64, user: &FakeUser, body: &str) -> u64 {
        let id = self.lock().id();
        self.with_mr(project, iid, |mr| {
            mr.notes.push(FakeNote {
                id,
                body: body.to_string(),
                author_id: user.id,
                system: false,
                edits: 0,
                created: id,
                updated: id,
            })
        });
        id
    }

    /// A user deletes a note in the UI.
    pub fn delete_note(&self, project: &FakeProject, iid: u64, note_id: u64) {
        self.with_mr(project, iid, |mr| mr.notes.retain(|n| n.id != note_id));
    }

    pub fn approve(&self, project: &FakeProject, iid: u64, user: &FakeUser) {
        self.with_mr(project, iid, |mr| {
            if !mr.approved_by.contains(&user.id) {
                mr.approved_by.push(user.id)
            }
        });
    }

    /// Every accepted status post on `sha`, oldest first, each as its row stood after it
    /// (the states a status went through).
    pub fn statuses(&self, project: &FakeProject, sha: &str) -> Vec<FakeStatus> {
        self.lock().projects[&project.id]
            .status_posts
            .iter()
            .filter(|s| s.sha == sha)
            .cloned()
            .collect()
    }

    /// GitLab's status rows on `sha`, oldest first (what `?all=true` lists).
    pub fn status_rows(&self, project: &FakeProject, sha: &str) -> Vec<FakeStatus> {
        self.lock().projects[&project.id]
            .statuses
            .iter()
            .filter(|s| s.sha == sha)
            .cloned()
            .collect()
    }

    /// What GitLab shows for status `name` on `sha`: its newest row.
    pub fn status(&self, project: &FakeProject, sha: &str, name: &str) -> Option<FakeStatus> {
        self.status_rows(project, sha)
            .into_iter()
            .rev()
            .find(|s| s.name == name)
    }

    pub fn register_job(&self, job: FakeJob) {
        self.lock().jobs.insert(job.token.clone(), job);
    }

    pub fn set_job_status(&self, token: &str, status: &str) {
        if let Some(j) = self.lock().jobs.get_mut(token) {
            j.status = status.to_string();
        }
    }

    pub fn issues(&self, project: &FakeProject) -> Vec<FakeIssue> {
        self.lock().projects[&project.id].issues.clone()
    }

    /// A project webhook as `GET /hooks` lists it.
    pub fn add_hook(
        &self,
        project: &FakeProject,
        url: &str,
        merge_requests_events: bool,
        note_events: bool,
    ) {
        let mut s = self.lock();
        let id = s.id();
        s.projects.get_mut(&project.id).unwrap().hooks.push(json!({
            "id": id, "url": url, "project_id": project.id,
            "push_events": false, "merge_requests_events": merge_requests_events,
            "note_events": note_events, "job_events": false, "pipeline_events": false,
            "enable_ssl_verification": true, "alert_status": "executable",
            "disabled_until": null, "created_at": now()
        }));
    }

    /// The stored Terraform state `name` of the project (its latest version), and its lock as
    /// GitLab shows it (`ID`, `Who`, `Created`).
    pub fn terraform_state(
        &self,
        project: &FakeProject,
        name: &str,
    ) -> (Option<Vec<u8>>, Option<Value>) {
        let s = self.lock();
        match s.projects[&project.id].tf.get(name) {
            Some(t) => (
                t.versions.last().map(|v| v.data.clone()),
                t.lock
                    .as_ref()
                    .map(|l| json!({"ID": l.id, "Who": l.who, "Created": l.created})),
            ),
            None => (None, None),
        }
    }

    /// The serials of every version of state `name`, oldest first.
    pub fn terraform_state_versions(&self, project: &FakeProject, name: &str) -> Vec<u64> {
        let s = self.lock();
        s.projects[&project.id]
            .tf
            .get(name)
            .map(|t| t.versions.iter().map(|v| v.serial).collect())
            .unwrap_or_default()
    }

    /// Lock state `name` as `user` would with `terraform` elsewhere (another pipeline, a
    /// laptop), with lock id `id`.
    pub fn lock_terraform_state(
        &self,
        project: &FakeProject,
        name: &str,
        user: &FakeUser,
        id: &str,
    ) {
        let mut s = self.lock();
        let tf = s
            .projects
            .get_mut(&project.id)
            .unwrap()
            .tf
            .entry(name.to_string())
            .or_default();
        tf.lock = Some(TfLock {
            id: id.to_string(),
            who: user.username.clone(),
            created: now(),
        });
    }

    /// Every request the state API answered, in order.
    pub fn state_requests(&self) -> Vec<StateRequest> {
        self.lock().tf_requests.clone()
    }

    /// Answer the next `times` calls of `route` (e.g. `"POST /api/v4/projects/{id}/merge_requests/{iid}/notes"`)
    /// with `status` and a JSON error, then behave normally.
    pub fn fail_next(&self, route: &str, times: u32, status: u16) {
        self.lock().faults.insert(
            route.to_string(),
            Faults {
                remaining: times,
                status,
                retry_after: None,
                after_write: false,
            },
        );
    }

    /// Let the next `times` calls of `route` do their work (store the note, the issue, the
    /// status), then answer `status` — as when a proxy in front of GitLab times out or answers
    /// 502 after GitLab committed the write. A client cannot tell this from a failure before
    /// the write.
    pub fn fail_next_after_write(&self, route: &str, times: u32, status: u16) {
        self.lock().faults.insert(
            route.to_string(),
            Faults {
                remaining: times,
                status,
                retry_after: None,
                after_write: true,
            },
        );
    }

    /// Like [`FakeGitLab::fail_next`] with 429 and a `Retry-After: secs` header.
    pub fn rate_limit_next(&self, route: &str, times: u32, retry_after_secs: u64) {
        self.lock().faults.insert(
            route.to_string(),
            Faults {
                remaining: times,
                status: 429,
                retry_after: Some(retry_after_secs),
                after_write: false,
            },
        );
    }

    /// How many calls `route` received (failed ones included).
    pub fn calls(&self, route: &str) -> u32 {
        self.lock().calls.get(route).copied().unwrap_or(0)
    }

    /// All calls per route so far.
    pub fn all_calls(&self) -> BTreeMap<String, u32> {
        self.lock()
            .calls
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Requests the git HTTP endpoint saw.
    pub fn git_requests(&self) -> Vec<GitRequest> {
        self.lock().git_requests.clone()
    }

    /// A `Merge Request Hook` payload built from `webhooks/merge_request_open.json` as is, with
    /// the story's fields set from the MR's current state (action `open`).
    pub fn mr_webhook(&self, project: &FakeProject, iid: u64) -> MrWebhook {
        let mut v: Value =
            serde_json::from_str(&super::gitlab_fixture("webhooks/merge_request_open.json"))
                .expect("fixture parses");
        let s = self.lock();
        let p = &s.projects[&project.id];
        let mr = &p.mrs[&iid];
        let author = &s.users[&mr.author];
        let target_json = hook_project_json(&s, p.id);
        let source_json = hook_project_json(&s, mr.source_project);
        v["user"]["id"] = json!(author.id);
        v["user"]["username"] = json!(author.username);
        v["user"]["name"] = json!(author.name);
        merge_into(&mut v["project"], &target_json);
        let oa = &mut v["object_attributes"];
        oa["id"] = json!(mr.id);
        oa["iid"] = json!(mr.iid);
        oa["title"] = json!(mr.title);
        oa["author_id"] = json!(mr.author);
        oa["source_branch"] = json!(mr.source_branch);
        oa["target_branch"] = json!(mr.target_branch);
        oa["source_project_id"] = json!(mr.source_project);
        oa["target_project_id"] = json!(p.id);
        oa["target_branch_protected"] = json!(p.protected.contains(&mr.target_branch));
        oa["state"] = json!(mr.state);
        oa["draft"] = json!(mr.draft);
        oa["merge_commit_sha"] = json!(mr.merge_commit_sha);
        oa["last_commit"]["id"] = json!(mr.sha);
        oa["last_commit"]["url"] = json!(format!("{}/{}/-/commit/{}", s.base_url, p.path, mr.sha));
        oa["url"] = json!(format!(
            "{}/{}/-/merge_requests/{}",
            s.base_url, p.path, mr.iid
        ));
        merge_into(&mut oa["source"], &source_json);
        merge_into(&mut oa["target"], &target_json);
        oa["action"] = json!(match mr.state.as_str() {
            "merged" => "merge",
            "closed" => "close",
            _ => "open",
        });
        MrWebhook { v }
    }

    /// A `Note Hook` payload from `webhooks/note_merge_request.json` as is: `user` writes `body`
    /// on the MR (the note is also added to the MR, as GitLab would have it).
    pub fn note_webhook(
        &self,
        project: &FakeProject,
        iid: u64,
        user: &FakeUser,
        body: &str,
    ) -> Value {
        let note_id = self.add_note(project, iid, user, body);
        let mut v: Value =
            serde_json::from_str(&super::gitlab_fixture("webhooks/note_merge_request.json"))
                .expect("fixture parses");
        let s = self.lock();
        let p = &s.projects[&project.id];
        let mr = &p.mrs[&iid];
        let target_json = hook_project_json(&s, p.id);
        let source_json = hook_project_json(&s, mr.source_project);
        v["user"]["id"] = json!(user.id);
        v["user"]["username"] = json!(user.username);
        v["user"]["name"] = json!(user.name);
        v["project_id"] = json!(p.id);
        merge_into(&mut v["project"], &target_json);
        let oa = &mut v["object_attributes"];
        oa["id"] = json!(note_id);
        oa["note"] = json!(body);
        oa["author_id"] = json!(user.id);
        oa["project_id"] = json!(p.id);
        oa["noteable_id"] = json!(mr.id);
        oa["url"] = json!(format!(
            "{}/{}/-/merge_requests/{}#note_{note_id}",
            s.base_url, p.path, mr.iid
        ));
        let m = &mut v["merge_request"];
        m["id"] = json!(mr.id);
        m["iid"] = json!(mr.iid);
        m["title"] = json!(mr.title);
        m["author_id"] = json!(mr.author);
        m["source_branch"] = json!(mr.source_branch);
        m["target_branch"] = json!(mr.target_branch);
        m["source_project_id"] = json!(mr.source_project);
        m["target_project_id"] = json!(p.id);
        m["state"] = json!(mr.state);
        m["draft"] = json!(mr.draft);
        m["work_in_progress"] = json!(mr.draft);
        m["last_commit"]["id"] = json!(mr.sha);
        merge_into(&mut m["source"], &source_json);
        merge_into(&mut m["target"], &target_json);
        v
    }
}

/// Builder for a Merge Request Hook payload; see [`FakeGitLab::mr_webhook`].
pub struct MrWebhook {
    v: Value,
}

impl MrWebhook {
    /// `open`, `reopen`, `update`, `close`, `merge`, `approved`, ...
    pub fn action(mut self, action: &str) -> MrWebhook {
        self.v["object_attributes"]["action"] = json!(action);
        self
    }

    /// `update` with new commits: `oldrev` is the previous head.
    pub fn oldrev(mut self, sha: &str) -> MrWebhook {
        self.v["object_attributes"]["action"] = json!("update");
        self.v["object_attributes"]["oldrev"] = json!(sha);
        self
    }

    /// Replace the `changes` object (e.g. `{"draft": {"previous": true, "current": false}}`).
    pub fn changes(mut self, changes: Value) -> MrWebhook {
        self.v["changes"] = changes;
        self
    }

    /// Who triggered the event.
    pub fn by(mut self, user: &FakeUser) -> MrWebhook {
        self.v["user"]["id"] = json!(user.id);
        self.v["user"]["username"] = json!(user.username);
        self.v["user"]["name"] = json!(user.name);
        self
    }

    /// Set any field by JSON pointer (`/object_attributes/draft`).
    pub fn set(mut self, pointer: &str, value: Value) -> MrWebhook {
        *self
            .v
            .pointer_mut(pointer)
            .unwrap_or_else(|| panic!("no {pointer} in payload")) = value;
        self
    }

    pub fn build(self) -> Value {
        self.v
    }

    pub fn body(self) -> Vec<u8> {
        serde_json::to_vec(&self.v).unwrap()
    }
}

fn merge_into(dst: &mut Value, src: &Value) {
    if let (Some(d), Some(s)) = (dst.as_object_mut(), src.as_object()) {
        for (k, v) in s {
            d.insert(k.clone(), v.clone());
        }
    } else {
        *dst = src.clone();
    }
}

fn hook_project_json(s: &StateInner, pid: u64) -> Value {
    let p = &s.projects[&pid];
    let web = format!("{}/{}", s.base_url, p.path);
    json!({
        "id": p.id,
        "name": p.path.rsplit('/').next().unwrap_or(&p.path),
        "web_url": web,
        "git_http_url": format!("{web}.git"),
        "git_ssh_url": format!("ssh://git@fake.gitlab/{}.git", p.path),
        "namespace": p.path.split('/').next().unwrap_or(""),
        "path_with_namespace": p.path,
        "default_branch": p.default_branch,
    })
}

// ---------------------------------------------------------------------------------------------
// JSON shapes
// ---------------------------------------------------------------------------------------------

fn user_json(u: &FakeUser) -> Value {
    json!({
        "id": u.id, "username": u.username, "name": u.name, "state": "active",
        "locked": false, "avatar_url": null, "web_url": format!("http://fake.gitlab/{}", u.username)
    })
}

fn user_by_id(s: &StateInner, id: u64) -> Value {
    s.users.get(&id).map(user_json).unwrap_or(Value::Null)
}

fn project_json(s: &StateInner, p: &FProject) -> Value {
    let web = format!("{}/{}", s.base_url, p.path);
    json!({
        "id": p.id,
        "name": p.path.rsplit('/').next().unwrap_or(&p.path),
        "path": p.path.rsplit('/').next().unwrap_or(&p.path),
        "path_with_namespace": p.path,
        "default_branch": p.default_branch,
        "visibility": "private",
        "http_url_to_repo": format!("{web}.git"),
        "ssh_url_to_repo": format!("ssh://git@fake.gitlab/{}.git", p.path),
        "web_url": web,
        "created_at": "2026-01-01T00:00:00.000Z",
        "archived": false,
    })
}

fn mr_json(s: &StateInner, pid: u64, mr: &FMr) -> Value {
    let p = &s.projects[&pid];
    let repo = s.repo(pid);
    let base = rev_parse(&repo, &format!("refs/heads/{}", mr.target_branch))
        .and_then(|t| try_git(&repo, &["merge-base", &t, &mr.sha], &[], None).ok());
    json!({
        "id": mr.id,
        "iid": mr.iid,
        "project_id": pid,
        "title": mr.title,
        "description": "",
        "state": mr.state,
        "draft": mr.draft,
        "work_in_progress": mr.draft,
        "sha": mr.sha,
        "source_project_id": mr.source_project,
        "target_project_id": pid,
        "source_branch": mr.source_branch,
        "target_branch": mr.target_branch,
        "author": user_by_id(s, mr.author),
        "merge_commit_sha": mr.merge_commit_sha,
        "squash_commit_sha": mr.squash_commit_sha,
        "squash": mr.squash,
        "merged_by": mr.merged_by.map(|u| user_by_id(s, u)).unwrap_or(Value::Null),
        "merge_user": mr.merged_by.map(|u| user_by_id(s, u)).unwrap_or(Value::Null),
        "detailed_merge_status": match (mr.state.as_str(), mr.merge_ref_pending) {
            ("opened", true) => "checking",
            ("opened", false) => "mergeable",
            _ => "not_open",
        },
        "diff_refs": {"base_sha": base, "head_sha": mr.sha, "start_sha": base},
        "web_url": format!("{}/{}/-/merge_requests/{}", s.base_url, p.path, mr.iid),
        "references": {"short": format!("!{}", mr.iid), "full": format!("{}!{}", p.path, mr.iid)},
        "created_at": "2026-01-01T00:00:00.000Z",
    })
}

/// A fake timestamp that orders as the logical time `t` does.
fn logical_time(t: u64) -> String {
    format!(
        "2026-01-01T{:02}:{:02}:{:02}.000Z",
        (t / 3600) % 24,
        (t / 60) % 60,
        t % 60
    )
}

fn note_json(s: &StateInner, mr: &FMr, n: &FakeNote) -> Value {
    json!({
        "id": n.id,
        "type": null,
        "body": n.body,
        "attachment": null,
        "author": user_by_id(s, n.author_id),
        "created_at": logical_time(n.created),
        "updated_at": logical_time(n.updated),
        "system": n.system,
        "noteable_id": mr.id,
        "noteable_type": "MergeRequest",
        "noteable_iid": mr.iid,
        "resolvable": false,
        "confidential": false,
        "internal": false,
    })
}

fn status_json(s: &StateInner, st: &FakeStatus, author: u64) -> Value {
    json!({
        "id": st.id, "sha": st.sha, "ref": st.ref_, "status": st.state, "name": st.name,
        "target_url": st.target_url, "description": st.description,
        "created_at": now(), "started_at": null, "finished_at": null,
        "allow_failure": false, "coverage": null, "pipeline_id": st.pipeline_id,
        "author": user_by_id(s, author),
    })
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

fn err(code: StatusCode, message: &str) -> Response {
    (code, Json(json!({ "message": message }))).into_response()
}

fn router(state: Shared) -> Router {
    let api = Router::new()
        .route("/api/v4/user", get(get_user))
        .route("/api/v4/users/{id}", get(get_user_by_id))
        .route(
            "/api/v4/groups/{id}/members/all/{user_id}",
            get(get_group_member),
        )
        .route("/api/v4/job", get(get_job))
        .route("/api/v4/projects/{id}", get(get_project))
        .route(
            "/api/v4/projects/{id}/members/all/{user_id}",
            get(get_member),
        )
        .route("/api/v4/projects/{id}/merge_requests", get(list_mrs))
        .route("/api/v4/projects/{id}/merge_requests/{iid}", get(get_mr))
        .route(
            "/api/v4/projects/{id}/merge_requests/{iid}/notes",
            get(list_notes).post(create_note),
        )
        .route(
            "/api/v4/projects/{id}/merge_requests/{iid}/notes/{note_id}",
            axum::routing::put(edit_note).get(get_note),
        )
        .route("/api/v4/projects/{id}/statuses/{sha}", post(post_status))
        .route(
            "/api/v4/projects/{id}/repository/commits/{sha}/statuses",
            get(list_statuses),
        )
        .route(
            "/api/v4/projects/{id}/repository/commits/{sha}/merge_requests",
            get(commit_mrs),
        )
        .route(
            "/api/v4/projects/{id}/repository/branches/{branch}",
            get(get_branch),
        )
        .route(
            "/api/v4/projects/{id}/issues",
            get(list_issues).post(create_issue),
        )
        .route("/api/v4/projects/{id}/issues/{iid}", put(edit_issue))
        .route(
            "/api/v4/projects/{id}/issues/{iid}/notes",
            get(list_issue_notes).post(create_issue_note),
        )
        .route("/api/v4/projects/{id}/hooks", get(list_hooks))
        .route(
            "/api/v4/projects/{id}/terraform/state/{name}",
            any(tf_state),
        )
        .route(
            "/api/v4/projects/{id}/terraform/state/{name}/lock",
            any(tf_lock),
        )
        .route("/api/graphql", post(graphql))
        .route("/oauth/authorize", get(oauth_authorize))
        .route("/oauth/token", post(oauth_token))
        .route("/-/fake/sign_in_as/{session}", get(fake_sign_in_as))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            count_and_fault,
        ));
    api.fallback(git_http)
        .layer(DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(state)
}

async fn count_and_fault(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_default();
    let key = format!("{} {}", req.method(), route);
    let fault = {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        *s.calls.entry(key.clone()).or_default() += 1;
        match s.faults.get_mut(&key) {
            Some(f) if f.remaining > 0 => {
                f.remaining -= 1;
                Some((f.status, f.retry_after, f.after_write))
            }
            _ => None,
        }
    };
    if let Some((code, retry_after, after_write)) = fault {
        if after_write {
            // The work is done (and kept); only the answer is lost.
            let _ = next.run(req).await;
        }
        let mut resp = err(
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &format!("{code} injected by the fake GitLab"),
        );
        if let Some(secs) = retry_after {
            resp.headers_mut().insert(
                "retry-after",
                HeaderValue::from_str(&secs.to_string()).unwrap(),
            );
        }
        return resp;
    }
    next.run(req).await
}

/// The user behind `PRIVATE-TOKEN` or `Authorization: Bearer`.
fn api_user(s: &StateInner, headers: &HeaderMap) -> Result<FakeUser, Response> {
    let token = headers
        .get("private-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| {
            headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_string)
        });
    match token.and_then(|t| s.user_by_token(&t).cloned()) {
        Some(u) => Ok(u),
        None => Err(err(StatusCode::UNAUTHORIZED, "401 Unauthorized")),
    }
}

/// The project, visible only to its members (like a private project).
fn visible_project(s: &StateInner, key: &str, user: &FakeUser) -> Result<u64, Response> {
    match s.project_ref(key) {
        Some(pid) if s.projects[&pid].members.contains_key(&user.id) => Ok(pid),
        _ => Err(err(StatusCode::NOT_FOUND, "404 Project Not Found")),
    }
}

fn level(s: &StateInner, pid: u64, user: &FakeUser) -> u32 {
    s.projects[&pid].members.get(&user.id).copied().unwrap_or(0)
}

macro_rules! lock {
    ($state:expr) => {
        $state.lock().unwrap_or_else(|e| e.into_inner())
    };
}

macro_rules! tryr {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return r,
        }
    };
}

async fn get_user(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let s = lock!(state);
    if let Some(u) = oauth_user(&s, &headers) {
        return Json(user_json(&u)).into_response();
    }
    let u = tryr!(api_user(&s, &headers));
    Json(user_json(&u)).into_response()
}

/// `GET /users/:id`: any signed-in user may read another's public profile.
async fn get_user_by_id(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> Response {
    let s = lock!(state);
    tryr!(api_user(&s, &headers));
    match s.users.get(&id) {
        Some(u) => Json(user_json(u)).into_response(),
        None => err(StatusCode::NOT_FOUND, "404 User Not Found"),
    }
}

/// `GET /groups/:id/members/all/:user_id`: a member of the group or of an ancestor (the
/// nearest membership's level); 404 for anyone else, and for a group the caller cannot see.
async fn get_group_member(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, user_id)): Path<(String, u64)>,
) -> Response {
    let s = lock!(state);
    let caller = tryr!(api_user(&s, &headers));
    let chain = s.group_chain(&id);
    let Some(group) = chain.first() else {
        return err(StatusCode::NOT_FOUND, "404 Group Not Found");
    };
    let is_member = |uid: u64| chain.iter().find_map(|g| g.members.get(&uid).copied());
    let visible = group.visibility != "private" || is_member(caller.id).is_some();
    if !visible {
        return err(StatusCode::NOT_FOUND, "404 Group Not Found");
    }
    match (is_member(user_id), s.users.get(&user_id)) {
        (Some(level), Some(member)) => {
            let mut v = user_json(member);
            v["access_level"] = json!(level);
            Json(v).into_response()
        }
        _ => err(StatusCode::NOT_FOUND, "404 Not found"),
    }
}

async fn get_job(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let s = lock!(state);
    let token = headers.get("job-token").and_then(|v| v.to_str().ok());
    let job = match token.and_then(|t| s.jobs.get(t)) {
        Some(j) if j.status == "running" => j.clone(),
        _ => return err(StatusCode::UNAUTHORIZED, "401 Unauthorized"),
    };
    let mut v: Value =
        serde_json::from_str(&super::gitlab_fixture("api/get_job_via_job_token.json")).unwrap();
    v["id"] = json!(job.id);
    v["name"] = json!(job.name);
    v["status"] = json!(job.status);
    v["ref"] = json!(job.ref_);
    v["tag"] = json!(job.tag);
    v["stage"] = json!("deploy");
    v["finished_at"] = Value::Null;
    v["failure_reason"] = Value::Null;
    v["commit"]["id"] = json!(job.sha);
    v["pipeline"] = json!({
        "id": job.pipeline_id, "project_id": job.project_id, "ref": job.ref_,
        "sha": job.sha, "status": "running"
    });
    v["user"] = match &job.user {
        Some(u) => user_json(u),
        None => Value::Null,
    };
    v["web_url"] = json!(format!("{}/-/jobs/{}", s.base_url, job.id));
    Json(v).into_response()
}

async fn get_project(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    Json(project_json(&s, &s.projects[&pid])).into_response()
}

async fn get_member(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, user_id)): Path<(String, u64)>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    match (
        s.projects[&pid].members.get(&user_id),
        s.users.get(&user_id),
    ) {
        (Some(level), Some(member)) => {
            let mut v = user_json(member);
            v["access_level"] = json!(level);
            Json(v).into_response()
        }
        _ => err(StatusCode::NOT_FOUND, "404 Not found"),
    }
}

#[derive(serde::Deserialize, Default)]
struct PageQuery {
    page: Option<usize>,
    per_page: Option<usize>,
    sort: Option<String>,
    order_by: Option<String>,
    state: Option<String>,
    author_id: Option<u64>,
    labels: Option<String>,
}

/// GitLab's offset pagination: `page`, `per_page` (default 20, max 100) and the `x-*` headers.
fn paginate(items: Vec<Value>, q: &PageQuery) -> Response {
    let per_page = q.per_page.unwrap_or(20).clamp(1, 100);
    let page = q.page.unwrap_or(1).max(1);
    let total = items.len();
    let pages = total.div_ceil(per_page).max(1);
    let slice: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    let mut resp = Json(Value::Array(slice)).into_response();
    let h = resp.headers_mut();
    let next = if page < pages {
        (page + 1).to_string()
    } else {
        String::new()
    };
    let prev = if page > 1 {
        (page - 1).to_string()
    } else {
        String::new()
    };
    for (k, v) in [
        ("x-page", page.to_string()),
        ("x-per-page", per_page.to_string()),
        ("x-total", total.to_string()),
        ("x-total-pages", pages.to_string()),
        ("x-next-page", next),
        ("x-prev-page", prev),
    ] {
        h.insert(k, HeaderValue::from_str(&v).unwrap());
    }
    resp
}

async fn list_mrs(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<PageQuery>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let want = q.state.clone().unwrap_or_else(|| "all".into());
    let items: Vec<Value> = s.projects[&pid]
        .mrs
        .values()
        .rev()
        .filter(|m| want == "all" || m.state == want)
        .map(|m| mr_json(&s, pid, m))
        .collect();
    paginate(items, &q)
}

async fn get_mr(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid)): Path<(String, u64)>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    match s.projects[&pid].mrs.get(&iid) {
        Some(mr) => Json(mr_json(&s, pid, mr)).into_response(),
        None => err(StatusCode::NOT_FOUND, "404 Not found"),
    }
}

async fn list_notes(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid)): Path<(String, u64)>,
    Query(q): Query<PageQuery>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let Some(mr) = s.projects[&pid].mrs.get(&iid) else {
        return err(StatusCode::NOT_FOUND, "404 Not found");
    };
    // https://docs.gitlab.com/api/notes/#list-all-merge-request-notes: `order_by` created_at
    // (default) or updated_at, `sort` desc (default) or asc.
    let mut notes: Vec<&FakeNote> = mr.notes.iter().collect();
    match q.order_by.as_deref() {
        None | Some("created_at") => notes.sort_by_key(|n| (n.created, n.id)),
        Some("updated_at") => notes.sort_by_key(|n| (n.updated, n.id)),
        Some(other) => {
            return err(
                StatusCode::BAD_REQUEST,
                &format!("400 Bad request - order_by does not have a valid value ({other})"),
            )
        }
    }
    if q.sort.as_deref() != Some("asc") {
        notes.reverse();
    }
    let items: Vec<Value> = notes.iter().map(|n| note_json(&s, mr, n)).collect();
    paginate(items, &q)
}

#[derive(serde::Deserialize)]
struct NoteBody {
    body: Option<String>,
}

const NOTE_LIMIT: usize = 1_000_000;

async fn create_note(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid)): Path<(String, u64)>,
    Json(b): Json<NoteBody>,
) -> Response {
    let mut s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let body = b.body.unwrap_or_default();
    if body.trim().is_empty() {
        return err(StatusCode::BAD_REQUEST, "400 Bad request - body is missing");
    }
    s.inspect(
        "POST /api/v4/projects/{id}/merge_requests/{iid}/notes",
        &body,
    );
    // GitLab runs the note's quick actions and keeps the rest.
    let body = super::gitlab_reading::without_quick_actions(&body);
    if body.chars().count() > NOTE_LIMIT {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"message": {"note": ["is too long (maximum is 1000000 characters)"]}})),
        )
            .into_response();
    }
    let note_id = s.id();
    let Some(mr) = s.projects.get_mut(&pid).unwrap().mrs.get_mut(&iid) else {
        return err(StatusCode::NOT_FOUND, "404 Not found");
    };
    let note = FakeNote {
        id: note_id,
        body,
        author_id: u.id,
        system: false,
        edits: 0,
        created: note_id,
        updated: note_id,
    };
    mr.notes.push(note.clone());
    let mr = mr.clone();
    (StatusCode::CREATED, Json(note_json(&s, &mr, &note))).into_response()
}

async fn get_note(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid, note_id)): Path<(String, u64, u64)>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let Some(mr) = s.projects[&pid].mrs.get(&iid) else {
        return err(StatusCode::NOT_FOUND, "404 Not found");
    };
    match mr.notes.iter().find(|n| n.id == note_id) {
        Some(n) => Json(note_json(&s, mr, n)).into_response(),
        None => err(StatusCode::NOT_FOUND, "404 Note Not Found"),
    }
}

async fn edit_note(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid, note_id)): Path<(String, u64, u64)>,
    Json(b): Json<NoteBody>,
) -> Response {
    let mut s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let body = b.body.unwrap_or_default();
    if body.chars().count() > NOTE_LIMIT {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"message": {"note": ["is too long (maximum is 1000000 characters)"]}})),
        )
            .into_response();
    }
    s.inspect(
        "PUT /api/v4/projects/{id}/merge_requests/{iid}/notes/{note_id}",
        &body,
    );
    let body = super::gitlab_reading::without_quick_actions(&body);
    let updated = s.id();
    let Some(mr) = s.projects.get_mut(&pid).unwrap().mrs.get_mut(&iid) else {
        return err(StatusCode::NOT_FOUND, "404 Not found");
    };
    let Some(n) = mr.notes.iter_mut().find(|n| n.id == note_id) else {
        return err(StatusCode::NOT_FOUND, "404 Note Not Found");
    };
    if n.author_id != u.id {
        return err(StatusCode::FORBIDDEN, "403 Forbidden");
    }
    n.body = body;
    n.edits += 1;
    n.updated = updated;
    let n = n.clone();
    let mr = mr.clone();
    Json(note_json(&s, &mr, &n)).into_response()
}

#[derive(serde::Deserialize)]
struct StatusBody {
    state: String,
    name: Option<String>,
    context: Option<String>,
    description: Option<String>,
    target_url: Option<String>,
    #[serde(rename = "ref")]
    ref_: Option<String>,
    pipeline_id: Option<u64>,
}

async fn post_status(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, sha)): Path<(String, String)>,
    Json(b): Json<StatusBody>,
) -> Response {
    let mut s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    if level(&s, pid, &u) < DEVELOPER {
        return err(StatusCode::FORBIDDEN, "403 Forbidden");
    }
    if !["pending", "running", "success", "failed", "canceled"].contains(&b.state.as_str()) {
        return err(
            StatusCode::BAD_REQUEST,
            "400 Bad request - state does not have a valid value",
        );
    }
    if rev_parse(&s.repo(pid), &sha).is_none() {
        return err(StatusCode::NOT_FOUND, "404 Commit Not Found");
    }
    if let Some(d) = &b.description {
        s.inspect("POST /api/v4/projects/{id}/statuses/{sha}", d);
    }
    if b.description
        .as_deref()
        .is_some_and(|d| d.chars().count() > 255)
    {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"message": {"description": ["is too long (maximum is 255 characters)"]}})),
        )
            .into_response();
    }
    let name = b.name.or(b.context).unwrap_or_else(|| "default".into());
    // Without `ref`, GitLab takes the first branch that holds the commit; none is a 404.
    let ref_ = match b.ref_ {
        Some(r) => r,
        None => match branches_containing(&s.repo(pid), &sha).into_iter().next() {
            Some(branch) => branch,
            None => return err(StatusCode::NOT_FOUND, "404 References for commit Not Found"),
        },
    };
    // Ci::CreateCommitStatusService: only a pending/running status of the same name, ref and
    // user is updated; otherwise (none, or a final one) a new status is created.
    let p = s.projects.get_mut(&pid).unwrap();
    let open = p.statuses.iter_mut().rev().find(|x| {
        x.sha == sha
            && x.name == name
            && x.ref_.as_deref() == Some(ref_.as_str())
            && x.author_id == u.id
            && matches!(x.state.as_str(), "pending" | "running")
    });
    let row = match open {
        Some(x) => {
            // The state machine: pending → running/final, running → final.
            let allowed = !matches!(
                (x.state.as_str(), b.state.as_str()),
                ("pending", "pending") | ("running", "pending" | "running")
            );
            if !allowed {
                let event = match b.state.as_str() {
                    "pending" => "enqueue",
                    _ => "run",
                };
                let cur = x.state.clone();
                return err(
                    StatusCode::BAD_REQUEST,
                    &format!("Cannot transition status via :{event} from :{cur} (Reason(s): Status cannot transition via \"{event}\".)"),
                );
            }
            x.state = b.state;
            if b.description.is_some() {
                x.description = b.description;
            }
            if b.target_url.is_some() {
                x.target_url = b.target_url;
            }
            x.clone()
        }
        None => {
            let status_id = s.id();
            let st = FakeStatus {
                id: status_id,
                sha,
                name,
                state: b.state,
                description: b.description,
                target_url: b.target_url,
                ref_: Some(ref_),
                pipeline_id: b.pipeline_id,
                author_id: u.id,
            };
            s.projects.get_mut(&pid).unwrap().statuses.push(st.clone());
            st
        }
    };
    s.projects
        .get_mut(&pid)
        .unwrap()
        .status_posts
        .push(row.clone());
    (StatusCode::CREATED, Json(status_json(&s, &row, u.id))).into_response()
}

/// The branches whose history holds `sha`, by name.
fn branches_containing(repo: &FsPath, sha: &str) -> Vec<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args([
            "for-each-ref",
            "--format=%(refname:short)",
            "--contains",
            sha,
            "refs/heads/",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

#[derive(serde::Deserialize, Default)]
struct StatusQuery {
    #[serde(rename = "ref")]
    ref_: Option<String>,
    name: Option<String>,
    all: Option<bool>,
    page: Option<usize>,
    per_page: Option<usize>,
}

/// <https://docs.gitlab.com/api/commits/#list-the-statuses-of-a-commit>: the latest status
/// per name and ref unless `all=true`; `ref` and `name` filter.
async fn list_statuses(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, sha)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let rows: Vec<&FakeStatus> = s.projects[&pid]
        .statuses
        .iter()
        .filter(|x| x.sha == sha)
        .filter(|x| q.ref_.is_none() || x.ref_ == q.ref_)
        .filter(|x| q.name.is_none() || Some(&x.name) == q.name.as_ref())
        .collect();
    let items: Vec<Value> = rows
        .iter()
        .filter(|x| {
            q.all == Some(true)
                || !rows
                    .iter()
                    .any(|y| y.id > x.id && y.name == x.name && y.ref_ == x.ref_)
        })
        .map(|x| status_json(&s, x, x.author_id))
        .collect();
    paginate(
        items,
        &PageQuery {
            page: q.page,
            per_page: q.per_page,
            ..PageQuery::default()
        },
    )
}

async fn commit_mrs(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, sha)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let items: Vec<Value> = s.projects[&pid]
        .mrs
        .values()
        .filter(|m| {
            m.shas.contains(&sha)
                || m.merge_commit_sha.as_deref() == Some(sha.as_str())
                || m.squash_commit_sha.as_deref() == Some(sha.as_str())
        })
        .map(|m| mr_json(&s, pid, m))
        .collect();
    paginate(items, &q)
}

async fn get_branch(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, branch)): Path<(String, String)>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let p = &s.projects[&pid];
    let Some(sha) = rev_parse(&s.repo(pid), &format!("refs/heads/{branch}")) else {
        return err(StatusCode::NOT_FOUND, "404 Branch Not Found");
    };
    let mut v: Value =
        serde_json::from_str(&super::gitlab_fixture("api/branch_single.json")).unwrap();
    v["name"] = json!(branch);
    v["protected"] = json!(p.protected.contains(&branch));
    v["default"] = json!(p.default_branch == branch);
    v["web_url"] = json!(format!("{}/{}/-/tree/{branch}", s.base_url, p.path));
    v["commit"]["id"] = json!(sha);
    v["commit"]["short_id"] = json!(&sha[..8]);
    v["commit"]["parent_ids"] = json!([]);
    Json(v).into_response()
}

#[derive(serde::Deserialize)]
struct IssueBody {
    title: Option<String>,
    description: Option<String>,
    /// Comma-separated, as the API takes them.
    labels: Option<String>,
    state_event: Option<String>,
}

fn label_list(labels: &str) -> Vec<String> {
    labels
        .split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

fn issue_json(s: &StateInner, pid: u64, i: &FakeIssue) -> Value {
    let p = &s.projects[&pid];
    json!({
        "id": i.id, "iid": i.iid, "project_id": pid, "title": i.title,
        "description": i.description, "state": i.state, "labels": i.labels,
        "created_at": i.created_at,
        "web_url": format!("{}/{}/-/issues/{}", s.base_url, p.path, i.iid),
        "author": user_by_id(s, i.author_id),
    })
}

/// <https://docs.gitlab.com/api/issues/#edit-an-issue>: the author or a Reporter edits;
/// `state_event` `close`/`reopen`; `labels` replaces the labels.
async fn edit_issue(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid)): Path<(String, u64)>,
    Json(b): Json<IssueBody>,
) -> Response {
    let mut s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let reporter = level(&s, pid, &u) >= REPORTER;
    if let Some(d) = &b.description {
        s.inspect("PUT /api/v4/projects/{id}/issues/{iid}", d);
    }
    let p = s.projects.get_mut(&pid).unwrap();
    let Some(issue) = p.issues.iter_mut().find(|i| i.iid == iid) else {
        return err(StatusCode::NOT_FOUND, "404 Issue Not Found");
    };
    if issue.author_id != u.id && !reporter {
        return err(StatusCode::FORBIDDEN, "403 Forbidden");
    }
    if let Some(t) = b.title {
        issue.title = t;
    }
    if let Some(d) = b.description {
        issue.description = super::gitlab_reading::without_quick_actions(&d);
    }
    if let Some(l) = b.labels {
        issue.labels = label_list(&l);
    }
    match b.state_event.as_deref() {
        Some("close") => issue.state = "closed".into(),
        Some("reopen") => issue.state = "opened".into(),
        _ => {}
    }
    let issue = issue.clone();
    Json(issue_json(&s, pid, &issue)).into_response()
}

/// <https://docs.gitlab.com/api/notes/#create-new-issue-note>
async fn create_issue_note(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid)): Path<(String, u64)>,
    Json(b): Json<NoteBody>,
) -> Response {
    let mut s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let Some(body) = b.body.filter(|t| !t.trim().is_empty()) else {
        return err(StatusCode::BAD_REQUEST, "400 Bad request - body is missing");
    };
    s.inspect("POST /api/v4/projects/{id}/issues/{iid}/notes", &body);
    let body = super::gitlab_reading::without_quick_actions(&body);
    let note_id = s.id();
    let p = s.projects.get_mut(&pid).unwrap();
    let Some(issue) = p.issues.iter_mut().find(|i| i.iid == iid) else {
        return err(StatusCode::NOT_FOUND, "404 Issue Not Found");
    };
    issue.notes.push((note_id, u.id, body.clone()));
    (
        StatusCode::CREATED,
        Json(
            json!({ "id": note_id, "body": body, "author": user_json(&u), "system": false,
                     "noteable_type": "Issue", "noteable_iid": iid }),
        ),
    )
        .into_response()
}

/// <https://docs.gitlab.com/api/notes/#list-project-issue-notes>: `sort` desc by default.
async fn list_issue_notes(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid)): Path<(String, u64)>,
    Query(q): Query<PageQuery>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let Some(issue) = s.projects[&pid].issues.iter().find(|i| i.iid == iid) else {
        return err(StatusCode::NOT_FOUND, "404 Issue Not Found");
    };
    let mut notes: Vec<Value> = issue
        .notes
        .iter()
        .map(|(nid, author, body)| {
            json!({ "id": nid, "body": body, "author": user_by_id(&s, *author), "system": false })
        })
        .collect();
    if q.sort.as_deref() != Some("asc") {
        notes.reverse();
    }
    paginate(notes, &q)
}

async fn create_issue(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Json(b): Json<IssueBody>,
) -> Response {
    let mut s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let Some(title) = b.title.filter(|t| !t.trim().is_empty()) else {
        return err(
            StatusCode::BAD_REQUEST,
            "400 Bad request - title is missing",
        );
    };
    s.inspect("POST /api/v4/projects/{id}/issues", &title);
    let description = b.description.unwrap_or_default();
    s.inspect("POST /api/v4/projects/{id}/issues", &description);
    let description = super::gitlab_reading::without_quick_actions(&description);
    let issue_id = s.id();
    let base = s.base_url.clone();
    let p = s.projects.get_mut(&pid).unwrap();
    let iid = p.issues.len() as u64 + 1;
    let issue = FakeIssue {
        id: issue_id,
        iid,
        title: title.clone(),
        description,
        author_id: u.id,
        state: "opened".into(),
        labels: label_list(b.labels.as_deref().unwrap_or("")),
        notes: Vec::new(),
        created_at: now(),
    };
    p.issues.push(issue.clone());
    let web = format!("{base}/{}/-/issues/{iid}", p.path);
    (
        StatusCode::CREATED,
        Json(json!({
            "id": issue_id, "iid": iid, "project_id": pid, "title": title,
            "description": issue.description, "state": "opened", "web_url": web,
            "labels": issue.labels, "author": user_json(&u), "created_at": issue.created_at,
        })),
    )
        .into_response()
}

/// <https://docs.gitlab.com/api/issues/#list-project-issues>: newest first by default,
/// `sort=asc`, `author_id` filters.
async fn list_issues(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<PageQuery>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let p = &s.projects[&pid];
    // `state`: opened (or closed, or all: the default); `labels`: every one listed.
    let wanted = label_list(q.labels.as_deref().unwrap_or(""));
    let mut issues: Vec<&FakeIssue> = p
        .issues
        .iter()
        .filter(|i| q.author_id.is_none_or(|a| a == i.author_id))
        .filter(|i| match q.state.as_deref() {
            None | Some("all") => true,
            Some(state) => i.state == state,
        })
        .filter(|i| wanted.iter().all(|l| i.labels.contains(l)))
        .collect();
    if q.sort.as_deref() != Some("asc") {
        issues.reverse();
    }
    let items = issues.iter().map(|i| issue_json(&s, pid, i)).collect();
    paginate(items, &q)
}

async fn list_hooks(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<PageQuery>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    if level(&s, pid, &u) < MAINTAINER {
        return err(StatusCode::FORBIDDEN, "403 Forbidden");
    }
    paginate(s.projects[&pid].hooks.clone(), &q)
}

// ----- Terraform state (GitLab-managed, used by the engine's `http` backend) ------------------
//
// As GitLab's `lib/api/terraform/state.rb` and `Terraform::RemoteStateHandler` do it
// (docs: user/infrastructure/iac/terraform_state, api/terraform_states): HTTP Basic auth with
// any user name and a personal access token (or `gitlab-ci-token` and a running job's token,
// acting as the job's user); a project the user is no member of is a 404; reading needs the
// Developer role (`read_terraform_state`), everything else Maintainer (`admin_terraform_state`):
// 403 otherwise. A state never written is a 404 to GET. A held lock answers `409 Conflict` with
// the lock info: `ID`, `Who` (the GitLab user who locked) and `Created` of the held lock, the
// other fields from the request. A write must name the held lock (`?ID=`), and every write
// is a new version (its `serial`).

/// Basic auth with any user name and a user's token (or `gitlab-ci-token` + a running job
/// token, which acts as the job's user).
fn basic_user(s: &StateInner, headers: &HeaderMap) -> Option<(String, Option<FakeUser>)> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, pass) = decoded.split_once(':')?;
    if let Some(u) = s.user_by_token(pass) {
        return Some((user.to_string(), Some(u.clone())));
    }
    if user == "gitlab-ci-token" {
        if let Some(j) = s.jobs.get(pass).filter(|j| j.status == "running") {
            return Some((user.to_string(), j.user.clone()));
        }
    }
    None
}

/// One request to the state API, as the fake answered it (for "never sends a lock" checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRequest {
    pub method: String,
    /// `state` or `lock`.
    pub target: String,
    pub name: String,
    /// The GitLab user the token belongs to.
    pub user: Option<String>,
    pub status: u16,
}

/// The user and project of a state request, and whether the user may do `needed`.
fn tf_auth(
    s: &StateInner,
    headers: &HeaderMap,
    id: &str,
    needed: u32,
) -> Result<(u64, FakeUser), Response> {
    // Basic auth (the engine's http backend), or the API's own token headers.
    let user = match basic_user(s, headers) {
        Some((_, Some(user))) => user,
        _ => api_user(s, headers)?,
    };
    let pid = match s.project_ref(id) {
        Some(pid) if s.projects[&pid].members.contains_key(&user.id) => pid,
        _ => return Err(err(StatusCode::NOT_FOUND, "404 Project Not Found")),
    };
    let have = level(s, pid, &user);
    if have < DEVELOPER || have < needed {
        return Err(err(StatusCode::FORBIDDEN, "403 Forbidden"));
    }
    Ok((pid, user))
}

#[derive(serde::Deserialize, Default)]
struct TfQuery {
    #[serde(rename = "ID")]
    id: Option<String>,
}

/// The lock info GitLab answers: the held lock's `ID`, `Who`, `Created`; the rest as asked.
fn lock_answer(held: &TfLock, asked: &Value) -> Value {
    let field = |k: &str| asked.get(k).cloned().unwrap_or(json!(""));
    json!({
        "Operation": field("Operation"),
        "Info": field("Info"),
        "Version": field("Version"),
        "Path": field("Path"),
        "ID": held.id,
        "Who": held.who,
        "Created": held.created,
    })
}

fn record_tf(
    state: &Shared,
    method: &str,
    target: &str,
    name: &str,
    user: Option<&FakeUser>,
    status: StatusCode,
) {
    lock!(state).tf_requests.push(StateRequest {
        method: method.to_string(),
        target: target.to_string(),
        name: name.to_string(),
        user: user.map(|u| u.username.clone()),
        status: status.as_u16(),
    });
}

async fn tf_state(
    State(state): State<Shared>,
    method: Method,
    headers: HeaderMap,
    Path((id, name)): Path<(String, String)>,
    Query(q): Query<TfQuery>,
    body: Bytes,
) -> Response {
    let needed = if method == Method::GET {
        DEVELOPER
    } else {
        MAINTAINER
    };
    let (code, user, resp) = {
        let mut s = lock!(state);
        let who = basic_user(&s, &headers)
            .and_then(|(_, u)| u)
            .or_else(|| api_user(&s, &headers).ok());
        match tf_auth(&s, &headers, &id, needed) {
            Err(r) => (r.status(), who, r),
            Ok((pid, user)) => {
                let tfs = &mut s.projects.get_mut(&pid).unwrap().tf;
                let resp = tf_state_answer(tfs, &method, &name, q.id.as_deref(), &body);
                (resp.status(), Some(user), resp)
            }
        }
    };
    record_tf(&state, method.as_str(), "state", &name, user.as_ref(), code);
    resp
}

fn tf_state_answer(
    tfs: &mut BTreeMap<String, TfState>,
    method: &Method,
    name: &str,
    lock_id: Option<&str>,
    body: &[u8],
) -> Response {
    match method.as_str() {
        "GET" => match tfs.get(name).and_then(|t| t.versions.last()) {
            Some(v) => (
                StatusCode::OK,
                [("content-type", "application/json")],
                v.data.clone(),
            )
                .into_response(),
            None if tfs.contains_key(name) => StatusCode::NO_CONTENT.into_response(),
            None => err(StatusCode::NOT_FOUND, "404 Not found"),
        },
        "POST" => {
            if body.is_empty() {
                return StatusCode::NO_CONTENT.into_response();
            }
            let Ok(doc) = serde_json::from_slice::<Value>(body) else {
                return err(StatusCode::UNPROCESSABLE_ENTITY, "invalid JSON");
            };
            let Some(serial) = doc.get("serial").and_then(Value::as_u64) else {
                return err(StatusCode::UNPROCESSABLE_ENTITY, "No serial in payload");
            };
            let tf = tfs.entry(name.to_string()).or_default();
            if tf.lock.as_ref().map(|l| l.id.as_str()) != lock_id {
                return StatusCode::CONFLICT.into_response();
            }
            tf.versions.push(TfVersion {
                serial,
                data: body.to_vec(),
            });
            StatusCode::OK.into_response()
        }
        "DELETE" => match tfs.get(name) {
            None => err(StatusCode::NOT_FOUND, "404 Not found"),
            Some(_) => {
                tfs.remove(name);
                StatusCode::OK.into_response()
            }
        },
        _ => err(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed"),
    }
}

async fn tf_lock(
    State(state): State<Shared>,
    method: Method,
    headers: HeaderMap,
    Path((id, name)): Path<(String, String)>,
    Query(q): Query<TfQuery>,
    body: Bytes,
) -> Response {
    let (code, user, resp) = {
        let mut s = lock!(state);
        let who = basic_user(&s, &headers)
            .and_then(|(_, u)| u)
            .or_else(|| api_user(&s, &headers).ok());
        match tf_auth(&s, &headers, &id, MAINTAINER) {
            Err(r) => (r.status(), who, r),
            Ok((pid, user)) => {
                let now = now();
                let tfs = &mut s.projects.get_mut(&pid).unwrap().tf;
                let resp = tf_lock_answer(tfs, &method, &name, &user, &now, q.id, &body);
                (resp.status(), Some(user), resp)
            }
        }
    };
    record_tf(&state, method.as_str(), "lock", &name, user.as_ref(), code);
    resp
}

fn tf_lock_answer(
    tfs: &mut BTreeMap<String, TfState>,
    method: &Method,
    name: &str,
    user: &FakeUser,
    now: &str,
    query_id: Option<String>,
    body: &[u8],
) -> Response {
    let asked: Value = serde_json::from_slice(body).unwrap_or(json!({}));
    let asked_id = asked
        .get("ID")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or(query_id);
    match method.as_str() {
        "POST" => {
            let Some(lock_id) = asked_id.filter(|i| !i.is_empty()) else {
                return err(StatusCode::BAD_REQUEST, "400 Bad request - ID is missing");
            };
            // The lock creates the state record (`create_or_find_by`).
            let tf = tfs.entry(name.to_string()).or_default();
            if let Some(held) = &tf.lock {
                return (StatusCode::CONFLICT, Json(lock_answer(held, &asked))).into_response();
            }
            let held = TfLock {
                id: lock_id,
                who: user.username.clone(),
                created: now.to_string(),
            };
            let answer = lock_answer(&held, &asked);
            tf.lock = Some(held);
            (StatusCode::OK, Json(answer)).into_response()
        }
        "DELETE" => {
            let Some(tf) = tfs.get_mut(name) else {
                return err(StatusCode::NOT_FOUND, "404 Not found");
            };
            // No ID = force-unlock; a wrong ID is a conflict.
            if asked_id.is_some() && tf.lock.as_ref().map(|l| &l.id) != asked_id.as_ref() {
                return StatusCode::CONFLICT.into_response();
            }
            tf.lock = None;
            StatusCode::OK.into_response()
        }
        _ => err(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed"),
    }
}

/// `POST /api/graphql`, the one query planbot asks (GitLab's `Project.terraformState`:
/// `lockedAt`, `lockedByUser { username }`). Any other query is answered with GraphQL's error
/// shape, so a test fails if planbot asks something the fake does not know. As on GitLab, a
/// project the user cannot see is `null`, and a state is `null` below the Developer role.
async fn graphql(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let s = lock!(state);
    let user = tryr!(api_user(&s, &headers));
    let req: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
    let query = req["query"].as_str().unwrap_or("");
    let known = "query($path: ID!, $name: String!) { project(fullPath: $path) { terraformState(name: $name) { lockedAt lockedByUser { username } } } }";
    if query != known {
        return Json(json!({"errors": [{"message": "the fake GitLab does not know this query"}]}))
            .into_response();
    }
    let path = req["variables"]["path"].as_str().unwrap_or("");
    let name = req["variables"]["name"].as_str().unwrap_or("");
    let project = match s.project_ref(path) {
        Some(pid) if s.projects[&pid].members.contains_key(&user.id) => pid,
        _ => return Json(json!({"data": {"project": null}})).into_response(),
    };
    let state_json = if level(&s, project, &user) < DEVELOPER {
        Value::Null
    } else {
        match s.projects[&project].tf.get(name) {
            None => Value::Null,
            Some(tf) => match &tf.lock {
                Some(l) => json!({"lockedAt": l.created, "lockedByUser": {"username": l.who}}),
                None => json!({"lockedAt": null, "lockedByUser": null}),
            },
        }
    };
    Json(json!({"data": {"project": {"terraformState": state_json}}})).into_response()
}

// ----- git over HTTP (smart protocol through `git http-backend`) ------------------------------

async fn git_http(State(state): State<Shared>, req: Request) -> Response {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let headers = req.headers().clone();
    let (git_root, auth_user, allowed) = {
        let s = lock!(state);
        let auth = basic_user(&s, &headers);
        let project_path = path
            .split_once(".git/")
            .map(|(p, _)| p.trim_start_matches('/').to_string());
        let pid = project_path.as_deref().and_then(|p| s.project_ref(p));
        let allowed = match (&auth, pid) {
            (Some((_, Some(u))), Some(pid)) => level(&s, pid, u) >= REPORTER,
            (Some((_, None)), Some(_)) => true,
            _ => false,
        };
        (s.git_root.clone(), auth.map(|(u, _)| u), allowed)
    };
    let record = |status: u16| {
        lock!(state).git_requests.push(GitRequest {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            auth_user: auth_user.clone(),
            status,
        });
    };
    if !path.contains(".git/") {
        record(404);
        return err(StatusCode::NOT_FOUND, "404 Not Found");
    }
    if !allowed {
        record(401);
        let mut r = (StatusCode::UNAUTHORIZED, "HTTP Basic: Access denied\n").into_response();
        r.headers_mut().insert(
            "www-authenticate",
            HeaderValue::from_static("Basic realm=\"Fake GitLab\""),
        );
        return r;
    }
    // Fetch only: pushes go through the test helpers.
    if path.ends_with("/git-receive-pack") || query.contains("service=git-receive-pack") {
        record(403);
        return err(StatusCode::FORBIDDEN, "pushes are not served by the fake");
    }
    let body = match axum::body::to_bytes(req.into_body(), 64 * 1024 * 1024).await {
        Ok(b) => b,
        Err(_) => {
            record(400);
            return err(StatusCode::BAD_REQUEST, "body too large");
        }
    };
    let h = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", &git_root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("PATH_INFO", &path)
        .env("QUERY_STRING", &query)
        .env("REQUEST_METHOD", &method)
        .env("CONTENT_TYPE", h("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", h("content-encoding"))
        .env("HTTP_GIT_PROTOCOL", h("git-protocol"))
        .env("REMOTE_USER", auth_user.clone().unwrap_or_default())
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            record(500);
            return err(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("git http-backend: {e}"),
            );
        }
    };
    let mut stdin = child.stdin.take().unwrap();
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
        let _ = stdin.shutdown().await;
    });
    let out = match child.wait_with_output().await {
        Ok(o) => o,
        Err(e) => {
            record(500);
            return err(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("git http-backend: {e}"),
            );
        }
    };
    let _ = writer.await;
    let raw = out.stdout;
    let (head_end, sep) = match find(&raw, b"\r\n\r\n") {
        Some(i) => (i, 4),
        None => match find(&raw, b"\n\n") {
            Some(i) => (i, 2),
            None => {
                record(500);
                return err(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "bad CGI answer from git http-backend",
                );
            }
        },
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_string();
    let mut status = StatusCode::OK;
    let mut builder = Response::builder();
    for line in head.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        if k.eq_ignore_ascii_case("status") {
            let code = v
                .split_whitespace()
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or(500);
            status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        } else {
            builder = builder.header(k, v);
        }
    }
    record(status.as_u16());
    builder
        .status(status)
        .body(Body::from(raw[head_end + sep..].to_vec()))
        .unwrap()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

// ---------------------------------------------------------------------------------------------
// Sign-in with GitLab: OAuth 2 authorization code flow with PKCE, as GitLab's docs describe it
// (https://docs.gitlab.com/api/oauth2/#authorization-code-with-proof-key-for-code-exchange-pkce):
// `GET /oauth/authorize` (the browser, signed in to GitLab, is sent back to the registered
// redirect URI with `code` and the unchanged `state`), `POST /oauth/token`
// (`grant_type=authorization_code`, `code`, `redirect_uri`, `code_verifier`, client credentials in
// the body or as Basic auth; answers `access_token`, `token_type: "Bearer"`, `expires_in: 7200`,
// `refresh_token`, `scope`, `created_at`), and `GET /api/v4/user` with
// `Authorization: Bearer <access_token>` (https://docs.gitlab.com/api/oauth2/#access-gitlab-api-with-access-token).
// An OAuth token here is good for `GET /user` only (scope `read_user`); every other route
// answers 401 to it, so a test fails if planbot ever acts as the signed-in user.
// ---------------------------------------------------------------------------------------------

/// An application registered in the fake (Admin → Applications).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeOAuthApp {
    pub client_id: String,
    pub secret: String,
    pub redirect_uri: String,
    pub scopes: Vec<String>,
}

#[derive(Debug, Clone)]
struct OAuthGrant {
    client_id: String,
    user: u64,
    redirect_uri: String,
    challenge: String,
    scope: String,
}

#[derive(Debug, Default)]
struct OAuthState {
    apps: Vec<FakeOAuthApp>,
    /// `_gitlab_session` cookie value → user id (a browser signed in to GitLab).
    browser_sessions: HashMap<String, u64>,
    codes: HashMap<String, OAuthGrant>,
    /// access token → (user id, scope).
    tokens: HashMap<String, (u64, String)>,
    /// What `POST /oauth/token` refused, for tests to assert on.
    token_errors: Vec<String>,
}

impl FakeGitLab {
    /// Register an OAuth application with this redirect URI and scopes.
    pub fn register_oauth_app(&self, redirect_uri: &str, scopes: &[&str]) -> FakeOAuthApp {
        let mut s = self.lock();
        let id = s.id();
        let app = FakeOAuthApp {
            client_id: format!("fake-app-{id}-client-id"),
            secret: format!("gloas-fake-secret-{id}"),
            redirect_uri: redirect_uri.to_string(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
        };
        s.oauth.apps.push(app.clone());
        app
    }

    /// The `_gitlab_session` cookie value of a browser where `user` is signed in to GitLab.
    pub fn browser_session(&self, user: &FakeUser) -> String {
        let mut s = self.lock();
        let id = s.id();
        let cookie = format!("fake-gitlab-session-{id}");
        s.oauth.browser_sessions.insert(cookie.clone(), user.id);
        cookie
    }

    /// A URL that signs a real browser in to the fake GitLab as `user` (sets `_gitlab_session`,
    /// the stand-in for typing a password on `/users/sign_in`) and then sends it to `return_to`.
    pub fn browser_sign_in_url(&self, user: &FakeUser, return_to: &str) -> String {
        let session = self.browser_session(user);
        let q = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("return_to", return_to)
            .finish();
        format!("{}/-/fake/sign_in_as/{session}?{q}", self.url)
    }

    /// How many OAuth access tokens were issued.
    pub fn oauth_tokens_issued(&self) -> usize {
        self.lock().oauth.tokens.len()
    }

    /// Why `POST /oauth/token` refused requests, oldest first.
    pub fn oauth_token_errors(&self) -> Vec<String> {
        self.lock().oauth.token_errors.clone()
    }
}

fn oauth_error(code: StatusCode, error: &str, description: &str) -> Response {
    (
        code,
        Json(json!({ "error": error, "error_description": description })),
    )
        .into_response()
}

/// The user behind an OAuth access token (`Authorization: Bearer`), for `GET /user` only.
fn oauth_user(s: &StateInner, headers: &HeaderMap) -> Option<FakeUser> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))?;
    let (user, _scope) = s.oauth.tokens.get(token)?;
    s.users.get(user).cloned()
}

fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

#[derive(serde::Deserialize)]
struct AuthorizeQuery {
    client_id: Option<String>,
    redirect_uri: Option<String>,
    response_type: Option<String>,
    state: Option<String>,
    scope: Option<String>,
    code_challenge: Option<String>,
    code_challenge_method: Option<String>,
}

async fn oauth_authorize(
    State(state): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<AuthorizeQuery>,
) -> Response {
    let mut s = lock!(state);
    let Some(app) = s
        .oauth
        .apps
        .iter()
        .find(|a| Some(&a.client_id) == q.client_id.as_ref())
        .cloned()
    else {
        return err(
            StatusCode::UNAUTHORIZED,
            "Client authentication failed due to unknown client",
        );
    };
    // GitLab shows an error page (no redirect) for a redirect URI that is not registered.
    if q.redirect_uri.as_deref() != Some(app.redirect_uri.as_str()) {
        return err(
            StatusCode::BAD_REQUEST,
            "The redirect uri included is not valid.",
        );
    }
    let back = |params: &[(&str, &str)]| {
        let mut url = url::Url::parse(&app.redirect_uri).unwrap();
        url.query_pairs_mut().extend_pairs(params);
        if let Some(st) = &q.state {
            url.query_pairs_mut().append_pair("state", st);
        }
        Response::builder()
            .status(StatusCode::FOUND)
            .header("location", url.as_str())
            .body(Body::empty())
            .unwrap()
    };
    if q.response_type.as_deref() != Some("code") {
        return back(&[("error", "unsupported_response_type")]);
    }
    let scope = q.scope.clone().unwrap_or_default();
    if scope
        .split(' ')
        .any(|sc| !app.scopes.iter().any(|a| a == sc))
    {
        return back(&[("error", "invalid_scope")]);
    }
    let (Some(challenge), Some("S256")) =
        (q.code_challenge.clone(), q.code_challenge_method.as_deref())
    else {
        return back(&[("error", "invalid_request")]);
    };
    let Some(user) = cookie_value(&headers, "_gitlab_session")
        .and_then(|c| s.oauth.browser_sessions.get(&c).copied())
    else {
        // Not signed in to GitLab: its sign-in page (the tests' browsers are always signed in).
        return Response::builder()
            .status(StatusCode::FOUND)
            .header("location", format!("{}/users/sign_in", s.base_url))
            .body(Body::empty())
            .unwrap();
    };
    // The user already authorized this application: GitLab redirects at once.
    let id = s.id();
    let code = format!("fake-code-{id}");
    s.oauth.codes.insert(
        code.clone(),
        OAuthGrant {
            client_id: app.client_id.clone(),
            user,
            redirect_uri: app.redirect_uri.clone(),
            challenge,
            scope,
        },
    );
    drop(s);
    back(&[("code", &code)])
}

async fn oauth_token(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    use sha2::Digest;
    let form: HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
    let mut s = lock!(state);
    let refuse = |s: &mut StateInner, code: StatusCode, error: &str, why: &str| {
        s.oauth.token_errors.push(format!("{error}: {why}"));
        oauth_error(code, error, why)
    };
    // Client credentials: in the body (GitLab's docs) or as HTTP Basic.
    let basic = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|b| {
            b.split_once(':')
                .map(|(u, p)| (u.to_string(), p.to_string()))
        });
    let (client_id, secret) = match basic {
        Some(c) => c,
        None => (
            form.get("client_id").cloned().unwrap_or_default(),
            form.get("client_secret").cloned().unwrap_or_default(),
        ),
    };
    let Some(app) = s
        .oauth
        .apps
        .iter()
        .find(|a| a.client_id == client_id && a.secret == secret)
        .cloned()
    else {
        return refuse(
            &mut s,
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            "unknown client or wrong secret",
        );
    };
    if form.get("grant_type").map(String::as_str) != Some("authorization_code") {
        return refuse(
            &mut s,
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "only authorization_code",
        );
    }
    // A code is good once.
    let Some(grant) = form.get("code").and_then(|c| s.oauth.codes.remove(c)) else {
        return refuse(
            &mut s,
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "unknown or used code",
        );
    };
    if grant.client_id != app.client_id || form.get("redirect_uri") != Some(&grant.redirect_uri) {
        return refuse(
            &mut s,
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "code issued to another client or redirect URI",
        );
    }
    let verifier = form.get("code_verifier").cloned().unwrap_or_default();
    let computed = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(verifier.as_bytes()));
    if computed != grant.challenge {
        return refuse(
            &mut s,
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "PKCE verification failed",
        );
    }
    let id = s.id();
    let token = format!("fake-oauth-access-{id}");
    s.oauth
        .tokens
        .insert(token.clone(), (grant.user, grant.scope.clone()));
    Json(json!({
        "access_token": token,
        "token_type": "Bearer",
        "expires_in": 7200,
        "refresh_token": format!("fake-oauth-refresh-{id}"),
        "scope": grant.scope,
        "created_at": 1_764_680_000
    }))
    .into_response()
}

#[derive(serde::Deserialize)]
struct SignInAsQuery {
    return_to: String,
}

/// Test-only: a browser "signs in" to the fake GitLab with a session made by
/// [`FakeGitLab::browser_sign_in_url`].
async fn fake_sign_in_as(
    State(state): State<Shared>,
    Path(session): Path<String>,
    Query(q): Query<SignInAsQuery>,
) -> Response {
    if !lock!(state).oauth.browser_sessions.contains_key(&session) {
        return err(StatusCode::NOT_FOUND, "404 Not found");
    }
    Response::builder()
        .status(StatusCode::FOUND)
        .header(
            "set-cookie",
            format!("_gitlab_session={session}; Path=/; HttpOnly"),
        )
        .header("location", q.return_to)
        .body(Body::empty())
        .unwrap()
}
