//! Which credentials the engine gets: plans of MR code never see the apply credentials.
//!
//! `engine.env` is handed to every run (state backend password, encryption passphrase), plus
//! `[engine.plan] env` for MR plans or `[engine.apply] env` for the default branch's runs. The
//! Proxmox endpoint and token come from `[proxmox.plan]` for plans and `[proxmox.apply]` for
//! applies (each falling back to `[proxmox]`), as the provider's `PROXMOX_VE_ENDPOINT` /
//! `PROXMOX_VE_API_TOKEN` (and `PROXMOX_VE_INSECURE`): a read-only token can plan every MR
//! while only the apply job on protected `main` runs with the token that may change things.
//!
//! GitLab-managed state and modules follow the same split: `[state.plan]` (a Developer's
//! token: MR plans only read the state) or `[state.apply]` (a Maintainer's: lock and write),
//! `[modules.plan]` or `[modules.apply]` (read-only, for `init` only). Never the bot's token.
//! The state tokens never reach the engine: it gets a pass through the job's state gate
//! ([`crate::capabilities::state_gate`], set up by [`super::plan_request`]), good there alone.

use crate::capabilities::state_gate::GatePass;
use crate::core::config::{Config, GitlabCredential, ProxmoxEndpoint};
use crate::core::state;
use std::collections::BTreeMap;

/// Whose code an engine run executes, which decides its credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// An MR's plan: untrusted code, the plan credentials.
    MergeRequest,
    /// Plans and applies on the protected default branch: reviewed code, the apply credentials.
    DefaultBranch,
}

/// What the job's state gate refused, for the note: each refusal with why, and when the
/// engine's output says a state endpoint refused its credential (a `terraform_remote_state`
/// pointed at GitLab itself, where the job's credential is no use), what that credential is.
/// Empty when the gate refused nothing and the engine saw no refused credential.
pub fn gate_explanation(gate: Option<&GatePass>, output: &str) -> String {
    let Some(gate) = gate else {
        return String::new();
    };
    let mut lines = gate.refusals();
    let refused_credential = output.contains("remote state endpoint requires auth")
        || output.contains("remote state endpoint invalid auth");
    if lines.is_empty() && refused_credential {
        lines.push(crate::core::templates::text(
            "state.txt.j2",
            "gate_direct",
            minijinja::context! { own => gate.project() },
        ));
    }
    lines.join("\n")
}

/// Whether the engine reaches GitLab itself: module tokens are set up (`init` fetches modules
/// over git or the module registry). GitLab-managed state does not count: the engine reaches
/// it only through the job's state gate on loopback.
pub fn uses_gitlab(config: &Config) -> bool {
    let modules = &config.modules;
    modules.plan.is_some() || modules.apply.is_some()
}

/// The module credentials `init` gets in a run for `use_` (none without a token).
pub fn module_env(config: &Config, trust: Trust) -> BTreeMap<String, String> {
    let credential: Option<&GitlabCredential> = match trust {
        Trust::MergeRequest => config.modules.plan.as_ref(),
        Trust::DefaultBranch => config.modules.apply.as_ref(),
    };
    credential
        .map(|c| state::module_env(&config.gitlab.url, c))
        .unwrap_or_default()
}

/// The Proxmox endpoint for `use_`.
pub fn proxmox_for(config: &Config, trust: Trust) -> ProxmoxEndpoint {
    match trust {
        Trust::MergeRequest => config.proxmox.for_plan(),
        Trust::DefaultBranch => config.proxmox.for_apply(),
    }
}

/// Whether the default branch's runs get SSH credentials for the bpg provider: from
/// `[proxmox.apply] ssh_*`, or `PROXMOX_VE_SSH_*` set by the operator in the apply's env.
pub fn apply_has_ssh(config: &Config) -> bool {
    let env = engine_env(config, Trust::DefaultBranch);
    env.contains_key("PROXMOX_VE_SSH_PRIVATE_KEY")
        || env.contains_key("PROXMOX_VE_SSH_PASSWORD")
        || env.get("PROXMOX_VE_SSH_AGENT").is_some_and(|v| v == "true")
}

/// The engine environment for `use_`: `engine.env` plus the matching Proxmox credentials.
pub fn engine_env(config: &Config, trust: Trust) -> BTreeMap<String, String> {
    let per_use = match trust {
        Trust::MergeRequest => &config.engine.plan_env,
        Trust::DefaultBranch => &config.engine.apply_env,
    };
    // `[engine] env` is the default for both; `[engine.plan]`/`[engine.apply]` win per key.
    let mut env: BTreeMap<String, String> = config
        .engine
        .env
        .iter()
        .chain(per_use)
        .map(|(k, v)| (k.clone(), v.expose().to_string()))
        .collect();
    let pve = proxmox_for(config, trust);
    if let Some(endpoint) = &pve.endpoint {
        env.insert("PROXMOX_VE_ENDPOINT".into(), endpoint.clone());
    }
    if let Some(token) = &pve.api_token {
        let token = token.expose();
        let token = token.strip_prefix("PVEAPIToken=").unwrap_or(token);
        env.insert("PROXMOX_VE_API_TOKEN".into(), token.to_string());
    }
    if pve.insecure {
        env.insert("PROXMOX_VE_INSECURE".into(), "true".into());
    }
    // SSH to the nodes (the bpg provider uploads snippets over SSH): applies only.
    if let (Trust::DefaultBranch, Some(ssh)) = (trust, &config.proxmox.apply_ssh) {
        env.insert("PROXMOX_VE_SSH_USERNAME".into(), ssh.username.clone());
        if let Some(key) = &ssh.private_key {
            env.insert(
                "PROXMOX_VE_SSH_PRIVATE_KEY".into(),
                key.expose().to_string(),
            );
        }
        if let Some(sock) = &ssh.agent_socket {
            env.insert("PROXMOX_VE_SSH_AGENT".into(), "true".into());
            env.insert(
                "PROXMOX_VE_SSH_AUTH_SOCK".into(),
                sock.display().to_string(),
            );
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----";

    fn config(extra: &str) -> Config {
        let text = format!(
            r#"
fingerprint_key = "0123456789abcdef0123"
[gitlab]
url = "https://gitlab.example.com/"
token = "glpat-secret-token"
webhook_secret = "hook-secret"
projects = ["infra/homelab"]
[engine]
env = {{ SHARED = "both" }}
[engine.plan]
env = {{ TF_VAR_plan_only = "p" }}
[engine.apply]
env = {{ TF_VAR_apply_only = "a" }}
[proxmox.apply]
ssh_username = "root"
ssh_private_key_file = "/run/secrets/pve-ssh-key"
{extra}
"#
        );
        Config::load(&text, &[], &|_| Ok(KEY.to_string())).unwrap()
    }

    #[test]
    fn ssh_and_apply_env_reach_only_the_default_branchs_runs() {
        let c = config("");
        let plan = engine_env(&c, Trust::MergeRequest);
        let apply = engine_env(&c, Trust::DefaultBranch);
        assert_eq!(plan.get("SHARED").map(String::as_str), Some("both"));
        assert_eq!(apply.get("SHARED").map(String::as_str), Some("both"));
        assert!(plan.contains_key("TF_VAR_plan_only"));
        assert!(!plan.contains_key("TF_VAR_apply_only"));
        assert!(apply.contains_key("TF_VAR_apply_only"));
        assert!(!apply.contains_key("TF_VAR_plan_only"));
        assert!(
            !plan.keys().any(|k| k.starts_with("PROXMOX_VE_SSH")),
            "{plan:?}"
        );
        assert_eq!(apply["PROXMOX_VE_SSH_USERNAME"], "root");
        assert!(apply["PROXMOX_VE_SSH_PRIVATE_KEY"].starts_with("-----BEGIN OPENSSH"));
        // The key is a secret: scrubbed from every output.
        assert!(c
            .secrets()
            .iter()
            .any(|s| s.contains("b3BlbnNzaC1rZXktdjEAAAAA")));
    }

    #[test]
    fn an_ssh_key_that_is_not_a_key_is_refused() {
        let text = r#"
fingerprint_key = "0123456789abcdef0123"
[gitlab]
url = "https://gitlab.example.com/"
token = "glpat-secret-token"
webhook_secret = "hook-secret"
projects = ["infra/homelab"]
[proxmox.apply]
ssh_username = "root"
ssh_private_key = "ssh-ed25519 AAAA the-public-key-by-mistake"
"#;
        let err = Config::load(text, &[], &|_| Err("no files".into())).unwrap_err();
        assert!(
            err.to_string().contains("proxmox.apply.ssh_private_key"),
            "{err}"
        );
    }
}
