//! Pure decisions and texts of the MCP tools: the names the model sees,
//! which calls ask for approval, what the approval card shows, and how a
//! tool's result becomes the (capped) text the model reads.
//!
//! Results are read as JSON (the MCP wire shape), not through the SDK's
//! types, so a content kind this build does not know is described rather
//! than lost. Non-text content (images, audio, binary resources) is
//! described, never dumped into the model's context.

use serde_json::Value;

use super::config::McpApproval;

/// The separator between a server's name and its tool's.
pub const SEPARATOR: &str = "__";

/// OpenAI's limit on a function name.
const MAX_NAME: usize = 64;

/// The name the model calls `tool` of `server` by: `server__tool`, with
/// every character OpenAI refuses replaced by `_` and cut to 64
/// characters. `taken` says whether a name is already used (then a
/// number is added).
pub fn exposed_name(server: &str, tool: &str, taken: impl Fn(&str) -> bool) -> String {
    let clean: String = format!("{server}{SEPARATOR}{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let base: String = clean.chars().take(MAX_NAME).collect();
    if !taken(&base) {
        return base;
    }
    (2..)
        .map(|n| {
            let suffix = format!("_{n}");
            let keep = MAX_NAME - suffix.len();
            format!("{}{suffix}", base.chars().take(keep).collect::<String>())
        })
        .find(|candidate| !taken(candidate))
        .unwrap_or(base)
}

/// Why a call of a tool with these MCP `annotations` needs approval under
/// `mode`, or `None` if it may run at once.
pub fn reason_to_ask(mode: McpApproval, server: &str, annotations: &Value) -> Option<String> {
    match mode {
        McpApproval::Never => None,
        McpApproval::Always => Some(format!(
            "every call to the MCP server {server} needs approval here"
        )),
        McpApproval::Dangerous => {
            let read_only = annotations.get("readOnlyHint").and_then(Value::as_bool) == Some(true);
            let not_destructive =
                annotations.get("destructiveHint").and_then(Value::as_bool) == Some(false);
            if read_only || not_destructive {
                None
            } else {
                Some(format!(
                    "the MCP server {server} does not mark this tool as read-only or harmless"
                ))
            }
        }
    }
}

/// What the approval card shows: server, tool and the arguments in full.
pub fn approval_subject(server: &str, tool: &str, arguments: &Value) -> String {
    let shown = serde_json::to_string_pretty(arguments).unwrap_or_else(|_| arguments.to_string());
    format!("MCP tool {tool} of server {server}, with the arguments\n{shown}")
}

/// The text the model reads for a tool's result (the `CallToolResult` as
/// JSON), and whether the tool reported an error. Cut to `cap` bytes.
pub fn result_text(result: &Value, cap: usize) -> (String, bool) {
    let is_error = result.get("isError").and_then(Value::as_bool) == Some(true);
    let mut parts: Vec<String> = result
        .get("content")
        .and_then(Value::as_array)
        .map(|blocks| blocks.iter().map(content_text).collect())
        .unwrap_or_default();
    if let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null()) {
        // Structured content repeats the text for clients that read it; the
        // model gets it only when there is no text.
        if parts.iter().all(|p| p.trim().is_empty()) {
            parts = vec![structured.to_string()];
        }
    }
    let text = if parts.is_empty() {
        "(the tool returned nothing)".to_string()
    } else {
        parts.join("\n")
    };
    (cap_text(&text, cap), is_error)
}

/// One content block as text.
fn content_text(block: &Value) -> String {
    let field = |key: &str| block.get(key).and_then(Value::as_str);
    let data_bytes = || field("data").map_or(0, |d| d.len() / 4 * 3);
    match field("type").unwrap_or_default() {
        "text" => field("text").unwrap_or_default().to_string(),
        "image" => format!(
            "[image ({}, about {} bytes), not shown]",
            field("mimeType").unwrap_or("unknown type"),
            data_bytes()
        ),
        "audio" => format!(
            "[audio ({}, about {} bytes), not shown]",
            field("mimeType").unwrap_or("unknown type"),
            data_bytes()
        ),
        "resource" => {
            let resource = block.get("resource").unwrap_or(&Value::Null);
            let uri = resource.get("uri").and_then(Value::as_str).unwrap_or("?");
            match resource.get("text").and_then(Value::as_str) {
                Some(text) => format!("[resource {uri}]\n{text}"),
                None => format!(
                    "[resource {uri} ({}), binary, not shown]",
                    resource
                        .get("mimeType")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown type")
                ),
            }
        }
        "resource_link" => format!(
            "[link to resource {}{}]",
            field("uri").unwrap_or("?"),
            field("name").map(|n| format!(" ({n})")).unwrap_or_default()
        ),
        other => format!("[{other} content, not shown]"),
    }
}

/// `text` cut to at most `cap` bytes (on a character boundary), with a
/// note saying how much was left out.
pub fn cap_text(text: &str, cap: usize) -> String {
    if text.len() <= cap {
        return text.to_string();
    }
    let note_room = 80;
    let mut end = cap.saturating_sub(note_room);
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[… cut: {} more bytes of the result were left out]",
        &text[..end],
        text.len() - end
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_are_namespaced_cleaned_cut_and_unique() {
        assert_eq!(exposed_name("fs", "read_file", |_| false), "fs__read_file");
        assert_eq!(exposed_name("fs", "a.b/c d", |_| false), "fs__a_b_c_d");
        let long = exposed_name("srv", &"x".repeat(100), |_| false);
        assert_eq!(long.len(), 64);
        let taken = |n: &str| n == "fs__a_b";
        assert_eq!(exposed_name("fs", "a.b", taken), "fs__a_b_2");
    }

    #[test]
    fn dangerous_asks_unless_the_server_says_harmless() {
        let ask = |annotations: Value| reason_to_ask(McpApproval::Dangerous, "fs", &annotations);
        assert!(
            ask(Value::Null).is_some(),
            "unmarked tools may be destructive"
        );
        assert!(ask(json!({"readOnlyHint": true})).is_none());
        assert!(ask(json!({"destructiveHint": false})).is_none());
        assert!(ask(json!({"readOnlyHint": false, "destructiveHint": true})).is_some());
        assert!(reason_to_ask(McpApproval::Never, "fs", &Value::Null).is_none());
        assert!(reason_to_ask(McpApproval::Always, "fs", &json!({"readOnlyHint": true})).is_some());
    }

    #[test]
    fn results_read_as_text_with_other_content_described() {
        let result = json!({"content": [
            {"type": "text", "text": "hello"},
            {"type": "image", "data": "AAAAAAAA", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "inside"}},
            {"type": "resource", "resource": {"uri": "file:///b.bin", "blob": "AAAA", "mimeType": "application/zip"}},
            {"type": "resource_link", "uri": "file:///c", "name": "c"},
            {"type": "hologram"}
        ]});
        let (text, error) = result_text(&result, 10_000);
        assert!(!error);
        assert!(
            text.starts_with("hello\n[image (image/png, about 6 bytes), not shown]"),
            "{text}"
        );
        assert!(text.contains("[resource file:///a.txt]\ninside"));
        assert!(text.contains("binary, not shown"));
        assert!(text.contains("[link to resource file:///c (c)]"));
        assert!(text.contains("[hologram content, not shown]"));
        assert!(!text.contains("AAAA"));
        let (text, error) = result_text(
            &json!({"content": [], "structuredContent": {"n": 1}, "isError": true}),
            100,
        );
        assert_eq!(text, "{\"n\":1}");
        assert!(error);
        assert_eq!(
            result_text(&json!({}), 100).0,
            "(the tool returned nothing)"
        );
    }

    #[test]
    fn long_results_are_cut_with_a_note() {
        let text = "é".repeat(10_000);
        let cut = cap_text(&text, 1000);
        assert!(cut.len() <= 1000, "{}", cut.len());
        assert!(cut.contains("more bytes of the result were left out"));
        assert_eq!(cap_text("short", 1000), "short");
    }

    #[test]
    fn the_card_shows_the_arguments_in_full() {
        let long = "y".repeat(5000);
        let subject = approval_subject("fs", "write_file", &json!({"path": "/a", "content": long}));
        assert!(subject.contains("write_file") && subject.contains("fs"));
        assert!(subject.contains(&long));
    }
}
