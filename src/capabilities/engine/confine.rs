//! How engine processes are confined ([`SandboxMode`]) and the Landlock policy of one run: it
//! may write only the run's worktree, its private directory (home, temp, plan file) and the
//! plugin cache. A run that must be sandboxed on a kernel without Landlock is refused.

use super::run_dir::RunDirs;
use super::{Engine, EngineError};
pub use crate::capabilities::sandbox::Profile as SandboxProfile;
use crate::capabilities::sandbox::{Policy, Support};
use std::path::{Path, PathBuf};

/// How engine processes are confined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxMode {
    /// Every process under Landlock with this profile.
    Landlock {
        profile: SandboxProfile,
        /// The kernel's Landlock ABI version.
        abi: i32,
        /// Further paths the engine may read (`[sandbox] read_paths`, a provider mirror).
        extra_read: Vec<PathBuf>,
        /// TCP ports it may connect to (strict profile only).
        connect_ports: Vec<u16>,
    },
    /// No sandbox (`planbot plan --no-sandbox`, or `[sandbox] required = false` where the
    /// kernel offers none). The reason is shown wherever a plan is.
    Off { reason: String },
    /// A sandbox is required and unavailable: every run is refused with this text.
    Refused { reason: String },
}

impl SandboxMode {
    /// The strict profile where the kernel offers Landlock; else refused (`required`) with
    /// `refusal`, or off with the kernel's reason.
    pub fn strict(support: Support, required: bool, refusal: impl FnOnce(&str) -> String) -> Self {
        Self::with_profile(SandboxProfile::Strict, support, required, refusal)
    }

    /// `profile` where the kernel offers Landlock, else refused or off as for [`Self::strict`].
    pub fn with_profile(
        profile: SandboxProfile,
        support: Support,
        required: bool,
        refusal: impl FnOnce(&str) -> String,
    ) -> Self {
        match support {
            Support::Landlock { abi } => SandboxMode::Landlock {
                profile,
                abi,
                extra_read: Vec::new(),
                connect_ports: vec![443],
            },
            Support::Unavailable { reason } if required => SandboxMode::Refused {
                reason: refusal(reason),
            },
            Support::Unavailable { reason } => SandboxMode::Off {
                reason: reason.to_string(),
            },
        }
    }

    /// The kernel support this mode runs with (what `doctor` and `--check` describe).
    pub fn describe(&self) -> String {
        match self {
            SandboxMode::Landlock {
                profile,
                abi,
                connect_ports,
                ..
            } => {
                let mut text = Support::Landlock { abi: *abi }.describe();
                if *profile == SandboxProfile::Strict && *abi >= 4 {
                    let ports: Vec<String> = connect_ports.iter().map(u16::to_string).collect();
                    text.push_str(&format!(" (TCP ports allowed: {})", ports.join(", ")));
                }
                text
            }
            SandboxMode::Off { reason } => format!("no sandbox: {reason}"),
            SandboxMode::Refused { reason } => reason.clone(),
        }
    }
}

/// The sandbox of one run, ready to be applied to each of its processes.
#[derive(Debug, Clone)]
pub(super) struct Confinement {
    pub(super) policy: Policy,
    pub(super) support: Support,
}

impl Engine {
    /// `Err` when a sandbox is required and the kernel offers none: nothing may run.
    pub(super) fn refuse_unsandboxed(&self) -> Result<(), EngineError> {
        match &self.inner.sandbox {
            SandboxMode::Refused { reason } => Err(EngineError::SandboxRefused(reason.clone())),
            _ => Ok(()),
        }
    }

    /// The sandbox of one run: the profile's base, the engine binary, the operator's extra
    /// read paths, and `run`'s own directories (worktree, private dirs, plugin cache). `None`
    /// when runs are not sandboxed.
    pub(super) fn confinement(&self, run: Option<(&Path, &RunDirs)>) -> Option<Confinement> {
        let SandboxMode::Landlock {
            profile,
            abi,
            extra_read,
            connect_ports,
        } = &self.inner.sandbox
        else {
            return None;
        };
        let mut policy = Policy::base(*profile);
        policy.allow_exec(&self.inner.binary);
        for p in extra_read {
            policy.allow_read(p);
        }
        for port in connect_ports {
            policy.allow_port(*port);
        }
        if let Some((worktree, dirs)) = run {
            policy.allow_write(worktree);
            policy.allow_write(&dirs.out);
            policy.allow_write(&dirs.tmp);
            if let Some(home) = &dirs.home {
                policy.allow_write(home);
            }
            if let Some(file) = &dirs.cli_config_file {
                policy.allow_read(file);
            }
            if let Some(cache) = &self.inner.plugin_cache_dir {
                policy.allow_write(cache);
            }
        }
        Some(Confinement {
            policy,
            support: Support::Landlock { abi: *abi },
        })
    }
}
