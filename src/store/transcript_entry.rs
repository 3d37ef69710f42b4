//! One message of a transcript ([`TranscriptEntry`]), as the store records
//! it and hands it back. Its own file because both the transcript's SQL
//! (`store::transcript`) and the memory of recent history
//! (`store::history_cache`) hold entries, and the one uses the other.
//!
//! This module owns the type and its conversions. It must never run SQL.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::now_ms;
use crate::vocab::{ChatMessage, Role};

/// One message of a transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptEntry {
    /// Who wrote it.
    pub role: Role,
    /// The text (may be empty for an assistant message that only calls tools).
    pub content: String,
    /// The tool calls an assistant message makes (JSON, as the model sent it).
    pub tool_calls: Option<Value>,
    /// For a tool result: the id of the call it answers.
    pub tool_call_id: Option<String>,
    /// Optional author name (e.g. the tool's name).
    pub name: Option<String>,
    /// The message was cut short before it was complete.
    pub interrupted: bool,
    /// When it was written (unix ms).
    pub created_at_ms: i64,
}

impl TranscriptEntry {
    /// A plain message with `role` and `content`, stamped now.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        TranscriptEntry {
            role,
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            interrupted: false,
            created_at_ms: now_ms(),
        }
    }

    /// A system message, stamped now.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    /// A user message, stamped now.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    /// An assistant message, stamped now.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }

    /// A tool result answering call `tool_call_id`, stamped now.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        TranscriptEntry {
            tool_call_id: Some(tool_call_id.into()),
            ..Self::new(Role::Tool, content)
        }
    }
}

impl TranscriptEntry {
    /// The entry as the agent sees it.
    pub fn into_message(self) -> ChatMessage {
        ChatMessage {
            role: self.role,
            content: self.content,
            tool_calls: self.tool_calls,
            tool_call_id: self.tool_call_id,
            name: self.name,
        }
    }

    /// A message produced by a turn, stamped now.
    pub fn from_message(message: ChatMessage) -> Self {
        TranscriptEntry {
            tool_calls: message.tool_calls,
            tool_call_id: message.tool_call_id,
            name: message.name,
            ..TranscriptEntry::new(message.role, message.content)
        }
    }
}
