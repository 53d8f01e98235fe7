//! Proxmox VE API client (read-only calls for the preflight and `planbot doctor`).
//!
//! `PVEAPIToken` auth, TLS verified by default (opt-in `insecure`, or a custom CA file),
//! timeouts, the `{"data": ...}` envelope, and errors with or without a `"message"` body. The
//! token secret never appears in errors, logs or `Debug` output.

use reqwest::header::{HeaderValue, AUTHORIZATION};
use serde::de::{DeserializeOwned, Deserializer};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// An API token `user@realm!name=secret`. `Debug`/`Display` show only the token id.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken(String);

impl ApiToken {
    pub fn new(value: impl Into<String>) -> ApiToken {
        ApiToken(value.into().trim().to_string())
    }

    /// `user@realm!name` — safe to print (it is what `pveum acl modify --tokens` wants).
    pub fn id(&self) -> &str {
        self.0.split_once('=').map_or("", |(id, _)| id)
    }

    /// The whole value, for the `Authorization` header and for scrubbing output.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The secret part (after `=`), for scrubbing output.
    pub fn secret(&self) -> &str {
        self.0.split_once('=').map_or(self.0.as_str(), |(_, s)| s)
    }

    /// Whether it looks like `user@realm!name=secret`.
    pub fn is_well_formed(&self) -> bool {
        let id = self.id();
        !self.secret().is_empty() && id.contains('@') && id.contains('!')
    }
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiToken({}=<redacted>)", self.id())
    }
}

/// Where the Proxmox API is and how to talk to it.
#[derive(Debug, Clone)]
pub struct ProxmoxEndpoint {
    /// e.g. `https://pve01.example.com:8006/` (`/api2/json` is appended when missing).
    pub url: String,
    pub api_token: ApiToken,
    /// Skip TLS verification (self-signed homelab certificates). Off by default.
    pub insecure: bool,
    /// A PEM CA bundle to trust in addition to the system roots.
    pub ca_file: Option<PathBuf>,
    pub timeout: Duration,
}

/// The default per-request timeout (401 answers alone take about 3 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

impl ProxmoxEndpoint {
    pub fn new(url: impl Into<String>, api_token: impl Into<String>) -> ProxmoxEndpoint {
        ProxmoxEndpoint {
            url: url.into(),
            api_token: ApiToken::new(api_token),
            insecure: false,
            ca_file: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The provider's own environment: `PROXMOX_VE_ENDPOINT` + `PROXMOX_VE_API_TOKEN`, else
    /// `PM_VE_ENDPOINT` + `PM_VE_API_TOKEN`; `PROXMOX_VE_INSECURE=true` opts out of TLS checks.
    /// `None` when no endpoint and token are set.
    pub fn from_env() -> Option<ProxmoxEndpoint> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// [`from_env`](Self::from_env) over any variable source (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Option<ProxmoxEndpoint> {
        let pick = |a: &str, b: &str| {
            get(a)
                .filter(|v| !v.is_empty())
                .or_else(|| get(b).filter(|v| !v.is_empty()))
        };
        let url = pick("PROXMOX_VE_ENDPOINT", "PM_VE_ENDPOINT")?;
        let token = pick("PROXMOX_VE_API_TOKEN", "PM_VE_API_TOKEN")?;
        let insecure = pick("PROXMOX_VE_INSECURE", "PM_VE_INSECURE")
            .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes"));
        let mut ep = ProxmoxEndpoint::new(url, token);
        ep.insecure = insecure;
        Some(ep)
    }
}

/// Why a call failed. Callers branch on `Unauthorized` / `Status`.
#[derive(Debug, thiserror::Error)]
pub enum ProxmoxError {
    #[error("cannot reach the Proxmox API at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("the Proxmox API refused the token {token_id} ({status})")]
    Unauthorized { token_id: String, status: String },
    #[error("the Proxmox API answered {status}{}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Status {
        code: u16,
        status: String,
        message: Option<String>,
    },
    #[error("unexpected answer from the Proxmox API for {path}: {reason}")]
    Decode { path: String, reason: String },
    #[error("invalid Proxmox client settings: {0}")]
    Config(String),
}

/// `GET /version`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Version {
    pub version: String,
    #[serde(default)]
    pub release: Option<String>,
    #[serde(default)]
    pub repoid: Option<String>,
}

impl Version {
    /// `(major, minor)` of `version` (`8.4.1` → `(8, 4)`).
    pub fn major_minor(&self) -> Option<(u64, u64)> {
        let mut p = self.version.split(['.', '-']);
        Some((p.next()?.parse().ok()?, p.next()?.parse().ok()?))
    }
}

/// One entry of `GET /nodes`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Node {
    pub node: String,
    #[serde(default)]
    pub status: Option<String>,
}

impl Node {
    pub fn is_online(&self) -> bool {
        self.status.as_deref() == Some("online")
    }
}

/// One entry of `GET /storage` (the cluster storage configuration).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct StorageConfig {
    pub storage: String,
    #[serde(rename = "type")]
    pub storage_type: String,
    #[serde(default, deserialize_with = "comma_list")]
    pub content: Vec<String>,
    /// Restricted to these nodes; empty = all nodes.
    #[serde(default, deserialize_with = "comma_list")]
    pub nodes: Vec<String>,
    #[serde(default, deserialize_with = "flag")]
    pub disable: bool,
    #[serde(default, deserialize_with = "flag")]
    pub shared: bool,
}

impl StorageConfig {
    /// Storage types that keep files in a directory (iso, templates, snippets, import).
    pub fn is_file_based(&self) -> bool {
        matches!(
            self.storage_type.as_str(),
            "dir" | "nfs" | "cifs" | "cephfs" | "glusterfs" | "btrfs"
        )
    }
}

/// One entry of `GET /nodes/{node}/storage`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct NodeStorage {
    pub storage: String,
    #[serde(rename = "type", default)]
    pub storage_type: String,
    #[serde(default, deserialize_with = "comma_list")]
    pub content: Vec<String>,
    #[serde(default, deserialize_with = "flag")]
    pub enabled: bool,
    #[serde(default, deserialize_with = "flag")]
    pub active: bool,
    #[serde(default, deserialize_with = "flag")]
    pub shared: bool,
}

/// One guest of `GET /cluster/resources?type=vm`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Guest {
    pub vmid: u64,
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(rename = "type", default)]
    pub guest_type: String,
    #[serde(default, deserialize_with = "flag")]
    pub template: bool,
}

/// `memory` of `GET /nodes/{node}/status` (bytes).
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
pub struct NodeMemory {
    #[serde(default)]
    pub total: u64,
    #[serde(default)]
    pub used: u64,
    #[serde(default)]
    pub free: u64,
    /// PVE 9: what a new guest can have (free plus reclaimable cache); absent before.
    #[serde(default)]
    pub available: Option<u64>,
}

/// `cpuinfo` of `GET /nodes/{node}/status`.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
pub struct CpuInfo {
    #[serde(default)]
    pub cpus: u64,
}

/// `GET /nodes/{node}/status`, the parts planbot reads.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
pub struct NodeStatus {
    #[serde(default)]
    pub memory: NodeMemory,
    #[serde(default)]
    pub cpuinfo: CpuInfo,
}

/// `GET /nodes/{node}/storage/{storage}/status` (bytes).
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
pub struct StorageStatus {
    #[serde(rename = "type", default)]
    pub storage_type: String,
    #[serde(default, deserialize_with = "flag")]
    pub shared: bool,
    #[serde(default)]
    pub total: u64,
    #[serde(default)]
    pub used: u64,
    #[serde(default)]
    pub avail: u64,
}

/// Effective privileges: path → privilege → propagate flag (presence = granted).
pub type Permissions = BTreeMap<String, BTreeMap<String, u8>>;

fn comma_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => s
            .split([',', ' ', ';'])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        Value::Array(a) => a
            .into_iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    })
}

/// Perl's booleans: `1`/`0`, `"1"`/`"0"`, or true/false.
fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Bool(b) => b,
        Value::Number(n) => n.as_i64().unwrap_or(0) != 0,
        Value::String(s) => !matches!(s.as_str(), "" | "0" | "false"),
        _ => false,
    })
}

/// The Proxmox API client.
pub struct Proxmox {
    http: reqwest::Client,
    base: url::Url,
    token: ApiToken,
}

impl fmt::Debug for Proxmox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxmox")
            .field("base", &self.base.as_str())
            .field("token", &self.token)
            .finish()
    }
}

impl Proxmox {
    pub fn new(ep: ProxmoxEndpoint) -> Result<Proxmox, ProxmoxError> {
        let mut url = ep.url.trim().to_string();
        if !url.ends_with('/') {
            url.push('/');
        }
        if !url.trim_end_matches('/').ends_with("/api2/json") {
            url.push_str("api2/json/");
        }
        let base = url::Url::parse(&url)
            .map_err(|e| ProxmoxError::Config(format!("endpoint {:?}: {e}", ep.url)))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(ProxmoxError::Config(format!(
                "endpoint {:?} must start with https://",
                ep.url
            )));
        }
        if !ep.api_token.is_well_formed() {
            return Err(ProxmoxError::Config(format!(
                "the API token must look like user@realm!name=secret (got id {:?})",
                ep.api_token.id()
            )));
        }
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(ep.timeout)
            .connect_timeout(ep.timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("planbot/", env!("CARGO_PKG_VERSION")));
        if ep.insecure {
            builder = builder.danger_accept_invalid_certs(true);
        }
        if let Some(ca) = &ep.ca_file {
            let pem = std::fs::read(ca).map_err(|e| {
                ProxmoxError::Config(format!("cannot read CA file {}: {e}", ca.display()))
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                ProxmoxError::Config(format!("CA file {} is not PEM: {e}", ca.display()))
            })?;
            if certs.is_empty() {
                return Err(ProxmoxError::Config(format!(
                    "CA file {} holds no certificate",
                    ca.display()
                )));
            }
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let http = builder
            .build()
            .map_err(|e| ProxmoxError::Config(format!("TLS setup: {e}")))?;
        Ok(Proxmox {
            http,
            base,
            token: ep.api_token,
        })
    }

    /// `user@realm!name` of the token in use.
    pub fn token_id(&self) -> &str {
        self.token.id()
    }

    pub fn base_url(&self) -> &url::Url {
        &self.base
    }

    async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<T, ProxmoxError> {
        let url = self
            .base
            .join(path.trim_start_matches('/'))
            .map_err(|e| ProxmoxError::Config(format!("path {path}: {e}")))?;
        let mut auth = HeaderValue::from_str(&format!("PVEAPIToken={}", self.token.expose()))
            .map_err(|_| {
                ProxmoxError::Config("the API token has characters a header cannot carry".into())
            })?;
        auth.set_sensitive(true);
        let resp = self
            .http
            .get(url.clone())
            .query(query)
            .header(AUTHORIZATION, auth)
            .send()
            .await
            .map_err(|e| ProxmoxError::Unreachable {
                url: self.base.to_string(),
                reason: describe_reqwest(&e),
            })?;
        let status = resp.status();
        // Proxmox puts its error text in the reason phrase (`400 Parameter verification
        // failed.`); older releases put it nowhere else.
        let reason = resp
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .and_then(|r| std::str::from_utf8(r.as_bytes()).ok())
            .map(str::to_string)
            .or_else(|| status.canonical_reason().map(str::to_string))
            .unwrap_or_default();
        let status_line = format!("{} {}", status.as_u16(), reason.trim())
            .trim()
            .to_string();
        let body = resp.bytes().await.map_err(|e| ProxmoxError::Unreachable {
            url: self.base.to_string(),
            reason: describe_reqwest(&e),
        })?;
        if status.as_u16() == 401 {
            return Err(ProxmoxError::Unauthorized {
                token_id: self.token.id().to_string(),
                status: status_line,
            });
        }
        if !status.is_success() {
            let message = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| {
                    let m = v.get("message")?.as_str()?.trim().to_string();
                    let errors = v.get("errors").and_then(Value::as_object).map(|e| {
                        e.iter()
                            .map(|(k, v)| format!("{k}: {}", v.as_str().unwrap_or_default().trim()))
                            .collect::<Vec<_>>()
                            .join("; ")
                    });
                    Some(match errors {
                        Some(e) if !e.is_empty() => format!("{m} ({e})"),
                        _ => m,
                    })
                })
                .filter(|m| !m.is_empty());
            return Err(ProxmoxError::Status {
                code: status.as_u16(),
                status: status_line,
                message,
            });
        }
        #[derive(Deserialize)]
        struct Envelope<T> {
            data: T,
        }
        serde_json::from_slice::<Envelope<T>>(&body)
            .map(|e| e.data)
            .map_err(|e| ProxmoxError::Decode {
                path: path.to_string(),
                reason: e.to_string(),
            })
    }

    /// `GET /version`: reachable, and which release.
    pub async fn version(&self) -> Result<Version, ProxmoxError> {
        self.get("version", &[]).await
    }

    /// `GET /nodes`.
    pub async fn nodes(&self) -> Result<Vec<Node>, ProxmoxError> {
        self.get("nodes", &[]).await
    }

    /// `GET /storage`: every storage of the cluster with its content types and nodes.
    pub async fn storage(&self) -> Result<Vec<StorageConfig>, ProxmoxError> {
        self.get("storage", &[]).await
    }

    /// `GET /nodes/{node}/storage`: the storages usable on that node.
    pub async fn node_storage(&self, node: &str) -> Result<Vec<NodeStorage>, ProxmoxError> {
        self.get(&format!("nodes/{}/storage", encode_segment(node)), &[])
            .await
    }

    /// `GET /nodes/{node}/status`: memory (`total`, `free`, and since PVE 9 `available`) and
    /// CPUs (`cpuinfo.cpus`). Needs `Sys.Audit` on `/nodes/{node}`.
    pub async fn node_status(&self, node: &str) -> Result<NodeStatus, ProxmoxError> {
        self.get(&format!("nodes/{}/status", encode_segment(node)), &[])
            .await
    }

    /// `GET /nodes/{node}/storage/{storage}/status`: `total`, `used`, `avail` bytes, `type`,
    /// `shared`. Needs `Datastore.Audit` or `Datastore.AllocateSpace` on `/storage/{storage}`.
    pub async fn storage_status(
        &self,
        node: &str,
        storage: &str,
    ) -> Result<StorageStatus, ProxmoxError> {
        self.get(
            &format!(
                "nodes/{}/storage/{}/status",
                encode_segment(node),
                encode_segment(storage)
            ),
            &[],
        )
        .await
    }

    /// Whether `iface` is a network interface of `node` (`GET /nodes/{node}/network/{iface}`,
    /// which PVE answers for bridges even where its list omits them, as 9.2.5's does). `false`
    /// when PVE says it does not exist (400 `interface does not exist`).
    pub async fn has_interface(&self, node: &str, iface: &str) -> Result<bool, ProxmoxError> {
        let path = format!(
            "nodes/{}/network/{}",
            encode_segment(node),
            encode_segment(iface)
        );
        match self.get::<Value>(&path, &[]).await {
            Ok(_) => Ok(true),
            Err(ProxmoxError::Status { code: 400, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The bridges of `node` as `GET /nodes/{node}/network?type=any_bridge` lists them (for a
    /// fix's "it has …"; PVE 9.2.5 omits bridges from this list, so it never decides alone).
    pub async fn bridges(&self, node: &str) -> Result<Vec<String>, ProxmoxError> {
        let list: Vec<Value> = self
            .get(
                &format!("nodes/{}/network", encode_segment(node)),
                &[("type", "any_bridge")],
            )
            .await?;
        Ok(list
            .iter()
            .filter_map(|i| i.get("iface")?.as_str().map(str::to_string))
            .collect())
    }

    /// Whether `vnet` is an SDN VNet (`GET /cluster/sdn/vnets/{vnet}`; PVE answers 500
    /// `sdn vnet '…' does not exist` otherwise).
    pub async fn has_vnet(&self, vnet: &str) -> Result<bool, ProxmoxError> {
        match self
            .get::<Value>(&format!("cluster/sdn/vnets/{}", encode_segment(vnet)), &[])
            .await
        {
            Ok(_) => Ok(true),
            Err(ProxmoxError::Status {
                code: 500,
                message,
                status,
            }) if message
                .as_deref()
                .unwrap_or(&status)
                .contains("does not exist") =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// `GET /cluster/sdn/vnets?pending=1`: the VNets the token may audit, with `state`
    /// (`new`, `changed`, `deleted`) and the `pending` values while the SDN configuration is not
    /// applied.
    pub async fn vnets_pending(&self) -> Result<Vec<Value>, ProxmoxError> {
        self.get("cluster/sdn/vnets", &[("pending", "1")]).await
    }

    /// `GET /cluster/ha/resources` (needs `Sys.Audit` on `/`): the HA-managed services
    /// (`sid` = `vm:105`), with their `group` before PVE 9.
    pub async fn ha_resources(&self) -> Result<Vec<Value>, ProxmoxError> {
        self.get("cluster/ha/resources", &[]).await
    }

    /// `GET /cluster/ha/rules` (PVE 9; `Sys.Audit` on `/`): node-affinity and resource-affinity
    /// rules, which replaced HA groups.
    pub async fn ha_rules(&self) -> Result<Vec<Value>, ProxmoxError> {
        self.get("cluster/ha/rules", &[]).await
    }

    /// `GET /cluster/ha/groups` (before PVE 9; `Sys.Audit` on `/`).
    pub async fn ha_groups(&self) -> Result<Vec<Value>, ProxmoxError> {
        self.get("cluster/ha/groups", &[]).await
    }

    /// `GET /cluster/resources?type=vm`: every guest the token may see (`VM.Audit`), with its
    /// `vmid`, `node`, `name`, `type` (`qemu`, `lxc`) and `template`.
    pub async fn guests(&self) -> Result<Vec<Guest>, ProxmoxError> {
        self.get("cluster/resources", &[("type", "vm")]).await
    }

    /// `GET /nodes/{node}/{qemu|lxc}/{vmid}/pending`: every configuration key with its running
    /// `value` and, when a change waits for a reboot, its `pending` value (or `delete`).
    pub async fn pending(
        &self,
        node: &str,
        kind: &str,
        vmid: u64,
    ) -> Result<Vec<Value>, ProxmoxError> {
        self.get(
            &format!("nodes/{}/{}/{vmid}/pending", encode_segment(node), kind),
            &[],
        )
        .await
    }

    /// `GET /access/permissions?path=`: the token's effective privileges on `path`.
    pub async fn permissions(&self, path: &str) -> Result<Permissions, ProxmoxError> {
        self.permissions_query(&[("path", path)]).await
    }

    /// `GET /access/permissions` without a path: the token's effective privileges on PVE's
    /// top-level paths and on every path an ACL is set on.
    pub async fn permissions_all(&self) -> Result<Permissions, ProxmoxError> {
        self.permissions_query(&[]).await
    }

    /// `GET /access/permissions?path=&userid=`: the effective privileges of `userid` (a user or
    /// token id) on `path`. Asking about another user needs `Sys.Audit` on `/access` (403).
    pub async fn permissions_of(
        &self,
        userid: &str,
        path: &str,
    ) -> Result<std::collections::BTreeSet<String>, ProxmoxError> {
        let perms = self
            .permissions_query(&[("path", path), ("userid", userid)])
            .await?;
        Ok(perms
            .get(path)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default())
    }

    /// `GET /access/acl`: the path of every ACL entry (all of them with `Sys.Audit` on
    /// `/access`; otherwise PVE lists only those the caller may modify).
    pub async fn acl_paths(&self) -> Result<Vec<String>, ProxmoxError> {
        let entries: Vec<Value> = self.get("access/acl", &[]).await?;
        Ok(entries
            .iter()
            .filter_map(|e| e.get("path")?.as_str().map(str::to_string))
            .collect())
    }

    async fn permissions_query(&self, query: &[(&str, &str)]) -> Result<Permissions, ProxmoxError> {
        let v: Value = self.get("access/permissions", query).await?;
        // An empty answer is `[]` on some releases, `{}` on others.
        if v.as_array().is_some_and(Vec::is_empty) || v.is_null() {
            return Ok(Permissions::new());
        }
        let raw: BTreeMap<String, BTreeMap<String, Value>> =
            serde_json::from_value(v).map_err(|e| ProxmoxError::Decode {
                path: "access/permissions".into(),
                reason: e.to_string(),
            })?;
        Ok(raw
            .into_iter()
            .map(|(p, privs)| {
                let privs = privs
                    .into_iter()
                    .map(|(k, v)| (k, u8::from(v.as_i64().unwrap_or(1) != 0)))
                    .collect();
                (p, privs)
            })
            .collect())
    }

    /// The privileges the token has on exactly `path` (the map's entry for it).
    pub async fn privileges_on(
        &self,
        path: &str,
    ) -> Result<std::collections::BTreeSet<String>, ProxmoxError> {
        let perms = self.permissions(path).await?;
        Ok(perms
            .get(path)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default())
    }

    /// `GET /cluster/nextid?vmid=`: `true` when the id is free (Proxmox answers 400 when taken).
    pub async fn next_id(&self, vmid: u64) -> Result<bool, ProxmoxError> {
        let id = vmid.to_string();
        match self.get::<Value>("cluster/nextid", &[("vmid", &id)]).await {
            Ok(_) => Ok(true),
            Err(ProxmoxError::Status { code: 400, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `GET /cluster/nextid`: the next free id (for a fix suggestion).
    pub async fn free_id(&self) -> Result<u64, ProxmoxError> {
        let v: Value = self.get("cluster/nextid", &[]).await?;
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| ProxmoxError::Decode {
                path: "cluster/nextid".into(),
                reason: format!("not a number: {v}"),
            })
    }
}

fn encode_segment(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A reqwest error in words, without the URL's query (no secrets are in URLs, but keep it short).
fn describe_reqwest(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "connection failed".to_string()
    } else {
        "request failed".to_string()
    };
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(s) = src {
        text.push_str(": ");
        text.push_str(&s.to_string());
        src = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_id_is_printable_and_the_secret_is_not() {
        let t = ApiToken::new("tofu@pve!plan=0b2a6c2e-0000-4e2f-9c11-5e1d4a3b2c1d");
        assert_eq!(t.id(), "tofu@pve!plan");
        assert!(t.is_well_formed());
        let dbg = format!("{t:?}");
        assert!(!dbg.contains("0b2a6c2e"), "{dbg}");
        let ep = ProxmoxEndpoint::new("https://pve:8006", t.expose());
        assert!(!format!("{ep:?}").contains("0b2a6c2e"));
        let client = Proxmox::new(ep).unwrap();
        assert!(!format!("{client:?}").contains("0b2a6c2e"));
        assert_eq!(client.base_url().as_str(), "https://pve:8006/api2/json/");
    }

    #[test]
    fn env_prefers_proxmox_ve_and_falls_back_to_pm_ve() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let ep = ProxmoxEndpoint::from_lookup(vars(&[
            ("PROXMOX_VE_ENDPOINT", "https://a:8006/"),
            ("PROXMOX_VE_API_TOKEN", "u@pam!t=s"),
            ("PM_VE_ENDPOINT", "https://b:8006/"),
        ]))
        .unwrap();
        assert_eq!(ep.url, "https://a:8006/");
        assert!(!ep.insecure);
        let ep = ProxmoxEndpoint::from_lookup(vars(&[
            ("PM_VE_ENDPOINT", "https://b:8006/"),
            ("PM_VE_API_TOKEN", "u@pam!t=s"),
        ]))
        .unwrap();
        assert_eq!(ep.url, "https://b:8006/");
        assert!(ProxmoxEndpoint::from_lookup(vars(&[("PM_VE_ENDPOINT", "x")])).is_none());
    }

    #[test]
    fn rejects_a_token_without_an_id() {
        let err =
            Proxmox::new(ProxmoxEndpoint::new("https://pve:8006", "just-a-secret")).unwrap_err();
        assert!(!err.to_string().contains("just-a-secret"), "{err}");
    }
}
