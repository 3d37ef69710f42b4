//! What travels over the private socket between the permission helper
//! and telegate (pure): one JSON line each way, bounded in size.
//!
//! The helper sends a [`Request`] (the turn's token and what Claude Code
//! asked); telegate answers with a [`Decision`], whose JSON is exactly the
//! text Claude Code expects from a `--permission-prompt-tool`:
//! `{"behavior":"allow","updatedInput":…}` or
//! `{"behavior":"deny","message":…}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The longest request line (the tool's input is shown in full on the card,
/// so it is bounded here rather than cut).
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// The longest answer line (it echoes the input).
pub const MAX_REPLY_BYTES: usize = MAX_REQUEST_BYTES + 64 * 1024;

/// One permission request, helper → telegate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The turn's one-time token (only that turn's requests are answered).
    pub token: String,
    /// The tool Claude Code wants to use (`Bash`, `Edit`, `mcp__x__y`).
    pub tool_name: String,
    /// Its input.
    #[serde(default)]
    pub input: Value,
    /// Claude Code's id of this tool use, if it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
}

/// The answer, telegate → helper → Claude Code.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "behavior", rename_all = "lowercase")]
pub enum Decision {
    /// Use the tool with this input (the input as asked).
    Allow {
        /// The input to use.
        #[serde(rename = "updatedInput")]
        updated_input: Value,
    },
    /// Do not; `message` tells Claude why.
    Deny {
        /// Why, for the model.
        message: String,
    },
}

impl Decision {
    /// A refusal saying `why`.
    pub fn deny(why: impl Into<String>) -> Decision {
        Decision::Deny {
            message: why.into(),
        }
    }

    /// The JSON text Claude Code reads.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"behavior":"deny","message":"the decision could not be encoded"}"#.to_string()
        })
    }
}

/// Read one request line; the error is the refusal to send back.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    if line.len() > MAX_REQUEST_BYTES {
        return Err("the request is too large to show for approval".to_string());
    }
    let request: Request =
        serde_json::from_slice(line).map_err(|_| "the request could not be read".to_string())?;
    if request.tool_name.trim().is_empty() {
        return Err("the request names no tool".to_string());
    }
    Ok(request)
}

/// The tool's arguments as Claude Code sends them (`tool_name`, `input`,
/// `tool_use_id`), into a request with `token`.
pub fn request_from_arguments(
    token: &str,
    arguments: &serde_json::Map<String, Value>,
) -> Result<Request, String> {
    let tool_name = arguments
        .get("tool_name")
        .and_then(Value::as_str)
        .filter(|name| !name.trim().is_empty())
        .ok_or_else(|| "the permission request names no tool_name".to_string())?;
    Ok(Request {
        token: token.to_string(),
        tool_name: tool_name.to_string(),
        input: arguments.get("input").cloned().unwrap_or(Value::Null),
        tool_use_id: arguments
            .get("tool_use_id")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decisions_are_claude_codes_own_json() {
        let allow = Decision::Allow {
            updated_input: json!({"command": "ls"}),
        };
        assert_eq!(
            allow.to_text(),
            r#"{"behavior":"allow","updatedInput":{"command":"ls"}}"#
        );
        assert_eq!(
            Decision::deny("no").to_text(),
            r#"{"behavior":"deny","message":"no"}"#
        );
        let back: Decision = serde_json::from_str(&allow.to_text()).unwrap();
        assert_eq!(back, allow);
    }

    #[test]
    fn requests_are_checked() {
        let arguments = json!({"tool_name": "Bash", "input": {"command": "rm -rf x"}, "tool_use_id": "toolu_1"});
        let request = request_from_arguments("t", arguments.as_object().unwrap()).unwrap();
        assert_eq!(request.tool_use_id.as_deref(), Some("toolu_1"));
        let line = serde_json::to_vec(&request).unwrap();
        assert_eq!(parse_request(&line).unwrap(), request);
        assert!(request_from_arguments("t", json!({"input": {}}).as_object().unwrap()).is_err());
        assert!(parse_request(b"not json").is_err());
        assert!(parse_request(&vec![b' '; MAX_REQUEST_BYTES + 1])
            .unwrap_err()
            .contains("too large"));
    }
}
