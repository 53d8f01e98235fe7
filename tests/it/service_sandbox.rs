//! A hostile merge request against the running service: its HCL tries to read planbot's config
//! file, the bot token's secret file, the store and planbot's `/proc/<pid>/environ`, and to
//! use the apply credentials; a root on `main` is replaced by a symlink into `data_dir`. Each
//! attempt fails inside the plan, and no secret reaches the note, the statuses, the run pages,
//! the logs or the store — in clear or reversed, hex or base64. Then the fail-closed path: a
//! machine without Landlock refuses MR plans with a note that says why, unless told otherwise.

use crate::support::fake_gitlab::{FakeGitLab, FakeProject};
use crate::support::service::{token_headers, TestService, WEBHOOK_SECRET};
use crate::support::world::PlanbotConfig;
use base64::Engine as _;
use planbot::core::config::Config;
use planbot::flows::service::server::Options;

const FINGERPRINT_KEY: &str = "fingerprint-key-canary-7d41c0e2";
const APPLY_SECRET: &str = "apply-credential-canary-5be9a3";

const INNOCENT: &str = "resource \"terraform_data\" \"vm\" {\n  input = \"blocky\"\n}\n";

/// planbot's own files, outside `data_dir` as an operator lays them out: the config file and
/// the bot token's secret file.
struct Etc {
    dir: tempfile::TempDir,
}

impl Etc {
    fn config_file(&self) -> std::path::PathBuf {
        self.dir.path().join("planbot.toml")
    }
    fn token_file(&self) -> std::path::PathBuf {
        self.dir.path().join("gitlab-token")
    }
}

/// Write the config file (secrets in it and in a secret file; `edit` varies it) and load it
/// as `serve` does.
fn service_config(
    data: &std::path::Path,
    fake: &FakeGitLab,
    edit: impl FnOnce(PlanbotConfig) -> PlanbotConfig,
) -> (Etc, Config) {
    let etc = Etc {
        dir: tempfile::tempdir().unwrap(),
    };
    std::fs::write(etc.token_file(), fake.bot_token()).unwrap();
    let token_file = format!("\"{}\"", etc.token_file().display());
    let config = PlanbotConfig::serving(fake.url(), "", data)
        .set("", "fingerprint_key", &format!("\"{FINGERPRINT_KEY}\""))
        .unset("gitlab", "token")
        .set("gitlab", "token_file", &token_file)
        .engine(&crate::support::engine())
        .set(
            "engine.apply",
            "env",
            &format!("{{ TF_VAR_apply_secret = \"{APPLY_SECRET}\" }}"),
        );
    let config = edit(config);
    std::fs::write(etc.config_file(), config.text()).unwrap();
    (etc, config.load())
}

/// HCL that tries to read each of `paths` (reversed base64, so a naive scrubber would miss it)
/// and the apply credential; each read that fails says `denied-NAME`.
fn hostile_hcl(paths: &[(&str, String)]) -> String {
    let mut hcl = String::from(
        "variable \"apply_secret\" {\n  default = \"apply-credential-absent\"\n}\n\
         output \"apply\" {\n  value = var.apply_secret\n}\n",
    );
    for (name, path) in paths {
        hcl.push_str(&format!(
            "output \"{name}\" {{\n  value = try(strrev(filebase64(\"{path}\")), \"denied-{name}\")\n}}\n"
        ));
    }
    hcl
}

/// The documented Merge Request Hook payload, pointed at the fake's project and MR.
fn mr_hook(fake: &FakeGitLab, p: &FakeProject, iid: u64, action: &str) -> String {
    fake.merge_request_hook(p, iid, action)
}

fn plan_note(fake: &FakeGitLab, p: &FakeProject, iid: u64) -> Option<String> {
    fake.plan_note(p, iid)
}

/// The service with its workers (no start-up reconciliation: the story delivers the hooks).
async fn start(config: Config) -> TestService {
    let options = Options {
        workers: true,
        reconcile: false,
    };
    TestService::start(config, options).await
}

/// Every form a stolen secret could take on its way out.
fn forms(secret: &str) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(secret);
    vec![
        secret.to_string(),
        secret.chars().rev().collect(),
        hex::encode(secret),
        b64.clone(),
        b64.chars().rev().collect(),
    ]
}

/// Open an MR whose head is `hostile` on top of `main`, deliver the hook, and wait for the
/// plan to end (its commit status final and every job recorded done).
async fn plan_mr(s: &TestService, fake: &FakeGitLab, project: &FakeProject, iid: u64) -> String {
    let head = fake.mr_sha(project, iid);
    let status = s
        .deliver(
            &mr_hook(fake, project, iid, "open"),
            &token_headers("Merge Request Hook", &format!("open-{iid}"), WEBHOOK_SECRET),
        )
        .await;
    assert_eq!(status, 200);
    s.after_job_ends("the plan's final status and recorded end", 180, || async {
        let done = fake.statuses(project, &head).iter().any(|st| {
            st.name == "planbot/plan" && ["success", "failed"].contains(&st.state.as_str())
        });
        done && s.jobs_all_ended().await
    })
    .await;
    plan_note(fake, project, iid).expect("a plan note")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_mr_reads_none_of_planbots_secrets_and_a_symlinked_root_is_refused() {
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(
        &project,
        "main",
        &[
            (
                ".planbot.toml",
                "[[roots]]\nname = \"steal\"\ndir = \"steal\"\n\n\
                 [[roots]]\nname = \"linked\"\ndir = \"linked\"\n",
            ),
            ("steal/main.tf", INNOCENT),
            ("linked/main.tf", INNOCENT),
        ],
    );
    let data = tempfile::tempdir().unwrap();
    let (etc, config) = service_config(data.path(), &fake, |c| c);
    let store = data.path().join("planbot.db");
    let me = std::process::id();
    let hcl = hostile_hcl(&[
        ("config", etc.config_file().display().to_string()),
        ("token", etc.token_file().display().to_string()),
        ("store", store.display().to_string()),
        ("environ", format!("/proc/{me}/environ")),
    ]);
    fake.commit_files(&project, "feature/x", &[("steal/main.tf", &hcl)]);
    fake.commit_changes(
        &project,
        "feature/x",
        &[("linked/main.tf", None)],
        "Replace the root",
    );
    fake.commit_with_mode(
        &project,
        "feature/x",
        "linked",
        "120000",
        &data.path().display().to_string(),
    );
    let iid = fake.open_mr(&project, "feature/x", "main");

    let s = start(config).await;
    let note = plan_mr(&s, &fake, &project, iid).await;

    // Each read failed inside the plan; the apply credential never reached it.
    for name in ["config", "token", "store", "environ"] {
        assert!(note.contains(&format!("denied-{name}")), "{name}:\n{note}");
    }
    assert!(note.contains("apply-credential-absent"), "{note}");
    // The symlinked root is refused with a clear word.
    assert!(
        note.contains("resolves outside the repository checkout"),
        "{note}"
    );

    // No secret anywhere a person or a later job could read it.
    let mut places: Vec<(String, String)> = vec![("note".into(), note.clone())];
    let head = fake.mr_sha(&project, iid);
    for st in fake.statuses(&project, &head) {
        places.push((format!("status {}", st.name), format!("{st:?}")));
    }
    let (code, list) = s.get_text("/runs").await;
    assert_eq!(code, 200);
    places.push(("/runs".into(), list));
    for run in s.app.store.recent_runs(20).await.unwrap() {
        let (code, page) = s.get_text(&format!("/runs/{}", run.id)).await;
        assert_eq!(code, 200);
        places.push((format!("/runs/{}", run.id), page));
    }
    for file in std::fs::read_dir(data.path()).unwrap().flatten() {
        let name = file.file_name().to_string_lossy().into_owned();
        if name.starts_with("planbot.db") {
            let bytes = std::fs::read(file.path()).unwrap();
            places.push((name, String::from_utf8_lossy(&bytes).into_owned()));
        }
    }
    for secret in [
        fake.bot_token(),
        WEBHOOK_SECRET,
        FINGERPRINT_KEY,
        APPLY_SECRET,
    ] {
        for form in forms(secret) {
            for (place, text) in &places {
                assert!(!text.contains(&form), "{secret} (as {form}) is in {place}");
            }
        }
    }
    // The MR's plugin cache is its own: no other MR's plan and no apply reads it, and it is
    // gone when the MR is closed.
    let caches = data.path().join("plugin-cache");
    let own = caches.join(format!("mr/p{}-mr{iid}", project.id));
    assert!(own.is_dir(), "the MR's plan used its own cache");
    let listed: Vec<String> = std::fs::read_dir(caches.join("mr"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, vec![format!("p{}-mr{iid}", project.id)]);
    assert!(
        !caches.join("main").exists(),
        "an MR plan touched the apply's cache"
    );
    fake.close_mr(&project, iid);
    let status = s
        .deliver(
            &mr_hook(&fake, &project, iid, "close"),
            &token_headers("Merge Request Hook", "close", WEBHOOK_SECRET),
        )
        .await;
    assert_eq!(status, 200);
    s.eventually_for("the closed MR's plugin cache to go", 60, || {
        let gone = !own.exists();
        async move { gone }
    })
    .await;
    drop(etc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_landlock_an_mr_plan_is_refused_with_a_note_unless_the_operator_allows_it() {
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(&project, "main", &[("main.tf", INNOCENT)]);
    fake.commit_files(
        &project,
        "feature/a",
        &[("main.tf", &INNOCENT.replace("blocky", "blocky-a"))],
    );
    let a = fake.open_mr(&project, "feature/a", "main");

    // Required (the default) on a machine without it: refused, and the note says why and how.
    let data = tempfile::tempdir().unwrap();
    let (_etc, config) = service_config(data.path(), &fake, |c| {
        c.set("sandbox", "landlock", "\"off\"")
    });
    let s = start(config).await;
    let note = plan_mr(&s, &fake, &project, a).await;
    assert!(
        note.contains("does not run repository code without a sandbox"),
        "{note}"
    );
    assert!(note.contains("[sandbox] required = false"), "{note}");
    assert!(!note.contains("blocky-a"), "the plan ran:\n{note}");
    let head = fake.mr_sha(&project, a);
    assert!(
        fake.statuses(&project, &head)
            .iter()
            .any(|st| st.name == "planbot/plan" && st.state == "failed"),
        "{:?}",
        fake.statuses(&project, &head)
    );
    s.kill().await;

    // The operator accepts planning without a sandbox: it plans, and the note says so.
    fake.commit_files(
        &project,
        "feature/b",
        &[("main.tf", &INNOCENT.replace("blocky", "blocky-b"))],
    );
    let b = fake.open_mr(&project, "feature/b", "main");
    let data = tempfile::tempdir().unwrap();
    let (_etc, config) = service_config(data.path(), &fake, |c| {
        c.set("sandbox", "landlock", "\"off\"")
            .set("sandbox", "required", "false")
    });
    let s = start(config).await;
    let note = plan_mr(&s, &fake, &project, b).await;
    assert!(note.contains("Planned without a sandbox"), "{note}");
    assert!(note.contains("blocky-b"), "the plan did not run:\n{note}");
}

/// The note of an MR plan whose provider (one that runs a program the root names, as
/// `hashicorp/external` does, from the operator's filesystem mirror) runs `probe(port)`, given
/// planbot's own loopback port.
async fn note_of_a_probing_mr(probe: impl Fn(u16) -> String) -> String {
    let mirror = tempfile::tempdir().unwrap();
    let dir = mirror
        .path()
        .join("registry.terraform.io/example/external/1.0.0/linux_amd64");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("terraform-provider-external_v1.0.0");
    std::fs::write(&bin, "#!/bin/sh\nexec sh ./probe.sh\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(&project, "main", &[("main.tf", INNOCENT)]);
    let data = tempfile::tempdir().unwrap();
    let mirror_path = format!("\"{}\"", mirror.path().display());
    let (_etc, config) = service_config(data.path(), &fake, |c| {
        c.set("engine", "provider_mirror", &mirror_path)
    });
    let s = start(config).await;
    let port = url::Url::parse(&s.url("/")).unwrap().port().unwrap();
    fake.commit_files(
        &project,
        "feature/probe",
        &[
            (
                "main.tf",
                "terraform {\n  required_providers {\n    external = { source = \"example/external\" }\n  }\n}\n\
                 provider \"external\" {}\n",
            ),
            ("probe.sh", &probe(port)),
        ],
    );
    let iid = fake.open_mr(&project, "feature/probe", "main");
    plan_mr(&s, &fake, &project, iid).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mr_code_trying_mptcp_to_planbots_own_port_is_refused_and_the_note_says_so() {
    // The MR's program tries MPTCP (which Landlock's TCP rules do not govern) to planbot's own
    // loopback port and reads `/runs`.
    let note = note_of_a_probing_mr(|port| {
        format!(
            r#"exec perl -MSocket -e '$| = 1; socket(S, 2, 1, 262) or do {{ print "socket: $!\n"; exit 1 }}; connect(S, pack_sockaddr_in({port}, inet_aton("127.0.0.1"))) or do {{ print "connect: $!\n"; exit 1 }}; send(S, "GET /runs HTTP/1.0\r\n\r\n", 0); my $l = <S>; print "runs page: $l"; exit 1'
"#
        )
    })
    .await;

    // The program ran and its MPTCP socket was refused; planbot's page was not read.
    assert!(note.contains("socket: Operation not permitted"), "{note}");
    assert!(!note.contains("runs page"), "{note}");
    assert!(!note.contains("HTTP/1."), "{note}");
    // The note says what the sandbox refused and what it allows.
    assert!(note.contains("sandbox refused a connection"), "{note}");
    assert!(note.contains("only TCP"), "{note}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mr_code_opening_a_tcp_listener_is_refused_and_the_note_says_so() {
    // The MR's program calls listen() on a TCP socket it never bound: the kernel would bind it
    // to an ephemeral port of every interface (Landlock does not govern listen()).
    let note = note_of_a_probing_mr(|_| {
        r#"exec perl -MSocket -e '$| = 1; socket(S, 10, 1, 0) or do { print "socket: $!\n"; exit 1 }; listen(S, 5) or do { print "listen: $!\n"; exit 1 }; my ($port) = unpack_sockaddr_in6(getsockname(S)); print "listening on port $port\n"; exit 1'
"#
        .to_string()
    })
    .await;
    assert!(note.contains("listen: Operation not permitted"), "{note}");
    assert!(!note.contains("listening on port"), "{note}");
    assert!(
        note.contains("sandbox refused a listening socket"),
        "{note}"
    );
    assert!(note.contains("only on UNIX sockets"), "{note}");
}
