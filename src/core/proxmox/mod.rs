//! What planbot knows of Proxmox VE, pure: the plan's Proxmox resources, the lint rules, the
//! preflight's checks, HA, what a plan takes from the cluster, the privileges, the findings.
//!
//! - [`model`]: the Proxmox resources of a plan, indexed for the rules (VMs, disks, files).
//! - [`findings`]: what lint and preflight both report (`Finding`, `Severity`, `RULES`).
//! - [`access`]: the privileges each check needs and the roles the fixes grant.
//! - [`lint`]: the lint rules over a plan.
//! - [`ha`]: HA in the preflight (PVE112, PVE113).
//! - [`capacity`]: what a plan takes from each node and datastore next to what is free.
//! - [`preflight`]: the checks that need the live API, evaluated from what was read.

pub mod access;
pub mod capacity;
pub mod findings;
pub mod ha;
pub mod lint;
pub mod model;
pub mod preflight;
