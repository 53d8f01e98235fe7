//! SDN changes that nothing applies (PVE018): Proxmox keeps changes to SDN zones, VNets and
//! subnets pending until the SDN configuration is applied (`pvesh set /cluster/sdn`, or a
//! `proxmox_virtual_environment_sdn_applier`); until then a new VNet's bridge exists on no node.

use super::model::{self, after, block_len, Kind, Res};
use super::{finding, Finding, LintInput};
use serde_json::json;

/// PVE018: the plan changes SDN objects and no SDN applier changes with them. Names the guests
/// of the plan that attach to a VNet it creates or changes (they cannot start until it is applied).
pub fn pve018(input: &LintInput) -> Vec<Finding> {
    let sdn = model::sdn_changes(input.plan);
    if sdn.changed.is_empty() || sdn.applied {
        return Vec::new();
    }
    let mut guests = Vec::new();
    for rc in input.plan.managed_changes() {
        let Some(kind) = Kind::of(rc) else { continue };
        if !(kind.is_vm() || kind == Kind::Container) || !model::is_planned(rc) {
            continue;
        }
        let res = Res::parse(rc);
        let block = if kind == Kind::Container {
            "network_interface"
        } else {
            "network_device"
        };
        let on_vnet = (0..block_len(&res, block)).any(|i| {
            after(&res, &format!("{block}.{i}.bridge"))
                .str()
                .is_some_and(|b| sdn.vnets.iter().any(|v| v == b))
        });
        if on_vnet {
            guests.push(rc.address.clone());
        }
    }
    vec![finding(
        "PVE018",
        &sdn.changed[0],
        json!({"changed": sdn.changed, "vnets": sdn.vnets, "guests": guests}),
    )]
}
