//! Capabilities: one concrete client per external thing.
pub mod engine;
pub mod gitlab;
pub mod proxmox;
pub mod sandbox;
pub mod store;
pub mod workspace;
