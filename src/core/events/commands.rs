//! The MR comment commands planbot understands (`planbot plan`, `planbot help`,
//! `planbot approve policies`), and the engine flags of a targeted `planbot plan [ROOT] -- …`.

use crate::core::targeting::{MAX_ADDRESSES, MAX_ADDRESS_LEN};
use serde::{Deserialize, Serialize};

/// What follows `planbot plan` on a targeted plan's comment: `planbot plan -- FLAGS` (every
/// root the MR affects) or `planbot plan ROOT -- FLAGS` (that root only). The words are kept as
/// written (addresses are case-sensitive) and bounded; `core::targeting::Targeting::parse`
/// checks them, and the command's job answers when they are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanArgs {
    /// The root named before `--`; `None`: every root the MR affects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// The words after `--`: at most one more than `MAX_ADDRESSES` (so that too many is
    /// refused as such), each cut at a length no address reaches (so that it is refused).
    pub words: Vec<String>,
}

/// A comment command planbot understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    Plan,
    Help,
    /// An owner approves the failing policy sets of the plan shown (`core::policy::review`).
    ApprovePolicies,
}

impl Command {
    /// The command as written after `planbot`.
    pub fn name(self) -> &'static str {
        match self {
            Command::Plan => "plan",
            Command::Help => "help",
            Command::ApprovePolicies => "approve policies",
        }
    }
}

/// Parse a comment: the first non-empty line must be `planbot <command>` (case-insensitive).
pub fn parse_command(note: &str) -> Option<Command> {
    let line = note.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut words = line.split_whitespace();
    let first = words.next()?.trim_start_matches('/');
    if !first.eq_ignore_ascii_case("planbot") && !first.eq_ignore_ascii_case("@planbot") {
        return None;
    }
    let rest: Vec<String> = words.map(str::to_ascii_lowercase).collect();
    if plan_args(note).is_some() {
        return Some(Command::Plan);
    }
    match rest.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["plan"] => Some(Command::Plan),
        ["help"] => Some(Command::Help),
        ["approve", "policies"] => Some(Command::ApprovePolicies),
        _ => None,
    }
}

/// The engine flags of a `planbot plan [ROOT] -- …` comment (its first non-empty line), as
/// written; `None` for any other comment, a plain `planbot plan` included.
pub fn plan_args(note: &str) -> Option<PlanArgs> {
    let line = note.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut words = line.split_whitespace();
    let first = words.next()?.trim_start_matches('/');
    if !first.eq_ignore_ascii_case("planbot") && !first.eq_ignore_ascii_case("@planbot") {
        return None;
    }
    if !words.next()?.eq_ignore_ascii_case("plan") {
        return None;
    }
    let root = match words.next()? {
        "--" => None,
        root => {
            if words.next()? != "--" {
                return None;
            }
            Some(bounded(root))
        }
    };
    Some(PlanArgs {
        root,
        words: words.take(MAX_ADDRESSES + 1).map(bounded).collect(),
    })
}

/// A word cut at a length no flag with its address reaches (the check refuses it).
fn bounded(word: &str) -> String {
    word.chars().take(MAX_ADDRESS_LEN + 16).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_parsed_strictly() {
        assert_eq!(parse_command("planbot plan"), Some(Command::Plan));
        assert_eq!(
            parse_command("  \n PlanBot HELP \nthanks"),
            Some(Command::Help)
        );
        assert_eq!(parse_command("/planbot plan"), Some(Command::Plan));
        assert_eq!(parse_command("planbot plan please now"), None);
        assert_eq!(parse_command("I think planbot plan is broken"), None);
        assert_eq!(parse_command("planbot apply"), None);
        assert_eq!(
            parse_command("Planbot approve Policies\nchecked with the team"),
            Some(Command::ApprovePolicies)
        );
        assert_eq!(parse_command("planbot approve"), None);
        assert_eq!(parse_command("planbot approve policies now"), None);
        assert_eq!(parse_command(""), None);
    }

    #[test]
    fn a_double_dash_after_plan_carries_the_engine_flags_as_written() {
        let note = "planbot plan -- -target=module.dns.proxmox_virtual_environment_vm.Blocky -replace=x.y\nwhy";
        assert_eq!(parse_command(note), Some(Command::Plan));
        assert_eq!(
            plan_args(note),
            Some(PlanArgs {
                root: None,
                words: vec![
                    "-target=module.dns.proxmox_virtual_environment_vm.Blocky".into(),
                    "-replace=x.y".into()
                ]
            })
        );
        let rooted = plan_args("/planbot PLAN dns -- -chdir=/etc").unwrap();
        assert_eq!(rooted.root.as_deref(), Some("dns"));
        assert_eq!(rooted.words, ["-chdir=/etc"]);
        assert_eq!(
            plan_args("planbot plan --").unwrap().words,
            Vec::<String>::new()
        );
        assert_eq!(plan_args("planbot plan"), None);
        assert_eq!(plan_args("planbot plan dns"), None);
        assert_eq!(plan_args("planbot plan dns core -- -target=a.b"), None);
        assert_eq!(parse_command("planbot plan dns"), None);
        assert_eq!(plan_args("planbot help -- -target=a.b"), None);
        // Bounded: one word more than the limit, each cut.
        let many = format!("planbot plan -- {}", "-target=a.b ".repeat(100));
        assert_eq!(plan_args(&many).unwrap().words.len(), MAX_ADDRESSES + 1);
        let long = format!("planbot plan -- -target=a.{}", "b".repeat(10_000));
        assert_eq!(
            plan_args(&long).unwrap().words[0].len(),
            MAX_ADDRESS_LEN + 16
        );
    }
}
