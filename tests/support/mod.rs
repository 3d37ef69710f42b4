//! Shared helpers for the integration tests.
#![allow(dead_code)]

pub mod agents;
pub mod recorder;
