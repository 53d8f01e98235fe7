//! An operator's first day, as the README's five-minute start tells it: from an empty
//! directory beside the clone, the starting config, the secrets (pasted on a terminal, each
//! ended with Ctrl-D), `serve --check`, `serve`, a merge request's webhook from the fake GitLab,
//! the plan note, `planbot doctor`, then the merge and the apply job as the CI template planbot
//! serves runs it, to `planbot: apply succeeded` and the state in GitLab — each command of the
//! README run as written, by bash, with the planbot just built and the engine (by its own name,
//! found as `planbot plan` finds it) on `PATH`.

use crate::support::fake_gitlab::{FakeGitLab, FakeJob, DEVELOPER, MAINTAINER};

const MAIN_TF: &str = "resource \"terraform_data\" \"vm\" {\n  input = \"blocky\"\n}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_first_day_runs_as_written_from_an_empty_directory_to_an_apply() {
    let engine = require_engine!();
    // GitLab: the bot (Maintainer, so doctor can read the webhook), the two state tokens' users
    // (a Developer reads, a Maintainer writes), and an MR to plan of a root with no backend block.
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.add_member(&project, fake.bot(), MAINTAINER);
    let reader = fake.member_with_role(&project, "state-reader", DEVELOPER);
    let writer = fake.member_with_role(&project, "state-writer", MAINTAINER);
    let alice = fake.member_with_role(&project, "alice", MAINTAINER);
    fake.commit_files(&project, "main", &[("main.tf", MAIN_TF)]);
    fake.commit_files(
        &project,
        "feature/vm",
        &[("main.tf", &MAIN_TF.replace("blocky", "blocky-v2"))],
    );
    let iid = fake.open_mr(&project, "feature/vm", "main");

    // The clone (`planbot/`) and an empty directory beside it.
    let root = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_MANIFEST_DIR"), root.path().join("planbot")).unwrap();
    let here = root.path().join("first-day");
    std::fs::create_dir(&here).unwrap();
    let recipe =
        crate::support::doc_block("README.md", "planbot serve --config planbot.toml --check");
    let lines: Vec<&str> = recipe.lines().collect();
    assert!(lines[0].starts_with("cp ../planbot/deploy/planbot.toml planbot.toml"));
    let export = lines.iter().position(|l| l.starts_with("export ")).unwrap();
    assert_eq!(lines.last(), Some(&"planbot serve --config planbot.toml"));

    // The engine under its own name on `PATH` (`tofu`, else `terraform`), as on a machine that
    // has only that one: the starting config does not name it.
    let bin = here.join(".bin");
    std::fs::create_dir_all(&bin).unwrap();
    let engine_name = match engine.file_name().unwrap().to_string_lossy().as_ref() {
        "terraform" => "terraform",
        _ => "tofu",
    };
    std::os::unix::fs::symlink(&engine, bin.join(engine_name)).unwrap();

    // The copy, then the edits its comment names, and only those: gitlab.url, public_url,
    // projects (already `infra/homelab`), listen (a port of this machine's own). Nothing else:
    // the engine and the state are the starting config's.
    let named: Vec<&str> = lines[0]
        .split_once("# edit:")
        .map(|(_, keys)| keys.split(',').map(str::trim).collect())
        .unwrap_or_default();
    for edited in ["gitlab.url", "public_url", "projects", "listen"] {
        assert!(
            named.contains(&edited),
            "the README's copy line names its edits: {edited} is not among {named:?}"
        );
    }
    crate::support::run_recipe(&here, lines[0], "");
    let config = here.join("planbot.toml");
    let mut toml: toml::Table = std::fs::read_to_string(&config).unwrap().parse().unwrap();
    assert_eq!(
        toml["gitlab"]["projects"][0].as_str(),
        Some("infra/homelab")
    );
    assert_eq!(toml["state"]["default"].as_str(), Some("gitlab"));
    assert!(toml["engine"].get("binary").is_none(), "{toml}");
    crate::support::world::five_minute_edits(
        &mut toml,
        fake.url(),
        "https://planbot.corp.test",
        &["infra/homelab"],
    );
    std::fs::write(&config, toml.to_string()).unwrap();

    // The secrets: each token pasted at its `cat >` and ended with Ctrl-D, in the recipe's order.
    let secrets = lines[1..export].join("\n");
    let pasted: Vec<&str> = secrets
        .lines()
        .filter_map(|l| l.strip_prefix("cat > credentials/"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        pasted,
        ["gitlab-token", "state-plan-token", "state-apply-token"]
    );
    crate::support::run_recipe_pasting(
        &here,
        &secrets,
        &[fake.bot_token(), &reader.token, &writer.token],
    );
    let webhook_secret = std::fs::read_to_string(here.join("credentials/webhook-secret")).unwrap();
    assert_eq!(webhook_secret.trim().len(), 64);
    for (file, token) in [
        ("state-plan-token", &reader.token),
        ("state-apply-token", &writer.token),
    ] {
        let pasted = std::fs::read_to_string(here.join("credentials").join(file)).unwrap();
        assert_eq!(pasted.trim(), token.as_str(), "{file}");
    }

    // `--check` names the engine it found on `PATH`.
    let check = lines
        .iter()
        .find(|l| l.ends_with("--check"))
        .unwrap()
        .to_string();
    let out = crate::support::recipe_command(&here, &format!("{}\n{check}", lines[export]))
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found = format!(
        "- run the engine {} ",
        if engine_name == "tofu" {
            "OpenTofu"
        } else {
            "Terraform"
        }
    );
    assert!(
        report.contains(&found) && report.contains(&format!("/.bin/{engine_name}\n")),
        "{found}:\n{report}"
    );

    // `export ...`, `planbot serve ... --check` (bash -e: it must pass), then `planbot serve`.
    let serve = crate::support::ServeProcess::spawn(crate::support::recipe_command(
        &here,
        &lines[export..].join("\n"),
    ));
    let log = serve.log().join("\n");
    assert!(log.contains("store opened store=sqlite://"), "{log}");
    assert!(
        here.join("data/planbot.db").is_file(),
        "the store is in the data directory the recipe made"
    );

    // "Connect a GitLab project": the webhook to public_url with the secret token; GitLab
    // sends the MR's event (here delivered to the address planbot listens on).
    fake.add_hook(
        &project,
        "https://planbot.corp.test/webhooks/gitlab",
        true,
        true,
    );
    let status = reqwest::Client::new()
        .post(serve.url("/webhooks/gitlab"))
        .header("X-Gitlab-Event", "Merge Request Hook")
        .header("X-Gitlab-Token", webhook_secret.trim())
        .header("content-type", "application/json")
        .body(fake.merge_request_hook(&project, iid, "open"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
    crate::support::eventually("the plan note on the MR", 120, || {
        let note = fake.plan_note(&project, iid);
        async move { note.is_some() }
    })
    .await;
    let head = fake.mr_sha(&project, iid);
    crate::support::eventually("a final planbot/plan status", 120, || {
        let status = fake.status(&project, &head, "planbot/plan");
        async move { status.is_some_and(|s| s.state == "success" || s.state == "failed") }
    })
    .await;
    let note = fake.plan_note(&project, iid).unwrap();
    assert!(note.contains(&head[..8]), "{note}");
    assert!(note.contains("1 root with changes"), "{note}");
    assert!(!note.contains("STATE001"), "{note}");
    let status = fake.status(&project, &head, "planbot/plan").unwrap();
    assert_eq!(status.state, "success", "{status:?}\n{note}");

    // The README's `planbot doctor` step, in the same shell (the same credentials).
    let doctor_step =
        crate::support::doc_block("README.md", "planbot doctor --config planbot.toml");
    let doctor = format!("{}\n{doctor_step}", lines[export]);
    let out = crate::support::recipe_command(&here, &doctor)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for ok in [
        "OK    GitLab token belongs to @planbot-bot",
        "OK    infra/homelab: @planbot-bot is Maintainer",
        "OK    infra/homelab: webhook → https://planbot.corp.test/webhooks/gitlab",
    ] {
        assert!(report.contains(ok), "{ok}:\n{report}");
    }
    // Published at public_url without [gitlab.oauth]: MR authors could not open the run
    // pages the notes point to, and doctor names the one step that fixes it.
    assert!(
        report.contains(
            "WARN  run pages need sign-in: planbot is published at https://planbot.corp.test"
        ),
        "{report}"
    );
    assert!(
        report.contains("redirect URI https://planbot.corp.test/auth/callback"),
        "{report}"
    );
    assert!(!report.contains(fake.bot_token()), "{report}");

    // Step 5: the apply job of the CI template planbot serves, merged, clicked. The runner runs
    // its script with `sh`, the job's token and the job's PLANBOT_URL (planbot's address here,
    // as GitLab's webhook above).
    let template = reqwest::get(serve.url("/ci/planbot.gitlab-ci.yml"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // GitLab's `include: remote` with no inputs: each `$[[ inputs.NAME ]]` is its default.
    let (spec, jobs) = template.split_once("\n---\n").unwrap();
    let spec: serde_yaml::Value = serde_yaml::from_str(spec).unwrap();
    let mut jobs = jobs.to_string();
    for (name, decl) in spec["spec"]["inputs"].as_mapping().unwrap() {
        let default = decl["default"]
            .as_str()
            .expect("planbot fills in every input");
        jobs = jobs.replace(
            &format!("$[[ inputs.{} ]]", name.as_str().unwrap()),
            default,
        );
    }
    let jobs: serde_yaml::Value = serde_yaml::from_str(&jobs).unwrap();
    let job = &jobs["planbot-apply"];
    assert_eq!(
        job["variables"]["PLANBOT_URL"].as_str(),
        Some("https://planbot.corp.test")
    );
    let script = job["script"][0].as_str().unwrap().to_string();
    fake.merge_mr(&project, iid, Some(&alice));
    let sha = fake.branch_head(&project, "main").unwrap();
    fake.register_job(FakeJob {
        token: "glcbt-first-day-apply".into(),
        id: 501,
        name: "planbot-apply".into(),
        status: "running".into(),
        ref_: "main".into(),
        tag: false,
        user: Some(alice.clone()),
        pipeline_id: 1501,
        project_id: project.id,
        sha,
    });
    let job_dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(script)
        .current_dir(job_dir.path())
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("PLANBOT_URL", serve.url(""))
        .env("CI_JOB_TOKEN", "glcbt-first-day-apply");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let job_log = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{job_log}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        job_log.lines().last(),
        Some("planbot: apply succeeded"),
        "{job_log}"
    );
    // The state is in the project's GitLab-managed Terraform state: read with the plan token,
    // locked and written with the apply token.
    // (`planbot doctor` read a probe state of its own: it checked the plan token.)
    let requests: Vec<_> = fake
        .state_requests()
        .into_iter()
        .filter(|r| r.name != "planbot-doctor-probe")
        .collect();
    // The root of a repository without `.planbot.toml` is `default`: so is its state.
    assert!(
        !requests.is_empty() && requests.iter().all(|r| r.name == "default"),
        "{requests:?}"
    );
    let (state, lock) = fake.terraform_state(&project, "default");
    let state = String::from_utf8(state.expect("the apply wrote the state")).unwrap();
    assert!(state.contains("blocky-v2"), "{state}");
    assert!(lock.is_none(), "the lock is released");
    assert!(
        requests.iter().any(|r| r.method == "POST"
            && r.target == "state"
            && r.user.as_deref() == Some("state-writer")),
        "{requests:?}"
    );
    let log = serve.stop().join("\n");
    assert!(log.contains("note posted"), "{log}");
    // Nothing a reader of this log would look into: no warning (the sandbox probe's own
    // refused TCP listen() is no news).
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ")).collect();
    assert!(warnings.is_empty(), "{warnings:#?}");
}

#[test]
fn the_readmes_local_plan_of_the_quickstart_prints_its_note() {
    // Step 2 of the five-minute start, run as written from a copy of the clone's top: the
    // installed planbot and the engine on `PATH`, no GitLab.
    let engine = require_engine!();
    let recipe = crate::support::doc_block("README.md", "planbot plan examples/quickstart");
    assert_eq!(recipe.trim(), "planbot plan examples/quickstart");
    let clone = tempfile::tempdir().unwrap();
    let quickstart = clone.path().join("examples/quickstart");
    std::fs::create_dir_all(&quickstart).unwrap();
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quickstart");
    for entry in std::fs::read_dir(&example).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, quickstart.join(path.file_name().unwrap())).unwrap();
        }
    }
    // The engine under its own name, where `planbot plan` looks for it (`tofu`, else `terraform`).
    let bin = clone.path().join(".bin");
    std::fs::create_dir_all(&bin).unwrap();
    let name = engine.file_name().unwrap().to_string_lossy().into_owned();
    let name = if name == "terraform" {
        "terraform"
    } else {
        "tofu"
    };
    std::os::unix::fs::symlink(&engine, bin.join(name)).unwrap();
    let note = crate::support::run_recipe(clone.path(), &recipe, "");
    assert!(note.contains("plan for a local run"), "{note}");
    // docs/workflow.md's sample of this output has its headline (the quickstart's local state
    // is the STATE001 warning: 🟡).
    let sample = crate::support::doc_block("docs/workflow.md", "...");
    let headline = sample
        .lines()
        .find(|l| l.contains("plan for a local run"))
        .unwrap();
    let headline = headline.trim_start_matches('#').trim();
    assert!(note.contains(headline), "{headline}\n{note}");
    assert!(note.contains("1 root with changes"), "{note}");
    assert!(note.contains("quickstart"), "{note}");
    assert!(!note.contains("quickstart-not-a-real-secret"), "{note}");
}
