//! `planbot doctor` run as a user runs it: the real binary, a config file pointing at the fake
//! GitLab and the fake Proxmox, the real engine. Each line says OK or FAIL with the fix, and
//! the exit code is 1 when anything failed.

use crate::support::fake_gitlab::FakeGitLab;
use crate::support::fake_proxmox::{Cluster, FakeProxmox, Fault};
use crate::support::world::PlanbotConfig;
use std::path::Path;
use std::process::Output;

const PVE_TOKEN: &str = "tofu@pve!planbot";
const PVE_SECRET: &str = "d9a4c2b0-5e8f-4a71-93c6-1f2e3d4c5b6a";
const PLAN_TOKEN: &str = "tofu@pve!plan-ro";
const PLAN_SECRET: &str = "0e7b5a9c-2d4f-4b8a-a1c3-9f8e7d6c5b4a";

async fn doctor(config: &Path) -> Output {
    let config = config.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_planbot"))
            .arg("doctor")
            .arg("--config")
            .arg(&config)
            .env_remove("PROXMOX_VE_ENDPOINT")
            .env_remove("PROXMOX_VE_API_TOKEN")
            .env_remove("PM_VE_ENDPOINT")
            .env_remove("PM_VE_API_TOKEN")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// `dir/planbot.toml`: the operator's config for `infra/homelab` and `infra/lab` on `gitlab`,
/// the engine `engine`, then `extra` (whole tables: `[proxmox]`, `[store]`).
fn write_config(dir: &Path, gitlab: &FakeGitLab, engine: &str, extra: &str) -> std::path::PathBuf {
    PlanbotConfig::deployed(gitlab.url(), gitlab.bot_token(), dir)
        .projects(&["infra/homelab", "infra/lab"])
        .set("engine", "binary", &format!("\"{engine}\""))
        .raw(extra)
        .write(dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn everything_in_order_exits_0_and_says_so() {
    let engine = require_engine!();
    let gitlab = FakeGitLab::start();
    let homelab = gitlab.create_project("infra/homelab");
    let lab = gitlab.create_project("infra/lab");
    gitlab.add_member(&homelab, gitlab.bot(), 40);
    gitlab.add_member(&lab, gitlab.bot(), 40);
    for p in [&homelab, &lab] {
        gitlab.add_hook(p, "https://planbot.example.com/webhooks/gitlab", true, true);
    }
    let mut cluster = Cluster::homelab()
        .role("PlanbotDownload", &["Sys.Audit", "Sys.Modify"])
        .token(
            PVE_TOKEN,
            PVE_SECRET,
            &[("/", "PVEAdmin"), ("/", "PlanbotDownload")],
        )
        .token(PLAN_TOKEN, PLAN_SECRET, &[("/", "PVEAuditor")]);
    cluster.storages[0]
        .content
        .extend(["import".to_string(), "snippets".to_string()]);
    let pve = FakeProxmox::start(cluster).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &gitlab,
        &engine.display().to_string(),
        &format!(
            "[proxmox]\nendpoint = \"{}\"\napi_token = \"{PVE_TOKEN}={PVE_SECRET}\"\n\n[proxmox.plan]\napi_token = \"{PLAN_TOKEN}={PLAN_SECRET}\"\n",
            pve.url
        ),
    );
    let out = doctor(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("OK    GitLab token belongs to @planbot-bot"),
        "{stdout}"
    );
    assert!(
        stdout.contains("OK    infra/homelab: @planbot-bot is Maintainer"),
        "{stdout}"
    );
    assert!(
        stdout.contains("OK    infra/lab: webhook → https://planbot.example.com/webhooks/gitlab"),
        "{stdout}"
    );
    assert!(stdout.contains("Engine\n  OK    "), "{stdout}");
    assert!(
        stdout.contains("Proxmox (plan)\n  OK    reachable at"),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("token {PLAN_TOKEN} can read what a plan refreshes (Sys.Audit, VM.Audit, Datastore.Audit), and nothing more")), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "OK    token {PVE_TOKEN} can create VMs and disks and download images on every node"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("INFO  storage local (dir): iso, vztmpl, backup, import, snippets"),
        "{stdout}"
    );
    assert!(stdout.contains("All checks passed."), "{stdout}");
    for secret in [
        PVE_SECRET,
        PLAN_SECRET,
        gitlab.bot_token(),
        "hook-secret-5f3a",
    ] {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "secret leaked:\n{stdout}"
        );
    }
    // Proxmox saw only reads.
    assert!(pve.requests().iter().all(|(m, _)| m == "GET"));
}

#[tokio::test(flavor = "multi_thread")]
async fn every_problem_is_a_fail_line_with_its_fix_and_exit_1() {
    let gitlab = FakeGitLab::start();
    let homelab = gitlab.create_project("infra/homelab");
    let lab = gitlab.create_project("infra/lab");
    gitlab.add_member(&homelab, gitlab.bot(), 20); // Reporter: too low, cannot read hooks
    gitlab.add_member(&lab, gitlab.bot(), 40);
    gitlab.add_hook(
        &lab,
        "https://planbot.example.com/webhooks/gitlab",
        true,
        false,
    );
    let mut cluster = Cluster::homelab().token(
        PVE_TOKEN,
        PVE_SECRET,
        &[("/", "PVEAdmin"), ("/", "PVESysAdmin")],
    );
    cluster.storages.retain(|s| s.id != "nfs-images");
    let pve = FakeProxmox::start(cluster).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &gitlab,
        "/nonexistent/tofu",
        &format!(
            "[proxmox]\nendpoint = \"{}\"\napi_token = \"{PVE_TOKEN}={PVE_SECRET}\"\n",
            pve.url
        ),
    );
    let out = doctor(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(
            "FAIL  infra/homelab: @planbot-bot is Reporter, planbot needs Developer or more"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "fix: In infra/homelab → Manage → Members, give @planbot-bot the Developer role."
        ),
        "{stdout}"
    );
    assert!(stdout.contains("FAIL  infra/lab: the webhook → https://planbot.example.com/webhooks/gitlab misses \"Comments\""), "{stdout}");
    assert!(
        stdout
            .contains("FAIL  engine binary not found: /nonexistent/tofu is not an executable file"),
        "{stdout}"
    );
    assert!(stdout.contains("Proxmox (plan and apply)"), "{stdout}");
    assert!(stdout.contains(&format!("FAIL  token {PVE_TOKEN} lacks what a typical apply needs: Sys.Audit + Sys.Modify on / (or Sys.AccessNetwork on /nodes/pve01, /nodes/pve02)")), "{stdout}");
    assert!(
        stdout.contains("pveum role add PlanbotDownload --privs 'Sys.Audit,Sys.Modify'"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "pveum acl modify / --tokens '{PVE_TOKEN}' --roles PlanbotDownload"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("INFO  no enabled directory storage allows content type \"import\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("fix: pvesm set local --content iso,vztmpl,backup,import"),
        "{stdout}"
    );
    assert!(!stdout.contains(PVE_SECRET));
    let pve_port = url::Url::parse(&pve.url).unwrap().port().unwrap();
    let stdout = stdout
        .replace(gitlab.url(), "http://GITLAB")
        .replace(&pve.url, "http://PVE/")
        .replace(&format!("443, {pve_port})"), "443, PVE_PORT)")
        .replace(&format!("127.0.0.1:{pve_port} "), "PVE:PVE_PORT ");
    let stdout = stdout.replace(&config.display().to_string(), "planbot.toml");
    let stdout = stdout.replace(&dir.path().display().to_string(), "/TMP");
    // The per-run cgroup line names this host's cgroup directories (or why it has none).
    let cgroups = match planbot::capabilities::engine::CgroupSupport::probe() {
        planbot::capabilities::engine::CgroupSupport::Unavailable { reason } => reason,
        s => s.describe(),
    };
    let stdout = stdout.replace(&cgroups, "CGROUPS");
    insta::assert_snapshot!(stdout);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_proxmox_token_and_no_proxmox_at_all() {
    let gitlab = FakeGitLab::start();
    let pve =
        FakeProxmox::start(Cluster::homelab().token(PVE_TOKEN, "other", &[("/", "PVEAdmin")]))
            .await;
    pve.with(|c| c.unauthorized_delay = std::time::Duration::from_millis(50));
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &gitlab,
        "terraform",
        &format!(
            "[proxmox]\nendpoint = \"{}\"\napi_token = \"{PVE_TOKEN}={PVE_SECRET}\"\n",
            pve.url
        ),
    );
    let out = doctor(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "FAIL  the token {PVE_TOKEN} is refused (401 invalid token value!)"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("fix: Check the token id and secret (pveum user token list tofu@pve)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("FAIL  infra/homelab: the bot cannot see this project"),
        "{stdout}"
    );
    assert!(!stdout.contains(PVE_SECRET));

    let config = write_config(dir.path(), &gitlab, "terraform", "");
    let out = doctor(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("SKIP  no Proxmox endpoint configured: the preflight is skipped"),
        "{stdout}"
    );
}

/// The `pveum`/`pvesm` lines of doctor's fixes, as a user would copy them from the terminal.
fn pasteable(stdout: &str) -> String {
    stdout
        .lines()
        .map(|l| l.trim().trim_start_matches("fix: "))
        .filter(|l| l.starts_with("pveum ") || l.starts_with("pvesm "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn doctors_pasted_fixes_make_the_apply_token_ok_and_agree_with_the_preflight() {
    let engine = require_engine!();
    let gitlab = FakeGitLab::start();
    let mut cluster = Cluster::homelab().token(
        PVE_TOKEN,
        PVE_SECRET,
        &[("/", "PVEAuditor"), ("/storage/local", "PVEDatastoreUser")],
    );
    cluster.storages[0].content.push("import".into());
    let pve = FakeProxmox::start(cluster).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &gitlab,
        &engine.display().to_string(),
        &format!(
            "[proxmox]\nendpoint = \"{}\"\napi_token = \"{PVE_TOKEN}={PVE_SECRET}\"\n",
            pve.url
        ),
    );
    let ok_line = format!(
        "OK    token {PVE_TOKEN} can create VMs and disks and download images on every node"
    );
    let out = doctor(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        stdout.contains(&format!(
            "FAIL  token {PVE_TOKEN} lacks what a typical apply needs"
        )),
        "{stdout}"
    );
    assert!(!stdout.contains(&ok_line), "{stdout}");
    let fix = pasteable(&stdout);

    // The preflight asks for the same role to download to `local` (one definition).
    let plan = planbot::core::plan::Plan::from_json(
        &std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/plans/bpg/seed_debian_qcow2_import.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let ep = planbot::capabilities::proxmox::ProxmoxEndpoint::new(
        &pve.url,
        format!("{PVE_TOKEN}={PVE_SECRET}"),
    );
    let findings = planbot::flows::preflight::preflight(
        &planbot::capabilities::proxmox::Proxmox::new(ep).unwrap(),
        &plan,
    )
    .await
    .unwrap();
    let templates =
        "pveum role add PlanbotTemplates --privs 'Datastore.AllocateTemplate,Datastore.Audit'";
    assert!(fix.contains(templates), "{fix}");
    assert!(
        findings.iter().any(|f| f.fix.contains(templates)),
        "{findings:#?}"
    );

    pve.with(|c| c.paste(&fix)).unwrap();
    let out = doctor(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        stdout.contains(&ok_line),
        "after pasting:\n{fix}\n\n{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxmox_read_that_fails_is_a_fail_line_not_an_ok_from_nothing() {
    let gitlab = FakeGitLab::start();
    let pve = FakeProxmox::start(Cluster::homelab().token(
        PVE_TOKEN,
        PVE_SECRET,
        &[("/", "Administrator")],
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &gitlab,
        "terraform",
        &format!(
            "[proxmox]\nendpoint = \"{}\"\napi_token = \"{PVE_TOKEN}={PVE_SECRET}\"\n",
            pve.url
        ),
    );
    let ok_line = format!(
        "OK    token {PVE_TOKEN} can create VMs and disks and download images on every node"
    );
    let out = doctor(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(stdout.contains(&ok_line), "{stdout}");

    pve.with(|c| {
        c.faults.insert(
            "/storage".into(),
            Fault::Status(
                500,
                "cfs-lock 'file-storage_cfg' error: got lock timeout".into(),
            ),
        )
    });
    let out = doctor(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL  could not read GET /storage: the Proxmox API answered 500 cfs-lock"),
        "{stdout}"
    );
    assert!(!stdout.contains(&ok_line), "{stdout}");
}

/// The `Store` section of doctor's output.
fn store_section(stdout: &str) -> String {
    let start = stdout
        .find("\nStore\n")
        .unwrap_or_else(|| panic!("no Store section:\n{stdout}"));
    let rest = &stdout[start + 1..];
    let end = rest.find("\n\n").unwrap_or(rest.len());
    rest[..end].to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_store_is_read_never_created_and_its_schema_and_replicas_are_shown() {
    let gitlab = FakeGitLab::start();
    let dir = tempfile::tempdir().unwrap();

    // SQLite, before the first start: nothing to read yet, and doctor creates nothing.
    let config = write_config(dir.path(), &gitlab, "terraform", "");
    let out = doctor(&config).await;
    let db = dir.path().join("data/planbot.db");
    assert_eq!(
        store_section(&String::from_utf8_lossy(&out.stdout)),
        format!(
            "Store\n  OK    SQLite store at sqlite://{}\n  INFO  no planbot schema yet: `planbot serve` creates it (version {}) at start-up",
            db.display(),
            planbot::capabilities::store::SCHEMA_VERSION
        )
    );
    assert!(!db.exists(), "doctor created the SQLite store");

    // PostgreSQL: an empty database is read, not migrated.
    let Some(url) = crate::support::postgres::fresh_database("planbot_doctor").await else {
        return;
    };
    let pg = |url: &str| format!("[store]\nurl = \"{url}\"\n");
    let config = write_config(dir.path(), &gitlab, "terraform", &pg(&url));
    let out = doctor(&config).await;
    let known = planbot::capabilities::store::PG_SCHEMA_VERSION;
    let section = store_section(&String::from_utf8_lossy(&out.stdout));
    assert!(
        section.starts_with(&format!(
            "Store\n  OK    PostgreSQL store at {url}: PostgreSQL 15"
        )),
        "{section}"
    );
    assert!(
        section.ends_with(&format!(
            "\n  INFO  no planbot schema yet: `planbot serve` creates it (version {known}) at start-up\n  INFO  no live replica (none has a current heartbeat)"
        )),
        "{section}"
    );
    let client = crate::support::postgres::connect(&url).await;
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0, "doctor created tables");

    // A replica runs: its schema and its name.
    let store_url = planbot::core::config::StoreUrl::parse(&url).unwrap();
    let replica = planbot::capabilities::store::Store::connect_with(
        &store_url,
        None,
        planbot::capabilities::store::PgOptions {
            replica: "pve-planbot-7".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let out = doctor(&config).await;
    let section = store_section(&String::from_utf8_lossy(&out.stdout));
    assert!(
        section.ends_with(&format!(
            "\n  OK    schema version {known}, this planbot's\n  INFO  1 live replica: pve-planbot-7"
        )),
        "{section}"
    );

    // A newer planbot migrated it: this one would not start, and doctor says what to do.
    client
        .execute(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
             VALUES ($1, 'newer', '2030-01-01T00:00:00Z', '0')",
            &[&(known as i32 + 1)],
        )
        .await
        .unwrap();
    let out = doctor(&config).await;
    assert_eq!(out.status.code(), Some(1));
    let section = store_section(&String::from_utf8_lossy(&out.stdout));
    assert!(
        section.contains(&format!(
            "  FAIL  schema version {}, newer than this planbot knows (up to {known}): a newer planbot wrote it, and this one will not start on it\n        fix: Run the planbot version the other replicas run",
            known + 1
        )),
        "{section}"
    );
    drop(replica);

    // A database that does not exist: the server's reason, and what to check.
    let mut missing = url::Url::parse(&url).unwrap();
    missing.set_path("/planbot_doctor_no_such_database");
    let config = write_config(dir.path(), &gitlab, "terraform", &pg(missing.as_str()));
    let out = doctor(&config).await;
    let section = store_section(&String::from_utf8_lossy(&out.stdout));
    assert!(
        section.contains("database \"planbot_doctor_no_such_database\" does not exist"),
        "{section}"
    );
    assert!(
        section.contains("fix: Check store.url, the password (store.password_file"),
        "{section}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sandbox_line_names_the_namespaces_and_fails_or_warns_without_them() {
    let engine = require_engine!();
    let gitlab = FakeGitLab::start();
    let dir = tempfile::tempdir().unwrap();
    let line = |stdout: &str| {
        stdout
            .lines()
            .find(|l| l.contains("engine sandbox") || l.contains("without a sandbox"))
            .unwrap_or_else(|| panic!("no sandbox line:\n{stdout}"))
            .to_string()
    };
    // This kernel allows them: OK, with the limits.
    let config = write_config(dir.path(), &gitlab, engine.to_str().unwrap(), "");
    let out = doctor(&config).await;
    let ok = line(&String::from_utf8_lossy(&out.stdout));
    assert!(ok.trim_start().starts_with("OK"), "{ok}");
    assert!(ok.contains("user, mount and PID namespaces"), "{ok}");
    assert!(ok.contains("4096 tasks"), "{ok}");

    // Without them and required (the default): FAIL, and nothing runs.
    let config = write_config(
        dir.path(),
        &gitlab,
        engine.to_str().unwrap(),
        "[sandbox]\nnamespaces = \"off\"\n",
    );
    let out = doctor(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let fail = line(&stdout);
    assert!(fail.trim_start().starts_with("FAIL"), "{stdout}");
    assert!(fail.contains("namespaces switched off"), "{fail}");
    assert_eq!(out.status.code(), Some(1));

    // Without them, allowed by the operator: WARN, saying what is left open.
    let config = write_config(
        dir.path(),
        &gitlab,
        engine.to_str().unwrap(),
        "[sandbox]\nnamespaces = \"off\"\nrequired = false\n",
    );
    let out = doctor(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let warn = line(&stdout);
    assert!(warn.trim_start().starts_with("WARN"), "{stdout}");
    assert!(warn.contains("UNIX sockets"), "{warn}");
}

/// The lines of one section of doctor's output (from its heading to the next blank line).
fn section<'a>(stdout: &'a str, heading: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_state_and_module_token_is_checked_for_the_role_it_needs_and_no_more() {
    use crate::support::fake_gitlab::{DEVELOPER, MAINTAINER, REPORTER};
    let engine = require_engine!();
    let gitlab = FakeGitLab::start();
    let homelab = gitlab.create_project("infra/homelab");
    let lab = gitlab.create_project("infra/lab");
    let modules = gitlab.create_project("infra/modules");
    gitlab.remove_member(&modules, gitlab.bot());
    // The right tokens: a Developer reads, a Maintainer writes, a Reporter fetches modules.
    let reader = gitlab.create_user("state-reader");
    let writer = gitlab.create_user("state-writer");
    let fetcher = gitlab.member_with_role(&modules, "modules-reader", REPORTER);
    for p in [&homelab, &lab] {
        gitlab.add_member(p, &reader, DEVELOPER);
        gitlab.add_member(p, &writer, MAINTAINER);
    }
    let dir = tempfile::tempdir().unwrap();
    let tokens = |plan: &str, apply: &str, module: &str| {
        format!(
            "[state]\ndefault = \"gitlab\"\n[state.plan]\ntoken = \"{plan}\"\n[state.apply]\ntoken = \"{apply}\"\n\
             [modules]\nprojects = [\"infra/modules\"]\n[modules.plan]\ntoken = \"{module}\"\n"
        )
    };
    let config = write_config(
        dir.path(),
        &gitlab,
        &engine.display().to_string(),
        &tokens(&reader.token, &writer.token, &fetcher.token),
    );
    let out = doctor(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines = section(&stdout, "State and modules");
    assert_eq!(
        lines,
        [
            "  OK    infra/homelab: [state.plan] token (@state-reader, Developer) reads the state; MR plans never lock it",
            "  OK    infra/lab: [state.plan] token (@state-reader, Developer) reads the state; MR plans never lock it",
            "  WARN  [state.plan] token (@state-reader) reads the state of 2 projects (infra/homelab, infra/lab): MR code never holds it (planbot's state gate lets a plan read only its own project's states), but whoever reads the token file can read them all",
            "        fix: Keep the token file readable by planbot alone; to narrow the token itself, give each project's state its own planbot (a project access token each).",
            "  OK    infra/homelab: [state.apply] token (@state-writer, Maintainer) locks and writes the state",
            "  OK    infra/lab: [state.apply] token (@state-writer, Maintainer) locks and writes the state",
            "  OK    [modules.plan] token (@modules-reader) can fetch infra/modules over git",
        ],
        "{stdout}"
    );
    let network = section(&stdout, "Network");
    let port = url::Url::parse(gitlab.url()).unwrap().port().unwrap();
    assert_eq!(
        network,
        [format!(
            "  OK    the engine may connect to 127.0.0.1:{port} (modules from GitLab, gitlab.url)"
        )],
        "{stdout}"
    );

    // Swapped tokens, a module token that cannot read the modules, and a state backend of
    // the engine's environment on a port the sandbox blocks: each a FAIL with its fix.
    let outsider = gitlab.create_user("outsider");
    let extra = format!(
        "{}\n[engine.env]\nTF_HTTP_ADDRESS = \"http://127.0.0.1:9/state\"\n",
        tokens(&writer.token, &reader.token, &outsider.token)
    );
    let config = write_config(dir.path(), &gitlab, &engine.display().to_string(), &extra);
    let out = doctor(&config).await;
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines = section(&stdout, "State and modules").join("\n");
    assert!(lines.contains("FAIL  infra/homelab: [state.plan] token (@state-writer) is Maintainer: more than MR plans need, and MR authors can read it"), "{lines}");
    assert!(
        lines.contains("fix: Use a token with the Developer role for [state.plan]"),
        "{lines}"
    );
    assert!(lines.contains("FAIL  infra/lab: [state.apply] token (@state-reader) is Developer: GitLab lets only Maintainers lock and write the state"), "{lines}");
    assert!(
        lines.contains(
            "fix: In infra/lab → Manage → Members, give @state-reader the Maintainer role"
        ),
        "{lines}"
    );
    assert!(
        lines.contains("FAIL  [modules.plan] token (@outsider) cannot fetch infra/modules"),
        "{lines}"
    );
    let network = section(&stdout, "Network").join("\n");
    assert!(
        network.contains("FAIL  the engine's sandbox blocks 127.0.0.1:9 (a server the engine's environment names, engine.env.TF_HTTP_ADDRESS)")
            && network.contains("fix: [sandbox] connect_ports = [9, 443]"),
        "{network}"
    );
    for secret in [
        &reader.token,
        &writer.token,
        &fetcher.token,
        &outsider.token,
    ] {
        assert!(
            !stdout.contains(secret.as_str()),
            "a token in doctor's output"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_proxmox_endpoint_names_its_own_port_in_the_fix() {
    // A port nothing listens on (bound, then closed), not Proxmox's default 8006.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gitlab = FakeGitLab::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &gitlab,
        "terraform",
        &format!(
            "[proxmox]\nendpoint = \"https://127.0.0.1:{port}/\"\napi_token = \"{PVE_TOKEN}={PVE_SECRET}\"\n"
        ),
    );
    let out = doctor(&config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("that this host can reach its port {port}.")),
        "{stdout}"
    );
    assert!(!stdout.contains("port 8006"), "{stdout}");
}

/// GitLab does not answer: each token that needs GitLab to be checked says "not checked", with
/// no claim that GitLab refused it and no advice to make new tokens.
#[tokio::test(flavor = "multi_thread")]
async fn with_gitlab_unreachable_every_token_check_says_not_checked() {
    let engine = require_engine!();
    let dir = tempfile::tempdir().unwrap();
    let dead = crate::support::service::dead_url();
    let config = PlanbotConfig::deployed(&dead, "glpat-bot-token-0123456789", dir.path())
        .projects(&["infra/homelab"])
        .set("engine", "binary", &format!("\"{}\"", engine.display()))
        .raw(
            "[state]\ndefault = \"gitlab\"\n[state.plan]\ntoken = \"glpat-reader-0123456789\"\n\
             [state.apply]\ntoken = \"glpat-writer-0123456789\"\n\
             [modules]\nprojects = [\"infra/modules\"]\n[modules.plan]\ntoken = \"glpat-fetch-0123456789\"\n",
        )
        .write(dir.path());
    let out = doctor(&config).await;
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        section(&stdout, "GitLab")
            .join("\n")
            .contains(&format!("FAIL  GitLab not reachable at {dead}")),
        "{stdout}"
    );
    let lines = section(&stdout, "State and modules").join("\n");
    for setting in ["state.plan", "state.apply", "modules.plan"] {
        assert!(
            lines.contains(&format!(
                "SKIP  [{setting}] not checked: GitLab unreachable at {dead}"
            )),
            "{lines}"
        );
    }
    assert!(
        !lines.contains("refused") && !lines.contains("Create"),
        "a token blamed for GitLab's silence:\n{lines}"
    );
}
