//! A fake GitLab for tests: an in-process axum server on 127.0.0.1:0 that keeps state, speaks
//! GitLab's JSON shapes, serves REAL bare git repositories through `git http-backend`, and
//! implements the GitLab-managed Terraform state API (with locking).
//!
//! This file holds the world (users, projects, merge requests, the state they share), the
//! server and its router; each resource's helpers and routes live in their own file, as
//! GitLab's API pages split them: `users` (and groups, members), `projects` (branches, commits,
//! hooks), `merge_requests`, `notes`, `statuses`, `jobs`, `issues`, `webhooks` (the bodies
//! GitLab sends), `terraform_state`, `oauth` (sign-in), `git` (bare repositories and git over
//! HTTP) and `faults` (errors on demand, calls counted).
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
//! route; [`FakeGitLab::hold`] keeps the requests of one exact path waiting until the test
//! releases them (a slow GitLab on demand, and a marker saying a request is waiting). Routes are named `"METHOD /api/v4/path/{param}"` as registered below, e.g.
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
//!   `merge_commit_sha`/`squash_commit_sha` set as GitLab sets them, and `diff_refs` kept as
//!   the MR's last diff had them (after a fast-forward, `base_sha` is the target before it);
//!   rebase
//!   (<https://docs.gitlab.com/api/merge_requests/#rebase-a-merge-request>);
//! - approvals (<https://docs.gitlab.com/user/project/merge_requests/approvals/>, GitLab
//!   Free): a Developer or above approves an open MR (its author too), GitLab writes the system
//!   note "approved this merge request" by them and keeps the approval across pushes; `GET
//!   .../approvals` lists `approved_by[].user`; each push is a new diff version (`GET
//!   .../versions`, newest first, with its `created_at`);
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

use super::{gitlab_fixture, gitlab_reading};

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

mod faults;
mod git;
mod issues;
mod jobs;
mod merge_requests;
mod notes;
mod oauth;
mod projects;
mod statuses;
mod terraform_state;
mod users;
mod webhooks;

use faults::*;
use git::*;
use issues::*;
use jobs::*;
use merge_requests::*;
use notes::*;
use oauth::*;
use projects::*;
use statuses::*;
use terraform_state::*;
use users::*;

pub use git::GitRequest;
pub use issues::FakeIssue;
pub use jobs::FakeJob;
pub use notes::FakeNote;
pub use statuses::FakeStatus;
pub use terraform_state::StateRequest;

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
    /// `diff_refs.base_sha` frozen at the merge (GitLab keeps the MR's last diff; a live
    /// merge base would be the head itself after a fast-forward).
    merged_base: Option<String>,
    notes: Vec<FakeNote>,
    /// Who approves it now, in the order they approved.
    approved_by: Vec<u64>,
    /// Its diff versions, oldest first: one per head it had.
    versions: Vec<FVersion>,
}

/// A diff version of a merge request: GitLab makes one on each push to its source branch.
#[derive(Debug, Clone)]
struct FVersion {
    id: u64,
    head: String,
    base: Option<String>,
    /// Logical time (the fake's id counter), as notes have it.
    created: u64,
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
    /// Deploy freeze periods, as `GET /freeze_periods` lists them.
    freeze_periods: Vec<Value>,
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

#[derive(Debug)]
struct StateInner {
    base_url: String,
    git_root: PathBuf,
    next_id: u64,
    users: BTreeMap<u64, FakeUser>,
    projects: BTreeMap<u64, FProject>,
    jobs: HashMap<String, FakeJob>,
    /// When each job (by token) was created, unix ms: when it was registered, unless a test
    /// set it ([`FakeGitLab::set_job_created_ago`]).
    job_created: HashMap<String, i64>,
    faults: HashMap<String, Faults>,
    /// Requests held until released ([`FakeGitLab::hold`]), by method and path.
    holds: Vec<(String, Arc<HoldInner>)>,
    calls: HashMap<String, u32>,
    /// Merge refs are computed only by [`FakeGitLab::compute_merge_refs`], as GitLab's
    /// background mergeability check does.
    async_merge_refs: bool,
    git_requests: Vec<GitRequest>,
    tf_requests: Vec<StateRequest>,
    /// Reads of a managed state (by project id and name) that fail from its next write on
    /// ([`FakeGitLab::fail_state_reads_after_next_write`]).
    tf_read_faults: HashMap<(u64, String), terraform_state::ReadFault>,
    /// Groups by full path (`infra/admins`).
    groups: BTreeMap<String, FGroup>,
    /// Sign-in with GitLab (see `oauth`).
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
        for what in gitlab_reading::hazards(text) {
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

fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
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
            "/api/v4/projects/{id}/merge_requests/{iid}/approvals",
            get(get_approvals),
        )
        .route(
            "/api/v4/projects/{id}/merge_requests/{iid}/versions",
            get(list_versions),
        )
        .route(
            "/api/v4/projects/{id}/merge_requests/{iid}/notes",
            get(list_notes).post(create_note),
        )
        .route(
            "/api/v4/projects/{id}/merge_requests/{iid}/notes/{note_id}",
            axum::routing::put(edit_note).get(get_note),
        )
        .route(
            "/api/v4/projects/{id}/merge_requests/{iid}/notes/{note_id}/award_emoji",
            post(award_note_emoji),
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
            "/api/v4/projects/{id}/freeze_periods",
            get(list_freeze_periods),
        )
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
/// Merge request `iid` of a project `user` is a member of, with the project's id; 404 as
/// GitLab answers for a project or a merge request the user cannot see.
fn visible_mr<'a>(
    s: &'a StateInner,
    key: &str,
    user: &FakeUser,
    iid: u64,
) -> Result<(u64, &'a FMr), Response> {
    let pid = visible_project(s, key, user)?;
    match s.projects[&pid].mrs.get(&iid) {
        Some(mr) => Ok((pid, mr)),
        None => Err(err(StatusCode::NOT_FOUND, "404 Not found")),
    }
}

fn visible_project(s: &StateInner, key: &str, user: &FakeUser) -> Result<u64, Response> {
    match s.project_ref(key) {
        Some(pid) if s.projects[&pid].members.contains_key(&user.id) => Ok(pid),
        _ => Err(err(StatusCode::NOT_FOUND, "404 Project Not Found")),
    }
}

fn level(s: &StateInner, pid: u64, user: &FakeUser) -> u32 {
    s.projects[&pid].members.get(&user.id).copied().unwrap_or(0)
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
            job_created: HashMap::new(),
            faults: HashMap::new(),
            holds: Vec::new(),
            calls: HashMap::new(),
            async_merge_refs: false,
            git_requests: Vec::new(),
            tf_requests: Vec::new(),
            tf_read_faults: HashMap::new(),
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

    /// What GitLab would have acted on in the texts posted so far (quick actions, mass
    /// mentions, unclosed comments), taken off the record (see the Drop check).
    pub fn take_hazards(&self) -> Vec<Hazard> {
        std::mem::take(&mut self.lock().hazards)
    }
}
