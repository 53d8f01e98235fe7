//! When drift is checked: the `[drift] schedule` (cron, in `[drift] time_zone`) and the rule
//! that decides, from the last tick any replica claimed, whether a tick is due now.
//!
//! Ticks are the schedule's occurrences, in UTC seconds. A tick is due when the latest
//! occurrence at or before now is later than the last claimed tick: after an outage, however
//! many occurrences were missed, only the latest runs, once.

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use std::str::FromStr;

/// A parsed schedule: the cron pattern and the time zone its fields are read in.
#[derive(Debug, Clone)]
pub struct DriftSchedule {
    cron: Cron,
    zone: Tz,
}

/// What is wrong with a `[drift]` setting, said for the operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("`{text}` is not a cron schedule: {reason} (five fields, minute hour day-of-month month day-of-week, e.g. \"0 6 * * *\" for 06:00 every day)")]
    Cron { text: String, reason: String },
    #[error("`{text}` is not a time zone name{hint} (an IANA name such as \"UTC\" or \"Europe/Berlin\")")]
    TimeZone { text: String, hint: String },
}

/// What the scheduler does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Claim and run the tick of this occurrence.
    Run(DateTime<Utc>),
    /// Nothing is due; the next occurrence is then (`None`: the schedule never fires again).
    WaitUntil(Option<DateTime<Utc>>),
}

impl DriftSchedule {
    /// Parse `schedule` (cron: five fields, or six with seconds first; `@daily` and the other
    /// aliases) read in the time zone `time_zone`; both are checked, each error said.
    pub fn parse(schedule: &str, time_zone: &str) -> Result<Self, Vec<ScheduleError>> {
        let cron = Cron::from_str(schedule.trim()).map_err(|e| ScheduleError::Cron {
            text: schedule.to_string(),
            reason: e.to_string(),
        });
        let zone = Tz::from_str(time_zone.trim()).map_err(|_| ScheduleError::TimeZone {
            text: time_zone.to_string(),
            hint: zone_hint(time_zone),
        });
        match (cron, zone) {
            (Ok(cron), Ok(zone)) => Ok(Self { cron, zone }),
            (cron, zone) => Err([cron.err(), zone.err()].into_iter().flatten().collect()),
        }
    }

    /// The first occurrence strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.zone);
        self.cron
            .find_next_occurrence(&local, false)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// The latest occurrence at or before `t`.
    pub fn latest_until(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.zone);
        self.cron
            .find_previous_occurrence(&local, true)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// Whether a tick is due at `now`, given `since`: the last tick any replica claimed, or,
    /// when none ever was, the time this replica started (so a first start runs nothing until
    /// the schedule's next occurrence, and a replica that was down runs the one it missed).
    pub fn due(&self, since: DateTime<Utc>, now: DateTime<Utc>) -> Due {
        match self.latest_until(now) {
            Some(latest) if latest > since => Due::Run(latest),
            _ => Due::WaitUntil(self.next_after(now)),
        }
    }

    /// An occurrence as the operator reads it: in the schedule's time zone.
    pub fn local(&self, t: DateTime<Utc>) -> String {
        self.zone
            .from_utc_datetime(&t.naive_utc())
            .format("%Y-%m-%d %H:%M %Z")
            .to_string()
    }
}

/// " (did you mean `…`?)" for a misspelled zone name, else "".
fn zone_hint(text: &str) -> String {
    let names = chrono_tz::TZ_VARIANTS.iter().map(|z| z.name());
    crate::core::suggest::did_you_mean(text.trim(), names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_daily_schedule_in_a_time_zone_fires_at_that_zones_hour() {
        let s = DriftSchedule::parse("0 6 * * *", "Europe/Berlin").unwrap();
        // 06:00 in Berlin in December is 05:00 UTC; in July, 04:00 UTC.
        assert_eq!(
            s.next_after(utc("2026-12-05T12:00:00Z")),
            Some(utc("2026-12-06T05:00:00Z"))
        );
        assert_eq!(
            s.next_after(utc("2026-07-01T12:00:00Z")),
            Some(utc("2026-07-02T04:00:00Z"))
        );
        assert_eq!(s.local(utc("2026-12-06T05:00:00Z")), "2026-12-06 06:00 CET");
    }

    #[test]
    fn a_time_that_daylight_saving_skips_or_repeats_runs_once_that_day() {
        let s = DriftSchedule::parse("30 2 * * *", "Europe/Berlin").unwrap();
        // 2027-03-28 has no 02:30 in Berlin: the check runs when the clock jumps (03:00 CEST).
        assert_eq!(
            s.next_after(utc("2027-03-27T12:00:00Z")),
            Some(utc("2027-03-28T01:00:00Z"))
        );
        // 2027-10-31 has 02:30 twice: the check runs at the first, then the next day.
        let first = s.next_after(utc("2027-10-30T12:00:00Z")).unwrap();
        assert_eq!(first, utc("2027-10-31T00:30:00Z"));
        assert_eq!(s.next_after(first), Some(utc("2027-11-01T01:30:00Z")));
    }

    #[test]
    fn a_first_start_waits_for_the_next_occurrence() {
        let s = DriftSchedule::parse("0 6 * * *", "UTC").unwrap();
        let started = utc("2026-12-05T11:00:00Z");
        assert_eq!(
            s.due(started, started),
            Due::WaitUntil(Some(utc("2026-12-06T06:00:00Z")))
        );
        // Woken at the occurrence, it is due.
        assert_eq!(
            s.due(started, utc("2026-12-06T06:00:00Z")),
            Due::Run(utc("2026-12-06T06:00:00Z"))
        );
    }

    #[test]
    fn after_an_outage_only_the_latest_missed_tick_runs_once() {
        let s = DriftSchedule::parse("0 6 * * *", "UTC").unwrap();
        let last = utc("2026-12-01T06:00:00Z");
        let now = utc("2026-12-05T11:00:00Z");
        assert_eq!(s.due(last, now), Due::Run(utc("2026-12-05T06:00:00Z")));
        // Once claimed, nothing more is due until tomorrow.
        assert_eq!(
            s.due(utc("2026-12-05T06:00:00Z"), now),
            Due::WaitUntil(Some(utc("2026-12-06T06:00:00Z")))
        );
    }

    #[test]
    fn a_tick_claimed_by_another_replica_is_not_due_again() {
        let s = DriftSchedule::parse("*/15 * * * *", "UTC").unwrap();
        let claimed = utc("2026-12-05T11:15:00Z");
        assert_eq!(
            s.due(claimed, utc("2026-12-05T11:20:00Z")),
            Due::WaitUntil(Some(utc("2026-12-05T11:30:00Z")))
        );
    }

    #[test]
    fn bad_text_says_what_is_wrong_and_how_to_write_it() {
        let e = DriftSchedule::parse("every day", "UTC").unwrap_err();
        assert!(matches!(e[..], [ScheduleError::Cron { .. }]), "{e:?}");
        assert!(e[0].to_string().contains("\"0 6 * * *\""), "{e:?}");
        let e = DriftSchedule::parse("0 6 * * *", "Europe/Berln").unwrap_err();
        assert_eq!(
            e[0].to_string(),
            "`Europe/Berln` is not a time zone name (did you mean `Europe/Berlin`?) (an IANA name such as \"UTC\" or \"Europe/Berlin\")"
        );
        assert_eq!(
            DriftSchedule::parse("61 * * * *", "Mars/Base")
                .unwrap_err()
                .len(),
            2
        );
    }
}
