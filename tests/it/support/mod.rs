//! Shared helpers for the integration tests: test agents, a recording
//! outbound, the fake Telegram Bot API and the fake OpenAI-compatible server.
#![allow(dead_code)]

pub mod agents;
pub mod binary;
pub mod buttons;
pub mod fake_agent_apis;
pub mod fake_bot;
pub mod fake_files;
pub mod fake_openai;
pub mod fake_speech;
pub mod fake_transcribe;
pub mod recorder;
pub mod store_faults;
pub mod test_bot;
pub mod tools_bot;
