//! Capabilities: one concrete client per external thing.
pub mod gitlab;
pub mod proxmox;
