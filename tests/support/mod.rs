//! Shared helpers for the integration tests: test agents, a recording
//! outbound, and the fake Telegram Bot API.
#![allow(dead_code)]

pub mod agents;
pub mod fake_bot;
pub mod recorder;
