//! Shared helpers for integration tests.
//!
//! Include from a test crate with `mod support;` and use e.g.
//! `support::fake_bot::FakeBotApi`.

pub mod fake_bot;
