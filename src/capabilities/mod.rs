//! Capabilities: one concrete client per external thing (GitLab, git, the engine and its
//! sandbox, Proxmox, the store), each with an injectable base URL, binary or path.
pub mod checkout_file;
pub mod engine;
pub mod gitlab;
pub mod listen_guard;
pub mod namespaces;
pub mod process_start;
pub mod proxmox;
pub mod state_gate;
pub mod store;
pub mod workspace;
