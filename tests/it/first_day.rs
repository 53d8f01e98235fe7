//! An operator's first day, as the README's five-minute start tells it: from an empty
//! directory beside the clone, the starting config, the secrets, `serve --check`, `serve`, a
//! merge request's webhook from the fake GitLab, the plan note, and `planbot doctor` — each
//! command of the README run as written, by bash, with the planbot just built on `PATH`.

use crate::support::fake_gitlab::{FakeGitLab, MAINTAINER};

const MAIN_TF: &str = "resource \"terraform_data\" \"vm\" {\n  input = \"blocky\"\n}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_first_day_runs_as_written_from_an_empty_directory_to_a_plan_note() {
    let engine = require_engine!();
    // GitLab: the bot (Maintainer, so doctor can read the webhook) and an MR to plan.
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.add_member(&project, fake.bot(), MAINTAINER);
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

    // The copy, then the edit its comment asks for: gitlab.url, public_url, projects (already
    // `infra/homelab`); and, for this machine, the engine it has and a port of its own.
    crate::support::run_recipe(&here, lines[0], "");
    let config = here.join("planbot.toml");
    let mut toml: toml::Table = std::fs::read_to_string(&config).unwrap().parse().unwrap();
    assert_eq!(
        toml["gitlab"]["projects"][0].as_str(),
        Some("infra/homelab")
    );
    toml["gitlab"]["url"] = fake.url().into();
    toml["public_url"] = "https://planbot.corp.test".into();
    toml["listen"] = "127.0.0.1:0".into();
    toml["engine"]["binary"] = engine.display().to_string().into();
    std::fs::write(&config, toml.to_string()).unwrap();

    // The secrets (the bot's token pasted at the prompt).
    crate::support::run_recipe(&here, &lines[1..export].join("\n"), fake.bot_token());
    let webhook_secret = std::fs::read_to_string(here.join("credentials/webhook-secret")).unwrap();
    assert_eq!(webhook_secret.trim().len(), 64);

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
    let note = fake.plan_note(&project, iid).unwrap();
    let head = fake.mr_sha(&project, iid);
    assert!(note.contains(&head[..8]), "{note}");
    assert!(note.contains("1 root with changes"), "{note}");

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
    assert!(!report.contains(fake.bot_token()), "{report}");
    let log = serve.stop().join("\n");
    assert!(log.contains("note posted"), "{log}");
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
    assert!(note.contains("1 root with changes"), "{note}");
    assert!(note.contains("quickstart"), "{note}");
    assert!(!note.contains("quickstart-not-a-real-secret"), "{note}");
}
