//! Where a run's files live: a private (0700) directory per run under the temp root, deleted
//! when the run is dropped, and every leftover one wiped at service start ([`wipe_temp_root`]).

use super::cli_config::{cli_config_text, CliConfig};
use super::EngineError;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Run directories under the temp root are named with this prefix; only they are ever wiped.
pub const RUN_DIR_PREFIX: &str = "planbot-run-";

/// Delete every run directory left in `temp_root` (by a crash) and make sure the root exists
/// with mode 0700. Only entries named `planbot-run-*` are touched. Returns how many were removed.
pub fn wipe_temp_root(temp_root: &Path) -> std::io::Result<usize> {
    ensure_private_dir(temp_root)?;
    let mut removed = 0;
    for entry in std::fs::read_dir(temp_root)? {
        let entry = entry?;
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with(RUN_DIR_PREFIX)
        {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            // A plan file may sit in a dir made read-only by nobody but us; remove it anyway.
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
        removed += 1;
    }
    Ok(removed)
}

/// `dir` exists with mode 0700.
pub(super) fn ensure_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// A new private (0700) run directory under `temp_root`; deleted when it drops.
pub(super) fn private_run_dir(temp_root: &Path) -> Result<tempfile::TempDir, EngineError> {
    ensure_private_dir(temp_root)
        .map_err(|e| EngineError::Io(format!("temp root {}: {e}", temp_root.display())))?;
    let private = tempfile::Builder::new()
        .prefix(RUN_DIR_PREFIX)
        .tempdir_in(temp_root)
        .map_err(|e| EngineError::Io(format!("private run dir: {e}")))?;
    ensure_private_dir(private.path())
        .map_err(|e| EngineError::Io(format!("private run dir: {e}")))?;
    Ok(private)
}

/// The directories of one run inside its private (0700) directory: the plan file's, the
/// temp dir (`TMPDIR`: providers' plugin sockets), and with an owned CLI config a private
/// `HOME` and the config file itself (read-only in the sandbox).
pub(super) struct RunDirs {
    /// The private directory itself.
    pub(super) private: PathBuf,
    /// An empty directory: the mount point of each process's own root (in its namespace).
    pub(super) root: PathBuf,
    pub(super) out: PathBuf,
    pub(super) tmp: PathBuf,
    pub(super) home: Option<PathBuf>,
    pub(super) cli_config_file: Option<PathBuf>,
}

impl RunDirs {
    pub(super) fn create(private: &Path, cli: &CliConfig) -> std::io::Result<RunDirs> {
        let sub = |name: &str| -> std::io::Result<PathBuf> {
            let d = private.join(name);
            ensure_private_dir(&d)?;
            Ok(d)
        };
        let (home, cli_config_file) = match cli {
            CliConfig::User => (None, None),
            CliConfig::Owned { provider_mirror } => {
                let file = private.join("cli.tfrc");
                std::fs::write(&file, cli_config_text(provider_mirror.as_ref()))?;
                (Some(sub("home")?), Some(file))
            }
        };
        Ok(RunDirs {
            private: private.to_path_buf(),
            root: sub("root")?,
            out: sub("out")?,
            tmp: sub("tmp")?,
            home,
            cli_config_file,
        })
    }

    /// Point the run's environment at these directories.
    pub(super) fn set_env(&self, env: &mut BTreeMap<String, OsString>) {
        env.insert("TMPDIR".into(), self.tmp.clone().into());
        env.insert("CHECKPOINT_DISABLE".into(), "1".into());
        if let Some(home) = &self.home {
            env.insert("HOME".into(), home.clone().into());
        }
        if let Some(file) = &self.cli_config_file {
            env.insert("TF_CLI_CONFIG_FILE".into(), file.clone().into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wipes_only_run_dirs() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("planbot-run-abc")).unwrap();
        std::fs::write(root.path().join("planbot-run-abc/plan"), b"x").unwrap();
        std::fs::write(root.path().join("keep-me"), b"y").unwrap();
        assert_eq!(wipe_temp_root(root.path()).unwrap(), 1);
        assert!(root.path().join("keep-me").exists());
        assert!(!root.path().join("planbot-run-abc").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(root.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
