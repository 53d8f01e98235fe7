//! What `planbot serve --check` checks beyond the config's own problems: that the engine binary
//! runs and says its version, that `data_dir` can be used, that no server the engine must
//! reach is on a port its sandbox blocks, that the sandbox cannot reach planbot's own port, that
//! planbot's own policy sets read and parse, and
//! that no address is still the example's `example.com` placeholder. Every problem names where its value came from.

use crate::capabilities::engine::Engine;
use crate::core::config::{Config, ConfigError, Loaded, Problem};
use crate::core::policy::{PolicySetSpec, DEFAULT_LIMIT};
use std::path::Path;

/// The host's side of a check: what the engine says it is, and every problem found.
#[derive(Debug, Default)]
pub struct HostCheck {
    /// e.g. `OpenTofu 1.10.6 at /usr/bin/tofu`, when the engine answered.
    pub engine: Option<String>,
    pub problems: Vec<Problem>,
}

/// Check what `config` needs from this host. Keys that already have a problem in `loaded`
/// are not checked again.
pub fn check_host(loaded: &Loaded, config: &Config) -> HostCheck {
    let mut out = HostCheck::default();
    let has_problem = |key: &str| loaded.problems.iter().any(|p| p.error.key() == Some(key));
    let mut push = |key: &str, message: String| {
        out.problems.push(Problem {
            error: ConfigError::Invalid {
                key: key.to_string(),
                message,
            },
            origin: loaded.origin(key).cloned(),
        })
    };

    if !has_problem("engine.binary") {
        match engine_version(config.engine.binary.as_deref()) {
            Ok(v) => out.engine = Some(v),
            Err(message) => push("engine.binary", message),
        }
    }
    if !has_problem("data_dir") {
        if let Some(message) = data_dir_problem(&config.data_dir) {
            push("data_dir", message);
        }
    }
    // planbot's own policy sets: a set that cannot be read or parsed would block every apply.
    for set in &config.policy_sets {
        let key = format!("policy_sets.{}", set.name);
        if has_problem(&key) {
            continue;
        }
        if let Some(message) = policy_set_problem(set) {
            push(&key, message);
        }
    }
    // A server the engine must reach on a port its sandbox blocks: every plan would fail.
    for need in crate::flows::confinement::network::needs(config) {
        if need.allowed || has_problem(&need.key) {
            continue;
        }
        let mut wanted = config.sandbox.connect_ports.clone();
        wanted.push(need.port);
        wanted.sort_unstable();
        wanted.dedup();
        let text = crate::core::templates::text(
            "network.txt.j2",
            "blocked",
            minijinja::context! {
                host => &need.host,
                port => need.port,
                what => need.what,
                setting => format!("connect_ports = {wanted:?}"),
            },
        );
        push(&need.key, text);
    }
    // planbot's own port on the sandbox's allow-list: MR code could reach planbot itself.
    if let Some(text) = crate::flows::confinement::network::own_port_reachable(config) {
        push("listen", text);
    }
    let mut addresses = vec![
        ("gitlab.url", Some(config.gitlab.url.clone())),
        (
            "public_url",
            config.public_url.as_ref().map(|u| u.to_string()),
        ),
        ("proxmox.endpoint", config.proxmox.default.endpoint.clone()),
    ];
    for (section, ep) in [
        ("proxmox.plan", &config.proxmox.plan),
        ("proxmox.apply", &config.proxmox.apply),
    ] {
        if let Some(ep) = ep {
            addresses.push((
                if section == "proxmox.plan" {
                    "proxmox.plan.endpoint"
                } else {
                    "proxmox.apply.endpoint"
                },
                ep.endpoint.clone(),
            ));
        }
    }
    for (key, value) in addresses {
        let Some(value) = value else { continue };
        if has_problem(key) {
            continue;
        }
        let host = url::Url::parse(&value)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string));
        if let Some(host) = host.filter(|h| h == "example.com" || h.ends_with(".example.com")) {
            push(
                key,
                format!("`{host}` is the example's placeholder (example.com is reserved for documentation): put your own address here"),
            );
        }
    }
    out
}

/// Why an operator's policy set could not be evaluated on any plan: its directory cannot be
/// read, holds no `.rego` file, a file does not parse, or its package has no rule conftest reads.
fn policy_set_problem(set: &PolicySetSpec) -> Option<String> {
    let files = match crate::flows::context::policy_sets::read_policy_dir(Path::new(&set.path)) {
        Ok(files) => files,
        Err(e) => return Some(format!("{e:#}")),
    };
    crate::core::policy::check_set(&set.with_files(files, DEFAULT_LIMIT))
        .err()
        .map(|e| e.to_string())
}

/// Resolve `binary` as the service would (unset: `tofu`, else `terraform`) and ask it for its
/// version.
fn engine_version(binary: Option<&str>) -> Result<String, String> {
    let temp =
        tempfile::tempdir().map_err(|e| format!("cannot make a temporary directory: {e}"))?;
    let binary =
        crate::capabilities::engine::configured_binary(binary).map_err(|e| e.to_string())?;
    let engine = Engine::builder(binary, temp.path())
        .build()
        .map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let path = engine.binary().display().to_string();
    match runtime.block_on(engine.version()) {
        Ok(v) => Ok(format!("{v} at {path}")),
        Err(e) => Err(format!("{path} does not answer `version -json`: {e}")),
    }
}

/// Why planbot could not keep its store in `dir`: it must be a writable directory, or one
/// that can be created. Leaves nothing behind.
pub fn data_dir_problem(dir: &Path) -> Option<String> {
    if !dir.is_absolute() {
        return Some(format!(
            "{} is a relative path: write an absolute one",
            dir.display()
        ));
    }
    let probe = format!(".planbot-check-{}", std::process::id());
    if dir.exists() {
        if !dir.is_dir() {
            return Some(format!("{} is not a directory", dir.display()));
        }
        let file = dir.join(&probe);
        return match std::fs::write(&file, b"") {
            Ok(()) => std::fs::remove_file(&file).err().map(|e| e.to_string()),
            Err(e) => Some(format!("planbot cannot write in {}: {e}", dir.display())),
        };
    }
    let parent = dir.ancestors().skip(1).find(|a| a.exists())?;
    if !parent.is_dir() {
        return Some(format!(
            "{} cannot be created: {} is not a directory",
            dir.display(),
            parent.display()
        ));
    }
    let sub = parent.join(&probe);
    match std::fs::create_dir(&sub) {
        Ok(()) => std::fs::remove_dir(&sub).err().map(|e| e.to_string()),
        Err(e) => Some(format!(
            "{} does not exist and cannot be created in {}: {e}",
            dir.display(),
            parent.display()
        )),
    }
}
