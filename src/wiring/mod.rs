//! Wiring: everything built from the configuration.
//!
//! This is the one layer above the config loader: it reads [`Config`]
//! and hands each layer its own settings (the layers below never see the
//! configuration as a whole), builds the engine, the Telegram bot and the
//! console from them, and runs them (`telegate run`, `telegate console`).
//! The Telegram bot is built one way, `TelegramBot::start` (in
//! [`telegram`]): connect → wire → serve; `telegate run` ([`run`]) starts the
//! file's bots as a [`fleet::Fleet`] (one bot alone, or several sharing
//! the store and listeners); the console's engine comes from
//! [`engine::open_engine`], through the same `Engine::new`.
//!
//! It owns no behaviour of its own: every decision stays in the layer that
//! makes it.
//!
//! [`Config`]: crate::config::Config

pub mod console;
pub mod engine;
pub mod fleet;
pub mod run;
pub mod tables;
pub mod telegram;
