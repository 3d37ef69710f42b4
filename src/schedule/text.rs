//! How jobs and their times read in the chat: the confirmation line, the
//! `/jobs` list, the texts a run starts with. Pure functions.

use jiff::tz::TimeZone;
use jiff::Timestamp;

use super::when::{short_day, Action};

/// How much of an action a list shows.
const SUMMARY_CHARS: usize = 60;

/// A job as the chat sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobView {
    /// Its id.
    pub id: i64,
    /// The schedule in words ("every weekday at 08:00", "once").
    pub label: String,
    /// Whether it runs more than once.
    pub recurring: bool,
    /// What it does.
    pub action: Action,
    /// Its time zone's name.
    pub zone: String,
    /// Its next run, while active.
    pub next: Option<Timestamp>,
    /// Paused (by a user, or after failing runs).
    pub paused: bool,
    /// Who made it.
    pub creator: String,
    /// Runs that failed in a row.
    pub failures: u32,
    /// The forum topic it runs in, if any.
    pub thread_id: Option<i32>,
}

/// An instant in words, relative to `now` in `tz`: `today 18:00`,
/// `tomorrow 09:00`, `Mon 08:00` (within a week), `2026-12-24 18:00`;
/// seconds only when they are not zero.
pub fn when_words(at: Timestamp, now: Timestamp, tz: &TimeZone) -> String {
    let local = tz.to_datetime(at);
    let today = tz.to_datetime(now).date();
    let clock = if local.second() == 0 {
        local.strftime("%H:%M").to_string()
    } else {
        local.strftime("%H:%M:%S").to_string()
    };
    let days_ahead = today
        .until(local.date())
        .map(|s| s.get_days())
        .unwrap_or(i32::MAX);
    let day = match days_ahead {
        0 => "today".to_string(),
        1 => "tomorrow".to_string(),
        -1 => "yesterday".to_string(),
        2..=6 => short_day(local.weekday()).to_string(),
        _ => local.strftime("%Y-%m-%d").to_string(),
    };
    format!("{day} {clock}")
}

/// The line confirming a new job: `⏰ Job 3: tomorrow 09:00 Europe/Berlin
/// — remind: call Anna`, or for a recurring one `⏰ Job 4: every weekday
/// at 08:00 (Europe/Berlin), next Mon 08:00 — summarise my inbox`.
pub fn confirmation(view: &JobView, now: Timestamp, tz: &TimeZone) -> String {
    format!("⏰ Job {}: {}", view.id, schedule_words(view, now, tz))
}

/// When a job runs and what it does, in words (after `Job N: `).
fn schedule_words(view: &JobView, now: Timestamp, tz: &TimeZone) -> String {
    let action = view.action.summary(SUMMARY_CHARS);
    let next = view.next.map(|at| when_words(at, now, tz));
    match (view.recurring, next) {
        (false, Some(next)) => format!("{next} {} — {action}", view.zone),
        (false, None) => format!("once ({}) — {action}", view.zone),
        (true, Some(next)) => format!("{} ({}), next {next} — {action}", view.label, view.zone),
        (true, None) => format!("{} ({}) — {action}", view.label, view.zone),
    }
}

/// One job in `/jobs`.
pub fn list_line(view: &JobView, now: Timestamp, tz: &TimeZone) -> String {
    let mut line = format!(
        "#{} · {} · by {}",
        view.id,
        schedule_words(view, now, tz),
        view.creator
    );
    if view.paused {
        line.push_str(" · ⏸ paused");
        if view.failures > 0 {
            line.push_str(&format!(" after {} failed runs", view.failures));
        }
    }
    line
}

/// The `/jobs` text.
pub fn list_text(views: &[JobView], now: Timestamp, tz: &TimeZone) -> String {
    if views.is_empty() {
        return "No jobs in this chat. Make one with /at, /in, /every or /cron \
                (e.g. /in 30m remind: call Anna)."
            .to_string();
    }
    let mut text = format!("Jobs in this chat ({}):", views.len());
    for view in views {
        text.push('\n');
        text.push_str(&list_line(view, now, tz));
    }
    text.push_str("\n\nChange one with /pause ID, /resume ID or /unschedule ID.");
    text
}

/// What a late run says about itself: `late: due today 08:00, telegate
/// was not running` (and how many earlier runs were left out).
pub fn late_words(
    due: Timestamp,
    now: Timestamp,
    tz: &TimeZone,
    skipped: u64,
    more: bool,
) -> String {
    let mut text = format!(
        "late: due {}, telegate was not running then",
        when_words(due, now, tz)
    );
    match (skipped, more) {
        (0, false) => {}
        (1, false) => text.push_str("; 1 earlier missed run was left out"),
        (n, false) => text.push_str(&format!("; {n} earlier missed runs were left out")),
        (n, true) => text.push_str(&format!(
            "; more than {n} earlier missed runs were left out"
        )),
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::when::duration_words;

    fn tz() -> TimeZone {
        TimeZone::get("Europe/Berlin").unwrap()
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn view(recurring: bool, next: Option<Timestamp>) -> JobView {
        JobView {
            id: 3,
            label: if recurring {
                "every weekday at 08:00".into()
            } else {
                "once".into()
            },
            recurring,
            action: Action::Message {
                text: "call Anna".into(),
            },
            zone: "Europe/Berlin".into(),
            next,
            paused: false,
            creator: "Ann".into(),
            failures: 0,
            thread_id: None,
        }
    }

    #[test]
    fn times_read_relative_to_now_in_the_zone() {
        let now = at("2026-05-01T10:00:00Z"); // Friday 12:00 in Berlin
        assert_eq!(
            when_words(at("2026-05-01T16:00:00Z"), now, &tz()),
            "today 18:00"
        );
        assert_eq!(
            when_words(at("2026-05-02T07:00:00Z"), now, &tz()),
            "tomorrow 09:00"
        );
        assert_eq!(
            when_words(at("2026-05-04T06:00:00Z"), now, &tz()),
            "Mon 08:00"
        );
        assert_eq!(
            when_words(at("2026-12-24T17:00:05Z"), now, &tz()),
            "2026-12-24 18:00:05"
        );
        // Late at night in UTC is already tomorrow in Berlin.
        let late = at("2026-05-01T22:30:00Z");
        assert_eq!(when_words(late, now, &tz()), "tomorrow 00:30");
    }

    #[test]
    fn the_confirmation_names_the_time_zone_and_the_action() {
        let now = at("2026-05-01T10:00:00Z");
        let once = view(false, Some(at("2026-05-02T07:00:00Z")));
        assert_eq!(
            confirmation(&once, now, &tz()),
            "⏰ Job 3: tomorrow 09:00 Europe/Berlin — remind: call Anna"
        );
        let weekly = view(true, Some(at("2026-05-04T06:00:00Z")));
        assert_eq!(
            confirmation(&weekly, now, &tz()),
            "⏰ Job 3: every weekday at 08:00 (Europe/Berlin), next Mon 08:00 — remind: call Anna"
        );
    }

    #[test]
    fn the_list_shows_who_made_each_job_and_what_is_paused() {
        let now = at("2026-05-01T10:00:00Z");
        let mut paused = view(true, None);
        paused.paused = true;
        paused.failures = 3;
        let text = list_text(
            &[view(false, Some(at("2026-05-02T07:00:00Z"))), paused],
            now,
            &tz(),
        );
        assert!(text.starts_with("Jobs in this chat (2):"), "{text}");
        assert!(
            text.contains("#3 · tomorrow 09:00 Europe/Berlin — remind: call Anna · by Ann"),
            "{text}"
        );
        assert!(text.contains("⏸ paused after 3 failed runs"), "{text}");
        assert!(list_text(&[], now, &tz()).contains("No jobs"));
    }

    #[test]
    fn durations_and_late_runs_read_well() {
        assert_eq!(duration_words(2), "2s");
        assert_eq!(duration_words(90), "1m 30s");
        assert_eq!(duration_words(3600), "1h");
        assert_eq!(duration_words(5400), "1h 30m");
        let now = at("2026-05-01T10:00:00Z");
        let due = at("2026-05-01T06:00:00Z");
        assert_eq!(
            late_words(due, now, &tz(), 2, false),
            "late: due today 08:00, telegate was not running then; 2 earlier missed runs were left out"
        );
        assert!(late_words(due, now, &tz(), 0, false).ends_with("not running then"));
    }
}
