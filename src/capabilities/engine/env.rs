//! The engine's environment, built from scratch: `PATH`, `HOME`, `TF_IN_AUTOMATION=1`,
//! `TF_INPUT=0`, `TF_PLUGIN_CACHE_DIR`, the configured `engine.env`, the per-call extra env,
//! `TF_WORKSPACE` when asked, and on OpenTofu `TF_ENCRYPTION` for the plan file. Nothing is
//! inherited (no `TF_CLI_ARGS*`, `TF_LOG*`, stray `TF_VAR_*`, tokens).

use super::Engine;
use std::collections::BTreeMap;
use std::ffi::OsString;

/// Keys never passed to the engine, whoever sets them.
pub(super) fn forbidden_env_key(key: &str) -> bool {
    key.starts_with("TF_LOG") || key.starts_with("TF_CLI_ARGS")
}

impl Engine {
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
}
