//! Targeted plans asked for in an MR comment (`planbot plan -- -target=ADDR -exclude=ADDR
//! -replace=ADDR`): the allow-list of engine flags, each address checked as a resource address
//! (so no value can be read as an option), the engine's argv, the line the note shows, and the
//! text that binds them to the plan's fingerprint (`Fingerprint::with_targeting`).

use crate::core::engine_kind::EngineKind;
use serde::{Deserialize, Serialize};

/// The engine flags a comment may pass, the only ones: anything else is refused with this list.
pub const ALLOWED_FLAGS: [&str; 3] = ["-target", "-exclude", "-replace"];

/// At most this many addresses in one comment.
pub const MAX_ADDRESSES: usize = 32;

/// At most this many bytes in one address.
pub const MAX_ADDRESS_LEN: usize = 512;

/// The targeting of one plan: empty for a full plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Targeting {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replace: Vec<String>,
    /// `-destroy`: the plan of a root an MR retires (`core::retire`), every resource of its
    /// state destroyed. Never from a comment ([`Targeting::parse`] refuses the flag): planbot
    /// sets it for a retired root, on the MR and in the apply alike.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub destroy: bool,
}

/// Why the arguments of a `planbot plan -- …` comment were refused (the reply says it, with
/// [`ALLOWED_FLAGS`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetingError {
    #[error("`{0}` is not a flag planbot passes to the engine")]
    NotAllowed(String),
    #[error("`{0}` needs an address, written `{0}=ADDRESS` (one word)")]
    NoAddress(&'static str),
    #[error("`{address}` (after `{flag}`) is not a resource address such as `proxmox_virtual_environment_vm.web`, `module.dns.proxmox_virtual_environment_vm.blocky[\"a\"]`{modules}")]
    BadAddress {
        flag: &'static str,
        address: String,
        modules: &'static str,
    },
    #[error("more than {MAX_ADDRESSES} addresses")]
    TooMany,
    #[error("`planbot plan --` needs at least one of the flags")]
    Empty,
    #[error("`-target` and `-exclude` cannot be used in the same plan")]
    TargetAndExclude,
    #[error("`-exclude` needs OpenTofu (1.9 or later): Terraform has no `-exclude`; use `-target` with the addresses to plan instead")]
    ExcludeNeedsOpenTofu,
}

impl Targeting {
    /// Read the words after `planbot plan --`: each `FLAG=ADDRESS`, FLAG one of
    /// [`ALLOWED_FLAGS`], ADDRESS a resource address (a module address too for `-target` and
    /// `-exclude`). Repeated addresses count once.
    pub fn parse<S: AsRef<str>>(words: &[S]) -> Result<Targeting, TargetingError> {
        let mut t = Targeting::default();
        if words.len() > MAX_ADDRESSES {
            return Err(TargetingError::TooMany);
        }
        for word in words {
            let word = word.as_ref();
            let (flag, address) = match word.split_once('=') {
                Some((f, a)) => (f, Some(a)),
                None => (word, None),
            };
            let Some(flag) = ALLOWED_FLAGS.iter().copied().find(|f| *f == flag) else {
                return Err(TargetingError::NotAllowed(shown(flag)));
            };
            let Some(address) = address.filter(|a| !a.is_empty()) else {
                return Err(TargetingError::NoAddress(flag));
            };
            let module_ok = flag != "-replace";
            if !is_address(address, module_ok) {
                return Err(TargetingError::BadAddress {
                    flag,
                    address: shown(address),
                    modules: if module_ok {
                        " or `module.dns`"
                    } else {
                        " (a managed resource: `-replace` takes no module or data source)"
                    },
                });
            }
            let list = match flag {
                "-target" => &mut t.target,
                "-exclude" => &mut t.exclude,
                _ => &mut t.replace,
            };
            if !list.iter().any(|a| a == address) {
                list.push(address.to_string());
            }
        }
        if t.is_empty() {
            return Err(TargetingError::Empty);
        }
        if !t.target.is_empty() && !t.exclude.is_empty() {
            return Err(TargetingError::TargetAndExclude);
        }
        Ok(t)
    }

    /// A full plan (no flag).
    pub fn is_empty(&self) -> bool {
        self.target.is_empty()
            && self.exclude.is_empty()
            && self.replace.is_empty()
            && !self.destroy
    }

    /// The destroy plan of a retired root (`-destroy`, every resource of its state).
    pub fn destroy() -> Targeting {
        Targeting {
            destroy: true,
            ..Targeting::default()
        }
    }

    /// Plans only part of the root (`-target` or `-exclude`): what it leaves out stays
    /// unapplied, so an apply of it needs a confirmation. `-replace` alone plans everything.
    pub fn is_partial(&self) -> bool {
        !self.target.is_empty() || !self.exclude.is_empty()
    }

    /// Whether `engine` has every flag asked for (`-exclude` is OpenTofu's only).
    pub fn check_engine(&self, engine: EngineKind) -> Result<(), TargetingError> {
        if engine == EngineKind::Terraform && !self.exclude.is_empty() {
            return Err(TargetingError::ExcludeNeedsOpenTofu);
        }
        Ok(())
    }

    /// The engine's `plan` arguments, one argv item each (`-target=ADDRESS`), in a fixed order.
    pub fn engine_args(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (flag, list) in self.lists() {
            out.extend(list.iter().map(|a| format!("{flag}={a}")));
        }
        if self.destroy {
            out.push("-destroy".to_string());
        }
        out
    }

    /// The same targeting checked again as a comment's would be (one read back from the store
    /// or handed to the engine): every flag allowed, every address an address. A full plan
    /// passes as it is.
    pub fn recheck(&self) -> Result<Targeting, TargetingError> {
        let flags = Targeting {
            destroy: false,
            ..self.clone()
        };
        let mut checked = if flags.is_empty() {
            Targeting::default()
        } else {
            Targeting::parse(&flags.engine_args())?
        };
        checked.destroy = self.destroy;
        Ok(checked)
    }

    /// How a status description and the log say it, in a few words: `1 excluded`,
    /// `2 targeted, 1 replaced`; empty for a full plan.
    pub fn counts(&self) -> String {
        self.lists()
            .iter()
            .map(|(flag, list)| format!("{} {}", list.len(), past(flag)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The note's line above the headline (`comments/targeted_banner.md.j2`): which flags, which
    /// addresses, and what it means for the apply; `root` is named when the MR has several.
    pub fn banner(&self, root: Option<&str>) -> String {
        let lists: Vec<minijinja::Value> = self
            .lists()
            .into_iter()
            .map(|(flag, list)| minijinja::context! { kind => past(flag), addresses => list })
            .collect();
        crate::core::templates::render(
            "comments/targeted_banner.md.j2",
            minijinja::context! {
                root => root,
                lists => lists,
                partial => self.is_partial(),
            },
        )
        .map(|t| t.trim_end().to_string())
        .unwrap_or_else(|e| format!("**Targeted plan** ({e})"))
    }

    /// The flags and their addresses, in [`ALLOWED_FLAGS`] order, the empty ones left out.
    pub fn lists(&self) -> Vec<(&'static str, &[String])> {
        [
            ("-target", self.target.as_slice()),
            ("-exclude", self.exclude.as_slice()),
            ("-replace", self.replace.as_slice()),
        ]
        .into_iter()
        .filter(|(_, l)| !l.is_empty())
        .collect()
    }

    /// The text the fingerprint binds: each flag with its addresses sorted, length-prefixed so
    /// that no two targetings share it; empty for a full plan.
    pub fn canonical(&self) -> String {
        let mut out = String::new();
        for (flag, list) in self.lists() {
            let mut sorted: Vec<&String> = list.iter().collect();
            sorted.sort();
            out.push_str(&format!("{flag}:{};", sorted.len()));
            for a in sorted {
                out.push_str(&format!("{}:{a};", a.len()));
            }
        }
        if self.destroy {
            out.push_str("-destroy;");
        }
        out
    }
}

/// `-exclude` → `excluded`: how the note and the status name what a flag did.
fn past(flag: &str) -> &'static str {
    match flag {
        "-target" => "targeted",
        "-exclude" => "excluded",
        _ => "replaced",
    }
}

/// A word of a comment as a refusal shows it: at most 80 characters.
fn shown(word: &str) -> String {
    let mut s: String = word.chars().take(80).collect();
    if s.len() < word.len() {
        s.push('…');
    }
    s
}

/// A resource address as the engines write it: `module.NAME[KEY]` steps, then `data.`
/// (not with `module_ok` false), `TYPE.NAME` and an optional `[KEY]`; with `module_ok`, a
/// module address alone too. A KEY is a number or a JSON string (no control character).
pub fn is_address(s: &str, module_ok: bool) -> bool {
    if s.is_empty() || s.len() > MAX_ADDRESS_LEN {
        return false;
    }
    let mut rest = s;
    let mut modules = 0;
    while let Some(after) = rest.strip_prefix("module.") {
        let Some(r) = name(after).and_then(key) else {
            return false;
        };
        modules += 1;
        if r.is_empty() {
            return module_ok;
        }
        let Some(r) = r.strip_prefix('.') else {
            return false;
        };
        rest = r;
    }
    let _ = modules;
    if let Some(after) = rest.strip_prefix("data.") {
        if !module_ok {
            return false;
        }
        rest = after;
    }
    let Some(r) = name(rest) else { return false };
    let Some(r) = r.strip_prefix('.') else {
        return false;
    };
    matches!(name(r).and_then(key), Some(""))
}

/// After an identifier (a letter or `_`, then letters, digits, `_` and `-`): the rest.
fn name(s: &str) -> Option<&str> {
    let first = s.chars().next()?;
    if !(first.is_ascii_alphabetic() || first == '_') {
        return None;
    }
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .unwrap_or(s.len());
    Some(&s[end..])
}

/// After an optional `[KEY]`: the rest.
fn key(s: &str) -> Option<&str> {
    let Some(inner) = s.strip_prefix('[') else {
        return Some(s);
    };
    if let Some(q) = inner.strip_prefix('"') {
        let mut escaped = false;
        for (i, c) in q.char_indices() {
            if c.is_control() {
                return None;
            }
            if escaped {
                if !matches!(c, '"' | '\\') {
                    return None;
                }
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                return q[i + 1..].strip_prefix(']');
            }
        }
        None
    } else {
        let end = inner.find(']')?;
        let digits = &inner[..end];
        (!digits.is_empty() && digits.len() <= 9 && digits.bytes().all(|b| b.is_ascii_digit()))
            .then(|| &inner[end + 1..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_and_module_addresses_are_the_only_values() {
        for ok in [
            "proxmox_virtual_environment_vm.web",
            "proxmox_virtual_environment_vm.web[0]",
            r#"module.dns["a b"].proxmox_virtual_environment_vm.blocky["x\"y"]"#,
            "module.dns.module.inner[3].terraform_data.x",
            "data.proxmox_virtual_environment_nodes.all",
        ] {
            assert!(is_address(ok, true), "{ok}");
        }
        assert!(is_address("module.dns", true));
        assert!(is_address("module.dns[\"k\"]", true));
        assert!(!is_address("module.dns", false));
        assert!(!is_address("data.x.y", false));
        for bad in [
            "",
            "-chdir=/etc",
            "/etc",
            "web",
            "a.b.c",
            "a.b[",
            "a.b[x]",
            "a.b[\"x]",
            "a.b[\"x\n\"]",
            "a.b[0].c",
            "module.",
            "1a.b",
            "a.b ",
            "module.a.-x.y",
            "a.b[1234567890]",
        ] {
            assert!(!is_address(bad, true), "{bad:?}");
        }
        assert!(!is_address(
            &format!("a.{}", "b".repeat(MAX_ADDRESS_LEN)),
            true
        ));
    }

    #[test]
    fn only_the_three_flags_pass_each_with_an_address() {
        let t = Targeting::parse(&[
            "-target=proxmox_virtual_environment_vm.web",
            "-replace=terraform_data.x[0]",
            "-target=proxmox_virtual_environment_vm.web",
        ])
        .unwrap();
        assert_eq!(t.target, vec!["proxmox_virtual_environment_vm.web"]);
        assert_eq!(t.replace, vec!["terraform_data.x[0]"]);
        assert!(t.is_partial());
        assert_eq!(
            t.engine_args(),
            vec![
                "-target=proxmox_virtual_environment_vm.web",
                "-replace=terraform_data.x[0]"
            ]
        );
        assert!(!Targeting::parse(&["-replace=a.b"]).unwrap().is_partial());
        assert_eq!(
            Targeting::parse(&["-chdir=/etc"]),
            Err(TargetingError::NotAllowed("-chdir".into()))
        );
        assert_eq!(
            Targeting::parse(&["-target"]),
            Err(TargetingError::NoAddress("-target"))
        );
        assert_eq!(
            Targeting::parse(&["-target="]),
            Err(TargetingError::NoAddress("-target"))
        );
        assert!(matches!(
            Targeting::parse(&["-target=-chdir=/etc"]),
            Err(TargetingError::BadAddress { .. })
        ));
        assert!(matches!(
            Targeting::parse(&["--target=a.b"]),
            Err(TargetingError::NotAllowed(_))
        ));
        assert!(matches!(
            Targeting::parse(&["-replace=module.a"]),
            Err(TargetingError::BadAddress { .. })
        ));
        assert_eq!(
            Targeting::parse(&["-target=a.b", "-exclude=c.d"]),
            Err(TargetingError::TargetAndExclude)
        );
        assert_eq!(Targeting::parse::<&str>(&[]), Err(TargetingError::Empty));
        let many: Vec<String> = (0..=MAX_ADDRESSES)
            .map(|i| format!("-target=a.b{i}"))
            .collect();
        assert_eq!(Targeting::parse(&many), Err(TargetingError::TooMany));
        let long = format!("-target={}", "x".repeat(500));
        match Targeting::parse(&[long]) {
            Err(TargetingError::NotAllowed(_)) | Err(TargetingError::BadAddress { .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_targeting_read_back_is_checked_again() {
        let t = Targeting::parse(&["-exclude=a.b", "-replace=c.d[0]"]).unwrap();
        assert_eq!(t.recheck(), Ok(t.clone()));
        assert_eq!(t.counts(), "1 excluded, 1 replaced");
        assert_eq!(Targeting::default().recheck(), Ok(Targeting::default()));
        let forged = Targeting {
            target: vec!["a.b -chdir=/etc".into()],
            ..Targeting::default()
        };
        assert!(matches!(
            forged.recheck(),
            Err(TargetingError::BadAddress { .. })
        ));
    }

    #[test]
    fn the_banner_says_what_was_left_out_and_what_the_apply_needs() {
        let one = Targeting::parse(&["-exclude=terraform_data.b"]).unwrap();
        let many = Targeting::parse(&[
            "-target=module.dns",
            "-target=proxmox_virtual_environment_vm.web[\"a`b\"]",
            "-replace=terraform_data.x[0]",
        ])
        .unwrap();
        let replace = Targeting::parse(&["-replace=terraform_data.x"]).unwrap();
        insta::assert_snapshot!(
            "targeted_banners",
            [
                one.banner(None),
                many.banner(Some("dns")),
                replace.banner(Some("core"))
            ]
            .join("\n\n")
        );
    }

    #[test]
    fn exclude_is_opentofus_only() {
        let t = Targeting::parse(&["-exclude=proxmox_virtual_environment_vm.stuck"]).unwrap();
        assert_eq!(
            t.check_engine(EngineKind::Terraform),
            Err(TargetingError::ExcludeNeedsOpenTofu)
        );
        assert_eq!(t.check_engine(EngineKind::OpenTofu), Ok(()));
        let t = Targeting::parse(&["-target=a.b"]).unwrap();
        assert_eq!(t.check_engine(EngineKind::Terraform), Ok(()));
    }

    #[test]
    fn the_canonical_text_tells_every_targeting_apart() {
        let c = |w: &[&str]| Targeting::parse(w).unwrap().canonical();
        assert_eq!(Targeting::default().canonical(), "");
        assert_eq!(
            c(&["-target=a.b", "-target=c.d"]),
            c(&["-target=c.d", "-target=a.b"])
        );
        assert_ne!(c(&["-target=a.b"]), c(&["-exclude=a.b"]));
        assert_ne!(c(&["-target=a.b"]), c(&["-replace=a.b"]));
        assert_ne!(c(&["-target=a.b", "-target=c.d"]), c(&["-target=a.b"]));
        // The JSON round trip the store and the queue use keeps it.
        let t = Targeting::parse(&["-exclude=module.x", "-replace=a.b"]).unwrap();
        let back: Targeting = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn a_destroy_plan_is_its_own_plan_that_no_comment_can_ask_for() {
        let destroy = Targeting::destroy();
        assert!(!destroy.is_empty() && !destroy.is_partial());
        assert_eq!(destroy.engine_args(), ["-destroy"]);
        // Bound to the fingerprint apart from a full plan and kept through the store.
        assert_ne!(destroy.canonical(), Targeting::default().canonical());
        assert_eq!(destroy.recheck(), Ok(destroy.clone()));
        let json = serde_json::to_string(&destroy).unwrap();
        assert_eq!(serde_json::from_str::<Targeting>(&json).unwrap(), destroy);
        assert_eq!(serde_json::to_string(&Targeting::default()).unwrap(), "{}");
        // A comment cannot ask for it.
        assert_eq!(
            Targeting::parse(&["-destroy"]),
            Err(TargetingError::NotAllowed("-destroy".into()))
        );
    }
}
