//! Rules on snippet files (PVE012: Ignition spec newer than Flatcar stable understands; PVE015:
//! an upload that needs SSH when the apply has none).

use super::model::{after, is_planned, Kind};
use super::{finding, Finding, LintInput};
use base64::Engine as _;
use serde_json::{json, Value};

/// The newest Ignition config spec that Flatcar stable's Ignition (2.24) accepts.
const NEWEST_SUPPORTED: (u64, u64, u64) = (3, 5, 0);

/// The text of a snippet: plain, or a `data:` URL (`data:;base64,...` or percent-encoded).
pub(crate) fn decode_snippet(data: &str) -> Option<String> {
    let Some(rest) = data.trim_start().strip_prefix("data:") else {
        return Some(data.to_string());
    };
    let (meta, payload) = rest.split_once(',')?;
    if meta.ends_with(";base64") {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(payload.trim())
            .ok()?;
        String::from_utf8(bytes).ok()
    } else {
        Some(
            url::form_urlencoded::parse(format!("x={}", payload.replace('+', "%2B")).as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default(),
        )
    }
}

fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
        parts.next().flatten().unwrap_or(0),
    ))
}

/// PVE012: a snippet whose Ignition `ignition.version` is newer than 3.5.0.
pub fn pve012(input: &LintInput) -> Vec<Finding> {
    input
        .index
        .files(Kind::File)
        .filter(|rc| is_planned(rc))
        .filter_map(|rc| {
            if after(rc, "content_type").str()? != "snippets" {
                return None;
            }
            let text = decode_snippet(after(rc, "source_raw.0.data").str()?)?;
            let doc: Value = serde_json::from_str(&text).ok()?;
            let version = doc.get("ignition")?.get("version")?.as_str()?;
            if parse_version(version)? <= NEWEST_SUPPORTED {
                return None;
            }
            Some(finding(
                "PVE012",
                &rc.address,
                json!({
                    "version": version,
                    "file_name": after(rc, "source_raw.0.file_name").str(),
                }),
            ))
        })
        .collect()
}

/// PVE015: a snippet is uploaded (the bpg provider does that over SSH to the node) and the
/// service's apply has no SSH credentials (`[proxmox.apply] ssh_*` or `PROXMOX_VE_SSH_*`).
pub fn pve015(input: &LintInput) -> Vec<Finding> {
    if input.facts.apply_ssh != Some(false) {
        return Vec::new();
    }
    input
        .index
        .files(Kind::File)
        .filter(|rc| is_planned(rc))
        .filter(|rc| after(rc, "content_type").str() == Some("snippets"))
        .map(|rc| {
            finding(
                "PVE015",
                &rc.address,
                json!({ "node": after(rc, "node_name").str() }),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_data_urls() {
        assert_eq!(
            decode_snippet("data:;base64,eyJhIjoxfQ==").as_deref(),
            Some("{\"a\":1}")
        );
        assert_eq!(
            decode_snippet("data:,%7B%22a%22%3A1%7D").as_deref(),
            Some("{\"a\":1}")
        );
        assert_eq!(decode_snippet("{}").as_deref(), Some("{}"));
    }

    #[test]
    fn compares_versions_numerically() {
        assert!(parse_version("3.6.0").unwrap() > NEWEST_SUPPORTED);
        assert!(parse_version("3.10.0").unwrap() > NEWEST_SUPPORTED);
        assert!(parse_version("3.5.0").unwrap() <= NEWEST_SUPPORTED);
        assert!(parse_version("3.4.0-experimental").unwrap() <= NEWEST_SUPPORTED);
    }
}
