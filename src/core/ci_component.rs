//! The CI/CD component planbot serves to infra repositories (`include: remote:`): the shipped
//! template with this planbot's URL and apply job name as its inputs' defaults.

/// The component as planbot serves it: its `planbot_url` and `job_name` inputs default to this
/// planbot's `public_url` and `apply.job_name`, so `include: remote:` needs no inputs.
pub fn served_component(template: &str, public_url: Option<&str>, job_name: &str) -> String {
    let quote = |v: &str| serde_json::Value::from(v).to_string();
    let mut out = String::with_capacity(template.len() + 128);
    let mut input = "";
    let mut in_spec = true;
    for line in template.lines() {
        if line == "---" {
            in_spec = false;
        }
        if in_spec {
            if let Some(name) = line.strip_prefix("    ").and_then(|l| l.strip_suffix(':')) {
                if !name.starts_with(' ') {
                    input = name;
                    out.push_str(line);
                    out.push('\n');
                    if let (true, Some(url)) = (name == "planbot_url", public_url) {
                        out.push_str(&format!("      default: {}\n", quote(url)));
                    }
                    continue;
                }
            }
            if input == "job_name" && line.trim_start().starts_with("default:") {
                out.push_str(&format!("      default: {}\n", quote(job_name)));
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}
