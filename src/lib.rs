//! telegate: an AI agent behind a Telegram chat, with session control that
//! never gets stuck and never loses a message.
//!
//! The layers, top to bottom (see `ARCHITECTURE.md` for the map):
//!
//! * [`transport`]: Telegram (polling, webhook) and the console turn their
//!   input into [`vocab::MessageEvent`]s and hand them to the adapter;
//! * [`adapter`]: per-slot guards, owner tasks, queues, stale-lock healing,
//!   the command path;
//! * [`runner`]: turns, generations, slash commands, the stall watchdog;
//! * [`agent`]: the backends that answer;
//! * [`tools`]: what an LLM backend lets the model call;
//! * [`reply`]: the outbound port the transports implement;
//! * [`delivery`]: Markdown to Telegram entities, splitting, pacing, retries,
//!   streaming edits;
//! * [`store`]: SQLite sessions and transcripts on a dedicated thread;
//! * [`metrics`]: the explicit metrics registry every component records into;
//! * [`http`]: the optional `/healthz` and `/metrics` listener;
//! * [`listener`]: the accept loop both HTTP listeners share (connection
//!   cap, read deadlines);
//! * [`access`]: pairing, roles and invites (who may use the bot);
//! * [`limits`]: per-user budgets and usage, days in the chat's zone;
//! * [`clock`]: the injectable wall clock codes and budgets run on.
//!
//! Everything is re-exported here for the binary, the tests and the benches.

#![warn(missing_docs, unreachable_pub)]

pub mod access;
pub mod adapter;
pub mod agent;
pub mod clock;
pub mod config;
pub mod delivery;
pub mod engine;
pub mod http;
pub mod instance_lock;
pub mod journal;
pub mod limits;
pub mod listener;
pub mod media;
pub mod memory;
pub mod metrics;
pub mod private_fs;
pub mod reply;
pub mod runner;
pub mod schedule;
pub mod secrets;
pub mod store;
pub mod systemd;
pub mod tools;
pub mod transport;
pub mod vocab;
pub mod wiring;
pub mod worktree;
