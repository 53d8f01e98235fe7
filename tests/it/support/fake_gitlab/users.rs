//! Users, groups and members: who a token is, and the role each one has in a project or group.

use super::*;

pub(super) fn user_json(u: &FakeUser) -> Value {
    json!({
        "id": u.id, "username": u.username, "name": u.name, "state": "active",
        "locked": false, "avatar_url": null, "web_url": format!("http://fake.gitlab/{}", u.username)
    })
}

pub(super) fn user_by_id(s: &StateInner, id: u64) -> Value {
    s.users.get(&id).map(user_json).unwrap_or(Value::Null)
}

pub(super) async fn get_user(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let s = lock!(state);
    if let Some(u) = oauth_user(&s, &headers) {
        return Json(user_json(&u)).into_response();
    }
    let u = tryr!(api_user(&s, &headers));
    Json(user_json(&u)).into_response()
}

/// `GET /users/:id`: any signed-in user may read another's public profile.
pub(super) async fn get_user_by_id(
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
pub(super) async fn get_group_member(
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

pub(super) async fn get_member(
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

impl FakeGitLab {
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

    /// The user `username` (created the first time) with the role `level` on `project`: e.g.
    /// the owner of a state token with exactly the role a test needs.
    pub fn member_with_role(&self, project: &FakeProject, username: &str, level: u32) -> FakeUser {
        let user = self
            .user_named(username)
            .unwrap_or_else(|| self.create_user(username));
        self.add_member(project, &user, level);
        user
    }

    pub(super) fn member_level(&self, project: &FakeProject, user: &FakeUser) -> Option<u32> {
        self.lock().projects[&project.id]
            .members
            .get(&user.id)
            .copied()
    }

    pub fn user_named(&self, username: &str) -> Option<FakeUser> {
        self.lock()
            .users
            .values()
            .find(|u| u.username == username)
            .cloned()
    }
}
