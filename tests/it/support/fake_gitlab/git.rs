//! Real bare repositories: the git plumbing the helpers use, and git over HTTP (smart protocol through `git http-backend`).

use super::*;

/// One request the git HTTP endpoint saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRequest {
    pub method: String,
    pub path: String,
    pub query: String,
    /// The Basic-auth user name, when the Authorization header was valid.
    pub auth_user: Option<String>,
    pub status: u16,
}

pub(super) fn git_env(cmd: &mut std::process::Command) {
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::temp_dir())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_AUTHOR_NAME", "Fake Dev")
        .env("GIT_AUTHOR_EMAIL", "dev@fake.gitlab")
        .env("GIT_COMMITTER_NAME", "Fake GitLab")
        .env("GIT_COMMITTER_EMAIL", "gitlab@fake.gitlab");
}

/// Run git in `repo`; panics with git's stderr on failure (test helpers).
pub(super) fn git(
    repo: &FsPath,
    args: &[&str],
    extra_env: &[(&str, &FsPath)],
    stdin: Option<&[u8]>,
) -> String {
    try_git(repo, args, extra_env, stdin)
        .unwrap_or_else(|e| panic!("fake gitlab: git {args:?} in {}: {e}", repo.display()))
}

pub(super) fn try_git(
    repo: &FsPath,
    args: &[&str],
    extra_env: &[(&str, &FsPath)],
    stdin: Option<&[u8]>,
) -> Result<String, String> {
    use std::io::Write;
    let mut cmd = std::process::Command::new("git");
    git_env(&mut cmd);
    cmd.arg("-C").arg(repo).args(args);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input)
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "exit {:?}: {}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

pub(super) fn rev_parse(repo: &FsPath, rev: &str) -> Option<String> {
    try_git(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ],
        &[],
        None,
    )
    .ok()
    .filter(|s| !s.is_empty())
}

pub(super) fn is_ancestor(repo: &FsPath, a: &str, b: &str) -> bool {
    try_git(repo, &["merge-base", "--is-ancestor", a, b], &[], None).is_ok()
}

/// One real commit on `branch` of the bare repo, changing `files` (content `None` = delete).
pub(super) fn commit_in_bare(
    repo: &FsPath,
    branch: &str,
    base_if_new: Option<&str>,
    files: &[(&str, Option<&str>)],
    message: &str,
) -> String {
    let index_dir = tempfile::tempdir().expect("tempdir");
    let index = index_dir.path().join("index");
    let env = [("GIT_INDEX_FILE", index.as_path())];
    let parent = rev_parse(repo, &format!("refs/heads/{branch}"))
        .or_else(|| base_if_new.and_then(|b| rev_parse(repo, b)));
    match &parent {
        Some(p) => git(repo, &["read-tree", p], &env, None),
        None => git(repo, &["read-tree", "--empty"], &env, None),
    };
    for (path, content) in files {
        match content {
            Some(c) => {
                let oid = git(
                    repo,
                    &["hash-object", "-w", "--stdin"],
                    &[],
                    Some(c.as_bytes()),
                );
                git(
                    repo,
                    &[
                        "update-index",
                        "--add",
                        "--cacheinfo",
                        &format!("100644,{oid},{path}"),
                    ],
                    &env,
                    None,
                );
            }
            None => {
                let line = format!("0 {}\t{path}\n", "0".repeat(40));
                git(
                    repo,
                    &["update-index", "--index-info"],
                    &env,
                    Some(line.as_bytes()),
                );
            }
        }
    }
    let tree = git(repo, &["write-tree"], &env, None);
    let mut args = vec!["commit-tree", tree.as_str(), "-m", message];
    if let Some(p) = &parent {
        args.push("-p");
        args.push(p);
    }
    let sha = git(repo, &args, &[], None);
    git(
        repo,
        &["update-ref", &format!("refs/heads/{branch}"), &sha],
        &[],
        None,
    );
    sha
}

/// A commit on `branch` (which must exist) applying raw `git update-index --index-info` lines.
pub(super) fn commit_in_bare_with_index_lines(
    repo: &FsPath,
    branch: &str,
    lines: &[String],
) -> String {
    let index_dir = tempfile::tempdir().expect("tempdir");
    let index = index_dir.path().join("index");
    let env = [("GIT_INDEX_FILE", index.as_path())];
    let parent = rev_parse(repo, &format!("refs/heads/{branch}")).expect("branch exists");
    git(repo, &["read-tree", &parent], &env, None);
    for line in lines {
        git(
            repo,
            &["update-index", "--index-info"],
            &env,
            Some(line.as_bytes()),
        );
    }
    let tree = git(repo, &["write-tree"], &env, None);
    let sha = git(
        repo,
        &[
            "commit-tree",
            tree.as_str(),
            "-m",
            "Change modes",
            "-p",
            &parent,
        ],
        &[],
        None,
    );
    git(
        repo,
        &["update-ref", &format!("refs/heads/{branch}"), &sha],
        &[],
        None,
    );
    sha
}

/// The branches whose history holds `sha`, by name.
pub(super) fn branches_containing(repo: &FsPath, sha: &str) -> Vec<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args([
            "for-each-ref",
            "--format=%(refname:short)",
            "--contains",
            sha,
            "refs/heads/",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

// ----- git over HTTP (smart protocol through `git http-backend`) ------------------------------

pub(super) async fn git_http(State(state): State<Shared>, req: Request) -> Response {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let headers = req.headers().clone();
    let (git_root, auth_user, allowed) = {
        let s = lock!(state);
        let auth = basic_user(&s, &headers);
        let project_path = path
            .split_once(".git/")
            .map(|(p, _)| p.trim_start_matches('/').to_string());
        let pid = project_path.as_deref().and_then(|p| s.project_ref(p));
        let allowed = match (&auth, pid) {
            (Some((_, Some(u))), Some(pid)) => level(&s, pid, u) >= REPORTER,
            (Some((_, None)), Some(_)) => true,
            _ => false,
        };
        (s.git_root.clone(), auth.map(|(u, _)| u), allowed)
    };
    let record = |status: u16| {
        lock!(state).git_requests.push(GitRequest {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            auth_user: auth_user.clone(),
            status,
        });
    };
    if !path.contains(".git/") {
        record(404);
        return err(StatusCode::NOT_FOUND, "404 Not Found");
    }
    if !allowed {
        record(401);
        let mut r = (StatusCode::UNAUTHORIZED, "HTTP Basic: Access denied\n").into_response();
        r.headers_mut().insert(
            "www-authenticate",
            HeaderValue::from_static("Basic realm=\"Fake GitLab\""),
        );
        return r;
    }
    // Fetch only: pushes go through the test helpers.
    if path.ends_with("/git-receive-pack") || query.contains("service=git-receive-pack") {
        record(403);
        return err(StatusCode::FORBIDDEN, "pushes are not served by the fake");
    }
    let body = match axum::body::to_bytes(req.into_body(), 64 * 1024 * 1024).await {
        Ok(b) => b,
        Err(_) => {
            record(400);
            return err(StatusCode::BAD_REQUEST, "body too large");
        }
    };
    let h = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", &git_root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("PATH_INFO", &path)
        .env("QUERY_STRING", &query)
        .env("REQUEST_METHOD", &method)
        .env("CONTENT_TYPE", h("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", h("content-encoding"))
        .env("HTTP_GIT_PROTOCOL", h("git-protocol"))
        .env("REMOTE_USER", auth_user.clone().unwrap_or_default())
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            record(500);
            return err(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("git http-backend: {e}"),
            );
        }
    };
    let mut stdin = child.stdin.take().unwrap();
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
        let _ = stdin.shutdown().await;
    });
    let out = match child.wait_with_output().await {
        Ok(o) => o,
        Err(e) => {
            record(500);
            return err(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("git http-backend: {e}"),
            );
        }
    };
    let _ = writer.await;
    let raw = out.stdout;
    let (head_end, sep) = match find(&raw, b"\r\n\r\n") {
        Some(i) => (i, 4),
        None => match find(&raw, b"\n\n") {
            Some(i) => (i, 2),
            None => {
                record(500);
                return err(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "bad CGI answer from git http-backend",
                );
            }
        },
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_string();
    let mut status = StatusCode::OK;
    let mut builder = Response::builder();
    for line in head.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        if k.eq_ignore_ascii_case("status") {
            let code = v
                .split_whitespace()
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or(500);
            status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        } else {
            builder = builder.header(k, v);
        }
    }
    record(status.as_u16());
    builder
        .status(status)
        .body(Body::from(raw[head_end + sep..].to_vec()))
        .unwrap()
}

pub(super) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl FakeGitLab {
    /// Requests the git HTTP endpoint saw.
    pub fn git_requests(&self) -> Vec<GitRequest> {
        self.lock().git_requests.clone()
    }
}
