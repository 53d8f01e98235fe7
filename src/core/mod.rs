//! Pure core: events, config, plan model, redaction, fingerprint, rendering, lint rules.
//! No I/O, no async: everything here is a function of its arguments.
pub mod apply;
pub mod apply_note;
pub mod config;
pub mod engine_kind;
pub mod events;
pub mod fingerprint;
pub mod ids;
pub mod lint;
pub mod note_html;
pub mod plan;
pub mod plan_digest;
pub mod preflight;
pub mod pve_access;
pub mod redact;
pub mod render;
pub mod repo_config;
pub mod summary;
pub mod webhook;
