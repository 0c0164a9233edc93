//! CronJob schedules: the five-field cron syntax and `@hourly`-style macros Kubernetes accepts,
//! and the next run time after an instant in a time zone.
//!
//! Semantics follow the standard cron parser Kubernetes uses: names for months and weekdays,
//! `*` and `?`, ranges, steps and lists; when both day-of-month and day-of-week are restricted a
//! day matching either runs, when either is `*` both must match.

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan, Zoned};

/// A parsed schedule: one bit per allowed value of each field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Day-of-month or day-of-week was `*` or `?`: a day must then match both fields.
    any_day: bool,
}

struct Field {
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Field = Field { min: 0, max: 59, names: &[] };
const HOUR: Field = Field { min: 0, max: 23, names: &[] };
const DAY: Field = Field { min: 1, max: 31, names: &[] };
const MONTH: Field =
    Field { min: 1, max: 12, names: &["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"] };
const WEEKDAY: Field = Field { min: 0, max: 6, names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"] };

/// How far ahead a next run is looked for: a schedule such as `0 0 30 2 *` never runs.
const HORIZON_YEARS: i16 = 5;

impl Schedule {
    /// Parses a schedule; the error reads like Kubernetes' (`end of range (61) above maximum (59): 61`).
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let text = text.trim();
        if text.starts_with("TZ=") || text.starts_with("CRON_TZ=") {
            return Err("cannot use TZ or CRON_TZ in schedule, use timeZone field instead".into());
        }
        let expanded = match text {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            t if t.starts_with('@') => return Err(format!("unrecognized descriptor: {t}")),
            t => t,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!("expected exactly 5 fields, found {}: {text}", fields.len()));
        }
        let (minutes, _) = parse_field(fields[0], &MINUTE)?;
        let (hours, _) = parse_field(fields[1], &HOUR)?;
        let (days, any_dom) = parse_field(fields[2], &DAY)?;
        let (months, _) = parse_field(fields[3], &MONTH)?;
        let (weekdays, any_dow) = parse_field(fields[4], &WEEKDAY)?;
        Ok(Schedule { minutes, hours, days, months, weekdays, any_day: any_dom || any_dow })
    }

    fn day_matches(&self, date: Date) -> bool {
        let dom = has(self.days, date.day() as u32);
        let dow = has(self.weekdays, date.weekday().to_sunday_zero_offset() as u32);
        if self.any_day { dom && dow } else { dom || dow }
    }

    /// The first run strictly after `after`, in `tz`; `None` if the schedule never runs within
    /// a few years. A wall-clock time skipped by a daylight-saving change runs right after it.
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let start = after.to_zoned(tz.clone()).datetime();
        let mut t = start.with().second(0).subsec_nanosecond(0).build().ok()?.checked_add(1.minute()).ok()?;
        let limit = start.year().saturating_add(HORIZON_YEARS);
        while t.year() <= limit {
            if !has(self.months, t.month() as u32) {
                t = DateTime::from_parts(t.date().first_of_month().checked_add(1.month()).ok()?, Time::midnight());
                continue;
            }
            if !self.day_matches(t.date()) {
                t = DateTime::from_parts(t.date().tomorrow().ok()?, Time::midnight());
                continue;
            }
            if !has(self.hours, t.hour() as u32) {
                t = t.with().minute(0).build().ok()?.checked_add(1.hour()).ok()?;
                continue;
            }
            if !has(self.minutes, t.minute() as u32) {
                t = t.checked_add(1.minute()).ok()?;
                continue;
            }
            let at = tz.to_ambiguous_zoned(t).compatible().ok().map(|z: Zoned| z.timestamp())?;
            if at > after {
                return Some(at);
            }
            t = t.checked_add(1.minute()).ok()?;
        }
        None
    }
}

fn has(bits: u64, v: u32) -> bool {
    bits & (1 << v) != 0
}

/// The bits of one field, and whether it was a bare `*` or `?`.
fn parse_field(text: &str, f: &Field) -> Result<(u64, bool), String> {
    let mut bits = 0u64;
    let mut star = false;
    for part in text.split(',') {
        let (b, s) = parse_range(part, f)?;
        bits |= b;
        star |= s;
    }
    Ok((bits, star))
}

fn parse_range(expr: &str, f: &Field) -> Result<(u64, bool), String> {
    let (range, step) = match expr.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (expr, None),
    };
    let (start, end, star) = if range == "*" || range == "?" {
        (f.min, f.max, true)
    } else {
        match range.split_once('-') {
            Some((a, b)) => (value(a, f, expr)?, value(b, f, expr)?, false),
            None => {
                let v = value(range, f, expr)?;
                // `5/15` means from 5 to the end in steps of 15.
                (v, if step.is_some() { f.max } else { v }, false)
            }
        }
    };
    let step = match step {
        Some(s) => s.parse::<u32>().map_err(|_| format!("failed to parse int from {s}: invalid syntax"))?,
        None => 1,
    };
    if start < f.min {
        return Err(format!("beginning of range ({start}) below minimum ({}): {expr}", f.min));
    }
    if end > f.max {
        return Err(format!("end of range ({end}) above maximum ({}): {expr}", f.max));
    }
    if start > end {
        return Err(format!("beginning of range ({start}) beyond end of range ({end}): {expr}"));
    }
    if step == 0 {
        return Err(format!("step of range should be a positive number: {expr}"));
    }
    let bits = (start..=end).step_by(step as usize).fold(0u64, |b, v| b | (1 << v));
    Ok((bits, star && step == 1))
}

fn value(text: &str, f: &Field, expr: &str) -> Result<u32, String> {
    let lower = text.to_ascii_lowercase();
    if let Some(i) = f.names.iter().position(|n| *n == lower) {
        return Ok(i as u32 + f.min);
    }
    text.parse::<u32>().map_err(|_| {
        if text.is_empty() { format!("empty value in {expr}") } else { format!("failed to parse int from {text}: invalid syntax") }
    })
}

/// The time zone a CronJob names in `timeZone`; `None` (unset) is the controller's local zone, UTC here.
pub fn time_zone(name: Option<&str>) -> Result<TimeZone, String> {
    match name {
        None | Some("") => Ok(TimeZone::UTC),
        Some(n) if n.eq_ignore_ascii_case("local") => Err(format!("unknown time zone {n}")),
        Some(n) => TimeZone::get(n).map_err(|_| format!("unknown time zone {n}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn next(schedule: &str, after: &str) -> String {
        let s = Schedule::parse(schedule).expect("parses");
        s.next_after(at(after), &TimeZone::UTC).map(|t| t.to_string()).unwrap_or_default()
    }

    #[test]
    fn out_of_range_fields_are_refused_with_the_reason() {
        assert_eq!(Schedule::parse("61 * * * *").unwrap_err(), "end of range (61) above maximum (59): 61");
        assert!(Schedule::parse("* * *").unwrap_err().starts_with("expected exactly 5 fields, found 3"));
        assert!(Schedule::parse("*/0 * * * *").is_err());
        assert!(Schedule::parse("5-2 * * * *").is_err());
        assert!(Schedule::parse("@fortnightly").is_err());
        assert!(Schedule::parse("TZ=UTC 0 * * * *").is_err());
    }

    #[test]
    fn next_runs_follow_steps_ranges_names_and_macros() {
        assert_eq!(next("* * * * *", "2026-01-01T10:00:30Z"), "2026-01-01T10:01:00Z");
        assert_eq!(next("*/15 * * * *", "2026-01-01T10:00:00Z"), "2026-01-01T10:15:00Z");
        assert_eq!(next("@hourly", "2026-01-01T10:59:59Z"), "2026-01-01T11:00:00Z");
        assert_eq!(next("30 9 * * mon-fri", "2026-01-02T10:00:00Z"), "2026-01-05T09:30:00Z", "Friday to Monday");
        assert_eq!(next("0 0 1 JAN *", "2026-03-01T00:00:00Z"), "2027-01-01T00:00:00Z");
        assert_eq!(next("0 0 29 2 *", "2026-03-01T00:00:00Z"), "2028-02-29T00:00:00Z");
        assert_eq!(next("0 0 31 2 *", "2026-03-01T00:00:00Z"), "", "never");
    }

    #[test]
    fn restricted_day_of_month_and_weekday_run_on_either() {
        // The 13th (a Tuesday in January 2026) and every Friday.
        assert_eq!(next("0 0 13 * 5", "2026-01-10T00:00:00Z"), "2026-01-13T00:00:00Z");
        assert_eq!(next("0 0 13 * 5", "2026-01-13T00:00:00Z"), "2026-01-16T00:00:00Z");
        assert_eq!(next("0 0 * * 5", "2026-01-10T00:00:00Z"), "2026-01-16T00:00:00Z");
    }

    #[test]
    fn a_time_zone_moves_the_wall_clock_time() {
        let s = Schedule::parse("0 9 * * *").expect("parses");
        let tz = time_zone(Some("America/New_York")).expect("known zone");
        assert_eq!(s.next_after(at("2026-01-01T00:00:00Z"), &tz), Some(at("2026-01-01T14:00:00Z")));
        assert!(time_zone(Some("Mars/Olympus")).is_err());
    }
}
