//! GitLab-managed Terraform state (the engine's `http` backend) with its locks, and GraphQL's
//! answer to who holds a lock.
//!
//! As GitLab's `lib/api/terraform/state.rb` and `Terraform::RemoteStateHandler` do it
//! (docs: user/infrastructure/iac/terraform_state, api/terraform_states): HTTP Basic auth with
//! any user name and a personal access token (or `gitlab-ci-token` and a running job's token,
//! acting as the job's user); a project the user is no member of is a 404; reading needs the
//! Developer role (`read_terraform_state`), everything else Maintainer (`admin_terraform_state`):
//! 403 otherwise. A state never written is a 404 to GET. A held lock answers `409 Conflict` with
//! the lock info: `ID`, `Who` (the GitLab user who locked) and `Created` of the held lock, the
//! other fields from the request. A write must name the held lock (`?ID=`), and every write
//! is a new version (its `serial`).

use super::*;

/// Basic auth with any user name and a user's token (or `gitlab-ci-token` + a running job
/// token, which acts as the job's user).
pub(super) fn basic_user(
    s: &StateInner,
    headers: &HeaderMap,
) -> Option<(String, Option<FakeUser>)> {
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

/// Reads of one state that fail once it is written: armed with a status, failing with it.
#[derive(Debug, Clone, Default)]
pub(super) struct ReadFault {
    /// The status every read answers from the next successful write on.
    after_write: Option<u16>,
    /// The status every read answers now.
    failing: Option<u16>,
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
pub(super) fn tf_auth(
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
pub(super) struct TfQuery {
    #[serde(rename = "ID")]
    id: Option<String>,
}

/// The lock info GitLab answers: the held lock's `ID`, `Who`, `Created`; the rest as asked.
pub(super) fn lock_answer(held: &TfLock, asked: &Value) -> Value {
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

pub(super) fn record_tf(
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

pub(super) async fn tf_state(
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
                let key = (pid, name.clone());
                let failing = s.tf_read_faults.get(&key).and_then(|f| f.failing);
                match failing {
                    // GitLab failing to read the state: its API's error shape.
                    Some(code) if method == Method::GET => {
                        let code = StatusCode::from_u16(code).unwrap();
                        let message = format!(
                            "{} {}",
                            code.as_u16(),
                            code.canonical_reason().unwrap_or("Error")
                        );
                        (code, Some(user), err(code, &message))
                    }
                    _ => {
                        let tfs = &mut s.projects.get_mut(&pid).unwrap().tf;
                        let resp = tf_state_answer(tfs, &method, &name, q.id.as_deref(), &body);
                        let written = method == Method::POST
                            && resp.status() == StatusCode::OK
                            && !body.is_empty();
                        if written {
                            if let Some(f) = s.tf_read_faults.get_mut(&key) {
                                f.failing = f.failing.or(f.after_write.take());
                            }
                        }
                        (resp.status(), Some(user), resp)
                    }
                }
            }
        }
    };
    record_tf(&state, method.as_str(), "state", &name, user.as_ref(), code);
    resp
}

pub(super) fn tf_state_answer(
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
        // `Terraform::RemoteStateHandler#handle_with_lock`: a state locked by another lock
        // than the one named is a conflict, as for a write.
        "DELETE" => match tfs.get(name) {
            None => err(StatusCode::NOT_FOUND, "404 Not found"),
            Some(tf)
                if tf
                    .lock
                    .as_ref()
                    .is_some_and(|l| Some(l.id.as_str()) != lock_id) =>
            {
                StatusCode::CONFLICT.into_response()
            }
            Some(_) => {
                tfs.remove(name);
                StatusCode::OK.into_response()
            }
        },
        _ => err(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed"),
    }
}

pub(super) async fn tf_lock(
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

pub(super) fn tf_lock_answer(
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

/// `POST /api/graphql`, the two queries planbot asks (GitLab's `Project.terraformState`:
/// `lockedAt`, `lockedByUser { username }`; `latestVersion { serial }`). Any other query is answered with GraphQL's error
/// shape, so a test fails if planbot asks something the fake does not know. As on GitLab, a
/// project the user cannot see is `null`, and a state is `null` below the Developer role.
pub(super) async fn graphql(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let s = lock!(state);
    let user = tryr!(api_user(&s, &headers));
    let req: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
    let query = req["query"].as_str().unwrap_or("");
    let lock = "query($path: ID!, $name: String!) { project(fullPath: $path) { terraformState(name: $name) { lockedAt lockedByUser { username } } } }";
    let serial = "query($path: ID!, $name: String!) { project(fullPath: $path) { terraformState(name: $name) { latestVersion { serial } } } }";
    if query != lock && query != serial {
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
            // `latestVersion` is null for a state with no version yet.
            Some(tf) if query == serial => match tf.versions.last() {
                Some(v) => json!({"latestVersion": {"serial": v.serial}}),
                None => json!({"latestVersion": null}),
            },
            Some(tf) => match &tf.lock {
                Some(l) => json!({"lockedAt": l.created, "lockedByUser": {"username": l.who}}),
                None => json!({"lockedAt": null, "lockedByUser": null}),
            },
        }
    };
    Json(json!({"data": {"project": {"terraformState": state_json}}})).into_response()
}

impl FakeGitLab {
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

    /// Write state `name` of the project as an apply elsewhere would have (a new version with
    /// the document's `serial`).
    pub fn put_terraform_state(&self, project: &FakeProject, name: &str, document: &Value) {
        let mut s = self.lock();
        let tf = s
            .projects
            .get_mut(&project.id)
            .unwrap()
            .tf
            .entry(name.to_string())
            .or_default();
        tf.versions.push(TfVersion {
            serial: document["serial"].as_u64().unwrap_or(1),
            data: serde_json::to_vec(document).unwrap(),
        });
    }

    /// From the next successful write of state `name` on, every read of it answers `status`
    /// with GitLab's error body (`{"message": "500 Internal Server Error"}`), as a GitLab whose
    /// state storage fails would, until [`FakeGitLab::heal_state_reads`]. Writes and locks
    /// still work: an apply writes, and the plan right after it cannot read.
    pub fn fail_state_reads_after_next_write(
        &self,
        project: &FakeProject,
        name: &str,
        status: u16,
    ) {
        self.lock().tf_read_faults.insert(
            (project.id, name.to_string()),
            ReadFault {
                after_write: Some(status),
                failing: None,
            },
        );
    }

    /// Reads of state `name` work again.
    pub fn heal_state_reads(&self, project: &FakeProject, name: &str) {
        self.lock()
            .tf_read_faults
            .remove(&(project.id, name.to_string()));
    }

    /// Every request the state API answered, in order.
    pub fn state_requests(&self) -> Vec<StateRequest> {
        self.lock().tf_requests.clone()
    }
}
