//! Git workspace: one bare mirror per project, fetched incrementally, and a fresh detached
//! worktree per job at an exact commit (removed when the job's [`Checkout`] is dropped).
//!
//! The GitLab token reaches git ONLY through the environment (`GIT_CONFIG_COUNT` /
//! `GIT_CONFIG_KEY_0=http.extraHeader` / `GIT_CONFIG_VALUE_0=Authorization: Basic ...`): never in
//! argv, a URL, or the mirror's config. Every git process gets an explicit environment (no
//! inherited `GIT_*`, no user or system gitconfig, no prompts) and a timeout.

use crate::capabilities::checkout_file::size_text;
use crate::core::ids::{CommitSha, MrIid, ProjectId};
use crate::core::reach::{self, ModuleGraph};
use crate::core::repo_config::{self, RepoConfig, RepoConfigError};
use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;
use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A file of the repository larger than planbot reads: refused from its size in git, before a
/// byte of it is read. The text names the file, its size and the cap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{path}` is {}: planbot reads at most {} of it", size_text(*size), size_text(*max))]
pub struct RepoFileTooLarge {
    pub path: String,
    pub size: u64,
    pub max: u64,
}

/// A git command printed more than planbot reads of one (`Workspace::with_max_output`): a
/// merge request changing that many files, a directory that large. Nothing past the cap was
/// read; git was stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("git {what} printed more than {}, the most planbot reads of one git command: a merge request or directory with that many files is refused", size_text(*max))]
pub struct GitOutputTooLarge {
    pub what: String,
    pub max: u64,
}

/// A commit whose files, checked out, would take more than a job may write
/// (`Workspace::with_max_checkout`, `sandbox.disk_max`): sized from git (`git ls-tree -r
/// --long`) and refused before a byte is written. A few MiB of git objects can hold gigabytes
/// of files (one blob of zeros, named a thousand times).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("commit `{sha}` would take {} on disk checked out ({files} files), more than a job may write (`sandbox.disk_max`, {}): planbot did not check it out", size_text(*size), size_text(*max))]
pub struct CheckoutTooLarge {
    pub sha: String,
    pub size: u64,
    pub files: u64,
    pub max: u64,
}

/// What planbot reads at most of one git command's output (default of
/// `Workspace::with_max_output`): `git diff --name-only` of about 300,000 changed files.
pub const MAX_GIT_OUTPUT: u64 = 16 * 1024 * 1024;

/// One git process as the workspace started it (for audits and tests): argv and env names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub argv: Vec<String>,
    /// Names of the environment variables given (values are not kept: one is the token).
    pub env: Vec<String>,
    /// The git config keys given through the environment (`GIT_CONFIG_KEY_n`).
    pub config: Vec<String>,
}

/// Which commit of an MR is planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlannedRef {
    /// GitLab's `refs/merge-requests/IID/merge`: what would land.
    Merge,
    /// The MR's head commit.
    Head,
}

/// The commit chosen for an MR, and why, in words for the note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MrCommit {
    /// The commit to check out and plan.
    pub sha: CommitSha,
    /// The MR's head commit.
    pub head: CommitSha,
    pub planned: PlannedRef,
    /// e.g. "GitLab's merge result 1a2b3c4d of head 5e6f7a8b into main" or
    /// "head 5e6f7a8b (the MR has conflicts, or GitLab has not computed its merge result yet)".
    pub explanation: String,
    /// Why the merge result was not planned, when it was preferred but not used.
    pub reason: Option<String>,
}

/// The git capability. Cheap to clone; clones share the per-project locks.
#[derive(Clone)]
pub struct Workspace {
    data_dir: PathBuf,
    git: PathBuf,
    token: String,
    user: String,
    timeout: Duration,
    /// The most stdout read of one git command ([`MAX_GIT_OUTPUT`]).
    max_output: u64,
    /// The most a checkout's files may take ([`CheckoutTooLarge`]); `None`: no bound.
    max_checkout: Option<u64>,
    locks: Arc<Mutex<HashMap<ProjectId, Arc<tokio::sync::Mutex<()>>>>>,
    log: Arc<Mutex<Vec<Invocation>>>,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace")
            .field("data_dir", &self.data_dir)
            .field("git", &self.git)
            .field("token", &"[REDACTED]")
            .finish()
    }
}

/// A job's private checkout at one commit; the directory is removed on drop.
#[derive(Debug)]
pub struct Checkout {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    sha: CommitSha,
}

impl Checkout {
    /// The root of the checked-out tree.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn sha(&self) -> &CommitSha {
        &self.sha
    }
}

/// A root's own configuration files and planbot's files in it, inside a job's checkout. The
/// root directory is resolved (through symbolic links) and must stay inside the checkout;
/// symbolic links among its files are neither read nor written through.
#[derive(Debug, Clone)]
pub struct RootFiles {
    dir: PathBuf,
    /// The directory from the checkout's top, links resolved (`.` for the top).
    repo_dir: String,
}

/// The largest configuration file [`RootFiles::config_files`] reads.
const MAX_CONFIG_FILE: u64 = 4 * 1024 * 1024;

impl RootFiles {
    /// The root directory `dir` (relative to `checkout`), when it resolves inside the checkout.
    pub fn open(checkout: &Path, dir: &str) -> Result<RootFiles> {
        let top = std::fs::canonicalize(checkout)
            .with_context(|| format!("the checkout {}", checkout.display()))?;
        let real = std::fs::canonicalize(top.join(dir))
            .with_context(|| format!("the root directory `{dir}`"))?;
        if !real.starts_with(&top) || !real.is_dir() {
            bail!("the root directory `{dir}` resolves outside the repository checkout (through a symbolic link), or is no directory: refused");
        }
        let repo_dir = real
            .strip_prefix(&top)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let repo_dir = if repo_dir.is_empty() {
            ".".to_string()
        } else {
            repo_dir
        };
        Ok(RootFiles {
            dir: real,
            repo_dir,
        })
    }

    /// Where the directory really is, from the checkout's top (links inside it resolved).
    pub fn repo_dir(&self) -> &str {
        &self.repo_dir
    }

    /// The root's `.tf`, `.tofu`, `.tf.json` and `.tofu.json` files (regular files only), by
    /// name: what the engine reads as its configuration.
    pub fn config_files(&self) -> Result<Vec<(String, String)>> {
        self.config_files_within(u64::MAX)
    }

    /// [`RootFiles::config_files`], refused once they hold more than `max_total` bytes
    /// together (each file is sized before it is read).
    pub fn config_files_within(&self, max_total: u64) -> Result<Vec<(String, String)>> {
        let mut total: u64 = 0;
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_config = [".tf", ".tofu", ".tf.json", ".tofu.json"]
                .iter()
                .any(|ext| name.ends_with(ext));
            let meta = entry.metadata()?; // of the entry itself: a link is not followed
            if !is_config || !meta.is_file() {
                continue;
            }
            if meta.len() > MAX_CONFIG_FILE {
                bail!("{name} is larger than {MAX_CONFIG_FILE} bytes");
            }
            total = total.saturating_add(meta.len());
            if total > max_total {
                bail!("its configuration files hold more than {max_total} bytes");
            }
            let mut text = String::new();
            std::io::Read::read_to_string(
                &mut std::io::Read::take(
                    std::fs::File::open(entry.path()).with_context(|| format!("reading {name}"))?,
                    MAX_CONFIG_FILE,
                ),
                &mut text,
            )
            .with_context(|| format!("reading {name}"))?;
            files.push((name, text));
        }
        files.sort();
        Ok(files)
    }

    /// Write planbot's file `name` into the root, replacing whatever the repository has under
    /// that name (a symbolic link included, without following it): written aside, then renamed
    /// over it, so runs of one job that write the same file at once each leave it whole.
    pub fn write(&self, name: &str, text: &str) -> Result<()> {
        use std::io::Write;
        let mut aside = tempfile::Builder::new()
            .prefix(".planbot-")
            .tempfile_in(&self.dir)
            .with_context(|| format!("writing {name}"))?;
        aside
            .write_all(text.as_bytes())
            .with_context(|| format!("writing {name}"))?;
        aside
            .persist(self.dir.join(name))
            .map(drop)
            .with_context(|| format!("replacing {name}"))
    }
}

/// The module graph (`core::reach`) of the directories `dirs` of the checkout at `checkout`
/// and every local module they reach, read bounded and never through a link out of it.
/// Blocking: call it off the async workers.
pub fn module_graph(checkout: &Path, dirs: &[String]) -> ModuleGraph {
    ModuleGraph::build(dirs.iter().map(String::as_str), |dir| {
        read_dir(checkout, dir)
    })
}

/// One directory of the checkout: its configuration files, or why not. No path of the
/// server's disk is put in a reason.
fn read_dir(top: &Path, dir: &str) -> reach::Read {
    let path = if dir == "." {
        top.to_path_buf()
    } else {
        top.join(dir)
    };
    if !path.is_dir() {
        return reach::Read::Missing;
    }
    let files = match RootFiles::open(top, dir) {
        Ok(files) => files,
        Err(_) => {
            return reach::Read::Unreadable(
                "it resolves outside the repository through a symbolic link: not followed".into(),
            )
        }
    };
    match files.config_files_within(reach::MAX_DIR_BYTES) {
        Ok(read) => reach::Read::Files {
            real: files.repo_dir().to_string(),
            files: read,
        },
        Err(e) => reach::Read::Unreadable(e.to_string()),
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            let path = dir.path().to_path_buf();
            if let Err(e) = dir.close() {
                tracing::warn!(path = %path.display(), error = %e, "could not remove a job checkout");
            }
        }
        // The mirror's worktree record is pruned at the next fetch (`git worktree prune`).
    }
}

struct Output {
    stdout: Vec<u8>,
    stderr: String,
    success: bool,
    code: Option<i32>,
}

impl Workspace {
    /// Mirrors live in `<data_dir>/repos/<project_id>.git`, checkouts in `<data_dir>/work/`.
    /// `token` is the bot's GitLab token, sent to git as `Authorization: Basic oauth2:<token>`.
    pub fn new(data_dir: &Path, token: &str) -> Result<Workspace> {
        for sub in ["repos", "work", "git-home"] {
            let dir = data_dir.join(sub);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            restrict(&dir)?;
        }
        Ok(Workspace {
            data_dir: data_dir.to_path_buf(),
            git: PathBuf::from("git"),
            token: token.to_string(),
            user: "oauth2".to_string(),
            timeout: Duration::from_secs(600),
            max_output: MAX_GIT_OUTPUT,
            max_checkout: None,
            locks: Arc::default(),
            log: Arc::default(),
        })
    }

    /// Use another git binary (default: `git` on PATH).
    pub fn with_git_binary(mut self, git: &Path) -> Workspace {
        self.git = git.to_path_buf();
        self
    }

    /// Per git process (default 10 minutes); the process is killed after it.
    pub fn with_timeout(mut self, timeout: Duration) -> Workspace {
        self.timeout = timeout;
        self
    }

    /// The most planbot reads of one git command's output (default [`MAX_GIT_OUTPUT`]); past it
    /// git is stopped and the call fails with [`GitOutputTooLarge`].
    pub fn with_max_output(mut self, bytes: u64) -> Workspace {
        self.max_output = bytes;
        self
    }

    /// The most the files of one checkout may take (the service: `sandbox.disk_max`): a commit
    /// holding more is refused from its sizes in git, unwritten ([`CheckoutTooLarge`]).
    pub fn with_max_checkout(mut self, bytes: u64) -> Workspace {
        self.max_checkout = Some(bytes);
        self
    }

    /// The bare mirror of a project.
    pub fn mirror_path(&self, project: ProjectId) -> PathBuf {
        self.data_dir.join("repos").join(format!("{project}.git"))
    }

    /// Every git process started so far (argv and env names), oldest first.
    pub fn invocations(&self) -> Vec<Invocation> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Remove leftover checkouts (after a crash): call at start-up.
    pub fn wipe_checkouts(&self) -> Result<()> {
        let work = self.data_dir.join("work");
        for entry in
            std::fs::read_dir(&work).with_context(|| format!("reading {}", work.display()))?
        {
            let p = entry?.path();
            if p.is_dir() {
                std::fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
            } else {
                std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
            }
        }
        Ok(())
    }

    fn project_lock(&self, project: ProjectId) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(project)
            .or_default()
            .clone()
    }

    /// Create the mirror if needed and fetch `refs/heads/*` and `refs/merge-requests/*` from
    /// `clone_url` (the API's `http_url_to_repo`). Incremental after the first time.
    pub async fn sync(&self, project: ProjectId, clone_url: &str) -> Result<()> {
        let url = url::Url::parse(clone_url).with_context(|| format!("clone URL {clone_url:?}"))?;
        if !url.username().is_empty() || url.password().is_some() {
            bail!("the clone URL must not carry credentials");
        }
        let lock = self.project_lock(project);
        let _guard = lock.lock().await;
        let mirror = self.mirror_path(project);
        if !mirror.join("HEAD").exists() {
            let tmp = mirror.with_extension("git.tmp");
            let _ = std::fs::remove_dir_all(&tmp);
            let out = self
                .run(
                    None,
                    &[os("init"), os("--quiet"), os("--bare"), tmp.clone().into()],
                    false,
                )
                .await?;
            check(&out, "git init --bare")?;
            std::fs::rename(&tmp, &mirror)
                .with_context(|| format!("moving the new mirror to {}", mirror.display()))?;
        }
        // Forget worktrees of finished jobs whose directories are gone.
        let _ = self
            .run(Some(&mirror), &[os("worktree"), os("prune")], false)
            .await;
        let out = self
            .run(
                Some(&mirror),
                &[
                    os("fetch"),
                    os("--quiet"),
                    os("--prune"),
                    os("--no-tags"),
                    os("--no-write-fetch-head"),
                    os(url.as_str()),
                    os("+refs/heads/*:refs/heads/*"),
                    os("+refs/merge-requests/*:refs/merge-requests/*"),
                ],
                true,
            )
            .await?;
        check(&out, "git fetch").with_context(|| format!("fetching project {project}"))
    }

    /// Where `branch` points in the mirror (after [`Workspace::sync`]).
    pub async fn branch_head(&self, project: ProjectId, branch: &str) -> Result<Option<CommitSha>> {
        self.rev_parse(project, &format!("refs/heads/{branch}"))
            .await
    }

    /// The commit `rev` names in the mirror, if any.
    pub async fn rev_parse(&self, project: ProjectId, rev: &str) -> Result<Option<CommitSha>> {
        let mirror = self.existing_mirror(project)?;
        let oid = self.verify(&mirror, &format!("{rev}^{{commit}}")).await?;
        Ok(oid.map(CommitSha))
    }

    /// The object `spec` names in `mirror` (`git rev-parse --verify`), if any.
    async fn verify(&self, mirror: &Path, spec: &str) -> Result<Option<String>> {
        let args = [
            os("rev-parse"),
            os("--verify"),
            os("--quiet"),
            os("--end-of-options"),
            os(spec),
        ];
        let out = self.run(Some(mirror), &args, false).await?;
        Ok(out
            .success
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()))
    }

    /// Whether `ancestor` is `sha` or one of its ancestors in the mirror (`false` also when
    /// either is not there).
    pub async fn is_ancestor(
        &self,
        project: ProjectId,
        ancestor: &CommitSha,
        sha: &CommitSha,
    ) -> Result<bool> {
        if !is_full_sha(ancestor.as_str()) || !is_full_sha(sha.as_str()) {
            return Ok(false);
        }
        let mirror = self.existing_mirror(project)?;
        let out = self
            .run(
                Some(&mirror),
                &[
                    os("merge-base"),
                    os("--is-ancestor"),
                    os(ancestor.as_str()),
                    os(sha.as_str()),
                ],
                false,
            )
            .await?;
        Ok(out.success)
    }

    /// Choose the commit to plan for an MR whose head is `head`. With `prefer_merge`, GitLab's
    /// `refs/merge-requests/IID/merge` is used when it exists and its second parent is `head`
    /// (it was computed for this head); otherwise the head, saying why.
    pub async fn mr_commit(
        &self,
        project: ProjectId,
        iid: MrIid,
        head: &CommitSha,
        target_branch: &str,
        prefer_merge: bool,
    ) -> Result<MrCommit> {
        let mirror = self.existing_mirror(project)?;
        if self.rev_parse(project, head.as_str()).await?.is_none() {
            bail!(
                "commit {} of merge request !{iid} is not in the mirror after fetching (was the branch force-pushed?)",
                head.short()
            );
        }
        let head_only = |why: &str| MrCommit {
            sha: head.clone(),
            head: head.clone(),
            planned: PlannedRef::Head,
            reason: Some(why.to_string()).filter(|w| !w.is_empty()),
            explanation: if why.is_empty() {
                format!("head {}", head.short())
            } else {
                format!("head {} ({why})", head.short())
            },
        };
        if !prefer_merge {
            return Ok(head_only(""));
        }
        let merge_ref = format!("refs/merge-requests/{iid}/merge");
        let Some(merge) = self.rev_parse(project, &merge_ref).await? else {
            return Ok(head_only(
                "the MR has conflicts, or GitLab has not computed its merge result yet",
            ));
        };
        let out = self
            .run(
                Some(&mirror),
                &[
                    os("rev-list"),
                    os("--parents"),
                    os("-n"),
                    os("1"),
                    os(merge.as_str()),
                ],
                false,
            )
            .await?;
        check(&out, "git rev-list --parents")?;
        let line = String::from_utf8_lossy(&out.stdout).to_string();
        let ids: Vec<&str> = line.split_whitespace().collect();
        if ids.len() == 3 && ids[2] == head.as_str() {
            Ok(MrCommit {
                explanation: format!(
                    "GitLab's merge result {} of head {} into {target_branch}",
                    merge.short(),
                    head.short()
                ),
                sha: merge,
                head: head.clone(),
                planned: PlannedRef::Merge,
                reason: None,
            })
        } else {
            Ok(head_only(
                "GitLab's merge result is still the one for an older head",
            ))
        }
    }

    /// A fresh private checkout of exactly `sha` (detached worktree), removed when dropped.
    pub async fn checkout(&self, project: ProjectId, sha: &CommitSha) -> Result<Checkout> {
        if !is_full_sha(sha.as_str()) {
            bail!(
                "refusing to check out {:?}: not a full commit SHA",
                sha.as_str()
            );
        }
        let mirror = self.existing_mirror(project)?;
        if let Some(max) = self.max_checkout {
            let (size, files) = self.tree_size(&mirror, sha).await?;
            if size > max {
                return Err(CheckoutTooLarge {
                    sha: sha.short().to_string(),
                    size,
                    files,
                    max,
                }
                .into());
            }
        }
        let dir = tempfile::Builder::new()
            .prefix(&format!("p{project}-{}-", sha.short()))
            .tempdir_in(self.data_dir.join("work"))
            .context("creating the job checkout directory")?;
        restrict(dir.path())?;
        let path = dir.path().join("src");
        let lock = self.project_lock(project);
        let _guard = lock.lock().await;
        let out = self
            .run(
                Some(&mirror),
                &[
                    os("worktree"),
                    os("add"),
                    os("--quiet"),
                    os("--detach"),
                    path.clone().into(),
                    os(sha.as_str()),
                ],
                false,
            )
            .await?;
        check(&out, "git worktree add").with_context(|| format!("checking out {}", sha.short()))?;
        Ok(Checkout {
            dir: Some(dir),
            path,
            sha: sha.clone(),
        })
    }

    /// What the files of commit `sha` take on disk checked out, and how many there are: every
    /// blob's size as git lists it (`git ls-tree -r -t --long`, read from the objects' headers;
    /// the listing itself within [`MAX_GIT_OUTPUT`]) in whole 4 KiB blocks, and a block for each
    /// directory, so that many small files or directories count too.
    async fn tree_size(&self, mirror: &Path, sha: &CommitSha) -> Result<(u64, u64)> {
        let out = self
            .run(
                Some(mirror),
                &[
                    os("ls-tree"),
                    os("-r"),
                    os("-t"),
                    os("-z"),
                    os("--long"),
                    os("--end-of-options"),
                    os(&format!("{}^{{tree}}", sha.as_str())),
                ],
                false,
            )
            .await?;
        check(&out, "git ls-tree").with_context(|| format!("sizing {}", sha.short()))?;
        let (mut size, mut files) = (0u64, 0u64);
        for entry in out.stdout.split(|b| *b == 0).filter(|e| !e.is_empty()) {
            // `<mode> SP <type> SP <object> SP+ <size> TAB <path>`
            let meta = entry.split(|b| *b == b'\t').next().unwrap_or_default();
            let meta = String::from_utf8_lossy(meta);
            let fields: Vec<&str> = meta.split_whitespace().collect();
            const BLOCK: u64 = 4096;
            match fields[..] {
                [_mode, "blob", _oid, bytes] => {
                    files += 1;
                    let bytes = bytes.parse::<u64>().unwrap_or(u64::MAX);
                    size = size.saturating_add(bytes.div_ceil(BLOCK).saturating_mul(BLOCK));
                }
                [_mode, "tree", ..] => size = size.saturating_add(BLOCK),
                _ => {}
            }
        }
        Ok((size, files))
    }

    /// Files changed on `head` since it forked from `base` (the target branch's commit):
    /// `git diff --name-only` against their merge base, renames as delete + add.
    pub async fn changed_files(
        &self,
        project: ProjectId,
        base: &CommitSha,
        head: &CommitSha,
    ) -> Result<Vec<String>> {
        let mirror = self.existing_mirror(project)?;
        let merge_base = self.merge_base(project, base, head).await?;
        self.diff_names(&mirror, merge_base.as_str(), head.as_str())
            .await
    }

    /// The commit `head` forked from `base` at (`git merge-base`).
    pub async fn merge_base(
        &self,
        project: ProjectId,
        base: &CommitSha,
        head: &CommitSha,
    ) -> Result<CommitSha> {
        let mirror = self.existing_mirror(project)?;
        let out = self
            .run(
                Some(&mirror),
                &[
                    os("merge-base"),
                    os("--end-of-options"),
                    os(base.as_str()),
                    os(head.as_str()),
                ],
                false,
            )
            .await?;
        check(&out, "git merge-base").with_context(|| {
            format!(
                "finding the merge base of {} and {}",
                base.short(),
                head.short()
            )
        })?;
        Ok(CommitSha(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        ))
    }

    /// The files that differ between the commits `from` and `to` (no merge base: the two
    /// trees as they are), e.g. between two heads of an MR planned one after the other.
    pub async fn files_between(
        &self,
        project: ProjectId,
        from: &CommitSha,
        to: &CommitSha,
    ) -> Result<Vec<String>> {
        let mirror = self.existing_mirror(project)?;
        self.diff_names(&mirror, from.as_str(), to.as_str()).await
    }

    /// `git diff --name-only` between two revisions of the mirror.
    async fn diff_names(&self, mirror: &Path, from: &str, to: &str) -> Result<Vec<String>> {
        let out = self
            .run(
                Some(mirror),
                &[
                    os("diff"),
                    os("--name-only"),
                    os("-z"),
                    os("--no-renames"),
                    os("--no-ext-diff"),
                    os("--no-textconv"),
                    os(from),
                    os(to),
                    os("--"),
                ],
                false,
            )
            .await?;
        check(&out, "git diff --name-only")?;
        Ok(nul_separated(&out.stdout).collect())
    }

    /// The content of `path` at `rev` (e.g. `.planbot.toml` on the default branch), `None` when
    /// the file does not exist there. The blob's size is asked from git first and a blob over
    /// `max` bytes is refused with [`RepoFileTooLarge`] before a byte of it is read; the read
    /// itself stops after `max` bytes too. A few MiB of git objects can hold a file of gigabytes.
    pub async fn read_file_at(
        &self,
        project: ProjectId,
        rev: &str,
        path: &str,
        max: u64,
    ) -> Result<Option<Vec<u8>>> {
        let mirror = self.existing_mirror(project)?;
        let spec = format!("{rev}:{}", path.trim_start_matches("./"));
        let Some(oid) = self.verify(&mirror, &spec).await? else {
            return Ok(None);
        };
        let size = self.blob_size(&mirror, &oid, path, rev).await?;
        if size > max {
            return Err(RepoFileTooLarge {
                path: path.to_string(),
                size,
                max,
            }
            .into());
        }
        self.read_blob(&mirror, &oid, path, rev, max)
            .await
            .map(Some)
    }

    /// `.planbot.toml` at `rev`, parsed: the default when it does not exist there, a
    /// [`RepoConfigError`] that says so when it is invalid or larger than
    /// [`repo_config::MAX_FILE_BYTES`] (then it is not read at all).
    pub async fn repo_config_at(
        &self,
        project: ProjectId,
        rev: &str,
    ) -> Result<Result<RepoConfig, RepoConfigError>> {
        self.repo_config_read(project, rev, None).await
    }

    /// [`Workspace::repo_config_at`] for a config proposed at `rev`: a root whose `dir` is no
    /// directory of `rev`'s tree is a problem too (with the nearest one that is).
    pub async fn proposed_repo_config_at(
        &self,
        project: ProjectId,
        rev: &str,
    ) -> Result<Result<RepoConfig, RepoConfigError>> {
        let dirs = self.directories_at(project, rev).await?;
        self.repo_config_read(project, rev, Some(&dirs)).await
    }

    /// Which of `paths` (repo-relative) `rev`'s tree has, as anything: a directory, a file or a
    /// symbolic link (`git ls-tree` of exactly those paths).
    pub async fn paths_at(
        &self,
        project: ProjectId,
        rev: &str,
        paths: &[&str],
    ) -> Result<BTreeSet<String>> {
        if paths.is_empty() {
            return Ok(BTreeSet::new());
        }
        let mirror = self.existing_mirror(project)?;
        let mut args = vec![
            os("ls-tree"),
            os("-z"),
            os("--name-only"),
            os("--end-of-options"),
            os(&format!("{rev}^{{tree}}")),
            os("--"),
        ];
        args.extend(paths.iter().map(|p| os(p)));
        let out = self.run(Some(&mirror), &args, false).await?;
        check(&out, "git ls-tree").with_context(|| format!("listing paths of {rev}"))?;
        Ok(nul_separated(&out.stdout).collect())
    }

    /// Every directory of `rev`'s tree, repo-relative (`git ls-tree -r -d`, within the output
    /// bound of every git command).
    pub async fn directories_at(&self, project: ProjectId, rev: &str) -> Result<BTreeSet<String>> {
        let mirror = self.existing_mirror(project)?;
        let args = [
            os("ls-tree"),
            os("-r"),
            os("-d"),
            os("-z"),
            os("--name-only"),
            os("--end-of-options"),
            os(&format!("{rev}^{{tree}}")),
        ];
        let out = self.run(Some(&mirror), &args, false).await?;
        check(&out, "git ls-tree").with_context(|| format!("listing the directories of {rev}"))?;
        Ok(nul_separated(&out.stdout).collect())
    }

    async fn repo_config_read(
        &self,
        project: ProjectId,
        rev: &str,
        dirs: Option<&BTreeSet<String>>,
    ) -> Result<Result<RepoConfig, RepoConfigError>> {
        let read = self
            .read_file_at(
                project,
                rev,
                repo_config::FILE_NAME,
                repo_config::MAX_FILE_BYTES,
            )
            .await;
        let text = match read {
            Ok(bytes) => bytes.map(|b| String::from_utf8_lossy(&b).into_owned()),
            Err(e) => match e.downcast_ref::<RepoFileTooLarge>() {
                Some(big) => return Ok(Err(RepoConfigError::too_large(big.size, big.max))),
                None => return Err(e),
            },
        };
        Ok(match dirs {
            Some(dirs) => RepoConfig::from_optional_in(text.as_deref(), dirs),
            None => RepoConfig::from_optional(text.as_deref()),
        })
    }

    /// The size of blob `oid` (`git cat-file -s`), read from the object's header only.
    async fn blob_size(&self, mirror: &Path, oid: &str, path: &str, rev: &str) -> Result<u64> {
        let out = self
            .run(
                Some(mirror),
                &[os("cat-file"), os("-s"), os("--end-of-options"), os(oid)],
                false,
            )
            .await?;
        check(&out, "git cat-file -s").with_context(|| format!("sizing {path} at {rev}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .with_context(|| format!("the size of {path} at {rev}"))
    }

    /// Blob `oid`, at most `max` bytes of it: git is stopped when it writes more (the object
    /// was sized first; this holds even if it changed in between).
    async fn read_blob(
        &self,
        mirror: &Path,
        oid: &str,
        path: &str,
        rev: &str,
        max: u64,
    ) -> Result<Vec<u8>> {
        let out = self
            .run_capped(Some(mirror), &[os("cat-file"), os("blob"), os(oid)], max)
            .await?;
        if out.stdout.len() as u64 > max {
            return Err(RepoFileTooLarge {
                path: path.to_string(),
                size: out.stdout.len() as u64,
                max,
            }
            .into());
        }
        check(&out, "git cat-file").with_context(|| format!("reading {path} at {rev}"))?;
        Ok(out.stdout)
    }

    /// Every file under directory `dir` at `rev` whose name ends in `suffix`, recursively, in
    /// path order: `(path from the repository top, content)`. `Ok(None)` when `dir` is not a
    /// directory there. A symbolic link, a submodule or a file over `max_bytes` is an error that
    /// names it (a policy directory holds regular files only); one over `max_bytes` is never read
    /// ([`RepoFileTooLarge`]).
    pub async fn read_dir_at(
        &self,
        project: ProjectId,
        rev: &str,
        dir: &str,
        suffix: &str,
        max_bytes: u64,
    ) -> Result<Option<Vec<(String, Vec<u8>)>>> {
        let mirror = self.existing_mirror(project)?;
        let dir = dir.trim_start_matches("./").trim_end_matches('/');
        let tree = if dir.is_empty() || dir == "." {
            format!("{rev}^{{tree}}")
        } else {
            format!("{rev}:{dir}")
        };
        let kind = self
            .run(
                Some(&mirror),
                &[os("cat-file"), os("-t"), os("--end-of-options"), os(&tree)],
                false,
            )
            .await?;
        if !kind.success || String::from_utf8_lossy(&kind.stdout).trim() != "tree" {
            return Ok(None);
        }
        let out = self
            .run(
                Some(&mirror),
                &[
                    os("ls-tree"),
                    os("-r"),
                    os("-z"),
                    os("--long"),
                    os("--end-of-options"),
                    os(&tree),
                ],
                false,
            )
            .await?;
        check(&out, "git ls-tree").with_context(|| format!("listing {dir} at {rev}"))?;
        let shown = |name: &str| {
            if dir.is_empty() || dir == "." {
                name.to_string()
            } else {
                format!("{dir}/{name}")
            }
        };
        let mut files = Vec::new();
        for entry in out.stdout.split(|b| *b == 0).filter(|e| !e.is_empty()) {
            // `<mode> SP <type> SP <object> SP+ <size> TAB <path>`
            let entry = String::from_utf8_lossy(entry);
            let Some((meta, name)) = entry.split_once('\t') else {
                continue;
            };
            let fields: Vec<&str> = meta.split_whitespace().collect();
            let [mode, _kind, oid, size] = fields[..] else {
                continue;
            };
            let path = shown(name);
            match mode {
                "120000" => bail!("{path} is a symbolic link; policy files must be regular files in the directory"),
                "160000" => bail!("{path} is a submodule; policy files must be regular files in the directory"),
                _ => {}
            }
            if !name.ends_with(suffix) {
                continue;
            }
            let size = size.parse::<u64>().unwrap_or(u64::MAX);
            if size > max_bytes {
                return Err(RepoFileTooLarge {
                    path,
                    size,
                    max: max_bytes,
                }
                .into());
            }
            let blob = self.read_blob(&mirror, oid, &path, rev, max_bytes).await?;
            files.push((path, blob));
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Some(files))
    }

    fn existing_mirror(&self, project: ProjectId) -> Result<PathBuf> {
        let mirror = self.mirror_path(project);
        if !mirror.join("HEAD").exists() {
            bail!("no mirror of project {project} yet: sync it first");
        }
        Ok(mirror)
    }

    /// Run git with an explicit environment; `auth` adds the token header (network calls only).
    /// At most [`Workspace::with_max_output`] bytes of its stdout are read (past them git is
    /// stopped and the call fails with [`GitOutputTooLarge`]), 64 KiB of its stderr.
    async fn run(&self, cwd: Option<&Path>, args: &[OsString], auth: bool) -> Result<Output> {
        let out = self
            .run_capped_auth(cwd, args, self.max_output, auth)
            .await?;
        if out.stdout.len() as u64 > self.max_output {
            return Err(GitOutputTooLarge {
                what: what(args),
                max: self.max_output,
            }
            .into());
        }
        Ok(out)
    }

    /// [`Workspace::run`] (no network) keeping at most `max + 1` bytes of stdout and 64 KiB of
    /// stderr: past `max` git is killed, and the caller sees more than `max` bytes.
    async fn run_capped(&self, cwd: Option<&Path>, args: &[OsString], max: u64) -> Result<Output> {
        self.run_capped_auth(cwd, args, max, false).await
    }

    async fn run_capped_auth(
        &self,
        cwd: Option<&Path>,
        args: &[OsString],
        max: u64,
        auth: bool,
    ) -> Result<Output> {
        use tokio::io::AsyncReadExt;
        let what = what(args);
        let mut child = self
            .command(cwd, args, auth)
            .spawn()
            .with_context(|| format!("starting {} {what}", self.git.display()))?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            bail!("git {what}: no pipes");
        };
        // stdout up to `max + 1` bytes, then its pipe is closed (the future that owns it ends:
        // git's next write fails and it exits, instead of blocking on a full pipe); stderr up to
        // 64 KiB, the rest read and dropped (so git never blocks on it either).
        let out = async move {
            let mut out = Vec::new();
            let mut stdout = stdout.take(max.saturating_add(1));
            stdout.read_to_end(&mut out).await.map(|_| out)
        };
        let err = async move {
            let mut err = Vec::new();
            let mut stderr = stderr;
            (&mut stderr).take(64 * 1024).read_to_end(&mut err).await?;
            tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await?;
            Ok::<_, std::io::Error>(err)
        };
        let read = async {
            let (o, e) = tokio::join!(out, err);
            Ok::<_, std::io::Error>((o?, e?))
        };
        let (stdout, stderr) = match tokio::time::timeout(self.timeout, read).await {
            Ok(r) => r.with_context(|| format!("running git {what}"))?,
            Err(_) => bail!(
                "git {what} timed out after {}",
                humantime::format_duration(self.timeout)
            ),
        };
        if stdout.len() as u64 > max {
            let _ = child.start_kill();
        }
        let status = match tokio::time::timeout(self.timeout, child.wait()).await {
            Ok(r) => r.with_context(|| format!("running git {what}"))?,
            Err(_) => bail!(
                "git {what} timed out after {}",
                humantime::format_duration(self.timeout)
            ),
        };
        Ok(Output {
            stdout,
            stderr: self.scrub(&String::from_utf8_lossy(&stderr)),
            success: status.success(),
            code: status.code(),
        })
    }

    /// The git command with its explicit environment, logged in [`Workspace::invocations`].
    fn command(
        &self,
        cwd: Option<&Path>,
        args: &[OsString],
        auth: bool,
    ) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.git);
        let mut env: Vec<(String, OsString)> = vec![
            (
                "PATH".into(),
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
            ),
            ("HOME".into(), self.data_dir.join("git-home").into()),
            ("GIT_TERMINAL_PROMPT".into(), "0".into()),
            ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
            ("GIT_CONFIG_GLOBAL".into(), "/dev/null".into()),
            ("GIT_ASKPASS".into(), "/bin/false".into()),
            ("SSH_ASKPASS".into(), "/bin/false".into()),
            ("GIT_HTTP_LOW_SPEED_LIMIT".into(), "1000".into()),
            ("GIT_HTTP_LOW_SPEED_TIME".into(), "60".into()),
            ("LC_ALL".into(), "C".into()),
        ];
        // Hook-free, and nothing a repository controls runs: no hooks (a hook planted in a
        // mirror never runs), no fsmonitor command, no submodules, no `ext::` transport.
        let mut config: Vec<(&str, String)> = vec![
            ("core.hooksPath", "/dev/null".into()),
            ("core.fsmonitor", "false".into()),
            ("submodule.recurse", "false".into()),
            ("protocol.ext.allow", "never".into()),
        ];
        if auth {
            let basic = base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", self.user, self.token));
            config.push(("http.extraHeader", format!("Authorization: Basic {basic}")));
        }
        env.push(("GIT_CONFIG_COUNT".into(), config.len().to_string().into()));
        let config_keys: Vec<String> = config.iter().map(|(k, _)| k.to_string()).collect();
        for (i, (key, value)) in config.into_iter().enumerate() {
            env.push((format!("GIT_CONFIG_KEY_{i}"), key.into()));
            env.push((format!("GIT_CONFIG_VALUE_{i}"), value.into()));
        }
        cmd.env_clear();
        for (k, v) in &env {
            cmd.env(k, v);
        }
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        } else {
            cmd.current_dir(&self.data_dir);
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        {
            let mut argv = vec![self.git.to_string_lossy().into_owned()];
            argv.extend(args.iter().map(|a| a.to_string_lossy().into_owned()));
            self.log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Invocation {
                    argv,
                    env: env.iter().map(|(k, _)| k.clone()).collect(),
                    config: config_keys,
                });
        }
        cmd
    }

    fn scrub(&self, text: &str) -> String {
        let basic = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", self.user, self.token));
        let mut s = text.to_string();
        for secret in [self.token.as_str(), basic.as_str()] {
            if !secret.is_empty() {
                s = s.replace(secret, "[REDACTED]");
            }
        }
        s
    }
}

/// git's subcommand, for messages.
fn what(args: &[OsString]) -> String {
    args.first()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The names of a `-z` listing of git (NUL after each), as text.
fn nul_separated(stdout: &[u8]) -> impl Iterator<Item = String> + '_ {
    stdout
        .split(|b| *b == 0)
        .filter(|e| !e.is_empty())
        .map(|e| String::from_utf8_lossy(e).into_owned())
}

fn os(s: &str) -> OsString {
    OsString::from(s)
}

fn check(out: &Output, what: &str) -> Result<()> {
    if out.success {
        return Ok(());
    }
    let msg = out.stderr.trim();
    let msg = if msg.chars().count() > 1000 {
        let cut: String = msg.chars().take(1000).collect();
        format!("{cut}…")
    } else {
        msg.to_string()
    };
    Err(anyhow!(
        "{what} failed (exit {}): {msg}",
        out.code
            .map(|c| c.to_string())
            .unwrap_or_else(|| "signal".into())
    ))
}

fn is_full_sha(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(unix)]
fn restrict(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod 0700 {}", dir.display()))
}

#[cfg(not(unix))]
fn restrict(_dir: &Path) -> Result<()> {
    Ok(())
}
