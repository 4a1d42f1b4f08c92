//! Times: Unix seconds to and from RFC 3339, by the `time` crate (no calendar arithmetic of our
//! own). Recordings, `top`, the exporter's JSON and trend reports print UTC with whole seconds
//! (`2026-11-21T23:09:56Z`).

use time::format_description::well_known::Rfc3339;
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time, UtcOffset};

/// Formats Unix seconds as RFC 3339 UTC with whole seconds (`2026-11-21T23:09:56Z`); the
/// fraction is dropped (floor). Times outside years 1..9999 print as the nearest end.
pub fn rfc3339(ts: f64) -> String {
    let secs = if ts.is_finite() { ts.floor() as i64 } else { 0 };
    let t = OffsetDateTime::from_unix_timestamp(secs).unwrap_or(if secs < 0 {
        OffsetDateTime::new_utc(Date::MIN, Time::MIDNIGHT)
    } else {
        OffsetDateTime::new_utc(Date::MAX, Time::MIDNIGHT)
    });
    t.format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

/// Unix seconds of an RFC 3339 time (`2026-11-21T10:00:00Z`, `2026-11-21T10:00:00.5+02:00`).
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let t = OffsetDateTime::parse(s.trim(), &Rfc3339).ok()?;
    Some(t.unix_timestamp() as f64 + f64::from(t.nanosecond()) / 1e9)
}

/// Unix seconds of a civil time read by a caller's own pattern (logs print `2026-11-21
/// 10:00:00,123`, which RFC 3339 refuses): year, month, day, hour, minute, second, and the
/// offset from UTC in seconds. `None` for an impossible date or time.
pub fn unix_seconds(
    year: i64,
    month: i64,
    day: i64,
    hour: i64,
    minute: i64,
    second: i64,
    offset_seconds: i64,
) -> Option<i64> {
    let month = Month::try_from(u8::try_from(month).ok()?).ok()?;
    let date =
        Date::from_calendar_date(i32::try_from(year).ok()?, month, u8::try_from(day).ok()?).ok()?;
    // Leap seconds (`:60`) as logs may print them fold onto the next second.
    let leap = i64::from(second == 60);
    let time = Time::from_hms(
        u8::try_from(hour).ok()?,
        u8::try_from(minute).ok()?,
        u8::try_from(second - leap).ok()?,
    )
    .ok()?;
    let offset = UtcOffset::from_whole_seconds(i32::try_from(offset_seconds).ok()?).ok()?;
    Some(
        PrimitiveDateTime::new(date, time)
            .assume_offset(offset)
            .unix_timestamp()
            + leap,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_302_596.7), "2026-11-21T23:09:56Z");
        assert_eq!(rfc3339(-0.5), "1969-12-31T23:59:59Z");
        assert_eq!(rfc3339(f64::NAN), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1e300), "9999-12-31T00:00:00Z");
    }

    #[test]
    fn parses_rfc3339() {
        assert_eq!(parse_rfc3339("2026-11-21T23:09:56Z"), Some(1_795_302_596.0));
        assert_eq!(
            parse_rfc3339("2026-11-22T01:09:56.5+02:00"),
            Some(1_795_302_596.5)
        );
        assert_eq!(parse_rfc3339("2026-11-21 23:09:56"), None);
        assert_eq!(
            unix_seconds(2026, 11, 21, 23, 9, 56, 0),
            Some(1_795_302_596)
        );
        assert_eq!(unix_seconds(2026, 2, 30, 0, 0, 0, 0), None);
        assert_eq!(
            unix_seconds(2026, 11, 22, 1, 9, 56, 7200),
            Some(1_795_302_596)
        );
    }
}
