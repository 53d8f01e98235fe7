//! What the engine may connect to: the TCP ports its config implies (its endpoints), the places
//! the config says it connects to with whether the sandbox lets it, and what an engine error
//! the sandbox caused (`permission denied` on a connect or an open, `operation not permitted`
//! on a socket other than TCP or UNIX, a refused TCP listener) means, with the setting.

use crate::core::config::Config;
use crate::flows::confinement::credentials::{self, Trust};
use serde::Serialize;

/// The TCP port of a URL (its scheme's default when none is written).
pub fn url_port(u: &str) -> Option<u16> {
    let u = url::Url::parse(u).ok()?;
    u.port_or_known_default().or(match u.scheme() {
        "postgres" | "postgresql" => Some(5432),
        _ => None,
    })
}

/// The TCP ports the engine may connect to in a run for `trust`: `[sandbox] connect_ports`, the
/// Proxmox endpoint's port, the network provider mirror's, GitLab's when the engine fetches
/// modules from it (not for GitLab-managed state: the engine reaches that only through the
/// job's state gate, whose port each run adds), and SSH (22) for the default branch's runs with `[proxmox.apply] ssh_*`.
pub fn connect_ports(config: &Config, trust: Trust) -> Vec<u16> {
    let mut ports = config.sandbox.connect_ports.clone();
    if let Some(m) = config
        .engine
        .provider_mirror
        .as_deref()
        .filter(|m| !m.starts_with('/'))
    {
        ports.extend(url_port(m));
    }
    if trust == Trust::DefaultBranch && config.proxmox.apply_ssh.is_some() {
        // The bpg provider's SSH to the nodes (snippet uploads).
        ports.push(22);
    }
    if credentials::uses_gitlab(config) {
        // Modules over git or the module registry.
        ports.extend(url_port(&config.gitlab.url));
    }
    let env = credentials::engine_env(config, trust);
    for key in ["PROXMOX_VE_ENDPOINT", "PM_VE_ENDPOINT"] {
        ports.extend(env.get(key).and_then(|u| url_port(u)));
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The ports of every engine run, whatever its trust level: what no listener of planbot's may
/// use (its own port, a job's state gate).
pub fn sandbox_ports(config: &Config) -> Vec<u16> {
    let mut ports = connect_ports(config, Trust::MergeRequest);
    ports.extend(connect_ports(config, Trust::DefaultBranch));
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// When the engine's sandbox may connect to the port planbot itself listens on (`listen`): the
/// text that says so and what to change. MR code would reach planbot's pages and API from
/// loopback; `serve --check`, `serve` and `doctor` refuse such a config.
pub fn own_port_reachable(config: &Config) -> Option<String> {
    let port = config.listen.port();
    if !sandbox_ports(config).contains(&port) {
        return None;
    }
    // Where the allow-list got the port from, in the config's words.
    let source = if config.sandbox.connect_ports.contains(&port) {
        "`[sandbox] connect_ports`".to_string()
    } else {
        needs(config)
            .into_iter()
            .find(|n| n.port == port)
            .map(|n| format!("`{}` ({})", n.key, n.what))
            .unwrap_or_else(|| "the sandbox's allow-list".into())
    };
    Some(crate::core::templates::text(
        "network.txt.j2",
        "own_port",
        minijinja::context! { port => port, source => source },
    ))
}

/// Variables of the engine's environment that name a server the engine connects to (state
/// backends and providers configured through the environment).
const ENDPOINT_VARIABLES: &[&str] = &[
    "TF_HTTP_ADDRESS",
    "TF_HTTP_LOCK_ADDRESS",
    "TF_HTTP_UNLOCK_ADDRESS",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_ENDPOINT_URL_STS",
    "AWS_S3_ENDPOINT",
    "PG_CONN_STR",
    "CONSUL_HTTP_ADDR",
    "VAULT_ADDR",
    "PROXMOX_VE_ENDPOINT",
    "PM_API_URL",
];

/// One place the config says the engine connects to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Need {
    /// The setting that names it, e.g. `engine.env.TF_HTTP_ADDRESS` or `gitlab.url`.
    pub key: String,
    /// What it is for, in words.
    pub what: &'static str,
    pub host: String,
    pub port: u16,
    /// The sandbox lets the runs of every trust level that use it connect there.
    pub allowed: bool,
}

/// Every place the config says the engine connects to, each with whether the sandbox's
/// allow-list has its port: GitLab (modules), the Proxmox endpoints, the provider mirror,
/// and the endpoint variables of the engine's environment.
pub fn needs(config: &Config) -> Vec<Need> {
    let plan = connect_ports(config, Trust::MergeRequest);
    let apply = connect_ports(config, Trust::DefaultBranch);
    let mut out: Vec<Need> = Vec::new();
    let mut add = |key: String, what: &'static str, url: &str, uses: &[Trust]| {
        let Some(parsed) = url::Url::parse(url).ok() else {
            return;
        };
        let (Some(host), Some(port)) = (parsed.host_str(), url_port(url)) else {
            return;
        };
        let allowed = uses.iter().all(|u| match u {
            Trust::MergeRequest => plan.contains(&port),
            Trust::DefaultBranch => apply.contains(&port),
        });
        let need = Need {
            key,
            what,
            host: host.to_string(),
            port,
            allowed,
        };
        if !out.contains(&need) {
            out.push(need);
        }
    };
    let both = [Trust::MergeRequest, Trust::DefaultBranch];
    if credentials::uses_gitlab(config) {
        add(
            "gitlab.url".into(),
            "modules from GitLab",
            &config.gitlab.url,
            &both,
        );
    }
    let (pve_plan, pve_apply) = (
        config.proxmox.for_plan().endpoint,
        config.proxmox.for_apply().endpoint,
    );
    if pve_plan == pve_apply {
        if let Some(e) = &pve_plan {
            add("proxmox.endpoint".into(), "the Proxmox API", e, &both);
        }
    } else {
        for (key, ep, uses) in [
            (
                "proxmox.plan.endpoint",
                &pve_plan,
                &[Trust::MergeRequest][..],
            ),
            (
                "proxmox.apply.endpoint",
                &pve_apply,
                &[Trust::DefaultBranch][..],
            ),
        ] {
            if let Some(e) = ep {
                add(key.into(), "the Proxmox API", e, uses);
            }
        }
    }
    if let Some(m) = config
        .engine
        .provider_mirror
        .as_deref()
        .filter(|m| !m.starts_with('/'))
    {
        add(
            "engine.provider_mirror".into(),
            "the provider mirror",
            m,
            &both,
        );
    }
    for (table, env, uses) in [
        ("engine.env", &config.engine.env, &both[..]),
        (
            "engine.plan.env",
            &config.engine.plan_env,
            &[Trust::MergeRequest][..],
        ),
        (
            "engine.apply.env",
            &config.engine.apply_env,
            &[Trust::DefaultBranch][..],
        ),
    ] {
        for (name, value) in env {
            if ENDPOINT_VARIABLES.contains(&name.as_str()) {
                add(
                    format!("{table}.{name}"),
                    "a server the engine's environment names",
                    value.expose(),
                    uses,
                );
            }
        }
    }
    out
}

/// What the sandbox refused, as an engine's (redacted) output shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// `dial tcp HOST:PORT: connect: permission denied`: a TCP port not on the allow-list.
    Connect { host: String, port: u16 },
    /// `open PATH: permission denied`: a file outside what the sandbox lets it read.
    Open { path: String },
    /// `socket: operation not permitted`: a socket other than TCP or UNIX (UDP, MPTCP, SCTP,
    /// raw, packet, netlink, vsock), which the engine's seccomp filter refuses.
    Socket,
    /// `listen: operation not permitted` (the `listen()` guard: only UNIX sockets listen) or
    /// `bind: permission denied` (Landlock refuses every TCP bind): a TCP listener.
    Listen,
}

/// The first thing the sandbox refused in `output`, when it refused something.
pub fn denial(output: &str) -> Option<Denial> {
    for line in output.lines() {
        if let Some((before, _)) = line.split_once(": connect: permission denied") {
            let addr = before.rsplit(' ').next().unwrap_or("");
            if let Some((host, port)) = addr.rsplit_once(':') {
                if let Ok(port) = port.parse() {
                    return Some(Denial::Connect {
                        host: host.trim_matches(['[', ']']).to_string(),
                        port,
                    });
                }
            }
        }
        let lower = line.to_ascii_lowercase();
        if lower.contains("socket: operation not permitted") {
            return Some(Denial::Socket);
        }
        if lower.contains("listen: operation not permitted")
            || lower.contains("bind: permission denied")
        {
            return Some(Denial::Listen);
        }
        if let Some((before, _)) = line.split_once(": permission denied") {
            if let Some(path) = before.rsplit("open ").next().filter(|p| p.starts_with('/')) {
                return Some(Denial::Open {
                    path: path.trim().to_string(),
                });
            }
        }
    }
    None
}

/// The operator's explanation of an engine failure the sandbox caused (`templates/network.txt.j2`),
/// naming the setting that would allow it; `None` when the sandbox refused nothing.
pub fn explain(config: &Config, trust: Trust, output: &str) -> Option<String> {
    let d = denial(output)?;
    let ports = connect_ports(config, trust);
    let ctx = match &d {
        Denial::Connect { host, port } => {
            let mut wanted = config.sandbox.connect_ports.clone();
            wanted.push(*port);
            wanted.sort_unstable();
            wanted.dedup();
            minijinja::context! {
                kind => "denied_connect",
                host => host,
                port => port,
                allowed => format!("{ports:?}"),
                setting => format!("connect_ports = {wanted:?}"),
            }
        }
        Denial::Open { path } => minijinja::context! {
            kind => "denied_open",
            path => path,
        },
        Denial::Socket => minijinja::context! {
            kind => "denied_socket",
            allowed => format!("{ports:?}"),
        },
        Denial::Listen => minijinja::context! {
            kind => "denied_listen",
        },
    };
    crate::core::templates::render("network.txt.j2", ctx)
        .ok()
        .map(|t| t.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config with GitLab on port 8443 and `extra`.
    fn config(extra: &str) -> Config {
        crate::core::config::test_config(
            extra,
            &[("PLANBOT_GITLAB_URL", "https://gitlab.example.com:8443/")],
        )
    }

    #[test]
    fn the_needs_of_the_config_are_checked_against_the_allow_list() {
        let c = config(
            r#"
[engine.env]
TF_HTTP_ADDRESS = "https://minio.lab:9000/state/core"
TF_VAR_wiki = "https://wiki.lab:8080/"
[state.plan]
token = "glpat-state-reader"
[proxmox]
endpoint = "https://pve01.lab:8006/"
"#,
        );
        let found = needs(&c);
        let by_key = |k: &str| found.iter().find(|n| n.key == k).cloned();
        // GitLab-managed state alone: the engine reaches only the job's state gate, never
        // GitLab itself, so GitLab's port stays closed.
        assert_eq!(by_key("gitlab.url"), None);
        assert!(!connect_ports(&c, Trust::MergeRequest).contains(&8443));
        let with_modules = config("[modules.plan]\ntoken = \"glpat-modules\"\n");
        assert_eq!(
            needs(&with_modules)
                .iter()
                .find(|n| n.key == "gitlab.url")
                .map(|n| (n.port, n.allowed, n.what)),
            Some((8443, true, "modules from GitLab"))
        );
        assert_eq!(
            by_key("proxmox.endpoint").map(|n| (n.port, n.allowed)),
            Some((8006, true))
        );
        let minio = by_key("engine.env.TF_HTTP_ADDRESS").unwrap();
        assert_eq!(
            (minio.host.as_str(), minio.port, minio.allowed),
            ("minio.lab", 9000, false)
        );
        assert_eq!(by_key("engine.env.TF_VAR_wiki"), None);
        let c = config(
            "[engine.env]\nTF_HTTP_ADDRESS = \"https://minio.lab:9000/state\"\n[sandbox]\nconnect_ports = [443, 9000]\n",
        );
        assert!(needs(&c).iter().all(|n| n.allowed));
    }

    #[test]
    fn a_denial_is_read_from_the_engines_output_and_explained_with_the_setting() {
        let out = "Error: Failed to get existing workspaces: Get \"http://127.0.0.1:18929/state\": dial tcp 127.0.0.1:18929: connect: permission denied";
        assert_eq!(
            denial(out),
            Some(Denial::Connect {
                host: "127.0.0.1".into(),
                port: 18929
            })
        );
        let c = config("");
        let text = explain(&c, Trust::MergeRequest, out).unwrap();
        assert!(text.contains("port 18929"), "{text}");
        assert!(text.contains("connect_ports = [443, 18929]"), "{text}");
        let open = "Error: Invalid function argument\n  Invalid value for \"path\" parameter: open /opt/corp-ca/ca.pem: permission denied.";
        assert_eq!(
            denial(open),
            Some(Denial::Open {
                path: "/opt/corp-ca/ca.pem".into()
            })
        );
        assert!(explain(&c, Trust::MergeRequest, open)
            .unwrap()
            .contains("read_paths"));
        // Go's and a program's words for a socket the seccomp filter refused.
        for refused in [
            "Error: dial udp 10.0.0.53:53: socket: operation not permitted",
            "Unrecognized remote plugin message: socket: Operation not permitted",
        ] {
            assert_eq!(denial(refused), Some(Denial::Socket), "{refused}");
            let text = explain(&c, Trust::MergeRequest, refused).unwrap();
            assert!(text.contains("refused a connection"), "{text}");
            assert!(text.contains("only TCP"), "{text}");
        }
        // A TCP listener: the listen() guard's refusal (a socket never bound) and Go's words
        // for Landlock's refused bind (net.Listen binds first).
        for refused in [
            "listen: Operation not permitted port=0",
            "Error: listen tcp 0.0.0.0:0: bind: permission denied",
        ] {
            assert_eq!(denial(refused), Some(Denial::Listen), "{refused}");
            let text = explain(&c, Trust::MergeRequest, refused).unwrap();
            assert!(text.contains("refused a listening socket"), "{text}");
            assert!(text.contains("only on UNIX sockets"), "{text}");
        }
        assert_eq!(denial("Error: no such host"), None);
    }
}
