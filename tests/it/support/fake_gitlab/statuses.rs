//! Commit statuses, kept as `Ci::CreateCommitStatusService` keeps them.

use super::*;

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

pub(super) fn status_json(s: &StateInner, st: &FakeStatus, author: u64) -> Value {
    json!({
        "id": st.id, "sha": st.sha, "ref": st.ref_, "status": st.state, "name": st.name,
        "target_url": st.target_url, "description": st.description,
        "created_at": now(), "started_at": null, "finished_at": null,
        "allow_failure": false, "coverage": null, "pipeline_id": st.pipeline_id,
        "author": user_by_id(s, author),
    })
}

#[derive(serde::Deserialize)]
pub(super) struct StatusBody {
    state: String,
    name: Option<String>,
    context: Option<String>,
    description: Option<String>,
    target_url: Option<String>,
    #[serde(rename = "ref")]
    ref_: Option<String>,
    pipeline_id: Option<u64>,
}

pub(super) async fn post_status(
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

#[derive(serde::Deserialize, Default)]
pub(super) struct StatusQuery {
    #[serde(rename = "ref")]
    ref_: Option<String>,
    name: Option<String>,
    all: Option<bool>,
    page: Option<usize>,
    per_page: Option<usize>,
}

/// <https://docs.gitlab.com/api/commits/#list-the-statuses-of-a-commit>: the latest status
/// per name and ref unless `all=true`; `ref` and `name` filter.
pub(super) async fn list_statuses(
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

impl FakeGitLab {
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
}
