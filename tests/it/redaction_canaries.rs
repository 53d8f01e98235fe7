//! Canary secrets planted on every surface where a real engine's output holds secrets in clear
//! never reach anything planbot prints: logs, errors, the JSON report, the note.

use crate::support::fake_engine as fake;

use base64::Engine as _;
use planbot::capabilities::engine::{Engine, PlanRequest, PlannedRun};
use planbot::core::redact::REDACTED;
use planbot::flows::cli::render::{self as report, Format};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const VAR_VALUE: &str = "cnry-var-value-0a1b2c";
const VAR_DEFAULT: &str = "cnry-var-default-3d4e5f";
const LITERAL: &str = "cnry-literal-sensitive-6a7b";
const OUTPUT: &str = "cnry-sensitive-output-8c9d";
const COPY: &str = "cnry-computed-copy-1e2f";
const CHECK: &str = "cnry-check-message-3a4b";
const KEY_LINE_1: &str = "cnry-multi-line-key-aaaa1111";
const KEY_LINE_2: &str = "cnry-multi-line-key-bbbb2222";
const USER_PW: &str = "cnry-nonsensitive-copy-7e8f";
const ENV_TOKEN: &str = "cnry-engine-env-5c6d";

fn canaries() -> Vec<String> {
    let mut all: Vec<String> = [
        VAR_VALUE,
        VAR_DEFAULT,
        LITERAL,
        OUTPUT,
        COPY,
        CHECK,
        KEY_LINE_1,
        KEY_LINE_2,
        USER_PW,
        ENV_TOKEN,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Their base64 forms are secrets too.
    let b64: Vec<String> = all
        .iter()
        .map(|c| base64::engine::general_purpose::STANDARD.encode(c))
        .collect();
    all.extend(b64);
    all
}

fn assert_no_canary(what: &str, text: &str) {
    assert_no_canary_but(what, text, &[]);
}

/// Like `assert_no_canary`, except for `known_only_to_the_runner` (a configured engine env
/// value that `planbot render`, given only the JSON, cannot know about).
fn assert_no_canary_but(what: &str, text: &str, known_only_to_the_runner: &[&str]) {
    let skip: Vec<String> = known_only_to_the_runner
        .iter()
        .flat_map(|c| {
            [
                c.to_string(),
                base64::engine::general_purpose::STANDARD.encode(c),
            ]
        })
        .collect();
    for c in canaries().into_iter().filter(|c| !skip.contains(c)) {
        assert!(!text.contains(&c), "{what} leaks {c}:\n{text}");
    }
    // A secret inside a longer base64 text (the Ignition data URL) is gone too.
    assert!(
        !text.contains("Y25yeS1ub25zZW5zaXRpdmUtY29weS03ZThm"),
        "{what} leaks base64 of {USER_PW}"
    );
}

fn tfvars() -> String {
    format!(
        "admin_password = \"{VAR_VALUE}\"\ncopy_source = \"{COPY}\"\ncheck_secret = \"{CHECK}\"\nuser_password = \"{USER_PW}\"\ntls_key = <<EOT\n-----BEGIN CANARY KEY-----\n{KEY_LINE_1}\n{KEY_LINE_2}\n-----END CANARY KEY-----\nEOT\n"
    )
}

fn canary_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/engine/canaries/main.tf");
    std::fs::copy(src, dir.path().join("main.tf")).unwrap();
    std::fs::write(dir.path().join("terraform.tfvars"), tfvars()).unwrap();
    dir
}

fn engine(bin: &Path, temp_root: &Path) -> Engine {
    Engine::builder(bin, temp_root)
        .env([("TF_VAR_api_token".to_string(), ENV_TOKEN.to_string())].into())
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// Apply once (so state holds the unmasked computed copy), then plan a change.
async fn second_plan(bin: &Path, root: &Path, temp_root: &Path) -> PlannedRun {
    let engine = engine(bin, temp_root);
    let first = engine.plan(root, &PlanRequest::default()).await.unwrap();
    // The first plan creates everything: the note shows every attribute, masked and scrubbed.
    let ctx = planbot::core::render::NoteContext::default();
    let note = report::report(first.plan(), &ctx, first.secrets(), b"k", Format::Markdown);
    assert_no_canary("the note of the first plan", &note);
    assert!(
        note.contains("#cloud-config"),
        "the cloud-init text is shown: {note}"
    );
    assert!(
        note.contains(&format!("root:{REDACTED}")),
        "its password is not: {note}"
    );
    assert!(note.contains(&format!("api token is {REDACTED}")), "{note}");
    let json = report::report(first.plan(), &ctx, first.secrets(), b"k", Format::Json);
    assert_no_canary("the JSON report of the first plan", &json);
    let mut streamed = Vec::new();
    let applied = first
        .apply_streaming(|l| streamed.push(l.to_string()))
        .await
        .unwrap();
    assert_no_canary("the streamed apply", &streamed.join("\n"));
    assert_no_canary("the apply log", &applied.log);
    std::fs::write(
        root.join("terraform.tfvars"),
        format!("{}generation = 2\n", tfvars()),
    )
    .unwrap();
    engine.plan(root, &PlanRequest::default()).await.unwrap()
}

#[tokio::test]
async fn every_surface_of_a_real_plan_is_scrubbed() {
    let bin = require_engine!();
    let root = canary_root();
    let temp_root = tempfile::tempdir().unwrap();
    let run = second_plan(&bin, root.path(), temp_root.path()).await;

    // The canaries really are in the engine's raw output, on their surfaces.
    let raw = String::from_utf8_lossy(run.plan_json()).into_owned();
    for c in [
        VAR_VALUE,
        VAR_DEFAULT,
        LITERAL,
        OUTPUT,
        COPY,
        CHECK,
        USER_PW,
        ENV_TOKEN,
    ] {
        assert!(raw.contains(c), "the raw plan should hold {c}");
    }
    assert!(
        raw.contains(KEY_LINE_1) && raw.contains("\\n"),
        "multi-line, JSON-escaped"
    );
    let plan = run.plan();
    let echo = plan
        .resource_changes
        .iter()
        .find(|rc| rc.address == "terraform_data.echo")
        .unwrap()
        .change
        .values();
    let echo = echo.get();
    assert_eq!(
        echo.before.get("output").as_str(),
        Some(COPY),
        "a computed copy, in clear"
    );
    assert_ne!(
        echo.before_sensitive.get("output").as_bool(),
        Some(true),
        "and not masked"
    );
    assert!(
        raw.contains("\"problems\""),
        "the check message is in the JSON"
    );

    // Scrubbing the whole raw document removes every one of them.
    let scrubbed = run.scrubber().scrub(&raw);
    assert_no_canary("the scrubbed raw show -json", &scrubbed);
    assert!(scrubbed.contains(REDACTED));

    // The engine's log had the check warning with the secrets in clear: redacted.
    assert!(
        run.log()
            .contains("check_secret (sensitive value) is too short"),
        "{}",
        run.log()
    );
    assert_no_canary("the plan log", run.log());

    // What planbot prints: the note and the JSON report, from the shared renderer.
    let ctx = planbot::core::render::NoteContext {
        engine: Some(run.version().to_string()),
        ..Default::default()
    };
    for format in [Format::Markdown, Format::Json] {
        let out = report::report(plan, &ctx, run.secrets(), b"k", format);
        assert!(out.contains("terraform_data.cloudinit"), "{out}");
        assert_no_canary(&format!("the {format:?} report"), &out);
    }

    // What the store keeps of it for a later push (`core::kept_plan`): no canary, and read back
    // with its secrets as digests, the same note.
    let key = planbot::core::redact::DigestKey::derive(b"k");
    let kept =
        planbot::core::kept_plan::redacted_document(run.plan_json(), run.scrubber(), key).unwrap();
    let kept_text = String::from_utf8(kept.clone()).unwrap();
    assert_no_canary("the kept plan", &kept_text);
    assert_no_canary(
        "the kept plan's digests",
        &serde_json::to_string(&run.secrets().digests(key)).unwrap(),
    );
    let kept_plan = planbot::core::plan::Plan::from_json(&kept).unwrap();
    let mut known = planbot::core::redact::Secrets::from_plan(&kept_plan);
    known.add_digests(key, &run.secrets().digests(key));
    // (The fingerprint `planbot render` computes differs: the service keeps the plan's own.)
    let without_fingerprint = |note: String| {
        let (head, tail) = note.split_once("fingerprint `").unwrap();
        format!("{head}{}", &tail[tail.find('`').unwrap()..])
    };
    assert_eq!(
        without_fingerprint(report::report(
            &kept_plan,
            &ctx,
            &known,
            b"k",
            Format::Markdown
        )),
        without_fingerprint(report::report(
            plan,
            &ctx,
            run.secrets(),
            b"k",
            Format::Markdown
        )),
        "the kept plan's note is the plan's"
    );

    // `planbot render` of the raw document: it knows only what the plan says is secret.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), run.plan_json()).unwrap();
    for format in ["markdown", "json"] {
        let out = Command::new(env!("CARGO_BIN_EXE_planbot"))
            .arg("render")
            .arg(file.path())
            .args(["--format", format])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("cloudinit"), "{text}");
        assert_no_canary_but(
            &format!("planbot render --format {format}"),
            &text,
            &[ENV_TOKEN],
        );
    }

    let report = planbot::core::summary::PlanReport::new(
        plan,
        run.fingerprint(b"k").to_string(),
        planbot::core::proxmox::lint::lint(plan, &[]),
    );
    let report = serde_json::to_string(
        &run.scrubber()
            .scrub_json(&serde_json::to_value(&report).unwrap()),
    )
    .unwrap();
    assert_no_canary("the JSON report", &report);
    // The fingerprint's projection hides every value the plan itself knows as secret (the
    // configured env token is an operator secret the plan does not mark: it is hidden from
    // output by the scrubber, and the projection itself is never printed).
    let projection = planbot::core::fingerprint::projection(plan, b"k", run.lock_file());
    for c in canaries().iter().filter(|c| {
        !c.contains(ENV_TOKEN) && **c != base64::engine::general_purpose::STANDARD.encode(ENV_TOKEN)
    }) {
        assert!(
            !projection.contains(c.as_str()),
            "the projection holds {c}: {projection}"
        );
    }
    assert!(!projection.contains("Y25yeS1ub25zZW5zaXRpdmUtY29weS03ZThm"));
}

#[tokio::test]
async fn planbot_plan_prints_no_canary_in_either_format() {
    let bin = require_engine!();
    let root = canary_root();
    let temp_root = tempfile::tempdir().unwrap();
    // State with the computed copy in it, as above.
    drop(second_plan(&bin, root.path(), temp_root.path()).await);

    for format in ["markdown", "json"] {
        let tmp = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_planbot"))
            .arg("plan")
            .arg(root.path())
            .args(["--engine", bin.to_str().unwrap(), "--format", format])
            .env("TMPDIR", tmp.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
        // This run was not given the engine env, so it cannot know the api token that the
        // earlier (configured) apply stored in state in a non-sensitive attribute.
        assert_no_canary_but(
            &format!("planbot plan --format {format}"),
            &stdout,
            &[ENV_TOKEN],
        );
        assert_no_canary("stderr", &stderr);
        assert_eq!(fake::leftovers(tmp.path()), Vec::<String>::new());
    }
}
