//! planbot: review-before-apply for OpenTofu on GitLab (library root; the binary is a thin CLI).

/// mimalloc for every allocation of the binary, its tests and its benchmarks: reading a plan into
/// the policy interpreter and dropping it again are mostly allocator work (a quarter of a policy
/// evaluation with the system allocator; `cargo bench --bench policy`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod capabilities;
pub mod core;
pub mod flows;
