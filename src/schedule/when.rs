//! Reading what a user (or the model, or a program) asks for: the short
//! forms of `/at`, `/in`, `/every` and `/cron`, and the action after them.
//!
//! A thin layer over jiff (dates, times, durations: `30m`, `1h 30m`, `2
//! hours`) and croner (expressions): the short forms compile to a
//! [`Schedule`] of [`super::spec`], which computes every instant.
//!
//! * `/at [today|tomorrow|monday|2026-12-24] 18:00 ACTION` (a time alone
//!   is the next such time; `9am`, `9:30pm` and `2026-12-24T18:00` work);
//! * `/in 30m ACTION` (any jiff duration: `90s`, `2h30m`, `1 day`);
//! * `/every 30m ACTION` (seconds, minutes, hours: an interval from now),
//!   `/every 2d ACTION` (days at the same local time), `/every minute`,
//!   `/every hour`, `/every day 08:00`, `/every weekday 08:00`,
//!   `/every weekend 10:00`, `/every mon,wed,fri 18:30` (`at` optional);
//! * `/cron "0 8 * * 1-5" ACTION` (quotes optional);
//! * ACTION: a prompt run as a turn in the chat's session; `fresh: PROMPT`
//!   runs it in a fresh session each time; `remind: TEXT` sends TEXT as is.
//!
//! Every refusal is a sentence for the user. Pure: the caller passes the
//! time and zone.

use jiff::civil::{Date, DateTime, Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp};
use serde::{Deserialize, Serialize};

use super::spec::{parse_cron, resolve_local, Schedule};

/// What a job does at each run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Run `text` as a turn; in a fresh session each time when `fresh`.
    Prompt {
        /// The prompt.
        text: String,
        /// A new session per run instead of the chat's current one.
        #[serde(default)]
        fresh: bool,
    },
    /// Send `text` as is (no model).
    Message {
        /// The reminder.
        text: String,
    },
}

impl Action {
    /// The action as `/jobs` shows it: `remind: call Anna`, `fresh:
    /// summarise…`, or the prompt, cut to `max` characters.
    pub fn summary(&self, max: usize) -> String {
        let (prefix, text) = match self {
            Action::Message { text } => ("remind: ", text),
            Action::Prompt { text, fresh: true } => ("fresh: ", text),
            Action::Prompt { text, fresh: false } => ("", text),
        };
        let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let cut = if one_line.chars().count() > max {
            format!("{}…", one_line.chars().take(max).collect::<String>())
        } else {
            one_line
        };
        format!("{prefix}{cut}")
    }
}

/// A job as asked for: when and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRequest {
    /// When it runs.
    pub schedule: Schedule,
    /// The schedule in words ("every weekday at 08:00", "once").
    pub label: String,
    /// What it does.
    pub action: Action,
}

/// Which command asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `/at`
    At,
    /// `/in`
    In,
    /// `/every`
    Every,
    /// `/cron`
    Cron,
}

impl Form {
    fn usage(self) -> &'static str {
        match self {
            Form::At => {
                "/at 18:00 remind: call Anna (or /at tomorrow 9am …, /at 2026-12-24 18:00 …)"
            }
            Form::In => "/in 30m remind: call Anna (or /in 2h …, /in 1 day …)",
            Form::Every => {
                "/every weekday 08:00 summarise my inbox (or /every 1h …, /every day 07:30 …, \
                 /every mon,fri 18:00 …)"
            }
            Form::Cron => "/cron \"0 8 * * 1-5\" summarise my inbox",
        }
    }
}

/// `/at`, `/in`, `/every` or `/cron` with its arguments, at `now` in `tz`.
pub fn parse_job(
    form: Form,
    args: &str,
    now: Timestamp,
    tz: &TimeZone,
) -> Result<JobRequest, String> {
    if args.trim().is_empty() {
        return Err(format!("Usage: {}", form.usage()));
    }
    let (schedule, label, rest) = match form {
        Form::At => parse_at(args, now, tz)?,
        Form::In => parse_in(args, now, tz)?,
        Form::Every => parse_every(args, now, tz)?,
        Form::Cron => parse_cron_form(args)?,
    };
    let action = parse_action(rest).map_err(|e| format!("{e}\nUsage: {}", form.usage()))?;
    Ok(JobRequest {
        schedule,
        label,
        action,
    })
}

/// A "when" on its own (the model's tool, a program's request file):
/// `in 30m`, `at 18:00` (or just `tomorrow 09:00`), `every weekday 08:00`,
/// `cron 0 8 * * 1-5`.
pub fn parse_when(when: &str, now: Timestamp, tz: &TimeZone) -> Result<(Schedule, String), String> {
    let when = when.trim();
    let (first, rest) = split_word(when);
    let (schedule, label, left) = match first.to_ascii_lowercase().as_str() {
        "in" => parse_in(rest, now, tz)?,
        "at" | "on" => parse_at(rest, now, tz)?,
        "every" => parse_every(rest, now, tz)?,
        "cron" => parse_cron_form(rest)?,
        _ => parse_at(when, now, tz)?,
    };
    if !left.trim().is_empty() {
        return Err(format!(
            "I could not read {:?} in {when:?}: write it like \"in 30m\", \"at tomorrow 09:00\", \
             \"every weekday 08:00\" or \"cron 0 8 * * 1-5\".",
            left.trim()
        ));
    }
    Ok((schedule, label))
}

/// The action after the schedule.
pub fn parse_action(text: &str) -> Result<Action, String> {
    let text = text.trim();
    let lower = text.to_ascii_lowercase();
    for (prefix, message) in [("remind:", true), ("fresh:", false)] {
        if lower.starts_with(prefix) {
            let body = text[prefix.len()..].trim();
            if body.is_empty() {
                return Err(format!("Nothing after {prefix}: what should it say?"));
            }
            return Ok(if message {
                Action::Message {
                    text: body.to_string(),
                }
            } else {
                Action::Prompt {
                    text: body.to_string(),
                    fresh: true,
                }
            });
        }
    }
    if text.is_empty() {
        return Err(
            "What should happen then? Add a prompt for the agent, or remind: TEXT for a plain reminder."
                .to_string(),
        );
    }
    Ok(Action::Prompt {
        text: text.to_string(),
        fresh: false,
    })
}

/// The first word and the rest (trimmed).
fn split_word(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    match text.find(char::is_whitespace) {
        Some(end) => (&text[..end], text[end..].trim_start()),
        None => (text, ""),
    }
}

type Parsed<'a> = (Schedule, String, &'a str);

fn parse_in<'a>(args: &'a str, now: Timestamp, tz: &TimeZone) -> Result<Parsed<'a>, String> {
    let (span, rest) = leading_span(args).ok_or_else(|| {
        format!(
            "I could not read a duration in {:?}: write it like 30m, 2h30m or \"1 day\".",
            split_word(args).0
        )
    })?;
    if span.signum() <= 0 {
        return Err("The duration must be more than zero.".to_string());
    }
    let at = now
        .to_zoned(tz.clone())
        .checked_add(span)
        .map_err(|_| "That is too far away.".to_string())?
        .timestamp();
    let at = whole_second_up(at);
    Ok((
        Schedule::Once { at: at.as_second() },
        "once".to_string(),
        rest,
    ))
}

/// The longest run of leading words (up to four) that reads as a jiff
/// duration, and what follows.
fn leading_span(args: &str) -> Option<(Span, &str)> {
    let words: Vec<(usize, &str)> = args
        .split_whitespace()
        .map(|w| (w.as_ptr() as usize - args.as_ptr() as usize, w))
        .take(4)
        .collect();
    for take in (1..=words.len()).rev() {
        let (start, last) = words[take - 1];
        let end = start + last.len();
        if let Ok(span) = args[..end].trim().parse::<Span>() {
            return Some((span, args[end..].trim_start()));
        }
    }
    None
}

fn whole_second_up(at: Timestamp) -> Timestamp {
    if at.subsec_nanosecond() == 0 {
        return at;
    }
    Timestamp::from_second(at.as_second() + 1).unwrap_or(at)
}

fn parse_at<'a>(args: &'a str, now: Timestamp, tz: &TimeZone) -> Result<Parsed<'a>, String> {
    let today = tz.to_datetime(now).date();
    let (first, after_first) = split_word(args);
    // A date and a time in one word.
    if let Some(local) = first
        .contains(['T', 't'])
        .then(|| first.parse::<DateTime>().ok())
        .flatten()
    {
        return once_at(local, now, tz).map(|s| (s, "once".to_string(), after_first));
    }
    let (date, explicit, time_word, rest) = match date_word(first, today) {
        Some(date) => {
            let (time_word, rest) = split_word(after_first);
            (date, true, time_word, rest)
        }
        None => (today, false, first, after_first),
    };
    let time = parse_time(time_word).ok_or_else(|| {
        format!("I could not read a time in {time_word:?}: write it like 18:00, 9am or 21:30.")
    })?;
    let mut local = date.to_datetime(time);
    if !explicit && resolve_local(tz, local).is_some_and(|t| t <= now) {
        // A time alone is the next such time.
        local = local
            .checked_add(Span::new().days(1))
            .map_err(|_| "That is too far away.".to_string())?;
    }
    once_at(local, now, tz).map(|s| (s, "once".to_string(), rest))
}

fn once_at(local: DateTime, now: Timestamp, tz: &TimeZone) -> Result<Schedule, String> {
    let at = resolve_local(tz, local).ok_or_else(|| "That time does not exist.".to_string())?;
    if at <= now {
        return Err(format!(
            "{} has already passed.",
            local.strftime("%Y-%m-%d %H:%M")
        ));
    }
    Ok(Schedule::Once {
        at: whole_second_up(at).as_second(),
    })
}

/// `today`, `tomorrow`, a weekday (the next one, not today) or an ISO date.
fn date_word(word: &str, today: Date) -> Option<Date> {
    let lower = word.to_ascii_lowercase();
    match lower.as_str() {
        "today" => return Some(today),
        "tomorrow" => return today.tomorrow().ok(),
        _ => {}
    }
    if let Some(day) = weekday_named(&lower) {
        let mut date = today.tomorrow().ok()?;
        while date.weekday() != day {
            date = date.tomorrow().ok()?;
        }
        return Some(date);
    }
    word.parse::<Date>().ok()
}

fn weekday_named(name: &str) -> Option<Weekday> {
    const DAYS: [(&str, Weekday); 7] = [
        ("mon", Weekday::Monday),
        ("tue", Weekday::Tuesday),
        ("wed", Weekday::Wednesday),
        ("thu", Weekday::Thursday),
        ("fri", Weekday::Friday),
        ("sat", Weekday::Saturday),
        ("sun", Weekday::Sunday),
    ];
    let name = name.to_ascii_lowercase();
    let full = [
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
    ];
    DAYS.iter()
        .zip(full)
        .find(|((short, _), long)| {
            name == *short || name == *long || (name.len() >= 3 && long.starts_with(&name))
        })
        .map(|((_, day), _)| *day)
}

/// `18:00`, `8:05`, `18:00:30`, `9am`, `9:30pm`, `12am`.
fn parse_time(word: &str) -> Option<Time> {
    let lower = word.to_ascii_lowercase();
    let (clock, meridiem) = if let Some(c) = lower.strip_suffix("am") {
        (c, Some(false))
    } else if let Some(c) = lower.strip_suffix("pm") {
        (c, Some(true))
    } else {
        (lower.as_str(), None)
    };
    let mut parts = clock.split(':');
    let hour: i8 = parts.next()?.parse().ok()?;
    let minute: i8 = match parts.next() {
        Some(m) if m.len() == 2 => m.parse().ok()?,
        Some(_) => return None,
        None if meridiem.is_some() => 0,
        None => return None,
    };
    let second: i8 = match parts.next() {
        Some(s) if s.len() == 2 => s.parse().ok()?,
        Some(_) => return None,
        None => 0,
    };
    if parts.next().is_some() {
        return None;
    }
    let hour = match meridiem {
        None => hour,
        Some(_) if !(1..=12).contains(&hour) => return None,
        Some(false) => hour % 12,
        Some(true) => hour % 12 + 12,
    };
    Time::new(hour, minute, second, 0).ok()
}

fn parse_every<'a>(args: &'a str, now: Timestamp, tz: &TimeZone) -> Result<Parsed<'a>, String> {
    let (first, rest) = split_word(args);
    let lower = first.to_ascii_lowercase();
    match lower.as_str() {
        "minute" => return Ok((cron("* * * * *"), "every minute".to_string(), rest)),
        "hour" => return Ok((cron("0 * * * *"), "every hour".to_string(), rest)),
        _ => {}
    }
    let days: Option<(String, String)> = match lower.as_str() {
        "day" | "daily" => Some(("*".to_string(), "every day".to_string())),
        "weekday" | "weekdays" => Some(("1-5".to_string(), "every weekday".to_string())),
        "weekend" | "weekends" => Some(("0,6".to_string(), "every weekend day".to_string())),
        _ => day_list(&lower),
    };
    if let Some((dow, label)) = days {
        let (word, mut after) = split_word(rest);
        let time_word = if word.eq_ignore_ascii_case("at") {
            let (time, after_time) = split_word(after);
            after = after_time;
            time
        } else {
            word
        };
        let time = parse_time(time_word)
            .filter(|t| t.second() == 0)
            .ok_or_else(|| {
                format!("I could not read a time in {time_word:?}: write it like 08:00 or 9am.")
            })?;
        let expr = format!("{} {} * * {dow}", time.minute(), time.hour());
        let label = format!("{label} at {}", time.strftime("%H:%M"));
        return Ok((cron(&expr), label, after));
    }
    let (span, rest) = leading_span(args).ok_or_else(|| {
        format!(
            "I could not read {first:?}: write an interval like 30m or 2h, or day, weekday, \
             weekend or day names (mon,wed) with a time."
        )
    })?;
    interval(span, now, tz).map(|(schedule, label)| (schedule, label, rest))
}

/// `mon,wed,fri` as a cron day-of-week field and its label.
fn day_list(lower: &str) -> Option<(String, String)> {
    let names: Vec<&str> = lower.split(',').filter(|n| !n.is_empty()).collect();
    let mut days: Vec<Weekday> = names
        .iter()
        .map(|n| weekday_named(n))
        .collect::<Option<Vec<_>>>()?;
    if days.is_empty() {
        return None;
    }
    days.sort_by_key(|d| d.to_sunday_zero_offset());
    days.dedup();
    let field: Vec<String> = days
        .iter()
        .map(|d| d.to_sunday_zero_offset().to_string())
        .collect();
    let label: Vec<String> = days.iter().map(|d| short_day(*d).to_string()).collect();
    Some((field.join(","), format!("every {}", label.join(", "))))
}

/// `30s`, `1m 30s`, `2h`, `1h 30m`.
pub fn duration_words(secs: i64) -> String {
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut parts = Vec::new();
    if h > 0 {
        parts.push(format!("{h}h"));
    }
    if m > 0 {
        parts.push(format!("{m}m"));
    }
    if s > 0 || parts.is_empty() {
        parts.push(format!("{s}s"));
    }
    parts.join(" ")
}

/// `Mon`, `Tue`, …
pub fn short_day(day: Weekday) -> &'static str {
    match day {
        Weekday::Monday => "Mon",
        Weekday::Tuesday => "Tue",
        Weekday::Wednesday => "Wed",
        Weekday::Thursday => "Thu",
        Weekday::Friday => "Fri",
        Weekday::Saturday => "Sat",
        Weekday::Sunday => "Sun",
    }
}

fn cron(expr: &str) -> Schedule {
    Schedule::Cron {
        expr: expr.to_string(),
    }
}

/// An interval: seconds, minutes and hours from now, or whole days (weeks)
/// at the same local time.
fn interval(span: Span, now: Timestamp, tz: &TimeZone) -> Result<(Schedule, String), String> {
    if span.signum() <= 0 {
        return Err("The interval must be more than zero.".to_string());
    }
    if span.get_years() != 0 || span.get_months() != 0 {
        return Err(
            "For monthly or yearly jobs use /cron, e.g. /cron \"0 9 1 * *\" ….".to_string(),
        );
    }
    let days = i64::from(span.get_weeks()) * 7 + i64::from(span.get_days());
    let secs = i64::from(span.get_hours()) * 3600 + span.get_minutes() * 60 + span.get_seconds();
    if span.get_milliseconds() != 0 || span.get_microseconds() != 0 || span.get_nanoseconds() != 0 {
        return Err("Intervals are in whole seconds.".to_string());
    }
    match (days, secs) {
        (0, secs) => {
            let anchor = whole_second_up(now).as_second() + secs;
            Ok((
                Schedule::Interval {
                    every_secs: secs,
                    anchor,
                },
                format!("every {}", duration_words(secs)),
            ))
        }
        (days, 0) => {
            let days = i32::try_from(days).map_err(|_| "That interval is too long.".to_string())?;
            let local = tz
                .to_datetime(whole_second_up(now))
                .checked_add(Span::new().days(days))
                .map_err(|_| "That interval is too long.".to_string())?;
            let label = if days == 1 {
                "every day".to_string()
            } else {
                format!("every {days} days")
            };
            Ok((
                Schedule::Days {
                    days,
                    anchor: local.to_string(),
                },
                format!("{label} at {}", local.strftime("%H:%M")),
            ))
        }
        _ => Err(
            "Use whole days (2d) or hours and minutes (36h), not both: an interval of days keeps \
             the local time, one of hours does not."
                .to_string(),
        ),
    }
}

fn parse_cron_form(args: &str) -> Result<Parsed<'_>, String> {
    let args = args.trim_start();
    let (expr, rest) = match args.chars().next() {
        Some(quote @ ('"' | '\'' | '“' | '«')) => {
            let close = match quote {
                '“' => '”',
                '«' => '»',
                q => q,
            };
            let body = &args[quote.len_utf8()..];
            let end = body
                .find(close)
                .ok_or_else(|| "The cron expression's closing quote is missing.".to_string())?;
            (&body[..end], &body[end + close.len_utf8()..])
        }
        _ => {
            // Five bare fields.
            let mut end = 0;
            let mut fields = 0;
            for (index, word) in args.split_whitespace().enumerate().take(5) {
                let start = word.as_ptr() as usize - args.as_ptr() as usize;
                end = start + word.len();
                fields = index + 1;
            }
            if fields < 5 {
                return Err(
                    "A cron expression has five fields, like /cron \"0 8 * * 1-5\" ….".to_string(),
                );
            }
            (&args[..end], &args[end..])
        }
    };
    let expr = expr.split_whitespace().collect::<Vec<_>>().join(" ");
    parse_cron(&expr).map_err(|e| e.to_string())?;
    let label = format!("cron {expr}");
    Ok((Schedule::Cron { expr }, label, rest))
}

#[cfg(test)]
mod tests;
