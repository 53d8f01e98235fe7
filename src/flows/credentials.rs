//! Which credentials the engine gets: plans of MR code never see the apply credentials.
//!
//! `engine.env` is handed to every run (state backend password, encryption passphrase), plus
//! `[engine.plan] env` for MR plans or `[engine.apply] env` for the default branch's runs. The
//! Proxmox endpoint and token come from `[proxmox.plan]` for plans and `[proxmox.apply]` for
//! applies (each falling back to `[proxmox]`), as the provider's `PROXMOX_VE_ENDPOINT` /
//! `PROXMOX_VE_API_TOKEN` (and `PROXMOX_VE_INSECURE`): a read-only token can plan every MR
//! while only the apply job on protected `main` runs with the token that may change things.

use crate::core::config::{Config, ProxmoxEndpoint};
use std::collections::BTreeMap;

/// What a run is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    Plan,
    Apply,
}

/// The Proxmox endpoint for `use_`.
pub fn proxmox_for(config: &Config, use_: Use) -> ProxmoxEndpoint {
    match use_ {
        Use::Plan => config.proxmox.for_plan(),
        Use::Apply => config.proxmox.for_apply(),
    }
}

/// The engine environment for `use_`: `engine.env` plus the matching Proxmox credentials.
pub fn engine_env(config: &Config, use_: Use) -> BTreeMap<String, String> {
    let per_use = match use_ {
        Use::Plan => &config.engine.plan_env,
        Use::Apply => &config.engine.apply_env,
    };
    // `[engine] env` is the default for both; `[engine.plan]`/`[engine.apply]` win per key.
    let mut env: BTreeMap<String, String> = config
        .engine
        .env
        .iter()
        .chain(per_use)
        .map(|(k, v)| (k.clone(), v.expose().to_string()))
        .collect();
    let pve = proxmox_for(config, use_);
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
    if let (Use::Apply, Some(ssh)) = (use_, &config.proxmox.apply_ssh) {
        env.insert("PROXMOX_VE_SSH_USERNAME".into(), ssh.username.clone());
        if let Some(key) = &ssh.private_key {
            env.insert("PROXMOX_VE_SSH_PRIVATE_KEY".into(), key.expose().to_string());
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
