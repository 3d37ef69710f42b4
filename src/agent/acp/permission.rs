//! An ACP permission request (`session/request_permission`) as the
//! approval gate's request, and the gate's decision as the agent's answer.
//!
//! The prompt names the tool call (its title), shows its input (the raw
//! input, and what its content says: a diff's path and new text, text
//! blocks) and offers the agent's options as they are. Answers:
//!
//! * an option chosen (button, `/approve`, `/deny`) is `selected` with its id;
//! * /stop, /new, /reset, or the turn ending: `cancelled`, as the protocol
//!   requires after `session/cancel`;
//! * a timeout (or a request replaced by a newer one): the agent's first
//!   rejecting option (reject once before reject always), `cancelled` if it
//!   offers none.
//!
//! Pure: no I/O.

use std::time::Duration;

use agent_client_protocol::v1::schema::{
    ContentBlock, PermissionOption, PermissionOptionKind, RequestPermissionOutcome,
    RequestPermissionRequest, SelectedPermissionOutcome, ToolCallContent,
};

use crate::tools::approval::{ApprovalOption, ApprovalRequest, Decision, Denial, OptionKind};
use crate::tools::approval_prompt::options_request_text;

/// The input shown is cut after this many characters (a request's input
/// is the agent's and could be megabytes; the prompt says when it is cut).
pub(super) const MAX_SHOWN_INPUT_CHARS: usize = 60_000;

/// The gate's request for `request`, from the agent called `asker`, with
/// its prompt once the ticket is known. `None` when it offers no option.
pub(super) fn approval_request(
    request: &RequestPermissionRequest,
    asker: &str,
    timeout: Duration,
) -> Option<(ApprovalRequest, impl FnOnce(&str) -> String)> {
    let options: Vec<ApprovalOption> = request.options.iter().map(option).collect();
    if options.is_empty() {
        return None;
    }
    let fields = &request.tool_call.fields;
    let title = fields
        .title
        .clone()
        .filter(|t| !t.trim().is_empty())
        .unwrap_or_else(|| format!("tool call {}", request.tool_call.tool_call_id.0));
    let input = shown_input(request);
    let subject = title.clone();
    let prompt_options = options.clone();
    let asker = asker.to_string();
    let prompt = move |ticket: &str| {
        options_request_text(ticket, &asker, &title, &input, &prompt_options, timeout)
    };
    Some((
        ApprovalRequest {
            subject,
            text: String::new(),
            options,
        },
        prompt,
    ))
}

fn option(option: &PermissionOption) -> ApprovalOption {
    ApprovalOption {
        id: option.option_id.0.to_string(),
        label: option.name.clone(),
        kind: match option.kind {
            PermissionOptionKind::AllowOnce => OptionKind::AllowOnce,
            PermissionOptionKind::AllowAlways => OptionKind::AllowAlways,
            PermissionOptionKind::RejectAlways => OptionKind::RejectAlways,
            // Reject once, and any kind a newer agent invents: the
            // cautious reading.
            _ => OptionKind::RejectOnce,
        },
    }
}

/// What the request asks to do, as text: its raw input (pretty JSON) and
/// its content (diffs, text), cut at [`MAX_SHOWN_INPUT_CHARS`].
fn shown_input(request: &RequestPermissionRequest) -> String {
    let fields = &request.tool_call.fields;
    let mut parts = Vec::new();
    if let Some(raw) = fields.raw_input.as_ref().filter(|v| !v.is_null()) {
        parts.push(serde_json::to_string_pretty(raw).unwrap_or_else(|_| raw.to_string()));
    }
    for content in fields.content.iter().flatten() {
        match content {
            ToolCallContent::Diff(diff) => {
                parts.push(format!(
                    "Change to {}:\n{}",
                    diff.path.display(),
                    diff.new_text
                ));
            }
            ToolCallContent::Content(content) => {
                if let ContentBlock::Text(text) = &content.content {
                    parts.push(text.text.clone());
                }
            }
            _ => {}
        }
    }
    if let Some(locations) = fields.locations.as_ref().filter(|l| !l.is_empty()) {
        let paths: Vec<String> = locations
            .iter()
            .map(|l| l.path.display().to_string())
            .collect();
        parts.push(format!("Files: {}", paths.join(", ")));
    }
    let text = parts.join("\n\n");
    let count = text.chars().count();
    if count <= MAX_SHOWN_INPUT_CHARS {
        return text;
    }
    let cut: String = text.chars().take(MAX_SHOWN_INPUT_CHARS).collect();
    format!("{cut}\n… (the first {MAX_SHOWN_INPUT_CHARS} of {count} characters)")
}

/// The agent's answer for the gate's `decision` on `request`.
pub(super) fn outcome(
    request: &RequestPermissionRequest,
    decision: &Decision,
) -> RequestPermissionOutcome {
    let selected = |id: &str| {
        RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id.to_string()))
    };
    match decision {
        Decision::Chosen(option) => selected(&option.id),
        Decision::Denied(Denial::Stopped) => RequestPermissionOutcome::Cancelled,
        Decision::Denied(_) => {
            let first =
                |kind: PermissionOptionKind| request.options.iter().find(|o| o.kind == kind);
            match first(PermissionOptionKind::RejectOnce)
                .or_else(|| first(PermissionOptionKind::RejectAlways))
            {
                Some(reject) => selected(&reject.option_id.0),
                None => RequestPermissionOutcome::Cancelled,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(options: serde_json::Value) -> RequestPermissionRequest {
        serde_json::from_value(json!({
            "sessionId": "s1",
            "toolCall": {
                "toolCallId": "t1",
                "title": "Write notes.txt",
                "rawInput": {"path": "notes.txt", "content": "hello"},
                "content": [{"type": "diff", "path": "/w/notes.txt", "newText": "hello"}]
            },
            "options": options
        }))
        .unwrap()
    }

    fn three() -> serde_json::Value {
        json!([
            {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
            {"optionId": "always", "name": "Always allow", "kind": "allow_always"},
            {"optionId": "reject", "name": "Reject", "kind": "reject_once"}
        ])
    }

    #[test]
    fn the_prompt_shows_the_tool_its_input_and_every_option() {
        let asked = request(three());
        let (request, prompt) =
            approval_request(&asked, "gemini", Duration::from_secs(60)).unwrap();
        assert_eq!(request.subject, "Write notes.txt");
        assert_eq!(request.options.len(), 3);
        assert_eq!(request.options[1].kind, OptionKind::AllowAlways);
        let text = prompt("abc123");
        assert!(
            text.contains("Permission abc123") && text.contains("gemini"),
            "{text}"
        );
        assert!(text.contains("\"content\": \"hello\"") && text.contains("Change to /w/notes.txt"));
        assert!(text.contains("Always allow") && text.contains("/deny abc123 (Reject)"));
        assert!(
            approval_request(&request_with_no_options(), "x", Duration::from_secs(1)).is_none()
        );
    }

    fn request_with_no_options() -> RequestPermissionRequest {
        request(json!([]))
    }

    #[test]
    fn decisions_become_the_agents_outcome() {
        let asked = request(three());
        let chosen = Decision::Chosen(ApprovalOption {
            id: "always".into(),
            label: "Always allow".into(),
            kind: OptionKind::AllowAlways,
        });
        let id = |o: RequestPermissionOutcome| match o {
            RequestPermissionOutcome::Selected(s) => Some(s.option_id.0.to_string()),
            _ => None,
        };
        assert_eq!(id(outcome(&asked, &chosen)).as_deref(), Some("always"));
        assert_eq!(
            id(outcome(&asked, &Decision::Denied(Denial::TimedOut))).as_deref(),
            Some("reject"),
            "a timeout rejects"
        );
        assert_eq!(
            id(outcome(&asked, &Decision::Denied(Denial::Stopped))),
            None
        );
        let allow_only = request(json!([{"optionId": "a", "name": "A", "kind": "allow_once"}]));
        assert_eq!(
            id(outcome(&allow_only, &Decision::Denied(Denial::ByUser))),
            None,
            "nothing to reject with: cancelled"
        );
    }

    #[test]
    fn a_huge_input_is_cut_and_says_so() {
        let mut asked = request(three());
        asked.tool_call.fields.raw_input = Some(json!("x".repeat(MAX_SHOWN_INPUT_CHARS * 2)));
        let shown = shown_input(&asked);
        assert!(shown.contains("(the first 60000 of"));
        assert!(shown.chars().count() < MAX_SHOWN_INPUT_CHARS + 200);
    }
}
