//! What a caller asks of a plan run ([`PlanRequest`]), how it is checked before anything runs,
//! how it is cancelled ([`CancelHandle`]) and how its progress is told ([`StepProgress`]).

use super::env::forbidden_env_key;
use super::error::{EngineError, Step};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Ask a running step to stop (the same graceful stop as a timeout). Cheap to clone.
#[derive(Debug, Clone)]
pub struct CancelHandle(Arc<watch::Sender<bool>>);

/// Given to a [`PlanRequest`]; fires when its [`CancelHandle`] cancels.
#[derive(Debug, Clone)]
pub struct CancelToken(watch::Receiver<bool>);

impl CancelHandle {
    pub fn new() -> (CancelHandle, CancelToken) {
        let (tx, rx) = watch::channel(false);
        (CancelHandle(Arc::new(tx)), CancelToken(rx))
    }

    pub fn cancel(&self) {
        let _ = self.0.send(true);
    }
}

/// Keeps a [`CancelToken::following`] token following; stops when dropped.
#[derive(Debug)]
pub struct CancelFollower(tokio::task::JoinHandle<()>);

impl Drop for CancelFollower {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl CancelToken {
    /// A token that fires when `cancel` (a queue job's token) does, for as long as the
    /// [`CancelFollower`] lives: the job's cancellation bridged to the engine's graceful stop.
    pub fn following(
        cancel: &tokio_util::sync::CancellationToken,
    ) -> (CancelToken, CancelFollower) {
        let (handle, token) = CancelHandle::new();
        let cancel = cancel.clone();
        let task = tokio::spawn(async move {
            cancel.cancelled().await;
            handle.cancel();
        });
        (token, CancelFollower(task))
    }

    pub(super) fn is_cancelled(&self) -> bool {
        *self.0.borrow()
    }

    pub(super) async fn cancelled(&mut self) {
        if self.0.wait_for(|c| *c).await.is_err() {
            // The handle is gone: nobody can cancel any more.
            std::future::pending::<()>().await;
        }
    }
}

/// What to plan, besides the directory.
#[derive(Debug, Clone, Default)]
pub struct PlanRequest {
    /// `-var-file=` arguments, relative to the root directory (no absolute paths, no `..`).
    pub var_files: Vec<PathBuf>,
    /// `-var-file=` arguments the local operator chose on the command line (`planbot plan
    /// --var-file`): absolute paths, anywhere. Never from a repository. Passed after
    /// `var_files`, so they win.
    pub operator_var_files: Vec<PathBuf>,
    /// `-var=NAME=VALUE` arguments (`planbot plan --var`), passed last, so they win. Their
    /// values are secret only as the engine marks them (a sensitive variable is scrubbed via
    /// the plan JSON), like the values of a var file.
    pub vars: Vec<(String, String)>,
    /// Selected with `TF_WORKSPACE` (letters, digits, `-`, `_`).
    pub workspace: Option<String>,
    /// Extra environment for this run only (a value whose name looks secret, or that the
    /// runner's `secret_env` names, is scrubbed from all output).
    pub extra_env: BTreeMap<String, String>,
    /// Further secret strings to scrub from all output (tokens the caller knows).
    pub extra_secrets: Vec<String>,
    /// Environment for `init` only (module credentials): every value is a secret, and the
    /// plan and show steps, which run the root's code, never get it.
    pub init_env: BTreeMap<String, String>,
    /// The job's state gate, when the root's state is GitLab-managed: its port is allowed in
    /// the run's sandbox, and it lives as long as the planned run (through its apply).
    pub state_gate: Option<std::sync::Arc<crate::capabilities::state_gate::GatePass>>,
    /// `-lock=false` for `init` and `plan`: the run only reads the state (an MR's plan). Its
    /// apply, if any, still locks.
    pub no_lock: bool,
    /// The checkout the root lives in: the sandbox lets the engine write there, and a root
    /// directory or var file that resolves outside it (a symbolic link) is refused. `None`:
    /// the root directory itself.
    pub worktree: Option<PathBuf>,
    /// `-parallelism=N` for `plan` and for the apply of this plan (a root's `parallelism` in
    /// `.planbot.toml`, 1..=256); `None`: the engine's default (10). Part of the plan's
    /// fingerprint.
    pub parallelism: Option<u16>,
    /// `-target=`, `-exclude=` and `-replace=` for `plan` (a comment's `planbot plan -- …`,
    /// `core::targeting`): checked again before the engine runs, passed one argv item each,
    /// and bound to the plan's fingerprint. Empty: the full plan.
    pub targeting: crate::core::targeting::Targeting,
    /// This root's share of the one `fmt -check` its job runs over all its roots, beside their
    /// plans ([`FmtOfRoots`]): its `fmt` check waits for that and runs none of its own, unless
    /// that run gave no list. `None`: it runs its own, when its checks ask for one.
    pub fmt_of_roots: Option<FmtOfRoots>,
    /// Stops the run (SIGTERM, grace, SIGKILL) when cancelled.
    pub cancel: Option<CancelToken>,
    /// Told when each step starts and ends (`planbot plan`'s progress on stderr).
    pub progress: Option<mpsc::UnboundedSender<StepProgress>>,
}

/// A root's share of the one `fmt -check` its job runs over all its roots' directories
/// ([`Engine::fmt_of_roots`](super::Engine::fmt_of_roots)), which may still be running.
#[derive(Debug, Clone)]
pub struct FmtOfRoots {
    /// What that run gave, once it ended; the sender dropped without it: it never ran.
    pub ran: watch::Receiver<Option<Arc<crate::core::engine_checks::StepCheck>>>,
    /// The root's directory, repo-relative (`.`: the checkout's top).
    pub dir: String,
}

impl FmtOfRoots {
    /// The root's share once that run ended ([`crate::core::engine_checks::fmt_share`]);
    /// `None` when it gave no list or never ran: the root runs its own.
    pub async fn share(&self) -> Option<crate::core::engine_checks::StepCheck> {
        let mut ran = self.ran.clone();
        let ended = ran.wait_for(Option::is_some).await.ok()?.clone()?;
        crate::core::engine_checks::fmt_share(&ended, &self.dir)
    }
}

/// A step of a plan run starting (`took` is `None`) or ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepProgress {
    pub step: Step,
    pub took: Option<Duration>,
}

/// The canonical root directory and worktree of a checked request.
pub(super) struct RunPlace {
    pub(super) dir: PathBuf,
    pub(super) worktree: PathBuf,
}

/// Check `req` and resolve where it runs: the root directory and its worktree, canonical, the
/// root and the var files inside the worktree.
pub(super) fn place(dir: &Path, req: &PlanRequest) -> Result<RunPlace, EngineError> {
    validate_request(req)?;
    let dir = std::fs::canonicalize(dir).map_err(|e| {
        EngineError::InvalidRequest(format!("root directory {}: {e}", dir.display()))
    })?;
    let worktree = match &req.worktree {
        Some(w) => std::fs::canonicalize(w)
            .map_err(|e| EngineError::InvalidRequest(format!("worktree {}: {e}", w.display())))?,
        None => dir.clone(),
    };
    contained(&dir, &worktree, &req.var_files)?;
    Ok(RunPlace { dir, worktree })
}

/// Refuse a root directory or var file that resolves (through a symbolic link) outside the
/// worktree: the engine would run in, or read, a directory the repository does not own.
fn contained(dir: &Path, worktree: &Path, var_files: &[PathBuf]) -> Result<(), EngineError> {
    if !dir.starts_with(worktree) {
        return Err(EngineError::InvalidRequest(
            "the root directory resolves outside the repository checkout (through a symbolic link): refused".into(),
        ));
    }
    for vf in var_files {
        if let Ok(real) = std::fs::canonicalize(dir.join(vf)) {
            if !real.starts_with(worktree) {
                return Err(EngineError::InvalidRequest(format!(
                    "var file {:?} resolves outside the repository checkout (through a symbolic link): refused",
                    vf
                )));
            }
        }
    }
    Ok(())
}

fn validate_request(req: &PlanRequest) -> Result<(), EngineError> {
    for vf in &req.var_files {
        let escapes = vf.is_absolute()
            || vf
                .components()
                .any(|c| matches!(c, Component::ParentDir | Component::RootDir));
        if escapes || vf.as_os_str().is_empty() {
            return Err(EngineError::InvalidRequest(format!(
                "var file {:?} must be a relative path inside the root (no `..`)",
                vf
            )));
        }
    }
    for vf in &req.operator_var_files {
        if !vf.is_absolute() {
            return Err(EngineError::InvalidRequest(format!(
                "operator var file {vf:?} must be an absolute path"
            )));
        }
    }
    if let Some(n) = req.parallelism {
        if !(1..=crate::core::repo_config::MAX_PARALLELISM).contains(&n) {
            return Err(EngineError::InvalidRequest(format!(
                "parallelism {n}: from 1 to {}",
                crate::core::repo_config::MAX_PARALLELISM
            )));
        }
    }
    for (name, _) in &req.vars {
        if !is_variable_name(name) {
            return Err(EngineError::InvalidRequest(format!(
                "variable name {name:?}: use letters, digits, `-` and `_`, starting with a letter or `_`"
            )));
        }
    }
    if let Some(ws) = &req.workspace {
        let ok = !ws.is_empty()
            && ws.len() <= 90
            && ws
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(EngineError::InvalidRequest(format!(
                "workspace {ws:?}: use letters, digits, `-` and `_` only"
            )));
        }
    }
    for k in req.extra_env.keys().chain(req.init_env.keys()) {
        if forbidden_env_key(k) {
            return Err(EngineError::InvalidRequest(format!(
                "environment variable {k} is never passed to the engine"
            )));
        }
    }
    Ok(())
}

/// An HCL identifier as a variable name: a letter or `_`, then letters, digits, `-`, `_`.
pub fn is_variable_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_var_files_and_workspaces_that_escape() {
        for bad in ["/etc/shadow", "../secrets.tfvars", "a/../../b", ""] {
            let req = PlanRequest {
                var_files: vec![PathBuf::from(bad)],
                ..Default::default()
            };
            assert!(validate_request(&req).is_err(), "{bad}");
        }
        let ok = PlanRequest {
            var_files: vec![PathBuf::from("env/prod.tfvars")],
            workspace: Some("prod-1".into()),
            ..Default::default()
        };
        assert!(validate_request(&ok).is_ok());
        let bad_ws = PlanRequest {
            workspace: Some("prod; rm -rf".into()),
            ..Default::default()
        };
        assert!(validate_request(&bad_ws).is_err());
    }

    #[test]
    fn command_line_vars_need_a_variable_name_and_operator_var_files_an_absolute_path() {
        for bad in ["", "1vm", "vms=x", "a b", "-x", "name;rm"] {
            let req = PlanRequest {
                vars: vec![(bad.to_string(), "v".to_string())],
                ..Default::default()
            };
            assert!(validate_request(&req).is_err(), "{bad:?}");
        }
        let ok = PlanRequest {
            vars: vec![
                ("vm_count".to_string(), "a=b; $(x)".to_string()),
                ("_x-1".to_string(), String::new()),
            ],
            operator_var_files: vec![PathBuf::from("/home/me/prod.tfvars")],
            ..Default::default()
        };
        assert!(validate_request(&ok).is_ok());
        let relative = PlanRequest {
            operator_var_files: vec![PathBuf::from("prod.tfvars")],
            ..Default::default()
        };
        assert!(validate_request(&relative).is_err());
    }

    #[tokio::test]
    async fn a_roots_share_waits_for_the_one_fmt_and_is_none_when_it_never_ran() {
        use crate::core::engine_checks::StepCheck;
        let (tx, rx) = watch::channel(None);
        let share = FmtOfRoots {
            ran: rx.clone(),
            dir: "stacks/a".into(),
        };
        // Asked before the run ended: it waits for it.
        let waiting = tokio::spawn({
            let share = share.clone();
            async move { share.share().await }
        });
        // The one thread runs the task until it waits.
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "it waits for the run to end");
        tx.send(Some(Arc::new(StepCheck::Ran {
            exit: Some(3),
            stdout: b"stacks/a/main.tf\nmodules/x.tf\n".to_vec(),
        })))
        .unwrap();
        assert_eq!(
            waiting.await.unwrap(),
            Some(StepCheck::Ran {
                exit: Some(3),
                stdout: b"main.tf\n".to_vec()
            })
        );
        // A run that never ran (its sender gone without a word): the root runs its own.
        let (tx, rx) = watch::channel(None);
        drop(tx);
        let orphan = FmtOfRoots {
            ran: rx,
            dir: ".".into(),
        };
        assert_eq!(orphan.share().await, None);
    }
}
