//! The fake GitLab itself: real git served over HTTP (Basic auth required), MR refs computed like
//! GitLab's, merges, forks, and webhook payloads built from the documented fixtures as they are.

use crate::support::fake_gitlab::FakeGitLab;
use base64::Engine as _;
use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str], header: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new("git");
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0");
    if let Some(h) = header {
        cmd.env("GIT_CONFIG_COUNT", "1")
            .env("GIT_CONFIG_KEY_0", "http.extraHeader")
            .env("GIT_CONFIG_VALUE_0", h);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .trim()
        .to_string(),
    )
}

fn basic(token: &str) -> String {
    format!(
        "Authorization: Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("oauth2:{token}"))
    )
}

#[test]
fn the_repo_is_cloned_over_http_only_with_the_token_in_the_auth_header() {
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    let sha = fake.commit_files(
        &project,
        "main",
        &[("main.tf", "resource \"terraform_data\" \"a\" {}\n")],
    );
    let dir = tempfile::tempdir().unwrap();

    let (ok, log) = git(
        dir.path(),
        &["clone", "--quiet", &fake.clone_url(&project), "anon"],
        None,
    );
    assert!(!ok, "an anonymous clone must fail: {log}");
    let (ok, log) = git(
        dir.path(),
        &["clone", "--quiet", &fake.clone_url(&project), "wrong"],
        Some(&basic("glpat-not-valid")),
    );
    assert!(!ok, "a wrong token must fail: {log}");

    let (ok, log) = git(
        dir.path(),
        &["clone", "--quiet", &fake.clone_url(&project), "ok"],
        Some(&basic(fake.bot_token())),
    );
    assert!(ok, "clone with the header: {log}");
    let (_, head) = git(&dir.path().join("ok"), &["rev-parse", "HEAD"], None);
    assert_eq!(head, sha);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ok/main.tf")).unwrap(),
        "resource \"terraform_data\" \"a\" {}\n"
    );
    let reqs = fake.git_requests();
    assert!(reqs
        .iter()
        .any(|r| r.status == 401 && r.auth_user.is_none()));
    assert!(reqs
        .iter()
        .any(|r| r.status == 200 && r.auth_user.as_deref() == Some("oauth2")));
}

#[test]
fn merge_request_refs_are_written_like_gitlabs() {
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    let head = fake.commit_files(&project, "feature/vm", &[("vm.tf", "# v1\n")]);
    // main moves on after the branch was cut: the merge ref is a real merge commit.
    let main = fake.commit_files(&project, "main", &[("other.tf", "# other\n")]);
    let iid = fake.open_mr(&project, "feature/vm", "main");
    let repo = fake.repo_path(&project);

    assert_eq!(
        fake.ref_sha(&project, &format!("refs/merge-requests/{iid}/head"))
            .unwrap(),
        head
    );
    let merge = fake
        .ref_sha(&project, &format!("refs/merge-requests/{iid}/merge"))
        .unwrap();
    let (_, parents) = git(&repo, &["rev-list", "--parents", "-n", "1", &merge], None);
    assert_eq!(parents, format!("{merge} {main} {head}"));
    let (_, files) = git(&repo, &["ls-tree", "--name-only", &merge], None);
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        ["README.md", "other.tf", "vm.tf"]
    );

    // A push to the branch moves the MR's head and recomputes the merge ref.
    let head2 = fake.push(&project, "feature/vm", &[("vm.tf", "# v2\n")]);
    assert_eq!(fake.mr_sha(&project, iid), head2);
    let merge2 = fake
        .ref_sha(&project, &format!("refs/merge-requests/{iid}/merge"))
        .unwrap();
    assert_ne!(merge2, merge);

    // Merging lands a merge commit with the merge ref's tree on main, marks the MR merged.
    let landed = fake.merge_mr(&project, iid, None);
    let tree = |c: &str| git(&repo, &["rev-parse", &format!("{c}^{{tree}}")], None).1;
    assert_eq!(tree(&landed), tree(&merge2));
    let (_, parents) = git(&repo, &["rev-list", "--parents", "-n", "1", &landed], None);
    assert_eq!(parents, format!("{landed} {main} {head2}"));
    assert_eq!(fake.branch_head(&project, "main").unwrap(), landed);
    let mr = fake.mr_json(&project, iid);
    assert_eq!(mr["state"], "merged");
    assert_eq!(mr["merge_commit_sha"], landed.as_str());
}

/// Parents of a commit.
fn parents(repo: &Path, c: &str) -> Vec<String> {
    let (_, line) = git(repo, &["rev-list", "--parents", "-n", "1", c], None);
    line.split_whitespace()
        .skip(1)
        .map(str::to_string)
        .collect()
}

#[test]
fn each_merge_method_lands_what_gitlab_lands() {
    // https://docs.gitlab.com/user/project/merge_requests/methods/
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    let repo = fake.repo_path(&project);

    // `merge` (the default): a merge commit even when a fast-forward would do.
    let main0 = fake.branch_head(&project, "main").unwrap();
    fake.commit_files(&project, "a", &[("a.tf", "# a1\n")]);
    let head = fake.push(&project, "a", &[("a.tf", "# a2\n")]);
    let iid = fake.open_mr(&project, "a", "main");
    let landed = fake.merge_mr(&project, iid, None);
    assert_eq!(parents(&repo, &landed), [main0.clone(), head.clone()]);
    let mr = fake.mr_json(&project, iid);
    assert_eq!(mr["merge_commit_sha"], landed.as_str());
    assert_eq!(mr["squash_commit_sha"], serde_json::Value::Null);

    // `merge` with squash: one squash commit on the merge base, then the merge commit.
    let main1 = landed;
    fake.commit_files(&project, "b", &[("b.tf", "# b1\n")]);
    let head = fake.push(&project, "b", &[("b.tf", "# b2\n")]);
    let iid = fake.open_mr(&project, "b", "main");
    fake.set_squash(&project, iid, true);
    let landed = fake.merge_mr(&project, iid, None);
    let mr = fake.mr_json(&project, iid);
    let squash = mr["squash_commit_sha"].as_str().unwrap().to_string();
    assert_eq!(parents(&repo, &squash), [main1.as_str()]);
    assert_eq!(parents(&repo, &landed), [main1.clone(), squash.clone()]);
    assert_eq!(mr["merge_commit_sha"], landed.as_str());
    assert_ne!(squash, head);

    // `ff`: refused while the branch is behind; the target moves to the head once rebased.
    fake.set_merge_method(&project, "ff");
    let behind = fake.commit_files(&project, "c", &[("c.tf", "# c\n")]);
    let iid = fake.open_mr(&project, "c", "main");
    assert!(is_ancestor(&repo, &landed, &behind));
    fake.commit_files(&project, "main", &[("README.md", "moved\n")]);
    let err = fake.try_merge_mr(&project, iid, None).unwrap_err();
    assert!(err.contains("rebase needed"), "{err}");
    assert_eq!(fake.mr_json(&project, iid)["state"], "opened");
    let main2 = fake.branch_head(&project, "main").unwrap();
    let fresh = fake.commit_files(&project, "d", &[("d.tf", "# d\n")]);
    let iid = fake.open_mr(&project, "d", "main");
    assert_eq!(parents(&repo, &fresh), [main2.as_str()]);
    assert_eq!(fake.merge_mr(&project, iid, None), fresh);
    assert_eq!(
        fake.mr_json(&project, iid)["merge_commit_sha"],
        serde_json::Value::Null
    );

    // `ff` with squash: the squash commit is what lands.
    let e1 = fake.commit_files(&project, "e", &[("e.tf", "# e1\n")]);
    fake.push(&project, "e", &[("e.tf", "# e2\n")]);
    let iid = fake.open_mr(&project, "e", "main");
    fake.set_squash(&project, iid, true);
    let landed = fake.merge_mr(&project, iid, None);
    assert_eq!(parents(&repo, &landed), [fresh.as_str()]);
    assert_ne!(landed, e1);
    assert_eq!(
        fake.mr_json(&project, iid)["squash_commit_sha"],
        landed.as_str()
    );
    assert_eq!(fake.branch_head(&project, "main").unwrap(), landed);
}

fn is_ancestor(repo: &Path, a: &str, b: &str) -> bool {
    git(repo, &["merge-base", "--is-ancestor", a, b], None).0
}

#[test]
fn a_fork_mrs_head_is_fetched_into_the_target_project() {
    let fake = FakeGitLab::start();
    let upstream = fake.create_project("infra/homelab");
    let fork = fake.fork_project(&upstream, "mallory/homelab");
    let mallory = fake.create_user("mallory");
    let head = fake.commit_files(&fork, "evil", &[("main.tf", "# from a fork\n")]);
    let iid = fake.open_mr_from(&fork, "evil", &upstream, "main", &mallory);
    assert_eq!(
        fake.ref_sha(&upstream, &format!("refs/merge-requests/{iid}/head"))
            .unwrap(),
        head
    );
    let mr = fake.mr_json(&upstream, iid);
    assert_eq!(mr["source_project_id"], fork.id);
    assert_eq!(mr["target_project_id"], upstream.id);
    assert!(
        fake.branch_head(&upstream, "evil").is_none(),
        "the fork's branch is not in upstream"
    );
}

#[test]
fn webhook_payloads_are_the_documented_fixtures_with_the_storys_fields() {
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    let old = fake.commit_files(&project, "feature/vm", &[("vm.tf", "# v1\n")]);
    let iid = fake.open_mr(&project, "feature/vm", "main");
    let new = fake.push(&project, "feature/vm", &[("vm.tf", "# v2\n")]);

    let hook = fake.mr_webhook(&project, iid).oldrev(&old).build();
    let oa = &hook["object_attributes"];
    assert_eq!(oa["action"], "update");
    assert_eq!(oa["oldrev"], old.as_str());
    assert_eq!(oa["last_commit"]["id"], new.as_str());
    assert_eq!(oa["iid"], iid);
    assert_eq!(oa["source_project_id"], project.id);
    assert_eq!(oa["target_project_id"], project.id);
    assert_eq!(oa["source_branch"], "feature/vm");
    assert_eq!(hook["project"]["id"], project.id);
    assert_eq!(hook["project"]["path_with_namespace"], "infra/homelab");
    // Everything else is the fixture as documented (newest shape), untouched.
    assert_eq!(oa["approval_rules"][0]["rule_type"], "any_approver");
    assert_eq!(hook["reviewers"][0]["state"], "unreviewed");
    assert_eq!(hook["object_kind"], "merge_request");

    let alice = fake.create_user("alice");
    let note = fake.note_webhook(&project, iid, &alice, "planbot plan");
    assert_eq!(note["object_attributes"]["note"], "planbot plan");
    assert_eq!(note["object_attributes"]["noteable_type"], "MergeRequest");
    assert_eq!(note["user"]["username"], "alice");
    assert_eq!(note["merge_request"]["iid"], iid);
    assert_eq!(note["merge_request"]["last_commit"]["id"], new.as_str());
    assert_eq!(note["project_id"], project.id);
    // The note exists on the MR, as it would on GitLab when the hook fires.
    let notes = fake.notes(&project, iid);
    assert_eq!(notes.len(), 1);
    assert_eq!(note["object_attributes"]["id"], notes[0].id);
}
