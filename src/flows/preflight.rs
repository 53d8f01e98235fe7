//! Proxmox preflight, the fetching half: read-only API calls for what the plan needs, then the
//! pure evaluation in `core::preflight`. Runs in the plan flow and again just before apply.

use crate::capabilities::proxmox::{Proxmox, ProxmoxError};
use crate::core::lint::Finding;
use crate::core::plan::Plan;
use crate::core::preflight::{self, ClusterFacts, Needs, NodeFact, StorageFact};
use anyhow::Result;
use std::collections::BTreeSet;

/// The preflight's findings for `plan` (PVE101–PVE107). Only GET requests are made; an API
/// that cannot be used at all gives one PVE101 finding rather than an error.
pub async fn preflight(client: &Proxmox, plan: &Plan) -> Result<Vec<Finding>> {
    Ok(run(client, plan).await.0)
}

/// [`preflight`] plus the facts it fetched (the plan flow passes `facts.lint_facts()` to the
/// lint rules so that a snippet on shared storage is not reported).
pub async fn run(client: &Proxmox, plan: &Plan) -> (Vec<Finding>, ClusterFacts) {
    let needs = preflight::needs(plan);
    match gather(client, &needs).await {
        Ok(facts) => (preflight::evaluate(&needs, &facts), facts),
        Err(e) => (
            vec![preflight::unreachable(
                client.base_url().as_str(),
                &e.to_string(),
            )],
            ClusterFacts {
                token_id: client.token_id().to_string(),
                ..ClusterFacts::default()
            },
        ),
    }
}

/// Fetch what `needs` asks about: version, nodes, storages (cluster-wide and per node),
/// one `/access/permissions?path=` per needed path, and whether fixed VM ids are taken.
pub async fn gather(client: &Proxmox, needs: &Needs) -> Result<ClusterFacts, ProxmoxError> {
    let mut facts = ClusterFacts {
        token_id: client.token_id().to_string(),
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
    for (_, id) in &needs.vmids {
        if !client.next_id(*id).await? {
            facts.taken_vmids.insert(*id);
        }
    }
    if !facts.taken_vmids.is_empty() {
        facts.free_vmid = client.free_id().await.ok();
    }
    Ok(facts)
}
