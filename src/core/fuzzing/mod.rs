//! The properties planbot's fuzz targets check (`fuzz/`, docs/development.md "Fuzzing"): one
//! function per target, taking the raw input, running it through what planbot runs on outside
//! input and panicking when a property fails; and the corpus replay (`corpus_replay`), which
//! calls the same functions on stable, so every property lives here once. Compiled for tests
//! and for the fuzz crate only (`cfg(any(test, fuzzing))`: cargo-fuzz sets `--cfg fuzzing`).
//!
//! Adding a target: a `pub fn NAME(data: &[u8])` here, its line in [`TARGETS`], then
//! `scripts/fuzz.sh add NAME` writes `fuzz/fuzz_targets/NAME.rs` and its `[[bin]]`.

use crate::core::config::{Allowlist, Config, ProjectRef};
use crate::core::defuse::defuse as defuse_text;
use crate::core::events::{decide, Job, OutcomeKind};
use crate::core::fingerprint::Fingerprint;
use crate::core::markdown::{
    code_span, fence_for, gitlab_flavour, html_escape, inline_text, neutralise, table_code,
    table_text,
};
use crate::core::note_html::note_to_html;
use crate::core::plan::Plan;
use crate::core::policy::sets::Owner;
use crate::core::proxmox::lint::lint;
use crate::core::redact::{Secrets, REDACTED};
use crate::core::render::terminal::note_as_text;
use crate::core::render::{render_note, NoteContext, RootOutcome, RootSection, NOTE_MARKER};
use crate::core::repo_config::{self, RepoConfig, RootState};
use crate::core::summary::PlanReport;
use crate::core::webhook::{self, Expected, Presented, Refusal, Verified};
use base64::Engine as _;
use comrak::nodes::{AstNode, NodeValue};
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;

/// A target's check: panics when a property fails for this input.
pub type Check = fn(&[u8]);

/// Every target: its name (the file `fuzz/fuzz_targets/NAME.rs`, the corpus `fuzz/corpus/NAME/`)
/// and its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("webhook", webhook),
    ("plan_note", plan_note),
    ("repo_config", repo_config),
    ("service_config", service_config),
    ("defuse", defuse),
    ("markdown", markdown),
];

/// The check of target `name`.
pub fn target(name: &str) -> Option<Check> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

const ZWSP: char = '\u{200B}';

// ----- webhook: authentication and what a delivery means -----------------------------------------

/// The signing key the webhook target's deliveries are checked with (`whsec_` + base64 of it).
pub const WEBHOOK_SIGNING_KEY: &[u8] = b"planbot-fuzz-signing-key";
/// The `X-Gitlab-Token` secret of the webhook target.
pub const WEBHOOK_SECRET: &str = "hook-secret";

/// A delivery as the webhook target reads its input: header lines (`Name: value`) up to the
/// first empty line, then the body — an HTTP request without its request line.
#[derive(Debug, Default)]
pub struct Delivery<'a> {
    pub event: Option<&'a str>,
    pub token: Option<&'a str>,
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
    pub body: &'a [u8],
}

impl<'a> Delivery<'a> {
    pub fn parse(data: &'a [u8]) -> Delivery<'a> {
        let (head, body) = match find(data, b"\n\n") {
            Some(at) => (&data[..at], &data[at + 2..]),
            None => (&b""[..], data),
        };
        let mut d = Delivery {
            body,
            ..Delivery::default()
        };
        let Ok(head) = std::str::from_utf8(head) else {
            return d;
        };
        for line in head.lines() {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.strip_prefix(' ').unwrap_or(value);
            match name.to_ascii_lowercase().as_str() {
                "x-gitlab-event" => d.event = Some(value),
                "x-gitlab-token" => d.token = Some(value),
                "webhook-id" => d.id = Some(value),
                "webhook-timestamp" => d.timestamp = Some(value),
                "webhook-signature" => d.signature = Some(value),
                _ => {}
            }
        }
        d
    }

    /// The input that parses back to this delivery (for seeding the corpus).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in [
            ("X-Gitlab-Event", self.event),
            ("X-Gitlab-Token", self.token),
            ("webhook-id", self.id),
            ("webhook-timestamp", self.timestamp),
            ("webhook-signature", self.signature),
        ] {
            if let Some(v) = value {
                out.extend_from_slice(format!("{name}: {v}\n").as_bytes());
            }
        }
        out.push(b'\n');
        out.extend_from_slice(self.body);
        out
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The projects the webhook target allows: those of `tests/fixtures/gitlab/webhooks`.
pub fn webhook_allowlist() -> Allowlist {
    Allowlist(vec![
        ProjectRef::Path("flightjs/flight-management".into()),
        ProjectRef::Path("gitlabhq/gitlab-test".into()),
        ProjectRef::Id(5),
    ])
}

/// The Standard Webhooks signature over `id.timestamp.body`, as the spec computes it.
fn spec_signature(id: &str, timestamp: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(WEBHOOK_SIGNING_KEY).expect("any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let b64 = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    format!("v1,{b64}")
}

/// Webhook target: `core::webhook::verify` accepts exactly the right token, exactly a signature
/// entry the spec computes (in the window), and refuses the same delivery with its body changed;
/// `core::events::decide` never panics, gives jobs only for an allowed project's MR, each job
/// about that MR, every SHA lower-case hex, no fork ever planned on its own, and every job
/// survives the store's JSON as it is.
pub fn webhook(data: &[u8]) {
    let d = Delivery::parse(data);
    let presented = Presented {
        gitlab_token: d.token,
        webhook_id: d.id,
        webhook_timestamp: d.timestamp,
        webhook_signature: d.signature,
    };
    // With the secret token only.
    let token_only = Expected {
        webhook_secret: Some(WEBHOOK_SECRET.into()),
        signing_key: None,
    };
    let got = webhook::verify(&presented, d.body, &token_only, 0);
    if d.signature.is_none() {
        assert_eq!(
            got == Ok(Verified::Token),
            d.token == Some(WEBHOOK_SECRET),
            "token check: {got:?} for {:?}",
            d.token
        );
    } else {
        assert_eq!(got, Err(Refusal::NoSigningKey));
    }
    // With a signing key: the signature is mandatory.
    let token = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(WEBHOOK_SIGNING_KEY)
    );
    let signing = Expected {
        webhook_secret: Some(WEBHOOK_SECRET.into()),
        signing_key: webhook::decode_signing_token(&token),
    };
    assert!(signing.signing_key.is_some());
    let ts: Option<i64> = d.timestamp.and_then(|t| t.trim().parse().ok());
    let now = ts.unwrap_or(0);
    let got = webhook::verify(&presented, d.body, &signing, now);
    if let (Some(id), Some(t), Some(sig), Some(_)) = (d.id, d.timestamp, d.signature, ts) {
        let want = spec_signature(id, t, d.body);
        let matches = sig.split(' ').any(|e| e == want);
        assert_eq!(
            got == Ok(Verified::Signature),
            matches,
            "signature check: {got:?}"
        );
        // The same delivery checked at another time: stale when more than 5 minutes away
        // (whatever the numbers: no overflow), else as before.
        for at in [
            now.wrapping_add(301),
            now.wrapping_sub(301),
            1_700_000_000,
            i64::MIN,
        ] {
            let far = (i128::from(at) - i128::from(now)).abs() > 300;
            let later = webhook::verify(&presented, d.body, &signing, at);
            if far {
                assert_eq!(later, Err(Refusal::Stale), "at {at} for {t:?}");
            } else if (i128::from(at) - i128::from(now)).abs() <= 300 {
                assert_eq!(later, got, "at {at} for {t:?}");
            }
        }
    } else {
        assert!(got.is_err(), "no complete signature but {got:?}");
    }
    // A delivery signed the way GitLab signs passes; with one byte of the body changed it does not.
    if let (Some(id), Some(t)) = (d.id, ts) {
        let sig = webhook::sign(WEBHOOK_SIGNING_KEY, id, t, d.body);
        let ts_text = t.to_string();
        let signed = Presented {
            webhook_id: Some(id),
            webhook_timestamp: Some(&ts_text),
            webhook_signature: Some(&sig),
            ..Presented::default()
        };
        assert_eq!(
            webhook::verify(&signed, d.body, &signing, t),
            Ok(Verified::Signature)
        );
        let mut changed = d.body.to_vec();
        match changed.last_mut() {
            Some(b) => *b ^= 1,
            None => changed.push(b' '),
        }
        assert_eq!(
            webhook::verify(&signed, &changed, &signing, t),
            Err(Refusal::BadSignature)
        );
    }
    decision(d.event, d.body);
}

/// The decision's properties for one delivery.
fn decision(event: Option<&str>, body: &[u8]) {
    let allow = webhook_allowlist();
    let dec = decide(event, body, &allow);
    let is_json = serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok();
    if event.is_none() {
        assert_eq!(dec.kind, OutcomeKind::Ignored);
    } else if !is_json {
        assert_eq!(dec.kind, OutcomeKind::Unparseable, "{}", dec.outcome);
    }
    assert_eq!(dec.jobs.is_empty(), dec.kind != OutcomeKind::Enqueued);
    if dec.jobs.is_empty() {
        return;
    }
    assert_eq!(dec.outcome, "enqueued");
    let (Some(project), Some(mr)) = (dec.project, dec.mr) else {
        panic!("jobs without their MR: {dec:?}");
    };
    let value: serde_json::Value = serde_json::from_slice(body).expect("parsed before");
    let path = value
        .pointer("/project/path_with_namespace")
        .and_then(|v| v.as_str());
    assert!(
        allow.allows(Some(project.0), path),
        "a job for project {project:?} ({path:?}), not on the allow-list"
    );
    for job in &dec.jobs {
        assert_eq!(job.mr(), Some((project, mr)), "{job:?}");
        if let Some(sha) = job.sha() {
            let s = sha.as_str();
            assert!(
                matches!(s.len(), 40 | 64)
                    && s.bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{s:?}"
            );
        }
        if let Job::Plan(p) = job {
            assert!(!p.fork, "a fork's MR planned on its own: {p:?}");
        }
        let stored = serde_json::to_string(job).expect("a job serializes");
        let back: Job = serde_json::from_str(&stored).expect("a stored job reads back");
        assert_eq!(&back, job);
    }
}

// ----- plan_note: `show -json` to the note, its HTML and its text ---------------------------------

/// The fingerprint key of the plan target.
const FINGERPRINT_KEY: &[u8] = b"planbot-fuzz-fingerprint-key";

/// Every template's text, for telling a template's own words from a leaked value.
fn template_text() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        crate::core::templates::FILES
            .iter()
            .map(|(_, _, t)| *t)
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// Plan target: any bytes either fail to parse as a plan or go through lint, fingerprint, the
/// note (with the default budget, or a small one for odd lengths), its HTML and its terminal
/// text without a panic; the note opens with the marker, no sensitive value of the plan is in
/// the note, its text or its HTML (nor with the zero-width spaces taken out), the HTML has no
/// script, and the JSON report is scrubbed too.
pub fn plan_note(data: &[u8]) {
    let Ok(plan) = Plan::from_json(data) else {
        return;
    };
    let findings = lint(&plan, &[]);
    let secrets = Secrets::from_plan(&plan);
    let scrubber = secrets.scrubber();
    let fingerprint = Fingerprint::of_with_secrets(&plan, FINGERPRINT_KEY, None, &scrubber);
    let ctx = NoteContext {
        sha: Some("3f9a2c1e5b7d9f0a1c3e5b7d9f0a1c3e5b7d9f0a".into()),
        engine: Some("OpenTofu 1.10.6".into()),
        run_url: Some("https://planbot.example.com/runs/1".into()),
        budget: if data.len() % 2 == 1 { 6_000 } else { 0 },
        ..NoteContext::default()
    };
    let roots = [RootSection {
        name: "root".into(),
        outcome: RootOutcome::Planned {
            plan: &plan,
            findings: &findings,
            fingerprint: &fingerprint,
        },
    }];
    let note = render_note(&ctx, &roots, &scrubber);
    assert!(note.starts_with(NOTE_MARKER), "{note}");
    let text = note_as_text(&note);
    let html = note_to_html(&note);
    let lower = html.to_ascii_lowercase();
    assert!(!lower.contains("<script"), "{html}");
    assert!(!lower.contains("href=\"javascript:"), "{html}");
    let report = PlanReport::new(&plan, fingerprint.as_hex().to_string(), findings);
    let json = scrubber.pretty_json(&report, b"");
    let bare = note.replace(ZWSP, "");
    for s in secrets.iter() {
        // Long enough not to be a word of the page by chance, and one line (a multi-line
        // secret's lines are secrets of their own).
        if s.chars().count() < 10
            || s.chars().any(char::is_control)
            || s.contains(ZWSP)
            || template_text().contains(s)
            || REDACTED.contains(s)
        {
            continue;
        }
        for (what, out) in [
            ("note", &note),
            ("note without zero-width spaces", &bare),
            ("terminal text", &text),
            ("HTML", &html),
        ] {
            assert!(
                !out.contains(s),
                "sensitive value {s:?} in the {what}:\n{out}"
            );
        }
        let in_json = serde_json::to_string(s).expect("a string serializes");
        assert!(
            !json.contains(in_json.trim_matches('"')),
            "sensitive value {s:?} in the JSON report"
        );
    }
}

// ----- repo_config: `.planbot.toml` --------------------------------------------------------------

/// `.planbot.toml` written back from a parsed config (what matters: roots, plan settings,
/// policy sets), to parse again. An empty list is left out (the file's way of saying "none" or
/// "every root").
#[derive(Serialize)]
struct WrittenFile {
    plan: WrittenPlan,
    roots: Vec<WrittenRoot>,
    policy_sets: Vec<WrittenSet>,
}

#[derive(Serialize)]
struct WrittenPlan {
    checkout: &'static str,
    fork_mrs: &'static str,
}

#[derive(Serialize)]
struct WrittenRoot {
    name: String,
    dir: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    when_modified: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    var_files: Vec<String>,
    workspace: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    lint_disable: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<toml::Value>,
    drift: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    depends_on: Vec<String>,
}

#[derive(Serialize)]
struct WrittenSet {
    name: String,
    path: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    owners: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    roots: Vec<String>,
    namespace: String,
}

/// `cfg` as a `.planbot.toml`.
pub fn write_repo_config(cfg: &RepoConfig) -> String {
    let file = WrittenFile {
        plan: WrittenPlan {
            checkout: cfg.plan.checkout.as_str(),
            fork_mrs: cfg.plan.fork_mrs.as_str(),
        },
        roots: cfg
            .roots
            .iter()
            .map(|r| WrittenRoot {
                name: r.name.clone(),
                dir: r.dir.clone(),
                when_modified: r.when_modified.clone(),
                var_files: r.var_files.clone(),
                workspace: r.workspace.clone(),
                lint_disable: r.lint_disable.clone(),
                state: match &r.state {
                    RootState::Unset => None,
                    RootState::Own => Some(toml::Value::String("own".into())),
                    RootState::Gitlab(name) => {
                        let mut t = toml::map::Map::new();
                        t.insert("gitlab".into(), toml::Value::String(name.clone()));
                        Some(toml::Value::Table(t))
                    }
                },
                drift: r.drift,
                depends_on: r.depends_on.clone(),
            })
            .collect(),
        policy_sets: cfg
            .policy_sets
            .iter()
            .map(|s| WrittenSet {
                name: s.name.clone(),
                path: s.path.clone(),
                owners: s
                    .owners
                    .iter()
                    .map(|o| match o {
                        Owner::User(u) => u.clone(),
                        Owner::Group(g) => format!("group:{g}"),
                    })
                    .collect(),
                roots: s.roots.clone(),
                namespace: s.namespace.clone(),
            })
            .collect(),
    };
    toml::to_string(&file).expect("a config writes as TOML")
}

/// Whether a repo-relative path stays inside the repository, normalised (`.` or `a/b`).
fn inside_repo(path: &str) -> bool {
    path == "."
        || (!path.is_empty()
            && !path.starts_with('/')
            && !path.contains('\\')
            && !path.chars().any(char::is_control)
            && path.split('/').all(|p| !matches!(p, "" | "." | "..")))
}

/// `.planbot.toml` target: any text is a config or problems, never a panic; a config's root
/// directories, var files and policy set paths stay inside the repository, normalised; root
/// names are distinct; the config written back parses to the same config; the CLI's and the
/// note's texts about it render (a template that failed says so in its output).
pub fn repo_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let parsed = RepoConfig::parse(&text);
    let preview = repo_config::render_preview(&parsed, "main");
    assert!(!preview.starts_with("(template "), "{preview}");
    match parsed {
        Ok(cfg) => {
            assert!(!cfg.roots.is_empty());
            let mut names: Vec<&str> = cfg.roots.iter().map(|r| r.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), cfg.roots.len(), "two roots of one name");
            for r in &cfg.roots {
                assert!(inside_repo(&r.dir), "root dir {:?}", r.dir);
                for p in &r.patterns {
                    assert!(
                        !p.starts_with('/') && p.split('/').all(|c| c != ".."),
                        "pattern {p:?} of root {:?} leaves the repository",
                        r.name
                    );
                }
            }
            for s in &cfg.policy_sets {
                assert!(inside_repo(&s.path), "policy set path {:?}", s.path);
            }
            let out = repo_config::render_check_config(".planbot.toml", &cfg);
            assert!(!out.starts_with("(template "), "{out}");
            let changed = ["main.tf".to_string(), "modules/vm/main.tf".to_string()];
            let _ = cfg.decide(&changed);
            let written = write_repo_config(&cfg);
            match RepoConfig::parse(&written) {
                Ok(again) => assert_eq!(again, cfg, "written back as:\n{written}"),
                Err(e) => panic!("the config written back is refused: {e}\n{written}"),
            }
        }
        Err(e) => {
            assert!(!e.problems.is_empty());
            let lines = text.lines().count() + 1;
            for p in &e.problems {
                assert!(p.line.is_none_or(|l| l >= 1 && l <= lines), "{p:?}");
            }
            let out = repo_config::render_check_config_error(".planbot.toml", &e);
            assert!(!out.starts_with("(template "), "{out}");
            let note = repo_config::render_error_note("main", &e);
            assert!(!note.starts_with("(template "), "{note}");
        }
    }
}

// ----- service_config: planbot's own config file -------------------------------------------------

/// Service config target: any text loads to a config or to problems (each one displays), never
/// a panic; a config comes with no problem.
pub fn service_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let loaded = Config::load_all(&text, &[], &|_| Err("no files in the fuzz target".into()));
    for p in loaded.problems.iter().chain(&loaded.warnings) {
        let _ = p.describe("planbot.toml");
    }
    match loaded.into_result() {
        Ok(cfg) => {
            let _ = format!("{cfg:?}");
        }
        Err(problems) => assert!(!problems.is_empty(), "no config and no problem"),
    }
}

// ----- defuse: what GitLab would act on ----------------------------------------------------------

/// Whether GitLab would notify everyone for a mention in `text`: `@all` or `@here` in any case,
/// not followed by more of a user name (GitLab's names: letters, digits, `_`, `-`, inner `.`).
pub fn has_mass_mention(text: &str) -> bool {
    let name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    text.match_indices('@').any(|(at, _)| {
        let rest = &text[at + 1..];
        ["all", "here"].iter().any(|name| {
            let Some(head) = rest.get(..name.len()) else {
                return false;
            };
            if !head.eq_ignore_ascii_case(name) {
                return false;
            }
            let mut after = rest[name.len()..].chars();
            match (after.next(), after.next()) {
                (Some(c), _) if name_char(c) => false,
                (Some('.'), Some(c)) if name_char(c) => false,
                _ => true,
            }
        })
    })
}

/// Defuse target: the output has no carriage return, no line that starts with `/` (a superset
/// of GitLab's quick-action rule), no mass mention, no `<!--` left open on its line; it reads
/// the same (zero-width spaces aside, line ends as GitLab reads them) and defusing it again
/// changes nothing.
pub fn defuse(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let out = defuse_text(&text);
    assert!(!out.contains('\r'));
    for line in out.split('\n') {
        assert!(!line.starts_with('/'), "quick action line {line:?}");
        let mut rest = line;
        while let Some(open) = rest.find("<!--") {
            let after = &rest[open + 4..];
            let close = after
                .find("-->")
                .unwrap_or_else(|| panic!("`<!--` left open in {line:?}"));
            rest = &after[close + 3..];
        }
    }
    assert!(!has_mass_mention(&out), "mass mention in {out:?}");
    let read = text.replace("\r\n", "\n").replace('\r', "\n");
    assert_eq!(out.replace(ZWSP, ""), read.replace(ZWSP, ""));
    assert_eq!(defuse_text(&out), out, "not idempotent");
}

// ----- markdown: the escaping of values in the note ----------------------------------------------

/// Every node of a parsed Markdown document, depth first.
fn nodes<'a>(root: &'a AstNode<'a>) -> Vec<NodeValue> {
    root.descendants()
        .map(|n| n.data.borrow().value.clone())
        .collect()
}

fn parse_with<R>(md: &str, f: impl FnOnce(Vec<NodeValue>) -> R) -> R {
    let arena = comrak::Arena::new();
    let root = comrak::parse_document(&arena, md, &gitlab_flavour());
    f(nodes(root))
}

fn is_html(n: &NodeValue) -> bool {
    matches!(n, NodeValue::HtmlInline(_) | NodeValue::HtmlBlock(_))
}

/// A NUL as U+FFFD: CommonMark says a reader shows one for the other (comrak keeps it in
/// code), so the two are not told apart.
fn as_read(text: &str) -> String {
    text.replace('\0', "\u{FFFD}")
}

/// Markdown target, one value through every escaping function, each read back with GitLab's
/// flavour of Markdown (comrak): `neutralise` leaves no `<!--`/`-->` and reads the same;
/// `code_span` is one code span showing the value (line ends as spaces); `fence_for` makes a
/// block the value cannot close, showing it as it is; `inline_text` as a list item or in a
/// paragraph forms no HTML; `html_escape` leaves no character HTML reads; a table cell
/// (`table_text`, `table_code`) stays one cell of one row, with no HTML but `table_code`'s own.
pub fn markdown(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();

    let n = neutralise(text);
    assert!(!n.contains("<!--") && !n.contains("-->"), "{n:?}");
    assert_eq!(n.replace(ZWSP, ""), text.replace(ZWSP, ""));

    let escaped = html_escape(text);
    assert!(
        !escaped.contains(['<', '>', '"', '\'', '\n']),
        "{escaped:?}"
    );

    // A code span, inside a paragraph.
    let span = code_span(text);
    parse_with(&format!("x {span} y\n"), |nodes| {
        let codes: Vec<&String> = nodes
            .iter()
            .filter_map(|n| match n {
                NodeValue::Code(c) => Some(&c.literal),
                _ => None,
            })
            .collect();
        assert_eq!(codes.len(), 1, "{span:?} → {nodes:?}");
        let shown = neutralise(text).replace(['\n', '\r'], " ");
        // An empty value is a span of one space (an empty span is not a code span).
        let want = as_read(if shown.is_empty() { " " } else { &shown });
        // Long backtick runs are broken by zero-width spaces (`markdown::code_span`).
        assert_eq!(
            as_read(codes[0]).replace(ZWSP, ""),
            want.replace(ZWSP, ""),
            "{span:?}"
        );
        assert!(!nodes.iter().any(is_html), "{span:?} → {nodes:?}");
    });

    // A fenced block.
    let fence = fence_for(text);
    let body = text.replace("\r\n", "\n").replace('\r', "\n");
    let md = format!("{fence}\n{body}\n{fence}\nafter\n");
    parse_with(&md, |nodes| {
        let blocks: Vec<&String> = nodes
            .iter()
            .filter_map(|n| match n {
                NodeValue::CodeBlock(c) => Some(&c.literal),
                _ => None,
            })
            .collect();
        assert_eq!(blocks.len(), 1, "{md:?} → {nodes:?}");
        assert_eq!(as_read(blocks[0]), as_read(&format!("{body}\n")), "{md:?}");
    });

    // Text in a list item and in a paragraph.
    let inline = inline_text(text);
    assert!(!inline.contains(['\n', '\r']));
    for md in [format!("- {inline}\n"), format!("x {inline} y\n")] {
        parse_with(&md, |nodes| {
            assert!(!nodes.iter().any(is_html), "{md:?} → {nodes:?}");
            assert_links_and_mentions_nothing(&md, &nodes);
        });
    }

    // Table cells.
    for (cell, own_html) in [
        (table_text(text), &[][..]),
        (table_code(text), &["<code>", "</code>"][..]),
    ] {
        let md = format!("| a | b |\n| --- | --- |\n| x | {cell} |\n");
        parse_with(&md, |nodes| {
            let cells = nodes
                .iter()
                .filter(|n| matches!(n, NodeValue::TableCell))
                .count();
            let rows = nodes
                .iter()
                .filter(|n| matches!(n, NodeValue::TableRow(_)))
                .count();
            assert_eq!((rows, cells), (2, 4), "{md:?} → {nodes:?}");
            for n in &nodes {
                if let NodeValue::HtmlInline(h) = n {
                    assert!(own_html.contains(&h.as_str()), "{md:?} → {h:?}");
                }
                assert!(!matches!(n, NodeValue::HtmlBlock(_)), "{md:?}");
            }
            assert_links_and_mentions_nothing(&md, &nodes);
        });
    }
}

/// A value shown as prose (a cell, a list item, a paragraph) links nothing — no link, image or
/// autolink forms from it — and mentions no one: every `@` in its text is followed by a
/// zero-width space, so GitLab reads no `@user`, `@group/sub` or e-mail address.
fn assert_links_and_mentions_nothing(md: &str, nodes: &[NodeValue]) {
    for n in nodes {
        assert!(
            !matches!(n, NodeValue::Link(_) | NodeValue::Image(_)),
            "{md:?} → {n:?}"
        );
        if let NodeValue::Text(t) = n {
            let t: &str = t.as_ref();
            for (i, _) in t.match_indices('@') {
                assert!(
                    t[i + 1..].starts_with(ZWSP),
                    "{md:?}: a live mention in {t:?}"
                );
            }
        }
    }
}

#[cfg(test)]
mod corpus_replay;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_reads_back_as_written() {
        let d = Delivery {
            event: Some("Note Hook"),
            token: Some("t"),
            id: Some("msg_1"),
            timestamp: Some("1000"),
            signature: Some("v1,abc"),
            body: b"{\"a\":1}\n\nmore",
        };
        let bytes = d.to_bytes();
        let back = Delivery::parse(&bytes);
        assert_eq!(format!("{back:?}"), format!("{d:?}"));
    }

    #[test]
    fn mass_mentions_are_found_as_gitlab_finds_them() {
        for yes in ["@all", "hi @HERE.", "(@All)", "@all."] {
            assert!(has_mass_mention(yes), "{yes}");
        }
        for no in [
            "@allison",
            "@all_x",
            "@here-team",
            "@all.ops",
            "@all.-",
            "mail@example",
            "@al",
        ] {
            assert!(!has_mass_mention(no), "{no}");
        }
    }

    #[test]
    fn every_target_passes_on_an_empty_input() {
        for (_, check) in TARGETS {
            check(b"");
        }
    }
}
