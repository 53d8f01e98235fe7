//! planbot: review-before-apply for OpenTofu on GitLab (library root; the binary is a thin CLI).

pub mod capabilities;
pub mod core;
pub mod flows;
