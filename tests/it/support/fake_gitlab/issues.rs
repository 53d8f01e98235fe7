//! Issues: labels, state, edits by the author or a Reporter, and their notes.

use super::*;

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

#[derive(serde::Deserialize)]
pub(super) struct IssueBody {
    title: Option<String>,
    description: Option<String>,
    /// Comma-separated, as the API takes them.
    labels: Option<String>,
    state_event: Option<String>,
}

pub(super) fn label_list(labels: &str) -> Vec<String> {
    labels
        .split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

pub(super) fn issue_json(s: &StateInner, pid: u64, i: &FakeIssue) -> Value {
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
pub(super) async fn edit_issue(
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
        issue.description = gitlab_reading::without_quick_actions(&d);
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
pub(super) async fn create_issue_note(
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
    let body = gitlab_reading::without_quick_actions(&body);
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
pub(super) async fn list_issue_notes(
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

pub(super) async fn create_issue(
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
    let description = gitlab_reading::without_quick_actions(&description);
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
pub(super) async fn list_issues(
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

impl FakeGitLab {
    pub fn issues(&self, project: &FakeProject) -> Vec<FakeIssue> {
        self.lock().projects[&project.id].issues.clone()
    }
}
