//! Which sandbox the service's engine runs get: the strict Landlock profile and the namespaces
//! from `[sandbox]`, the TCP ports the engine may reach, the apply's SSH agent, and what
//! happens on a kernel without Landlock or namespaces.

use crate::capabilities::engine::sandbox::Support;
use crate::capabilities::engine::{
    CgroupSupport, JobCgroups, Limits, Namespaces, SandboxMode, SandboxProfile,
};
use crate::capabilities::namespaces::NsSupport;
use crate::core::config::{Config, LandlockSetting};
use crate::flows::confinement::credentials::Trust;

/// One text of `templates/sandbox.txt.j2`.
pub fn text(kind: &str, ctx: minijinja::Value) -> String {
    let ctx = minijinja::context! { kind => kind, ..ctx };
    crate::core::templates::render("sandbox.txt.j2", ctx)
        .map(|t| t.trim().to_string())
        .unwrap_or_else(|e| format!("planbot: sandbox {kind} ({e})"))
}

/// What the kernel offers, as `[sandbox] landlock` lets planbot see it.
pub fn support(config: &Config) -> Support {
    match config.sandbox.landlock {
        LandlockSetting::Auto => Support::probe(),
        LandlockSetting::Off => Support::Unavailable {
            reason: FORCED_OFF.get_or_init(|| text("forced_off", minijinja::context! {})),
        },
    }
}

static FORCED_OFF: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Whether the kernel lets planbot make namespaces, as `[sandbox] namespaces` lets it see.
pub fn namespace_support(config: &Config) -> NsSupport {
    match config.sandbox.namespaces {
        LandlockSetting::Auto => NsSupport::probe(),
        LandlockSetting::Off => NsSupport::Unavailable {
            reason: text("namespaces_off", minijinja::context! {}),
        },
    }
}

/// The sandbox of the service's engine runs for `trust`: the strict profile, reading
/// `[sandbox] read_paths` (and a filesystem provider mirror), connecting to
/// `[sandbox] connect_ports`, the Proxmox endpoint's port, the provider mirror's, and
/// GitLab's when the engine fetches modules from it (each run adds its state gate's port).
pub fn service_mode(config: &Config, trust: Trust) -> SandboxMode {
    let mode = SandboxMode::with_support(
        SandboxProfile::Strict,
        support(config),
        namespace_support(config),
        config.sandbox.required,
        |reason| text("refused_service", minijinja::context! { reason => reason }),
    );
    let SandboxMode::Landlock {
        profile,
        abi,
        namespaces,
        ..
    } = mode
    else {
        return mode;
    };
    let namespaces = match namespaces {
        Namespaces::On { limits } => Namespaces::On {
            limits: Limits {
                memory: config.sandbox.memory_max,
                // No one file larger than the whole quota (`sandbox.disk_max`).
                file_size: limits.file_size.min(config.sandbox.disk_max),
                ..limits
            },
        },
        off => off,
    };
    // The SSH agent of the default branch's runs, at a per-run path only they see.
    let agent_socket = match (trust, &config.proxmox.apply_ssh) {
        (Trust::DefaultBranch, Some(ssh)) => ssh.agent_socket.clone(),
        _ => None,
    };
    let extra_read = config.sandbox.read_paths.clone();
    let mut extra_exec = Vec::new();
    if let Some(m) = config
        .engine
        .provider_mirror
        .as_ref()
        .filter(|m| m.starts_with('/'))
    {
        // Read and execute: the engine runs the providers it unpacks there.
        extra_exec.push(m.into());
    }
    // The ports of the endpoints the config names (see `network::connect_ports`).
    let connect_ports = crate::flows::confinement::network::connect_ports(config, trust);
    SandboxMode::Landlock {
        profile,
        abi,
        extra_read,
        extra_exec,
        connect_ports,
        namespaces,
        agent_socket,
    }
}

/// The banner of a note planned without a sandbox, or `None`.
pub fn note_banner(mode: &SandboxMode) -> Option<String> {
    match mode {
        SandboxMode::Off { reason } => {
            Some(text("banner_off", minijinja::context! { reason => reason }))
        }
        SandboxMode::Landlock {
            profile: SandboxProfile::Strict,
            namespaces: Namespaces::Off { reason },
            ..
        } => Some(text(
            "banner_no_namespaces",
            minijinja::context! { reason => reason },
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        crate::core::config::test_config(extra, &[])
    }

    #[test]
    fn the_engine_may_reach_443_the_proxmox_port_and_the_mirror_port() {
        let c = config(
            r#"
[engine]
provider_mirror = "https://mirror.example.com:8443/providers/"
[proxmox]
endpoint = "https://pve01.example.com:8006/"
[proxmox.apply]
endpoint = "https://pve-apply.example.com:9006/"
[sandbox]
connect_ports = [443, 5432]
"#,
        );
        if Support::probe().abi().is_none() {
            panic!("this test needs a kernel with Landlock");
        }
        let SandboxMode::Landlock { connect_ports, .. } = service_mode(&c, Trust::MergeRequest)
        else {
            panic!("expected Landlock");
        };
        assert_eq!(connect_ports, vec![443, 5432, 8006, 8443]);
        let SandboxMode::Landlock { connect_ports, .. } = service_mode(&c, Trust::DefaultBranch)
        else {
            panic!("expected Landlock");
        };
        assert_eq!(connect_ports, vec![443, 5432, 8443, 9006]);
    }

    #[test]
    fn without_landlock_the_service_refuses_unless_told_otherwise() {
        let refused = service_mode(
            &config("[sandbox]\nlandlock = \"off\""),
            Trust::MergeRequest,
        );
        let SandboxMode::Refused { reason } = &refused else {
            panic!("expected a refusal, got {refused:?}");
        };
        assert!(reason.contains("[sandbox] required = false"), "{reason}");
        assert!(reason.contains("landlock = \"off\""), "{reason}");
        assert_eq!(note_banner(&refused), None);

        let off = service_mode(
            &config("[sandbox]\nlandlock = \"off\"\nrequired = false"),
            Trust::MergeRequest,
        );
        assert!(matches!(off, SandboxMode::Off { .. }), "{off:?}");
        let banner = note_banner(&off).unwrap();
        assert!(banner.contains("Planned without a sandbox"), "{banner}");
    }
}

/// Which per-run cgroups the service's engine runs get (`[sandbox] cgroup`), or why none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupStatus {
    /// `[sandbox] cgroup = "off"`.
    Off,
    /// Where they are made (`CgroupSupport::V1`/`V2`) or why none can be (`Unavailable`).
    Auto(CgroupSupport),
}

impl CgroupStatus {
    /// For `planbot doctor` and `--check`: what the host offers, changing nothing.
    pub fn probe(config: &Config) -> CgroupStatus {
        match config.sandbox.cgroup {
            LandlockSetting::Off => CgroupStatus::Off,
            LandlockSetting::Auto => CgroupStatus::Auto(CgroupSupport::probe()),
        }
    }

    /// For the service: what it uses, the v2 layout made (once per process).
    pub fn prepare(config: &Config) -> CgroupStatus {
        match config.sandbox.cgroup {
            LandlockSetting::Off => CgroupStatus::Off,
            LandlockSetting::Auto => CgroupStatus::Auto(CgroupSupport::prepare()),
        }
    }

    /// The line `serve --check` prints and the service logs at start.
    pub fn describe(&self, config: &Config) -> String {
        let caps = format!(
            "{} of memory and {} tasks per run (`sandbox.job_memory_max`, `sandbox.job_tasks_max`)",
            crate::capabilities::checkout_file::size_text(config.sandbox.job_memory_max),
            config.sandbox.job_tasks_max
        );
        match self {
            CgroupStatus::Off => text("cgroup_off", minijinja::context! {}),
            CgroupStatus::Auto(CgroupSupport::Unavailable { reason }) => {
                text("cgroup_none", minijinja::context! { reason => reason })
            }
            CgroupStatus::Auto(s) => text(
                "cgroup_on",
                minijinja::context! { level => s.describe(), caps => caps },
            ),
        }
    }
}

/// The per-run cgroups of the service's engines: made where the host delegates them and
/// `[sandbox] cgroup` is `auto`.
pub fn job_cgroups(config: &Config) -> Option<JobCgroups> {
    match CgroupStatus::prepare(config) {
        CgroupStatus::Auto(s) => JobCgroups::new(
            s,
            config.sandbox.job_memory_max,
            config.sandbox.job_tasks_max,
        ),
        CgroupStatus::Off => None,
    }
}
