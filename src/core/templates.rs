//! Every text planbot shows comes from `templates/`: one minijinja environment holds every
//! file there (embedded at compile time), built once, and [`check`]ed at start-up.
//!
//! A template is named by its path under `templates/` (`comments/help.md.j2`,
//! `pages/run.html`); `.html` templates are auto-escaped, the others are not.
//!
//! Scrubbing touches values, never planbot's words: inside [`scrubbing`], every value a template
//! prints (`{{ x }}`) passes through the scrubber, while the template's own text is written as
//! it is. A secret equal to a common word ("plan", "apply") is therefore hidden wherever a value
//! holds it, and the verdict line, the status descriptions and the notes' wording stay intact.
//! A value that is itself planbot's rendered (and scrubbed) text is passed as a safe string
//! (`Value::from_safe_string`) and written unchanged.

use crate::core::markdown;
use minijinja::{AutoEscape, Environment, Error, Output, State, Template, Value};
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::LazyLock;

/// What scrubs the values a template prints (`core::redact::Scrubber` is the one): the template
/// environment stands on core's ground floor, below the scrubber, and knows it by this only.
pub trait Scrub {
    /// Nothing to scrub: values are written as they are.
    fn is_empty(&self) -> bool;
    /// `text` with every secret hidden.
    fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str>;
}

/// A shared scrubber scrubs as the one it shares.
impl<T: Scrub + ?Sized> Scrub for std::sync::Arc<T> {
    fn is_empty(&self) -> bool {
        (**self).is_empty()
    }

    fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        (**self).scrub(text)
    }
}

/// How a file of `templates/` is read. minijinja applies its whitespace settings when a template
/// is loaded, so templates of both layouts live in the one environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// minijinja's defaults: the text as written, a single trailing newline dropped.
    Verbatim,
    /// A block tag takes its line with it (`trim_blocks`, `lstrip_blocks`) and the trailing
    /// newline is kept: for the long templates whose logic is indented.
    Blocks,
    /// Not a template: served or written as it is (the stylesheet, the CI template).
    Raw,
}

macro_rules! files {
    ($(($name:literal, $layout:ident)),* $(,)?) => {
        /// Every file of `templates/`: its path there, how it is read, its text. A test checks
        /// that the list matches the directory.
        pub const FILES: &[(&str, Layout, &str)] = &[
            $(($name, Layout::$layout, include_str!(concat!("../../templates/", $name))),)*
        ];
    };
}

files![
    ("apply/failure_issue.md.j2", Verbatim),
    ("apply/log.txt.j2", Verbatim),
    ("apply/plan_changed.md.j2", Verbatim),
    ("apply/refusal.j2", Verbatim),
    ("apply/result_note.md.j2", Verbatim),
    ("apply/status.txt.j2", Verbatim),
    ("check_config.txt.j2", Blocks),
    ("check_config_error.txt.j2", Blocks),
    ("comments/command_moved.md.j2", Verbatim),
    ("comments/command_refused.md.j2", Verbatim),
    ("comments/fork_notice.md.j2", Verbatim),
    ("comments/help.md.j2", Verbatim),
    ("comments/merged_banner.md.j2", Verbatim),
    ("comments/plan_args_refused.md.j2", Verbatim),
    ("comments/targeted_banner.md.j2", Verbatim),
    ("comments/applied_banner.md.j2", Verbatim),
    ("comments/approved_banner.md.j2", Verbatim),
    ("comments/policy_approval.md.j2", Blocks),
    ("doctor.j2", Blocks),
    ("drift/issue.md.j2", Verbatim),
    ("drift/terminal.txt.j2", Blocks),
    ("lint.j2", Blocks),
    ("local_progress.txt.j2", Verbatim),
    ("note.md.j2", Blocks),
    ("network.txt.j2", Verbatim),
    ("note_phrases.j2", Blocks),
    ("pages/home.html", Verbatim),
    ("pages/layout.html", Verbatim),
    ("pages/message.html", Verbatim),
    ("pages/not_found.html", Verbatim),
    ("pages/pages.css", Raw),
    ("pages/run.html", Verbatim),
    ("pages/runs.html", Verbatim),
    ("plan_request.txt.j2", Verbatim),
    ("plan_status.txt.j2", Verbatim),
    ("policy.txt.j2", Verbatim),
    ("policy_test.txt.j2", Blocks),
    ("privileges.j2", Blocks),
    ("readyz.txt.j2", Verbatim),
    ("planbot-apply.yml", Raw),
    ("repo_config_error.md.j2", Blocks),
    ("repo_config_preview.md.j2", Blocks),
    ("sandbox.txt.j2", Verbatim),
    ("state.txt.j2", Verbatim),
    ("widgets.txt.j2", Verbatim),
];

/// The pages' stylesheet (`templates/pages/pages.css`).
pub const STYLESHEET: &str = include_str!("../../templates/pages/pages.css");

/// The CI/CD component with the manual `planbot-apply` job (`templates/planbot-apply.yml`).
pub const APPLY_CI: &str = include_str!("../../templates/planbot-apply.yml");

/// The text of a file of `templates/` as written (for the [`Layout::Raw`] files).
pub fn file(name: &str) -> Option<&'static str> {
    FILES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, _, text)| *text)
}

fn build() -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_formatter(scrubbing_formatter);
    env.add_filter("html", |s: String| markdown::html_escape(&s));
    env.add_filter("code", |s: String| markdown::code_span(&s));
    env.add_filter("cell", |s: String| markdown::table_code(&s));
    env.add_filter("celltext", |s: String| markdown::table_text(&s));
    env.add_filter("text", |s: String| markdown::inline_text(&s));
    env.add_filter("mermaid", |s: String| markdown::mermaid_label(&s));
    for layout in [Layout::Verbatim, Layout::Blocks] {
        let blocks = layout == Layout::Blocks;
        env.set_trim_blocks(blocks);
        env.set_lstrip_blocks(blocks);
        env.set_keep_trailing_newline(blocks);
        for (name, _, text) in FILES.iter().filter(|(_, l, _)| *l == layout) {
            env.add_template(name, text)?;
        }
    }
    Ok(env)
}

thread_local! {
    /// The scrubber of the render running on this thread, set by [`scrubbing`].
    static SCRUBBER: RefCell<Option<Rc<dyn Scrub>>> = const { RefCell::new(None) };
}

/// minijinja's own formatter, with every printed value (not the template's text) scrubbed when
/// a [`scrubbing`] scope is active. Safe strings are planbot's own rendered text: as they are.
fn scrubbing_formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    let scrubbed = SCRUBBER.with(|s| {
        let s = s.borrow();
        let scrubber = s.as_ref().filter(|sc| !sc.is_empty() && !value.is_safe())?;
        let text = value.to_string();
        let text = scrubber.scrub(&text);
        Some(match state.auto_escape() {
            AutoEscape::Html => minijinja::HtmlEscape(&text).to_string(),
            _ => text.into_owned(),
        })
    });
    match scrubbed {
        Some(text) => out.write_str(&text).map_err(Error::from),
        None => minijinja::escape_formatter(out, state, value),
    }
}

/// Run `f` (which renders templates on this thread) with every value the templates print
/// scrubbed by `scrubber`; the templates' own words are never touched. Scopes nest: the inner
/// scrubber applies inside, the outer one again after.
pub fn scrubbing<R, S: Scrub + Clone + 'static>(scrubber: &S, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Rc<dyn Scrub>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            SCRUBBER.with(|s| *s.borrow_mut() = previous);
        }
    }
    let scrubber: Rc<dyn Scrub> = Rc::new(scrubber.clone());
    let previous = SCRUBBER.with(|s| s.borrow_mut().replace(scrubber));
    let _restore = Restore(previous);
    f()
}

static ENV: LazyLock<Result<Environment<'static>, Error>> = LazyLock::new(build);

/// Parse every template and evaluate the top level of each (the macro-only ones define their
/// macros there): called at start-up so that a broken template stops planbot at once.
pub fn check() -> Result<(), Error> {
    let env = ENV
        .as_ref()
        .map_err(|e| Error::new(e.kind(), format!("{e:#}")))?;
    for (name, layout, _) in FILES {
        if *layout != Layout::Raw && is_macros(name) {
            env.get_template(name)?.render_captured(())?;
        }
    }
    Ok(())
}

/// Templates that only define macros or values (rendered through [`with_state`]).
fn is_macros(name: &str) -> bool {
    matches!(
        name,
        "apply/refusal.j2" | "doctor.j2" | "lint.j2" | "note_phrases.j2" | "privileges.j2"
    )
}

/// The environment ([`check`] has made sure at start-up that it builds).
pub fn env() -> &'static Environment<'static> {
    match ENV.as_ref() {
        Ok(env) => env,
        Err(e) => panic!("templates/ do not parse: {e:#}"),
    }
}

/// One template by its path under `templates/`.
pub fn get(name: &str) -> Result<Template<'static, 'static>, Error> {
    env().get_template(name)
}

/// Render `name` with `ctx`.
pub fn render(name: &str, ctx: Value) -> Result<String, Error> {
    get(name)?.render(ctx)
}

/// One text of a template that holds several, picked by `kind` (`plan_status.txt.j2`,
/// `apply/log.txt.j2`…): exactly as the template writes it. A template that cannot render it
/// (an unknown kind) gives `planbot: <name> <kind> (<error>)` instead.
pub fn text(name: &str, kind: &str, ctx: Value) -> String {
    let ctx = minijinja::context! { kind => kind, ..ctx };
    render(name, ctx).unwrap_or_else(|e| format!("planbot: {name} {kind} ({e})"))
}

thread_local! {
    /// Each macro template evaluated once per thread (it defines macros and values only): its
    /// macros are then called on this state instead of evaluating the template again.
    static STATES: RefCell<HashMap<&'static str, minijinja::Captured<'static>>> =
        RefCell::new(HashMap::new());
}

/// Run `f` on the state of the macro template `name` (evaluated once per thread, without a
/// context), for calling its macros and reading its values.
pub fn with_state<R>(name: &'static str, f: impl FnOnce(&State) -> R) -> Result<R, Error> {
    STATES.with(|states| {
        if !states.borrow().contains_key(name) {
            let captured = get(name)?.render_captured(())?;
            states.borrow_mut().insert(name, captured);
        }
        let states = states.borrow();
        Ok(f(states[name].state()))
    })
}

/// Call the macro `name` of the macro template `template` with one argument.
pub fn call_macro(template: &'static str, name: &str, arg: &Value) -> Result<String, Error> {
    with_state(template, |state| {
        state.call_macro(name, std::slice::from_ref(arg))
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_parses_and_evaluates() {
        check().expect("templates check");
    }

    #[test]
    fn scrubbing_hides_values_and_never_touches_the_templates_words() {
        // Secrets that are common words: a password "apply", a passphrase "plan".
        let mut secrets = crate::core::redact::Secrets::new();
        secrets.extend(["apply", "plan"]);
        let scrubber = secrets.scrubber();
        let verdict = scrubbing(&scrubber, || {
            text("apply/log.txt.j2", "succeeded", minijinja::context! {})
        });
        assert_eq!(verdict, "planbot: apply succeeded");
        let line = scrubbing(&scrubber, || {
            text(
                "apply/log.txt.j2",
                "planning",
                minijinja::context! { root => "core", dir => "stacks/plan" },
            )
        });
        assert_eq!(
            line,
            "planbot: root `core`: planning `stacks/(sensitive value)`"
        );
        // Planbot's own rendered text passed on as a safe string is written as it is.
        let refused = scrubbing(&scrubber, || {
            text(
                "apply/log.txt.j2",
                "refused",
                minijinja::context! { why => Value::from_safe_string("the plan changed".into()) },
            )
        });
        assert_eq!(refused, "planbot: apply refused: the plan changed");
        // Outside a scope nothing is scrubbed; scopes nest and restore.
        let plain = text(
            "apply/log.txt.j2",
            "planning",
            minijinja::context! { root => "core", dir => "plan" },
        );
        assert_eq!(plain, "planbot: root `core`: planning `plan`");
        let inner = crate::core::redact::Scrubber::none();
        scrubbing(&scrubber, || {
            scrubbing(&inner, || assert!(render_plan_dir().ends_with("`plan`")));
            assert!(render_plan_dir().ends_with("`(sensitive value)`"));
        });
    }

    fn render_plan_dir() -> String {
        text(
            "apply/log.txt.j2",
            "planning",
            minijinja::context! { root => "core", dir => "plan" },
        )
    }

    #[test]
    fn the_list_is_the_directory() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
        let mut on_disk = Vec::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    let rel = path.strip_prefix(&root).unwrap();
                    on_disk.push(rel.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        on_disk.sort();
        let mut listed: Vec<String> = FILES.iter().map(|(n, _, _)| n.to_string()).collect();
        listed.sort();
        assert_eq!(
            listed, on_disk,
            "templates::FILES lists every file of templates/"
        );
    }
}
