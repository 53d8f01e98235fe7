//! The git workspace against the fake GitLab's real repositories: mirrors, exact checkouts,
//! GitLab's merge ref, changed files, reading the default branch's config, and the token kept
//! out of argv, URLs and the mirror's config.

use crate::support::fake_gitlab::{FakeGitLab, FakeProject};
use planbot::capabilities::workspace::{GitOutputTooLarge, PlannedRef, Workspace};
use planbot::core::ids::{CommitSha, MrIid, ProjectId};

struct Story {
    fake: FakeGitLab,
    project: FakeProject,
    data: tempfile::TempDir,
    ws: Workspace,
}

fn story() -> Story {
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(
        &project,
        "main",
        &[
            (
                "tofu/stacks/core/main.tf",
                "resource \"terraform_data\" \"a\" {}\n",
            ),
            ("modules/vm/main.tf", "# module\n"),
        ],
    );
    let data = tempfile::tempdir().unwrap();
    let ws = Workspace::new(data.path(), fake.bot_token()).unwrap();
    Story {
        fake,
        project,
        data,
        ws,
    }
}

impl Story {
    fn pid(&self) -> ProjectId {
        ProjectId(self.project.id)
    }
    async fn sync(&self) {
        self.ws
            .sync(self.pid(), &self.fake.clone_url(&self.project))
            .await
            .expect("sync");
    }
}

#[tokio::test]
async fn a_job_gets_its_own_checkout_of_the_exact_commit_and_it_is_removed_afterwards() {
    let s = story();
    let v1 = s.fake.commit_files(
        &s.project,
        "feature/vm",
        &[("tofu/stacks/core/vm.tf", "# v1\n")],
    );
    let iid = s.fake.open_mr(&s.project, "feature/vm", "main");
    let v2 = s.fake.push(
        &s.project,
        "feature/vm",
        &[("tofu/stacks/core/vm.tf", "# v2\n")],
    );
    s.sync().await;

    let old =
        s.ws.checkout(s.pid(), &CommitSha(v1.clone()))
            .await
            .unwrap();
    let new =
        s.ws.checkout(s.pid(), &CommitSha(v2.clone()))
            .await
            .unwrap();
    assert_ne!(old.path(), new.path(), "one directory per job");
    assert_eq!(
        std::fs::read_to_string(old.path().join("tofu/stacks/core/vm.tf")).unwrap(),
        "# v1\n"
    );
    assert_eq!(
        std::fs::read_to_string(new.path().join("tofu/stacks/core/vm.tf")).unwrap(),
        "# v2\n"
    );
    assert_eq!(new.sha().as_str(), v2);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(new.path().parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "job directories are private");
    }
    let (old_path, new_path) = (old.path().to_path_buf(), new.path().to_path_buf());
    drop(old);
    assert!(
        !old_path.exists(),
        "the checkout is removed when the job is done"
    );
    assert!(new_path.exists());
    drop(new);
    assert!(!new_path.exists());

    // The MR's head ref is in the mirror too.
    let head =
        s.ws.rev_parse(s.pid(), &format!("refs/merge-requests/{iid}/head"))
            .await
            .unwrap();
    assert_eq!(head.unwrap().as_str(), v2);
}

#[tokio::test]
async fn the_token_reaches_git_only_through_the_auth_header() {
    let s = story();
    s.sync().await;
    let token = s.fake.bot_token().to_string();

    // GitLab saw authenticated fetches, as the oauth2 user of the Basic header.
    let reqs = s.fake.git_requests();
    assert!(!reqs.is_empty());
    assert!(
        reqs.iter()
            .all(|r| r.auth_user.as_deref() == Some("oauth2")),
        "{reqs:?}"
    );
    assert!(reqs.iter().all(|r| r.status == 200), "{reqs:?}");

    // Not in any argv, not in the mirror's config or any small file in it.
    for inv in s.ws.invocations() {
        for arg in &inv.argv {
            assert!(!arg.contains(&token), "token in argv: {:?}", inv.argv);
            assert!(
                !arg.contains("oauth2"),
                "credentials in argv: {:?}",
                inv.argv
            );
        }
    }
    let mirror = s.ws.mirror_path(s.pid());
    let config = std::fs::read_to_string(mirror.join("config")).unwrap();
    assert!(!config.contains(&token), "{config}");
    assert!(!config.to_lowercase().contains("extraheader"), "{config}");
    for entry in walk(&mirror) {
        if let Ok(text) = std::fs::read_to_string(&entry) {
            assert!(!text.contains(&token), "token found in {}", entry.display());
        }
    }

    // The fetch had the header in its environment; local commands did not.
    let invs = s.ws.invocations();
    let fetch = invs
        .iter()
        .find(|i| i.argv.get(1).map(String::as_str) == Some("fetch"))
        .unwrap();
    assert!(fetch.config.contains(&"http.extraHeader".to_string()));
    let local = invs
        .iter()
        .find(|i| i.argv.get(1).map(String::as_str) == Some("init"))
        .unwrap();
    assert!(!local.config.contains(&"http.extraHeader".to_string()));
    // Every git command runs hook-free.
    assert!(invs
        .iter()
        .all(|i| i.config.contains(&"core.hooksPath".to_string())));
    // An explicit environment: nothing inherited (no GIT_DIR, GIT_SSH_COMMAND, ...).
    let allowed = [
        "PATH",
        "HOME",
        "GIT_TERMINAL_PROMPT",
        "GIT_CONFIG_NOSYSTEM",
        "GIT_CONFIG_GLOBAL",
        "GIT_ASKPASS",
        "SSH_ASKPASS",
        "GIT_HTTP_LOW_SPEED_LIMIT",
        "GIT_HTTP_LOW_SPEED_TIME",
        "LC_ALL",
        "GIT_CONFIG_COUNT",
    ];
    for inv in &invs {
        for k in &inv.env {
            let numbered = ["GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"]
                .iter()
                .any(|p| k.strip_prefix(p).is_some_and(|n| n.parse::<u8>().is_ok()));
            assert!(
                allowed.contains(&k.as_str()) || numbered,
                "unexpected env {k} for {:?}",
                inv.argv
            );
        }
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.metadata().map(|m| m.len() < 1_000_000).unwrap_or(false) {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn a_wrong_token_fails_the_fetch_without_showing_the_token() {
    let s = story();
    let ws = Workspace::new(s.data.path(), "glpat-wrong-and-secret").unwrap();
    let err = ws
        .sync(s.pid(), &s.fake.clone_url(&s.project))
        .await
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("git fetch failed"), "{text}");
    assert!(!text.contains("glpat-wrong-and-secret"), "{text}");
    // Credentials in the URL are refused outright.
    let url = s
        .fake
        .clone_url(&s.project)
        .replace("http://", "http://oauth2:x@");
    assert!(ws.sync(s.pid(), &url).await.is_err());
}

#[tokio::test]
async fn fetches_are_incremental_and_see_new_pushes_and_merge_requests() {
    let s = story();
    s.sync().await;
    let main1 = s.ws.branch_head(s.pid(), "main").await.unwrap().unwrap();
    assert_eq!(
        main1.as_str(),
        s.fake.branch_head(&s.project, "main").unwrap()
    );
    let head = s
        .fake
        .commit_files(&s.project, "feature/x", &[("x.tf", "# x\n")]);
    let iid = s.fake.open_mr(&s.project, "feature/x", "main");
    assert!(
        s.ws.rev_parse(s.pid(), &head).await.unwrap().is_none(),
        "not fetched yet"
    );
    s.sync().await;
    assert_eq!(
        s.ws.branch_head(s.pid(), "feature/x")
            .await
            .unwrap()
            .unwrap()
            .as_str(),
        head
    );
    assert!(s
        .ws
        .rev_parse(s.pid(), &format!("refs/merge-requests/{iid}/merge"))
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn merge_mode_plans_gitlabs_merge_result_and_head_mode_the_head() {
    let s = story();
    let head = s.fake.commit_files(
        &s.project,
        "feature/vm",
        &[("tofu/stacks/core/vm.tf", "# vm\n")],
    );
    // main moved on: the merge result contains both changes.
    s.fake.commit_files(
        &s.project,
        "main",
        &[("tofu/stacks/core/dns.tf", "# dns\n")],
    );
    let iid = s.fake.open_mr(&s.project, "feature/vm", "main");
    s.sync().await;
    let head = CommitSha(head);

    let merged =
        s.ws.mr_commit(s.pid(), MrIid(iid), &head, "main", true)
            .await
            .unwrap();
    assert_eq!(merged.planned, PlannedRef::Merge);
    assert_eq!(
        merged.sha.as_str(),
        s.fake
            .ref_sha(&s.project, &format!("refs/merge-requests/{iid}/merge"))
            .unwrap()
    );
    assert_eq!(merged.head, head);
    assert!(
        merged.explanation.starts_with("GitLab's merge result"),
        "{}",
        merged.explanation
    );
    let co = s.ws.checkout(s.pid(), &merged.sha).await.unwrap();
    assert!(co.path().join("tofu/stacks/core/vm.tf").exists());
    assert!(
        co.path().join("tofu/stacks/core/dns.tf").exists(),
        "what would land"
    );

    let h =
        s.ws.mr_commit(s.pid(), MrIid(iid), &head, "main", false)
            .await
            .unwrap();
    assert_eq!(h.planned, PlannedRef::Head);
    assert_eq!(h.sha, head);
    let co = s.ws.checkout(s.pid(), &h.sha).await.unwrap();
    assert!(!co.path().join("tofu/stacks/core/dns.tf").exists());
}

#[tokio::test]
async fn a_stale_or_missing_merge_ref_falls_back_to_the_head_and_says_why() {
    let s = story();
    s.fake
        .commit_files(&s.project, "feature/vm", &[("vm.tf", "# 1\n")]);
    let iid = s.fake.open_mr(&s.project, "feature/vm", "main");
    s.sync().await;
    // GitLab computes merge refs in the background: a push moves the head at once, the merge
    // ref only later.
    s.fake.set_async_merge_refs(true);
    let newer = s.fake.push(&s.project, "feature/vm", &[("vm.tf", "# 2\n")]);
    assert_eq!(
        s.fake.mr_json(&s.project, iid)["detailed_merge_status"],
        "checking"
    );
    s.sync().await;
    let c =
        s.ws.mr_commit(s.pid(), MrIid(iid), &CommitSha(newer.clone()), "main", true)
            .await
            .unwrap();
    assert_eq!(c.planned, PlannedRef::Head);
    assert_eq!(c.sha.as_str(), newer);
    assert!(c.explanation.contains("older head"), "{}", c.explanation);

    // Once GitLab caught up, the merge result of the new head is planned.
    s.fake.compute_merge_refs();
    s.sync().await;
    let c =
        s.ws.mr_commit(s.pid(), MrIid(iid), &CommitSha(newer.clone()), "main", true)
            .await
            .unwrap();
    assert_eq!(c.planned, PlannedRef::Merge, "{}", c.explanation);
    s.fake.set_async_merge_refs(false);

    // A conflicting MR has no merge ref at all.
    let clash = s
        .fake
        .commit_files(&s.project, "feature/clash", &[("README.md", "# ours\n")]);
    s.fake
        .commit_files(&s.project, "main", &[("README.md", "# theirs\n")]);
    let iid2 = s.fake.open_mr(&s.project, "feature/clash", "main");
    assert!(s
        .fake
        .ref_sha(&s.project, &format!("refs/merge-requests/{iid2}/merge"))
        .is_none());
    s.sync().await;
    let c =
        s.ws.mr_commit(
            s.pid(),
            MrIid(iid2),
            &CommitSha(clash.clone()),
            "main",
            true,
        )
        .await
        .unwrap();
    assert_eq!(c.planned, PlannedRef::Head);
    assert_eq!(c.sha.as_str(), clash);
    assert!(c.explanation.contains("conflicts"), "{}", c.explanation);
}

#[tokio::test]
async fn changed_files_are_counted_from_the_merge_base_with_renames_as_both_paths() {
    let s = story();
    s.fake.commit_changes(
        &s.project,
        "feature/move",
        &[
            ("tofu/stacks/core/main.tf", None),
            (
                "tofu/stacks/core/vms.tf",
                Some("resource \"terraform_data\" \"a\" {}\n"),
            ),
            ("modules/vm/main.tf", Some("# module v2\n")),
        ],
        "move and edit",
    );
    // main moves on with an unrelated file: it must not count as changed by the MR.
    s.fake.commit_files(
        &s.project,
        "main",
        &[("tofu/stacks/dns/main.tf", "# dns\n")],
    );
    s.sync().await;
    let base = s.ws.branch_head(s.pid(), "main").await.unwrap().unwrap();
    let head =
        s.ws.branch_head(s.pid(), "feature/move")
            .await
            .unwrap()
            .unwrap();
    let mut files = s.ws.changed_files(s.pid(), &base, &head).await.unwrap();
    files.sort();
    assert_eq!(
        files,
        [
            "modules/vm/main.tf",
            "tofu/stacks/core/main.tf",
            "tofu/stacks/core/vms.tf"
        ]
    );
}

#[tokio::test]
async fn the_repo_config_is_read_from_the_default_branch_not_the_mr() {
    let s = story();
    s.fake.commit_files(
        &s.project,
        "main",
        &[(".planbot.toml", "[plan]\ncheckout = \"head\"\n")],
    );
    s.fake.commit_files(
        &s.project,
        "feature/evil",
        &[(".planbot.toml", "[plan]\ncheckout = \"merge\"\n")],
    );
    s.sync().await;
    let main =
        s.ws.read_file_at(s.pid(), "refs/heads/main", ".planbot.toml", 1 << 20)
            .await
            .unwrap();
    assert_eq!(main.unwrap(), b"[plan]\ncheckout = \"head\"\n");
    let absent =
        s.ws.read_file_at(s.pid(), "refs/heads/main", "nope.toml", 1 << 20)
            .await
            .unwrap();
    assert!(absent.is_none());
    assert!(s
        .ws
        .read_file_at(
            s.pid(),
            "refs/heads/missing-branch",
            ".planbot.toml",
            1 << 20
        )
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn leftover_checkouts_are_wiped_at_start_up_and_the_mirror_prunes_them() {
    let s = story();
    s.sync().await;
    let sha = s.ws.branch_head(s.pid(), "main").await.unwrap().unwrap();
    let co = s.ws.checkout(s.pid(), &sha).await.unwrap();
    let path = co.path().to_path_buf();
    std::mem::forget(co); // a crash: Drop never ran
    assert!(path.exists());
    s.ws.wipe_checkouts().unwrap();
    assert!(!path.exists());
    s.sync().await; // prunes the worktree record
    let list = std::process::Command::new("git")
        .arg("-C")
        .arg(s.ws.mirror_path(s.pid()))
        .args(["worktree", "list", "--porcelain"])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(!list.contains(path.to_str().unwrap()), "{list}");
    // A short SHA or a branch name is not an exact commit.
    assert!(s
        .ws
        .checkout(s.pid(), &CommitSha("main".into()))
        .await
        .is_err());
}

#[tokio::test]
async fn a_hook_planted_in_the_mirror_never_runs() {
    let s = story();
    let head = s.fake.commit_files(
        &s.project,
        "feature/hook",
        &[("tofu/stacks/core/vm.tf", "# v1\n")],
    );
    s.sync().await;
    // What a provider that escaped once would do: plant hooks in the bare mirror.
    let marker = s.data.path().join("hook-ran");
    let hooks = s.ws.mirror_path(s.pid()).join("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    for hook in [
        "post-checkout",
        "reference-transaction",
        "pre-auto-gc",
        "post-index-change",
    ] {
        let path = hooks.join(hook);
        std::fs::write(
            &path,
            format!("#!/bin/sh\necho {hook} >> '{}'\n", marker.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    s.sync().await;
    let checkout =
        s.ws.checkout(s.pid(), &CommitSha(head.clone()))
            .await
            .unwrap();
    assert!(checkout.path().join("tofu/stacks/core/vm.tf").exists());
    drop(checkout);
    assert!(
        !marker.exists(),
        "a planted hook ran: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
}

#[tokio::test]
async fn a_policy_file_over_its_cap_is_refused_from_its_size_and_never_read() {
    let s = story();
    s.fake.commit_files(
        &s.project,
        "main",
        &[("policies/ok.rego", "package planbot\n")],
    );
    s.fake
        .commit_generated_file(&s.project, "main", "policies/huge.rego", "# x", 64 << 20);
    s.sync().await;
    let err =
        s.ws.read_dir_at(s.pid(), "refs/heads/main", "policies", ".rego", 1 << 20)
            .await
            .expect_err("a 64 MiB policy file is refused");
    let big = err
        .downcast_ref::<planbot::capabilities::workspace::RepoFileTooLarge>()
        .unwrap_or_else(|| panic!("{err:#}"));
    assert_eq!(
        (big.path.as_str(), big.size),
        ("policies/huge.rego", 64 << 20)
    );
    assert_eq!(
        err.to_string(),
        "`policies/huge.rego` is 64 MiB: planbot reads at most 1 MiB of it"
    );
    // Sized from the tree listing: not a byte of it was read (`ok.rego` sorts after it).
    let blobs =
        s.ws.invocations()
            .into_iter()
            .filter(|i| i.argv.iter().any(|a| a == "blob"))
            .count();
    assert_eq!(blobs, 0);
    // The same from `read_file_at`: sized with `cat-file -s`, refused unread.
    let err =
        s.ws.read_file_at(s.pid(), "refs/heads/main", "policies/huge.rego", 1 << 20)
            .await
            .expect_err("refused");
    assert!(err.to_string().contains("is 64 MiB"), "{err:#}");
    assert!(!s
        .ws
        .invocations()
        .iter()
        .any(|i| i.argv.iter().any(|a| a == "blob")));
}

#[tokio::test]
async fn a_merge_request_with_more_files_than_planbot_reads_fails_clearly_without_reading_them() {
    let s = story();
    let names: Vec<String> = (0..400)
        .map(|i| format!("stacks/s{i:04}/main.tf"))
        .collect();
    let files: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "# x\n")).collect();
    s.fake.commit_files(&s.project, "feature/many", &files);
    s.sync().await;
    let base = s.ws.branch_head(s.pid(), "main").await.unwrap().unwrap();
    let head =
        s.ws.branch_head(s.pid(), "feature/many")
            .await
            .unwrap()
            .unwrap();
    // Under the default cap the 400 files are listed.
    assert_eq!(
        s.ws.changed_files(s.pid(), &base, &head)
            .await
            .unwrap()
            .len(),
        400
    );
    // With a cap below their names' size (the default cap stands for an MR of ~300,000 files):
    // a clear error, not a list read whole.
    let capped = Workspace::new(s.data.path(), s.fake.bot_token())
        .unwrap()
        .with_max_output(4096);
    let err = capped
        .changed_files(s.pid(), &base, &head)
        .await
        .expect_err("more than the cap of names");
    assert_eq!(
        err.downcast_ref::<GitOutputTooLarge>(),
        Some(&GitOutputTooLarge {
            what: "diff".into(),
            max: 4096
        }),
        "{err:#}"
    );
    assert!(
        format!("{err:#}").contains("a merge request or directory with that many files is refused"),
        "{err:#}"
    );
    // The same for a directory listed whole (a policy set's): `git ls-tree -r`.
    let err = capped
        .read_dir_at(s.pid(), head.as_str(), "stacks", ".rego", 1024)
        .await
        .expect_err("more than the cap of entries");
    assert_eq!(
        err.downcast_ref::<GitOutputTooLarge>()
            .map(|e| e.what.as_str()),
        Some("ls-tree"),
        "{err:#}"
    );
}
