//! Which engine a binary is and its version (`BIN version -json`, run once per [`Engine`]).

use super::error::{EngineError, Step};
use super::output::RawLog;
use super::process::{Capture, StepCall};
use super::Engine;
pub use crate::core::engine_kind::EngineKind;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The engine's name and version, e.g. "Terraform 1.11.4" (its `Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineVersion {
    pub name: EngineKind,
    pub version: String,
}

impl fmt::Display for EngineVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.version)
    }
}

impl EngineVersion {
    /// Parse `BIN version -json`. Terraform's output has `terraform_outdated`; OpenTofu's,
    /// which keeps the `terraform_version` key, has not. `binary` breaks the tie when the JSON
    /// says nothing (a binary named `tofu…` is OpenTofu).
    pub fn from_version_json(json: &[u8], binary: &Path) -> Option<EngineVersion> {
        let v: serde_json::Value = serde_json::from_slice(json).ok()?;
        let version = v.get("terraform_version")?.as_str()?.to_string();
        let named_tofu = binary
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("tofu"));
        let name = if !named_tofu && v.get("terraform_outdated").is_some() {
            EngineKind::Terraform
        } else {
            EngineKind::OpenTofu
        };
        Some(EngineVersion { name, version })
    }
}

impl Engine {
    /// `BIN version -json`, run once and remembered.
    pub async fn version(&self) -> Result<EngineVersion, EngineError> {
        self.inner
            .version
            .get_or_try_init(|| self.detect_version())
            .await
            .cloned()
    }

    /// Run `BIN version -json` (sandboxed, at most a minute) and parse what it prints.
    async fn detect_version(&self) -> Result<EngineVersion, EngineError> {
        self.refuse_unsandboxed()?;
        let mut env = self.child_env(&BTreeMap::new(), None, None);
        env.insert("CHECKPOINT_DISABLE".into(), "1".into());
        let scrubber = self.secrets().scrubber();
        let confinement = self.confinement(None);
        let call = StepCall {
            dir: &std::env::temp_dir(),
            env: &env,
            deadline: Instant::now() + Duration::from_secs(60).min(self.inner.timeout),
            cancel: None,
            scrubber: &scrubber,
            confinement: confinement.as_ref(),
            quota: None,
            cgroup: None,
        };
        let args = ["version".into(), "-json".into()];
        let out = self
            .run_step(Step::Version, &args, Capture::Stdout, &call, &mut |_| {})
            .await
            .map_err(|e| e.into_engine_error(&RawLog::default(), &scrubber))?;
        EngineVersion::from_version_json(&out.stdout, &self.inner.binary).ok_or_else(|| {
            EngineError::Failed {
                step: Step::Version,
                exit_code: Some(0),
                log: format!(
                    "`{} version -json` printed no version: {}",
                    self.inner.binary.display(),
                    scrubber.scrub_bytes(&out.stdout)
                ),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_opentofu_from_terraform() {
        let tf = br#"{"terraform_version":"1.11.4","platform":"linux_amd64","provider_selections":{},"terraform_outdated":false}"#;
        let tofu =
            br#"{"terraform_version":"1.10.6","platform":"linux_amd64","provider_selections":{}}"#;
        let v = EngineVersion::from_version_json(tf, Path::new("/usr/bin/terraform")).unwrap();
        assert_eq!(v.to_string(), "Terraform 1.11.4");
        let v = EngineVersion::from_version_json(tofu, Path::new("/usr/bin/tofu")).unwrap();
        assert_eq!(v.to_string(), "OpenTofu 1.10.6");
        assert!(EngineVersion::from_version_json(b"{}", Path::new("tofu")).is_none());
    }
}
