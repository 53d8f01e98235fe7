//! The plan note once every failing policy set of the plans it shows is approved: the edit
//! `planbot approve policies` makes, saying what a re-plan of the same head would (each failing
//! set ☑️ with its approvers, no "the apply waits" line, a headline no longer red) and a banner
//! above the headline naming the approvals.

use crate::core::templates;
use std::collections::BTreeMap;

/// Marks the approval banner inside the plan note (the line after it is the banner).
pub const APPROVED_BANNER_MARKER: &str = "<!-- planbot:approved -->";

/// `body` (the plan note) with `approvers` (each approved failing set and who approved it, as
/// the note shows them) marked approved, the banner put above the headline (replacing an
/// earlier one), and, when `plans_ok` (the plans themselves succeeded: only the policies made
/// the headline red), the headline turned yellow: a failing set overridden by its owners is
/// worth a look, not green.
pub fn approved_note(
    body: &str,
    sha8: &str,
    approvers: &BTreeMap<String, Vec<String>>,
    plans_ok: bool,
) -> String {
    let sets: Vec<minijinja::Value> = approvers
        .iter()
        .map(|(set, names)| minijinja::context! { set => set, approvers => names })
        .collect();
    let banner = templates::text(
        "comments/approved_banner.md.j2",
        "banner",
        minijinja::context! { sets => &sets, sha => sha8 },
    );
    let failing: BTreeMap<String, String> = approvers
        .iter()
        .map(|(set, names)| {
            let line = templates::text(
                "comments/approved_banner.md.j2",
                "failing_line",
                minijinja::context! { set => set },
            );
            let suffix = templates::text(
                "comments/approved_banner.md.j2",
                "approved_suffix",
                minijinja::context! { approvers => names },
            );
            (line.trim().to_string(), suffix.trim().to_string())
        })
        .collect();
    let mut out: Vec<String> = Vec::new();
    let mut lines = body.lines();
    let mut headline_seen = false;
    while let Some(line) = lines.next() {
        if line == APPROVED_BANNER_MARKER {
            // The earlier banner: replaced below.
            lines.next();
            continue;
        }
        if line.starts_with("  - The apply waits for an owner to comment")
            || (line.starts_with("_The approval of ")
                && line.ends_with("the new push cleared it._"))
        {
            continue;
        }
        if let Some(rest) = line.strip_prefix("- ❌ ") {
            let approved = failing
                .iter()
                .find(|(prefix, _)| line.starts_with(prefix.as_str()));
            if let Some((_, suffix)) = approved {
                out.push(format!("- ☑️ {rest} {suffix}"));
                continue;
            }
        }
        if !headline_seen && line.starts_with("### ") {
            headline_seen = true;
            // The banner right above the headline (below the merged banner, if any).
            out.push(APPROVED_BANNER_MARKER.to_string());
            out.push(banner.trim().to_string());
            match line.strip_prefix("### 🔴") {
                Some(rest) if plans_ok => out.push(format!("### 🟡{rest}")),
                _ => out.push(line.to_string()),
            }
            continue;
        }
        out.push(line.to_string());
    }
    let mut text = out.join("\n");
    if body.ends_with('\n') {
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTE: &str = "<!-- planbot:mr-note v1 -->\n### 🔴 planbot · plan for `2222bbbb` · 1 root with changes\n\n**Policies** · sets from the default branch `main`\n\n- ❌ `new-vms` (`policies`): failed\n  - ❌ terraform_data.vm is a new VM\n  - The apply waits for an owner to comment `planbot approve policies`: members of `infra/capacity`.\n- ✅ `backups` (planbot's): passed\n\n_The approval of `new-vms` by @dana was for the plan of `1111aaaa`: the new push cleared it._\n";

    #[test]
    fn every_failing_set_approved_turns_the_note_yellow_under_a_banner() {
        let approvers = BTreeMap::from([("new-vms".to_string(), vec!["carol".to_string()])]);
        let once = approved_note(NOTE, "2222bbbb", &approvers, true);
        insta::assert_snapshot!("approved_note", once);
        // Approved again (another owner): one banner, the same lines.
        let twice = approved_note(&once, "2222bbbb", &approvers, true);
        assert_eq!(twice.matches(APPROVED_BANNER_MARKER).count(), 1, "{twice}");
        // A plan that failed stays red whatever the policies say.
        let red = approved_note(NOTE, "2222bbbb", &approvers, false);
        assert!(red.contains("### 🔴 planbot"), "{red}");
    }
}
