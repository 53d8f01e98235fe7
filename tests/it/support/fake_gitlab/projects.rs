//! Projects, forks, protected branches, commits pushed to their bare repositories, and their hooks.

use super::*;

pub(super) fn project_json(s: &StateInner, p: &FProject) -> Value {
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

pub(super) async fn get_project(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    Json(project_json(&s, &s.projects[&pid])).into_response()
}

pub(super) async fn get_branch(
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
    let mut v: Value = serde_json::from_str(&gitlab_fixture("api/branch_single.json")).unwrap();
    v["name"] = json!(branch);
    v["protected"] = json!(p.protected.contains(&branch));
    v["default"] = json!(p.default_branch == branch);
    v["web_url"] = json!(format!("{}/{}/-/tree/{branch}", s.base_url, p.path));
    v["commit"]["id"] = json!(sha);
    v["commit"]["short_id"] = json!(&sha[..8]);
    v["commit"]["parent_ids"] = json!([]);
    Json(v).into_response()
}

pub(super) async fn list_hooks(
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

/// `GET /projects/:id/freeze_periods`: Reporter or more (GitLab's rule), paginated.
pub(super) async fn list_freeze_periods(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<PageQuery>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let pid = tryr!(visible_project(&s, &id, &u));
    if level(&s, pid, &u) < REPORTER {
        return err(StatusCode::FORBIDDEN, "403 Forbidden");
    }
    paginate(s.projects[&pid].freeze_periods.clone(), &q)
}

impl FakeGitLab {
    /// A deploy freeze period (Settings → CI/CD → Deploy freezes): cron patterns read in
    /// `zone`, as GitLab keeps them.
    pub fn add_freeze_period(&self, p: &FakeProject, start: &str, end: &str, zone: &str) {
        let mut s = self.lock();
        let id = s.id();
        s.projects
            .get_mut(&p.id)
            .unwrap()
            .freeze_periods
            .push(serde_json::json!({
                "id": id, "freeze_start": start, "freeze_end": end, "cron_timezone": zone,
                "created_at": "2026-12-01T10:00:00.000Z", "updated_at": "2026-12-01T10:00:00.000Z"
            }));
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
                    freeze_periods: Vec::new(),
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
                    freeze_periods: Vec::new(),
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

    /// A commit on `branch` (which must exist) of a file of `bytes` bytes, `line` repeated, made
    /// by `yes | head -c | git hash-object` without passing through this process: a file of
    /// hundreds of MiB that compresses to a few MiB of git objects, as an author can push.
    pub fn commit_generated_file(
        &self,
        project: &FakeProject,
        branch: &str,
        path: &str,
        line: &str,
        bytes: u64,
    ) -> String {
        let repo = self.repo_path(project);
        let oid = generated_blob(&repo, line, bytes);
        let line = format!("100644 {oid}\t{path}\n");
        let sha = commit_in_bare_with_index_lines(&repo, branch, &[line]);
        self.refresh_after_push(project.id, branch);
        sha
    }

    /// A commit on `branch` of `copies` files `dir/f0`, `dir/f1`, … that are all one blob of
    /// `bytes` bytes (`line` repeated): what an author can push as a few KiB of git objects
    /// that check out to `copies × bytes`.
    pub fn commit_blob_copies(
        &self,
        project: &FakeProject,
        branch: &str,
        dir: &str,
        line: &str,
        bytes: u64,
        copies: usize,
    ) -> String {
        let repo = self.repo_path(project);
        let oid = generated_blob(&repo, line, bytes);
        let lines: Vec<String> = (0..copies)
            .map(|i| format!("100644 {oid}\t{dir}/f{i}\n"))
            .collect();
        let sha = commit_in_bare_with_index_lines(&repo, branch, &[lines.concat()]);
        self.refresh_after_push(project.id, branch);
        sha
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

    pub(super) fn refresh_after_push(&self, project: u64, branch: &str) {
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
            let version = s.id();
            let mr = s.projects.get_mut(&pid).unwrap().mrs.get_mut(&iid).unwrap();
            refresh_mr_refs(&target_repo, &source_repo, mr, compute, version);
        }
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
}

/// Write a blob of `bytes` bytes (`line` repeated) into the bare repository `repo`, streamed
/// (never held in memory); its object id.
fn generated_blob(repo: &std::path::Path, line: &str, bytes: u64) -> String {
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg("yes \"$1\" | head -c \"$2\" | git hash-object -w --stdin")
        .arg("sh")
        .arg(line)
        .arg(bytes.to_string())
        .current_dir(repo);
    super::git::git_env(&mut cmd);
    let out = cmd.output().expect("sh runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
