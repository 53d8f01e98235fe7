//! Proxmox preflight, the fetching half: read-only API calls for what the plan needs, then the
//! pure evaluation in `core::proxmox::preflight`. Runs in the plan flow and again just before apply.

use crate::capabilities::proxmox::{Proxmox, ProxmoxEndpoint, ProxmoxError};
use crate::core::plan::Plan;
use crate::core::proxmox::capacity::{self, Capacity};
use crate::core::proxmox::findings::Finding;
use crate::core::proxmox::preflight::{self, ClusterFacts, Needs, NodeFact, StorageFact};
use anyhow::Result;
use std::collections::BTreeSet;

/// The preflight's findings for `plan` (PVE101–PVE107). Only GET requests are made; when
/// the API cannot give what the checks need, the findings are one PVE101 error (fail closed).
pub async fn preflight(client: &Proxmox, plan: &Plan) -> Result<Vec<Finding>> {
    Ok(run(client, plan).await.findings)
}

/// One preflight: its findings, the facts it fetched (the plan flow passes
/// `facts.lint_facts()` to the lint rules so that a snippet on shared storage is not
/// reported), and why it could not run, if it could not.
#[derive(Debug, Clone, Default)]
pub struct Ran {
    pub findings: Vec<Finding>,
    pub facts: ClusterFacts,
    /// The API could not give what the checks need; `findings` is then one PVE101 error.
    pub failed: Option<String>,
    /// What the plan takes from the cluster next to what is free (empty when it takes nothing
    /// or the preflight could not run).
    pub capacity: Capacity,
}

/// [`preflight`] with the facts and the failure, if any.
pub async fn run(client: &Proxmox, plan: &Plan) -> Ran {
    run_as(client, plan, None).await
}

/// [`run`], judging what only some users may do (PVE110) by `apply_identity`, who the apply
/// acts as (its token's id), rather than by the token the preflight reads with.
pub async fn run_as(client: &Proxmox, plan: &Plan, apply_identity: Option<String>) -> Ran {
    let needs = preflight::needs(plan);
    match gather_as(client, &needs, apply_identity).await {
        Ok(facts) => Ran {
            findings: preflight::evaluate(&needs, &facts),
            capacity: preflight::capacity_of(&needs, &facts),
            facts,
            failed: None,
        },
        Err(e) => Ran {
            findings: vec![preflight::could_not_run(
                client.base_url().as_str(),
                &e.to_string(),
            )],
            facts: ClusterFacts {
                token_id: client.token_id().to_string(),
                ..ClusterFacts::default()
            },
            failed: Some(e.to_string()),
            capacity: Capacity::default(),
        },
    }
}

/// Fetch what `needs` asks about: version, nodes, storages (cluster-wide and per node),
/// one `/access/permissions?path=` per needed path, and whether fixed VM ids are taken.
pub async fn gather(client: &Proxmox, needs: &Needs) -> Result<ClusterFacts, ProxmoxError> {
    gather_as(client, needs, None).await
}

/// [`gather`], asking what the apply may do (`SDN.Use`, PVE114) for `apply_identity` (its
/// token's id), else for the token the preflight reads with.
pub async fn gather_as(
    client: &Proxmox,
    needs: &Needs,
    apply_identity: Option<String>,
) -> Result<ClusterFacts, ProxmoxError> {
    let mut facts = ClusterFacts {
        token_id: client.token_id().to_string(),
        apply_identity,
        ..ClusterFacts::default()
    };
    facts.version = Some(client.version().await?.version);
    if needs.is_empty() {
        return Ok(facts);
    }
    facts.nodes = client
        .nodes()
        .await?
        .into_iter()
        .map(|n| NodeFact {
            online: n.is_online(),
            status: n.status.clone().unwrap_or_else(|| "unknown".into()),
            name: n.node,
        })
        .collect();
    if !needs.storages.is_empty() {
        facts.storages = client
            .storage()
            .await?
            .into_iter()
            .map(|s| StorageFact {
                file_based: s.is_file_based(),
                id: s.storage,
                storage_type: s.storage_type,
                content: s.content,
                nodes: s.nodes,
                enabled: !s.disable,
                shared: s.shared,
            })
            .collect();
        let nodes: BTreeSet<&String> = needs
            .storages
            .iter()
            .filter_map(|s| s.node.as_ref())
            .filter(|n| facts.nodes.iter().any(|f| &f.name == *n && f.online))
            .collect();
        for node in nodes {
            let ids = client
                .node_storage(node)
                .await?
                .into_iter()
                .filter(|s| s.enabled)
                .map(|s| s.storage)
                .collect();
            facts.node_storages.insert(node.clone(), ids);
        }
    }
    for path in needs.permission_paths() {
        let privs = client.privileges_on(&path).await?;
        facts.privileges.insert(path, privs);
    }
    if !needs.vmids.is_empty() || !needs.clones.is_empty() {
        guests_and_ids(client, needs, &mut facts).await?;
    }
    facts.free = free_now(client, needs, &facts).await?;
    let (missing, vnets) = missing_bridges(client, needs, &facts).await?;
    facts.missing_bridges = missing;
    if !vnets.is_empty() {
        sdn_vnets(client, vnets, &mut facts).await?;
    }
    if !needs.ha_moves.is_empty() {
        let pve9 = facts
            .version
            .as_deref()
            .and_then(|v| v.split('.').next()?.parse::<u64>().ok())
            .is_some_and(|major| major >= 9);
        facts.ha = Some(ha(client, pve9).await?);
    }
    Ok(facts)
}

/// What HA says (PVE112): its resources, and the rules (PVE 9) or groups (before) that place
/// them. A refused read (403) is `Err(why)`: the finding then says the check could not run.
async fn ha(
    client: &Proxmox,
    pve9: bool,
) -> Result<Result<crate::core::proxmox::ha::HaFacts, String>, ProxmoxError> {
    let resources = match refused(client.ha_resources().await)? {
        Ok(r) => r,
        Err(why) => return Ok(Err(why)),
    };
    let placement = if pve9 {
        refused(client.ha_rules().await)?
    } else {
        refused(client.ha_groups().await)?
    };
    Ok(placement.map(|p| crate::core::proxmox::ha::ha_facts(&resources, &p, pve9)))
}

/// The cluster's guests (`GET /cluster/resources?type=vm`, once) and which of the plan's fixed
/// ids are taken (PVE106) — all of them checked against that one list. The list shows only the
/// guests the token may audit: unless the token's privileges (`GET /access/permissions`) and the
/// cluster's ACLs (`GET /access/acl`) prove the list complete, an id the list does not show is
/// asked about one by one (`GET /cluster/nextid?vmid=`), so a guest hidden from the token still
/// counts.
async fn guests_and_ids(
    client: &Proxmox,
    needs: &Needs,
    facts: &mut ClusterFacts,
) -> Result<(), ProxmoxError> {
    facts.guests = client
        .guests()
        .await?
        .into_iter()
        .map(|g| {
            let fact = preflight::GuestFact {
                node: g.node,
                name: g.name.unwrap_or_default(),
                kind: g.guest_type,
                template: g.template,
            };
            (g.vmid, fact)
        })
        .collect();
    let ids: BTreeSet<u64> = needs.vmids.iter().map(|(_, id)| *id).collect();
    let unlisted = ids
        .iter()
        .chain(needs.clones.iter().map(|c| &c.template))
        .any(|id| !facts.guests.contains_key(id));
    if unlisted {
        let perms = client.permissions_all().await?;
        let acl = if crate::core::proxmox::access::reads_every_acl(&perms) {
            Some(client.acl_paths().await?)
        } else {
            None
        };
        facts.hidden_guests = crate::core::proxmox::access::hidden_guests(&perms, acl.as_deref());
    }
    for id in ids {
        let taken =
            facts.guests.contains_key(&id) || (facts.may_hide(id) && !client.next_id(id).await?);
        if taken {
            facts.taken_vmids.insert(id);
        }
    }
    if !facts.taken_vmids.is_empty() {
        facts.free_vmid = client.free_id().await.ok();
    }
    Ok(())
}

type MissingBridges = std::collections::BTreeMap<(String, String), Vec<String>>;

/// The (node, bridge) pairs the plan uses that the node does not have: asked per bridge
/// (`GET /nodes/{n}/network/{bridge}`, since PVE 9.2.5's list omits bridges), then as an SDN
/// VNet (those found are returned too, for PVE114). A VNet the plan creates is not missing
/// (PVE018 says when nothing applies it). A read the token may not make (403) leaves the pair
/// unjudged.
async fn missing_bridges(
    client: &Proxmox,
    needs: &Needs,
    facts: &ClusterFacts,
) -> Result<(MissingBridges, BTreeSet<String>), ProxmoxError> {
    let mut missing = std::collections::BTreeMap::new();
    let mut vnets = BTreeSet::new();
    let online = |node: &str| facts.nodes.iter().any(|n| n.name == node && n.online);
    for (node, bridge) in needs.bridges.keys().filter(|(n, _)| online(n)) {
        if needs.sdn.vnets.contains(bridge) {
            continue;
        }
        if !matches!(
            refused(client.has_interface(node, bridge).await)?,
            Ok(false)
        ) {
            continue;
        }
        match refused(client.has_vnet(bridge).await)? {
            Ok(false) => {}
            Ok(true) => {
                vnets.insert(bridge.clone());
                continue;
            }
            Err(_) => continue,
        }
        let have = refused(client.bridges(node).await)?.unwrap_or_default();
        missing.insert((node.clone(), bridge.clone()), have);
    }
    Ok((missing, vnets))
}

/// The VNets the plan's guests attach to (PVE114): their zone and pending state
/// (`GET /cluster/sdn/vnets?pending=1`, once), and whether the apply may use each
/// (`GET /access/permissions?path=/sdn/zones/{zone}/{vnet}&userid=…`). Refused reads are kept
/// as the reason, for the finding to say the check could not run.
async fn sdn_vnets(
    client: &Proxmox,
    vnets: BTreeSet<String>,
    facts: &mut ClusterFacts,
) -> Result<(), ProxmoxError> {
    let listed = match refused(client.vnets_pending().await)? {
        Ok(list) => list,
        Err(why) => {
            facts.vnets_unread = Some(why);
            Vec::new()
        }
    };
    let who = facts
        .apply_identity
        .clone()
        .unwrap_or_else(|| facts.token_id.clone());
    for vnet in vnets {
        let entry = listed
            .iter()
            .find(|e| e.get("vnet").and_then(serde_json::Value::as_str) == Some(&vnet));
        let field = |k: &str| {
            entry.and_then(|e| {
                e.get(k)
                    .or_else(|| e.get("pending").and_then(|p| p.get(k)))
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_string)
            })
        };
        let zone = field("zone");
        let may_use = match &zone {
            Some(z) => Some(
                refused(
                    client
                        .permissions_of(&who, &format!("/sdn/zones/{z}/{vnet}"))
                        .await,
                )?
                .map(|privs| privs.contains("SDN.Use")),
            ),
            None => None,
        };
        let state = entry
            .and_then(|e| e.get("state"))
            .and_then(serde_json::Value::as_str)
            .map(str::to_string);
        facts.vnets.insert(
            vnet,
            preflight::VnetFact {
                zone,
                state,
                may_use,
            },
        );
    }
    Ok(())
}

/// A read the token may not make (403) is not a failure of the preflight: the capacity row says
/// why its numbers are unknown. Anything else (a 5xx, a timeout) fails it, as every read does.
fn refused<T>(r: Result<T, ProxmoxError>) -> Result<Result<T, String>, ProxmoxError> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(ProxmoxError::Status {
            code: 403,
            status,
            message,
        }) => Ok(Err(message.unwrap_or(status))),
        Err(e) => Err(e),
    }
}

/// What is free now where the plan adds or frees something: one `GET /nodes/{n}/status` per
/// online node, one `GET /nodes/{n}/storage/{s}/status` per storage of an online node (a shared
/// storage once, on the first node).
async fn free_now(
    client: &Proxmox,
    needs: &Needs,
    facts: &ClusterFacts,
) -> Result<capacity::Free, ProxmoxError> {
    let mut free = capacity::Free::default();
    let online = |node: &str| facts.nodes.iter().any(|n| n.name == node && n.online);
    for node in needs.demand.nodes.keys().filter(|n| online(n)) {
        let status = refused(client.node_status(node).await)?.map(|s| capacity::NodeStatus {
            memory_total: s.memory.total,
            memory_free: s.memory.available.unwrap_or(s.memory.free),
            cpus: s.cpuinfo.cpus,
        });
        free.nodes.insert(node.clone(), status);
    }
    let mut shared: std::collections::BTreeMap<String, Result<capacity::StorageStatus, String>> =
        std::collections::BTreeMap::new();
    for (node, storage) in needs.demand.storages.keys().filter(|(n, _)| online(n)) {
        let known_shared = facts.storages.iter().any(|s| &s.id == storage && s.shared);
        let key = (node.clone(), storage.clone());
        if let Some(status) = shared.get(storage).filter(|_| known_shared) {
            free.storages.insert(key, status.clone());
            continue;
        }
        let status =
            refused(client.storage_status(node, storage).await)?.map(|s| capacity::StorageStatus {
                storage_type: s.storage_type,
                shared: s.shared,
                total: s.total,
                avail: s.avail,
            });
        if known_shared {
            shared.insert(storage.clone(), status.clone());
        }
        free.storages.insert(key, status);
    }
    Ok(free)
}

/// After an apply: which changes of the guests it updated wait for a reboot, read with the
/// apply's endpoint (`GET /nodes/{n}/{qemu|lxc}/{id}/pending`, read-only). The words for the
/// apply note, or `None` when nothing waits (or there is no endpoint, or no guest to ask about).
/// A read that fails says so: a provider reporting success is not proof.
pub async fn pending_after_apply(
    endpoint: Option<ProxmoxEndpoint>,
    guests: &[preflight::GuestRef],
) -> Option<String> {
    if guests.is_empty() {
        return None;
    }
    let client = Proxmox::new(endpoint?).ok()?;
    let mut waiting = Vec::new();
    for g in guests {
        match client.pending(&g.node, g.kind, g.vmid).await {
            Ok(entries) => waiting.push((g.address.clone(), preflight::waiting_changes(&entries))),
            Err(e) => {
                return Some(crate::core::proxmox::findings::render_macro(
                    "pending_unread",
                    &serde_json::json!({"error": e.to_string()}),
                ))
            }
        }
    }
    preflight::pending_note(&waiting)
}

/// The Proxmox endpoint for one use (plan or apply): the service config's
/// `[proxmox.plan]`/`[proxmox.apply]` over `[proxmox]` (pass `config.proxmox.for_plan()`), key
/// by key falling back to the provider's variables in `engine.env`, then in the process
/// environment (`PROXMOX_VE_ENDPOINT` / `PROXMOX_VE_API_TOKEN`, else `PM_VE_*`).
/// `None` when no endpoint and token can be found: the preflight is then skipped.
pub fn endpoint_from_config(
    configured: &crate::core::config::ProxmoxEndpoint,
    engine_env: &std::collections::BTreeMap<String, crate::core::config::Secret>,
) -> Option<ProxmoxEndpoint> {
    let lookup = |k: &str| {
        engine_env
            .get(k)
            .map(|s| s.expose().to_string())
            .or_else(|| std::env::var(k).ok())
            .filter(|v| !v.is_empty())
    };
    let from_env = ProxmoxEndpoint::from_lookup(lookup);
    let url = configured
        .endpoint
        .clone()
        .or_else(|| from_env.as_ref().map(|e| e.url.clone()))?;
    let token = configured
        .api_token
        .as_ref()
        .map(|s| s.expose().to_string())
        .or_else(|| from_env.as_ref().map(|e| e.api_token.expose().to_string()))?;
    let mut ep = ProxmoxEndpoint::new(url, token);
    ep.insecure = configured.insecure
        || (configured.endpoint.is_none() && from_env.as_ref().is_some_and(|e| e.insecure));
    ep.ca_file = configured.ca_file.clone();
    Some(ep)
}

/// What the plan flow puts in the note: the findings (to merge with the lint findings), the
/// preflight line for `NoteContext::preflight_note`, and facts that sharpen the lint rules.
#[derive(Debug, Clone, Default)]
pub struct PlanPreflight {
    pub findings: Vec<Finding>,
    pub note: String,
    pub lint_facts: crate::core::proxmox::findings::Facts,
    /// The note's capacity table and `data.planbot.capacity` (`None` when the preflight did not
    /// run, or the plan takes and frees nothing).
    pub capacity: Option<Capacity>,
    /// Why the preflight could not run (then `findings` is one PVE101 error).
    pub failed: Option<String>,
}

/// The plan flow's preflight: nothing at all (no line in the note) for a plan that does not
/// touch Proxmox ([`preflight::touches_proxmox`]); skipped (and said so) without an endpoint.
pub async fn for_plan(endpoint: Option<ProxmoxEndpoint>, plan: &Plan) -> PlanPreflight {
    for_plan_as(endpoint, None, plan).await
}

/// [`for_plan`] knowing who the apply will act as (`apply_identity`, its token's id), for the
/// checks that depend on it (PVE110).
pub async fn for_plan_as(
    endpoint: Option<ProxmoxEndpoint>,
    apply_identity: Option<String>,
    plan: &Plan,
) -> PlanPreflight {
    if !preflight::touches_proxmox(plan) {
        return PlanPreflight::default();
    }
    let Some(ep) = endpoint else {
        return PlanPreflight {
            note: preflight::skipped_note(),
            ..PlanPreflight::default()
        };
    };
    let url = ep.url.clone();
    let token_id = ep.api_token.id().to_string();
    let client = match Proxmox::new(ep) {
        Ok(c) => c,
        Err(e) => {
            let error = e.to_string();
            return PlanPreflight {
                findings: vec![preflight::could_not_run(&url, &error)],
                note: preflight::failed_note(&url, &token_id, &error),
                failed: Some(error),
                ..PlanPreflight::default()
            };
        }
    };
    let ran = run_as(&client, plan, apply_identity).await;
    let note = match &ran.failed {
        Some(error) => preflight::failed_note(&url, client.token_id(), error),
        None => preflight::ran_note(&url, client.token_id(), ran.findings.len()),
    };
    PlanPreflight {
        note,
        lint_facts: ran.facts.lint_facts(),
        capacity: Some(ran.capacity).filter(|c| !c.is_empty()),
        findings: ran.findings,
        failed: ran.failed,
    }
}

/// The apply flow's preflight, just before apply: `Err(why)` refuses the apply, naming the
/// first error finding and its fix — also when the preflight could not read what it needs
/// (fail closed). Without an endpoint, or for a plan that does not touch Proxmox
/// ([`preflight::touches_proxmox`]), the apply goes ahead (nothing to check, nothing waited for).
pub async fn before_apply(
    endpoint: Option<ProxmoxEndpoint>,
    plan: &Plan,
) -> std::result::Result<Vec<Finding>, String> {
    let Some(ep) = endpoint.filter(|_| preflight::touches_proxmox(plan)) else {
        return Ok(Vec::new());
    };
    let url = ep.url.clone();
    let findings = match Proxmox::new(ep) {
        Ok(client) => run(&client, plan).await.findings,
        Err(e) => vec![preflight::could_not_run(&url, &e.to_string())],
    };
    match preflight::apply_refusal(&findings) {
        Some(why) => Err(why),
        None => Ok(findings),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config::{ProxmoxConfig, ProxmoxEndpoint as Configured, Secret};
    use std::collections::BTreeMap;

    #[test]
    fn plan_and_apply_credentials_come_from_the_config_then_engine_env() {
        let cfg = ProxmoxConfig {
            default: Configured {
                endpoint: Some("https://pve01:8006/".into()),
                api_token: Some(Secret::new("tofu@pve!apply=aaa")),
                insecure: false,
                ca_file: None,
            },
            plan: Some(Configured {
                api_token: Some(Secret::new("tofu@pve!plan=bbb")),
                ..Configured::default()
            }),
            apply: None,
            apply_ssh: None,
        };
        let none = BTreeMap::new();
        let plan = endpoint_from_config(&cfg.for_plan(), &none).unwrap();
        let apply = endpoint_from_config(&cfg.for_apply(), &none).unwrap();
        assert_eq!(plan.url, "https://pve01:8006/");
        assert_eq!(plan.api_token.id(), "tofu@pve!plan");
        assert_eq!(apply.api_token.id(), "tofu@pve!apply");

        // Nothing in [proxmox]: the provider's variables in engine.env.
        let env = BTreeMap::from([
            (
                "PROXMOX_VE_ENDPOINT".to_string(),
                Secret::new("https://pve02:8006/"),
            ),
            (
                "PROXMOX_VE_API_TOKEN".to_string(),
                Secret::new("root@pam!tofu=ccc"),
            ),
        ]);
        let ep = endpoint_from_config(&Configured::default(), &env).unwrap();
        assert_eq!(ep.url, "https://pve02:8006/");
        assert_eq!(ep.api_token.id(), "root@pam!tofu");
        assert!(!ep.insecure);
    }
}
