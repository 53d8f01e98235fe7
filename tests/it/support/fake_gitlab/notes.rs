//! Merge request notes: listed (sort, order, pages), posted, read, edited, deleted, and the
//! award emoji on them.

use super::*;

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
    /// The award emoji on it, as `(user id, name)`, in the order awarded.
    pub awards: Vec<(u64, String)>,
}

pub(super) fn note_json(s: &StateInner, mr: &FMr, n: &FakeNote) -> Value {
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

pub(super) async fn list_notes(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid)): Path<(String, u64)>,
    Query(q): Query<PageQuery>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let (_, mr) = tryr!(visible_mr(&s, &id, &u, iid));
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
pub(super) struct NoteBody {
    pub(super) body: Option<String>,
}

pub(super) const NOTE_LIMIT: usize = 1_000_000;

pub(super) async fn create_note(
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
    let body = gitlab_reading::without_quick_actions(&body);
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
        awards: Vec::new(),
    };
    mr.notes.push(note.clone());
    let mr = mr.clone();
    (StatusCode::CREATED, Json(note_json(&s, &mr, &note))).into_response()
}

pub(super) async fn get_note(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid, note_id)): Path<(String, u64, u64)>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let (_, mr) = tryr!(visible_mr(&s, &id, &u, iid));
    match mr.notes.iter().find(|n| n.id == note_id) {
        Some(n) => Json(note_json(&s, mr, n)).into_response(),
        None => err(StatusCode::NOT_FOUND, "404 Note Not Found"),
    }
}

pub(super) async fn edit_note(
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
    let body = gitlab_reading::without_quick_actions(&body);
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
pub(super) struct AwardBody {
    name: Option<String>,
}

/// `POST /projects/:id/merge_requests/:iid/notes/:note_id/award_emoji` as GitLab answers it:
/// 201 with the award; 400 without a `name`; 404 for a note it cannot find, and also (GitLab's
/// way, gitlab-org/gitlab#21252) when this user already awarded this emoji on the note. Any
/// user who can read the MR may react (Guest or more on a private project).
pub(super) async fn award_note_emoji(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid, note_id)): Path<(String, u64, u64)>,
    Json(b): Json<AwardBody>,
) -> Response {
    let mut s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    let Some(name) = b.name.filter(|n| !n.is_empty()) else {
        return err(StatusCode::BAD_REQUEST, "400 Bad request - name is missing");
    };
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_+-".contains(c))
    {
        return err(
            StatusCode::NOT_FOUND,
            "404 Award Emoji Name is not a valid emoji name",
        );
    }
    let award_id = s.id();
    let Some(mr) = s.projects.get_mut(&pid).unwrap().mrs.get_mut(&iid) else {
        return err(StatusCode::NOT_FOUND, "404 Not found");
    };
    let Some(n) = mr.notes.iter_mut().find(|n| n.id == note_id) else {
        return err(StatusCode::NOT_FOUND, "404 Note Not Found");
    };
    if n.awards.iter().any(|(by, e)| *by == u.id && *e == name) {
        return err(
            StatusCode::NOT_FOUND,
            "404 Award Emoji Name has already been taken",
        );
    }
    n.awards.push((u.id, name.clone()));
    let author = user_by_id(&s, u.id);
    (
        StatusCode::CREATED,
        Json(json!({
            "id": award_id,
            "name": name,
            "user": author,
            "created_at": logical_time(award_id),
            "updated_at": logical_time(award_id),
            "awardable_id": note_id,
            "awardable_type": "Note",
        })),
    )
        .into_response()
}

impl FakeGitLab {
    /// planbot's plan note on MR `iid` (found by its hidden marker), if posted.
    pub fn plan_note(&self, p: &FakeProject, iid: u64) -> Option<String> {
        self.notes(p, iid)
            .into_iter()
            .find(|n| n.body.contains(planbot::core::render::NOTE_MARKER))
            .map(|n| n.body)
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
                awards: Vec::new(),
            })
        });
        id
    }

    /// A user deletes a note in the UI.
    pub fn delete_note(&self, project: &FakeProject, iid: u64, note_id: u64) {
        self.with_mr(project, iid, |mr| mr.notes.retain(|n| n.id != note_id));
    }
}
