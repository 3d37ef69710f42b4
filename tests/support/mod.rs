//! Shared helpers for the integration tests.
#![allow(dead_code)]

pub mod fake_openai;
pub mod recorder;
