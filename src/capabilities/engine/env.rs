//! The engine's environment, built from scratch: `PATH`, `HOME`, `TF_IN_AUTOMATION=1`,
//! `TF_INPUT=0`, `TF_PLUGIN_CACHE_DIR`, the Go runtime's collector tuned to the run's memory
//! cap ([`go_runtime_env`]), the configured `engine.env`, the per-call extra env, `TF_WORKSPACE`
//! when asked, and on OpenTofu `TF_ENCRYPTION` for the plan file. Nothing is inherited (no
//! `TF_CLI_ARGS*`, `TF_LOG*`, stray `TF_VAR_*`, tokens).

use super::Engine;
use std::collections::BTreeMap;
use std::ffi::OsString;

/// Keys never passed to the engine, whoever sets them.
pub(super) fn forbidden_env_key(key: &str) -> bool {
    key.starts_with("TF_LOG") || key.starts_with("TF_CLI_ARGS")
}

/// How much more the Go heap of an engine process may grow between two collections than Go's
/// default (`GOGC=100`): both engines and their providers are Go programs, most of whose
/// processes are short (`init`, `show`, `fmt`) and spend a third of their CPU collecting a
/// heap that dies with them. Measured on this project's machine (docs/internals.md, "Many
/// roots"): `init` + `plan` + `show -json` of a small root take about 30 % less CPU at 400.
const GO_GC_PERCENT: u64 = 400;

/// The Go runtime's settings for an engine whose every process may use at most `memory_cap`
/// bytes (the smaller of `sandbox.memory_max` and `sandbox.job_memory_max` where they apply):
/// `GOGC` = [`GO_GC_PERCENT`], and `GOMEMLIMIT` at half the cap, so that a large plan's heap,
/// which would otherwise grow to five times what it holds, collects as before once it nears
/// half the cap (the other half is left to the providers beside it in the run's cgroup). With
/// no cap (a run without a sandbox) nothing: the engine's defaults. `engine.env` may set either.
pub fn go_runtime_env(memory_cap: Option<u64>) -> Vec<(&'static str, String)> {
    match memory_cap {
        Some(cap) => vec![
            ("GOGC", GO_GC_PERCENT.to_string()),
            ("GOMEMLIMIT", format!("{}MiB", ((cap / 2) >> 20).max(1))),
        ],
        None => Vec::new(),
    }
}

impl Engine {
    /// The most memory one engine process may use: the smaller of its own limit (the
    /// sandbox's `RLIMIT_DATA`) and its run's cgroup's, where either applies.
    fn memory_cap(&self) -> Option<u64> {
        let process = match &self.inner.sandbox {
            super::SandboxMode::Landlock {
                namespaces: super::sandbox::Namespaces::On { limits },
                ..
            } => Some(limits.memory),
            _ => None,
        };
        let run = self.inner.job_cgroups.as_ref().map(|c| c.memory_max());
        process.into_iter().chain(run).min()
    }

    /// The whole child environment (pure; see the module docs for what is in it and why).
    pub(super) fn child_env(
        &self,
        extra: &BTreeMap<String, String>,
        workspace: Option<&str>,
        encryption: Option<&str>,
    ) -> BTreeMap<String, OsString> {
        let mut env: BTreeMap<String, OsString> = BTreeMap::new();
        env.insert("PATH".into(), self.inner.path.clone());
        env.insert("HOME".into(), self.inner.home.clone());
        env.insert("TF_IN_AUTOMATION".into(), "1".into());
        env.insert("TF_INPUT".into(), "0".into());
        if let Some(cache) = &self.inner.plugin_cache_dir {
            env.insert("TF_PLUGIN_CACHE_DIR".into(), cache.clone().into_os_string());
        }
        for (k, v) in go_runtime_env(self.memory_cap()) {
            env.insert(k.into(), v.into());
        }
        for (k, v) in self.inner.env.iter().chain(extra) {
            if !forbidden_env_key(k) {
                env.insert(k.clone(), v.into());
            }
        }
        if let Some(ws) = workspace {
            env.insert("TF_WORKSPACE".into(), ws.into());
        }
        if let Some(enc) = encryption {
            env.insert("TF_ENCRYPTION".into(), enc.into());
        }
        env
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::sandbox::Namespaces;
    use super::super::SandboxMode;
    use super::*;

    pub(in crate::capabilities::engine) fn engine_with(env: &[(&str, &str)]) -> Engine {
        Engine::builder("/bin/sh", "/nonexistent-temp-root")
            .env(
                env.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
            .plugin_cache_dir("/var/cache/plugins")
            .path_env("/usr/bin:/bin")
            .home("/home/planbot")
            // No sandbox, so no memory cap: the same environment on every kernel.
            .sandbox(SandboxMode::Off {
                reason: "test".into(),
            })
            .build()
            .unwrap()
    }

    #[test]
    fn the_child_environment_is_explicit() {
        let e = engine_with(&[
            ("TF_VAR_proxmox_api_token", "pve-token-secret"),
            ("TF_LOG", "trace"),
            ("TF_CLI_ARGS_plan", "-refresh=false"),
        ]);
        let extra: BTreeMap<String, String> =
            [("TF_VAR_extra".to_string(), "x".to_string())].into();
        let env = e.child_env(&extra, Some("staging"), None);
        let keys: Vec<&str> = env.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            vec![
                "HOME",
                "PATH",
                "TF_INPUT",
                "TF_IN_AUTOMATION",
                "TF_PLUGIN_CACHE_DIR",
                "TF_VAR_extra",
                "TF_VAR_proxmox_api_token",
                "TF_WORKSPACE"
            ]
        );
        assert_eq!(env["TF_IN_AUTOMATION"], "1");
        assert_eq!(env["TF_INPUT"], "0");
        assert_eq!(env["PATH"], "/usr/bin:/bin");
        assert_eq!(env["TF_WORKSPACE"], "staging");
        assert!(e.secrets().iter().any(|s| s == "pve-token-secret"));
    }

    fn capped(memory: u64, run: Option<u64>, env: &[(&str, &str)]) -> Engine {
        use crate::capabilities::namespaces::Limits;
        let mode = SandboxMode::Landlock {
            profile: super::super::sandbox::Profile::Strict,
            abi: 4,
            extra_read: Vec::new(),
            extra_exec: Vec::new(),
            connect_ports: vec![443],
            namespaces: Namespaces::On {
                limits: Limits {
                    memory,
                    ..Limits::default()
                },
            },
            agent_socket: None,
        };
        let support = super::super::CgroupSupport::V2 {
            parent: "/nonexistent".into(),
        };
        Engine::builder("/bin/sh", "/nonexistent-temp-root")
            .env(
                env.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
            .sandbox(mode)
            .job_cgroups(run.and_then(|m| super::super::JobCgroups::new(support, m, 64)))
            .build()
            .unwrap()
    }

    #[test]
    fn the_go_collector_is_tuned_to_half_the_smaller_memory_cap_and_the_config_may_override_it() {
        let go = |e: &Engine| {
            let env = e.child_env(&BTreeMap::new(), None, None);
            let get = |k: &str| env.get(k).map(|v| v.to_string_lossy().into_owned());
            (get("GOGC"), get("GOMEMLIMIT"))
        };
        let some = |gc: &str, limit: &str| (Some(gc.to_string()), Some(limit.to_string()));
        // The sandbox's per-process cap alone, then a smaller run cgroup, then a larger one.
        assert_eq!(go(&capped(4 << 30, None, &[])), some("400", "2048MiB"));
        assert_eq!(
            go(&capped(4 << 30, Some(1 << 30), &[])),
            some("400", "512MiB")
        );
        assert_eq!(
            go(&capped(1 << 30, Some(8 << 30), &[])),
            some("400", "512MiB")
        );
        // `engine.env` wins.
        let own = capped(4 << 30, None, &[("GOGC", "100"), ("GOMEMLIMIT", "300MiB")]);
        assert_eq!(go(&own), some("100", "300MiB"));
        // No cap, no tuning: the engine's own defaults.
        assert_eq!(go(&engine_with(&[])), (None, None));
    }
}
