//! Pure core: events, config, plan model, redaction, fingerprint, rendering, lint rules. No I/O, no async.
pub mod fingerprint;
pub mod ids;
pub mod lint;
pub mod plan;
pub mod preflight;
pub mod redact;
pub mod render;
pub mod summary;
