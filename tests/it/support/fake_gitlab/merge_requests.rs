//! Merge requests: opened, drafted, retargeted, rebased, merged (each merge method), closed,
//! approved; their refs, diff versions and approvals, and their JSON.

use super::*;

/// Recompute `refs/merge-requests/IID/{head,merge}` in the target repo for one MR; without
/// `compute_merge`, only the head (the merge ref is left as it was, marked pending). A new
/// head is a new diff version of the MR, `version` its id and logical time (GitLab makes one
/// per push: <https://docs.gitlab.com/api/merge_requests/#get-merge-request-diff-versions>).
pub(super) fn refresh_mr_refs(
    target_repo: &FsPath,
    source_repo: &FsPath,
    mr: &mut FMr,
    compute_merge: bool,
    version: u64,
) {
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
        let base = rev_parse(target_repo, &format!("refs/heads/{}", mr.target_branch))
            .and_then(|t| try_git(target_repo, &["merge-base", &t, &head], &[], None).ok());
        mr.versions.push(FVersion {
            id: version,
            head: head.clone(),
            base,
            created: version,
        });
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

pub(super) fn mr_json(s: &StateInner, pid: u64, mr: &FMr) -> Value {
    let p = &s.projects[&pid];
    let repo = s.repo(pid);
    let base = mr.merged_base.clone().or_else(|| {
        rev_parse(&repo, &format!("refs/heads/{}", mr.target_branch))
            .and_then(|t| try_git(&repo, &["merge-base", &t, &mr.sha], &[], None).ok())
    });
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

pub(super) async fn list_mrs(
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

pub(super) async fn get_mr(
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

pub(super) async fn commit_mrs(
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

/// `GET /projects/:id/merge_requests/:iid/approvals`
/// (<https://docs.gitlab.com/api/merge_request_approvals/#for-a-merge-request>): who approves
/// it now (`approved_by[].user`), as GitLab Free answers: no rules, so nothing is required.
pub(super) async fn get_approvals(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid)): Path<(String, u64)>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let (pid, mr) = tryr!(visible_mr(&s, &id, &u, iid));
    let approved_by: Vec<Value> = mr
        .approved_by
        .iter()
        .map(|a| json!({ "user": user_by_id(&s, *a) }))
        .collect();
    Json(json!({
        "id": mr.id,
        "iid": mr.iid,
        "project_id": pid,
        "title": mr.title,
        "description": "",
        "state": mr.state,
        "created_at": "2026-01-01T00:00:00.000Z",
        "updated_at": "2026-01-01T00:00:00.000Z",
        "merge_status": "can_be_merged",
        "approved": !mr.approved_by.is_empty(),
        "approvals_required": 0,
        "approvals_left": 0,
        "approved_by": approved_by,
        "user_has_approved": mr.approved_by.contains(&u.id),
        "user_can_approve": level(&s, pid, &u) >= DEVELOPER && !mr.approved_by.contains(&u.id),
    }))
    .into_response()
}

/// `GET /projects/:id/merge_requests/:iid/versions`
/// (<https://docs.gitlab.com/api/merge_requests/#get-merge-request-diff-versions>): the MR's
/// diff versions, newest first, paginated; one per push.
pub(super) async fn list_versions(
    State(state): State<Shared>,
    headers: HeaderMap,
    Path((id, iid)): Path<(String, u64)>,
    Query(q): Query<PageQuery>,
) -> Response {
    let s = lock!(state);
    let u = tryr!(api_user(&s, &headers));
    let (_, mr) = tryr!(visible_mr(&s, &id, &u, iid));
    let items: Vec<Value> = mr
        .versions
        .iter()
        .rev()
        .map(|v| {
            json!({
                "id": v.id,
                "head_commit_sha": v.head,
                "base_commit_sha": v.base,
                "start_commit_sha": v.base,
                "created_at": logical_time(v.created),
                "merge_request_id": mr.id,
                "state": "collected",
                "real_size": "1",
                "patch_id_sha": null,
            })
        })
        .collect();
    paginate(items, &q)
}

impl FakeGitLab {
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
        let version = s.id();
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
            merged_base: None,
            notes: Vec::new(),
            approved_by: Vec::new(),
            versions: Vec::new(),
        };
        refresh_mr_refs(&target_repo, &source_repo, &mut mr, compute, version);
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

    pub(super) fn with_mr<R>(
        &self,
        project: &FakeProject,
        iid: u64,
        f: impl FnOnce(&mut FMr) -> R,
    ) -> R {
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
            let version = s.id();
            let mr = s.projects.get_mut(&pid).unwrap().mrs.get_mut(&iid).unwrap();
            refresh_mr_refs(&target_repo, &source_repo, mr, true, version);
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
        let diff_base = try_git(&repo, &["merge-base", &target, &head], &[], None).ok();
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
            mr.merged_base = diff_base.clone();
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

    /// `user` clicks "Approve" on the open MR: GitLab Free lets a Developer or above approve
    /// (the author too), keeps the approval across later pushes, and writes the system note
    /// "approved this merge request" by `user`
    /// (<https://docs.gitlab.com/user/project/merge_requests/approvals/>). Returns the note's
    /// logical time.
    pub fn approve(&self, project: &FakeProject, iid: u64, user: &FakeUser) -> u64 {
        let level = self.member_level(project, user).unwrap_or(0);
        assert!(
            level >= DEVELOPER,
            "GitLab lets only a Developer or above approve"
        );
        self.system_note(project, iid, user, "approved this merge request", |mr| {
            assert_eq!(
                mr.state, "opened",
                "GitLab takes approvals on open MRs only"
            );
            assert!(!mr.approved_by.contains(&user.id), "already approved");
            mr.approved_by.push(user.id);
        })
    }

    /// `user` revokes their approval: the system note "unapproved this merge request".
    pub fn unapprove(&self, project: &FakeProject, iid: u64, user: &FakeUser) -> u64 {
        self.system_note(project, iid, user, "unapproved this merge request", |mr| {
            assert!(mr.approved_by.contains(&user.id), "not approved");
            mr.approved_by.retain(|a| *a != user.id);
        })
    }

    /// What `user` did to the MR (`change`), and GitLab's system note `body` by them saying it.
    fn system_note(
        &self,
        project: &FakeProject,
        iid: u64,
        user: &FakeUser,
        body: &str,
        change: impl FnOnce(&mut FMr),
    ) -> u64 {
        let id = self.lock().id();
        self.with_mr(project, iid, |mr| {
            change(mr);
            mr.notes.push(FakeNote {
                id,
                body: body.to_string(),
                author_id: user.id,
                system: true,
                edits: 0,
                created: id,
                updated: id,
                awards: Vec::new(),
            });
        });
        id
    }

    /// When the MR's newest diff version was made (its last push), as GitLab writes it.
    pub fn last_push(&self, project: &FakeProject, iid: u64) -> String {
        self.with_mr(project, iid, |mr| {
            logical_time(mr.versions.last().expect("a diff version").created)
        })
    }

    /// A logical time as GitLab writes it (`created_at`).
    pub fn time(&self, t: u64) -> String {
        logical_time(t)
    }
}
