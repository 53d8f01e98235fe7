//! The plan as the lint rules see it: bpg resource kinds, known/unknown attribute access,
//! Proxmox volume ids, and references followed through the plan's `configuration`.

use crate::core::plan::{ActionKind, Plan, ResourceChange};
use serde_json::Value;

/// The bpg/proxmox resources the rules know, whatever the name family
/// (`proxmox_virtual_environment_vm` or `proxmox_vm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    DownloadFile,
    File,
    Vm,
    ClonedVm,
    Container,
}

impl Kind {
    /// The kind of a resource type of the bpg provider; `None` for anything else.
    pub fn of_type(resource_type: &str) -> Option<Kind> {
        let rest = resource_type
            .strip_prefix("proxmox_virtual_environment_")
            .or_else(|| resource_type.strip_prefix("proxmox_"))?;
        Some(match rest {
            "download_file" => Kind::DownloadFile,
            "file" => Kind::File,
            "vm" | "vm2" => Kind::Vm,
            "cloned_vm" => Kind::ClonedVm,
            "container" => Kind::Container,
            _ => return None,
        })
    }

    /// The kind of a managed resource change from the bpg provider.
    pub fn of(rc: &ResourceChange) -> Option<Kind> {
        if !rc.is_managed() {
            return None;
        }
        // Other Proxmox providers (Telmate) share the `proxmox_` prefix: trust the provider
        // name when the plan gives one.
        if let Some(p) = rc.provider_name.as_deref() {
            if !p.is_empty() && !p.ends_with("bpg/proxmox") {
                return None;
            }
        }
        Kind::of_type(&rc.resource_type)
    }

    pub fn is_vm(self) -> bool {
        matches!(self, Kind::Vm | Kind::ClonedVm)
    }

    pub fn is_file(self) -> bool {
        matches!(self, Kind::DownloadFile | Kind::File)
    }
}

/// An attribute read from `change.after`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Attr<'a> {
    /// Known only after apply: a rule that needs it stays silent.
    Unknown,
    /// Not set (absent or null).
    Absent,
    Known(&'a Value),
}

impl<'a> Attr<'a> {
    /// A known, non-empty string (the provider writes unset strings as `""`).
    pub fn str(self) -> Option<&'a str> {
        match self {
            Attr::Known(Value::String(s)) if !s.is_empty() => Some(s),
            _ => None,
        }
    }

    pub fn bool(self) -> Option<bool> {
        match self {
            Attr::Known(Value::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    pub fn is_unknown(self) -> bool {
        self == Attr::Unknown
    }

    /// Set to something (known non-empty, or unknown = computed from another value).
    pub fn is_set(self) -> bool {
        match self {
            Attr::Unknown => true,
            Attr::Absent => false,
            Attr::Known(Value::String(s)) => !s.is_empty(),
            Attr::Known(Value::Array(a)) => !a.is_empty(),
            Attr::Known(_) => true,
        }
    }

    /// Known to be unset (absent, null or the empty string).
    pub fn is_unset(self) -> bool {
        match self {
            Attr::Absent => true,
            Attr::Known(Value::String(s)) => s.is_empty(),
            _ => false,
        }
    }
}

fn step<'v>(v: &'v Value, seg: &str) -> Option<&'v Value> {
    match v {
        Value::Object(m) => m.get(seg),
        Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    }
}

/// Whether `path` (dot-separated, numbers index lists) is unknown in an `after_unknown` mask.
pub fn unknown_at(mask: &Value, path: &str) -> bool {
    let mut cur = mask;
    if cur == &Value::Bool(true) {
        return true;
    }
    for seg in path.split('.') {
        match step(cur, seg) {
            Some(Value::Bool(true)) => return true,
            Some(next) => cur = next,
            None => return false,
        }
    }
    false
}

/// `change.after` at `path`, honouring `after_unknown`.
pub fn after<'a>(rc: &'a ResourceChange, path: &str) -> Attr<'a> {
    if unknown_at(&rc.change.after_unknown, path) {
        return Attr::Unknown;
    }
    let mut cur = &rc.change.after;
    for seg in path.split('.') {
        match step(cur, seg) {
            Some(next) => cur = next,
            None => return Attr::Absent,
        }
    }
    if cur.is_null() {
        Attr::Absent
    } else {
        Attr::Known(cur)
    }
}

/// `change.before` at `path` (state values are always known).
pub fn before<'a>(rc: &'a ResourceChange, path: &str) -> Option<&'a Value> {
    let mut cur = &rc.change.before;
    for seg in path.split('.') {
        cur = step(cur, seg)?;
    }
    (!cur.is_null()).then_some(cur)
}

/// The number of elements of a list (block) attribute in `after`, known or not.
pub fn block_len(rc: &ResourceChange, path: &str) -> usize {
    let known = match after(rc, path) {
        Attr::Known(Value::Array(a)) => a.len(),
        _ => 0,
    };
    let mut mask = &rc.change.after_unknown;
    for seg in path.split('.') {
        match step(mask, seg) {
            Some(m) => mask = m,
            None => return known,
        }
    }
    known.max(mask.as_array().map_or(0, Vec::len))
}

/// The change will create the resource, update it, or replace it (there is an `after`).
pub fn is_planned(rc: &ResourceChange) -> bool {
    matches!(
        rc.kind(),
        ActionKind::Create
            | ActionKind::Update
            | ActionKind::DeleteThenCreate
            | ActionKind::CreateThenDelete
            | ActionKind::ForgetAndCreate
    )
}

/// The change creates a new object (a create or the create half of a replacement).
pub fn is_created(rc: &ResourceChange) -> bool {
    rc.change.actions.iter().any(|a| a == "create")
}

/// A Proxmox volume id `storage:content/name` (`local:iso/debian.img`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeId {
    pub storage: String,
    pub content: String,
    pub name: String,
}

impl VolumeId {
    pub fn parse(s: &str) -> Option<VolumeId> {
        let (storage, rest) = s.split_once(':')?;
        let (content, name) = rest.split_once('/')?;
        if storage.is_empty() || content.is_empty() || name.is_empty() {
            return None;
        }
        Some(VolumeId {
            storage: storage.to_string(),
            content: content.to_string(),
            name: name.to_string(),
        })
    }
}

/// The `resources[]` entry of the plan's `configuration` that declared this change, if the
/// plan carries its configuration.
pub fn config_of<'p>(plan: &'p Plan, rc: &ResourceChange) -> Option<&'p Value> {
    let cfg = plan.configuration.as_ref()?;
    let names = module_names(rc.module_address.as_deref());
    let mut module = &cfg.root_module;
    for n in &names {
        module = &module.module_calls.get(n)?.module;
    }
    let resources = &module.resources;
    resources.iter().find(|r| {
        r.get("mode").and_then(Value::as_str).unwrap_or("managed") == "managed"
            && r.get("type").and_then(Value::as_str) == Some(rc.resource_type.as_str())
            && r.get("name").and_then(Value::as_str) == Some(rc.name.as_str())
    })
}

/// `module.a["x"].module.b` → `["a", "b"]`.
fn module_names(module_address: Option<&str>) -> Vec<String> {
    let Some(addr) = module_address else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut rest = addr;
    while let Some(r) = rest.strip_prefix("module.") {
        let end = r.find(['.', '[']).unwrap_or(r.len());
        out.push(r[..end].to_string());
        rest = &r[end..];
        if rest.starts_with('[') {
            // skip the index, which may contain dots inside quotes
            match rest.find("].") {
                Some(i) => rest = &rest[i + 2..],
                None => break,
            }
        } else if let Some(r2) = rest.strip_prefix('.') {
            rest = r2;
        }
    }
    out
}

/// The expression object of a configured attribute, `path` as in [`after`]
/// (e.g. `disk.0.import_from`).
pub fn config_expr<'p>(plan: &'p Plan, rc: &ResourceChange, path: &str) -> Option<&'p Value> {
    let mut cur = config_of(plan, rc)?.get("expressions")?;
    for seg in path.split('.') {
        cur = step(cur, seg)?;
    }
    Some(cur)
}

/// The resources in the plan that a configured attribute refers to (same module), e.g.
/// `disk.0.import_from = proxmox_download_file.img.id` → the change(s) of that resource.
pub fn referenced<'p>(plan: &'p Plan, rc: &ResourceChange, path: &str) -> Vec<&'p ResourceChange> {
    let Some(expr) = config_expr(plan, rc, path) else {
        return Vec::new();
    };
    let Some(refs) = expr.get("references").and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut out: Vec<&ResourceChange> = Vec::new();
    for r in refs.iter().filter_map(Value::as_str) {
        let Some((rtype, rname, index)) = split_reference(r) else {
            continue;
        };
        for cand in plan.managed_changes() {
            if cand.resource_type == rtype
                && cand.name == rname
                && cand.module_address == rc.module_address
                && cand.deposed.is_none()
                && index
                    .as_ref()
                    .is_none_or(|i| cand.address.ends_with(&format!("{rtype}.{rname}{i}")))
                && !out.iter().any(|o| o.address == cand.address)
            {
                out.push(cand);
            }
        }
    }
    out
}

/// `proxmox_file.x["a"].id` → (`proxmox_file`, `x`, Some(`["a"]`)); `var.x` → None.
fn split_reference(r: &str) -> Option<(&str, &str, Option<String>)> {
    let (rtype, rest) = r.split_once('.')?;
    if matches!(
        rtype,
        "var" | "local" | "data" | "module" | "each" | "count" | "path" | "terraform" | "self"
    ) {
        return None;
    }
    let end = rest.find(['.', '[']).unwrap_or(rest.len());
    let name = &rest[..end];
    let after_name = &rest[end..];
    let index = if after_name.starts_with('[') {
        after_name.find(']').map(|i| after_name[..=i].to_string())
    } else {
        None
    };
    Some((rtype, name, index))
}

/// The resource address without its module prefix (what a `moved` block inside that module uses).
pub fn local_address(rc: &ResourceChange) -> &str {
    match rc.module_address.as_deref() {
        Some(m) if !m.is_empty() => rc
            .address
            .strip_prefix(m)
            .and_then(|r| r.strip_prefix('.'))
            .unwrap_or(&rc.address),
        _ => &rc.address,
    }
}

/// The address with a trailing instance key removed: `x["a"]` → `x`, `x[0]` → `x`.
pub fn without_index(address: &str) -> &str {
    if address.ends_with(']') {
        if let Some(i) = address.rfind('[') {
            // the bracket must open the last step, not sit inside a quoted key
            let base = &address[..i];
            if base.rsplit('.').next().is_some_and(|s| !s.contains('"')) {
                return base;
            }
        }
    }
    address
}

/// Proxmox's normalisation of an uploaded file name (pve-storage): keep what follows the last
/// `/` or `\`, and turn every character outside `[A-Za-z0-9_.-]` into `_`.
pub fn normalise_file_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    base.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The last path segment of a URL (what the provider names a download after when `file_name`
/// is not set), or `None` when the URL does not parse.
pub fn url_file_name(u: &str) -> Option<String> {
    let parsed = url::Url::parse(u).ok()?;
    let last = parsed.path_segments()?.rev().find(|s| !s.is_empty())?;
    Some(last.to_string())
}

/// The file name a download_file will get: `file_name`, else the URL's last segment. `None`
/// when it cannot be known at plan time.
pub fn download_name(plan: &Plan, rc: &ResourceChange) -> Option<String> {
    match after(rc, "file_name") {
        Attr::Known(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        // Written in the configuration but only known after apply: not the URL's name.
        Attr::Unknown if config_expr(plan, rc, "file_name").is_some() => None,
        // Not set, or computed by the provider: it is derived from the URL.
        _ => url_file_name(after(rc, "url").str()?),
    }
}

/// A URL that can point at a different file tomorrow (`/latest/`, `/current/`, `latest`).
pub fn is_floating_url(u: &str) -> bool {
    let path = match url::Url::parse(u) {
        Ok(p) => p.path().to_ascii_lowercase(),
        Err(_) => return false,
    };
    path.contains("latest") || path.split('/').any(|s| s == "current")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_name_families_and_nothing_else() {
        assert_eq!(
            Kind::of_type("proxmox_virtual_environment_download_file"),
            Some(Kind::DownloadFile)
        );
        assert_eq!(
            Kind::of_type("proxmox_download_file"),
            Some(Kind::DownloadFile)
        );
        assert_eq!(Kind::of_type("proxmox_vm"), Some(Kind::Vm));
        assert_eq!(
            Kind::of_type("proxmox_virtual_environment_vm"),
            Some(Kind::Vm)
        );
        assert_eq!(Kind::of_type("proxmox_vm_qemu"), None);
        assert_eq!(Kind::of_type("terraform_data"), None);
    }

    #[test]
    fn normalises_like_proxmox() {
        assert_eq!(normalise_file_name("a/b\\c d+e.qcow2"), "c_d_e.qcow2");
        assert_eq!(
            url_file_name("https://x.org/a/b/flatcar_production_qemu_image.img?x=1").as_deref(),
            Some("flatcar_production_qemu_image.img")
        );
    }

    #[test]
    fn strips_only_the_last_index() {
        assert_eq!(without_index("a.x[\"pve01\"]"), "a.x");
        assert_eq!(without_index("a.x[0]"), "a.x");
        assert_eq!(without_index("a.x"), "a.x");
        assert_eq!(
            module_names(Some("module.a[\"k.1\"].module.b")),
            vec!["a", "b"]
        );
    }

    #[test]
    fn volume_ids() {
        assert_eq!(
            VolumeId::parse("local:import/x.qcow2"),
            Some(VolumeId {
                storage: "local".into(),
                content: "import".into(),
                name: "x.qcow2".into()
            })
        );
        assert_eq!(VolumeId::parse("local-lvm:vm-100-disk-0"), None);
    }
}
