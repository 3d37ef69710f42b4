//! One run of a job: its id, and which runs a due job gets (catch-up).
//!
//! **Run ids.** A run is journaled in the inbox under an id derived from
//! its job and its instant ([`run_id`]), so firing the same instant again
//! (after a crash before the commit, or a replay) writes the same id and
//! the inbox's primary key refuses it: a run exists once. The ids are
//! negative, like every journaled internal event, in a range of their own
//! below `-2^62` (wakeups' time-based ids stay above `-2^54` for
//! millennia; Telegram's are positive), and [`run_of`] reads the job and
//! instant back, which is how the runner recognises a scheduled run.
//!
//! **Catch-up.** An instant is *missed* when it fell due before this
//! process's scheduler started (telegate was down or still starting,
//! however briefly), or when it is found due more than [`LATE_AFTER`]
//! after it (the machine asleep, the store stalled). A due job with a
//! missed instant, or with more than one due, follows `[schedule]
//! catch_up` ([`plan_firing`]): `latest` runs the newest missed instant
//! once, labelled late; `none` runs no missed instant at all; `all` runs
//! each missed instant, at most [`MAX_CATCH_UP`] (the newest). Never a
//! burst of hundreds.
//!
//! Pure: no clock, no I/O.

use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use serde::Deserialize;

use super::spec::Schedule;

/// A run found due this long after its instant is late (missed), even
/// while telegate ran.
pub const LATE_AFTER: SignedDuration = SignedDuration::from_secs(60);

/// At most this many missed runs of one job are run with `catch_up = "all"`.
pub const MAX_CATCH_UP: usize = 10;

/// `[schedule] catch_up`: what happens to runs missed while telegate was
/// not running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// One run for the newest missed instant, labelled late.
    #[default]
    Latest,
    /// Missed runs are left out.
    None,
    /// Every missed run (at most [`MAX_CATCH_UP`] per job), labelled late.
    All,
}

/// Run ids lie below `-RUN_ID_BASE`.
const RUN_ID_BASE: i64 = 1 << 62;
/// Bits of the instant (unix seconds up to the year 2106).
const INSTANT_BITS: u32 = 32;
/// The largest job id a run id can carry.
pub const MAX_JOB_ID: i64 = (1 << 30) - 1;

/// The inbox id of job `job`'s run at `instant` (whole seconds). `None`
/// for a job id past [`MAX_JOB_ID`] or an instant outside 1970–2106.
pub fn run_id(job: i64, instant: Timestamp) -> Option<i64> {
    let secs = instant.as_second();
    if !(1..=MAX_JOB_ID).contains(&job) || !(0..(1 << INSTANT_BITS)).contains(&secs) {
        return None;
    }
    Some(-(RUN_ID_BASE + (job << INSTANT_BITS) + secs))
}

/// The job and instant of a run id; `None` for any other id.
pub fn run_of(id: i64) -> Option<(i64, Timestamp)> {
    let rest = id.checked_neg()?.checked_sub(RUN_ID_BASE)?;
    if rest < 0 {
        return None;
    }
    let job = rest >> INSTANT_BITS;
    let secs = rest & ((1 << INSTANT_BITS) - 1);
    if job == 0 {
        return None;
    }
    Some((job, Timestamp::from_second(secs).ok()?))
}

/// One run to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    /// Its instant.
    pub due: Timestamp,
    /// Its instant was missed: it fell due before the scheduler started,
    /// or it starts more than [`LATE_AFTER`] after it.
    pub late: bool,
}

/// What a due job does now ([`plan_firing`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirePlan {
    /// The runs to start, oldest first.
    pub runs: Vec<Planned>,
    /// Due instants left out (late, under the policy).
    pub skipped: u64,
    /// More instants were missed than were counted.
    pub more: bool,
    /// The newest instant considered (run or left out).
    pub last: Timestamp,
    /// The next run after it; `None`: the job is done.
    pub next_run: Option<Timestamp>,
}

/// The plan for a job whose stored next run `first` is due at `now`, by a
/// scheduler that started at `since` (an instant before it was missed).
pub fn plan_firing(
    schedule: &Schedule,
    tz: &TimeZone,
    first: Timestamp,
    now: Timestamp,
    since: Timestamp,
    policy: CatchUp,
) -> FirePlan {
    let due = schedule.due_until(first, now, tz, MAX_CATCH_UP);
    let last = due.newest.last().copied().unwrap_or(first);
    let late = |at: Timestamp| at < since || now.duration_since(at) > LATE_AFTER;
    let planned = |at: Timestamp| Planned {
        due: at,
        late: late(at),
    };
    let on_time = due.count == 1 && !late(last);
    let runs: Vec<Planned> = if on_time || due.count == 0 {
        due.newest.iter().copied().map(planned).collect()
    } else {
        match policy {
            CatchUp::Latest => vec![planned(last)],
            CatchUp::None => due
                .newest
                .last()
                .copied()
                .filter(|at| !late(*at))
                .map(planned)
                .into_iter()
                .collect(),
            CatchUp::All => due.newest.iter().copied().map(planned).collect(),
        }
    };
    let skipped = due.count.saturating_sub(runs.len() as u64);
    FirePlan {
        runs,
        skipped,
        more: due.more,
        last,
        next_run: schedule.next_after(last.max(now), tz),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// A scheduler running since long before every instant of these tests.
    fn running() -> Timestamp {
        at("2026-01-01T00:00:00Z")
    }

    fn hourly(anchor: &str) -> Schedule {
        Schedule::Interval {
            every_secs: 3600,
            anchor: at(anchor).as_second(),
        }
    }

    #[test]
    fn run_ids_round_trip_and_stay_clear_of_other_ids() {
        let instant = at("2026-12-24T17:00:00Z");
        let id = run_id(3, instant).unwrap();
        assert!(id < -(1 << 62), "{id}");
        assert_eq!(run_of(id), Some((3, instant)));
        assert_ne!(run_id(3, instant), run_id(4, instant));
        assert_ne!(run_id(3, instant), run_id(3, at("2026-12-24T17:00:01Z")));
        // The largest job and instant still fit.
        let far = Timestamp::from_second((1 << 32) - 1).unwrap();
        assert_eq!(
            run_of(run_id(MAX_JOB_ID, far).unwrap()),
            Some((MAX_JOB_ID, far))
        );
        assert_eq!(run_id(MAX_JOB_ID + 1, instant), None);
        assert_eq!(run_id(0, instant), None);
        // Wakeups' ids, Telegram's ids and extremes are no runs.
        for other in [
            -1_700_000_000_000_000,
            -1,
            0,
            42,
            i64::MIN,
            i64::MAX,
            -(1 << 62),
        ] {
            assert_eq!(run_of(other), None, "{other}");
        }
    }

    #[test]
    fn a_run_on_time_is_run_and_the_job_moves_on() {
        let now = at("2026-05-01T10:00:00.020Z");
        let plan = plan_firing(
            &hourly("2026-05-01T10:00:00Z"),
            &TimeZone::UTC,
            at("2026-05-01T10:00:00Z"),
            now,
            running(),
            CatchUp::None,
        );
        assert_eq!(
            plan.runs,
            vec![Planned {
                due: at("2026-05-01T10:00:00Z"),
                late: false
            }]
        );
        assert_eq!(plan.skipped, 0);
        assert_eq!(plan.next_run, Some(at("2026-05-01T11:00:00Z")));
    }

    #[test]
    fn after_a_two_hour_outage_each_policy_does_what_it_says() {
        let first = at("2026-05-01T08:00:00Z");
        let now = at("2026-05-01T10:30:00Z");
        let schedule = hourly("2026-05-01T08:00:00Z");
        let latest = plan_firing(
            &schedule,
            &TimeZone::UTC,
            first,
            now,
            running(),
            CatchUp::Latest,
        );
        assert_eq!(
            latest.runs,
            vec![Planned {
                due: at("2026-05-01T10:00:00Z"),
                late: true
            }]
        );
        assert_eq!(latest.skipped, 2);
        assert_eq!(latest.next_run, Some(at("2026-05-01T11:00:00Z")));
        let none = plan_firing(
            &schedule,
            &TimeZone::UTC,
            first,
            now,
            running(),
            CatchUp::None,
        );
        assert!(none.runs.is_empty());
        assert_eq!(none.skipped, 3);
        assert_eq!(none.next_run, Some(at("2026-05-01T11:00:00Z")));
        let all = plan_firing(
            &schedule,
            &TimeZone::UTC,
            first,
            now,
            running(),
            CatchUp::All,
        );
        assert_eq!(all.runs.len(), 3);
        assert!(all.runs.iter().all(|r| r.late));
        assert_eq!(all.skipped, 0);
    }

    #[test]
    fn a_long_outage_never_becomes_a_burst() {
        let minutely = Schedule::Cron {
            expr: "* * * * *".into(),
        };
        let first = at("2026-05-01T00:00:00Z");
        let now = at("2026-05-20T00:00:30Z"); // 19 days of minutes
        let all = plan_firing(
            &minutely,
            &TimeZone::UTC,
            first,
            now,
            running(),
            CatchUp::All,
        );
        assert!(all.runs.len() <= MAX_CATCH_UP, "{}", all.runs.len());
        assert_eq!(all.runs.last().unwrap().due, at("2026-05-20T00:00:00Z"));
        assert!(all.skipped > 10_000);
        assert_eq!(all.next_run, Some(at("2026-05-20T00:01:00Z")));
        let latest = plan_firing(
            &minutely,
            &TimeZone::UTC,
            first,
            now,
            running(),
            CatchUp::Latest,
        );
        assert_eq!(latest.runs.len(), 1);
    }

    #[test]
    fn a_one_time_job_late_by_a_little_still_runs_and_is_then_done() {
        let once = Schedule::Once {
            at: at("2026-05-01T10:00:00Z").as_second(),
        };
        let now = at("2026-05-01T10:00:30Z");
        let plan = plan_firing(
            &once,
            &TimeZone::UTC,
            at("2026-05-01T10:00:00Z"),
            now,
            running(),
            CatchUp::None,
        );
        assert_eq!(plan.runs.len(), 1);
        assert!(!plan.runs[0].late);
        assert_eq!(plan.next_run, None);
        // Two hours late: `none` leaves it out, `latest` runs it late.
        let later = at("2026-05-01T12:00:00Z");
        let none = plan_firing(
            &once,
            &TimeZone::UTC,
            at("2026-05-01T10:00:00Z"),
            later,
            running(),
            CatchUp::None,
        );
        assert!(none.runs.is_empty());
        assert_eq!((none.skipped, none.next_run), (1, None));
        let latest = plan_firing(
            &once,
            &TimeZone::UTC,
            at("2026-05-01T10:00:00Z"),
            later,
            running(),
            CatchUp::Latest,
        );
        assert!(latest.runs[0].late);
    }

    #[test]
    fn an_instant_that_fell_due_while_telegate_was_down_is_missed_however_short_the_outage() {
        let every_minute = Schedule::Interval {
            every_secs: 60,
            anchor: at("2026-05-01T10:00:00Z").as_second(),
        };
        let first = at("2026-05-01T10:00:00Z");
        // Down from 09:59:50 to 10:00:20: the instant is 20 s old at the
        // start, well within LATE_AFTER.
        let started = at("2026-05-01T10:00:20Z");
        let now = at("2026-05-01T10:00:20.010Z");
        let none = plan_firing(
            &every_minute,
            &TimeZone::UTC,
            first,
            now,
            started,
            CatchUp::None,
        );
        assert!(none.runs.is_empty(), "{:?}", none.runs);
        assert_eq!(none.skipped, 1);
        assert_eq!(none.next_run, Some(at("2026-05-01T10:01:00Z")));
        let latest = plan_firing(
            &every_minute,
            &TimeZone::UTC,
            first,
            now,
            started,
            CatchUp::Latest,
        );
        assert_eq!(
            latest.runs,
            vec![Planned {
                due: first,
                late: true
            }],
            "run once, labelled late"
        );
        // The next instant, due while the scheduler runs, is on time.
        let next = at("2026-05-01T10:01:00Z");
        let on_time = plan_firing(
            &every_minute,
            &TimeZone::UTC,
            next,
            at("2026-05-01T10:01:00.005Z"),
            started,
            CatchUp::None,
        );
        assert_eq!(
            on_time.runs,
            vec![Planned {
                due: next,
                late: false
            }]
        );
    }
}
