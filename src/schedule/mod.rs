//! Scheduled jobs and reminders that run exactly once per instant, also
//! across restarts.
//!
//! A **job** belongs to a chat slot and the user who made it; it has a
//! schedule ([`spec::Schedule`]: once, cron, an interval, every N days) in
//! a time zone, and an action ([`when::Action`]): a prompt run as a turn
//! (in the slot's current session, or a fresh one per run) or a plain
//! message sent as is. Users make them with `/at`, `/in`, `/every` and
//! `/cron` ([`when`]), the model with the `schedule` tool ([`tool`]), a
//! command-backend program with request files ([`requests`]); `/jobs`,
//! `/pause`, `/resume`, `/unschedule` and `/timezone` manage them
//! ([`service::Jobs`], answered by the runner).
//!
//! A due run is an **internal event**, like a background process's
//! wakeup, built on what makes a user's message safe:
//!
//! * it is journaled in the inbox, under an id derived from (job, instant)
//!   ([`run::run_id`]), in the same transaction that moves the job on, and
//!   only then handed to the adapter ([`scheduler`]); a crash or `kill -9`
//!   at any point neither loses nor repeats it (restart recovery replays
//!   the journal, the inbox key refuses a second row, the outbox sends its
//!   answer once);
//! * it queues silently behind a running turn and never interrupts it;
//!   `/stop` stops it like any turn, `/new` leaves jobs alone;
//! * runs missed while telegate was down follow `[schedule] catch_up`
//!   ([`run::plan_firing`]); never a burst;
//! * a job failing `max_failures` runs in a row is paused and its chat
//!   told; caps per chat (`max_jobs_per_chat`, `min_interval`) are enforced
//!   with a clear message.
//!
//! The scheduler is one task sleeping until the earliest next run (one
//! index lookup, nothing per job in memory); wall time comes from a
//! [`clock::Clock`], so tests drive it with tokio's paused clock.
//!
//! Layering: this module produces internal events (handed to a
//! [`scheduler::RunSink`], the adapter) and reads and writes the store; it
//! never calls the transport and never sends anything itself.

pub mod clock;
pub mod config;
pub mod health;
pub mod requests;
pub mod run;
pub mod scheduler;
pub mod service;
pub mod spec;
pub mod text;
pub mod tool;
pub mod when;

pub use clock::{Clock, SystemClock, TokioClock};
pub use config::ScheduleConfig;
pub use health::SchedulerHealth;
pub use requests::{apply_env, turn_jobs, with_turn_jobs, TurnJobs};
pub use run::{run_id, run_of, CatchUp};
pub use scheduler::{spawn, RunSink};
pub use service::{Change, Jobs, SpendGate};
pub use spec::Schedule;
pub use tool::WithSchedule;
pub use when::{parse_job, Action, Form, JobRequest};
