//! The MR comment commands planbot understands (`planbot plan`, `planbot help`).

use serde::{Deserialize, Serialize};

/// A comment command planbot understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    Plan,
    Help,
}

/// Parse a comment: the first non-empty line must be `planbot <command>` (case-insensitive).
pub fn parse_command(note: &str) -> Option<Command> {
    let line = note.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut words = line.split_whitespace();
    let first = words.next()?.trim_start_matches('/');
    if !first.eq_ignore_ascii_case("planbot") && !first.eq_ignore_ascii_case("@planbot") {
        return None;
    }
    let cmd = words.next()?;
    if words.next().is_some() {
        return None;
    }
    match cmd.to_ascii_lowercase().as_str() {
        "plan" => Some(Command::Plan),
        "help" => Some(Command::Help),
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
        assert_eq!(parse_command(""), None);
    }
}
