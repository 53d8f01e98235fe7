//! "Did you mean …?": the known word nearest to a misspelled one, for config keys, sections,
//! `PLANBOT_*` variables and rule ids.

/// The candidate nearest to `word` (ASCII case ignored), when it is near enough to be a typo of
/// it: at most a third of its letters wrong (at least one), by Damerau-Levenshtein distance
/// (a swap of two neighbours counts once).
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    let len = word.chars().count();
    let limit = (len / 3).max(1);
    candidates
        .into_iter()
        // The lengths' difference is at least the distance: a candidate farther than the limit
        // by length alone is never compared (a comparison costs the product of the lengths, and
        // a hostile word may be a MiB long).
        .filter(|c| c.chars().count().abs_diff(len) <= limit)
        .map(|c| {
            (
                strsim::damerau_levenshtein(&word, &c.to_ascii_lowercase()),
                c,
            )
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// ` (did you mean `x`?)`, or nothing when no candidate is near.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    nearest(word, candidates)
        .map(|c| format!(" (did you mean `{c}`?)"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_finds_its_word_and_a_stranger_finds_none() {
        let keys = ["binary", "timeout", "lock_timeout", "grace"];
        assert_eq!(nearest("binray", keys), Some("binary"));
        assert_eq!(nearest("timeuot", keys), Some("timeout"));
        assert_eq!(nearest("TIMEOUT", keys), Some("timeout"));
        assert_eq!(nearest("colour", keys), None);
        assert_eq!(
            nearest("PVE999", ["PVE009", "PVE010", "PVE101"]),
            Some("PVE009")
        );
        assert_eq!(nearest("XYZ123", ["PVE009", "PVE101"]), None);
        assert_eq!(
            did_you_mean("gitlb", ["gitlab", "engine"]),
            " (did you mean `gitlab`?)"
        );
        assert_eq!(did_you_mean("zzz", ["gitlab"]), "");
    }
}
