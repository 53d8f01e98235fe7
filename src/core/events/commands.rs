//! The MR comment commands planbot understands (`planbot plan`, `planbot help`,
//! `planbot approve policies`).

use serde::{Deserialize, Serialize};

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
    match rest.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["plan"] => Some(Command::Plan),
        ["help"] => Some(Command::Help),
        ["approve", "policies"] => Some(Command::ApprovePolicies),
        _ => None,
    }
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
}
