//! GitLab's deploy freezes (Settings → CI/CD → Deploy freezes): whether one holds now, and
//! until when, as GitLab itself decides for `$CI_DEPLOY_FREEZE`.
//!
//! A freeze period is two cron patterns read in its time zone: it holds from an occurrence of
//! `freeze_start` to the next occurrence of `freeze_end`. So it holds now when the latest start
//! at or before now is later than the latest end (or no end came yet), and it ends at the next
//! end. A period whose pattern or time zone planbot cannot read is an error, never "open": the
//! apply it guards is refused, saying which period.

use crate::core::drift_schedule::DriftSchedule;
use chrono::{DateTime, Utc};
use serde::Deserialize;

/// One freeze period as GitLab's API gives it (`GET /projects/:id/freeze_periods`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FreezePeriod {
    pub id: u64,
    pub freeze_start: String,
    pub freeze_end: String,
    #[serde(default = "utc")]
    pub cron_timezone: String,
}

fn utc() -> String {
    "UTC".into()
}

/// The freeze that holds now: which period, and when it ends (in its time zone for people).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frozen {
    pub period: FreezePeriod,
    /// The next occurrence of `freeze_end`; `None` when the pattern never fires again.
    pub ends_at: Option<DateTime<Utc>>,
    /// `ends_at` as the period's time zone reads it.
    pub ends_local: Option<String>,
}

/// A period planbot cannot read (its cron pattern or time zone).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("deploy freeze period {id} (`{start}` to `{end}`, {zone}) cannot be read: {why}")]
pub struct FreezeError {
    pub id: u64,
    pub start: String,
    pub end: String,
    pub zone: String,
    pub why: String,
}

/// The first of `periods` that holds at `now`, or none; an unreadable period is an error.
pub fn holding(
    periods: &[FreezePeriod],
    now: DateTime<Utc>,
) -> Result<Option<Frozen>, FreezeError> {
    for p in periods {
        let read = |pattern: &str| {
            DriftSchedule::parse(pattern, &p.cron_timezone).map_err(|errors| FreezeError {
                id: p.id,
                start: p.freeze_start.clone(),
                end: p.freeze_end.clone(),
                zone: p.cron_timezone.clone(),
                why: errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            })
        };
        let (start, end) = (read(&p.freeze_start)?, read(&p.freeze_end)?);
        let Some(started) = start.latest_until(now) else {
            continue;
        };
        if end.latest_until(now).is_some_and(|ended| ended >= started) {
            continue;
        }
        let ends_at = end.next_after(now);
        return Ok(Some(Frozen {
            period: p.clone(),
            ends_at,
            ends_local: ends_at.map(|t| end.local(t)),
        }));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn weekend(zone: &str) -> FreezePeriod {
        // GitLab's docs' example: from Friday 23:00 to Monday 07:00.
        FreezePeriod {
            id: 1,
            freeze_start: "0 23 * * 5".into(),
            freeze_end: "0 7 * * 1".into(),
            cron_timezone: zone.into(),
        }
    }

    #[test]
    fn a_weekend_freeze_holds_from_friday_night_to_monday_morning() {
        // 2026-12-04 is a Friday.
        let at = |d, h, m| Utc.with_ymd_and_hms(2026, 12, d, h, m, 0).unwrap();
        let periods = [weekend("UTC")];
        assert_eq!(holding(&periods, at(4, 22, 59)).unwrap(), None);
        let frozen = holding(&periods, at(4, 23, 0)).unwrap().unwrap();
        assert_eq!(frozen.ends_at, Some(at(7, 7, 0)));
        assert_eq!(frozen.ends_local.as_deref(), Some("2026-12-07 07:00 UTC"));
        assert!(holding(&periods, at(6, 12, 0)).unwrap().is_some());
        assert_eq!(holding(&periods, at(7, 7, 0)).unwrap(), None);
        assert_eq!(holding(&periods, at(9, 12, 0)).unwrap(), None);
    }

    #[test]
    fn the_period_is_read_in_its_time_zone() {
        // 23:00 on Friday in Berlin (UTC+1 in December) is 22:00 UTC.
        let periods = [weekend("Europe/Berlin")];
        let friday = |h| Utc.with_ymd_and_hms(2026, 12, 4, h, 30, 0).unwrap();
        assert_eq!(holding(&periods, friday(21)).unwrap(), None);
        let frozen = holding(&periods, friday(22)).unwrap().unwrap();
        assert_eq!(frozen.ends_local.as_deref(), Some("2026-12-07 07:00 CET"));
    }

    #[test]
    fn a_period_that_cannot_be_read_is_an_error_not_an_open_window() {
        let bad = FreezePeriod {
            freeze_end: "0 7 * *".into(),
            ..weekend("UTC")
        };
        let now = Utc.with_ymd_and_hms(2026, 12, 9, 12, 0, 0).unwrap();
        let err = holding(&[bad], now).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "deploy freeze period 1 (`0 23 * * 5` to `0 7 * *`, UTC) cannot be read:"
            ),
            "{err}"
        );
        let zone = holding(&[weekend("Mars/Olympus")], now).unwrap_err();
        assert!(zone.why.contains("not a time zone name"), "{zone}");
    }
}
