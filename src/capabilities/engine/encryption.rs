//! The plan file at rest: on OpenTofu encrypted with a random per-run key (`TF_ENCRYPTION`,
//! plan target only), unless the operator configured encryption; Terraform has none.

use super::version::{EngineKind, EngineVersion};
use super::PlanRequest;
use crate::core::redact::Secrets;
use std::collections::BTreeMap;

/// How the plan file was protected at rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanEncryption {
    /// OpenTofu: encrypted with a random per-run key in `TF_ENCRYPTION` (plan target only).
    PerRunKey,
    /// `TF_ENCRYPTION` is set in the configured engine env: the operator's own setup applies.
    Configured,
    /// Terraform has no plan encryption: the 0700 directory is the only protection.
    Unsupported,
}

impl PlanEncryption {
    /// The encryption of one run and its `TF_ENCRYPTION` text when planbot sets it; a per-run
    /// passphrase is added to `secrets`.
    pub(super) fn choose(
        configured_env: &BTreeMap<String, String>,
        req: &PlanRequest,
        version: &EngineVersion,
        secrets: &mut Secrets,
    ) -> (PlanEncryption, Option<String>) {
        if configured_env.contains_key("TF_ENCRYPTION")
            || req.extra_env.contains_key("TF_ENCRYPTION")
        {
            (PlanEncryption::Configured, None)
        } else if version.name == EngineKind::OpenTofu {
            let pass = random_passphrase();
            secrets.add(pass.clone());
            (
                PlanEncryption::PerRunKey,
                Some(plan_encryption_config(&pass)),
            )
        } else {
            (PlanEncryption::Unsupported, None)
        }
    }
}

/// The `TF_ENCRYPTION` text for an OpenTofu run: a PBKDF2 key from a random per-run passphrase,
/// AES-GCM, applied to the plan target only (state is left as the repository configures it),
/// and enforced so the plan file is never written in clear.
pub fn plan_encryption_config(passphrase: &str) -> String {
    format!(
        r#"key_provider "pbkdf2" "planbot_run" {{
  passphrase    = "{passphrase}"
  key_length    = 32
  iterations    = 200000
  salt_length   = 32
  hash_function = "sha512"
}}

method "aes_gcm" "planbot_run" {{
  keys = key_provider.pbkdf2.planbot_run
}}

plan {{
  method   = method.aes_gcm.planbot_run
  enforced = true
}}
"#
    )
}

/// A random 256-bit passphrase, as 64 hex characters (no quoting issue in HCL).
fn random_passphrase() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::engine::env::tests::engine_with;
    use std::ffi::OsString;

    #[test]
    fn opentofu_plan_encryption_lands_in_tf_encryption() {
        let pass = random_passphrase();
        assert_eq!(pass.len(), 64);
        assert_ne!(pass, random_passphrase(), "a new key per run");
        let text = plan_encryption_config(&pass);
        assert!(text.contains(&format!("passphrase    = \"{pass}\"")));
        assert!(text.contains(r#"key_provider "pbkdf2" "planbot_run""#));
        assert!(text.contains(r#"method "aes_gcm" "planbot_run""#));
        assert!(text.contains("keys = key_provider.pbkdf2.planbot_run"));
        assert!(
            text.contains("plan {\n  method   = method.aes_gcm.planbot_run\n  enforced = true\n}")
        );
        // Only the plan target: state stays as the repository configures it.
        assert!(!text.contains("state {"));
        // OpenTofu's minimum: 16 characters of passphrase, 200000 iterations.
        assert!(text.contains("iterations    = 200000"));
        let e = engine_with(&[]);
        let env = e.child_env(&BTreeMap::new(), None, Some(&text));
        assert_eq!(env["TF_ENCRYPTION"], OsString::from(text));
    }
}
