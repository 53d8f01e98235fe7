//! The plan as the lint rules and the preflight see it: bpg resource kinds, known/unknown
//! attribute access, Proxmox volume ids, and references followed through the plan's
//! `configuration`.

use crate::core::plan::{ActionKind, ChangeValues, Json, Plan, ResourceChange, Values};
use serde_json::Value;
use std::collections::HashMap;
use std::ops::Deref;

/// A resource change with its values parsed: what the rules read. Built one resource at a time
/// (and dropped after it) for VMs and containers; kept for the plan's file resources, which other
/// resources refer to.
pub struct Res<'p> {
    pub rc: &'p ResourceChange,
    values: ChangeValues,
}

impl<'p> Res<'p> {
    pub fn parse(rc: &'p ResourceChange) -> Res<'p> {
        Res {
            rc,
            values: rc.change.values(),
        }
    }

    /// The change's values.
    pub fn values(&self) -> &Values<'_> {
        self.values.get()
    }
}

impl Deref for Res<'_> {
    type Target = ResourceChange;
    fn deref(&self) -> &ResourceChange {
        self.rc
    }
}

/// The bpg/proxmox resources the rules know, whatever the name family
/// (`proxmox_virtual_environment_vm` or `proxmox_vm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    Known(&'a Json<'a>),
}

impl<'a> Attr<'a> {
    /// A known, non-empty string (the provider writes unset strings as `""`).
    pub fn str(self) -> Option<&'a str> {
        match self {
            Attr::Known(Json::Str(s)) if !s.is_empty() => Some(s),
            _ => None,
        }
    }

    pub fn bool(self) -> Option<bool> {
        match self {
            Attr::Known(Json::Bool(b)) => Some(*b),
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
            Attr::Known(Json::Str(s)) => !s.is_empty(),
            Attr::Known(Json::Array(a)) => !a.is_empty(),
            Attr::Known(_) => true,
        }
    }

    /// Known to be unset (absent, null or the empty string).
    pub fn is_unset(self) -> bool {
        match self {
            Attr::Absent => true,
            Attr::Known(Json::Str(s)) => s.is_empty(),
            _ => false,
        }
    }
}

fn step<'v>(v: &'v Json<'v>, seg: &str) -> Option<&'v Json<'v>> {
    match v {
        Json::Object(m) => m.get(seg),
        Json::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    }
}

/// [`step`] in the plan's `configuration` (a document read whole, not a change's values).
fn config_step<'v>(v: &'v Value, seg: &str) -> Option<&'v Value> {
    match v {
        Value::Object(m) => m.get(seg),
        Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    }
}

/// Whether `path` (dot-separated, numbers index lists) is unknown in an `after_unknown` mask.
pub fn unknown_at(mask: &Json, path: &str) -> bool {
    let mut cur = mask;
    if cur == &Json::Bool(true) {
        return true;
    }
    for seg in path.split('.') {
        match step(cur, seg) {
            Some(Json::Bool(true)) => return true,
            Some(next) => cur = next,
            None => return false,
        }
    }
    false
}

/// `change.after` at `path`, honouring `after_unknown`.
pub fn after<'a>(rc: &'a Res, path: &str) -> Attr<'a> {
    if unknown_at(&rc.values().after_unknown, path) {
        return Attr::Unknown;
    }
    let mut cur = &rc.values().after;
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
pub fn before<'a>(rc: &'a Res, path: &str) -> Option<&'a Json<'a>> {
    let mut cur = &rc.values().before;
    for seg in path.split('.') {
        cur = step(cur, seg)?;
    }
    (!cur.is_null()).then_some(cur)
}

/// The number of elements of a list (block) attribute in `after`, known or not.
pub fn block_len(rc: &Res, path: &str) -> usize {
    let known = match after(rc, path) {
        Attr::Known(Json::Array(a)) => a.len(),
        _ => 0,
    };
    let mut mask = &rc.values().after_unknown;
    for seg in path.split('.') {
        match step(mask, seg) {
            Some(m) => mask = m,
            None => return known,
        }
    }
    known.max(mask.as_array().map_or(0, <[Json]>::len))
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

/// The SDN side of a plan (PVE018, PVE114): the bpg SDN objects it creates, changes or destroys
/// (zones, VNets, subnets, …: `proxmox_virtual_environment_sdn_*`, `proxmox_sdn_*`), the VNet
/// names it creates or changes (`id`, or `vnet_id`, when known), and whether an SDN applier
/// (`…_sdn_applier`) changes with them — Proxmox keeps SDN changes pending until something applies
/// the SDN configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SdnChanges {
    pub changed: Vec<String>,
    pub vnets: Vec<String>,
    pub applied: bool,
}

pub fn sdn_changes(plan: &Plan) -> SdnChanges {
    let mut out = SdnChanges::default();
    for rc in plan.managed_changes().filter(|rc| rc.deposed.is_none()) {
        let t = rc.resource_type.as_str();
        let Some(rest) = t
            .strip_prefix("proxmox_virtual_environment_sdn_")
            .or_else(|| t.strip_prefix("proxmox_sdn_"))
        else {
            continue;
        };
        if matches!(
            rc.kind(),
            ActionKind::NoOp | ActionKind::Read | ActionKind::Forget
        ) {
            continue;
        }
        if rest == "applier" {
            out.applied = true;
            continue;
        }
        out.changed.push(rc.address.clone());
        if rest == "vnet" && is_planned(rc) {
            let res = Res::parse(rc);
            let name = after(&res, "vnet_id")
                .str()
                .or_else(|| after(&res, "id").str());
            if let Some(name) = name {
                out.vnets.push(name.to_string());
            }
        }
    }
    out
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

/// A module's configured resources: (type, name) → its first managed `resources[]` entry.
type ModuleConfig<'p> = HashMap<(&'p str, &'p str), &'p Value>;

/// What the rules look up by key, built once per lint call so that no rule scans every
/// resource change (or every configured resource) for every resource.
pub struct Index<'p> {
    /// The managed changes, deposed objects left out, in plan order.
    live: Vec<&'p ResourceChange>,
    /// `live` by (module address, type, name), in plan order: what a reference can name.
    by_name: HashMap<(Option<&'p str>, &'p str, &'p str), Vec<&'p ResourceChange>>,
    /// The bpg file resources (download_file and file) of `live`, with their values, in plan
    /// order: VMs refer to them, so they are parsed once and kept (a plan has few of them).
    files: Vec<Res<'p>>,
    /// Position in `files` by address (unique once deposed objects are left out).
    file_at: HashMap<&'p str, usize>,
    /// Positions in `files` by the file's known `id`, in plan order.
    files_by_id: HashMap<String, Vec<usize>>,
    /// Per module address of a change: the first managed `resources[]` entry of that module's
    /// configuration for each (type, name); `None` when the plan has no configuration for it.
    config: HashMap<Option<&'p str>, Option<ModuleConfig<'p>>>,
}

impl<'p> Index<'p> {
    pub fn new(plan: &'p Plan) -> Index<'p> {
        let live: Vec<&ResourceChange> = plan
            .managed_changes()
            .filter(|rc| rc.deposed.is_none())
            .collect();
        let mut by_name: HashMap<_, Vec<&ResourceChange>> = HashMap::new();
        let mut files = Vec::new();
        let mut file_at = HashMap::new();
        let mut files_by_id: HashMap<String, Vec<usize>> = HashMap::new();
        let mut config = HashMap::new();
        for &rc in &live {
            by_name
                .entry((
                    rc.module_address.as_deref(),
                    rc.resource_type.as_str(),
                    rc.name.as_str(),
                ))
                .or_default()
                .push(rc);
            if Kind::of(rc).is_some_and(Kind::is_file) {
                let file = Res::parse(rc);
                if let Some(id) = after(&file, "id").str() {
                    files_by_id
                        .entry(id.to_string())
                        .or_default()
                        .push(files.len());
                }
                file_at.insert(rc.address.as_str(), files.len());
                files.push(file);
            }
        }
        for rc in plan.managed_changes() {
            let module = rc.module_address.as_deref();
            config
                .entry(module)
                .or_insert_with(|| module_config(plan, module));
        }
        Index {
            live,
            by_name,
            files,
            file_at,
            files_by_id,
            config,
        }
    }

    /// The managed changes, deposed objects left out, in plan order.
    pub fn live(&self) -> &[&'p ResourceChange] {
        &self.live
    }

    /// The bpg file resources of one kind (`DownloadFile` or `File`), deposed objects left out,
    /// with their values, in plan order.
    pub fn files(&self, kind: Kind) -> impl Iterator<Item = &Res<'p>> + '_ {
        self.files.iter().filter(move |f| Kind::of(f) == Some(kind))
    }

    /// The kept file resource at this change's address, if it is one.
    pub fn file(&self, rc: &ResourceChange) -> Option<&Res<'p>> {
        self.file_at
            .get(rc.address.as_str())
            .map(|&n| &self.files[n])
            .filter(|f| std::ptr::eq(f.rc, rc))
    }

    /// The bpg file resources (deposed left out) whose known `id` is `id`, in plan order.
    pub fn files_with_id(&self, id: &str) -> Vec<&Res<'p>> {
        self.files_by_id.get(id).map_or(Vec::new(), |ns| {
            ns.iter().map(|&n| &self.files[n]).collect()
        })
    }

    /// The `resources[]` entry of the plan's `configuration` that declared this change, if the
    /// plan carries its configuration.
    pub fn config_of(&self, rc: &ResourceChange) -> Option<&'p Value> {
        let module = self.config.get(&rc.module_address.as_deref())?.as_ref()?;
        module
            .get(&(rc.resource_type.as_str(), rc.name.as_str()))
            .copied()
    }

    /// The expression object of a configured attribute, `path` as in [`after`]
    /// (e.g. `disk.0.import_from`).
    pub fn config_expr(&self, rc: &ResourceChange, path: &str) -> Option<&'p Value> {
        let mut cur = self.config_of(rc)?.get("expressions")?;
        for seg in path.split('.') {
            cur = config_step(cur, seg)?;
        }
        Some(cur)
    }

    /// The bpg file resources in the plan that a configured attribute refers to (same module),
    /// e.g. `disk.0.import_from = proxmox_download_file.img.id` → that download's change.
    pub fn referenced_files(&self, rc: &ResourceChange, path: &str) -> Vec<&Res<'p>> {
        let Some(expr) = self.config_expr(rc, path) else {
            return Vec::new();
        };
        let Some(refs) = expr.get("references").and_then(Value::as_array) else {
            return Vec::new();
        };
        let mut out: Vec<&Res> = Vec::new();
        for r in refs.iter().filter_map(Value::as_str) {
            let Some((rtype, rname, index)) = split_reference(r) else {
                continue;
            };
            let key = (rc.module_address.as_deref(), rtype, rname);
            let suffix = index.as_ref().map(|i| format!("{rtype}.{rname}{i}"));
            for &cand in self.by_name.get(&key).map_or(&[][..], Vec::as_slice) {
                if suffix.as_ref().is_none_or(|s| cand.address.ends_with(s))
                    && !out.iter().any(|o| o.address == cand.address)
                {
                    if let Some(file) = self.file(cand) {
                        out.push(file);
                    }
                }
            }
        }
        out
    }

    /// The file name a download_file will get: `file_name`, else the URL's last segment.
    /// `None` when it cannot be known at plan time.
    pub fn download_name(&self, rc: &Res) -> Option<String> {
        match after(rc, "file_name") {
            Attr::Known(Json::Str(s)) if !s.is_empty() => Some(s.to_string()),
            // Written in the configuration but only known after apply: not the URL's name.
            Attr::Unknown if self.config_expr(rc, "file_name").is_some() => None,
            // Not set, or computed by the provider: it is derived from the URL.
            _ => url_file_name(after(rc, "url").str()?),
        }
    }
}

/// The first managed `resources[]` entry for each (type, name) in the configuration of the
/// module at `module_address`; `None` when the plan carries no configuration for it.
fn module_config<'p>(plan: &'p Plan, module_address: Option<&str>) -> Option<ModuleConfig<'p>> {
    let cfg = plan.configuration.as_ref()?;
    let mut module = &cfg.root_module;
    for n in &module_names(module_address) {
        module = &module.module_calls.get(n)?.module;
    }
    let mut out = HashMap::new();
    for r in &module.resources {
        if r.get("mode").and_then(Value::as_str).unwrap_or("managed") != "managed" {
            continue;
        }
        let (Some(t), Some(n)) = (
            r.get("type").and_then(Value::as_str),
            r.get("name").and_then(Value::as_str),
        ) else {
            continue;
        };
        out.entry((t, n)).or_insert(r);
    }
    Some(out)
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
