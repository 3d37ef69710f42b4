//! Local days: when "today" starts and ends, and how a reset time reads.
//!
//! Budget days are counted in the bot's zone ([`super::Limits::day_zone`]);
//! [`chat_time_zone`] is the one place that says which zone a chat's times
//! are shown in: the chat's `/timezone` (the scheduler's), else the
//! default zone (`[schedule] timezone`, else the system's).

use jiff::tz::TimeZone;
use jiff::Timestamp;

use crate::store::Jobs;

/// The time zone `chat_id`'s times are shown in: the chat's own `/timezone`, else
/// `default`. A zone that cannot be read (store down, a name this build
/// does not know) falls back to `default`, logged.
pub async fn chat_time_zone(jobs: &Jobs, chat_id: i64, default: &TimeZone) -> TimeZone {
    match jobs.chat_timezone(chat_id).await {
        Ok(Some(name)) => TimeZone::get(&name).unwrap_or_else(|error| {
            tracing::warn!(chat_id, %name, %error, "a chat's time zone is unknown; its times show in the default");
            default.clone()
        }),
        Ok(None) => default.clone(),
        Err(error) => {
            tracing::warn!(chat_id, %error, "could not read a chat's time zone; its times show in the default");
            default.clone()
        }
    }
}

fn ms(ts: Timestamp) -> i64 {
    ts.as_millisecond()
}

/// `[start, end)` of the local day `now` falls in, in unix ms. A zone
/// whose midnight does not exist that day starts it at the first instant
/// after.
pub fn day_range(tz: &TimeZone, now: Timestamp) -> (i64, i64) {
    let date = now.to_zoned(tz.clone()).date();
    let start = date.to_zoned(tz.clone()).map(|z| ms(z.timestamp()));
    let end = date
        .tomorrow()
        .and_then(|d| d.to_zoned(tz.clone()))
        .map(|z| ms(z.timestamp()));
    match (start, end) {
        (Ok(start), Ok(end)) => (start, end),
        // At the edges of the representable range: a plain 24 hours.
        _ => (
            ms(now) - ms(now).rem_euclid(86_400_000),
            ms(now) - ms(now).rem_euclid(86_400_000) + 86_400_000,
        ),
    }
}

/// `[start, end)` of the local month `now` falls in, in unix ms.
pub fn month_range(tz: &TimeZone, now: Timestamp) -> (i64, i64) {
    let date = now.to_zoned(tz.clone()).date();
    let start = date
        .first_of_month()
        .to_zoned(tz.clone())
        .map(|z| ms(z.timestamp()));
    let end = date
        .last_of_month()
        .tomorrow()
        .and_then(|d| d.to_zoned(tz.clone()))
        .map(|z| ms(z.timestamp()));
    match (start, end) {
        (Ok(start), Ok(end)) => (start, end),
        _ => day_range(tz, now),
    }
}

/// `at_ms` as local time with the zone, e.g. "00:00 (Europe/Berlin)", or
/// with the date when it is not within the next day ("2024-03-10 14:32").
pub fn local_time_text(tz: &TimeZone, at_ms: i64) -> String {
    let Ok(at) = Timestamp::from_millisecond(at_ms) else {
        return "later".to_string();
    };
    let zoned = at.to_zoned(tz.clone());
    let name = tz.iana_name().unwrap_or("local time");
    format!("{} ({name})", zoned.strftime("%H:%M"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_york() -> TimeZone {
        // A POSIX rule: no time zone database needed.
        TimeZone::posix("EST5EDT,M3.2.0,M11.1.0").unwrap()
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn a_day_is_local_midnight_to_local_midnight() {
        let tz = new_york();
        // 03:30 UTC on the 5th is still the 4th in New York (23:30 EDT).
        let (start, end) = day_range(&tz, at("2024-06-05T03:30:00Z"));
        assert_eq!(start, ms(at("2024-06-04T04:00:00Z")));
        assert_eq!(end, ms(at("2024-06-05T04:00:00Z")));
        // The day clocks go forward is 23 hours long.
        let (start, end) = day_range(&tz, at("2024-03-10T12:00:00Z"));
        assert_eq!(end - start, 23 * 3_600_000);
        let utc = TimeZone::UTC;
        let (start, end) = day_range(&utc, at("2024-06-05T03:30:00Z"));
        assert_eq!(
            (start, end),
            (
                ms(at("2024-06-05T00:00:00Z")),
                ms(at("2024-06-06T00:00:00Z"))
            )
        );
    }

    #[test]
    fn a_month_is_its_first_local_midnight_to_the_next() {
        let tz = new_york();
        let (start, end) = month_range(&tz, at("2024-03-01T03:00:00Z"));
        assert_eq!(
            start,
            ms(at("2024-02-01T05:00:00Z")),
            "still February locally"
        );
        assert_eq!(end, ms(at("2024-03-01T05:00:00Z")));
    }

    #[test]
    fn reset_times_read_as_local_clock_time() {
        let text = local_time_text(&TimeZone::UTC, ms(at("2024-06-06T00:00:00Z")));
        assert_eq!(text, "00:00 (UTC)");
        let text = local_time_text(&new_york(), ms(at("2024-06-05T04:00:00Z")));
        assert!(text.starts_with("00:00 ("), "{text}");
    }
}
