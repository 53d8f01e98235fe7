//! `planbot render`, and the output shared with `planbot plan`: the note or the JSON report.

use crate::core::engine_kind::{self, EngineKind};
use crate::core::fingerprint::Fingerprint;
use crate::core::plan::Plan;
use crate::core::proxmox::lint::lint;
use crate::core::redact::Secrets;
use crate::core::render::{
    render_note, write_note, NoteContext, RootOutcome, RootSection, NO_BUDGET,
};
use crate::core::summary::PlanReport;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Markdown,
    Json,
    /// The note as plain aligned text, for a terminal ([`crate::core::render::terminal`]).
    Text,
}

impl Format {
    /// What `planbot plan` and `planbot render` print when `--format` is not given: text on a
    /// terminal, the exact Markdown when piped.
    pub fn for_stdout() -> Format {
        if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            Format::Text
        } else {
            Format::Markdown
        }
    }
}

/// The first bytes of a binary plan file: a zip archive (`tofu plan -out`, `terraform plan -out`).
const ZIP_MAGIC: &[u8] = b"PK\x03\x04";

/// The fingerprint key used when none is given (`--fingerprint-key` / `PLANBOT_FINGERPRINT_KEY`).
/// It is public and fixed: such a fingerprint identifies a plan locally but proves nothing, and
/// matches no fingerprint a server made (docs/workflow.md says so; no warning on every run).
pub const LOCAL_FINGERPRINT_KEY: &str = "planbot-local-fingerprint-key-not-secret";

/// The root name shown when a plan is rendered on its own.
pub const DEFAULT_ROOT: &str = ".";

/// The note (markdown) or the JSON report (`--format json`) of one plan, scrubbed of every secret the
/// plan reveals plus `extra_secrets`. Findings come from the lint rules.
pub fn report(
    plan: &Plan,
    ctx: &NoteContext,
    extra_secrets: &Secrets,
    fingerprint_key: &[u8],
    format: Format,
) -> String {
    let mut out = Vec::new();
    write_report(plan, ctx, extra_secrets, fingerprint_key, format, &mut out)
        .expect("a Vec takes every byte");
    String::from_utf8(out).expect("the report is UTF-8")
}

/// [`report`] written to `out`; the Markdown note as it is rendered, never held whole.
pub fn write_report(
    plan: &Plan,
    ctx: &NoteContext,
    extra_secrets: &Secrets,
    fingerprint_key: &[u8],
    format: Format,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    // The lint rules and the fingerprint read the plan independently: on two threads (each
    // reads one resource at a time, so this costs little memory). The plan's own secrets are
    // collected (and their matcher built) once, for the fingerprint and for scrubbing; the set
    // itself is not needed after that.
    let (findings, (mut secrets, plan_scrubber, fingerprint)) = std::thread::scope(|s| {
        let lint = s.spawn(|| lint(plan, &[]));
        let secrets = Secrets::from_plan(plan);
        let scrubber = secrets.scrubber();
        let fingerprint = Fingerprint::of_with_secrets(plan, fingerprint_key, None, &scrubber);
        let findings = match lint.join() {
            Ok(findings) => findings,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        (findings, (secrets, scrubber, fingerprint))
    });
    let scrubber = if extra_secrets.is_empty() {
        plan_scrubber
    } else {
        secrets.merge(extra_secrets);
        secrets.scrubber()
    };
    drop(secrets);
    give_back_freed_memory();
    let roots = [RootSection {
        name: DEFAULT_ROOT.to_string(),
        outcome: RootOutcome::Planned {
            plan,
            findings: &findings,
            fingerprint: &fingerprint,
        },
    }];
    match format {
        Format::Markdown => write_note(ctx, &roots, &scrubber, out),
        Format::Text => {
            let note = render_note(ctx, &roots, &scrubber);
            out.write_all(crate::core::render::terminal::note_as_text(&note).as_bytes())
        }
        Format::Json => {
            let report = PlanReport::new(plan, fingerprint.as_hex().to_string(), findings);
            out.write_all(scrubber.pretty_json(&report, b"  ").as_bytes())
        }
    }
}

/// Return to the system the memory the analysis freed (each resource's values, parsed and
/// dropped in turn, on two threads), so the note is rendered on top of the plan, the findings
/// and the scrubber only: on a 10,000-resource plan this lowers the peak by about 1.5 MiB.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The key of a local command's fingerprints: the one given, else [`LOCAL_FINGERPRINT_KEY`].
pub fn local_fingerprint_key(given: Option<&str>) -> &[u8] {
    match given {
        Some(k) if !k.is_empty() => k.as_bytes(),
        _ => LOCAL_FINGERPRINT_KEY.as_bytes(),
    }
}

/// What `planbot render` says about a binary plan file: what it is, and the two ways on.
fn binary_plan_hint(path: &Path) -> String {
    crate::core::templates::render(
        "local_progress.txt.j2",
        minijinja::context! { kind => "binary_plan", file => path.display().to_string() },
    )
    .map(|t| t.trim().to_string())
    .unwrap_or_else(|e| format!("planbot: {} is a binary plan file ({e})", path.display()))
}

/// `planbot render PLAN_JSON`: exit 0 on success, 2 when the input is not a plan document.
/// The footer names the engine given (`--engine-name`), else the one the document shows
/// ([`engine_kind::detect_plan`]), else only its version.
pub fn render_command(
    path: &Path,
    format: Format,
    fingerprint_key: Option<&str>,
    engine_name: Option<EngineKind>,
    gitlab_budget: bool,
) -> Result<ExitCode> {
    // Read from the file (or stdin) into the plan: whole when it is small enough to, else as it
    // comes, which keeps the peak memory of a very big plan low (`Plan::from_json_reader`).
    let (name, parsed) = if path == Path::new("-") {
        let stdin = std::io::stdin().lock();
        (
            "stdin".to_string(),
            Plan::from_json_reader(std::io::BufReader::new(stdin)),
        )
    } else {
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
        let head = std::io::BufRead::fill_buf(&mut reader)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if head.starts_with(ZIP_MAGIC) {
            eprintln!("{}", binary_plan_hint(path));
            return Ok(ExitCode::from(2));
        }
        (path.display().to_string(), Plan::from_json_reader(reader))
    };
    let plan = match parsed {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("planbot: {name} is {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let engine = engine_name.or_else(|| engine_kind::detect_plan(&plan));
    let key = local_fingerprint_key(fingerprint_key);
    let ctx = NoteContext {
        // Rendered here, not on a merge request: no "comment to re-plan" hint.
        local_run: true,
        engine: engine_kind::footer_text(engine, plan.engine_version()),
        // Locally there is no GitLab limit: the whole plan, unless `--budget gitlab` asks for
        // the note GitLab would get.
        budget: if gitlab_budget { 0 } else { NO_BUDGET },
        plan_file: Some(name.clone()),
        ..NoteContext::default()
    };
    let mut stdout = LastByte {
        out: std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock()),
        last: None,
    };
    write_report(&plan, &ctx, &Secrets::new(), key, format, &mut stdout)
        .and_then(|()| match stdout.last {
            Some(b'\n') => Ok(()),
            _ => stdout.write_all(b"\n"),
        })
        .and_then(|()| stdout.flush())
        .context("cannot write to stdout")?;
    Ok(ExitCode::SUCCESS)
}

/// A writer that remembers the last byte written through it (the output ends with a newline).
struct LastByte<W> {
    out: W,
    last: Option<u8>,
}

impl<W: Write> Write for LastByte<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        if n > 0 {
            self.last = Some(buf[n - 1]);
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
