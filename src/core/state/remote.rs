//! Reading another root's GitLab-managed state under the state gate: the override planbot
//! writes beside every `data "terraform_remote_state"` over `http`, so that code written as
//! GitLab's docs write it (GitLab's own address, a token from a variable) reads through the job's
//! gate with the job's credential.
//!
//! The engine cannot reach GitLab for state (its port is not on the sandbox's allow-list, and
//! the real token never enters the sandbox), so a `terraform_remote_state` addressed to
//! `https://gitlab.example.com/api/v4/projects/42/terraform/state/network` would fail. An
//! override file (`*_override.tf`) merges into the block of the same name: planbot keeps the
//! block's own `config` expression, as written, and only turns an address at this GitLab into
//! the same path at the gate (`replace` with a pattern of GitLab's URL) and the credentials of
//! such an address into none, so the `http` backend takes the job's own from `TF_HTTP_USERNAME`
//! and `TF_HTTP_PASSWORD`. Whatever the code's address and credentials, the gate decides what is
//! read (this project's states only); an address elsewhere is left as it is.
//!
//! Pure: the flow reads the directory's files and writes the text this returns.

use crate::core::hcl::hcl_string;

/// The override file planbot writes into a directory whose code reads GitLab-managed state.
pub const OVERRIDE_FILE: &str = "planbot_remote_state_override.tf";

/// GitLab's state API as the repository's code names it, and the job's gate that answers for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRedirect {
    /// An RE2 pattern (the engine's `regex` and `replace`) of `<gitlab.url>/api/v4/projects/`
    /// at the start of an address: scheme and host in any case, the default port written or not.
    pattern: String,
    /// `<gate>/api/v4/projects/`.
    gate: String,
}

impl StateRedirect {
    /// The redirect from `gitlab_url` (`gitlab.url`) to `gate_url` (`http://127.0.0.1:<port>`);
    /// `None` when `gitlab_url` is not an `http(s)` URL with a host.
    pub fn new(gitlab_url: &str, gate_url: &str) -> Option<StateRedirect> {
        let url = url::Url::parse(gitlab_url).ok()?;
        let scheme = url.scheme();
        if scheme != "http" && scheme != "https" {
            return None;
        }
        let host = url.host_str()?;
        let port = match (url.port(), url.port_or_known_default()) {
            // Written in the config: the code must name it too.
            (Some(p), _) => format!(":{p}"),
            (None, Some(default)) => format!("(?::{default})?"),
            (None, None) => String::new(),
        };
        let path = url.path().trim_end_matches('/');
        Some(StateRedirect {
            pattern: format!(
                "^(?i:{}://{}){port}{}/api/v4/projects/",
                regex_escape(scheme),
                regex_escape(host),
                regex_escape(path)
            ),
            gate: format!("{}/api/v4/projects/", gate_url.trim_end_matches('/')),
        })
    }

    /// The pattern, as the engine's `regex()` takes it.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }
}

/// The override text for the `terraform_remote_state` blocks over `http` in one directory's
/// configuration files (`(file name, text)`; `.tf`, `.tofu` and their `.json` forms), or `None`
/// when there is none. A file that does not parse overrides nothing (the engine says why).
pub fn remote_state_override(
    files: &[(String, String)],
    redirect: &StateRedirect,
) -> Option<String> {
    let blocks: Vec<(String, String)> = crate::core::hcl::http_state_blocks(files)
        .into_iter()
        .filter(|(label, _)| plain_label(label))
        .collect();
    if blocks.is_empty() {
        return None;
    }
    let mut out = String::from(
        "# Written by planbot: GitLab-managed state is read through this job's state gate.\n",
    );
    for (label, config) in &blocks {
        out.push_str(&override_block(label, config, redirect));
    }
    Some(out)
}

/// One block's override: the block's own `config` (`config`, an HCL expression as written,
/// named `c` once by a one-element `for`), its address at GitLab turned into the gate's, and
/// that address's credentials dropped.
fn override_block(label: &str, config: &str, redirect: &StateRedirect) -> String {
    let pattern = hcl_string(&redirect.pattern);
    let slashed = hcl_string(&format!("/{}/", redirect.pattern));
    let gate = hcl_string(&redirect.gate);
    format!(
        "data \"terraform_remote_state\" \"{label}\" {{
  config = [for c in [({config})] : merge(c, {{
    address  = try(replace(c.address, {slashed}, {gate}), null)
    username = can(regex({pattern}, c.address)) ? null : try(c.username, null)
    password = can(regex({pattern}, c.address)) ? null : try(c.password, null)
  }})][0]
}}
"
    )
}

/// A block label planbot writes back: an identifier as the engine takes one.
fn plain_label(label: &str) -> bool {
    let mut chars = label.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && label.len() <= 256
}

/// `s` as an RE2 pattern matching it literally.
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redirect() -> StateRedirect {
        StateRedirect::new("https://GitLab.example.com/", "http://127.0.0.1:4711").unwrap()
    }

    #[test]
    fn the_pattern_names_gitlab_in_any_case_with_or_without_its_default_port() {
        assert_eq!(
            redirect().pattern(),
            r"^(?i:https://gitlab\.example\.com)(?::443)?/api/v4/projects/"
        );
        let prefixed =
            StateRedirect::new("http://10.0.0.5:8929/gitlab", "http://127.0.0.1:1").unwrap();
        assert_eq!(
            prefixed.pattern(),
            r"^(?i:http://10\.0\.0\.5):8929/gitlab/api/v4/projects/"
        );
        assert!(StateRedirect::new("file:///etc", "http://127.0.0.1:1").is_none());
    }

    #[test]
    fn a_block_over_http_keeps_its_config_as_written_and_others_are_left_alone() {
        let files = vec![
            (
                "main.tf".to_string(),
                r#"
data "terraform_remote_state" "network" {
  backend = "http"
  config = {
    address  = "https://gitlab.example.com/api/v4/projects/42/terraform/state/network"
    username = var.user
    password = var.token
  }
}
data "terraform_remote_state" "s3" {
  backend = "s3"
  config  = { bucket = "b" }
}
data "http" "x" { url = "https://example.com" }
"#
                .to_string(),
            ),
            ("broken.tf".to_string(), "data {".to_string()),
        ];
        let text = remote_state_override(&files, &redirect()).unwrap();
        insta::assert_snapshot!(text);
        assert!(!text.contains("\"s3\""));
    }

    #[test]
    fn the_json_form_is_read_as_its_hcl() {
        let files = vec![(
            "remote.tf.json".to_string(),
            r#"{"data": [{"terraform_remote_state": {"up": {"backend": "http", "count": 1,
                "config": {"address": "${var.gitlab}/api/v4/projects/7/terraform/state/a\"b", "retry_max": 2}}}}]}"#
                .to_string(),
        )];
        let text = remote_state_override(&files, &redirect()).unwrap();
        assert!(
            text.contains(r#"[for c in [({ "address" = "${var.gitlab}/api/v4/projects/7/terraform/state/a\"b", "retry_max" = 2 })] : merge(c, {"#),
            "{text}"
        );
    }

    #[test]
    fn nothing_to_override_writes_nothing_and_a_label_is_never_code() {
        let plain = vec![(
            "main.tf".to_string(),
            "resource \"x\" \"y\" {}\n".to_string(),
        )];
        assert_eq!(remote_state_override(&plain, &redirect()), None);
        let json = vec![(
            "x.tf.json".to_string(),
            r#"{"data": {"terraform_remote_state": {"a\" {}\nresource \"x": {"backend": "http", "config": {}}}}}"#.to_string(),
        )];
        assert_eq!(remote_state_override(&json, &redirect()), None);
    }

    #[test]
    fn a_pattern_or_gate_is_written_as_plain_text() {
        assert_eq!(hcl_string("a${b}%{c}\"\\"), r#""a$${b}%%{c}\"\\""#);
        assert_eq!(regex_escape("a.b-c(d)"), r"a\.b-c\(d\)");
    }
}
