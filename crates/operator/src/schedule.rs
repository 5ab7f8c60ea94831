//! Cron schedules (`spec.backup.schedule`), in UTC: the five fields of crontab(5) —
//! minute, hour, day of month, month, day of week — each `*`, a value, a range `a-b`, a
//! step `*/n` or `a-b/n`, or a comma list of those; month and weekday names (`jan`,
//! `mon`); `7` is Sunday as `0` is; and `@hourly`, `@daily` (`@midnight`), `@weekly`,
//! `@monthly`, `@yearly` (`@annually`). As in cron, when both the day of month and the day
//! of week are restricted, a day matching either is a day of the schedule.

use std::str::FromStr;

use k8s_openapi::jiff::civil::{Date, DateTime, Time};
use k8s_openapi::jiff::{tz::TimeZone, Timestamp, ToSpan};

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    /// The day-of-month field was `*` (then only the weekday restricts days).
    any_day: bool,
    /// The day-of-week field was `*`.
    any_weekday: bool,
}

/// Why a schedule does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schedule {schedule:?}: {why}")]
pub struct CronError {
    pub schedule: String,
    pub why: String,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// The bits `lo..=hi` of `field` selects (`names[i]` stands for `lo + i`).
fn field(text: &str, lo: u32, hi: u32, names: &[&str]) -> Result<u64, String> {
    let value = |s: &str| -> Result<u32, String> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            return Ok(lo + i as u32);
        }
        let v: u32 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
        if v < lo || v > hi {
            return Err(format!("{v} is outside {lo}-{hi}"));
        }
        Ok(v)
    };
    let mut bits = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let s: u32 = s
                    .parse()
                    .map_err(|_| format!("step {s:?} is not a number"))?;
                if s == 0 {
                    return Err("a step of 0".into());
                }
                (r, s)
            }
            None => (part, 1),
        };
        let (a, b) = match range {
            "*" => (lo, hi),
            r => match r.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                // `5/15` means from 5 to the end, every 15.
                None if step > 1 => (value(r)?, hi),
                None => {
                    let v = value(r)?;
                    (v, v)
                }
            },
        };
        if a > b {
            return Err(format!("the range {a}-{b} runs backwards"));
        }
        let mut v = a;
        while v <= b {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

impl FromStr for Cron {
    type Err = CronError;

    fn from_str(schedule: &str) -> Result<Cron, CronError> {
        let err = |why: String| CronError {
            schedule: schedule.to_owned(),
            why,
        };
        let expanded = match schedule.trim() {
            "@hourly" => "0 * * * *",
            "@daily" | "@midnight" => "0 0 * * *",
            "@weekly" => "0 0 * * 0",
            "@monthly" => "0 0 1 * *",
            "@yearly" | "@annually" => "0 0 1 1 *",
            s if s.starts_with('@') => return Err(err(format!("unknown macro {s}"))),
            s => s,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = fields[..] else {
            return Err(err(format!(
                "{} fields; a schedule has five: minute hour day-of-month month day-of-week",
                fields.len()
            )));
        };
        let named = |f: &str, what: &str, r: Result<u64, String>| {
            r.map_err(|why| err(format!("{what} field {f:?}: {why}")))
        };
        let weekdays = named(weekday, "day-of-week", field(weekday, 0, 7, &WEEKDAYS))?;
        Ok(Cron {
            minutes: named(minute, "minute", field(minute, 0, 59, &[]))?,
            hours: named(hour, "hour", field(hour, 0, 23, &[]))? as u32,
            days: named(day, "day-of-month", field(day, 1, 31, &[]))? as u32,
            months: named(month, "month", field(month, 1, 12, &MONTHS))? as u16,
            // 7 is Sunday too.
            weekdays: ((weekdays | (weekdays >> 7)) & 0x7f) as u8,
            any_day: day.starts_with('*'),
            any_weekday: weekday.starts_with('*'),
        })
    }
}

impl Cron {
    fn day_matches(&self, d: Date) -> bool {
        if self.months & (1 << d.month()) == 0 {
            return false;
        }
        let dom = self.days & (1 << d.day()) != 0;
        let dow = self.weekdays & (1 << d.weekday().to_sunday_zero_offset()) != 0;
        match (self.any_day, self.any_weekday) {
            (false, false) => dom || dow,
            _ => dom && dow,
        }
    }

    /// The latest minute of the schedule at or before `at` (within five years).
    pub fn prev(&self, at: Timestamp) -> Option<Timestamp> {
        let at = at.to_zoned(TimeZone::UTC).datetime();
        let mut day = at.date();
        let mut first = true;
        for _ in 0..(5 * 366) {
            if self.day_matches(day) {
                let (h_max, m_max) = if first {
                    (at.hour() as u32, Some(at.minute() as u32))
                } else {
                    (23, None)
                };
                for h in (0..=h_max).rev() {
                    if self.hours & (1 << h) == 0 {
                        continue;
                    }
                    let m_top = if h == h_max { m_max.unwrap_or(59) } else { 59 };
                    if let Some(m) = (0..=m_top).rev().find(|m| self.minutes & (1 << m) != 0) {
                        return utc(day, h, m);
                    }
                }
            }
            first = false;
            day = day.checked_sub(1.day()).ok()?;
        }
        None
    }

    /// The earliest minute of the schedule after `at` (within five years).
    pub fn next(&self, at: Timestamp) -> Option<Timestamp> {
        let at = at.to_zoned(TimeZone::UTC).datetime();
        let mut day = at.date();
        let mut first = true;
        for _ in 0..(5 * 366) {
            if self.day_matches(day) {
                let (h_min, m_min) = if first {
                    (at.hour() as u32, Some(at.minute() as u32 + 1))
                } else {
                    (0, None)
                };
                for h in h_min..24 {
                    if self.hours & (1 << h) == 0 {
                        continue;
                    }
                    let m_low = if h == h_min { m_min.unwrap_or(0) } else { 0 };
                    if let Some(m) = (m_low..60).find(|m| self.minutes & (1 << m) != 0) {
                        return utc(day, h, m);
                    }
                }
            }
            first = false;
            day = day.checked_add(1.day()).ok()?;
        }
        None
    }

    /// The longest gap between two runs around `at`: from the run before it to the one
    /// after, or between the next two (what "twice the schedule" measures).
    pub fn period_s(&self, at: Timestamp) -> Option<i64> {
        let next = self.next(at)?;
        let after = self.next(next)?;
        let before = self.prev(at)?;
        Some((next.as_second() - before.as_second()).max(after.as_second() - next.as_second()))
    }
}

fn utc(day: Date, h: u32, m: u32) -> Option<Timestamp> {
    let t = Time::new(h as i8, m as i8, 0, 0).ok()?;
    DateTime::from_parts(day, t)
        .to_zoned(TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn steps_ranges_lists_and_names() {
        let c: Cron = "*/15 2-4 * jan,jul mon-fri".parse().unwrap();
        assert_eq!(
            c.next(ts("2027-01-01T00:00:00Z")).unwrap(),
            ts("2027-01-01T02:00:00Z")
        );
        // 2027-01-02 is a Saturday: the next weekday run is Monday the 4th.
        assert_eq!(
            c.next(ts("2027-01-01T04:45:00Z")).unwrap(),
            ts("2027-01-04T02:00:00Z")
        );
        assert_eq!(
            c.prev(ts("2027-01-04T01:59:59Z")).unwrap(),
            ts("2027-01-01T04:45:00Z")
        );
        let c: Cron = "5/20 * * * *".parse().unwrap();
        assert_eq!(
            c.next(ts("2027-03-01T10:45:00Z")).unwrap(),
            ts("2027-03-01T11:05:00Z")
        );
    }

    #[test]
    fn day_of_month_or_day_of_week_when_both_are_set() {
        // The 13th, or any Friday.
        let c: Cron = "0 0 13 * fri".parse().unwrap();
        // 2027-08-06 is a Friday, before the 13th.
        assert_eq!(
            c.next(ts("2027-08-01T00:00:00Z")).unwrap(),
            ts("2027-08-06T00:00:00Z")
        );
        assert_eq!(
            c.next(ts("2027-08-12T00:00:00Z")).unwrap(),
            ts("2027-08-13T00:00:00Z")
        );
    }

    #[test]
    fn macros_sunday_as_seven_and_leap_days() {
        let weekly: Cron = "@weekly".parse().unwrap();
        assert_eq!(weekly, "0 0 * * 7".parse().unwrap());
        let leap: Cron = "0 12 29 feb *".parse().unwrap();
        assert_eq!(
            leap.next(ts("2027-03-01T00:00:00Z")).unwrap(),
            ts("2028-02-29T12:00:00Z")
        );
        assert_eq!(
            leap.prev(ts("2031-01-01T00:00:00Z")).unwrap(),
            ts("2028-02-29T12:00:00Z")
        );
        let daily: Cron = "@daily".parse().unwrap();
        assert_eq!(daily.period_s(ts("2027-05-05T05:05:00Z")), Some(86_400));
        let every: Cron = "* * * * *".parse().unwrap();
        assert_eq!(
            every.prev(ts("2027-05-05T05:05:59Z")).unwrap(),
            ts("2027-05-05T05:05:00Z")
        );
        assert_eq!(every.period_s(ts("2027-05-05T05:05:30Z")), Some(60));
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        for (s, why) in [
            ("0 3 * *", "4 fields"),
            ("60 * * * *", "minute field \"60\": 60 is outside 0-59"),
            ("* 5-2 * * *", "runs backwards"),
            ("*/0 * * * *", "a step of 0"),
            ("* * * smarch *", "\"smarch\" is not a number"),
            ("@often", "unknown macro"),
        ] {
            let e = s.parse::<Cron>().unwrap_err().to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
    }
}
