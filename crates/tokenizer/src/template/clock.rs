//! `strftime_now(format)`: transformers' global for templates that print today's date (Llama 3.x
//! writes `Today Date: 26 Jul 2024`).
//!
//! Python formats `datetime.now()` in local time; a server's local time is usually UTC and this crate
//! has no time-zone database, so the clock here is UTC. The C-locale (English) directives of
//! `strftime` are supported; an unknown directive is copied through unchanged, as glibc does.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DateTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub micros: u32,
    /// 0 = Monday .. 6 = Sunday
    pub weekday: u32,
    /// 1..=366
    pub yday: u32,
}

impl DateTime {
    /// The current time in UTC (the epoch if the clock is before it).
    pub(crate) fn now_utc() -> DateTime {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let secs = i64::try_from(since.as_secs()).unwrap_or(0);
        DateTime::from_unix(secs, since.subsec_micros())
    }

    /// Seconds since 1970-01-01T00:00:00Z to a civil date (Howard Hinnant's `civil_from_days`).
    pub(crate) fn from_unix(secs: i64, micros: u32) -> DateTime {
        let days = secs.div_euclid(86_400);
        let sod = secs.rem_euclid(86_400);
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let month_idx = usize::try_from(month - 1).unwrap_or(0);
        let yday = CUM[month_idx] + day + i64::from(leap && month > 2);
        // 1970-01-01 was a Thursday (index 3).
        let weekday = (days + 3).rem_euclid(7);
        let small = |v: i64| u32::try_from(v).unwrap_or(0);
        DateTime {
            year,
            month: small(month),
            day: small(day),
            hour: small(sod / 3600),
            minute: small(sod / 60 % 60),
            second: small(sod % 60),
            micros,
            weekday: small(weekday),
            yday: small(yday),
        }
    }

    /// C `strftime` in the C locale.
    pub(crate) fn strftime(&self, format: &str) -> String {
        let mut out = String::new();
        let mut chars = format.chars();
        let weekday = WEEKDAYS[self.weekday as usize % 7];
        let month = MONTHS[(self.month as usize + 11) % 12];
        let hour12 = match self.hour % 12 {
            0 => 12,
            h => h,
        };
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(d) = chars.next() else {
                out.push('%');
                break;
            };
            let _ = match d {
                'a' => write!(out, "{}", &weekday[..3]),
                'A' => write!(out, "{weekday}"),
                'b' | 'h' => write!(out, "{}", &month[..3]),
                'B' => write!(out, "{month}"),
                'd' => write!(out, "{:02}", self.day),
                'e' => write!(out, "{:2}", self.day),
                'm' => write!(out, "{:02}", self.month),
                'y' => write!(out, "{:02}", self.year.rem_euclid(100)),
                'Y' => write!(out, "{}", self.year),
                'H' => write!(out, "{:02}", self.hour),
                'I' => write!(out, "{hour12:02}"),
                'M' => write!(out, "{:02}", self.minute),
                'S' => write!(out, "{:02}", self.second),
                'f' => write!(out, "{:06}", self.micros),
                'p' => write!(out, "{}", if self.hour < 12 { "AM" } else { "PM" }),
                'j' => write!(out, "{:03}", self.yday),
                'w' => write!(out, "{}", (self.weekday + 1) % 7),
                'u' => write!(out, "{}", self.weekday + 1),
                'D' => write!(
                    out,
                    "{:02}/{:02}/{:02}",
                    self.month,
                    self.day,
                    self.year.rem_euclid(100)
                ),
                'F' => write!(out, "{}-{:02}-{:02}", self.year, self.month, self.day),
                'T' => write!(
                    out,
                    "{:02}:{:02}:{:02}",
                    self.hour, self.minute, self.second
                ),
                'R' => write!(out, "{:02}:{:02}", self.hour, self.minute),
                'c' => write!(
                    out,
                    "{} {} {:2} {:02}:{:02}:{:02} {}",
                    &weekday[..3],
                    &month[..3],
                    self.day,
                    self.hour,
                    self.minute,
                    self.second,
                    self.year
                ),
                'x' => write!(
                    out,
                    "{:02}/{:02}/{:02}",
                    self.month,
                    self.day,
                    self.year.rem_euclid(100)
                ),
                'X' => write!(
                    out,
                    "{:02}:{:02}:{:02}",
                    self.hour, self.minute, self.second
                ),
                'Z' => write!(out, "UTC"),
                'z' => write!(out, "+0000"),
                'n' => writeln!(out),
                't' => write!(out, "\t"),
                '%' => write!(out, "%"),
                other => write!(out, "%{other}"),
            };
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        let t = DateTime::from_unix(0, 0);
        assert_eq!(
            t.strftime("%Y-%m-%d %H:%M:%S %a %j"),
            "1970-01-01 00:00:00 Thu 001"
        );
        // 2024-07-26T13:05:09Z, a Friday, day 208 of a leap year.
        let t = DateTime::from_unix(1_721_999_109, 42);
        assert_eq!(
            t.strftime("%d %b %Y|%A %B %e|%I %p|%y %j %w %u|%f|%F %T|%%|%Q"),
            "26 Jul 2024|Friday July 26|01 PM|24 208 5 5|000042|2024-07-26 13:05:09|%|%Q"
        );
        let t = DateTime::from_unix(951_782_400, 0); // 2000-02-29
        assert_eq!(t.strftime("%F %j"), "2000-02-29 060");
        let t = DateTime::from_unix(-86_400, 0);
        assert_eq!(t.strftime("%F %a"), "1969-12-31 Wed");
    }
}
