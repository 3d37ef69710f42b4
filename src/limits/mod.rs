//! Per-user budgets (`[limits]`) and usage.
//!
//! A budget is up to three limits per user: tokens per day, cost per day
//! (US dollars, as the backend reports it) and turns per hour; any may be
//! unset. A role may have its own table (`[limits.owner]`, `[limits.admin]`,
//! `[limits.user]`), which then replaces the base limits for that role
//! entirely (an empty table: no limits).
//!
//! Every spend is reserved before it runs, and decided before anything
//! changes:
//!
//! * **Before a turn** ([`Limits::check`]) the user's usage is read from
//!   the store and their running turns in this process are added (each at
//!   the larger of its reservation and its use, [`ledger`]); a turn over a
//!   limit is refused with which limit and when it resets, and nothing of
//!   it is charged (no usage row, no transcript). A turn let in is booked
//!   under the same lock with its reservation ([`LimitsConfig::reserve_for`]),
//!   so turns started together cannot all pass: together they pass the
//!   limit by at most one turn's reservation (plus one model round each).
//! * **During a turn** the backends report usage into the turn's
//!   [`meter`] (a task-local the runner binds), and the openai tool loop
//!   asks it between rounds: at the limit (counting the user's other
//!   running turns), the loop ends with a short note. A request that ends
//!   without usage is charged an estimate from its characters.
//! * **After a turn** the runner records what the meter saw, one row per
//!   turn ([`crate::store::usage`]), also for a turn that was stopped, and
//!   then ends its booking.
//!
//! "Today" is the day in the bot's zone ([`Limits::day_zone`]: `[schedule]
//! timezone`, else the system's), the same for every user and chat: no
//! setting a user controls (a chat's `/timezone`) moves a budget day.
//! Reset times are shown in the chat's zone. The clock is injectable
//! ([`crate::clock::Clock`]).
//!
//! This module owns the limits and their wording. It must never refuse a
//! command (only turns and the making of prompt jobs) and never charge a
//! refused turn.

mod counts;
pub mod ledger;
pub mod meter;
pub mod zone;

use serde::Deserialize;

use crate::access::Role;
use crate::clock::Clock;
use crate::store::{AgentUsage, Jobs, StoreError, Usage};

pub use counts::Amount;
pub use ledger::Ledger;
pub use meter::TurnMeter;

/// Tokens a turn reserves when it starts, unless `[limits] reserve_tokens`
/// says otherwise.
pub const DEFAULT_RESERVE_TOKENS: u64 = 20_000;
/// Dollars a turn reserves when it starts, unless `[limits]
/// reserve_cost_usd` says otherwise.
pub const DEFAULT_RESERVE_COST_USD: f64 = 0.05;

/// One set of limits; `None` is no limit.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Tokens (input, cached input and output) per day.
    #[serde(default)]
    pub daily_tokens: Option<u64>,
    /// Cost in US dollars per day, as the backend reports it.
    #[serde(default)]
    pub daily_cost_usd: Option<f64>,
    /// Turns per hour (any 60 minutes).
    #[serde(default)]
    pub turns_per_hour: Option<u32>,
}

impl Budget {
    fn is_unlimited(&self) -> bool {
        self.daily_tokens.is_none()
            && self.daily_cost_usd.is_none()
            && self.turns_per_hour.is_none()
    }

    fn validate(&self, table: &str) -> Result<(), String> {
        if let Some(cost) = self.daily_cost_usd {
            if !cost.is_finite() || cost < 0.0 {
                return Err(format!(
                    "{table}.daily_cost_usd must be a number of dollars, 0 or more (it is {cost})"
                ));
            }
        }
        Ok(())
    }
}

/// `[limits]`: the base budget, and per-role tables replacing it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Tokens per day (base).
    #[serde(default)]
    pub daily_tokens: Option<u64>,
    /// Dollars per day (base).
    #[serde(default)]
    pub daily_cost_usd: Option<f64>,
    /// Turns per hour (base).
    #[serde(default)]
    pub turns_per_hour: Option<u32>,
    /// Tokens a starting turn reserves (at least; more when the user's
    /// turns today averaged more): [`DEFAULT_RESERVE_TOKENS`] unset.
    #[serde(default)]
    pub reserve_tokens: Option<u64>,
    /// Dollars a starting turn reserves (at least, as `reserve_tokens`):
    /// [`DEFAULT_RESERVE_COST_USD`] unset.
    #[serde(default)]
    pub reserve_cost_usd: Option<f64>,
    /// `[limits.owner]`: replaces the base for the owner.
    #[serde(default)]
    pub owner: Option<Budget>,
    /// `[limits.admin]`: replaces the base for admins.
    #[serde(default)]
    pub admin: Option<Budget>,
    /// `[limits.user]`: replaces the base for users (and for anyone let in
    /// by `allow_all_users` or `allowed_chats`).
    #[serde(default)]
    pub user: Option<Budget>,
}

impl LimitsConfig {
    /// Check the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        self.base().validate("limits")?;
        if let Some(cost) = self.reserve_cost_usd {
            if !cost.is_finite() || cost < 0.0 {
                return Err(format!(
                    "limits.reserve_cost_usd must be a number of dollars, 0 or more (it is {cost})"
                ));
            }
        }
        for (name, budget) in [
            ("limits.owner", &self.owner),
            ("limits.admin", &self.admin),
            ("limits.user", &self.user),
        ] {
            if let Some(budget) = budget {
                budget.validate(name)?;
            }
        }
        Ok(())
    }

    fn base(&self) -> Budget {
        Budget {
            daily_tokens: self.daily_tokens,
            daily_cost_usd: self.daily_cost_usd,
            turns_per_hour: self.turns_per_hour,
        }
    }

    /// The budget of a user of `role` (`None`: not a member, let in by an
    /// open chat, counted as a user).
    pub fn budget_for(&self, role: Option<Role>) -> Budget {
        let table = match role {
            Some(Role::Owner) => &self.owner,
            Some(Role::Admin) => &self.admin,
            Some(Role::User) | None => &self.user,
        };
        table.clone().unwrap_or_else(|| self.base())
    }

    /// What a turn reserves when it starts (pure): the configured amount,
    /// or the average of the user's turns `today` if that is more; one
    /// turn.
    pub fn reserve_for(&self, today: &AgentUsage) -> Amount {
        let turns = today.turns.max(1);
        let average_cost = if today.turns == 0 {
            0.0
        } else {
            today.cost_usd / today.turns as f64
        };
        Amount {
            tokens: self
                .reserve_tokens
                .unwrap_or(DEFAULT_RESERVE_TOKENS)
                .max(tokens_of(today) / turns),
            cost: self
                .reserve_cost_usd
                .unwrap_or(DEFAULT_RESERVE_COST_USD)
                .max(average_cost),
            turns: 1,
        }
    }

    /// No limit is set anywhere.
    pub fn is_unlimited(&self) -> bool {
        [
            Some(self.base()),
            self.owner.clone(),
            self.admin.clone(),
            self.user.clone(),
        ]
        .into_iter()
        .flatten()
        .all(|b| b.is_unlimited())
    }
}

/// Which limit a turn ran into.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LimitKind {
    /// Tokens per day (the limit).
    DailyTokens(u64),
    /// Dollars per day (the limit).
    DailyCost(f64),
    /// Turns per hour (the limit).
    TurnsPerHour(u32),
}

/// What a user spent, as the checks need it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spent {
    /// Tokens today.
    pub tokens_today: u64,
    /// Dollars today.
    pub cost_today: f64,
    /// Turns in the last hour.
    pub turns_last_hour: u32,
}

/// The limit `spent` has reached under `budget`, if any (pure).
pub fn reached(budget: &Budget, spent: &Spent) -> Option<LimitKind> {
    if let Some(limit) = budget.turns_per_hour {
        if spent.turns_last_hour >= limit {
            return Some(LimitKind::TurnsPerHour(limit));
        }
    }
    if let Some(limit) = budget.daily_tokens {
        if spent.tokens_today >= limit {
            return Some(LimitKind::DailyTokens(limit));
        }
    }
    if let Some(limit) = budget.daily_cost_usd {
        if spent.cost_today >= limit {
            return Some(LimitKind::DailyCost(limit));
        }
    }
    None
}

/// All tokens of a usage (input, cached input, output).
pub fn tokens_of(usage: &AgentUsage) -> u64 {
    usage
        .input_tokens
        .saturating_add(usage.cached_input_tokens)
        .saturating_add(usage.output_tokens)
}

/// What a limit is called in a sentence.
fn limit_name(kind: LimitKind) -> String {
    match kind {
        LimitKind::DailyTokens(n) => format!("daily budget of {} tokens", human_count(n)),
        LimitKind::DailyCost(usd) => format!("daily budget of ${usd:.2}"),
        LimitKind::TurnsPerHour(n) => format!("limit of {n} messages per hour"),
    }
}

/// The refusal of a turn at `kind`, free again at `resets` (local time
/// text, e.g. "00:00 (Europe/Berlin)").
pub fn refusal_text(kind: LimitKind, resets: &str) -> String {
    format!(
        "⏳ You have reached your {}. It resets at {resets}; this message was not run \
         (and not counted).",
        limit_name(kind)
    )
}

/// The note a tool loop ends with at `kind`.
pub fn stopped_note(kind: LimitKind, resets: &str) -> String {
    format!(
        "(Stopped: your {} was reached during this task; it resets at {resets}.)",
        limit_name(kind)
    )
}

/// 950, 12.3k, 4.5M.
pub fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}k", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// How a usage reads in /usage and /users: "3 turns, 12.3k tokens, $0.0123".
pub fn usage_line(usage: &AgentUsage) -> String {
    let turns = if usage.turns == 1 { "turn" } else { "turns" };
    let mut text = format!(
        "{} {turns}, {} tokens",
        usage.turns,
        human_count(tokens_of(usage))
    );
    if usage.cost_usd > 0.0 {
        text.push_str(&format!(", ${:.4}", usage.cost_usd));
    }
    text
}

/// The budgets, the clock they run on, and the running turns' bookings.
/// Cheap to clone; clones share the bookings.
#[derive(Clone, Debug, Default)]
pub struct Limits {
    config: LimitsConfig,
    clock: Clock,
    /// The zone of every day and shown time (tests); `None`: the budget
    /// days follow `default_zone`, shown times the chat's.
    zone: Option<jiff::tz::TimeZone>,
    /// The bot's zone (`[schedule] timezone`); `None`: the system's.
    default_zone: Option<jiff::tz::TimeZone>,
    /// Every user's running turns in this process.
    ledger: Ledger,
}

/// Whether a turn may run.
#[derive(Debug)]
pub enum Verdict {
    /// It may: its meter, booked until the last clone of it is dropped.
    Go(TurnMeter),
    /// It may not: which limit, and when it frees up.
    Refused(Refusal),
}

/// A turn may run: what is left of its user's budget (for its meter).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allowance {
    /// Tokens left today (before the user's running turns).
    pub tokens_left: Option<u64>,
    /// Dollars left today (before the user's running turns).
    pub cost_left: Option<f64>,
    /// When the daily limits reset (local time text).
    pub resets: String,
}

/// A limit that refuses a turn (or a prompt job).
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// The limit.
    pub kind: LimitKind,
    /// When it frees up (local time text).
    pub resets: String,
    /// Reached only with the user's running turns counted (their
    /// reservations): it frees up as they finish.
    pub by_running: bool,
}

impl Refusal {
    /// The refusal of `what` ("this message", "this scheduled run").
    pub fn text(&self, what: &str) -> String {
        if self.by_running {
            return format!(
                "⏳ Your tasks still running have reserved the rest of your {}; {what} was not \
                 run (and not counted). Send it again when they have finished.",
                limit_name(self.kind)
            );
        }
        refusal_text(self.kind, &self.resets).replace("this message", what)
    }

    /// The refusal of a job that would run prompts.
    pub fn job_text(&self) -> String {
        format!(
            "⏳ You have reached your {}; it resets at {}. A job that runs a prompt is not made \
             while you are over it (a reminder still is).",
            limit_name(self.kind),
            self.resets
        )
    }
}

/// The limit a turn would pass (pure): reached by what is `stored`, or
/// only with what is `in_flight` added (`true`).
pub fn decide(budget: &Budget, stored: &Spent, in_flight: Amount) -> Option<(LimitKind, bool)> {
    if let Some(kind) = reached(budget, stored) {
        return Some((kind, false));
    }
    let with_running = Spent {
        tokens_today: stored.tokens_today.saturating_add(in_flight.tokens),
        cost_today: stored.cost_today + in_flight.cost,
        turns_last_hour: stored
            .turns_last_hour
            .saturating_add(u32::try_from(in_flight.turns).unwrap_or(u32::MAX)),
    };
    reached(budget, &with_running).map(|kind| (kind, true))
}

/// What the store says a user spent: the sums, today's usage, the turn
/// times of the last hour.
struct Stored {
    spent: Spent,
    today: AgentUsage,
    last_hour: Vec<i64>,
}

impl Limits {
    /// Budgets from `config`, on `clock`.
    pub fn new(config: LimitsConfig, clock: Clock) -> Limits {
        Limits {
            config,
            clock,
            zone: None,
            default_zone: None,
            ledger: Ledger::default(),
        }
    }

    /// The bot's zone: budget days follow it (and chats without a
    /// `/timezone` show times in it).
    pub fn with_default_zone(mut self, zone: jiff::tz::TimeZone) -> Limits {
        self.default_zone = Some(zone);
        self
    }

    /// Every day and shown time follows `zone` (tests).
    pub fn with_zone(mut self, zone: jiff::tz::TimeZone) -> Limits {
        self.zone = Some(zone);
        self
    }

    /// The clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The settings.
    pub fn config(&self) -> &LimitsConfig {
        &self.config
    }

    /// The running turns' bookings.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The zone every user's budget day is counted in: the bot's, never a
    /// setting a user controls.
    pub fn day_zone(&self) -> jiff::tz::TimeZone {
        self.zone
            .clone()
            .or_else(|| self.default_zone.clone())
            .unwrap_or_else(jiff::tz::TimeZone::system)
    }

    /// The time zone `chat_id` is shown times in (its `/timezone`).
    pub async fn zone(&self, jobs: &Jobs, chat_id: i64) -> jiff::tz::TimeZone {
        match &self.zone {
            Some(zone) => zone.clone(),
            None => {
                let default = self
                    .default_zone
                    .clone()
                    .unwrap_or_else(jiff::tz::TimeZone::system);
                zone::chat_time_zone(jobs, chat_id, &default).await
            }
        }
    }

    /// When today's budget day ends, in `chat_id`'s shown zone.
    async fn resets_text(&self, jobs: &Jobs, chat_id: i64) -> (String, jiff::tz::TimeZone) {
        let shown = self.zone(jobs, chat_id).await;
        let today = zone::day_range(&self.day_zone(), self.clock.now());
        (zone::local_time_text(&shown, today.1), shown)
    }

    async fn stored(&self, usage: &Usage, user: u64) -> Result<Stored, StoreError> {
        let now = self.clock.now();
        let today = zone::day_range(&self.day_zone(), now);
        let used = usage
            .usage_between(Some(user), today.0, today.1)
            .await?
            .remove(&user)
            .unwrap_or_default();
        let last_hour = usage
            .turn_times_since(user, now.as_millisecond() - 3_600_000)
            .await?;
        Ok(Stored {
            spent: Spent {
                tokens_today: tokens_of(&used),
                cost_today: used.cost_usd,
                turns_last_hour: u32::try_from(last_hour.len()).unwrap_or(u32::MAX),
            },
            today: used,
            last_hour,
        })
    }

    /// The refusal of `kind`, its reset time shown in `shown`.
    fn refusal(
        &self,
        (kind, by_running): (LimitKind, bool),
        stored: &Stored,
        resets: String,
        shown: &jiff::tz::TimeZone,
    ) -> Refusal {
        let resets = match kind {
            // A turn is free again an hour after the oldest one counted.
            LimitKind::TurnsPerHour(_) => {
                let now = self.clock.now().as_millisecond();
                let free_at = stored.last_hour.first().copied().unwrap_or(now - 3_600_000);
                zone::local_time_text(shown, free_at + 3_600_000)
            }
            _ => resets,
        };
        Refusal {
            kind,
            resets,
            by_running,
        }
    }

    /// May `user` (of `role`) start a turn in `chat_id`? Reads the
    /// store's usage only when a limit is set; a turn let in is booked
    /// (its meter holds the booking).
    pub async fn check(
        &self,
        usage: &Usage,
        jobs: &Jobs,
        user: u64,
        role: Option<Role>,
        chat_id: i64,
    ) -> Result<Verdict, StoreError> {
        let budget = self.config.budget_for(role);
        let (resets, shown) = self.resets_text(jobs, chat_id).await;
        if budget.is_unlimited() {
            let allowance = Allowance {
                resets,
                ..Allowance::default()
            };
            return Ok(Verdict::Go(TurnMeter::new(allowance, (None, None))));
        }
        // Taken before the store is read: what settles after it is added.
        let settled_before = self.ledger.settled(user);
        let stored = self.stored(usage, user).await?;
        let spent = stored.spent;
        let reserve = self.config.reserve_for(&stored.today);
        let shared = counts::Shared::default();
        let booked = self.ledger.book(
            user,
            settled_before,
            shared.clone(),
            |in_flight| match decide(&budget, &spent, in_flight) {
                Some(reached) => Err(reached),
                None => Ok(reserve),
            },
        );
        let reservation = match booked {
            Ok(reservation) => reservation,
            Err(reached) => {
                return Ok(Verdict::Refused(
                    self.refusal(reached, &stored, resets, &shown),
                ))
            }
        };
        let allowance = Allowance {
            tokens_left: budget
                .daily_tokens
                .map(|limit| limit.saturating_sub(spent.tokens_today)),
            cost_left: budget
                .daily_cost_usd
                .map(|limit| (limit - spent.cost_today).max(0.0)),
            resets,
        };
        Ok(Verdict::Go(TurnMeter::booked(
            shared,
            (allowance, (budget.daily_tokens, budget.daily_cost_usd)),
            (self.ledger.clone(), user, settled_before),
            reservation,
        )))
    }

    /// Is `user` (of `role`) over a limit now, by what the store says
    /// (a prompt job is not made then)? Nothing is booked.
    pub async fn over_limit(
        &self,
        usage: &Usage,
        jobs: &Jobs,
        user: u64,
        role: Option<Role>,
        chat_id: i64,
    ) -> Result<Option<Refusal>, StoreError> {
        let budget = self.config.budget_for(role);
        if budget.is_unlimited() {
            return Ok(None);
        }
        let stored = self.stored(usage, user).await?;
        let Some(kind) = reached(&budget, &stored.spent) else {
            return Ok(None);
        };
        let (resets, shown) = self.resets_text(jobs, chat_id).await;
        Ok(Some(self.refusal((kind, false), &stored, resets, &shown)))
    }
}

#[cfg(test)]
mod tests {
    use super::{
        decide, reached, refusal_text, stopped_note, usage_line, AgentUsage, Amount, Budget,
        LimitKind, Limits, LimitsConfig, Refusal, Role, Spent, Verdict,
    };
    use crate::clock::Clock;
    use crate::store::{Store, TurnUsage};

    fn limits(text: &str) -> LimitsConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn a_role_table_replaces_the_base_entirely() {
        let config = limits(
            "daily_tokens = 100\nturns_per_hour = 5\n[owner]\n[admin]\ndaily_tokens = 1000\n",
        );
        assert_eq!(config.budget_for(Some(Role::Owner)), Budget::default());
        assert_eq!(
            config.budget_for(Some(Role::Admin)),
            Budget {
                daily_tokens: Some(1000),
                ..Budget::default()
            }
        );
        let user = config.budget_for(Some(Role::User));
        assert_eq!(
            (user.daily_tokens, user.turns_per_hour),
            (Some(100), Some(5))
        );
        assert_eq!(config.budget_for(None), user);
        assert!(!config.is_unlimited());
        assert!(LimitsConfig::default().is_unlimited());
        assert!(toml::from_str::<LimitsConfig>("daily_tokns = 1").is_err());
        assert!(limits("daily_cost_usd = -1.0").validate().is_err());
        assert!(limits("[user]\ndaily_cost_usd = nan").validate().is_err());
    }

    #[test]
    fn each_limit_is_reached_at_its_value_not_before() {
        let budget = Budget {
            daily_tokens: Some(100),
            daily_cost_usd: Some(1.0),
            turns_per_hour: Some(3),
        };
        let under = Spent {
            tokens_today: 99,
            cost_today: 0.99,
            turns_last_hour: 2,
        };
        assert_eq!(reached(&budget, &under), None);
        let tokens = Spent {
            tokens_today: 100,
            ..under
        };
        assert_eq!(reached(&budget, &tokens), Some(LimitKind::DailyTokens(100)));
        let cost = Spent {
            cost_today: 1.0,
            ..under
        };
        assert_eq!(reached(&budget, &cost), Some(LimitKind::DailyCost(1.0)));
        let turns = Spent {
            turns_last_hour: 3,
            ..under
        };
        assert_eq!(reached(&budget, &turns), Some(LimitKind::TurnsPerHour(3)));
        assert_eq!(reached(&Budget::default(), &turns), None);
    }

    #[test]
    fn refusals_say_which_limit_and_when_it_resets() {
        let text = refusal_text(LimitKind::DailyTokens(200_000), "00:00 (Europe/Berlin)");
        assert!(text.contains("daily budget of 200.0k tokens"), "{text}");
        assert!(text.contains("resets at 00:00 (Europe/Berlin)"), "{text}");
        assert!(text.contains("not counted"), "{text}");
        assert!(refusal_text(LimitKind::DailyCost(2.0), "x").contains("$2.00"));
        assert!(refusal_text(LimitKind::TurnsPerHour(20), "x").contains("20 messages per hour"));
        assert!(stopped_note(LimitKind::DailyTokens(5), "00:00").starts_with("(Stopped"));
        let line = usage_line(&AgentUsage {
            turns: 1,
            input_tokens: 1000,
            cached_input_tokens: 200,
            output_tokens: 34,
            cost_usd: 0.5,
        });
        assert_eq!(line, "1 turn, 1.2k tokens, $0.5000");
    }

    #[test]
    fn running_turns_count_after_what_is_stored() {
        let budget = Budget {
            daily_tokens: Some(100),
            daily_cost_usd: None,
            turns_per_hour: Some(3),
        };
        let stored = Spent {
            tokens_today: 60,
            ..Spent::default()
        };
        let running = |tokens, turns| Amount {
            tokens,
            cost: 0.0,
            turns,
        };
        assert_eq!(decide(&budget, &stored, running(39, 1)), None);
        assert_eq!(
            decide(&budget, &stored, running(40, 1)),
            Some((LimitKind::DailyTokens(100), true))
        );
        assert_eq!(
            decide(&budget, &stored, running(0, 3)),
            Some((LimitKind::TurnsPerHour(3), true))
        );
        let over = Spent {
            tokens_today: 100,
            ..Spent::default()
        };
        assert_eq!(
            decide(&budget, &over, Amount::default()),
            Some((LimitKind::DailyTokens(100), false))
        );
        let refusal = Refusal {
            kind: LimitKind::DailyTokens(100),
            resets: "00:00 (UTC)".into(),
            by_running: true,
        };
        let text = refusal.text("this scheduled run");
        assert!(
            text.contains("still running") && text.contains("this scheduled run"),
            "{text}"
        );
        let text = Refusal {
            by_running: false,
            ..refusal.clone()
        }
        .text("this scheduled run");
        assert!(text.contains("this scheduled run was not run"), "{text}");
        assert!(
            refusal.job_text().contains("prompt"),
            "{}",
            refusal.job_text()
        );
    }

    #[test]
    fn a_turn_reserves_the_configured_amount_or_the_days_average() {
        let config = limits("reserve_tokens = 1000\nreserve_cost_usd = 0.5\n");
        let none = config.reserve_for(&AgentUsage::default());
        assert_eq!((none.tokens, none.cost, none.turns), (1000, 0.5, 1));
        let busy = config.reserve_for(&AgentUsage {
            turns: 2,
            input_tokens: 5000,
            output_tokens: 1000,
            cost_usd: 3.0,
            ..AgentUsage::default()
        });
        assert_eq!((busy.tokens, busy.cost), (3000, 1.5));
        let default = LimitsConfig::default().reserve_for(&AgentUsage::default());
        assert_eq!(default.tokens, super::DEFAULT_RESERVE_TOKENS);
        assert!(limits("reserve_cost_usd = -1.0").validate().is_err());
    }

    /// Five turns of one user checked at once: each booked turn counts its
    /// reservation for the next, so only as many start as the budget has
    /// room for.
    #[tokio::test]
    async fn turns_checked_together_are_booked_against_each_other() {
        let store = Store::open_in_memory().unwrap();
        let clock = Clock::manual(1_700_000_000_000);
        let config = limits("daily_tokens = 100000\nreserve_tokens = 30000\n");
        let limits = Limits::new(config, clock).with_zone(jiff::tz::TimeZone::UTC);
        let (usage, jobs) = (store.usage(), store.jobs());
        let checks = (0..5).map(|chat| limits.check(&usage, &jobs, 7, Some(Role::User), chat));
        let verdicts = futures::future::join_all(checks).await;
        let mut meters = Vec::new();
        let mut refused = Vec::new();
        for verdict in verdicts {
            match verdict.unwrap() {
                Verdict::Go(meter) => meters.push(meter),
                Verdict::Refused(refusal) => refused.push(refusal),
            }
        }
        // 0, 30k, 60k and 90k booked are under 100k; the fifth is not.
        assert_eq!((meters.len(), refused.len()), (4, 1));
        assert!(refused[0].by_running, "{refused:?}");
        // Another user is not held up by this one's turns.
        assert!(matches!(
            limits
                .check(&usage, &jobs, 8, Some(Role::User), 0)
                .await
                .unwrap(),
            Verdict::Go(_)
        ));
        // A running turn's meter sees the others' reservations: three
        // others reserve 90k, so 10k of its own reaches the limit.
        let first = meters.remove(0);
        first.add(&AgentUsage {
            input_tokens: 9_000,
            ..AgentUsage::default()
        });
        assert_eq!(first.over_budget(), None);
        first.add(&AgentUsage {
            input_tokens: 1_000,
            ..AgentUsage::default()
        });
        assert!(first.over_budget().is_some());
        // Finished turns free their reservations; what they used (nothing,
        // here) is what counts, whether or not their row is in the store.
        drop(meters);
        assert_eq!(first.over_budget(), None);
        // A row written for a finished turn is counted once.
        store
            .usage()
            .record_turn_usage(TurnUsage {
                user_id: 7,
                chat_id: 0,
                session_id: "s".into(),
                at_ms: 1_700_000_000_000,
                usage: first.used(),
            })
            .await
            .unwrap();
        drop(first);
        let again = limits
            .check(&usage, &jobs, 7, Some(Role::User), 0)
            .await
            .unwrap();
        let Verdict::Go(meter) = again else {
            panic!("10k of 100k used: {again:?}")
        };
        meter.add(&AgentUsage {
            input_tokens: 89_999,
            ..AgentUsage::default()
        });
        assert_eq!(meter.over_budget(), None, "10k stored + 89,999 is under");
    }
}
