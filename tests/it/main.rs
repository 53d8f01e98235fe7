//! planbot's integration tests, one binary: each module is a story (open an MR, push, read the
//! note), told with the shared helpers of `support` (the fake GitLab and Proxmox, the engine).

#[macro_use]
mod support;

mod apply_story;
mod architecture;
mod browser_pages;
mod ci_template;
mod deploy;
mod doctor_binary;
mod drift_hostile;
mod drift_issue;
mod drift_schedule;
mod drift_story;
mod drift_visible;
mod engine_bounds;
mod engine_cli;
mod engine_env;
mod engine_process;
mod engine_runner;
mod fingerprint_engine;
mod first_day;
mod fuzz_replay;
mod gitlab_client;
mod gitlab_fake;
mod gitlab_plan_flow;
mod gitlab_reading;
mod isolation;
mod lint_rules;
mod memory_bounds;
mod policy_cli;
mod policy_eval;
mod policy_examples;
mod policy_story;
mod preflight_checks;
mod preflight_tls;
mod redaction_canaries;
mod render_cli;
mod render_notes;
mod replicas_story;
mod repo_config_cli;
mod repo_docs;
mod sandbox;
mod service_config;
mod service_crash;
mod service_e2e;
mod service_intake;
mod service_logs;
mod service_pages;
mod service_queue;
mod service_sandbox;
mod state_story;
mod store_migrate;
mod store_schema;
mod templates;
mod workspace_git;
