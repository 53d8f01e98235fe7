//! Pure core: events, config, plan model, redaction, fingerprint, rendering and its templates, lint
//! and preflight findings. No I/O, no async.
pub mod apply;
pub mod apply_note;
pub mod config;
pub mod defuse;
pub mod drift;
pub mod engine_kind;
pub mod events;
pub mod findings;
pub mod fingerprint;
pub mod ids;
pub mod lint;
pub mod note_html;
pub mod plan;
pub mod plan_digest;
pub mod policy;
pub mod preflight;
pub mod pve_access;
pub mod pve_model;
pub mod redact;
pub mod render;
pub mod repo_config;
pub mod state;
pub mod store_tls;
pub mod summary;
pub mod templates;
pub mod webhook;
