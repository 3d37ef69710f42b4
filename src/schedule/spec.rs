//! When a job runs: the [`Schedule`] and the computation of its instants.
//!
//! Four kinds, all evaluated in the job's time zone:
//!
//! * **once** at an instant (`/at`, `/in`);
//! * **cron**: a five-field expression (`/cron`, and the short forms
//!   `/every day 08:00`, `/every weekday 08:00`, `/every mon,wed 18:30`,
//!   `/every hour`, which compile to one), evaluated by `croner`;
//! * **interval**: every N seconds from an anchor (`/every 30m`);
//! * **days**: every N days at the anchor's local time (`/every 2d`).
//!
//! Daylight saving time is handled the way cron users expect (Vixie
//! cron): a job whose minute and hour fields name times (no `*` or `/`)
//! runs **once** at the first instant after a gap when its local time is
//! skipped, and **once** (the earlier instant) when its local time repeats;
//! a job on a wildcard or step (`*/15`) follows real time, on both
//! instants of a repeated hour. croner does this for a single fixed time;
//! [`Schedule::next_after`] adds it for lists and ranges (`0 2,14 * * *`),
//! by probing the skipped range in the offset before the gap. Local times
//! typed by a user (`/at 02:30` on the spring-forward night) and the days
//! kind resolve the same way ([`resolve_local`]).
//!
//! Everything here is pure: no clock, no I/O. Instants are whole seconds.

use std::str::FromStr;

use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, Span, Timestamp};
use serde::{Deserialize, Serialize};

/// When a job runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// Once, at `at` (unix seconds).
    Once {
        /// The instant.
        at: i64,
    },
    /// A five-field cron expression in the job's zone.
    Cron {
        /// The expression, e.g. `0 8 * * 1-5`.
        expr: String,
    },
    /// Every `every_secs` seconds, starting at `anchor` (unix seconds).
    Interval {
        /// The period.
        every_secs: i64,
        /// The first instant.
        anchor: i64,
    },
    /// Every `days` days at the local time of `anchor`, a civil date and
    /// time (`2026-05-01T09:00:00`) that is also the first run.
    Days {
        /// The period in days.
        days: i32,
        /// The first run, in local time.
        anchor: String,
    },
}

/// How many missed instants [`Schedule::due_until`] walks one by one
/// before it jumps to the newest (a long outage of a frequent job).
const WALK_LIMIT: u64 = 20_000;

/// The instants of a schedule that are due, as [`Schedule::due_until`]
/// finds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    /// The newest due instants, oldest first (at most as many as asked).
    pub newest: Vec<Timestamp>,
    /// How many instants are due in all (a lower bound when `more`).
    pub count: u64,
    /// More were due than were counted (a very long outage).
    pub more: bool,
}

/// Why a cron expression is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CronRefusal {
    /// Not five fields.
    #[error("a cron expression has five fields (minute hour day-of-month month day-of-week), like \"0 8 * * 1-5\"")]
    FieldCount,
    /// croner refused it.
    #[error("that cron expression is not valid: {0}")]
    Invalid(String),
}

/// Parse a five-field cron expression (no seconds, no years, no
/// `@nicknames`).
pub fn parse_cron(expr: &str) -> Result<Cron, CronRefusal> {
    let fields = expr.split_whitespace().count();
    if fields != 5 || expr.contains('@') {
        return Err(CronRefusal::FieldCount);
    }
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(expr)
        .map_err(|e| CronRefusal::Invalid(e.to_string()))
}

/// Whether a cron expression's minute and hour fields name times (no `*`,
/// `?` or `/`): such a job runs once when its local time is skipped or
/// repeated by a DST change.
fn names_times(expr: &str) -> bool {
    expr.split_whitespace()
        .take(2)
        .all(|field| !field.contains(['*', '/', '?']))
}

impl Schedule {
    /// Whether the job runs more than once.
    pub fn is_recurring(&self) -> bool {
        !matches!(self, Schedule::Once { .. })
    }

    /// The first instant strictly after `after`, in `tz`; `None` when there
    /// is none (a one-time job that has run, a cron expression that never
    /// matches).
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        match self {
            Schedule::Once { at } => Timestamp::from_second(*at).ok().filter(|t| *t > after),
            Schedule::Interval { every_secs, anchor } => {
                let every = (*every_secs).max(1);
                let after_s = after.as_second();
                if after_s < *anchor {
                    return Timestamp::from_second(*anchor).ok();
                }
                let steps = (after_s - anchor) / every + 1;
                Timestamp::from_second(anchor.checked_add(steps.checked_mul(every)?)?).ok()
            }
            Schedule::Days { days, anchor } => next_day_run(*days, anchor, after, tz),
            Schedule::Cron { expr } => {
                let cron = parse_cron(expr).ok()?;
                next_cron(&cron, names_times(expr), after, tz)
            }
        }
    }

    /// The instants due from `first` (the stored next run, due at or
    /// before `now`) up to `now`: the newest `keep` of them and how many
    /// there are.
    pub fn due_until(&self, first: Timestamp, now: Timestamp, tz: &TimeZone, keep: usize) -> Due {
        let keep = keep.max(1);
        if first > now {
            return Due {
                newest: Vec::new(),
                count: 0,
                more: false,
            };
        }
        if let Schedule::Interval { every_secs, .. } = self {
            let every = (*every_secs).max(1);
            let count = (now.as_second() - first.as_second()) / every + 1;
            let start = (count - keep as i64).max(0);
            let newest = (start..count)
                .filter_map(|k| Timestamp::from_second(first.as_second() + k * every).ok())
                .collect();
            return Due {
                newest,
                count: u64::try_from(count).unwrap_or(0),
                more: false,
            };
        }
        let mut newest = std::collections::VecDeque::with_capacity(keep);
        let mut count = 0u64;
        let mut cursor = Some(first);
        while let Some(instant) = cursor.filter(|t| *t <= now) {
            count += 1;
            if newest.len() == keep {
                newest.pop_front();
            }
            newest.push_back(instant);
            if count >= WALK_LIMIT {
                // Jump to the newest instant; the ones between are only
                // counted as "more".
                let last = self.previous_at_or_before(now, tz).filter(|t| *t > instant);
                if let Some(last) = last {
                    newest.clear();
                    newest.push_back(last);
                    return Due {
                        newest: newest.into(),
                        count: count + 1,
                        more: true,
                    };
                }
                break;
            }
            cursor = self.next_after(instant, tz);
        }
        Due {
            newest: newest.into(),
            count,
            more: false,
        }
    }

    /// The newest instant at or before `at` (cron only; the others are
    /// walked or computed directly).
    fn previous_at_or_before(&self, at: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let Schedule::Cron { expr } = self else {
            return None;
        };
        let cron = parse_cron(expr).ok()?;
        cron.find_previous_occurrence(&at.to_zoned(tz.clone()), true)
            .ok()
            .map(|z| z.timestamp())
    }

    /// The shortest time between two runs, looking at the runs after
    /// `from` (for the `min_interval` cap); `None` for a one-time job or
    /// one that never runs twice.
    pub fn shortest_gap(&self, from: Timestamp, tz: &TimeZone) -> Option<SignedDuration> {
        match self {
            Schedule::Once { .. } => None,
            Schedule::Interval { every_secs, .. } => Some(SignedDuration::from_secs(*every_secs)),
            Schedule::Days { days, .. } => Some(SignedDuration::from_hours(i64::from(*days) * 23)),
            Schedule::Cron { .. } => {
                let horizon = from
                    .checked_add(SignedDuration::from_hours(24 * 400))
                    .ok()?;
                let mut previous = self.next_after(from, tz)?;
                let mut shortest: Option<SignedDuration> = None;
                for _ in 0..500 {
                    let Some(next) = self.next_after(previous, tz) else {
                        break;
                    };
                    let gap = next.duration_since(previous);
                    shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
                    if next > horizon {
                        break;
                    }
                    previous = next;
                }
                shortest
            }
        }
    }
}

/// The next cron instant after `after`, with the DST rule of the module
/// docs for expressions that name times.
fn next_cron(cron: &Cron, named: bool, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
    let mut after = after;
    // A repeated hour is skipped at most once per call in practice; the
    // bound only keeps a pathological zone from looping.
    for _ in 0..8 {
        let next = cron
            .find_next_occurrence(&after.to_zoned(tz.clone()), false)
            .ok()?
            .timestamp();
        if !named {
            return Some(next);
        }
        if let Some(gap_run) = skipped_in_gap(cron, after, next, tz) {
            return Some(gap_run);
        }
        if is_second_of_repeated(tz, next) {
            after = next;
            continue;
        }
        return Some(next);
    }
    None
}

/// The first instant after a DST gap lying in `(after, next]` whose
/// skipped local times the expression names.
fn skipped_in_gap(
    cron: &Cron,
    after: Timestamp,
    next: Timestamp,
    tz: &TimeZone,
) -> Option<Timestamp> {
    for transition in tz.following(after) {
        let at = transition.timestamp();
        if at > next {
            break;
        }
        let before = tz.to_offset(at.checked_sub(SignedDuration::from_secs(1)).ok()?);
        let gap = transition.offset().duration_since(before);
        if gap <= SignedDuration::ZERO {
            continue;
        }
        // The skipped local times, [at in `before`, + gap), exist in a zone
        // fixed at `before`: ask croner there.
        let fixed = TimeZone::fixed(before);
        let probe = at
            .checked_sub(SignedDuration::from_secs(1))
            .ok()?
            .to_zoned(fixed);
        if let Ok(found) = cron.find_next_occurrence(&probe, false) {
            let end = at.checked_add(gap).ok()?;
            if found.timestamp() < end {
                return Some(at);
            }
        }
    }
    None
}

/// Whether `instant` is the second (later) of the two instants of a local
/// time that happens twice.
fn is_second_of_repeated(tz: &TimeZone, instant: Timestamp) -> bool {
    let local = tz.to_datetime(instant);
    match tz.to_ambiguous_timestamp(local).offset() {
        AmbiguousOffset::Fold { after, .. } => tz.to_offset(instant) == after,
        _ => false,
    }
}

/// The instant of local time `local` in `tz`: a skipped time (a DST gap)
/// is the first instant after the gap, a repeated one the earlier instant.
pub fn resolve_local(tz: &TimeZone, local: DateTime) -> Option<Timestamp> {
    let ambiguous = tz.to_ambiguous_timestamp(local);
    match ambiguous.offset() {
        AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(local).ok(),
        AmbiguousOffset::Fold { before, .. } => before.to_timestamp(local).ok(),
        AmbiguousOffset::Gap { before, .. } => {
            // `local` read in the offset before the gap lies past the
            // transition; the transition itself is the first valid instant.
            let past = before.to_timestamp(local).ok()?;
            tz.preceding(past.checked_add(SignedDuration::from_secs(1)).ok()?)
                .next()
                .map(|t| t.timestamp())
        }
    }
}

/// The next run of a days schedule after `after`.
fn next_day_run(days: i32, anchor: &str, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
    let days = days.max(1);
    let anchor: DateTime = anchor.parse().ok()?;
    let after_date = tz.to_datetime(after).date();
    let elapsed = anchor.date().until(after_date).ok()?.get_days();
    // Start a period early: the run of the day `after` falls on may still
    // be ahead of it.
    let first = (elapsed / days - 1).max(0);
    for k in first..first + 4 {
        let local = anchor
            .checked_add(Span::new().days(i64::from(k) * i64::from(days)))
            .ok()?;
        let instant = resolve_local(tz, local)?;
        if instant > after {
            return Some(instant);
        }
    }
    None
}

impl FromStr for Schedule {
    type Err = CronRefusal;

    /// A cron schedule from its expression (for tests and the tool).
    fn from_str(expr: &str) -> Result<Schedule, CronRefusal> {
        parse_cron(expr)?;
        Ok(Schedule::Cron {
            expr: expr.split_whitespace().collect::<Vec<_>>().join(" "),
        })
    }
}

#[cfg(test)]
mod tests;
