//! GitLab REST client (`/api/v4`): MRs, notes, commit statuses, members, branches, job tokens, with retries.
//!
//! One concrete struct, [`GitLab`], with an injectable base URL (tests point it at the fake GitLab).
//! Every text it posts (note bodies, issue titles and descriptions, status descriptions) goes
//! through [`defuse`] first, here and nowhere else, so that no caller can post a quick action,
//! a mass mention or an unclosed HTML comment. Note bodies and issue descriptions are sent
//! without trailing whitespace, as GitLab stores them (its quick-action pass strips it), so
//! that the "never post twice" checks compare like with like.
//!
//! The bot token travels only in the `PRIVATE-TOKEN` header and is never part of an error or a log
//! line; a CI job token travels only in the `JOB-TOKEN` header of [`GitLab::job_for_token`].
//!
//! Retries: 429 (honouring `Retry-After`), 5xx, timeouts and connection errors are retried with
//! exponential backoff; every other 4xx is answered at once with a typed [`GitLabError`].
//!
//! The response types are tolerant: besides the identifying id, every field is optional or
//! defaulted (also when GitLab sends `null`), and unknown fields are ignored.

use crate::core::defuse::defuse;
use crate::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId, UserId};
use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use std::time::Duration;
use url::Url;

/// Errors a caller can branch on. None of them ever contains a token.
#[derive(Debug, thiserror::Error)]
pub enum GitLabError {
    /// 404: the project, MR, note, member... does not exist (or the bot cannot see it).
    #[error("GitLab answered 404 Not Found")]
    NotFound,
    /// 401: the token is invalid, expired or revoked (for a job token: the job is not running).
    #[error("GitLab answered 401 Unauthorized (token invalid, expired or revoked)")]
    Unauthorized,
    /// 403: the token is valid but lacks the role or scope for this call.
    #[error("GitLab answered 403 Forbidden (the token lacks the role or scope)")]
    Forbidden,
    /// Any other non-success status (after retries for 429/5xx), with GitLab's message.
    #[error("GitLab answered {code}: {message}")]
    Status { code: u16, message: String },
    /// No answer: connection refused, DNS, TLS, timeout (after retries).
    #[error("GitLab unreachable: {0}")]
    Transport(String),
    /// An answer that is not the JSON we expect.
    #[error("unexpected GitLab response: {0}")]
    Decode(String),
}

/// How often and how patiently to retry 429/5xx/timeouts/connection errors.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Total attempts, the first included (1 = no retry).
    pub max_attempts: u32,
    /// Delay before the first retry; doubled each time.
    pub base_delay: Duration,
    /// Upper bound for one delay, also for a `Retry-After` asked by GitLab.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(30),
        }
    }
}

/// The GitLab API client.
#[derive(Clone)]
pub struct GitLab {
    http: reqwest::Client,
    base: Url,
    api: Url,
    token: String,
    retry: RetryPolicy,
}

impl std::fmt::Debug for GitLab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitLab")
            .field("base", &self.base.as_str())
            .field("token", &"[REDACTED]")
            .finish()
    }
}

/// Which credential a request carries.
#[derive(Clone, Copy)]
enum Auth<'a> {
    Bot,
    Job(&'a str),
    /// HTTP Basic auth with this user name and the client's token (git over HTTP).
    Basic(&'a str),
    /// HTTP Basic auth with another credential (the state API with the apply's state token).
    Login(&'a crate::core::config::GitlabCredential),
}

/// One attempt of a call, classified.
enum Attempt {
    Done(StatusCode, HeaderMap, bytes::Bytes),
    /// Worth another attempt; `ambiguous`: GitLab may have carried the call out.
    Retry {
        error: GitLabError,
        ambiguous: bool,
        retry_after: Option<Duration>,
    },
    Fail(GitLabError),
}

// ---------------------------------------------------------------------------------------------
// Response and request types
// ---------------------------------------------------------------------------------------------

/// `null` and absent both become the type's default.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A GitLab user (`GET /user`, note authors, MR authors, job users).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub id: UserId,
    #[serde(default, deserialize_with = "null_default")]
    pub username: String,
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
}

/// A project (`GET /projects/:id`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Project {
    pub id: ProjectId,
    #[serde(default, deserialize_with = "null_default")]
    pub path_with_namespace: String,
    /// `None` for an empty repository.
    #[serde(default)]
    pub default_branch: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub http_url_to_repo: String,
    #[serde(default, deserialize_with = "null_default")]
    pub web_url: String,
}

/// A merge request (`GET /projects/:id/merge_requests/:iid` and lists).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeRequest {
    pub iid: MrIid,
    #[serde(default)]
    pub project_id: Option<ProjectId>,
    #[serde(default, deserialize_with = "null_default")]
    pub title: String,
    /// `opened`, `closed`, `locked`, `merged`.
    #[serde(default, deserialize_with = "null_default")]
    pub state: String,
    /// The head commit.
    #[serde(default)]
    pub sha: Option<CommitSha>,
    #[serde(default)]
    pub source_project_id: Option<ProjectId>,
    #[serde(default)]
    pub target_project_id: Option<ProjectId>,
    #[serde(default, deserialize_with = "null_default")]
    pub source_branch: String,
    #[serde(default, deserialize_with = "null_default")]
    pub target_branch: String,
    #[serde(default, deserialize_with = "null_default")]
    pub draft: bool,
    #[serde(default, deserialize_with = "null_default")]
    pub web_url: String,
    #[serde(default)]
    pub author: Option<User>,
    #[serde(default)]
    pub merge_commit_sha: Option<CommitSha>,
    #[serde(default)]
    pub squash_commit_sha: Option<CommitSha>,
    #[serde(default)]
    pub merged_by: Option<User>,
    /// The commits of the MR's diff (only in `GET /merge_requests/:iid`, not in lists).
    #[serde(default)]
    pub diff_refs: Option<DiffRefs>,
}

/// `diff_refs` of a merge request: `base_sha` is where its diff starts on the target branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffRefs {
    #[serde(default)]
    pub base_sha: Option<CommitSha>,
    #[serde(default)]
    pub head_sha: Option<CommitSha>,
    #[serde(default)]
    pub start_sha: Option<CommitSha>,
}

impl MergeRequest {
    /// The source lives in another project: its code is untrusted.
    pub fn is_fork(&self) -> bool {
        match (self.source_project_id, self.target_project_id) {
            (Some(s), Some(t)) => s != t,
            _ => false,
        }
    }

    /// The commit that landed on the target branch when merged: the merge commit, else the
    /// squash commit, else (fast-forward) the head.
    pub fn landed_sha(&self) -> Option<&CommitSha> {
        self.merge_commit_sha
            .as_ref()
            .or(self.squash_commit_sha.as_ref())
            .or(self.sha.as_ref())
    }
}

/// A note (comment) on an MR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    pub id: NoteId,
    #[serde(default, deserialize_with = "null_default")]
    pub body: String,
    #[serde(default)]
    pub author: Option<User>,
    /// System notes ("added 1 commit") are written by GitLab itself.
    #[serde(default, deserialize_with = "null_default")]
    pub system: bool,
    /// When the note was last edited (or written), on GitLab's clock.
    #[serde(default)]
    pub updated_at: Option<String>,
    /// When it was written, on GitLab's clock (a system note: when GitLab recorded the event).
    #[serde(default)]
    pub created_at: Option<String>,
}

/// One approver of a merge request (`approved_by[]` of `GET .../approvals`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovedBy {
    pub user: User,
}

/// `GET /projects/:id/merge_requests/:iid/approvals`: only who approves it now is read.
#[derive(Deserialize)]
struct Approvals {
    #[serde(default, deserialize_with = "null_default")]
    approved_by: Vec<ApprovedBy>,
}

/// A diff version of a merge request (`GET .../versions`): GitLab makes one on each push.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffVersion {
    pub id: u64,
    #[serde(default)]
    pub head_commit_sha: Option<CommitSha>,
    /// When it was made: when the push was.
    #[serde(default)]
    pub created_at: Option<String>,
}

/// The state of a commit status (`planbot/plan`, `planbot/apply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatusState {
    Pending,
    Running,
    Success,
    Failed,
    Canceled,
}

impl StatusState {
    pub fn as_str(self) -> &'static str {
        match self {
            StatusState::Pending => "pending",
            StatusState::Running => "running",
            StatusState::Success => "success",
            StatusState::Failed => "failed",
            StatusState::Canceled => "canceled",
        }
    }
}

/// What [`GitLab::set_commit_status`] posts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitStatus {
    pub state: StatusState,
    pub name: String,
    /// One line; cut to 255 characters before sending.
    pub description: Option<String>,
    pub target_url: Option<String>,
    pub ref_: Option<String>,
    pub pipeline_id: Option<u64>,
}

/// The longest description GitLab accepts.
pub const STATUS_DESCRIPTION_MAX: usize = 255;

/// A status as GitLab reports it (`POST /statuses/:sha` answer, `GET .../commits/:sha/statuses`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusRecord {
    pub id: u64,
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub sha: String,
    /// `pending`, `running`, `success`, `failed`, `canceled`, ...
    #[serde(default, deserialize_with = "null_default")]
    pub status: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub target_url: Option<String>,
    #[serde(rename = "ref", default)]
    pub ref_: Option<String>,
}

/// A project role (`access_level`): 10 Guest, 20 Reporter, 30 Developer, 40 Maintainer, 50 Owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AccessLevel(pub u32);

impl AccessLevel {
    pub const GUEST: AccessLevel = AccessLevel(10);
    pub const REPORTER: AccessLevel = AccessLevel(20);
    pub const DEVELOPER: AccessLevel = AccessLevel(30);
    pub const MAINTAINER: AccessLevel = AccessLevel(40);
    pub const OWNER: AccessLevel = AccessLevel(50);

    /// Developer or more: allowed to drive planbot by comment.
    pub fn is_developer_or_more(self) -> bool {
        self >= AccessLevel::DEVELOPER
    }
}

#[derive(Deserialize)]
struct Member {
    #[serde(default)]
    access_level: Option<AccessLevel>,
}

/// The commit a branch points at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchCommit {
    pub id: CommitSha,
}

/// A branch (`GET /projects/:id/repository/branches/:branch`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Branch {
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub protected: bool,
    #[serde(default, deserialize_with = "null_default")]
    pub default: bool,
    pub commit: BranchCommit,
}

/// The pipeline a job belongs to, as `GET /job` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPipeline {
    pub id: u64,
    pub project_id: ProjectId,
    pub sha: CommitSha,
    #[serde(rename = "ref", default, deserialize_with = "null_default")]
    pub ref_: String,
    #[serde(default, deserialize_with = "null_default")]
    pub status: String,
}

/// A CI job seen through its own job token (`GET /api/v4/job`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// `running` while the job runs (the only time its token is valid).
    #[serde(default, deserialize_with = "null_default")]
    pub status: String,
    #[serde(rename = "ref", default, deserialize_with = "null_default")]
    pub ref_: String,
    #[serde(default, deserialize_with = "null_default")]
    pub tag: bool,
    /// For a manual job: who clicked it.
    #[serde(default)]
    pub user: Option<User>,
    pub pipeline: JobPipeline,
    #[serde(default)]
    pub web_url: Option<String>,
    /// When GitLab created the job (with its pipeline, or at a retry), GitLab's ISO 8601 time.
    #[serde(default)]
    pub created_at: Option<String>,
}

/// An issue planbot opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Issue {
    pub id: u64,
    pub iid: u64,
    #[serde(default, deserialize_with = "null_default")]
    pub title: String,
    #[serde(default, deserialize_with = "null_default")]
    pub description: String,
    #[serde(default, deserialize_with = "null_default")]
    pub web_url: String,
    /// `opened` or `closed`.
    #[serde(default, deserialize_with = "null_default")]
    pub state: String,
    #[serde(default, deserialize_with = "null_default")]
    pub labels: Vec<String>,
    /// RFC 3339.
    #[serde(default, deserialize_with = "null_default")]
    pub created_at: String,
    /// Who opened it: planbot's own issues are those its bot user authored.
    #[serde(default)]
    pub author: Option<User>,
}

/// `state_event` of an issue edit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssueStateEvent {
    Close,
    Reopen,
}

impl IssueStateEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Close => "close",
            Self::Reopen => "reopen",
        }
    }
}

/// A project webhook as `GET /projects/:id/hooks` shows it (the secret token is never shown).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hook {
    pub id: u64,
    #[serde(default, deserialize_with = "null_default")]
    pub url: String,
    #[serde(default, deserialize_with = "null_default")]
    pub merge_requests_events: bool,
    #[serde(default, deserialize_with = "null_default")]
    pub note_events: bool,
    #[serde(default, deserialize_with = "null_default")]
    pub push_events: bool,
    #[serde(default, deserialize_with = "null_default")]
    pub enable_ssl_verification: bool,
    /// `executable`, `temporarily_disabled`, `disabled` (newer GitLab).
    #[serde(default)]
    pub alert_status: Option<String>,
    #[serde(default)]
    pub disabled_until: Option<String>,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// The lock of a GitLab-managed state: the GitLab user who took it and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateLock {
    pub username: String,
    pub locked_at: String,
}

/// A note body or issue description as it is sent: made inert ([`defuse`]), and without the
/// trailing whitespace GitLab would strip when it stores it.
pub fn outgoing(text: &str) -> std::borrow::Cow<'_, str> {
    match defuse(text) {
        std::borrow::Cow::Borrowed(t) => std::borrow::Cow::Borrowed(t.trim_end()),
        std::borrow::Cow::Owned(t) => std::borrow::Cow::Owned(t.trim_end().to_string()),
    }
}

/// Cut a status description to GitLab's limit, on a character boundary, marking the cut; made
/// inert ([`defuse`]) after the cut, which could leave a comment opener without its end.
pub fn truncate_description(text: &str) -> String {
    let lines = defuse(text);
    let one_line = defuse(lines.lines().next().unwrap_or("").trim()).into_owned();
    let mut keep = STATUS_DESCRIPTION_MAX;
    loop {
        if one_line.chars().count() <= keep {
            return defuse(&one_line).into_owned();
        }
        let mut out: String = one_line.chars().take(keep - 1).collect();
        out.push('…');
        let out = defuse(&out).into_owned();
        if out.chars().count() <= STATUS_DESCRIPTION_MAX {
            return out;
        }
        keep -= 1;
    }
}

/// Why a request got no answer, in the words an operator looks for first — `connection
/// refused`, `DNS lookup failed`, `TLS handshake failed`, `timed out` — then where and the
/// system's own words (`Connection refused (os error 111)`), not just "error sending request".
pub fn no_answer_cause(e: &reqwest::Error, url: &Url) -> String {
    use std::error::Error as _;
    let mut messages: Vec<String> = Vec::new();
    let mut io_kind = None;
    let mut tls = false;
    let mut source = e.source();
    while let Some(s) = source {
        // The innermost io::Error kind is the reason. A TLS failure reaches us as rustls' own error inside io::Errors (whose `source()`
        // skips what they wrap, so they are opened here).
        let mut wrapped: Option<&(dyn std::error::Error + 'static)> = Some(s);
        while let Some(w) = wrapped {
            tls |= w.is::<rustls::Error>();
            let io = w.downcast_ref::<std::io::Error>();
            if let Some(io) = io {
                io_kind = Some(io.kind());
            }
            wrapped = io
                .and_then(|io| io.get_ref())
                .map(|inner| inner as &(dyn std::error::Error + 'static));
        }
        messages.push(s.to_string());
        source = s.source();
    }
    let all = messages.join(": ").to_ascii_lowercase();
    let host = url.host_str().unwrap_or("?");
    let at = match url.port_or_known_default() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    };
    let cause = if e.is_timeout() {
        format!("timed out waiting for {at}")
    } else if all.contains("dns error") || all.contains("failed to lookup address") {
        format!("DNS lookup failed for {host}")
    } else if tls || all.contains("certificate") || all.contains("tls") {
        format!("TLS handshake with {at} failed")
    } else if io_kind == Some(std::io::ErrorKind::ConnectionRefused) {
        format!("connection refused by {at} (nothing listens there)")
    } else if matches!(
        io_kind,
        Some(std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted)
    ) {
        format!("connection to {at} reset")
    } else if e.is_connect() {
        format!("cannot connect to {at}")
    } else {
        format!("no answer from {at}")
    };
    // The innermost message is the system's own reason (the outer ones wrap it).
    match messages.last() {
        Some(detail) => format!("{cause}: {detail}"),
        None => cause,
    }
}

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

impl GitLab {
    /// A client for the GitLab at `base_url` (e.g. `https://gitlab.example.com`), acting as the
    /// bot whose personal/project access token is `token`.
    pub fn new(base_url: &str, token: &str) -> anyhow::Result<GitLab> {
        let mut base = Url::parse(base_url.trim())
            .map_err(|e| anyhow::anyhow!("GitLab URL {base_url:?} is not a URL: {e}"))?;
        if !matches!(base.scheme(), "http" | "https") {
            anyhow::bail!("GitLab URL {base_url:?} must start with http:// or https://");
        }
        if !base.username().is_empty() || base.password().is_some() {
            anyhow::bail!("GitLab URL must not contain credentials; give the token separately");
        }
        if !base.path().ends_with('/') {
            let p = format!("{}/", base.path());
            base.set_path(&p);
        }
        let api = base.join("api/v4/")?;
        if token.trim().is_empty() {
            anyhow::bail!("the GitLab token is empty");
        }
        HeaderValue::from_str(token).map_err(|_| {
            anyhow::anyhow!("the GitLab token contains characters not allowed in a header")
        })?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .user_agent(concat!("planbot/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(GitLab {
            http,
            base,
            api,
            token: token.to_string(),
            retry: RetryPolicy::default(),
        })
    }

    /// Replace the retry policy (tests use short delays).
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> GitLab {
        self.retry = retry;
        self
    }

    /// Replace the per-request timeout (default 60 s; connect timeout 10 s).
    pub fn with_timeout(mut self, timeout: Duration) -> anyhow::Result<GitLab> {
        self.http = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .timeout(timeout)
            .user_agent(concat!("planbot/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(self)
    }

    /// The instance's base URL, with a trailing slash.
    pub fn base_url(&self) -> &Url {
        &self.base
    }

    // ----- users, projects, members ------------------------------------------------------------

    /// The bot user (`GET /user`): its own notes are ignored by name.
    pub async fn current_user(&self) -> Result<User, GitLabError> {
        self.get_json(&["user"], &[]).await
    }

    /// `GET /projects/:id` by numeric id or `group/project` path.
    pub async fn project(&self, path_or_id: &str) -> Result<Project, GitLabError> {
        self.get_json(&["projects", path_or_id], &[]).await
    }

    /// The role `user` has on the project, inherited ones included; `None` if not a member.
    pub async fn member_access(
        &self,
        project: ProjectId,
        user: UserId,
    ) -> Result<Option<AccessLevel>, GitLabError> {
        let p = project.to_string();
        let u = user.to_string();
        match self
            .get_json::<Member>(&["projects", &p, "members", "all", &u], &[])
            .await
        {
            Ok(m) => Ok(m.access_level),
            Err(GitLabError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `GET /users/:id`: who wrote a note (a webhook names the author by id).
    pub async fn user(&self, user: UserId) -> Result<User, GitLabError> {
        self.get_json(&["users", &user.to_string()], &[]).await
    }

    /// Whether `user` is a member of the group at `group_path` (`infra/admins`), inherited
    /// memberships included (`GET /groups/:id/members/all/:user_id`). GitLab answers 404 both
    /// for a non-member and for a group the bot cannot see: either way, not a member.
    pub async fn group_member(&self, group_path: &str, user: UserId) -> Result<bool, GitLabError> {
        let u = user.to_string();
        match self
            .get_json::<Member>(&["groups", group_path, "members", "all", &u], &[])
            .await
        {
            Ok(_) => Ok(true),
            Err(GitLabError::NotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    // ----- merge requests ----------------------------------------------------------------------

    pub async fn merge_request(
        &self,
        project: ProjectId,
        iid: MrIid,
    ) -> Result<MergeRequest, GitLabError> {
        let p = project.to_string();
        let i = iid.to_string();
        self.get_json(&["projects", &p, "merge_requests", &i], &[])
            .await
    }

    /// Every open MR of the project (all pages), for reconciling after downtime.
    pub async fn open_merge_requests(
        &self,
        project: ProjectId,
    ) -> Result<Vec<MergeRequest>, GitLabError> {
        let p = project.to_string();
        self.get_all(&["projects", &p, "merge_requests"], &[("state", "opened")])
            .await
    }

    /// The MRs that contain commit `sha` (for a merge commit: the MR merged as it).
    pub async fn commit_merge_requests(
        &self,
        project: ProjectId,
        sha: &CommitSha,
    ) -> Result<Vec<MergeRequest>, GitLabError> {
        let p = project.to_string();
        self.get_all(
            &[
                "projects",
                &p,
                "repository",
                "commits",
                sha.as_str(),
                "merge_requests",
            ],
            &[],
        )
        .await
    }

    // ----- notes -------------------------------------------------------------------------------

    /// All notes of an MR, oldest first (every page).
    pub async fn mr_notes(&self, project: ProjectId, iid: MrIid) -> Result<Vec<Note>, GitLabError> {
        let p = project.to_string();
        let i = iid.to_string();
        self.get_all(
            &["projects", &p, "merge_requests", &i, "notes"],
            &[("sort", "asc"), ("order_by", "created_at")],
        )
        .await
    }

    /// The MR's notes, newest first, a page of 100 at a time until `enough` says the notes read
    /// so far suffice or `max_pages` pages were read: a bounded read of a long discussion.
    /// Also says whether every note was read.
    pub async fn newest_mr_notes(
        &self,
        project: ProjectId,
        iid: MrIid,
        max_pages: u32,
        enough: impl Fn(&[Note]) -> bool,
    ) -> Result<(Vec<Note>, bool), GitLabError> {
        let p = project.to_string();
        let i = iid.to_string();
        self.get_pages(
            &["projects", &p, "merge_requests", &i, "notes"],
            &[("sort", "desc"), ("order_by", "created_at")],
            max_pages,
            enough,
        )
        .await
    }

    /// Who approves the MR now (`GET .../approvals`, `approved_by[].user`; GitLab Free keeps
    /// an approval across pushes). Anyone who may read the MR may read them.
    pub async fn mr_approvers(
        &self,
        project: ProjectId,
        iid: MrIid,
    ) -> Result<Vec<User>, GitLabError> {
        let p = project.to_string();
        let i = iid.to_string();
        let approvals: Approvals = self
            .get_json(&["projects", &p, "merge_requests", &i, "approvals"], &[])
            .await?;
        Ok(approvals.approved_by.into_iter().map(|a| a.user).collect())
    }

    /// The MR's newest diff versions (`GET .../versions`, newest first): one page of at most
    /// 100, which holds the newest, its last push.
    pub async fn mr_diff_versions(
        &self,
        project: ProjectId,
        iid: MrIid,
    ) -> Result<Vec<DiffVersion>, GitLabError> {
        let p = project.to_string();
        let i = iid.to_string();
        self.get_json(
            &["projects", &p, "merge_requests", &i, "versions"],
            &[("per_page", "100"), ("page", "1")],
        )
        .await
    }

    /// Post a note — once: when an attempt fails in a way that leaves open whether GitLab
    /// stored it (a 5xx, a timeout), the bot's notes newer than the MR's newest note before
    /// the post are looked at first, and an identical one is taken as this post.
    pub async fn create_mr_note(
        &self,
        project: ProjectId,
        iid: MrIid,
        body: &str,
    ) -> Result<Note, GitLabError> {
        let body = outgoing(body);
        let body = &*body;
        let p = project.to_string();
        let i = iid.to_string();
        let payload = serde_json::json!({ "body": body });
        let newest = |notes: Vec<Note>| notes.first().map_or(0, |n| n.id.0);
        let before: Option<u64> = self
            .get_json(
                &["projects", &p, "merge_requests", &i, "notes"],
                &[
                    ("sort", "desc"),
                    ("order_by", "created_at"),
                    ("per_page", "1"),
                ],
            )
            .await
            .map(newest)
            .ok();
        let stored = || async {
            let Some(before) = before else {
                return Ok(None);
            };
            let me = self.current_user().await?.id;
            let notes = self.mr_notes(project, iid).await?;
            Ok(notes.into_iter().find(|n| {
                n.id.0 > before
                    && !n.system
                    && n.author.as_ref().is_some_and(|a| a.id == me)
                    && n.body == body
            }))
        };
        let note: Note = self
            .create_once(
                &["projects", &p, "merge_requests", &i, "notes"],
                &payload,
                stored,
            )
            .await?;
        tracing::info!(
            project = project.0,
            mr = iid.0,
            note = note.id.0,
            "note posted"
        );
        Ok(note)
    }

    /// Edit a note in place; [`GitLabError::NotFound`] when it was deleted (re-create it then).
    pub async fn edit_mr_note(
        &self,
        project: ProjectId,
        iid: MrIid,
        note: NoteId,
        body: &str,
    ) -> Result<Note, GitLabError> {
        let p = project.to_string();
        let i = iid.to_string();
        let n = note.to_string();
        let payload = serde_json::json!({ "body": outgoing(body) });
        let edited: Note = self
            .send_json(
                Method::PUT,
                &["projects", &p, "merge_requests", &i, "notes", &n],
                &payload,
            )
            .await?;
        tracing::info!(
            project = project.0,
            mr = iid.0,
            note = note.0,
            "note edited"
        );
        Ok(edited)
    }

    /// Award the emoji `name` (GitLab's name, without colons: `eyes`) on a note of an MR, as the
    /// bot (`POST …/notes/:note_id/award_emoji`). GitLab answers 404 both when the bot awarded
    /// it already (a retried post) and when the note is gone: either way there is nothing more
    /// to do, so both are `Ok(false)`.
    pub async fn award_note_emoji(
        &self,
        project: ProjectId,
        iid: MrIid,
        note: NoteId,
        name: &str,
    ) -> Result<bool, GitLabError> {
        let p = project.to_string();
        let i = iid.to_string();
        let n = note.to_string();
        let payload = serde_json::json!({ "name": name });
        let segments = [
            "projects",
            &p,
            "merge_requests",
            &i,
            "notes",
            &n,
            "award_emoji",
        ];
        match self
            .send_json::<serde_json::Value>(Method::POST, &segments, &payload)
            .await
        {
            Ok(_) => Ok(true),
            Err(GitLabError::NotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    // ----- commit statuses ---------------------------------------------------------------------

    /// Post a commit status. A 400 "Cannot transition status" (the status is already in that
    /// final state, or final) counts as done.
    pub async fn set_commit_status(
        &self,
        project: ProjectId,
        sha: &CommitSha,
        status: &CommitStatus,
    ) -> Result<(), GitLabError> {
        let p = project.to_string();
        let mut payload = serde_json::json!({
            "state": status.state.as_str(),
            "name": status.name,
        });
        let obj = payload.as_object_mut().expect("object");
        if let Some(d) = &status.description {
            obj.insert("description".into(), truncate_description(d).into());
        }
        if let Some(u) = &status.target_url {
            obj.insert("target_url".into(), u.clone().into());
        }
        if let Some(r) = &status.ref_ {
            obj.insert("ref".into(), r.clone().into());
        }
        if let Some(id) = status.pipeline_id {
            obj.insert("pipeline_id".into(), id.into());
        }
        match self
            .send_json::<serde_json::Value>(
                Method::POST,
                &["projects", &p, "statuses", sha.as_str()],
                &payload,
            )
            .await
        {
            Ok(_) => {
                tracing::info!(project = project.0, sha = sha.short(), name = %status.name, state = status.state.as_str(), "commit status set");
                Ok(())
            }
            Err(GitLabError::Status { code: 400, message })
                if message.contains("Cannot transition status") =>
            {
                tracing::debug!(sha = %sha, name = %status.name, "commit status already final; treated as done");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The statuses posted on a commit (all names).
    pub async fn commit_statuses(
        &self,
        project: ProjectId,
        sha: &CommitSha,
    ) -> Result<Vec<StatusRecord>, GitLabError> {
        let p = project.to_string();
        self.get_all(
            &[
                "projects",
                &p,
                "repository",
                "commits",
                sha.as_str(),
                "statuses",
            ],
            &[],
        )
        .await
    }

    // ----- branches ----------------------------------------------------------------------------

    pub async fn branch(&self, project: ProjectId, name: &str) -> Result<Branch, GitLabError> {
        let p = project.to_string();
        self.get_json(&["projects", &p, "repository", "branches", name], &[])
            .await
    }

    // ----- jobs, issues, hooks -----------------------------------------------------------------

    /// The job that owns `job_token` (`GET /job` with `JOB-TOKEN`, not the bot token).
    /// [`GitLabError::Unauthorized`] when the token is invalid or the job no longer runs.
    pub async fn job_for_token(&self, job_token: &str) -> Result<Job, GitLabError> {
        if job_token.is_empty() || HeaderValue::from_str(job_token).is_err() {
            return Err(GitLabError::Unauthorized);
        }
        let url = self.url(&["job"], &[]);
        let (_, _, body) = self
            .request(Method::GET, url, Auth::Job(job_token), None)
            .await?;
        decode(&body)
    }

    pub async fn create_issue(
        &self,
        project: ProjectId,
        title: &str,
        description: &str,
    ) -> Result<Issue, GitLabError> {
        self.create_labelled_issue(project, title, description, &[])
            .await
    }

    /// Open an issue with `labels` (GitLab creates a label it does not know yet).
    pub async fn create_labelled_issue(
        &self,
        project: ProjectId,
        title: &str,
        description: &str,
        labels: &[String],
    ) -> Result<Issue, GitLabError> {
        let (title, description) = (defuse(title), outgoing(description));
        let (title, description) = (&*title, &*description);
        let p = project.to_string();
        let mut payload = serde_json::json!({ "title": title, "description": description });
        if !labels.is_empty() {
            payload["labels"] = labels.join(",").into();
        }
        // After an ambiguous failure: an identical issue by the bot newer than the project's
        // newest issue before the post.
        let newest = |issues: &[Issue]| issues.first().map_or(0, |i| i.id);
        let before: Option<u64> = self
            .get_json::<Vec<Issue>>(
                &["projects", &p, "issues"],
                &[
                    ("order_by", "created_at"),
                    ("sort", "desc"),
                    ("per_page", "1"),
                ],
            )
            .await
            .map(|i| newest(&i))
            .ok();
        let stored = || async {
            let Some(before) = before else {
                return Ok(None);
            };
            let me = self.current_user().await?.id.to_string();
            let mine: Vec<Issue> = self
                .get_json(
                    &["projects", &p, "issues"],
                    &[
                        ("author_id", &me),
                        ("order_by", "created_at"),
                        ("sort", "desc"),
                        ("per_page", "20"),
                    ],
                )
                .await?;
            Ok(mine
                .into_iter()
                .find(|i| i.id > before && i.title == title && i.description == description))
        };
        self.create_once(&["projects", &p, "issues"], &payload, stored)
            .await
    }

    /// The project's issues carrying `label`, open and closed, newest first (the first 100: a
    /// label planbot owns holds one issue per root).
    pub async fn issues_labelled(
        &self,
        project: ProjectId,
        label: &str,
    ) -> Result<Vec<Issue>, GitLabError> {
        let p = project.to_string();
        self.get_json(
            &["projects", &p, "issues"],
            &[("labels", label), ("state", "all"), ("per_page", "100")],
        )
        .await
    }

    /// Replace an issue's description, and close or reopen it with `state_event`.
    pub async fn edit_issue(
        &self,
        project: ProjectId,
        iid: u64,
        description: &str,
        state_event: Option<IssueStateEvent>,
    ) -> Result<Issue, GitLabError> {
        let p = project.to_string();
        let i = iid.to_string();
        let mut payload = serde_json::json!({ "description": outgoing(description) });
        if let Some(event) = state_event {
            payload["state_event"] = event.as_str().into();
        }
        self.send_json(Method::PUT, &["projects", &p, "issues", &i], &payload)
            .await
    }

    /// The newest `count` (at most 100) comments on an issue, newest first.
    pub async fn newest_issue_notes(
        &self,
        project: ProjectId,
        iid: u64,
        count: u8,
    ) -> Result<Vec<Note>, GitLabError> {
        let p = project.to_string();
        let i = iid.to_string();
        let per_page = count.clamp(1, 100).to_string();
        self.get_json(
            &["projects", &p, "issues", &i, "notes"],
            &[
                ("sort", "desc"),
                ("order_by", "created_at"),
                ("per_page", per_page.as_str()),
            ],
        )
        .await
    }

    /// Comment on an issue.
    pub async fn create_issue_note(
        &self,
        project: ProjectId,
        iid: u64,
        body: &str,
    ) -> Result<Note, GitLabError> {
        let p = project.to_string();
        let i = iid.to_string();
        let body = outgoing(body);
        let body = &*body;
        let payload = serde_json::json!({ "body": body });
        // After an ambiguous failure: a note by the bot with this body, newer than the issue's
        // newest note before the post.
        let before: Option<u64> = self
            .newest_issue_notes(project, iid, 1)
            .await
            .map(|notes| notes.first().map_or(0, |n| n.id.0))
            .ok();
        let stored = || async {
            let Some(before) = before else {
                return Ok(None);
            };
            let me = self.current_user().await?.id;
            let notes = self.newest_issue_notes(project, iid, 20).await?;
            Ok(notes.into_iter().find(|n| {
                n.id.0 > before && n.author.as_ref().is_some_and(|a| a.id == me) && n.body == body
            }))
        };
        self.create_once(&["projects", &p, "issues", &i, "notes"], &payload, stored)
            .await
    }

    /// Who holds the lock of the GitLab-managed state `name` of `project_path`, and since when
    /// (`None`: not locked, or no such state the bot can see). GitLab's REST API has no read of
    /// a lock, its GraphQL API does (`Project.terraformState`: `lockedByUser`, `lockedAt`).
    pub async fn terraform_state_lock(
        &self,
        project_path: &str,
        name: &str,
    ) -> Result<Option<StateLock>, GitLabError> {
        let answer = self
            .terraform_state_query(project_path, name, "lockedAt lockedByUser { username }")
            .await?;
        let state = answer.pointer("/data/project/terraformState");
        let locked_at = state
            .and_then(|s| s.get("lockedAt"))
            .and_then(|v| v.as_str());
        let who = state
            .and_then(|s| s.pointer("/lockedByUser/username"))
            .and_then(|v| v.as_str());
        Ok(match (locked_at, who) {
            (Some(since), Some(who)) => Some(StateLock {
                username: who.to_string(),
                locked_at: since.to_string(),
            }),
            _ => None,
        })
    }

    /// The serial of the latest version of the GitLab-managed state `name` of `project_path`
    /// (`None`: no such state the bot can see), read without the state itself: GraphQL's
    /// `Project.terraformState.latestVersion.serial`. Every write of the state (an apply, a
    /// drift fix, an import) makes a new version.
    pub async fn terraform_state_serial(
        &self,
        project_path: &str,
        name: &str,
    ) -> Result<Option<u64>, GitLabError> {
        let answer = self
            .terraform_state_query(project_path, name, "latestVersion { serial }")
            .await?;
        if answer.get("errors").is_some() {
            return Err(GitLabError::Decode("GraphQL answered with errors".into()));
        }
        Ok(answer
            .pointer("/data/project/terraformState/latestVersion/serial")
            .and_then(serde_json::Value::as_u64))
    }

    /// GraphQL's `Project.terraformState(name)` of `project_path` with `fields`, as the bot: the
    /// whole answer (REST has no read of a state's lock or version without the state).
    async fn terraform_state_query(
        &self,
        project_path: &str,
        name: &str,
        fields: &str,
    ) -> Result<serde_json::Value, GitLabError> {
        let query = format!(
            "query($path: ID!, $name: String!) {{ project(fullPath: $path) {{ terraformState(name: $name) {{ {fields} }} }} }}"
        );
        let url = self
            .base
            .join("api/graphql")
            .map_err(|e| GitLabError::Decode(e.to_string()))?;
        let payload = serde_json::json!({
            "query": query,
            "variables": { "path": project_path, "name": name },
        });
        let (_, _, body) = self
            .request(Method::POST, url, Auth::Bot, Some(&payload))
            .await?;
        decode(&body)
    }

    /// Delete the project's GitLab-managed state `name` with `credential` (the Maintainer role
    /// GitLab asks for; `DELETE /projects/:id/terraform/state/:name`). A state already gone is
    /// not an error: it is what was asked for.
    pub async fn delete_terraform_state(
        &self,
        project: ProjectId,
        name: &str,
        credential: &crate::core::config::GitlabCredential,
    ) -> Result<(), GitLabError> {
        let p = project.to_string();
        let url = self.url(&["projects", &p, "terraform", "state", name], &[]);
        match self
            .request(Method::DELETE, url, Auth::Login(credential), None)
            .await
        {
            Ok(_) | Err(GitLabError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether the token may read the project's GitLab-managed state (the Developer role):
    /// `GET` of a state name no one uses answers 404 to a reader, 403 to anyone else. Read only.
    pub async fn terraform_state_readable(&self, project: ProjectId) -> Result<(), GitLabError> {
        let p = project.to_string();
        let url = self.url(
            &["projects", &p, "terraform", "state", "planbot-doctor-probe"],
            &[],
        );
        match self.request(Method::GET, url, Auth::Bot, None).await {
            Ok(_) | Err(GitLabError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether git may fetch the repository `project_path` with this token as `username`
    /// (what `init` does for a module): `GET <project>.git/info/refs?service=git-upload-pack`.
    pub async fn repository_readable(
        &self,
        project_path: &str,
        username: &str,
    ) -> Result<(), GitLabError> {
        let mut url = self
            .base
            .join(&format!("{}.git/info/refs", project_path.trim_matches('/')))
            .map_err(|e| GitLabError::Decode(e.to_string()))?;
        url.set_query(Some("service=git-upload-pack"));
        self.request(Method::GET, url, Auth::Basic(username), None)
            .await
            .map(|_| ())
    }

    /// The project's deploy freeze periods (Reporter or more may read them).
    pub async fn freeze_periods(
        &self,
        project: ProjectId,
    ) -> Result<Vec<crate::core::freeze::FreezePeriod>, GitLabError> {
        let p = project.to_string();
        self.get_all(&["projects", &p, "freeze_periods"], &[]).await
    }

    /// The project's webhooks (needs Maintainer; [`GitLabError::Forbidden`] otherwise).
    pub async fn project_hooks(&self, project: ProjectId) -> Result<Vec<Hook>, GitLabError> {
        let p = project.to_string();
        self.get_all(&["projects", &p, "hooks"], &[]).await
    }

    // ----- plumbing ----------------------------------------------------------------------------

    fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
        let mut url = self.api.clone();
        {
            let mut segs = url.path_segments_mut().expect("http URL has segments");
            segs.pop_if_empty();
            for s in segments {
                segs.push(s);
            }
        }
        if !query.is_empty() {
            let mut q = url.query_pairs_mut();
            for (k, v) in query {
                q.append_pair(k, v);
            }
        }
        url
    }

    async fn get_json<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<T, GitLabError> {
        let url = self.url(segments, query);
        let (_, _, body) = self.request(Method::GET, url, Auth::Bot, None).await?;
        decode(&body)
    }

    async fn send_json<T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        payload: &serde_json::Value,
    ) -> Result<T, GitLabError> {
        let url = self.url(segments, &[]);
        let (_, _, body) = self.request(method, url, Auth::Bot, Some(payload)).await?;
        decode(&body)
    }

    /// Every page of a list endpoint (`per_page=100`, following `x-next-page`), with a hard
    /// stop so a misbehaving server cannot keep planbot paging forever.
    async fn get_all<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<Vec<T>, GitLabError> {
        const MAX_PAGES: u32 = 10_000;
        match self
            .get_pages(segments, query, MAX_PAGES, |_| false)
            .await?
        {
            (all, true) => Ok(all),
            (_, false) => Err(GitLabError::Decode(format!(
                "pagination did not end after {MAX_PAGES} pages"
            ))),
        }
    }

    /// The first pages of a list endpoint (`per_page=100`, following `x-next-page`), until
    /// `enough` says what was read suffices or `max_pages` were read; and whether the list
    /// ended (everything was read).
    async fn get_pages<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
        max_pages: u32,
        enough: impl Fn(&[T]) -> bool,
    ) -> Result<(Vec<T>, bool), GitLabError> {
        let mut out = Vec::new();
        let mut page = "1".to_string();
        for _ in 0..max_pages {
            let mut q: Vec<(&str, &str)> = query.to_vec();
            q.push(("per_page", "100"));
            q.push(("page", &page));
            let url = self.url(segments, &q);
            let (_, headers, body) = self.request(Method::GET, url, Auth::Bot, None).await?;
            let items: Vec<T> = decode(&body)?;
            out.extend(items);
            let next = headers
                .get("x-next-page")
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .unwrap_or("");
            if next.is_empty() || next == page {
                return Ok((out, true));
            }
            if enough(&out) {
                return Ok((out, false));
            }
            page = next.to_string();
        }
        Ok((out, false))
    }

    /// A POST that creates something (a note, an issue), retried like any call but never
    /// creating it twice: after a failure that leaves open whether GitLab did the work (a 5xx,
    /// a timeout, a connection lost after sending), `stored` looks for it before the next
    /// attempt, and what it finds is the answer.
    async fn create_once<T, F, Fut>(
        &self,
        segments: &[&str],
        payload: &serde_json::Value,
        stored: F,
    ) -> Result<T, GitLabError>
    where
        T: DeserializeOwned,
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>, GitLabError>>,
    {
        let url = self.url(segments, &[]);
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let last = attempt >= self.retry.max_attempts;
            match self
                .attempt(&Method::POST, &url, Auth::Bot, Some(payload))
                .await
            {
                Attempt::Done(_, _, body) => return decode(&body),
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry {
                    error,
                    ambiguous,
                    retry_after,
                } => {
                    if ambiguous {
                        if let Some(found) = stored().await? {
                            tracing::warn!(path = %url.path(), attempt, "gitlab: the failed POST had been stored; not posting again");
                            return Ok(found);
                        }
                    }
                    if last {
                        return Err(error);
                    }
                    let delay = self.delay(attempt, retry_after);
                    tracing::warn!(path = %url.path(), attempt, delay_ms = delay.as_millis() as u64, error = %error, "gitlab: retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// One call with retries; returns the success answer's status, headers and body.
    async fn request(
        &self,
        method: Method,
        url: Url,
        auth: Auth<'_>,
        payload: Option<&serde_json::Value>,
    ) -> Result<(StatusCode, HeaderMap, bytes::Bytes), GitLabError> {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let last = attempt >= self.retry.max_attempts;
            match self.attempt(&method, &url, auth, payload).await {
                Attempt::Done(status, headers, body) => return Ok((status, headers, body)),
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry {
                    error, retry_after, ..
                } => {
                    if last {
                        return Err(error);
                    }
                    let delay = self.delay(attempt, retry_after);
                    tracing::warn!(method = %method, path = %url.path(), attempt, delay_ms = delay.as_millis() as u64, error = %error, "gitlab: retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// One attempt of a call, classified: done, worth retrying (and whether GitLab may have
    /// carried it out), or failed for good.
    async fn attempt(
        &self,
        method: &Method,
        url: &Url,
        auth: Auth<'_>,
        payload: Option<&serde_json::Value>,
    ) -> Attempt {
        let path = url.path();
        let mut req = self.http.request(method.clone(), url.clone());
        req = match auth {
            Auth::Bot => req.header("PRIVATE-TOKEN", &self.token),
            Auth::Job(t) => req.header("JOB-TOKEN", t),
            Auth::Basic(user) => req.basic_auth(user, Some(&self.token)),
            Auth::Login(c) => req.basic_auth(&c.username, Some(c.token.expose())),
        };
        if let Some(p) = payload {
            req = req.json(p);
        }
        let outcome = match req.send().await {
            Ok(resp) => {
                let status = resp.status();
                let headers = resp.headers().clone();
                match resp.bytes().await {
                    Ok(body) => Ok((status, headers, body)),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok((status, headers, body)) if status.is_success() => {
                tracing::debug!(method = %method, path = %path, status = status.as_u16(), "gitlab");
                Attempt::Done(status, headers, body)
            }
            Ok((status, headers, body)) => {
                tracing::debug!(method = %method, path = %path, status = status.as_u16(), "gitlab: error");
                let error = self.status_error(status, &body);
                if status == StatusCode::TOO_MANY_REQUESTS {
                    // Rejected before any work.
                    Attempt::Retry {
                        error,
                        ambiguous: false,
                        retry_after: retry_after(&headers),
                    }
                } else if status.is_server_error() {
                    // A 500 mid-way, or a proxy's 502/504 after GitLab did the work.
                    Attempt::Retry {
                        error,
                        ambiguous: true,
                        retry_after: retry_after(&headers),
                    }
                } else {
                    Attempt::Fail(error)
                }
            }
            Err(e) => {
                let (connect, maybe_sent) = (
                    e.is_connect(),
                    e.is_timeout() || e.is_request() || e.is_body(),
                );
                let text = self.scrub(&no_answer_cause(&e, url));
                let error = GitLabError::Transport(format!("{method} {path}: {text}"));
                if connect {
                    // Never reached GitLab.
                    Attempt::Retry {
                        error,
                        ambiguous: false,
                        retry_after: None,
                    }
                } else if maybe_sent {
                    Attempt::Retry {
                        error,
                        ambiguous: true,
                        retry_after: None,
                    }
                } else {
                    Attempt::Fail(error)
                }
            }
        }
    }

    fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(d) = retry_after {
            return d.min(self.retry.max_delay);
        }
        let exp = self
            .retry
            .base_delay
            .saturating_mul(1u32 << (attempt - 1).min(16));
        // Up to 25 % jitter so many workers do not retry in lockstep.
        let jitter = exp.mul_f64(rand::random::<f64>() * 0.25);
        (exp + jitter).min(self.retry.max_delay)
    }

    fn status_error(&self, status: StatusCode, body: &[u8]) -> GitLabError {
        match status {
            StatusCode::NOT_FOUND => GitLabError::NotFound,
            StatusCode::UNAUTHORIZED => GitLabError::Unauthorized,
            StatusCode::FORBIDDEN => GitLabError::Forbidden,
            _ => GitLabError::Status {
                code: status.as_u16(),
                message: self.scrub(&error_message(body)),
            },
        }
    }

    /// The bot token never appears in an error, even if a server echoed it.
    fn scrub(&self, text: &str) -> String {
        if self.token.is_empty() {
            text.to_string()
        } else {
            text.replace(&self.token, "[REDACTED]")
        }
    }
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    v.parse::<u64>().ok().map(Duration::from_secs)
}

/// GitLab's error text (`{"message": ...}` or `{"error": ...}`), else the start of the body.
fn error_message(body: &[u8]) -> String {
    let text = if let Ok(e) = serde_json::from_slice::<ErrorBody>(body) {
        match e.message.or(e.error) {
            Some(serde_json::Value::String(s)) => s,
            Some(other) => other.to_string(),
            None => String::from_utf8_lossy(body).into_owned(),
        }
    } else {
        String::from_utf8_lossy(body).into_owned()
    };
    let text = text.trim();
    if text.chars().count() > 300 {
        let mut s: String = text.chars().take(300).collect();
        s.push('…');
        s
    } else {
        text.to_string()
    }
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, GitLabError> {
    serde_json::from_slice(body).map_err(|e| GitLabError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(rel: &str) -> String {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/gitlab")
            .join(rel);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
    }

    #[test]
    fn branch_fixture_parses_protected_default_and_commit() {
        let b: Branch = serde_json::from_str(&fixture("api/branch_single.json")).unwrap();
        assert_eq!(b.name, "main");
        assert!(b.protected);
        assert!(b.default);
        assert_eq!(
            b.commit.id.as_str(),
            "7b5c3cc8be40ee161ae89a06bba6229da1032a0c"
        );
    }

    #[test]
    fn job_token_fixture_parses_the_fields_the_apply_checks_use() {
        let j: Job = serde_json::from_str(&fixture("api/get_job_via_job_token.json")).unwrap();
        assert_eq!(j.id, JobId(8));
        assert_eq!(j.name, "rubocop");
        assert_eq!(j.status, "failed");
        assert_eq!(j.ref_, "main");
        assert!(!j.tag);
        assert_eq!(j.user.as_ref().unwrap().username, "root");
        assert_eq!(j.user.as_ref().unwrap().id, UserId(1));
        assert_eq!(j.pipeline.id, 6);
        assert_eq!(j.pipeline.project_id, ProjectId(1));
        assert_eq!(j.pipeline.ref_, "main");
        assert_eq!(
            j.pipeline.sha.as_str(),
            "0ff3ae198f8601a285adcf5c0fff204ee6fba5fd"
        );
        // The widgets endpoint bounds its wait for the webhook by it.
        assert_eq!(j.created_at.as_deref(), Some("2015-12-24T15:51:21.880Z"));
    }

    #[test]
    fn commit_status_fixture_parses_with_null_description_and_ref() {
        let s: StatusRecord =
            serde_json::from_str(&fixture("api/commit_status_create_response.json")).unwrap();
        assert_eq!(s.id, 93);
        assert_eq!(s.status, "success");
        assert_eq!(s.name, "default");
        assert_eq!(s.description, None);
        assert_eq!(s.ref_, None);
    }

    #[test]
    fn merge_request_tolerates_nulls_and_unknown_fields() {
        let mr: MergeRequest = serde_json::from_value(serde_json::json!({
            "iid": 16, "state": "opened", "title": null, "draft": null,
            "sha": "e59094b8de0f2f91abbe4760a52d9137260252d8",
            "source_project_id": 3, "target_project_id": 2,
            "merge_commit_sha": null, "some_future_field": {"x": 1}
        }))
        .unwrap();
        assert_eq!(mr.iid, MrIid(16));
        assert_eq!(mr.title, "");
        assert!(!mr.draft);
        assert!(mr.is_fork());
        assert_eq!(
            mr.landed_sha().unwrap().as_str(),
            "e59094b8de0f2f91abbe4760a52d9137260252d8"
        );
    }

    #[test]
    fn descriptions_are_cut_to_255_characters_on_a_char_boundary() {
        let long = "é".repeat(400);
        let cut = truncate_description(&long);
        assert_eq!(cut.chars().count(), 255);
        assert!(cut.ends_with('…'));
        assert_eq!(truncate_description("2 to add\nsecond line"), "2 to add");
        // Made inert, also where the cut leaves a comment opener without its end.
        assert_eq!(truncate_description(" /approve"), "\u{200B}/approve");
        assert_eq!(truncate_description("x\r/approve"), "x");
        let cut = truncate_description(&format!("{}<!-- {} -->", "a".repeat(240), "b".repeat(20)));
        assert!(cut.chars().count() <= 255 && !cut.contains("<!--"), "{cut}");
    }

    #[test]
    fn error_messages_come_from_gitlab_json_and_never_carry_the_token() {
        let gl = GitLab::new("http://127.0.0.1:9", "glpat-secret").unwrap();
        let e = gl.status_error(
            StatusCode::BAD_REQUEST,
            br#"{"message":"bad thing glpat-secret"}"#,
        );
        let text = e.to_string();
        assert!(text.contains("bad thing"), "{text}");
        assert!(!text.contains("glpat-secret"), "{text}");
        assert!(!format!("{gl:?}").contains("glpat-secret"));
        assert!(matches!(
            gl.status_error(StatusCode::NOT_FOUND, b"{}"),
            GitLabError::NotFound
        ));
    }

    #[test]
    fn urls_encode_project_paths_and_branch_names_as_one_segment() {
        let gl = GitLab::new("https://gitlab.example.com/sub", "t").unwrap();
        let u = gl.url(
            &[
                "projects",
                "infra/homelab",
                "repository",
                "branches",
                "feature/x",
            ],
            &[("a", "b")],
        );
        assert_eq!(
            u.as_str(),
            "https://gitlab.example.com/sub/api/v4/projects/infra%2Fhomelab/repository/branches/feature%2Fx?a=b"
        );
    }

    #[test]
    fn new_rejects_urls_with_credentials_and_empty_tokens() {
        assert!(GitLab::new("https://u:p@gitlab.example.com", "t").is_err());
        assert!(GitLab::new("https://gitlab.example.com", "").is_err());
        assert!(GitLab::new("ftp://gitlab.example.com", "t").is_err());
    }
}
