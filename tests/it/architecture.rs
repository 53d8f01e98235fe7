//! The layout is the architecture: no import cycles between modules, the layers point one way
//! (flows → capabilities → core), every file says what it is for, and `docs/architecture.md`
//! names only modules that exist.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every module of the crate (`flows::context::app_state`) and the file that holds it.
fn modules() -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let src = Path::new(ROOT).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    let mut mods = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|l| l == "mod") {
            parts.pop();
        }
        if parts == ["lib"] || parts == ["main"] {
            continue;
        }
        mods.insert(parts.join("::"), f);
    }
    mods
}

/// The longest module that `path` (`a::b::c::Item`) names, if any.
fn resolve<'a>(mods: &'a BTreeMap<String, PathBuf>, path: &str) -> Option<&'a str> {
    let mut parts: Vec<&str> = path.split("::").collect();
    while !parts.is_empty() {
        if let Some((k, _)) = mods.get_key_value(&parts.join("::")) {
            return Some(k.as_str());
        }
        parts.pop();
    }
    None
}

/// `segments` (as written in `module`) from the crate root, when they start at `crate`, `self`
/// or `super`; other paths (std, another crate, a name in scope) are not the crate's modules.
fn absolute(module: &str, segments: &[String]) -> Option<String> {
    let mut here: Vec<&str> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").collect()
    };
    let mut rest = segments;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            here.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                here.pop();
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    let mut all: Vec<String> = here.iter().map(|s| s.to_string()).collect();
    all.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(all.join("::"))
}

/// The paths of one `use` tree (groups, nesting, renames, globs), from the crate root.
fn use_tree(module: &str, prefix: &mut Vec<String>, t: &syn::UseTree, out: &mut Vec<String>) {
    match t {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_tree(module, prefix, &p.tree, out);
            prefix.pop();
        }
        syn::UseTree::Name(syn::UseName { ident })
        | syn::UseTree::Rename(syn::UseRename { ident, .. }) => {
            prefix.push(ident.to_string());
            out.extend(absolute(module, prefix));
            prefix.pop();
        }
        syn::UseTree::Glob(_) => out.extend(absolute(module, prefix)),
        syn::UseTree::Group(g) => {
            for item in &g.items {
                use_tree(module, prefix, item, out);
            }
        }
    }
}

/// Whether an item is compiled for tests only (`#[cfg(test)]`).
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string().split_whitespace().any(|t| t == "test"))
    })
}

/// Every path of the crate that `module`'s code names, from the crate root
/// (`flows::review::X`): `use` trees with their groups, `self`, `super` and `crate`, and the
/// paths written inline in the code (`super::run::first_error_line(…)`). Test-only code is
/// left out: a test may look anywhere.
fn crate_paths(module: &str, code: &str) -> Vec<String> {
    use syn::visit::Visit;
    struct Paths<'a> {
        module: &'a str,
        out: Vec<String>,
    }
    impl<'ast> Visit<'ast> for Paths<'_> {
        fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
            if !test_only(&u.attrs) {
                use_tree(self.module, &mut Vec::new(), &u.tree, &mut self.out);
            }
        }
        fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
            if !test_only(&m.attrs) {
                syn::visit::visit_item_mod(self, m);
            }
        }
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            if !test_only(&f.attrs) {
                syn::visit::visit_item_fn(self, f);
            }
        }
        fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
            if !test_only(&i.attrs) {
                syn::visit::visit_item_impl(self, i);
            }
        }
        /// `pub(super)` says who may see an item, not a module the item uses.
        fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
        fn visit_path(&mut self, p: &'ast syn::Path) {
            let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.out.extend(absolute(self.module, &segments));
            syn::visit::visit_path(self, p);
        }
    }
    let file = syn::parse_file(code).unwrap_or_else(|e| panic!("{module}: {e}"));
    let mut paths = Paths {
        module,
        out: Vec::new(),
    };
    paths.visit_file(&file);
    paths.out
}

/// Module → modules it uses (a child using its parent is not an edge: that is nesting).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    graph_with(false)
}

/// [`graph`], with `parents`: a child using its parent (an item of its `mod.rs`) is an edge too.
fn graph_with(parents: bool) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules();
    let mut g = BTreeMap::new();
    for (m, file) in &mods {
        let mut deps = BTreeSet::new();
        let code = std::fs::read_to_string(file).unwrap();
        for p in crate_paths(m, &code) {
            if let Some(t) = resolve(&mods, &p) {
                if t != m && (parents || !m.starts_with(&format!("{t}::"))) {
                    deps.insert(t.to_string());
                }
            }
        }
        g.insert(m.clone(), deps);
    }
    g
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        let g = t.g;
        for w in &g[v] {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let found = cycles(&graph());
    assert!(
        found.is_empty(),
        "import cycles between modules (each line is one cycle):\n{}",
        found
            .iter()
            .map(|c| c.join(" ↔ "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_cycle_check_sees_a_cycle() {
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    g.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    g.insert("d".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(cycles(&g), vec![vec!["a", "b", "c"]]);
    let paths = crate_paths(
        "flows::apply::parity",
        "use crate::flows::service::{app::App, queue};\nuse super::{run::{Decided, first_error_line}, self as apply};\nuse self::inner::X;\nfn f() { let x = crate::core::ids::RunId(1); super::super::review::go(); }\n#[cfg(test)]\nmod tests { use crate::flows::cli::Hidden; }",
    );
    for want in [
        "flows::service::app::App",
        "flows::service::queue",
        "flows::apply::run::Decided",
        "flows::apply::run::first_error_line",
        "flows::apply",
        "flows::apply::parity::inner::X",
        "core::ids::RunId",
        "flows::review::go",
    ] {
        assert!(paths.contains(&want.to_string()), "{want}: {paths:?}");
    }
    assert!(!paths.iter().any(|p| p.contains("Hidden")), "{paths:?}");
}

#[test]
fn layers_point_one_way() {
    let layer = |m: &str| match m.split("::").next().unwrap() {
        "flows" => 2,
        "capabilities" => 1,
        "core" => 0,
        other => panic!("a module outside the three layers: {other}"),
    };
    let mut wrong = Vec::new();
    for (m, deps) in graph() {
        for d in deps {
            if layer(&d) > layer(&m) {
                wrong.push(format!("{m} → {d}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a lower layer uses a higher one:\n{}",
        wrong.join("\n")
    );
}

/// The floors of `flows` (docs/architecture.md): a room uses only rooms on lower floors;
/// review and apply stand side by side and use neither each other nor anything above; drift
/// stands under apply (the apply posts its result on a root's drift issue).
fn flows_floor(room: &str) -> u8 {
    match room {
        "cli" => 6,
        "service" => 5,
        "review" | "apply" => 4,
        "drift" => 3,
        "context" | "preflight" => 2,
        "confinement" => 1,
        other => {
            panic!("flows::{other} has no floor: give it one here and in docs/architecture.md")
        }
    }
}

fn flows_arrows_up(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    arrows_up(g, "flows::", flows_floor)
}

/// The arrows of `g` between two rooms of a layer (`flows::`, `core::`, `flows::apply::`) that
/// do not go down a floor. The layer's own module (its `mod.rs`) is the room `mod`.
fn arrows_up(
    g: &BTreeMap<String, BTreeSet<String>>,
    layer: &str,
    floor: fn(&str) -> u8,
) -> Vec<String> {
    let room = |m: &str| {
        if format!("{m}::") == layer {
            return Some("mod".to_string());
        }
        m.strip_prefix(layer)
            .map(|r| r.split("::").next().unwrap().to_string())
    };
    let mut wrong = Vec::new();
    for (m, deps) in g {
        let Some(from) = room(m) else { continue };
        for d in deps {
            let Some(to) = room(d) else { continue };
            if to != from && floor(&to) >= floor(&from) {
                wrong.push(format!("{m} → {d}"));
            }
        }
    }
    wrong
}

/// The floors of `core` (docs/architecture.md): a room uses only rooms on lower floors. On
/// the ground floor what every text needs (a value's Markdown escaping, `defuse`, ids); the
/// template environment right on it (it knows the scrubber by `templates::Scrub` only, so the
/// scrubber stands above it); the plan model; what reads a plan; the configurations; what
/// decides; the note; and on top what puts it all together (drift, the fuzz properties).
fn core_floor(room: &str) -> u8 {
    match room {
        "drift" | "fuzzing" => 8,
        "render" | "retire" => 7,
        "apply" | "reach" | "replan" | "events" | "state" => 6,
        "fingerprint" | "repo_config" | "config" | "widgets" => 5,
        "targeting" | "apply_note" | "policy" | "engine_checks" | "summary" | "kept_plan" => 4,
        "engine_kind" | "redact" | "plan_digest" | "proxmox" | "freeze" | "approvals" => 3,
        "templates" | "root_graph" | "plan" | "drift_schedule" | "note_html" => 2,
        "markdown" | "defuse" | "ids" | "suggest" | "links" | "webhook" | "store_tls"
        | "plan_budget" | "ci_component" | "commit_status" | "hcl" | "sealed" => 1,
        other => {
            panic!("core::{other} has no floor: give it one here and in docs/architecture.md")
        }
    }
}

#[test]
fn core_rooms_stand_on_lower_floors_only() {
    let wrong = arrows_up(&graph(), "core::", core_floor);
    assert!(
        wrong.is_empty(),
        "a core room uses one on its own floor or above:\n{}",
        wrong.join("\n")
    );
    // Every room of core has a floor (a new one without panics above only if it imports).
    for m in modules().keys() {
        if let Some(room) = m.strip_prefix("core::") {
            core_floor(room.split("::").next().unwrap());
        }
    }
    let mut g = BTreeMap::new();
    g.insert(
        "core::templates".to_string(),
        BTreeSet::from(["core::redact".to_string(), "core::markdown".to_string()]),
    );
    assert_eq!(
        arrows_up(&g, "core::", core_floor),
        vec!["core::templates → core::redact"]
    );
}

/// The floors of `flows::review` (docs/architecture.md): a room uses only rooms on lower
/// floors, and none uses `flows::review` itself (its `mod.rs` only names them). At the bottom
/// how the review calls GitLab; the policy gate's review side on it; the plan run and the other
/// MR events side by side; the widgets' endpoint, which asks the events' `fork_policy`.
fn review_floor(room: &str) -> u8 {
    match room {
        "mod" => 5,
        "widgets" => 4,
        "plan" | "commands" => 3,
        "policies" => 2,
        "gitlab_calls" => 1,
        other => panic!(
            "flows::review::{other} has no floor: give it one here and in docs/architecture.md"
        ),
    }
}

/// The floors of `flows::review::plan`: its `mod.rs` on top calls the stages in order; each
/// stage uses only the stages before it, and `shared` (the status lines and statuses, the
/// note's upsert, a run's end) at the bottom.
fn review_plan_floor(room: &str) -> u8 {
    match room {
        "mod" => 7,
        "record" | "widgets" => 6,
        "note" | "unit" => 5,
        "roots" => 4,
        "reach" | "reuse" | "units" => 3,
        "prepare" => 2,
        "shared" => 1,
        other => panic!(
            "flows::review::plan::{other} has no floor: give it one here and in docs/architecture.md"
        ),
    }
}

/// The arrows of `g` between rooms of `flows::review`, and between rooms of its plan, that do
/// not go down a floor.
fn review_arrows_up(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut wrong = arrows_up(g, "flows::review::", review_floor);
    wrong.extend(arrows_up(g, "flows::review::plan::", review_plan_floor));
    wrong
}

#[test]
fn review_rooms_stand_on_lower_floors_only() {
    let wrong = review_arrows_up(&graph_with(true));
    assert!(
        wrong.is_empty(),
        "a room of flows::review (or of its plan) uses one on its own floor or above, or its folder's mod.rs:\n{}",
        wrong.join("\n")
    );
    for m in modules().keys() {
        if let Some(room) = m.strip_prefix("flows::review::") {
            review_floor(room.split("::").next().unwrap());
        }
        if let Some(room) = m.strip_prefix("flows::review::plan::") {
            review_plan_floor(room.split("::").next().unwrap());
        }
    }
    // The check sees an arrow going up, one into a folder's `mod.rs` (a stage calling its
    // helpers), one to a later stage, and lets those going down pass.
    let mut g = BTreeMap::new();
    g.insert(
        "flows::review::plan::roots".to_string(),
        BTreeSet::from([
            "flows::review::plan".to_string(),
            "flows::review::plan::note".to_string(),
            "flows::review::plan::prepare".to_string(),
        ]),
    );
    g.insert(
        "flows::review::plan::note".to_string(),
        BTreeSet::from([
            "flows::review::policies".to_string(),
            "flows::review::plan::shared".to_string(),
        ]),
    );
    g.insert(
        "flows::review::policies".to_string(),
        BTreeSet::from(["flows::review::commands".to_string()]),
    );
    assert_eq!(
        review_arrows_up(&g),
        vec![
            "flows::review::policies → flows::review::commands",
            "flows::review::plan::roots → flows::review::plan",
            "flows::review::plan::roots → flows::review::plan::note",
        ]
    );
}

#[test]
fn flows_rooms_stand_on_lower_floors_only() {
    let wrong = flows_arrows_up(&graph());
    assert!(
        wrong.is_empty(),
        "a flows room uses one on its own floor or above:\n{}",
        wrong.join("\n")
    );
    let mut g = BTreeMap::new();
    g.insert(
        "flows::apply::parity".to_string(),
        BTreeSet::from([
            "flows::review::policies".to_string(),
            "flows::context::cpu".to_string(),
        ]),
    );
    g.insert(
        "flows::context::app_state".to_string(),
        BTreeSet::from(["flows::service::server".to_string()]),
    );
    assert_eq!(
        flows_arrows_up(&g),
        vec![
            "flows::apply::parity → flows::review::policies",
            "flows::context::app_state → flows::service::server"
        ]
    );
}

/// The floors of `flows::apply` (docs/architecture.md): a room uses only rooms on lower
/// floors, and none uses `flows::apply` itself, whose `mod.rs` stands on top and re-exports.
/// At the bottom the job's log, the verdict and the texts; the policy gate and the job's
/// verification on it; the context every stage works with; the engine's plan (and its lint
/// findings); what the one decision judges a plan with (the policy sets and the preflight) and
/// what a refused plan shows; the one decision; the dependency order and the report; the two stages that ask the decision (parity,
/// run); the request's stages in order; and the endpoint.
fn apply_floor(room: &str) -> u8 {
    match room {
        "mod" => 10,
        "endpoint" => 9,
        "job" => 8,
        "parity" | "run" => 7,
        "order" | "report" => 6,
        "decide" => 5,
        "judge" | "shown" | "rails" => 4,
        "plan" => 3,
        "ctx" => 2,
        "policy" | "verify" | "retire" => 1,
        "log" => 0,
        other => panic!(
            "flows::apply::{other} has no floor: give it one here and in docs/architecture.md"
        ),
    }
}

#[test]
fn apply_rooms_stand_on_lower_floors_only() {
    let wrong = arrows_up(&graph_with(true), "flows::apply::", apply_floor);
    assert!(
        wrong.is_empty(),
        "a room of flows::apply uses one on its own floor or above (or flows::apply itself):\n{}",
        wrong.join("\n")
    );
    for m in modules().keys() {
        if let Some(room) = m.strip_prefix("flows::apply::") {
            apply_floor(room.split("::").next().unwrap());
        }
    }
    // A visibility is no arrow; a path into `mod.rs` is.
    let paths = crate_paths(
        "flows::apply::ctx",
        "pub(super) struct S;\nfn f() { super::say(); }",
    );
    assert_eq!(paths, vec!["flows::apply::say"]);
    // The check sees an arrow going up, one to `mod.rs`, and lets one going down pass.
    let mut g = BTreeMap::new();
    g.insert(
        "flows::apply::log".to_string(),
        BTreeSet::from(["flows::apply::ctx".to_string()]),
    );
    g.insert(
        "flows::apply::run".to_string(),
        BTreeSet::from([
            "flows::apply".to_string(),
            "flows::apply::decide".to_string(),
            "flows::context::cpu".to_string(),
        ]),
    );
    g.insert(
        "flows::apply".to_string(),
        BTreeSet::from(["flows::apply::endpoint".to_string()]),
    );
    assert_eq!(
        arrows_up(&g, "flows::apply::", apply_floor),
        vec![
            "flows::apply::log → flows::apply::ctx",
            "flows::apply::run → flows::apply"
        ]
    );
}

#[test]
fn every_file_says_what_it_is_for_and_every_folder_what_lives_in_it() {
    let mut missing = Vec::new();
    for (m, file) in modules() {
        let text = std::fs::read_to_string(&file).unwrap();
        if !text.starts_with("//!") {
            missing.push(format!("{m}: no `//!` line at the top"));
        }
        if file.ends_with("mod.rs") {
            let doc = text.lines().take_while(|l| l.starts_with("//!")).count();
            if doc < 2 {
                missing.push(format!(
                    "{m}: a folder's mod.rs says in two lines what lives in it"
                ));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn the_architecture_page_names_only_modules_that_exist() {
    let page = std::fs::read_to_string(Path::new(ROOT).join("docs/architecture.md")).unwrap();
    let mods = modules();
    let mut named = BTreeSet::new();
    for token in page.split('`').skip(1).step_by(2) {
        let token = token.trim();
        let first = token.split("::").next().unwrap_or("");
        if matches!(first, "flows" | "capabilities" | "core") && token.contains("::") {
            named.insert(token.to_string());
        }
    }
    assert!(
        named.len() >= 20,
        "the page names the modules in backticks: {named:?}"
    );
    // `flows::context::app_state::App` names an item of a module: the module must exist and define it.
    let unknown: Vec<_> = named
        .iter()
        .filter(|t| match resolve(&mods, t) {
            None => true,
            Some(m) => {
                let item = t[m.len()..].trim_start_matches("::");
                !item.is_empty()
                    && (item.contains("::") || {
                        let text = std::fs::read_to_string(&mods[m]).unwrap();
                        ![
                            "struct ", "enum ", "fn ", "trait ", "const ", "type ", "mod ",
                        ]
                        .iter()
                        .any(|k| text.contains(&format!("{k}{item}")))
                    })
            }
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/architecture.md names modules that do not exist: {unknown:?}"
    );
    let unnamed: Vec<_> = mods
        .keys()
        .filter(|m| m.matches("::").count() == 1 || m.starts_with("flows::"))
        .filter(|m| {
            !named
                .iter()
                .any(|n| n == *m || n.starts_with(&format!("{m}::")))
        })
        .collect();
    assert!(
        unnamed.is_empty(),
        "modules missing from docs/architecture.md's map: {unnamed:?}"
    );
}
