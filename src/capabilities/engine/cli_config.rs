//! The engine's CLI configuration: the user's own, or (the service) a file written by planbot
//! for each run with an explicit `provider_installation` (`TF_CLI_CONFIG_FILE`), so neither a
//! repository's implied local mirror (`terraform.d/plugins`) nor a `.terraformrc` is used.

use std::path::PathBuf;

/// Where the engine's CLI configuration (provider installation, credentials) comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CliConfig {
    /// The user's own (`~/.terraformrc`, `~/.tofurc`): local runs of the user's own code.
    #[default]
    User,
    /// Written by planbot for each run, with a private `HOME`: only the installation method
    /// below, never a repository's `terraform.d/plugins` or a committed `.terraformrc`.
    Owned {
        provider_mirror: Option<ProviderMirror>,
    },
}

/// The operator's provider mirror (`engine.provider_mirror`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderMirror {
    /// `network_mirror { url = ... }` (an `https://` URL).
    Network(String),
    /// `filesystem_mirror { path = ... }` (an absolute directory, readable in the sandbox).
    Filesystem(PathBuf),
}

/// The CLI configuration file of an owned run: providers come from the registry (`direct`) or
/// the operator's mirror, and from nowhere else.
pub fn cli_config_text(mirror: Option<&ProviderMirror>) -> String {
    let method = match mirror {
        None => "  direct {}\n".to_string(),
        Some(ProviderMirror::Network(url)) => {
            format!("  network_mirror {{\n    url = {}\n  }}\n", hcl_string(url))
        }
        Some(ProviderMirror::Filesystem(dir)) => format!(
            "  filesystem_mirror {{\n    path = {}\n  }}\n",
            hcl_string(&dir.to_string_lossy())
        ),
    };
    format!("# Written by planbot for this run only.\nprovider_installation {{\n{method}}}\n")
}

/// A quoted HCL string (JSON string escaping is valid HCL, and `${`/`%{` are escaped).
fn hcl_string(s: &str) -> String {
    serde_json::to_string(s)
        .unwrap_or_default()
        .replace("${", "$${")
        .replace("%{", "%%{")
}
