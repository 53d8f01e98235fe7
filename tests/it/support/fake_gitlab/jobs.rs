//! CI jobs: a job token is who `GET /job` says it is, while the job runs.

use super::*;

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

impl FakeJob {
    /// A running manual `planbot-apply` job `id` of `project`'s newest pipeline on `main`
    /// (its head `sha`), clicked by `user`.
    pub fn apply(id: u64, project: &FakeProject, user: &FakeUser, sha: &str) -> FakeJob {
        FakeJob {
            token: format!("glcbt-job-{id}"),
            id,
            name: "planbot-apply".into(),
            status: "running".into(),
            ref_: "main".into(),
            tag: false,
            user: Some(user.clone()),
            pipeline_id: 1000 + id,
            project_id: project.id,
            sha: sha.to_string(),
        }
    }
}

pub(super) async fn get_job(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let s = lock!(state);
    let token = headers.get("job-token").and_then(|v| v.to_str().ok());
    let job = match token.and_then(|t| s.jobs.get(t)) {
        Some(j) if j.status == "running" => j.clone(),
        _ => return err(StatusCode::UNAUTHORIZED, "401 Unauthorized"),
    };
    let mut v: Value =
        serde_json::from_str(&gitlab_fixture("api/get_job_via_job_token.json")).unwrap();
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
    // GitLab's own format: UTC, milliseconds, `Z`.
    let created = s.job_created.get(&job.token).copied().unwrap_or(0);
    v["created_at"] = json!(chrono::DateTime::from_timestamp_millis(created)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    v["started_at"] = v["created_at"].clone();
    Json(v).into_response()
}

impl FakeGitLab {
    /// A job GitLab just created (its `created_at` is now).
    pub fn register_job(&self, job: FakeJob) {
        let mut s = self.lock();
        s.job_created
            .insert(job.token.clone(), planbot::capabilities::store::now_ms());
        s.jobs.insert(job.token.clone(), job);
    }

    /// The job was created `secs` seconds ago (its pipeline started then).
    pub fn set_job_created_ago(&self, token: &str, secs: i64) {
        self.lock().job_created.insert(
            token.to_string(),
            planbot::capabilities::store::now_ms() - secs * 1000,
        );
    }

    pub fn set_job_status(&self, token: &str, status: &str) {
        if let Some(j) = self.lock().jobs.get_mut(token) {
            j.status = status.to_string();
        }
    }
}
