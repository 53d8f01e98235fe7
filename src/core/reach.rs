//! Which roots a change reaches, without globs: each root's local module calls (read from its
//! configuration, recursively through modules that call modules) make a graph, and a root is
//! planned when its own files, a local module it uses, or a `when_modified` pattern changed.
//!
//! Pure: the directories' configuration files are handed in by a reader (the flow reads them
//! from the job's checkout, bounded, never through a link out of it). A module source is
//! followed only when it is a local path (`./…`, `../…`) that stays inside the repository.

use crate::core::repo_config::{normalize_path, RepoConfig, Root};
use crate::core::root_graph::RootGraph;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// At most this many directories are read for one plan run (roots and the modules they reach);
/// past it the rest are said unread, and a root reaching them is planned.
pub const MAX_DIRS: usize = 256;

/// At most this many bytes of configuration files are read in one directory.
pub const MAX_DIR_BYTES: u64 = 16 * 1024 * 1024;

/// At most this many bytes of configuration files are read for one plan run, all directories
/// together: planbot parses them itself, outside the engine's sandbox and its cgroup (16 MiB of
/// HCL took 4 s of a debug build's CPU, so [`MAX_DIRS`] full directories would have taken a
/// quarter of an hour for each push). Past it the directories left are said unread.
pub const MAX_TOTAL_BYTES: u64 = 32 * 1024 * 1024;

/// At most this many `terraform_remote_state` reads are kept of one directory.
pub const MAX_STATE_READS: usize = 64;

/// How many changed files a reason names before it counts the rest.
const SHOWN_FILES: usize = 3;

/// One `module "name" { source = "…" }` call as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleCall {
    pub name: String,
    pub source: String,
}

/// Where a call's `source` leads, seen from the calling directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// A directory of the repository (repo-relative, normalised).
    Local { dir: String },
    /// A registry or remote address (`hashicorp/consul/aws`, `git::https://…`): not the
    /// repository's files, nothing to follow.
    Remote,
    /// A local path that leaves the repository (`../../../etc`, `/opt/x`): never followed.
    Outside { source: String },
}

/// Terraform's rule: a local source starts with `./` or `../`; an absolute path is a
/// filesystem path outside the repository.
pub fn resolve_source(dir: &str, source: &str) -> Source {
    let local = source.starts_with("./") || source.starts_with("../");
    let absolute = source.starts_with('/') || source.starts_with('\\');
    if absolute {
        return Source::Outside {
            source: source.to_string(),
        };
    }
    if !local {
        return Source::Remote;
    }
    match normalize_path(dir, source) {
        Ok(dir) => Source::Local { dir },
        Err(_) => Source::Outside {
            source: source.to_string(),
        },
    }
}

/// The module calls of one directory's configuration files (`(file name, text)`: `.tf` and
/// `.tofu` are HCL, `.tf.json` and `.tofu.json` JSON). A file that does not parse is an error
/// naming it (the engine would refuse it too).
pub fn module_calls(files: &[(String, String)]) -> Result<Vec<ModuleCall>, String> {
    let mut calls = Vec::new();
    for (name, text) in files {
        if name.ends_with(".json") {
            calls.extend(json_calls(text).ok_or_else(|| format!("{name} is not valid JSON"))?);
        } else {
            // Parsed without letting its nesting overflow planbot's stack (`core::hcl`).
            let found = crate::core::hcl::with_body(text, |body| {
                let mut calls = Vec::new();
                for block in body.blocks().filter(|b| b.identifier() == "module") {
                    let Some(label) = block.labels().first() else {
                        continue;
                    };
                    let source = block
                        .body()
                        .attributes()
                        .find(|a| a.key() == "source")
                        .and_then(|a| match a.expr() {
                            hcl::Expression::String(s) => Some(s.clone()),
                            _ => None,
                        });
                    if let Some(source) = source {
                        calls.push(ModuleCall {
                            name: label.as_str().to_string(),
                            source,
                        });
                    }
                }
                calls
            })
            .map_err(|e| format!("{name} {e}"))?;
            calls.extend(found);
        }
    }
    Ok(calls)
}

/// `{"module": {"name": {"source": "…"}}}`, the block as an object or a list of objects.
fn json_calls(text: &str) -> Option<Vec<ModuleCall>> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let blocks: Vec<&serde_json::Value> = match v.get("module") {
        Some(serde_json::Value::Array(items)) => items.iter().collect(),
        Some(m) => vec![m],
        None => Vec::new(),
    };
    let mut calls = Vec::new();
    for m in blocks {
        for (name, call) in m.as_object().into_iter().flatten() {
            let calls_of: Vec<&serde_json::Value> = match call {
                serde_json::Value::Array(items) => items.iter().collect(),
                c => vec![c],
            };
            for c in calls_of {
                if let Some(source) = c.get("source").and_then(|s| s.as_str()) {
                    calls.push(ModuleCall {
                        name: name.clone(),
                        source: source.to_string(),
                    });
                }
            }
        }
    }
    Some(calls)
}

/// A `data "terraform_remote_state"` over `backend = "http"` that reads GitLab-managed state:
/// the project as its address names it (a numeric id or a path, decoded) and the state's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRead {
    pub project: String,
    pub name: String,
}

/// The GitLab-managed states a directory's HCL files read with `data "terraform_remote_state"`
/// (`backend = "http"`, `config = { address = "…" }`), at most [`MAX_STATE_READS`]. Only what
/// the address writes literally counts: its end `/api/v4/projects/<project>/terraform/state/<name>`
/// after any interpolation (`"${var.gate}/api/v4/projects/7/terraform/state/network"` names
/// `network`; `var.address`, or a project or name interpolated, names nothing). A file that
/// does not parse reads nothing (the module calls already say so).
pub fn state_reads(files: &[(String, String)]) -> Vec<StateRead> {
    let mut reads = Vec::new();
    for (_, config) in crate::core::hcl::http_state_blocks(files) {
        match config_address_read(&config) {
            Some(read) if !reads.contains(&read) && reads.len() < MAX_STATE_READS => {
                reads.push(read)
            }
            _ => {}
        }
    }
    reads
}

/// The state a block's `config` expression reads: its `address`, a string or a quoted template
/// whose literal end after the last interpolation or directive names it.
fn config_address_read(config: &str) -> Option<StateRead> {
    // Parsed without letting its nesting overflow planbot's stack (`core::hcl`).
    crate::core::hcl::with_body(&format!("config = {config}\n"), |body| {
        let Some(hcl::Expression::Object(config)) = body
            .attributes()
            .find(|a| a.key() == "config")
            .map(|a| a.expr())
        else {
            return None;
        };
        let address = config.iter().find_map(|(k, v)| {
            let key = match k {
                hcl::ObjectKey::Identifier(i) => i.as_str(),
                hcl::ObjectKey::Expression(hcl::Expression::String(s)) => s.as_str(),
                _ => return None,
            };
            (key == "address").then_some(v)
        });
        match address? {
            hcl::Expression::String(s) => state_address_read(s),
            hcl::Expression::TemplateExpr(t) => match t.as_ref() {
                hcl::TemplateExpr::QuotedString(raw) => {
                    let tail = raw.rfind('}').map_or(raw.as_str(), |i| &raw[i + 1..]);
                    state_address_read(tail)
                }
                hcl::TemplateExpr::Heredoc(_) => None,
            },
            _ => None,
        }
    })
    .ok()
    .flatten()
}

/// `…/api/v4/projects/<project>/terraform/state/<name>` (GitLab's state API, at GitLab or at
/// planbot's state gate): the project and name, decoded; anything else is no state read.
fn state_address_read(address: &str) -> Option<StateRead> {
    const API: &str = "/api/v4/projects/";
    let rest = &address[address.rfind(API)? + API.len()..];
    let parts: Vec<&str> = rest.split('/').collect();
    let [project, "terraform", "state", name] = parts.as_slice() else {
        return None;
    };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(|c| c.into_owned())
            .filter(|c| !c.is_empty())
    };
    Some(StateRead {
        project: decode(project)?,
        name: decode(name)?,
    })
}

/// One directory as read: where it really is and where its calls lead, or why it was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dir {
    Read {
        /// The directory as it really is in the repository (a link inside the repository
        /// resolved): a change under it counts too.
        real: String,
        calls: Vec<(String, Source)>,
        /// The GitLab-managed states its `terraform_remote_state` blocks read.
        states: Vec<StateRead>,
    },
    /// Not a directory at the commit: no calls (a root's own plan says it is missing).
    Missing,
    Unreadable {
        reason: String,
    },
}

/// What a reader says of one directory.
pub enum Read {
    /// Its configuration files, and its real repo-relative path.
    Files {
        real: String,
        files: Vec<(String, String)>,
    },
    Missing,
    Unreadable(String),
}

/// A directory not read because the run's directories before it hold `max` bytes.
fn over_total(max: u64) -> Dir {
    Dir::Unreadable {
        reason: format!(
            "the directories read before it hold more than {} MiB of configuration, the most planbot reads for one plan",
            max / (1024 * 1024)
        ),
    }
}

/// Every directory reached from the roots, by repo-relative path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleGraph {
    pub dirs: BTreeMap<String, Dir>,
}

impl ModuleGraph {
    /// Read the roots' directories and, breadth first, every local module they reach, with
    /// `read` (at most [`MAX_DIRS`] directories; the rest are unreadable, said so).
    pub fn build<'a>(
        roots: impl IntoIterator<Item = &'a str>,
        read: impl FnMut(&str) -> Read,
    ) -> ModuleGraph {
        ModuleGraph::build_within(roots, read, MAX_TOTAL_BYTES)
    }

    /// [`ModuleGraph::build`], parsing at most `max_total` bytes of configuration in all: a
    /// directory that would pass it is unreadable, and so is every one after it.
    pub fn build_within<'a>(
        roots: impl IntoIterator<Item = &'a str>,
        mut read: impl FnMut(&str) -> Read,
        max_total: u64,
    ) -> ModuleGraph {
        let mut total: u64 = 0;
        let mut dirs = BTreeMap::new();
        let mut queue: VecDeque<String> = roots.into_iter().map(str::to_string).collect();
        while let Some(dir) = queue.pop_front() {
            if dirs.contains_key(&dir) {
                continue;
            }
            if dirs.len() >= MAX_DIRS {
                dirs.insert(
                    dir,
                    Dir::Unreadable {
                        reason: format!("more than {MAX_DIRS} module directories"),
                    },
                );
                continue;
            }
            if total > max_total {
                dirs.insert(dir, over_total(max_total));
                continue;
            }
            let entry = match read(&dir) {
                Read::Missing => Dir::Missing,
                Read::Unreadable(reason) => Dir::Unreadable { reason },
                Read::Files { files, .. }
                    if {
                        total = files
                            .iter()
                            .fold(total, |t, (_, text)| t.saturating_add(text.len() as u64));
                        total > max_total
                    } =>
                {
                    over_total(max_total)
                }
                Read::Files { real, files } => match module_calls(&files) {
                    Err(reason) => Dir::Unreadable { reason },
                    Ok(found) => {
                        let calls: Vec<(String, Source)> = found
                            .into_iter()
                            .map(|c| {
                                let to = resolve_source(&dir, &c.source);
                                (c.name, to)
                            })
                            .collect();
                        for (_, to) in &calls {
                            if let Source::Local { dir: next } = to {
                                queue.push_back(next.clone());
                            }
                        }
                        let states = state_reads(&files);
                        Dir::Read {
                            real,
                            calls,
                            states,
                        }
                    }
                },
            };
            dirs.insert(dir, entry);
        }
        ModuleGraph { dirs }
    }

    /// The local module directories `root_dir` uses, directly or through other modules, each
    /// with the chain of directories it is reached through (shortest first found), the sources
    /// not followed because they leave the repository, and the directories not read.
    pub fn uses(&self, root_dir: &str) -> Uses {
        let mut uses = Uses::default();
        let mut seen = BTreeSet::from([root_dir.to_string()]);
        let mut queue = VecDeque::from([(root_dir.to_string(), Vec::<String>::new())]);
        while let Some((dir, via)) = queue.pop_front() {
            match self.dirs.get(&dir) {
                Some(Dir::Read { calls, .. }) => {
                    for (_, to) in calls {
                        match to {
                            Source::Local { dir: next } => {
                                if seen.insert(next.clone()) {
                                    let mut chain = via.clone();
                                    if dir != root_dir {
                                        chain.push(dir.clone());
                                    }
                                    uses.modules.push(ModuleUse {
                                        dir: next.clone(),
                                        via: chain.clone(),
                                    });
                                    queue.push_back((next.clone(), chain));
                                }
                            }
                            Source::Remote => {}
                            Source::Outside { source } => {
                                if !uses.outside.contains(source) {
                                    uses.outside.push(source.clone());
                                }
                            }
                        }
                    }
                }
                Some(Dir::Unreadable { reason }) => {
                    uses.unreadable.push((dir.clone(), reason.clone()));
                }
                Some(Dir::Missing) | None => {}
            }
        }
        uses
    }

    /// Whether repo-relative `path` lies in module directory `dir` (or its real place).
    fn holds(&self, dir: &str, path: &str) -> bool {
        let real = match self.dirs.get(dir) {
            Some(Dir::Read { real, .. }) => Some(real.as_str()),
            _ => None,
        };
        under(dir, path) || real.is_some_and(|r| r != dir && under(r, path))
    }
}

/// `path` is `dir` or below it (`.` holds everything), both repo-relative.
pub fn under(dir: &str, path: &str) -> bool {
    let path = path.trim_start_matches("./");
    dir == "." || path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// What one root uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uses {
    pub modules: Vec<ModuleUse>,
    /// Sources that leave the repository, as written: not followed.
    pub outside: Vec<String>,
    /// Directories reached but not read, with why.
    pub unreadable: Vec<(String, String)>,
}

/// A local module a root uses, through the modules in `via` (empty: called by the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleUse {
    pub dir: String,
    pub via: Vec<String>,
}

/// Why a root is planned (the note's words come from the template).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Why {
    /// Files under its directory changed.
    OwnFiles { files: Vec<String>, more: usize },
    /// A local module it uses changed (through the modules in `via`).
    Module {
        module: String,
        via: Vec<String>,
        files: Vec<String>,
        more: usize,
    },
    /// A `when_modified` pattern (as written) matched changed files.
    WhenModified {
        pattern: String,
        files: Vec<String>,
        more: usize,
    },
    /// A directory it reaches could not be read: planned, as a change may reach it.
    Unread { dir: String, reason: String },
}

/// One root the MR reaches and why, as the note shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reached {
    pub root: String,
    pub why: Vec<Why>,
    /// Module sources of it that leave the repository, as written: not followed.
    pub outside: Vec<String>,
    /// Module directories it reaches that were not read, with why (when that is not already
    /// the reason it is planned).
    pub unread: Vec<(String, String)>,
}

impl Decision<'_> {
    /// What the note says of this root, when it is planned.
    pub fn reached(&self) -> Option<Reached> {
        let said = |dir: &str| {
            self.why
                .iter()
                .any(|w| matches!(w, Why::Unread { dir: d, .. } if d == dir))
        };
        self.affected.then(|| Reached {
            root: self.root.name.clone(),
            why: self.why.clone(),
            outside: self.outside.clone(),
            unread: self
                .unread
                .iter()
                .filter(|(dir, _)| !said(dir))
                .cloned()
                .collect(),
        })
    }
}

/// The project a plan runs for: the states its roots' reads are matched against (GitLab names
/// a project by its numeric id or its path).
#[derive(Debug, Clone, Copy)]
pub struct OwnProject<'a> {
    pub id: u64,
    pub path: Option<&'a str>,
}

/// Config advice: root `root` reads root `reads`'s GitLab-managed state and does not depend on
/// it, so it may plan and apply before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DependsHint {
    pub root: String,
    pub reads: String,
}

/// For each root of `config`, the other roots whose GitLab-managed state (by `state_of`: a
/// root's state name, or none) it reads through a `terraform_remote_state` of its own files or
/// of a local module it uses, in `project`, and that are not above it in `depends_on` (directly
/// or through others). In configuration order, each pair once.
pub fn depends_on_hints(
    config: &RepoConfig,
    graph: &ModuleGraph,
    project: OwnProject<'_>,
    state_of: impl Fn(&Root) -> Option<String>,
) -> Vec<DependsHint> {
    let roots = config.graph();
    let states: Vec<Option<String>> = config.roots.iter().map(&state_of).collect();
    let own = |p: &str| {
        p == project.id.to_string()
            || project
                .path
                .is_some_and(|path| path.eq_ignore_ascii_case(p))
    };
    let mut hints = Vec::new();
    for (i, root) in config.roots.iter().enumerate() {
        let upstream = roots.upstream_of(&root.name);
        let dirs = std::iter::once(root.dir.clone())
            .chain(graph.uses(&root.dir).modules.into_iter().map(|m| m.dir));
        for dir in dirs {
            let Some(Dir::Read { states: reads, .. }) = graph.dirs.get(&dir) else {
                continue;
            };
            for read in reads.iter().filter(|r| own(&r.project)) {
                for (j, other) in config.roots.iter().enumerate() {
                    let hint = DependsHint {
                        root: root.name.clone(),
                        reads: other.name.clone(),
                    };
                    if j != i
                        && states[j].as_deref() == Some(read.name.as_str())
                        && states[i].as_deref() != Some(read.name.as_str())
                        && !upstream.contains(&other.name.as_str())
                        // Below it already: the line would make a circle.
                        && !roots.upstream_of(&other.name).contains(&root.name.as_str())
                        && !hints.contains(&hint)
                    {
                        hints.push(hint);
                    }
                }
            }
        }
    }
    hints
}

/// One root's decision.
#[derive(Debug, Clone)]
pub struct Decision<'a> {
    pub root: &'a Root,
    pub affected: bool,
    /// Why it is planned (empty when skipped).
    pub why: Vec<Why>,
    /// Why it is skipped (the repo config's words), empty when planned.
    pub skipped: String,
    /// The local modules it uses, directly or not (for the note's picture).
    pub modules: Vec<String>,
    /// Module sources of it that leave the repository: not followed.
    pub outside: Vec<String>,
    /// Module directories it reaches that were not read, with why.
    pub unread: Vec<(String, String)>,
}

/// Each root of `config`, and whether the `changed` files (repo-relative) reach it: its own
/// files, a local module of `graph` it uses, or a `when_modified` pattern. Each changed file
/// is counted once per root, in that order.
pub fn decide<'a>(
    config: &'a RepoConfig,
    changed: &[String],
    graph: &ModuleGraph,
) -> Vec<Decision<'a>> {
    let globs = config.decide(changed);
    config
        .roots
        .iter()
        .zip(globs)
        .map(|(root, glob)| {
            let uses = graph.uses(&root.dir);
            let mut own = Vec::new();
            let mut by_module: BTreeMap<usize, Vec<String>> = BTreeMap::new();
            let mut by_pattern: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for f in changed {
                if under(&root.dir, f) {
                    own.push(f.clone());
                } else if let Some(i) = uses.modules.iter().position(|m| graph.holds(&m.dir, f)) {
                    by_module.entry(i).or_default().push(f.clone());
                } else if let Some(p) = root.matching_pattern(f) {
                    by_pattern.entry(p.to_string()).or_default().push(f.clone());
                }
            }
            let mut why = Vec::new();
            if !own.is_empty() {
                let (files, more) = shown(own);
                why.push(Why::OwnFiles { files, more });
            }
            for (i, files) in by_module {
                let (files, more) = shown(files);
                let m = &uses.modules[i];
                why.push(Why::Module {
                    module: m.dir.clone(),
                    via: m.via.clone(),
                    files,
                    more,
                });
            }
            for (pattern, files) in by_pattern {
                let (files, more) = shown(files);
                let written = root
                    .patterns
                    .iter()
                    .position(|p| *p == pattern)
                    .and_then(|i| root.when_modified.get(i))
                    .cloned()
                    .unwrap_or(pattern);
                why.push(Why::WhenModified {
                    pattern: written,
                    files,
                    more,
                });
            }
            if why.is_empty() {
                for (dir, reason) in &uses.unreadable {
                    why.push(Why::Unread {
                        dir: dir.clone(),
                        reason: reason.clone(),
                    });
                }
            }
            let affected = !why.is_empty();
            Decision {
                root,
                affected,
                why,
                skipped: if affected { String::new() } else { glob.reason },
                modules: uses.modules.iter().map(|m| m.dir.clone()).collect(),
                outside: uses.outside,
                unread: uses.unreadable,
            }
        })
        .collect()
}

/// The changed configuration files (`.tf`, `.tofu` and their `.json` forms) no root claims:
/// outside every root's directory, every local module a root uses and every root's
/// `when_modified`. Nothing plans them (a root `dir` misspelled, a module no root calls): the
/// note lists them and the status counts them.
pub fn in_no_root(
    decisions: &[Decision<'_>],
    changed: &[String],
    graph: &ModuleGraph,
) -> Vec<String> {
    let config_file = |f: &str| {
        [".tf", ".tofu", ".tf.json", ".tofu.json"]
            .iter()
            .any(|ext| f.ends_with(ext))
    };
    changed
        .iter()
        .filter(|f| config_file(f))
        .filter(|f| {
            !decisions.iter().any(|d| {
                under(&d.root.dir, f)
                    || d.modules.iter().any(|m| graph.holds(m, f))
                    || d.root.matching_pattern(f).is_some()
            })
        })
        .cloned()
        .collect()
}

/// The reached roots in `graph`'s order (upstream first), and the picture's arrows between
/// them: `(upstream, downstream)` when the one depends on the other, directly or through roots
/// the MR does not reach, and no reached root stands between them.
pub fn in_order(
    graph: &RootGraph,
    mut reached: Vec<Reached>,
) -> (Vec<Reached>, Vec<(String, String)>) {
    let order = graph.order();
    reached.sort_by_key(|r| {
        order
            .iter()
            .position(|o| *o == r.root)
            .unwrap_or(usize::MAX)
    });
    let names: Vec<&str> = reached.iter().map(|r| r.root.as_str()).collect();
    let mut edges = Vec::new();
    for down in &names {
        let above: Vec<&str> = graph
            .upstream_of(down)
            .into_iter()
            .filter(|u| names.contains(u))
            .collect();
        for up in &above {
            let between = above
                .iter()
                .any(|mid| mid != up && graph.upstream_of(mid).contains(up));
            if !between {
                edges.push((up.to_string(), down.to_string()));
            }
        }
    }
    (reached, edges)
}

fn shown(mut files: Vec<String>) -> (Vec<String>, usize) {
    let more = files.len().saturating_sub(SHOWN_FILES);
    files.truncate(SHOWN_FILES);
    (files, more)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> RepoConfig {
        RepoConfig::from_optional(Some(text)).unwrap()
    }

    /// A repository as a map of directory → files.
    fn graph_of(repo: &[(&str, &[(&str, &str)])], roots: &[&str]) -> ModuleGraph {
        ModuleGraph::build(roots.iter().copied(), |dir| {
            match repo.iter().find(|(d, _)| *d == dir) {
                Some((d, files)) => Read::Files {
                    real: d.to_string(),
                    files: files
                        .iter()
                        .map(|(n, t)| (n.to_string(), t.to_string()))
                        .collect(),
                },
                None => Read::Missing,
            }
        })
    }

    const THREE: &str = r#"
[[roots]]
name = "network"
dir = "stacks/network"

[[roots]]
name = "vms"
dir = "stacks/vms"

[[roots]]
name = "dns"
dir = "stacks/dns"
when_modified = ["**", "../../zones/*.txt"]
"#;

    fn repo() -> Vec<(&'static str, &'static [(&'static str, &'static str)])> {
        vec![
            ("stacks/network", &[("main.tf", "resource \"x\" \"y\" {}\n")]),
            (
                "stacks/vms",
                &[(
                    "main.tf",
                    "module \"web\" {\n  source = \"../../modules/vm\"\n}\nmodule \"c\" {\n  source = \"hashicorp/consul/aws\"\n}\n",
                )],
            ),
            (
                "stacks/dns",
                &[(
                    "main.tf.json",
                    r#"{"module": {"rec": {"source": "../../modules/record"}}}"#,
                )],
            ),
            (
                "modules/record",
                &[("main.tf", "module \"n\" {\n  source = \"../vm/./\"\n}\nmodule \"o\" {\n  source = \"../../../outside\"\n}\n")],
            ),
            ("modules/vm", &[("main.tf", "variable \"n\" {}\n")]),
        ]
    }

    fn affected(decisions: &[Decision<'_>]) -> Vec<String> {
        decisions
            .iter()
            .filter(|d| d.affected)
            .map(|d| d.root.name.clone())
            .collect()
    }

    #[test]
    fn a_module_change_reaches_the_roots_that_use_it_directly_or_through_a_module() {
        let cfg = config(THREE);
        let g = graph_of(&repo(), &["stacks/network", "stacks/vms", "stacks/dns"]);
        let d = decide(&cfg, &["modules/vm/main.tf".to_string()], &g);
        assert_eq!(affected(&d), ["vms", "dns"]);
        assert_eq!(
            d[1].why,
            [Why::Module {
                module: "modules/vm".into(),
                via: vec![],
                files: vec!["modules/vm/main.tf".into()],
                more: 0
            }]
        );
        assert_eq!(
            d[2].why,
            [Why::Module {
                module: "modules/vm".into(),
                via: vec!["modules/record".into()],
                files: vec!["modules/vm/main.tf".into()],
                more: 0
            }]
        );
        assert!(
            d[0].skipped.contains("no changed file matches"),
            "{}",
            d[0].skipped
        );
        assert!(d[0].why.is_empty());
        // The nested module's own change reaches only dns; the source leaving the repository
        // is listed, never read.
        let d = decide(&cfg, &["modules/record/variables.tf".to_string()], &g);
        assert_eq!(affected(&d), ["dns"]);
        assert_eq!(d[2].outside, ["../../../outside"]);
        assert_eq!(d[2].modules, ["modules/record", "modules/vm"]);
        assert!(!g.dirs.keys().any(|k| k.contains("outside")), "{g:?}");
    }

    #[test]
    fn own_files_and_when_modified_still_plan_and_say_which() {
        let cfg = config(THREE);
        let g = graph_of(&repo(), &["stacks/network", "stacks/vms", "stacks/dns"]);
        let changed: Vec<String> = ["stacks/network/a.tf", "zones/x.txt", "stacks/vms/README.md"]
            .map(String::from)
            .to_vec();
        let d = decide(&cfg, &changed, &g);
        assert_eq!(affected(&d), ["network", "vms", "dns"]);
        assert_eq!(
            d[0].why,
            [Why::OwnFiles {
                files: vec!["stacks/network/a.tf".into()],
                more: 0
            }]
        );
        assert_eq!(
            d[2].why,
            [Why::WhenModified {
                pattern: "../../zones/*.txt".into(),
                files: vec!["zones/x.txt".into()],
                more: 0
            }]
        );
        let d = decide(&cfg, &["notes/readme.txt".to_string()], &g);
        assert!(affected(&d).is_empty());
    }

    #[test]
    fn sources_are_followed_only_inside_the_repository() {
        assert_eq!(
            resolve_source("stacks/vms", "../../modules/vm"),
            Source::Local {
                dir: "modules/vm".into()
            }
        );
        assert_eq!(
            resolve_source("stacks/vms", "./sub"),
            Source::Local {
                dir: "stacks/vms/sub".into()
            }
        );
        for outside in ["../../../etc", "/etc/passwd", "../../..", "\\\\host\\share"] {
            assert_eq!(
                resolve_source("stacks/vms", outside),
                Source::Outside {
                    source: outside.into()
                },
                "{outside}"
            );
        }
        for remote in [
            "hashicorp/consul/aws",
            "git::https://x/y.git",
            "github.com/a/b",
            "modules/vm",
        ] {
            assert_eq!(
                resolve_source("stacks/vms", remote),
                Source::Remote,
                "{remote}"
            );
        }
    }

    #[test]
    fn an_unreadable_module_plans_the_roots_reaching_it_and_cycles_end() {
        let cfg = config(THREE);
        let mut r = repo();
        r[4] = (
            "modules/vm",
            &[(
                "main.tf",
                "module \"back\" {\n  source = \"../record\"\n}\n",
            )],
        );
        let g = graph_of(&r, &["stacks/network", "stacks/vms", "stacks/dns"]);
        // modules/record ↔ modules/vm call each other: read once each.
        assert_eq!(g.uses("stacks/vms").modules.len(), 2);
        let broken: &[(&str, &str)] = &[("main.tf", "module \"x\" {")];
        r[4] = ("modules/vm", broken);
        let g = graph_of(&r, &["stacks/network", "stacks/vms", "stacks/dns"]);
        let d = decide(&cfg, &["notes/readme.txt".to_string()], &g);
        assert_eq!(affected(&d), ["vms", "dns"]);
        assert_eq!(
            d[1].why,
            [Why::Unread {
                dir: "modules/vm".into(),
                reason: "main.tf does not parse as HCL".into()
            }]
        );
    }

    #[test]
    fn the_picture_orders_the_reached_roots_and_draws_only_the_nearest_arrows() {
        let deps: [(&str, &[&str]); 4] = [
            ("dns", &["vms"]),
            ("vms", &["network"]),
            ("network", &[]),
            ("backup", &[]),
        ];
        let graph = RootGraph::new(&deps).unwrap();
        let r = |n: &str| Reached {
            root: n.into(),
            why: vec![],
            outside: vec![],
            unread: vec![],
        };
        let names = |v: &[Reached]| v.iter().map(|r| r.root.clone()).collect::<Vec<_>>();
        let (order, edges) = in_order(&graph, vec![r("dns"), r("backup"), r("vms"), r("network")]);
        assert_eq!(names(&order), ["network", "vms", "dns", "backup"]);
        assert_eq!(
            edges,
            [
                ("network".to_string(), "vms".to_string()),
                ("vms".to_string(), "dns".to_string())
            ]
        );
        // vms not reached: network still comes before dns, one arrow through it.
        let (order, edges) = in_order(&graph, vec![r("dns"), r("network")]);
        assert_eq!(names(&order), ["network", "dns"]);
        assert_eq!(edges, [("network".to_string(), "dns".to_string())]);
    }

    #[test]
    fn the_reading_stops_at_the_total_bytes_and_says_why() {
        // a calls b calls c; each directory holds 60 bytes, the cap is 100: b passes it.
        let text = |next: &str| {
            let t = format!("module \"m\" {{\n  source = \"../{next}\"\n}}\n");
            format!("{t}{}", "#".repeat(60 - t.len() - 1) + "\n")
        };
        let mut read = Vec::new();
        let g = ModuleGraph::build_within(
            ["a"],
            |dir| {
                read.push(dir.to_string());
                let next = match dir {
                    "a" => "b",
                    "b" => "c",
                    _ => "d",
                };
                Read::Files {
                    real: dir.to_string(),
                    files: vec![("main.tf".to_string(), text(next))],
                }
            },
            100,
        );
        assert!(matches!(g.dirs["a"], Dir::Read { .. }));
        let Dir::Unreadable { reason } = &g.dirs["b"] else {
            panic!("{:?}", g.dirs["b"]);
        };
        assert!(
            reason.starts_with("the directories read before it hold more than"),
            "{reason}"
        );
        assert_eq!(read, ["a", "b"], "nothing is read past the cap");
    }

    #[test]
    fn the_reading_stops_at_max_dirs() {
        let g = ModuleGraph::build(["r"], |dir| {
            let n: usize = dir.trim_start_matches("r").trim_start_matches('/').len();
            Read::Files {
                real: dir.to_string(),
                files: vec![(
                    "main.tf".into(),
                    format!(
                        "module \"m\" {{\n  source = \"./{}\"\n}}\n",
                        "x".repeat(n % 3 + 1)
                    ),
                )],
            }
        });
        assert_eq!(g.dirs.len(), MAX_DIRS + 1);
        assert!(g
            .dirs
            .values()
            .any(|d| matches!(d, Dir::Unreadable { reason } if reason.contains("more than"))));
    }

    /// A `terraform_remote_state` over `http` at `address` (HCL, quotes included when literal).
    fn remote(address: &str) -> String {
        format!(
            "data \"terraform_remote_state\" \"up\" {{\n  backend = \"http\"\n  config = {{\n    address = {address}\n  }}\n}}\n"
        )
    }

    const NETWORK_VMS_DNS: &str = r#"
[[roots]]
name = "network"
dir = "stacks/network"

[[roots]]
name = "vms"
dir = "stacks/vms"

[[roots]]
name = "dns"
dir = "stacks/dns"
depends_on = ["vms"]

[[roots]]
name = "core"
dir = "stacks/core"
state = { gitlab = "homelab" }
"#;

    /// The hints for a repository where `vms` has `vms_tf` (project 7, `infra/homelab`; every
    /// root's state is its name, `core`'s is `homelab`), with `toml` as the repo config.
    fn hints_for(toml: &str, vms_tf: &str, dns_tf: &str) -> Vec<(String, String)> {
        let cfg = config(toml);
        let repo: Vec<(&str, Vec<(&str, &str)>)> = vec![
            ("stacks/network", vec![("main.tf", "")]),
            ("stacks/vms", vec![("main.tf", vms_tf)]),
            ("stacks/dns", vec![("main.tf", dns_tf)]),
            ("stacks/core", vec![("main.tf", "")]),
            ("modules/reader", vec![("main.tf", vms_tf)]),
        ];
        let repo: Vec<(&str, &[(&str, &str)])> =
            repo.iter().map(|(d, f)| (*d, f.as_slice())).collect();
        let dirs: Vec<&str> = cfg.roots.iter().map(|r| r.dir.as_str()).collect();
        let g = graph_of(&repo, &dirs);
        let project = OwnProject {
            id: 7,
            path: Some("infra/homelab"),
        };
        depends_on_hints(&cfg, &g, project, |r| match &r.state {
            crate::core::repo_config::RootState::Gitlab(n) => Some(n.clone()),
            _ => Some(r.name.clone()),
        })
        .into_iter()
        .map(|h| (h.root, h.reads))
        .collect()
    }

    fn pair(a: &str, b: &str) -> Vec<(String, String)> {
        vec![(a.to_string(), b.to_string())]
    }

    #[test]
    fn a_root_reading_another_roots_managed_state_gets_the_depends_on_hint() {
        // At GitLab, by id; at the gate, by path (encoded), the host interpolated.
        for address in [
            "\"https://gitlab.example.com/api/v4/projects/7/terraform/state/network\"",
            "\"http://127.0.0.1:${var.gate_port}/api/v4/projects/infra%2Fhomelab/terraform/state/network\"",
        ] {
            assert_eq!(
                hints_for(NETWORK_VMS_DNS, &remote(address), ""),
                pair("vms", "network"),
                "{address}"
            );
        }
        // A state named other than its root (`state = { gitlab = "homelab" }`), URL-encoded.
        assert_eq!(
            hints_for(
                NETWORK_VMS_DNS,
                &remote(
                    "\"https://gitlab.example.com/api/v4/projects/7/terraform/state/home%6cab\""
                ),
                ""
            ),
            pair("vms", "core")
        );
        // Read through a local module the root uses.
        let via_module = "module \"r\" {\n  source = \"../../modules/reader\"\n}\n";
        let reader =
            remote("\"https://gitlab.example.com/api/v4/projects/7/terraform/state/network\"");
        let cfg = config(NETWORK_VMS_DNS);
        let vms_files = [("main.tf", via_module)];
        let reader_files = [("main.tf", reader.as_str())];
        let repo: Vec<(&str, &[(&str, &str)])> = vec![
            ("stacks/vms", &vms_files),
            ("modules/reader", &reader_files),
        ];
        let g = graph_of(&repo, &["stacks/network", "stacks/vms"]);
        let hints = depends_on_hints(&cfg, &g, OwnProject { id: 7, path: None }, |r| {
            Some(r.name.clone())
        });
        assert_eq!(
            hints,
            [DependsHint {
                root: "vms".into(),
                reads: "network".into()
            }]
        );
    }

    #[test]
    fn no_hint_for_another_projects_state_a_root_already_below_or_an_address_not_written_out() {
        let at = |a: &str| remote(&format!("\"https://gitlab.example.com{a}\""));
        // Another project's state of the same name, by id or path.
        for other in [
            "/api/v4/projects/8/terraform/state/network",
            "/api/v4/projects/infra%2Fother/terraform/state/network",
        ] {
            assert!(
                hints_for(NETWORK_VMS_DNS, &at(other), "").is_empty(),
                "{other}"
            );
        }
        // No root's state, its own state, or not the state API at all.
        for name in [
            "/api/v4/projects/7/terraform/state/storage",
            "/api/v4/projects/7/terraform/state/vms",
            "/api/v4/projects/7/terraform/state/network/lock",
            "/api/v4/projects/7/repository/files/network",
        ] {
            assert!(
                hints_for(NETWORK_VMS_DNS, &at(name), "").is_empty(),
                "{name}"
            );
        }
        // The JSON form, read the same way (a list of blocks, too).
        let json = r#"{"data": [{"terraform_remote_state": {"up": {"backend": "http", "config": {"address": "${var.gate}/api/v4/projects/7/terraform/state/network"}}}}]}"#;
        assert_eq!(
            state_reads(&[("state.tf.json".into(), json.into())]),
            [StateRead {
                project: "7".into(),
                name: "network".into()
            }]
        );
        let json_var = r#"{"data": {"terraform_remote_state": {"up": {"backend": "http", "config": {"address": "${var.address}"}}}}}"#;
        assert!(state_reads(&[("state.tf.json".into(), json_var.into())]).is_empty());
        // Not over `http`.
        let s3 = "data \"terraform_remote_state\" \"up\" {\n  backend = \"s3\"\n  config = {\n    address = \"https://gitlab.example.com/api/v4/projects/7/terraform/state/network\"\n  }\n}\n";
        assert!(hints_for(NETWORK_VMS_DNS, s3, "").is_empty());
        // Not literal: a variable, the name or the project interpolated.
        for address in [
            "var.network_state",
            "\"https://gitlab.example.com/api/v4/projects/7/terraform/state/${var.upstream}\"",
            "\"https://gitlab.example.com/api/v4/projects/${var.project}/terraform/state/network\"",
        ] {
            assert!(
                hints_for(NETWORK_VMS_DNS, &remote(address), "").is_empty(),
                "{address}"
            );
        }
        // Already in depends_on: directly (`vms` → `network`), or through another root (`dns`
        // reads `network`, below it through `vms`).
        let read_network =
            remote("\"https://gitlab.example.com/api/v4/projects/7/terraform/state/network\"");
        let depends = NETWORK_VMS_DNS.replace(
            "dir = \"stacks/vms\"\n",
            "dir = \"stacks/vms\"\ndepends_on = [\"network\"]\n",
        );
        assert!(hints_for(&depends, &read_network, &read_network).is_empty());
        // A root below the reader: the line would make a circle (`vms` reading `dns`).
        let read_dns =
            remote("\"https://gitlab.example.com/api/v4/projects/7/terraform/state/dns\"");
        assert!(hints_for(NETWORK_VMS_DNS, &read_dns, "").is_empty());
        // Without `vms` → `network`, `dns` gets the hint too.
        assert_eq!(
            hints_for(NETWORK_VMS_DNS, "", &read_network),
            pair("dns", "network")
        );
    }
}
