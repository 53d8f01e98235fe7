//! What planbot knows about a root's state: GitLab-managed state (the engine's `http` backend,
//! its address and environment), the backend a root declares or `init` chose, a held lock;
//! and in [`remote`], another root's state read through the job's state gate.
//!
//! Pure: the flows read the files and hand their text in.

use crate::core::config::{GitlabCredential, StateDefault};
use crate::core::proxmox::findings::{self, Finding, Severity};
use crate::core::repo_config::{Root, RootState};
use base64::Engine as _;

pub mod remote;
use std::collections::BTreeMap;

/// The override file planbot writes into a root with GitLab-managed state: an override's
/// `backend` block replaces the root's own, so the `http` backend is used whatever the root's
/// code says, configured entirely by the `TF_HTTP_*` environment.
pub const OVERRIDE_FILE: &str = "planbot_state_override.tf";

/// The text of [`OVERRIDE_FILE`].
pub const OVERRIDE_TEXT: &str = "# Written by planbot: this root's state is GitLab-managed (see .planbot.toml).\nterraform {\n  backend \"http\" {}\n}\n";

/// The GitLab-managed state a root uses, by name: its own `state = { gitlab = "NAME" }`, or
/// the root's name when the service's `state.default` is `gitlab` and the root says nothing.
pub fn gitlab_state_name(root: &Root, default: StateDefault) -> Option<String> {
    match (&root.state, default) {
        (RootState::Gitlab(name), _) => Some(name.clone()),
        (RootState::Unset, StateDefault::Gitlab) => Some(root.name.clone()),
        _ => None,
    }
}

/// `<gitlab>/api/v4/projects/<id>/terraform/state/<name>`, the name URL-encoded.
pub fn state_address(gitlab_url: &str, project: u64, name: &str) -> String {
    let base = format!(
        "{}/api/v4/projects/{project}/terraform/state/",
        gitlab_url.trim_end_matches('/')
    );
    match url::Url::parse(&base) {
        Ok(mut u) => {
            if let Ok(mut segments) = u.path_segments_mut() {
                segments.pop_if_empty().push(name);
            }
            u.to_string()
        }
        Err(_) => format!("{base}{name}"),
    }
}

/// The `http` backend's configuration for GitLab-managed state at `address` (as GitLab's own
/// OpenTofu component sets it): the lock and unlock addresses and methods, retries, and the
/// credential of the run's trust level.
pub fn http_backend_env(address: &str, credential: &GitlabCredential) -> BTreeMap<String, String> {
    let lock = format!("{address}/lock");
    [
        ("TF_HTTP_ADDRESS", address.to_string()),
        ("TF_HTTP_LOCK_ADDRESS", lock.clone()),
        ("TF_HTTP_UNLOCK_ADDRESS", lock),
        ("TF_HTTP_LOCK_METHOD", "POST".into()),
        ("TF_HTTP_UNLOCK_METHOD", "DELETE".into()),
        ("TF_HTTP_RETRY_WAIT_MIN", "5".into()),
        ("TF_HTTP_USERNAME", credential.username.clone()),
        ("TF_HTTP_PASSWORD", credential.token.expose().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// What a job's state gate lets its engine do, by the run's trust level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateAccess {
    /// MR plans and drift checks: read (`GET`) the project's states, nothing else.
    Read,
    /// The default branch's plans and applies: read the project's states; lock, write and
    /// unlock the run's own state.
    ReadWrite,
}

/// What one job's state gate grants a run: the states of one project (its own, named by its
/// numeric id or, when known, its path), the one state the run may lock and write, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateGrant {
    pub project: u64,
    pub project_path: Option<String>,
    pub state: String,
    pub access: GateAccess,
}

impl GateGrant {
    /// Whether `asked` (an address's project, decoded) names the grant's project: its id, or
    /// its path in any case (GitLab finds a project by its path whatever the case).
    fn names_project(&self, asked: &str) -> bool {
        asked == self.project.to_string()
            || self
                .project_path
                .as_deref()
                .is_some_and(|p| p.eq_ignore_ascii_case(asked))
    }
}

/// What a request to the gate asks of GitLab's state API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateOp {
    Read,
    Write,
    Lock,
    Unlock,
    Delete,
}

impl GateOp {
    fn word(self) -> &'static str {
        match self {
            GateOp::Read => "read",
            GateOp::Write => "write",
            GateOp::Lock => "lock",
            GateOp::Unlock => "unlock",
            GateOp::Delete => "deletion",
        }
    }
}

/// A request the gate forwards: the state's name (decoded), the lock endpoint or the state's
/// own, and the lock ID a write names (`?ID=`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateCall {
    pub op: GateOp,
    pub name: String,
    pub lock_endpoint: bool,
    pub lock_id: Option<String>,
}

impl GateCall {
    /// Where the gate forwards it: GitLab's state API for the grant's project, the name
    /// encoded again (nothing of the request's own path or query reaches GitLab).
    pub fn upstream(&self, gitlab_url: &str, project: u64) -> String {
        let mut address = state_address(gitlab_url, project, &self.name);
        if self.lock_endpoint {
            address.push_str("/lock");
        }
        if let Some(id) = &self.lock_id {
            let query: String = url::form_urlencoded::Serializer::new(String::new())
                .append_pair("ID", id)
                .finish();
            address.push('?');
            address.push_str(&query);
        }
        address
    }
}

/// Why the gate refused a request: the text for the note and the job's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateRefusal(pub String);

/// The path of GitLab's state API the gate serves (`/api/v4/projects/<id>/terraform/state/`).
const GATE_PREFIX: [&str; 3] = ["api", "v4", "projects"];

/// Decide one request to a job's state gate (`method`, its raw `path` and `query`): the call
/// to forward, or why it is refused. Only the grant's own project, by its numeric ID or its
/// path (the gate asks GitLab by the ID whatever the address said); for a [`GateAccess::Read`] grant only reads; locks and
/// writes only of the grant's own state; never a deletion.
pub fn gate_request(
    grant: &GateGrant,
    method: &str,
    path: &str,
    query: Option<&str>,
) -> Result<GateCall, GateRefusal> {
    let run = match grant.access {
        GateAccess::Read => "plan",
        GateAccess::ReadWrite => "run",
    };
    let refuse = |why: &str, ctx: minijinja::Value| {
        let ctx = minijinja::context! { why => why, run => run, own => grant.project, ..ctx };
        GateRefusal(crate::core::templates::text(
            "state.txt.j2",
            "gate_refused",
            ctx,
        ))
    };
    let not_api = || {
        refuse(
            "not_state_api",
            minijinja::context! { path => path.chars().take(200).collect::<String>() },
        )
    };
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or("").split('/').collect();
    if segments.len() < 7
        || segments.len() > 8
        || segments[..3] != GATE_PREFIX
        || segments[4] != "terraform"
        || segments[5] != "state"
        || (segments.len() == 8 && segments[7] != "lock")
    {
        return Err(not_api());
    }
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .ok()
    };
    let (Some(asked), Some(name)) = (decode(segments[3]), decode(segments[6])) else {
        return Err(not_api());
    };
    if name.is_empty() {
        return Err(not_api());
    }
    let lock_endpoint = segments.len() == 8;
    let op = match (lock_endpoint, method) {
        (false, "GET") => GateOp::Read,
        (false, "POST") => GateOp::Write,
        (false, "DELETE") => GateOp::Delete,
        (true, "POST") => GateOp::Lock,
        (true, "DELETE") => GateOp::Unlock,
        _ => {
            return Err(refuse(
                "method",
                minijinja::context! { method => method.chars().take(20).collect::<String>(), name => &name },
            ))
        }
    };
    let ctx = minijinja::context! { op => op.word(), name => &name, asked => &asked, granted => &grant.state };
    if !grant.names_project(&asked) {
        return Err(refuse("other_project", ctx));
    }
    match (op, grant.access) {
        (GateOp::Read, _) => {}
        (GateOp::Delete, _) => return Err(refuse("delete", ctx)),
        (_, GateAccess::Read) => return Err(refuse("read_only", ctx)),
        (_, GateAccess::ReadWrite) if name != grant.state => {
            return Err(refuse("other_state", ctx))
        }
        _ => {}
    }
    let lock_id = query.and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "ID")
            .map(|(_, v)| v.into_owned())
    });
    Ok(GateCall {
        op,
        name,
        lock_endpoint,
        lock_id: lock_id.filter(|_| op != GateOp::Read),
    })
}

/// The environment `init` gets to fetch modules from the same GitLab: git's HTTP
/// `Authorization` header for that GitLab's URL only (through git's environment: nothing is
/// written into the checkout or a file), and `TF_TOKEN_<host>` for its module registry (not for
/// a GitLab on a port other than 443, which the engine cannot name in a variable). Every value
/// is a secret.
pub fn module_env(gitlab_url: &str, credential: &GitlabCredential) -> BTreeMap<String, String> {
    let token = credential.token.expose();
    let basic = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{token}", credential.username));
    let prefix = format!("{}/", gitlab_url.trim_end_matches('/'));
    let mut env: BTreeMap<String, String> = [
        ("GIT_CONFIG_NOSYSTEM", "1".to_string()),
        ("GIT_TERMINAL_PROMPT", "0".to_string()),
        ("GIT_CONFIG_COUNT", "1".to_string()),
        ("GIT_CONFIG_KEY_0", format!("http.{prefix}.extraHeader")),
        (
            "GIT_CONFIG_VALUE_0",
            format!("Authorization: Basic {basic}"),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(name) = registry_token_variable(gitlab_url) {
        env.insert(name, token.to_string());
    }
    env
}

/// `TF_TOKEN_gitlab_example_com` for `https://gitlab.example.com`: dots become `_`, hyphens
/// `__` (the engines' encoding of a host name). `None` for a URL with a port other than 443.
pub fn registry_token_variable(gitlab_url: &str) -> Option<String> {
    let u = url::Url::parse(gitlab_url).ok()?;
    if u.port().is_some_and(|p| p != 443) {
        return None;
    }
    let host = u.host_str()?.to_ascii_lowercase();
    Some(format!(
        "TF_TOKEN_{}",
        host.replace('-', "__").replace('.', "_")
    ))
}

/// The backend a root uses, as planbot learns it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Backend {
    /// The state is a file next to the code: a `local` backend (`declared`), or no backend
    /// block at all. In a service run it lives in a throwaway checkout and is lost.
    Local { declared: bool },
    /// Any other backend (`http`, `s3`, `pg`, `cloud`…), by type.
    Remote(String),
}

impl Backend {
    /// After `init`: `.terraform/terraform.tfstate` names the backend `init` configured; without
    /// that file there was no backend block, which is the local one.
    pub fn after_init(init_file: Option<&[u8]>) -> Backend {
        let Some(bytes) = init_file else {
            return Backend::Local { declared: false };
        };
        let kind = serde_json::from_slice::<serde_json::Value>(bytes)
            .ok()
            .and_then(|v| {
                v.pointer("/backend/type")
                    .and_then(|t| t.as_str())
                    .map(str::to_string)
            });
        match kind.as_deref() {
            None | Some("") => Backend::Local { declared: false },
            Some("local") => Backend::Local { declared: true },
            Some(other) => Backend::Remote(other.to_string()),
        }
    }

    /// Whether the state is a file in the checkout.
    pub fn is_local(&self) -> bool {
        matches!(self, Backend::Local { .. })
    }

    /// Before any engine runs: the backend the root's files declare (`terraform { backend "x"
    /// {} }` or `cloud {}`; an override file wins), or `None` when a file cannot be read as
    /// HCL or JSON (then only `init` can tell). `files` are the root directory's `.tf`,
    /// `.tofu`, `.tf.json` and `.tofu.json` files, by name.
    pub fn declared(files: &[(String, String)]) -> Option<Backend> {
        let mut found: Option<Backend> = None;
        let mut overridden: Option<Backend> = None;
        for (name, text) in files {
            let stem = name
                .trim_end_matches(".json")
                .trim_end_matches(".tf")
                .trim_end_matches(".tofu");
            let is_override = stem == "override" || stem.ends_with("_override");
            let backend = if name.ends_with(".json") {
                json_backend(text)?
            } else {
                hcl_backend(text)?
            };
            if let Some(b) = backend {
                if is_override {
                    overridden = Some(b);
                } else {
                    found = Some(b);
                }
            }
        }
        Some(
            overridden
                .or(found)
                .unwrap_or(Backend::Local { declared: false }),
        )
    }
}

/// The backend of one HCL file: `Some(None)` when it declares none, `None` when it does not parse.
fn hcl_backend(text: &str) -> Option<Option<Backend>> {
    // Parsed without letting its nesting overflow planbot's stack (`core::hcl`).
    crate::core::hcl::with_body(text, body_backend).ok()
}

/// The backend an HCL body declares (the last one), `None` when it declares none.
fn body_backend(body: &hcl::Body) -> Option<Backend> {
    let mut found = None;
    for block in body.blocks().filter(|b| b.identifier() == "terraform") {
        for inner in block.body().blocks() {
            match inner.identifier() {
                "backend" => {
                    let kind = inner
                        .labels()
                        .first()
                        .map(|l| l.as_str().to_string())
                        .unwrap_or_default();
                    found = Some(if kind == "local" {
                        Backend::Local { declared: true }
                    } else {
                        Backend::Remote(kind)
                    });
                }
                "cloud" => found = Some(Backend::Remote("cloud".into())),
                _ => {}
            }
        }
    }
    found
}

/// The backend of one JSON configuration file (`{"terraform": {"backend": {"s3": {...}}}}`).
fn json_backend(text: &str) -> Option<Option<Backend>> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let blocks: Vec<&serde_json::Value> = match v.get("terraform") {
        Some(serde_json::Value::Array(items)) => items.iter().collect(),
        Some(t) => vec![t],
        None => Vec::new(),
    };
    let mut found = None;
    for t in blocks {
        if t.get("cloud").is_some() {
            found = Some(Backend::Remote("cloud".into()));
        }
        if let Some(kind) = t
            .get("backend")
            .and_then(|b| b.as_object())
            .and_then(|b| b.keys().next())
        {
            found = Some(if kind == "local" {
                Backend::Local { declared: true }
            } else {
                Backend::Remote(kind.clone())
            });
        }
    }
    Some(found)
}

/// The finding for a root whose state is a file in the checkout: an error in a service run
/// (`service`: the plan status fails, the apply is refused), a warning for `planbot plan`.
pub fn state_in_checkout(root: &str, dir: &str, backend: &Backend, service: bool) -> Finding {
    let severity = if service {
        Severity::Error
    } else {
        Severity::Warning
    };
    findings::finding_with(
        findings::STATE_IN_CHECKOUT,
        severity,
        "",
        serde_json::json!({
            "root": root,
            "dir": dir,
            "declared": matches!(backend, Backend::Local { declared: true }),
            "service": service,
        }),
    )
}

/// A state lock someone else holds, as the engine reports it ("Error acquiring the state lock").
/// The `http` backend names only the held lock's ID (`already locked: ID=…`; its `Lock Info:`
/// block is the engine's own attempt), so who holds it and since when come from GitLab
/// ([`HeldLock::held_by`]); other backends print the held lock's info.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    pub id: String,
    pub who: String,
    pub created: String,
}

impl HeldLock {
    /// The held lock an engine's (redacted) output reports, if it reports one.
    pub fn from_engine_output(text: &str) -> Option<HeldLock> {
        if !text.contains("Error acquiring the state lock") {
            return None;
        }
        if let Some(rest) = text.split("already locked: ID=").nth(1) {
            let id: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
            return (!id.is_empty()).then(|| HeldLock {
                id,
                who: String::new(),
                created: String::new(),
            });
        }
        let mut in_info = false;
        let mut fields: BTreeMap<&str, String> = BTreeMap::new();
        for line in text.lines() {
            let l = line.trim_start_matches(['│', '╷', '╵']).trim();
            if l.starts_with("Lock Info:") {
                in_info = true;
                continue;
            }
            if !in_info {
                continue;
            }
            let Some((key, value)) = l.split_once(':') else {
                if l.is_empty() && !fields.is_empty() {
                    break;
                }
                continue;
            };
            match key.trim() {
                k @ ("ID" | "Who" | "Created") => {
                    fields.insert(k, value.trim().to_string());
                }
                "Path" | "Operation" | "Version" | "Info" => {}
                _ => break,
            }
        }
        Some(HeldLock {
            id: fields.remove("ID").filter(|s| !s.is_empty())?,
            who: fields.remove("Who").unwrap_or_default(),
            created: fields.remove("Created").unwrap_or_default(),
        })
    }

    /// The lock with who holds it and since when, as GitLab tells (`who` a GitLab user name).
    pub fn held_by(self, who: &str, since: &str) -> HeldLock {
        HeldLock {
            who: format!("@{who}"),
            created: since.to_string(),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config::Secret;
    use crate::core::repo_config::RepoConfig;

    #[test]
    fn the_overrides_are_files_the_format_check_knows_as_planbots() {
        for name in [OVERRIDE_FILE, remote::OVERRIDE_FILE] {
            assert!(
                crate::core::engine_checks::PLANBOT_FILES.contains(&name),
                "{name}"
            );
        }
    }

    fn cred() -> GitlabCredential {
        GitlabCredential {
            username: "planbot".into(),
            token: Secret::new("glpat-state-token"),
        }
    }

    #[test]
    fn a_root_gets_gitlab_managed_state_by_its_own_entry_or_the_service_default() {
        let cfg = RepoConfig::parse(
            r#"
[[roots]]
name = "core"
dir = "core"
state = { gitlab = "homelab prod" }
[[roots]]
name = "dns"
dir = "dns"
[[roots]]
name = "lab"
dir = "lab"
state = "own"
"#,
        )
        .unwrap();
        let names = |d| {
            cfg.roots
                .iter()
                .map(|r| gitlab_state_name(r, d))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(StateDefault::Own),
            [Some("homelab prod".to_string()), None, None]
        );
        assert_eq!(
            names(StateDefault::Gitlab),
            [
                Some("homelab prod".to_string()),
                Some("dns".to_string()),
                None
            ]
        );
        let address = state_address("https://gitlab.example.com:8443/", 42, "homelab prod");
        assert_eq!(
            address,
            "https://gitlab.example.com:8443/api/v4/projects/42/terraform/state/homelab%20prod"
        );
        let env = http_backend_env(&address, &cred());
        assert_eq!(env["TF_HTTP_LOCK_ADDRESS"], format!("{address}/lock"));
        assert_eq!(env["TF_HTTP_UNLOCK_METHOD"], "DELETE");
        assert_eq!(env["TF_HTTP_PASSWORD"], "glpat-state-token");
    }

    #[test]
    fn the_gate_forwards_only_the_own_projects_states_and_says_why_not() {
        let read = GateGrant {
            project: 7,
            project_path: Some("infra/homelab".into()),
            state: "homelab".into(),
            access: GateAccess::Read,
        };
        let write = GateGrant {
            access: GateAccess::ReadWrite,
            ..read.clone()
        };
        let p = "/api/v4/projects/7/terraform/state/homelab";
        let call = gate_request(&read, "GET", p, None).unwrap();
        assert_eq!(call.op, GateOp::Read);
        assert_eq!(
            call.upstream("https://gitlab.example.com/", 7),
            "https://gitlab.example.com/api/v4/projects/7/terraform/state/homelab"
        );
        // A sibling state of the same project: read, yes.
        let sibling = gate_request(
            &read,
            "GET",
            "/api/v4/projects/7/terraform/state/dns%20zone",
            None,
        )
        .unwrap();
        assert_eq!(
            sibling.upstream("https://gitlab.example.com", 7),
            "https://gitlab.example.com/api/v4/projects/7/terraform/state/dns%20zone"
        );
        let why =
            |g: &GateGrant, m: &str, path: &str| gate_request(g, m, path, None).unwrap_err().0;
        assert_eq!(
            why(&read, "GET", "/api/v4/projects/42/terraform/state/prod"),
            "planbot refused this plan's read of project 42's state `prod`: a plan of project 7 may read only project 7's states"
        );
        // Its own project by path, in any case, as GitLab finds it: read, yes.
        for own in ["infra%2Fhomelab", "Infra%2FHomeLab"] {
            let by_path = format!("/api/v4/projects/{own}/terraform/state/network");
            let call = gate_request(&read, "GET", &by_path, None).unwrap();
            assert_eq!(
                call.upstream("https://gitlab.example.com", 7),
                "https://gitlab.example.com/api/v4/projects/7/terraform/state/network"
            );
        }
        // Another path, encoded, or with dot segments: still another project, or not the API.
        assert!(why(
            &read,
            "GET",
            "/api/v4/projects/infra%2Fprod/terraform/state/prod"
        )
        .contains("project infra/prod's state"));
        assert!(why(
            &read,
            "GET",
            "/api/v4/projects/7/terraform/state/../../42/terraform/state/prod"
        )
        .contains("serves only"));
        assert!(why(&read, "GET", "/api/v4/projects/7/terraform/state/a/b").contains("serves only"));
        assert!(why(&read, "GET", "/api/v4/user").contains("serves only"));
        assert_eq!(
            why(&read, "POST", &format!("{p}/lock")),
            "planbot refused this plan's lock of state `homelab`: merge request plans only read the state"
        );
        assert!(why(&read, "POST", p).contains("write of state `homelab`"));
        assert!(why(&write, "DELETE", p).contains("never deletes a state"));
        assert!(why(&write, "PUT", p).contains("forwards only"));
        assert!(why(
            &write,
            "POST",
            "/api/v4/projects/7/terraform/state/other/lock"
        )
        .contains("may lock and write only its own state `homelab`"));
        assert!(why(
            &write,
            "POST",
            "/api/v4/projects/8/terraform/state/homelab/lock"
        )
        .contains("a run of project 7 may use only project 7's states"));
        // The default branch's own state: lock, write with the lock's ID, unlock.
        let lock = gate_request(&write, "POST", &format!("{p}/lock"), None).unwrap();
        assert_eq!(lock.op, GateOp::Lock);
        let w = gate_request(&write, "POST", p, Some("ID=6c1f%200e&x=y")).unwrap();
        assert_eq!(
            w.upstream("https://gitlab.example.com", 7),
            "https://gitlab.example.com/api/v4/projects/7/terraform/state/homelab?ID=6c1f+0e"
        );
        assert_eq!(
            gate_request(&write, "DELETE", &format!("{p}/lock"), None)
                .unwrap()
                .op,
            GateOp::Unlock
        );
    }

    #[test]
    fn the_gates_texts() {
        let read = GateGrant {
            project: 7,
            project_path: Some("infra/homelab".into()),
            state: "homelab".into(),
            access: GateAccess::Read,
        };
        let write = GateGrant {
            access: GateAccess::ReadWrite,
            ..read.clone()
        };
        let p = "/api/v4/projects/7/terraform/state/homelab";
        let mut texts: Vec<String> = [
            (&read, "GET", "/api/v4/projects/42/terraform/state/prod"),
            (
                &write,
                "POST",
                "/api/v4/projects/42/terraform/state/prod/lock",
            ),
            (&read, "POST", p),
            (&write, "POST", "/api/v4/projects/7/terraform/state/dns"),
            (&write, "DELETE", p),
            (&write, "PATCH", p),
            (&read, "GET", "/metrics"),
        ]
        .into_iter()
        .map(|(g, m, path)| gate_request(g, m, path, None).unwrap_err().0)
        .collect();
        for (kind, ctx) in [
            ("gate_direct", minijinja::context! { own => 7 }),
            (
                "shared_plan_token",
                minijinja::context! { count => 2, projects => "infra/homelab, infra/lab" },
            ),
        ] {
            texts.push(crate::core::templates::text("state.txt.j2", kind, ctx));
        }
        insta::assert_snapshot!(texts.join("\n"));
    }

    #[test]
    fn module_credentials_are_for_the_gitlab_url_only() {
        let env = module_env("https://gitlab.example-lab.com", &cred());
        assert_eq!(
            env["GIT_CONFIG_KEY_0"],
            "http.https://gitlab.example-lab.com/.extraHeader"
        );
        let basic = base64::engine::general_purpose::STANDARD.encode("planbot:glpat-state-token");
        assert_eq!(
            env["GIT_CONFIG_VALUE_0"],
            format!("Authorization: Basic {basic}")
        );
        assert_eq!(env["TF_TOKEN_gitlab_example__lab_com"], "glpat-state-token");
        assert_eq!(
            registry_token_variable("https://gitlab.example.com:8443"),
            None
        );
    }

    #[test]
    fn the_backend_is_read_from_the_files_and_after_init() {
        let f = |name: &str, text: &str| (name.to_string(), text.to_string());
        assert_eq!(
            Backend::declared(&[f("main.tf", "resource \"x\" \"y\" {}")]),
            Some(Backend::Local { declared: false })
        );
        assert_eq!(
            Backend::declared(&[f(
                "backend.tf",
                "terraform {\n  required_version = \">= 1.6\"\n  backend \"s3\" {\n    bucket = \"b\"\n  }\n}"
            )]),
            Some(Backend::Remote("s3".into()))
        );
        assert_eq!(
            Backend::declared(&[f("backend.tf", "terraform {\n  backend \"local\" {}\n}")]),
            Some(Backend::Local { declared: true })
        );
        assert_eq!(
            Backend::declared(&[
                f("backend.tf", "terraform {\n  backend \"local\" {}\n}"),
                f(OVERRIDE_FILE, OVERRIDE_TEXT)
            ]),
            Some(Backend::Remote("http".into()))
        );
        assert_eq!(
            Backend::declared(&[f(
                "main.tf.json",
                r#"{"terraform": {"backend": {"pg": {}}}}"#
            )]),
            Some(Backend::Remote("pg".into()))
        );
        assert_eq!(Backend::declared(&[f("main.tf", "terraform {")]), None);
        assert_eq!(
            Backend::after_init(None),
            Backend::Local { declared: false }
        );
        assert_eq!(
            Backend::after_init(Some(
                br#"{"version":3,"backend":{"type":"http","config":{}}}"#
            )),
            Backend::Remote("http".into())
        );
    }

    #[test]
    fn a_held_lock_is_read_from_the_engines_error() {
        // The http backend: the held lock's ID in the message; the Lock Info is its own attempt.
        let http = "Error: Error acquiring the state lock\n\nError message: HTTP remote state already locked: ID=6c1f0e2a-held\nLock Info:\n  ID:        d3912e86-own\n  Who:       root@vm\n";
        assert_eq!(
            HeldLock::from_engine_output(http),
            Some(HeldLock {
                id: "6c1f0e2a-held".into(),
                who: String::new(),
                created: String::new(),
            })
        );
        // Other backends print the held lock's info (here boxed, as with -no-color).
        let s3 = "╷\n│ Error: Error acquiring the state lock\n│ \n│ Error message: ConditionalCheckFailedException\n│ Lock Info:\n│   ID:        9f1c2a\n│   Path:      \n│   Operation: OperationTypePlan\n│   Who:       alice@laptop\n│   Version:   1.11.4\n│   Created:   2025-06-01 09:30:00 +0000 UTC\n│   Info:      \n│ \n╵\n";
        assert_eq!(
            HeldLock::from_engine_output(s3),
            Some(HeldLock {
                id: "9f1c2a".into(),
                who: "alice@laptop".into(),
                created: "2025-06-01 09:30:00 +0000 UTC".into()
            })
        );
        assert_eq!(HeldLock::from_engine_output("Error: something else"), None);
    }
}
