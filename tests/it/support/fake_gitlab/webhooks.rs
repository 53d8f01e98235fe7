//! The webhook bodies GitLab sends: Merge Request Hook and Note Hook.

use super::*;

/// Builder for a Merge Request Hook payload; see [`FakeGitLab::mr_webhook`].
pub struct MrWebhook {
    v: Value,
}

impl MrWebhook {
    /// `open`, `reopen`, `update`, `close`, `merge`, `approved`, ...
    pub fn action(mut self, action: &str) -> MrWebhook {
        self.v["object_attributes"]["action"] = json!(action);
        self
    }

    /// `update` with new commits: `oldrev` is the previous head.
    pub fn oldrev(mut self, sha: &str) -> MrWebhook {
        self.v["object_attributes"]["action"] = json!("update");
        self.v["object_attributes"]["oldrev"] = json!(sha);
        self
    }

    /// Replace the `changes` object (e.g. `{"draft": {"previous": true, "current": false}}`).
    pub fn changes(mut self, changes: Value) -> MrWebhook {
        self.v["changes"] = changes;
        self
    }

    /// Who triggered the event.
    pub fn by(mut self, user: &FakeUser) -> MrWebhook {
        self.v["user"]["id"] = json!(user.id);
        self.v["user"]["username"] = json!(user.username);
        self.v["user"]["name"] = json!(user.name);
        self
    }

    /// Set any field by JSON pointer (`/object_attributes/draft`).
    pub fn set(mut self, pointer: &str, value: Value) -> MrWebhook {
        *self
            .v
            .pointer_mut(pointer)
            .unwrap_or_else(|| panic!("no {pointer} in payload")) = value;
        self
    }

    pub fn build(self) -> Value {
        self.v
    }

    pub fn body(self) -> Vec<u8> {
        serde_json::to_vec(&self.v).unwrap()
    }
}

pub(super) fn merge_into(dst: &mut Value, src: &Value) {
    if let (Some(d), Some(s)) = (dst.as_object_mut(), src.as_object()) {
        for (k, v) in s {
            d.insert(k.clone(), v.clone());
        }
    } else {
        *dst = src.clone();
    }
}

pub(super) fn hook_project_json(s: &StateInner, pid: u64) -> Value {
    let p = &s.projects[&pid];
    let web = format!("{}/{}", s.base_url, p.path);
    json!({
        "id": p.id,
        "name": p.path.rsplit('/').next().unwrap_or(&p.path),
        "web_url": web,
        "git_http_url": format!("{web}.git"),
        "git_ssh_url": format!("ssh://git@fake.gitlab/{}.git", p.path),
        "namespace": p.path.split('/').next().unwrap_or(""),
        "path_with_namespace": p.path,
        "default_branch": p.default_branch,
    })
}

impl FakeGitLab {
    /// The documented Merge Request Hook payload (`webhooks/merge_request_open.json`), pointed
    /// at project `p`'s MR `iid` and its current head, with `action` (`merge` also carries the
    /// merge commit).
    pub fn merge_request_hook(&self, p: &FakeProject, iid: u64, action: &str) -> String {
        let mut v: Value =
            serde_json::from_str(&gitlab_fixture("webhooks/merge_request_open.json")).unwrap();
        v["project"]["id"] = p.id.into();
        v["project"]["path_with_namespace"] = p.path.clone().into();
        let a = &mut v["object_attributes"];
        a["iid"] = iid.into();
        a["action"] = action.into();
        a["source_project_id"] = p.id.into();
        a["target_project_id"] = p.id.into();
        a["target_branch"] = "main".into();
        a["last_commit"]["id"] = self.mr_sha(p, iid).into();
        if action == "merge" {
            a["merge_commit_sha"] = self.mr_json(p, iid)["merge_commit_sha"].clone();
        }
        v.to_string()
    }

    /// A `Merge Request Hook` payload built from `webhooks/merge_request_open.json` as is, with
    /// the story's fields set from the MR's current state (action `open`).
    pub fn mr_webhook(&self, project: &FakeProject, iid: u64) -> MrWebhook {
        let mut v: Value =
            serde_json::from_str(&gitlab_fixture("webhooks/merge_request_open.json"))
                .expect("fixture parses");
        let s = self.lock();
        let p = &s.projects[&project.id];
        let mr = &p.mrs[&iid];
        let author = &s.users[&mr.author];
        let target_json = hook_project_json(&s, p.id);
        let source_json = hook_project_json(&s, mr.source_project);
        v["user"]["id"] = json!(author.id);
        v["user"]["username"] = json!(author.username);
        v["user"]["name"] = json!(author.name);
        merge_into(&mut v["project"], &target_json);
        let oa = &mut v["object_attributes"];
        oa["id"] = json!(mr.id);
        oa["iid"] = json!(mr.iid);
        oa["title"] = json!(mr.title);
        oa["author_id"] = json!(mr.author);
        oa["source_branch"] = json!(mr.source_branch);
        oa["target_branch"] = json!(mr.target_branch);
        oa["source_project_id"] = json!(mr.source_project);
        oa["target_project_id"] = json!(p.id);
        oa["target_branch_protected"] = json!(p.protected.contains(&mr.target_branch));
        oa["state"] = json!(mr.state);
        oa["draft"] = json!(mr.draft);
        oa["merge_commit_sha"] = json!(mr.merge_commit_sha);
        oa["last_commit"]["id"] = json!(mr.sha);
        oa["last_commit"]["url"] = json!(format!("{}/{}/-/commit/{}", s.base_url, p.path, mr.sha));
        oa["url"] = json!(format!(
            "{}/{}/-/merge_requests/{}",
            s.base_url, p.path, mr.iid
        ));
        merge_into(&mut oa["source"], &source_json);
        merge_into(&mut oa["target"], &target_json);
        oa["action"] = json!(match mr.state.as_str() {
            "merged" => "merge",
            "closed" => "close",
            _ => "open",
        });
        MrWebhook { v }
    }

    /// A `Note Hook` payload from `webhooks/note_merge_request.json` as is: `user` writes `body`
    /// on the MR (the note is also added to the MR, as GitLab would have it).
    pub fn note_webhook(
        &self,
        project: &FakeProject,
        iid: u64,
        user: &FakeUser,
        body: &str,
    ) -> Value {
        let note_id = self.add_note(project, iid, user, body);
        let mut v: Value =
            serde_json::from_str(&gitlab_fixture("webhooks/note_merge_request.json"))
                .expect("fixture parses");
        let s = self.lock();
        let p = &s.projects[&project.id];
        let mr = &p.mrs[&iid];
        let target_json = hook_project_json(&s, p.id);
        let source_json = hook_project_json(&s, mr.source_project);
        v["user"]["id"] = json!(user.id);
        v["user"]["username"] = json!(user.username);
        v["user"]["name"] = json!(user.name);
        v["project_id"] = json!(p.id);
        merge_into(&mut v["project"], &target_json);
        let oa = &mut v["object_attributes"];
        oa["id"] = json!(note_id);
        oa["note"] = json!(body);
        oa["author_id"] = json!(user.id);
        oa["project_id"] = json!(p.id);
        // GitLab's clock: the note's own creation time, the one its API shows.
        oa["created_at"] = json!(logical_time(
            mr.notes
                .iter()
                .find(|n| n.id == note_id)
                .map_or(note_id, |n| n.created)
        ));
        oa["noteable_id"] = json!(mr.id);
        oa["url"] = json!(format!(
            "{}/{}/-/merge_requests/{}#note_{note_id}",
            s.base_url, p.path, mr.iid
        ));
        let m = &mut v["merge_request"];
        m["id"] = json!(mr.id);
        m["iid"] = json!(mr.iid);
        m["title"] = json!(mr.title);
        m["author_id"] = json!(mr.author);
        m["source_branch"] = json!(mr.source_branch);
        m["target_branch"] = json!(mr.target_branch);
        m["source_project_id"] = json!(mr.source_project);
        m["target_project_id"] = json!(p.id);
        m["state"] = json!(mr.state);
        m["draft"] = json!(mr.draft);
        m["work_in_progress"] = json!(mr.draft);
        m["last_commit"]["id"] = json!(mr.sha);
        merge_into(&mut m["source"], &source_json);
        merge_into(&mut m["target"], &target_json);
        v
    }
}
