//! The plan fingerprint over real engine plans: same plan → same fingerprint, any change → another.

use crate::support::tf_root as tf;

use planbot::core::fingerprint::{projection, Fingerprint};
use planbot::core::plan::Plan;
use tf::TfRoot;

const KEY: &[u8] = b"test-fingerprint-key";
const SECRET: &str = "fp-canary-sensitive-7d1e";

const ROOT: &str = r#"
variable "size"     { default = "small" }
variable "name"     { default = "web" }
variable "greeting" { default = "hello" }
variable "password" {
  type      = string
  sensitive = true
}
resource "terraform_data" "vm" {
  for_each = toset([var.name])
  input    = { size = var.size, name = each.key }
}
resource "terraform_data" "pw" {
  input = var.password
}
output "greeting" { value = var.greeting }
"#;

fn fp(json: &[u8]) -> Fingerprint {
    Fingerprint::of(&Plan::from_json(json).expect("a plan"), KEY)
}

#[test]
fn two_plans_of_the_same_code_made_at_different_times_have_the_same_fingerprint() {
    let engine = require_engine!();
    let root = TfRoot::new(&engine, &[("main.tf", ROOT)]);
    let vars = [("password", SECRET)];
    let first = root.plan_json(&vars);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let second = root.plan_json(&vars);
    assert_ne!(first, second, "the documents differ (timestamp) yet");
    assert_eq!(fp(&first), fp(&second));

    // Also with a prior state, for an in-place update.
    root.apply(&vars);
    let a = root.plan_json(&[("password", SECRET), ("size", "large")]);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let b = root.plan_json(&[("password", SECRET), ("size", "large")]);
    assert_eq!(fp(&a), fp(&b));
}

#[test]
fn any_change_in_what_would_happen_changes_the_fingerprint() {
    let engine = require_engine!();
    let root = TfRoot::new(&engine, &[("main.tf", ROOT)]);
    root.apply(&[("password", SECRET)]);
    let base = root.plan_json(&[("password", SECRET), ("size", "large")]);
    let base_fp = fp(&base);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "a planned value",
            root.plan_json(&[("password", SECRET), ("size", "huge")]),
        ),
        (
            "an address (and action)",
            root.plan_json(&[("password", SECRET), ("size", "large"), ("name", "db")]),
        ),
        (
            "an output",
            root.plan_json(&[("password", SECRET), ("size", "large"), ("greeting", "hi")]),
        ),
        (
            "only a sensitive value",
            root.plan_json(&[("password", "fp-canary-other-value"), ("size", "large")]),
        ),
    ];
    for (what, json) in &cases {
        assert_ne!(
            base_fp,
            fp(json),
            "changing {what} must change the fingerprint"
        );
    }

    // An import of the same resource is another plan too.
    root.write(
        "import.tf",
        r#"
resource "terraform_data" "imported" { input = "x" }
import {
  to = terraform_data.imported
  id = "abc"
}
"#,
    );
    let with_import = root.plan_json(&[("password", SECRET), ("size", "large")]);
    root.write(
        "import.tf",
        r#"resource "terraform_data" "imported" { input = "x" }"#,
    );
    let without_import = root.plan_json(&[("password", SECRET), ("size", "large")]);
    root.remove("import.tf");
    let plan = Plan::from_json(&with_import).unwrap();
    assert!(plan.resource_changes.iter().any(|rc| rc.is_import()));
    assert_ne!(fp(&with_import), fp(&without_import));
    assert_ne!(fp(&with_import), base_fp);

    // The same plan under another key, or another provider lock file, is another fingerprint.
    let p = Plan::from_json(&base).unwrap();
    assert_ne!(Fingerprint::of(&p, b"another key"), base_fp);
    assert_ne!(Fingerprint::of_with_lock(&p, KEY, Some(b"# lock")), base_fp);
}

#[test]
fn neither_the_fingerprint_nor_its_projection_reveals_a_sensitive_value() {
    let engine = require_engine!();
    let root = TfRoot::new(&engine, &[("main.tf", ROOT)]);
    root.apply(&[("password", SECRET)]);
    // The password changes: the resource's input (sensitive) and its output change.
    let json = root.plan_json(&[("password", "fp-canary-rotated-91ab")]);
    let text = String::from_utf8_lossy(&json);
    assert!(
        text.contains("fp-canary-rotated-91ab"),
        "the raw plan holds it in clear"
    );
    let plan = Plan::from_json(&json).unwrap();
    let proj = projection(&plan, KEY, None);
    assert!(proj.contains("terraform_data.pw"), "{proj}");
    for secret in [SECRET, "fp-canary-rotated-91ab"] {
        assert!(!proj.contains(secret), "projection leaks {secret}: {proj}");
    }
    // The value is in the projection as its keyed HMAC only: the fingerprint still tells
    // another password apart (a hex digest cannot hold the canary, so that is what to check).
    assert!(proj.contains("h64:"), "{proj}");
    let other =
        Plan::from_json(&root.plan_json(&[("password", "fp-canary-rotated-0000")])).unwrap();
    assert_ne!(Fingerprint::of(&plan, KEY), Fingerprint::of(&other, KEY));
    let again =
        Plan::from_json(&root.plan_json(&[("password", "fp-canary-rotated-91ab")])).unwrap();
    assert_eq!(Fingerprint::of(&plan, KEY), Fingerprint::of(&again, KEY));
}
