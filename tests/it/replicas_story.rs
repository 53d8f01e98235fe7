//! Three `planbot serve` processes on one PostgreSQL, one fake GitLab: deliveries land on any
//! replica (duplicates included) and every MR still ends with one note for its last head; a
//! replica's plan is stopped from another replica; a replica SIGKILLed mid-plan leaves its job
//! to another, and so does one stopped with SIGTERM; two apply jobs on two replicas apply one
//! after the other, once; a replica goes unready when a newer planbot migrates the store under
//! it; a push taken by another replica reuses the plans the first one kept.
//!
//! Needs PostgreSQL (the server `PLANBOT_TEST_POSTGRES_URL` names, else one the tests start) and the
//! engine: without either these tests fail (under `CI=true` always).

use crate::support::fake_gitlab::{FakeGitLab, FakeJob, FakeProject, FakeUser, MAINTAINER};
use crate::support::service::{token_headers, WEBHOOK_SECRET};
use crate::support::world::PlanbotConfig;
use planbot::core::render::NOTE_MARKER;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Child;

const INFRA: &str = "infra/homelab";
/// The replicas' lease: short, so that "a replica died" is noticed in seconds.
const LEASE: &str = "2s";

/// One `planbot serve` process.
struct Replica {
    child: Child,
    port: u16,
    data: PathBuf,
    /// Its log, when it was started with one ([`Replicas::start_logging`]).
    log: Option<crate::support::ServeLog>,
}

/// N replicas sharing one store; all killed (with their engines) when dropped.
struct Replicas {
    list: Vec<Replica>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Replicas {
    /// Start `n` replicas, each with its own data dir and the config `config(data_dir)`.
    fn start(n: usize, config: impl Fn(&Path) -> String) -> Replicas {
        let dir = tempfile::tempdir().unwrap();
        let list = (0..n)
            .map(|i| {
                let data = dir.path().join(format!("replica-{i}"));
                let file = dir.path().join(format!("replica-{i}.toml"));
                std::fs::write(&file, config(&data)).unwrap();
                let (child, port) = crate::support::spawn_serve(&file);
                Replica {
                    child,
                    port,
                    data,
                    log: None,
                }
            })
            .collect();
        Replicas {
            list,
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    /// [`Replicas::start`], the processes started all at once (as an orchestrator starts a
    /// deployment's pods), each waited for on its own thread.
    fn start_at_once(n: usize, config: impl Fn(&Path) -> String) -> Replicas {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<(PathBuf, PathBuf)> = (0..n)
            .map(|i| {
                let data = dir.path().join(format!("replica-{i}"));
                let file = dir.path().join(format!("replica-{i}.toml"));
                std::fs::write(&file, config(&data)).unwrap();
                (data, file)
            })
            .collect();
        let list = std::thread::scope(|scope| {
            let started: Vec<_> = files
                .iter()
                .map(|(_, file)| scope.spawn(|| crate::support::spawn_serve(file)))
                .collect();
            started
                .into_iter()
                .zip(&files)
                .map(|(t, (data, _))| {
                    let (child, port) = t.join().unwrap();
                    Replica {
                        child,
                        port,
                        data: data.clone(),
                        log: None,
                    }
                })
                .collect()
        });
        Replicas {
            list,
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    /// [`Replicas::start`], each replica logging what its plans do (`RUST_LOG`: the plan
    /// flow's lines at `info`).
    fn start_logging(n: usize, config: impl Fn(&Path) -> String) -> Replicas {
        let dir = tempfile::tempdir().unwrap();
        let list = (0..n)
            .map(|i| {
                let data = dir.path().join(format!("replica-{i}"));
                let file = dir.path().join(format!("replica-{i}.toml"));
                std::fs::write(&file, config(&data)).unwrap();
                let filter = "warn,planbot::flows::service=info,planbot::flows::review::plan=info";
                let serve = crate::support::ServeProcess::start(&file, &[("RUST_LOG", filter)]);
                let (child, port, log) = serve.into_parts();
                Replica {
                    child,
                    port,
                    data,
                    log: Some(log),
                }
            })
            .collect();
        Replicas {
            list,
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    /// The lines replica `i` logged so far (started by [`Replicas::start_logging`]).
    fn log(&self, i: usize) -> Vec<String> {
        let log = self.list[i].log.as_ref().expect("started logging");
        log.lock().unwrap().clone()
    }

    fn url(&self, i: usize, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.list[i].port)
    }

    /// The index of the replica whose store name (`<host>-<pid>-<random>`) is `owner`.
    fn index_of(&self, owner: &str) -> usize {
        self.list
            .iter()
            .position(|r| owner.contains(&format!("-{}-", r.child.id())))
            .unwrap_or_else(|| panic!("no replica is {owner}"))
    }

    /// GitLab delivers `body` (an MR hook) with idempotency key `key` to replica `i`.
    async fn deliver(&self, i: usize, body: &[u8], key: &str) -> u16 {
        deliver_to(&self.http, &self.url(i, "/webhooks/gitlab"), body, key).await
    }

    /// Stop replica `i` as an orchestrator does (SIGTERM) and wait until it has exited.
    async fn stop(&mut self, i: usize) {
        let pid = self.list[i].child.id() as i32;
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let child = &mut self.list[i].child;
        crate::support::eventually("the replica exits after SIGTERM", 60, || {
            let exited = child.try_wait().unwrap().is_some();
            async move { exited }
        })
        .await;
    }

    /// SIGKILL replica `i` and the engine it was running (nothing else would stop that).
    fn kill(&mut self, i: usize) {
        let r = &mut self.list[i];
        r.child.kill().unwrap();
        r.child.wait().unwrap();
        for pid in crate::support::processes_under(&r.data) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for r in &mut self.list {
            let _ = r.child.kill();
            let _ = r.child.wait();
            for pid in crate::support::processes_under(&r.data) {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

async fn deliver_to(http: &reqwest::Client, url: &str, body: &[u8], key: &str) -> u16 {
    let mut req = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_vec());
    for (k, v) in token_headers("Merge Request Hook", key, WEBHOOK_SECRET) {
        req = req.header(k, v);
    }
    req.send()
        .await
        .expect("POST /webhooks/gitlab")
        .status()
        .as_u16()
}

/// A replica's config: the shared store, the fake GitLab, the engine; `state` adds the
/// engine's GitLab-managed state backend (the apply story).
fn replica_config(
    data: &Path,
    store: &str,
    gitlab: &FakeGitLab,
    project: &FakeProject,
    engine: &Path,
    state: bool,
) -> String {
    let gitlab_port = url::Url::parse(gitlab.url()).unwrap().port().unwrap();
    let config = PlanbotConfig::serving(gitlab.url(), gitlab.bot_token(), data)
        .engine(engine)
        .plan_slots(2)
        .sandbox_reaches(gitlab_port)
        .set("store", "url", &format!("\"{store}\""))
        .set("store", "lease", &format!("\"{LEASE}\""));
    let config = if state {
        let writer = gitlab.member_with_role(project, "state-writer", MAINTAINER);
        let address = format!(
            "{}/api/v4/projects/{}/terraform/state/core",
            gitlab.url(),
            project.id
        );
        config.http_backend(&address).set(
            "engine.env",
            "TF_HTTP_PASSWORD",
            &format!("\"{}\"", writer.token),
        )
    } else {
        // GitLab-managed state, as users run it (a root's local state is refused).
        config.managed_state(gitlab, project)
    };
    config.text()
}

/// A root whose only resource holds `input`: every push changes the plan.
fn root_tf(input: &str) -> String {
    format!("resource \"terraform_data\" \"vm\" {{\n  input = \"{input}\"\n}}\n")
}

/// The real engine, with a `plan` slow enough to act on a replica in the middle of it.
fn slow_engine(dir: &Path, real: &Path) -> PathBuf {
    let path = dir.join("slow-engine");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nif [ \"$1\" = plan ]; then sleep 3; fi\nexec {} \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The plan notes on MR `iid` (planbot's, found by their marker).
fn plan_notes(gitlab: &FakeGitLab, project: &FakeProject, iid: u64) -> Vec<String> {
    gitlab
        .notes(project, iid)
        .into_iter()
        .filter(|n| n.body.contains(NOTE_MARKER))
        .map(|n| n.body)
        .collect()
}

fn plan_state(gitlab: &FakeGitLab, project: &FakeProject, sha: &str) -> Option<String> {
    gitlab.status(project, sha, "planbot/plan").map(|s| s.state)
}

/// How many times `planbot/plan` went `running` on `sha` (each start of a plan of that head).
fn plan_starts(gitlab: &FakeGitLab, project: &FakeProject, sha: &str) -> usize {
    gitlab
        .statuses(project, sha)
        .iter()
        .filter(|s| s.name == "planbot/plan" && s.state == "running")
        .count()
}

/// The replica planning `sha`: the owner of its running run (the engine is at work).
async fn planning_replica(db: &tokio_postgres::Client, sha: &str) -> Option<String> {
    db.query_opt(
        "SELECT owner FROM runs WHERE sha = $1 AND state = 'running'",
        &[&sha],
    )
    .await
    .unwrap()
    .map(|r| r.get::<_, String>(0))
}

/// Whether every job in the shared store has ended.
async fn all_jobs_ended(db: &tokio_postgres::Client) -> bool {
    let row = db
        .query_one(
            "SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')",
            &[],
        )
        .await
        .unwrap();
    row.get::<_, i64>(0) == 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pushes_to_twenty_mrs_land_on_random_replicas_and_each_mr_gets_one_note_for_its_last_head()
{
    let engine = require_engine!();
    let Some(store) = crate::support::postgres::fresh_database("planbot_story").await else {
        return;
    };
    let gitlab = FakeGitLab::start();
    let project = gitlab.create_project(INFRA);
    gitlab.commit_files(&project, "main", &[("main.tf", &root_tf("main"))]);
    let replicas = Replicas::start(3, |data| {
        replica_config(data, &store, &gitlab, &project, &engine, false)
    });
    let seed = std::env::var("PLANBOT_STORY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("replica story seed: {seed} (PLANBOT_STORY_SEED={seed} replays it)");
    let mut rng = StdRng::seed_from_u64(seed);

    // Twenty MRs are opened; GitLab tells a random replica about each.
    let mut mrs = Vec::new();
    for m in 0..20 {
        let branch = format!("mr-{m}");
        gitlab.commit_files(
            &project,
            &branch,
            &[("main.tf", &root_tf(&format!("mr{m}-push0")))],
        );
        let iid = gitlab.open_mr(&project, &branch, "main");
        let body = gitlab.mr_webhook(&project, iid).action("open").body();
        let to = rng.gen_range(0..3);
        assert_eq!(replicas.deliver(to, &body, &format!("open-{m}")).await, 200);
        mrs.push((iid, branch, 0usize));
    }

    // Two hundred pushes. Each MR's hooks arrive in order, the MRs' hooks at once, each to a
    // random replica; a quarter are delivered twice (to two replicas), and now and then an old
    // delivery of the MR is retried late (GitLab's retry of a hook it thinks failed).
    let mut last_delivery: BTreeMap<u64, tokio::task::JoinHandle<()>> = BTreeMap::new();
    let mut sent: BTreeMap<u64, Vec<(String, Vec<u8>)>> = BTreeMap::new();
    let mut heads = Vec::new();
    for _ in 0..200 {
        let m = rng.gen_range(0..mrs.len());
        let (iid, branch, pushes) = &mut mrs[m];
        *pushes += 1;
        let old = gitlab.mr_sha(&project, *iid);
        let head = gitlab.push(
            &project,
            branch,
            &[("main.tf", &root_tf(&format!("mr{m}-push{pushes}")))],
        );
        heads.push(head.clone());
        let body = gitlab
            .mr_webhook(&project, *iid)
            .action("update")
            .oldrev(&old)
            .body();
        let key = format!("push-{m}-{pushes}");
        let mut plan: Vec<(usize, String, Vec<u8>)> =
            vec![(rng.gen_range(0..3), key.clone(), body.clone())];
        if rng.gen_bool(0.25) {
            plan.push((rng.gen_range(0..3), key.clone(), body.clone()));
        }
        let history = sent.entry(*iid).or_default();
        if !history.is_empty() && rng.gen_bool(0.1) {
            let (k, b) = history[rng.gen_range(0..history.len())].clone();
            plan.push((rng.gen_range(0..3), k, b));
        }
        history.push((key, body));
        let previous = last_delivery.remove(iid);
        let http = replicas.http.clone();
        let urls: Vec<String> = (0..3)
            .map(|i| replicas.url(i, "/webhooks/gitlab"))
            .collect();
        last_delivery.insert(
            *iid,
            tokio::spawn(async move {
                if let Some(p) = previous {
                    p.await.unwrap();
                }
                for (to, key, body) in plan {
                    assert_eq!(
                        deliver_to(&http, &urls[to], &body, &key).await,
                        200,
                        "{key}"
                    );
                }
            }),
        );
    }
    for (_, d) in last_delivery {
        d.await.unwrap();
    }

    // Every MR ends with exactly one plan note, for its last head, and a green status on it.
    let db = crate::support::postgres::connect(&store).await;
    for (m, (iid, _, pushes)) in mrs.iter().enumerate() {
        let head = gitlab.mr_sha(&project, *iid);
        let (g, p) = (&gitlab, &project);
        crate::support::eventually(&format!("MR !{iid}'s last head planned"), 600, || async {
            plan_state(g, p, &head).is_some_and(|s| s == "success")
        })
        .await;
        let notes = plan_notes(&gitlab, &project, *iid);
        assert_eq!(
            notes.len(),
            1,
            "MR !{iid}: one plan note, not {}",
            notes.len()
        );
        assert!(
            notes[0].contains(&format!("mr{m}-push{pushes}\"")),
            "{}",
            notes[0]
        );
        assert!(
            notes[0].contains(&head[..8]),
            "the note names its head: {}",
            notes[0]
        );
    }
    crate::support::eventually("every job ended", 60, || all_jobs_ended(&db)).await;

    // No head was planned twice: not on GitLab (its status went `running` at most once) ...
    for head in &heads {
        assert!(
            plan_starts(&gitlab, &project, head) <= 1,
            "{head} planned twice"
        );
    }
    // ... nor in the store, whichever replica planned it.
    let twice = db
        .query(
            "SELECT sha, count(*) FROM runs WHERE kind = 'plan' AND state <> 'canceled'
             GROUP BY sha, root HAVING count(*) > 1",
            &[],
        )
        .await
        .unwrap();
    assert!(
        twice.is_empty(),
        "{} heads planned more than once",
        twice.len()
    );
    // Each delivery is stored once, whichever replicas received it.
    let deliveries: i64 = db
        .query_one("SELECT count(*) FROM deliveries", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(deliveries, 20 + 200);
    // The plans were spread over the replicas: nothing in planbot serialises them.
    let owners: i64 = db
        .query_one(
            "SELECT count(DISTINCT owner) FROM runs WHERE kind = 'plan'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(owners >= 2, "plans ran on {owners} replica(s)");

    // A run's page reads the same on every replica, whichever one ran it.
    let (iid, _, pushes) = &mrs[0];
    let head = gitlab.mr_sha(&project, *iid);
    let run: i64 = db
        .query_one(
            "SELECT id FROM runs WHERE kind = 'plan' AND sha = $1 AND state = 'succeeded'",
            &[&head],
        )
        .await
        .unwrap()
        .get(0);
    for i in 0..3 {
        let page = replicas
            .http
            .get(replicas.url(i, &format!("/runs/{run}")))
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200, "replica {i}");
        let page = page.text().await.unwrap();
        assert!(
            page.contains(&format!("mr0-push{pushes}")),
            "replica {i}: {page}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_is_stopped_from_another_replica_and_a_killed_replicas_plan_is_finished_by_another()
{
    let real = require_engine!();
    let Some(store) = crate::support::postgres::fresh_database("planbot_story").await else {
        return;
    };
    let tools = tempfile::tempdir().unwrap();
    let engine = slow_engine(tools.path(), &real);
    let gitlab = FakeGitLab::start();
    let project = gitlab.create_project(INFRA);
    gitlab.commit_files(&project, "main", &[("main.tf", &root_tf("main"))]);
    let mut replicas = Replicas::start(3, |data| {
        replica_config(data, &store, &gitlab, &project, &engine, false)
    });
    let db = crate::support::postgres::connect(&store).await;
    let planning = |sha: String| {
        let db = &db;
        async move { planning_replica(db, &sha).await }
    };

    // The MR's first head is planned by some replica.
    gitlab.commit_files(&project, "vms", &[("main.tf", &root_tf("first"))]);
    let iid = gitlab.open_mr(&project, "vms", "main");
    let first = gitlab.mr_sha(&project, iid);
    let body = gitlab.mr_webhook(&project, iid).action("open").body();
    assert_eq!(replicas.deliver(0, &body, "open").await, 200);
    let (g, p) = (&gitlab, &project);
    crate::support::eventually("a replica planning the first head", 60, || async {
        planning(first.clone()).await.is_some()
    })
    .await;
    assert_eq!(plan_state(g, p, &first).as_deref(), Some("running"));
    let owner = planning(first.clone()).await.unwrap();
    let planner = replicas.index_of(&owner);

    // A push lands on another replica: the plan running on the first one stops.
    let second = gitlab.push(&project, "vms", &[("main.tf", &root_tf("second"))]);
    let body = gitlab
        .mr_webhook(&project, iid)
        .action("update")
        .oldrev(&first)
        .body();
    let other = (planner + 1) % 3;
    assert_eq!(replicas.deliver(other, &body, "push-1").await, 200);
    crate::support::eventually("the first head's plan canceled", 60, || async {
        plan_state(g, p, &first).is_some_and(|s| s == "canceled")
    })
    .await;
    let first_runs = db
        .query("SELECT state, owner FROM runs WHERE sha = $1", &[&first])
        .await
        .unwrap();
    assert_eq!(first_runs.len(), 1);
    assert_eq!(first_runs[0].get::<_, String>(0), "canceled");
    assert_eq!(
        first_runs[0].get::<_, String>(1),
        owner,
        "stopped where it ran"
    );

    // The second head's plan starts somewhere; that replica is SIGKILLed in the middle of it.
    crate::support::eventually("a replica planning the second head", 60, || async {
        planning(second.clone()).await.is_some()
    })
    .await;
    let doomed_owner = planning(second.clone()).await.unwrap();
    let doomed = replicas.index_of(&doomed_owner);
    replicas.kill(doomed);

    // Its lease runs out, and another replica plans the head to the end: one note, green.
    crate::support::eventually(
        "the second head planned by another replica",
        120,
        || async { plan_state(g, p, &second).is_some_and(|s| s == "success") },
    )
    .await;
    let notes = plan_notes(&gitlab, &project, iid);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("\"second\""), "{}", notes[0]);
    taken_over(&db, &replicas, &second, &doomed_owner).await;
}

/// A rolling update drains a replica in the middle of a plan (SIGTERM): it exits, and another
/// replica plans the head once the lease has run out; the MR gets one note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopped_with_sigterm_mid_plan_leaves_the_plan_to_another() {
    let real = require_engine!();
    let Some(store) = crate::support::postgres::fresh_database("planbot_story").await else {
        return;
    };
    let tools = tempfile::tempdir().unwrap();
    let engine = slow_engine(tools.path(), &real);
    let gitlab = FakeGitLab::start();
    let project = gitlab.create_project(INFRA);
    gitlab.commit_files(&project, "main", &[("main.tf", &root_tf("main"))]);
    let mut replicas = Replicas::start(2, |data| {
        replica_config(data, &store, &gitlab, &project, &engine, false)
    });
    let db = crate::support::postgres::connect(&store).await;

    gitlab.commit_files(&project, "vms", &[("main.tf", &root_tf("drained"))]);
    let iid = gitlab.open_mr(&project, "vms", "main");
    let head = gitlab.mr_sha(&project, iid);
    let body = gitlab.mr_webhook(&project, iid).action("open").body();
    assert_eq!(replicas.deliver(0, &body, "open").await, 200);
    let running_owner = || planning_replica(&db, &head);
    crate::support::eventually("a replica planning the head", 60, || async {
        running_owner().await.is_some()
    })
    .await;
    let drained_owner = running_owner().await.unwrap();
    let drained = replicas.index_of(&drained_owner);
    replicas.stop(drained).await;

    let (g, p) = (&gitlab, &project);
    crate::support::eventually("the head planned by the other replica", 120, || async {
        plan_state(g, p, &head).is_some_and(|s| s == "success")
    })
    .await;
    let notes = plan_notes(&gitlab, &project, iid);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("\"drained\""), "{}", notes[0]);
    taken_over(&db, &replicas, &head, &drained_owner).await;
}

/// What the replica `gone` was planning of `sha` was finished by another: `gone`'s run
/// interrupted, the other's succeeded. `gone` ran either the plan job (then another replica
/// took the job over: two attempts) or the root's unit (then, once its lease ran out, the plan
/// job took it back, or a third replica's idle worker claimed it).
async fn taken_over(db: &tokio_postgres::Client, replicas: &Replicas, sha: &str, gone: &str) {
    // The status goes green before the worker records the job's end.
    crate::support::eventually("every job ended", 60, || all_jobs_ended(db)).await;
    let job = db
        .query_one(
            "SELECT state, attempts, owner FROM jobs WHERE kind = 'plan' AND sha = $1",
            &[&sha],
        )
        .await
        .unwrap();
    assert_eq!(job.get::<_, String>(0), "done");
    let mut finisher: String = job.get(2);
    assert_ne!(replicas.index_of(&finisher), replicas.index_of(gone));
    if job.get::<_, i64>(1) == 1 {
        let unit = db
            .query_one(
                "SELECT state, owner FROM jobs WHERE kind = 'plan_root' AND sha = $1",
                &[&sha],
            )
            .await
            .unwrap();
        assert_eq!(unit.get::<_, String>(0), "done", "the unit {gone} ran");
        finisher = unit.get(1);
        assert_ne!(replicas.index_of(&finisher), replicas.index_of(gone));
    }
    let runs: Vec<(String, String)> = db
        .query(
            "SELECT state, owner FROM runs WHERE sha = $1 ORDER BY id",
            &[&sha],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        runs,
        vec![
            ("interrupted".to_string(), gone.to_string()),
            ("succeeded".to_string(), finisher)
        ]
    );
}

/// A running manual `planbot-apply` job on `main`'s head, clicked by `user`.
fn apply_job(gitlab: &FakeGitLab, project: &FakeProject, user: &FakeUser, id: u64) -> FakeJob {
    FakeJob::apply(
        id,
        project,
        user,
        &gitlab.branch_head(project, "main").unwrap(),
    )
}

/// The CI job's call: its streamed log grows in `log` as planbot writes it.
fn start_apply(
    replicas: &Replicas,
    to: usize,
    job: &FakeJob,
    body: String,
) -> (
    std::sync::Arc<std::sync::Mutex<String>>,
    tokio::task::JoinHandle<u16>,
) {
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let request = replicas
        .http
        .post(replicas.url(to, "/api/v1/apply"))
        .header("JOB-TOKEN", &job.token)
        .header("content-type", "application/json")
        .body(body);
    let sink = log.clone();
    let task = tokio::spawn(async move {
        let mut response = request.send().await.expect("POST /api/v1/apply");
        let status = response.status().as_u16();
        while let Some(chunk) = response.chunk().await.unwrap() {
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk));
        }
        status
    });
    (log, task)
}

fn last_line(log: &str) -> String {
    log.lines()
        .rev()
        .find(|l| !l.starts_with("planbot: still working"))
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_apply_jobs_on_two_replicas_apply_one_after_the_other_and_a_job_applies_once() {
    let engine = require_engine!();
    let Some(store) = crate::support::postgres::fresh_database("planbot_story").await else {
        return;
    };
    let gitlab = FakeGitLab::start();
    let project = gitlab.create_project(INFRA);
    let alice = gitlab.create_user("alice");
    gitlab.add_member(&project, &alice, 40);
    gitlab.commit_files(
        &project,
        "main",
        &[("main.tf", &crate::support::infra_main_tf(&["blocky"]))],
    );
    let replicas = Replicas::start(3, |data| {
        replica_config(data, &store, &gitlab, &project, &engine, true)
    });
    let db = crate::support::postgres::connect(&store).await;

    // main's head was pushed directly: its plan applies with its fingerprint as the confirm.
    let probe = apply_job(&gitlab, &project, &alice, 50);
    gitlab.register_job(probe.clone());
    let (log, probed) = start_apply(&replicas, 2, &probe, "{}".into());
    probed.await.unwrap();
    let log = log.lock().unwrap().clone();
    let confirm = log
        .lines()
        .find_map(|l| l.split("fingerprint `").nth(1))
        .map(|rest| rest.trim_end_matches('`').to_string())
        .unwrap_or_else(|| panic!("the probe's log names the plan's fingerprint: {log}"));
    let body = format!(r#"{{"confirm":"{confirm}"}}"#);

    // Another replica is applying this project (its lock row, as that replica holds it) when
    // two jobs arrive, on two replicas: both wait for it.
    db.batch_execute(&format!(
        "INSERT INTO replicas (owner, started_at, expires_at) VALUES ('busy-replica', 0, {far});
         INSERT INTO project_locks (project_id, owner, token, acquired_at)
         VALUES ({project}, 'busy-replica', 'busy-token', 0);",
        far = i64::MAX / 2,
        project = project.id
    ))
    .await
    .unwrap();
    let (a, b) = (
        apply_job(&gitlab, &project, &alice, 51),
        apply_job(&gitlab, &project, &alice, 52),
    );
    gitlab.register_job(a.clone());
    gitlab.register_job(b.clone());
    let (log_a, job_a) = start_apply(&replicas, 0, &a, body.clone());
    let (log_b, job_b) = start_apply(&replicas, 1, &b, body.clone());
    let waiting = "another apply of this project is running (maybe on another planbot replica); waiting for it";
    crate::support::eventually("both jobs to wait for the project", 60, || async {
        log_a.lock().unwrap().contains(waiting) && log_b.lock().unwrap().contains(waiting)
    })
    .await;
    let state = gitlab.terraform_state(&project, "core").0;
    assert!(
        state.is_none(),
        "nothing applied while the project is locked"
    );

    // That apply ends: the two jobs run one after the other; one applies, one finds it done.
    db.batch_execute("DELETE FROM project_locks").await.unwrap();
    assert_eq!(job_a.await.unwrap(), 200);
    assert_eq!(job_b.await.unwrap(), 200);
    let (la, lb) = (log_a.lock().unwrap().clone(), log_b.lock().unwrap().clone());
    for l in [&la, &lb] {
        assert_eq!(last_line(l), "planbot: apply succeeded", "{l}");
    }
    let applied = [&la, &lb]
        .iter()
        .filter(|l| l.contains("Apply complete!"))
        .count();
    let nothing = [&la, &lb]
        .iter()
        .filter(|l| l.contains("no changes, nothing to apply"))
        .count();
    assert_eq!((applied, nothing), (1, 1), "{la}\n---\n{lb}");
    let state = String::from_utf8(gitlab.terraform_state(&project, "core").0.unwrap()).unwrap();
    assert!(state.contains("\"blocky\""), "{state}");
    let locks: i64 = db
        .query_one("SELECT count(*) FROM project_locks", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(locks, 0, "the project lock is free again");

    // Job 51 retried against a third replica: a CI job applies once, whichever replica it asks.
    let (log, again) = start_apply(&replicas, 2, &a, body);
    again.await.unwrap();
    let log = log.lock().unwrap().clone();
    assert!(
        last_line(&log).starts_with("planbot: apply refused"),
        "{log}"
    );
    assert!(log.contains("51"), "{log}");
}

/// A rolling upgrade: a newer planbot migrates the store while an older one still runs. The
/// older replica goes unready and says why (the Service stops sending it webhooks); a hook it
/// still gets is kept, queued for the newer replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_goes_unready_and_says_why_when_a_newer_planbot_migrates_the_store() {
    let engine = require_engine!();
    let Some(store) = crate::support::postgres::fresh_database("planbot_story").await else {
        return;
    };
    let gitlab = FakeGitLab::start();
    let project = gitlab.create_project(INFRA);
    gitlab.commit_files(&project, "main", &[("main.tf", &root_tf("main"))]);
    let replicas = Replicas::start(1, |data| {
        replica_config(data, &store, &gitlab, &project, &engine, false)
    });
    let db = crate::support::postgres::connect(&store).await;
    let readyz = || async {
        let resp = replicas
            .http
            .get(replicas.url(0, "/readyz"))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    };
    assert_eq!(readyz().await, (200, "store: ok\ngitlab: ok\n".to_string()));

    let known = planbot::capabilities::store::PG_SCHEMA_VERSION;
    db.execute(
        "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
             VALUES ($1, 'newer', '2030-01-01T00:00:00Z', '0')",
        &[&(known as i32 + 1)],
    )
    .await
    .unwrap();
    crate::support::eventually("the older replica answers /readyz with 503", 30, || async {
        readyz().await.0 == 503
    })
    .await;
    let (_, body) = readyz().await;
    assert!(
        body.starts_with(&format!(
            "store: the store has schema version {}, newer than this planbot knows (up to {known})",
            known + 1
        )),
        "{body}"
    );
    assert!(body.ends_with("gitlab: ok\n"), "{body}");

    // A hook that still reaches it is stored, and its plan waits for a replica that knows the
    // schema.
    gitlab.commit_files(&project, "mr-1", &[("main.tf", &root_tf("mr1"))]);
    let iid = gitlab.open_mr(&project, "mr-1", "main");
    let body = gitlab.mr_webhook(&project, iid).action("open").body();
    assert_eq!(replicas.deliver(0, &body, "open-1").await, 200);
    let queued: i64 = db
        .query_one(
            "SELECT count(*) FROM jobs WHERE kind = 'plan' AND mr_iid = $1 AND state = 'queued'",
            &[&(iid as i64)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(queued, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_back_after_missed_drift_ticks_run_one_drift_check() {
    use planbot::capabilities::store::{JobEnd, PgOptions, Store};
    use planbot::core::config::StoreUrl;
    let engine = require_engine!();
    let Some(store) = crate::support::postgres::fresh_database("planbot_drift").await else {
        return;
    };
    let gitlab = FakeGitLab::start();
    let project = gitlab.create_project(INFRA);
    gitlab.commit_files(&project, "main", &[("main.tf", &root_tf("main"))]);

    // The replicas' last drift tick ran three New Years ago; then all of them were down.
    let new_year = crate::drift_schedule::this_new_year();
    let seen = Store::connect_with(
        &StoreUrl::Postgres(store.clone()),
        None,
        PgOptions::default(),
    )
    .await
    .unwrap();
    let old = seen
        .claim_drift_tick(crate::drift_schedule::three_years_before(new_year))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.claim_next().await.unwrap().unwrap().id, old);
    seen.finish_job(old, JobEnd::Done).await.unwrap();
    drop(seen);

    // Two replicas start at once, each finding the latest New Year's tick missed.
    let replicas = Replicas::start_at_once(2, |data| {
        replica_config(data, &store, &gitlab, &project, &engine, false)
            + crate::drift_schedule::YEARLY
    });
    let db = crate::support::postgres::connect(&store).await;
    crate::support::eventually("the drift check ends", 120, || all_jobs_ended(&db)).await;

    // Exactly one drift check ran: one tick claimed (not one per replica, not one per missed
    // year), one drift run of the one root, one issue.
    let count = |sql: &'static str| {
        let db = &db;
        async move { db.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert_eq!(count("SELECT count(*) FROM drift_ticks").await, 2);
    assert_eq!(
        count("SELECT MAX(tick_at) FROM drift_ticks").await,
        new_year
    );
    assert_eq!(
        count("SELECT count(*) FROM jobs WHERE kind = 'drift_tick' AND state = 'done'").await,
        2
    );
    assert_eq!(
        count("SELECT count(*) FROM runs WHERE kind = 'drift'").await,
        1
    );
    let issues = gitlab.issues(&project);
    assert_eq!(issues.len(), 1, "{issues:?}");
    drop(replicas);
}

/// Plans reused across pushes on two replicas: the replica that planned the MR stops, the
/// other takes the next push (to `b` alone) and shows `a`'s plan again from the store, as the
/// note of the first head showed it, without planning `a`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_taken_by_another_replica_reuses_the_plans_the_first_one_kept() {
    let engine = require_engine!();
    let Some(store) = crate::support::postgres::fresh_database("planbot_story").await else {
        return;
    };
    let gitlab = FakeGitLab::start();
    let project = gitlab.create_project(INFRA);
    gitlab.commit_files(
        &project,
        "main",
        &[
            (
                ".planbot.toml",
                "[[roots]]\nname = \"a\"\ndir = \"stacks/a\"\n\n[[roots]]\nname = \"b\"\ndir = \"stacks/b\"\n",
            ),
            ("stacks/a/versions.tf", "terraform {}\n"),
            ("stacks/b/versions.tf", "terraform {}\n"),
        ],
    );
    let mut replicas = Replicas::start(2, |data| {
        replica_config(data, &store, &gitlab, &project, &engine, false)
    });
    let db = crate::support::postgres::connect(&store).await;
    gitlab.commit_files(
        &project,
        "two",
        &[
            ("stacks/a/main.tf", &root_tf("a1")),
            ("stacks/b/main.tf", &root_tf("b1")),
        ],
    );
    let iid = gitlab.open_mr(&project, "two", "main");
    let first = gitlab.mr_sha(&project, iid);
    let body = gitlab.mr_webhook(&project, iid).action("open").body();
    assert_eq!(replicas.deliver(0, &body, "open").await, 200);
    let (g, p) = (&gitlab, &project);
    crate::support::eventually("the first head planned", 120, || async {
        plan_state(g, p, &first).is_some_and(|s| s == "success")
    })
    .await;
    crate::support::eventually("every job ended", 60, || all_jobs_ended(&db)).await;
    let owner_of = |sha: String, root: &'static str| {
        let db = &db;
        async move {
            db.query_one(
                "SELECT owner FROM runs WHERE sha = $1 AND root = $2 AND kind = 'plan'",
                &[&sha, &root],
            )
            .await
            .unwrap()
            .get::<_, String>(0)
        }
    };
    let reads_after_first = (reads(&gitlab, "a"), reads(&gitlab, "b"));
    let planner = replicas.index_of(&owner_of(first.clone(), "a").await);
    replicas.stop(planner).await;
    let other = 1 - planner;

    let second = gitlab.push(&project, "two", &[("stacks/b/main.tf", &root_tf("b2"))]);
    let body = gitlab
        .mr_webhook(&project, iid)
        .action("update")
        .oldrev(&first)
        .body();
    assert_eq!(replicas.deliver(other, &body, "push").await, 200);
    crate::support::eventually("the second head planned", 120, || async {
        plan_state(g, p, &second).is_some_and(|s| s == "success")
    })
    .await;
    let notes = plan_notes(&gitlab, &project, iid);
    assert_eq!(notes.len(), 1, "{notes:?}");
    let note = &notes[0];
    let a = note.split("#### Root `a`").nth(1).unwrap();
    let a = a.split("#### Root ").next().unwrap();
    assert!(
        a.contains(&format!("♻️ _Reused: planned at `{}`", &first[..8])),
        "a's plan is shown again: {note}"
    );
    assert!(a.contains("\"a1\""), "{a}");
    let b = note.split("#### Root `b`").nth(1).unwrap();
    assert!(!b.contains("♻️ _Reused") && b.contains("\"b2\""), "{b}");
    // The second head's runs are the other replica's; its engine planned `b` alone (`a`'s
    // state was not read again).
    let second_owner = owner_of(second.clone(), "a").await;
    assert_eq!(replicas.index_of(&second_owner), other);
    assert_eq!(
        reads(&gitlab, "a"),
        reads_after_first.0,
        "a not planned again"
    );
    assert!(reads(&gitlab, "b") > reads_after_first.1, "b planned");
}

/// How many times the engine read state `name` through the fake GitLab so far.
fn reads(gitlab: &FakeGitLab, name: &str) -> usize {
    gitlab
        .state_requests()
        .iter()
        .filter(|r| r.method == "GET" && r.target == "state" && r.name == name)
        .count()
}

/// How many results of root units the store still holds.
async fn unit_results_left(db: &tokio_postgres::Client) -> i64 {
    db.query_one("SELECT count(*) FROM unit_results", &[])
        .await
        .unwrap()
        .get(0)
}

/// The four roots of the stories of one MR over two replicas.
const FOUR: [&str; 4] = ["a", "b", "c", "d"];

/// Two replicas on `store`, each with one engine slot and an engine that takes three seconds per
/// plan, logging what their plans do; a project whose `.planbot.toml` lists `roots`, and an MR
/// that changes every one of them, its hook delivered to the first replica.
struct SpreadWorld {
    gitlab: FakeGitLab,
    project: FakeProject,
    replicas: Replicas,
    db: tokio_postgres::Client,
    iid: u64,
    head: String,
    _dir: tempfile::TempDir,
}

impl SpreadWorld {
    async fn start(engine: &Path, store: &str, roots: [&str; 4]) -> SpreadWorld {
        let gitlab = FakeGitLab::start();
        let project = gitlab.create_project(INFRA);
        let mut config = String::new();
        let mut files = Vec::new();
        for r in roots {
            config.push_str(&format!(
                "[[roots]]\nname = \"{r}\"\ndir = \"stacks/{r}\"\n\n"
            ));
            files.push((
                format!("stacks/{r}/versions.tf"),
                "terraform {}\n".to_string(),
            ));
        }
        files.push((".planbot.toml".to_string(), config));
        let files: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        gitlab.commit_files(&project, "main", &files);
        let dir = tempfile::tempdir().unwrap();
        let slow = slow_engine(dir.path(), engine);
        let gitlab_port = url::Url::parse(gitlab.url()).unwrap().port().unwrap();
        let replicas = Replicas::start_logging(2, |data| {
            PlanbotConfig::serving(gitlab.url(), gitlab.bot_token(), data)
                .engine(&slow)
                .plan_slots(1)
                .sandbox_reaches(gitlab_port)
                .set("store", "url", &format!("\"{store}\""))
                .set("store", "lease", &format!("\"{LEASE}\""))
                .managed_state(&gitlab, &project)
                .text()
        });
        let db = crate::support::postgres::connect(store).await;
        // Not formatted (`input =  "…"`): each root's `fmt -check` lists its file.
        let changes: Vec<(String, String)> = roots
            .iter()
            .map(|r| {
                let tf = root_tf(&format!("{r}1")).replace("input = ", "input =  ");
                (format!("stacks/{r}/main.tf"), tf)
            })
            .collect();
        let changes: Vec<(&str, &str)> = changes
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        gitlab.commit_files(&project, "four", &changes);
        let iid = gitlab.open_mr(&project, "four", "main");
        let head = gitlab.mr_sha(&project, iid);
        let body = gitlab.mr_webhook(&project, iid).action("open").body();
        assert_eq!(replicas.deliver(0, &body, "open").await, 200);
        SpreadWorld {
            gitlab,
            project,
            replicas,
            db,
            iid,
            head,
            _dir: dir,
        }
    }
}

/// One MR's roots over both replicas: the replica that takes the MR's plan job queues its four
/// roots as units, the other replica takes some of them, each replica's log shows roots of
/// the MR planned there, and the one note is whole: every root's plan, its status green, and
/// every root's unformatted file, which the plan job's one `fmt -check` found.
/// Each replica's engine takes three seconds per plan and one slot, so the replica that plans
/// the job cannot take all four roots before the other one's idle workers look at the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mrs_roots_are_planned_on_both_replicas_and_its_note_is_whole() {
    let engine = require_engine!();
    let Some(store) = crate::support::postgres::fresh_database("planbot_story").await else {
        return;
    };
    let SpreadWorld {
        gitlab,
        project,
        replicas,
        db,
        iid,
        head,
        _dir,
    } = SpreadWorld::start(&engine, &store, FOUR).await;
    let roots = FOUR;
    let (g, p) = (&gitlab, &project);
    crate::support::eventually("the head planned", 180, || async {
        plan_state(g, p, &head).is_some_and(|s| s != "running" && s != "pending")
    })
    .await;
    assert_eq!(plan_state(g, p, &head).as_deref(), Some("success"));
    crate::support::eventually("every job ended", 60, || all_jobs_ended(&db)).await;

    // One note, every root's plan in it.
    let notes = plan_notes(&gitlab, &project, iid);
    assert_eq!(notes.len(), 1, "{notes:?}");
    for r in roots {
        let section = notes[0]
            .split(&format!("#### Root `{r}`"))
            .nth(1)
            .unwrap_or_else(|| panic!("no section of {r}: {}", notes[0]));
        let section = section.split("#### Root ").next().unwrap();
        assert!(section.contains(&format!("\"{r}1\"")), "{r}: {section}");
        // Its file found not formatted by the plan job's one `fmt -check`, wherever it was
        // planned.
        let not_formatted = notes[0]
            .lines()
            .any(|l| l.contains(&format!("`{r}`: **Not formatted**")) && l.contains("`main.tf`"));
        assert!(not_formatted, "{r}: {}", notes[0]);
    }
    // The head's runs were planned on both replicas, each root once.
    let runs = db
        .query(
            "SELECT root, owner, state FROM runs WHERE sha = $1 AND kind = 'plan' ORDER BY root",
            &[&head],
        )
        .await
        .unwrap();
    let runs: Vec<(String, String, String)> = runs
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        runs.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        roots,
        "{runs:?}"
    );
    assert!(runs.iter().all(|r| r.2 == "succeeded"), "{runs:?}");
    let owners: std::collections::BTreeSet<usize> =
        runs.iter().map(|r| replicas.index_of(&r.1)).collect();
    assert_eq!(owners.len(), 2, "both replicas planned roots: {runs:?}");
    // Each replica's log shows roots of the MR planned there.
    let mr = format!("mr={iid}");
    for i in 0..2 {
        let planned: Vec<String> = replicas
            .log(i)
            .into_iter()
            .filter(|l| l.contains("root planned") && l.contains(&mr))
            .collect();
        let mine = runs.iter().filter(|r| replicas.index_of(&r.1) == i).count();
        assert_eq!(planned.len(), mine, "replica {i}: {planned:?}");
    }
    // Three units, each ended; no result left in the store.
    let units: Vec<String> = db
        .query("SELECT state FROM jobs WHERE kind = 'plan_root'", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // The first root took the plan job's one slot at once; the three others were queued.
    assert_eq!(units, vec!["done"; 3], "{units:?}");
    assert_eq!(unit_results_left(&db).await, 0);
}

/// A newer head stops the older head's roots wherever they run: while the replica that did not
/// take the MR's plan job plans one of its roots, a push delivered to the plan job's replica
/// cancels the plan job and its units; the other replica hears it from the store and stops its
/// engine, every run of the older head ends `canceled`, no result of it is left in the store,
/// and the newer head's note is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_head_stops_the_older_heads_roots_on_every_replica() {
    let engine = require_engine!();
    let Some(store) = crate::support::postgres::fresh_database("planbot_story").await else {
        return;
    };
    let w = SpreadWorld::start(&engine, &store, FOUR).await;
    let (db, first) = (&w.db, &w.head);
    // The replica of the plan job, and a root of the first head planned on the other one.
    let parent_owner = || async move {
        db.query_opt(
            "SELECT owner FROM jobs WHERE kind = 'plan' AND sha = $1 AND state = 'running'",
            &[first],
        )
        .await
        .unwrap()
        .map(|r| r.get::<_, String>(0))
    };
    crate::support::eventually("the plan job runs", 60, || async {
        parent_owner().await.is_some()
    })
    .await;
    let parent = w.replicas.index_of(&parent_owner().await.unwrap());
    let other = 1 - parent;
    let replicas = &w.replicas;
    let other_planning = || async move {
        let rows = db
            .query(
                "SELECT owner FROM runs WHERE sha = $1 AND state = 'running'",
                &[first],
            )
            .await
            .unwrap();
        rows.iter()
            .any(|r| replicas.index_of(&r.get::<_, String>(0)) == other)
    };
    crate::support::eventually(
        "the other replica plans a root of the first head",
        60,
        other_planning,
    )
    .await;

    let changes: Vec<(String, String)> = FOUR
        .iter()
        .map(|r| (format!("stacks/{r}/main.tf"), root_tf(&format!("{r}2"))))
        .collect();
    let changes: Vec<(&str, &str)> = changes
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    let second = w.gitlab.push(&w.project, "four", &changes);
    let body = w
        .gitlab
        .mr_webhook(&w.project, w.iid)
        .action("update")
        .oldrev(first)
        .body();
    // To the plan job's replica: the other one hears of the cancel from the store.
    assert_eq!(w.replicas.deliver(parent, &body, "push").await, 200);
    let (g, p) = (&w.gitlab, &w.project);
    crate::support::eventually("the second head planned", 180, || async {
        plan_state(g, p, &second).is_some_and(|s| s == "success")
    })
    .await;
    crate::support::eventually("every job ended", 60, || all_jobs_ended(db)).await;
    assert_eq!(plan_state(g, p, first).as_deref(), Some("canceled"));
    // Every run of the first head ended canceled, on both replicas.
    let runs: Vec<(String, String)> = db
        .query(
            "SELECT root, state FROM runs WHERE sha = $1 AND kind = 'plan'",
            &[first],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(!runs.is_empty());
    assert!(runs.iter().all(|r| r.1 == "canceled"), "{runs:?}");
    // The other replica heard the cancel from the store and stopped its engine.
    let log = w.replicas.log(other);
    let heard = log.iter().any(|l| l.contains("job canceled in the store"));
    let stopped = log
        .iter()
        .any(|l| l.contains("root failed to plan") && l.contains("was cancelled"));
    assert!(heard && stopped, "{log:#?}");
    assert_eq!(unit_results_left(db).await, 0);
    // One note, for the second head, whole.
    let notes = plan_notes(&w.gitlab, &w.project, w.iid);
    assert_eq!(notes.len(), 1, "{notes:?}");
    for r in FOUR {
        assert!(notes[0].contains(&format!("\"{r}2\"")), "{r}: {}", notes[0]);
    }
}
