//! Unit tests of the `openai` backend's pure parts.

use super::*;
use crate::agent::openai::config::chat_completions_url;
use crate::agent::openai::config::parse_base_url;
use crate::agent::openai::config::shareable_url;
use crate::agent::openai::errors::http_error_message;
use crate::agent::openai::errors::owner_hint;
use crate::agent::openai::errors::provider_message_in_body;
use crate::agent::openai::history::message_chars;
use crate::agent::openai::request::wire_message;
use crate::agent::openai::stream::excerpt;
use crate::agent::openai::stream::parse_completion;
use crate::agent::openai::stream::CompletionError;
use crate::agent::openai::stream::StreamStep;
use crate::agent::openai::stream::StreamedAnswer;
use crate::agent::openai::tool_loop::tool_specs;
use crate::agent::openai::tool_loop::ShownText;
use crate::agent::openai::tool_loop::ToolCall;
use crate::tools::ToolDefinition;
use crate::vocab::ChatMessage;
use crate::vocab::Progress;
use crate::vocab::Role;
use serde_json::json;
use serde_json::Value;

fn msg(role: Role, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

fn calls(ids: &[&str]) -> ChatMessage {
    let calls = ids
        .iter()
        .map(|id| json!({"id": id, "type": "function", "function": {"name": "t", "arguments": "{}"}}))
        .collect();
    ChatMessage {
        tool_calls: Some(Value::Array(calls)),
        ..msg(Role::Assistant, "")
    }
}

fn result(id: &str, content: &str) -> ChatMessage {
    ChatMessage {
        tool_call_id: Some(id.to_string()),
        name: Some("t".to_string()),
        ..msg(Role::Tool, content)
    }
}

fn roles(messages: &[ChatMessage]) -> Vec<Role> {
    messages.iter().map(|m| m.role).collect()
}

fn total_chars(messages: &[ChatMessage]) -> usize {
    messages.iter().map(message_chars).sum()
}

// --- trim_history ---

#[test]
fn everything_fits_in_a_large_budget() {
    let history = vec![msg(Role::User, "hi"), msg(Role::Assistant, "hello")];
    let (messages, dropped) = trim_history(Some("be brief"), &history, "again", 1000);
    assert_eq!(dropped, 0);
    assert_eq!(
        roles(&messages),
        [Role::System, Role::User, Role::Assistant, Role::User]
    );
    assert_eq!(messages[0].content, "be brief");
    assert_eq!(messages[3].content, "again");
}

#[test]
fn the_oldest_history_goes_first_and_the_budget_holds() {
    let history: Vec<_> = (0..10)
        .map(|i| {
            msg(
                if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                },
                &format!("{i:0>10}"),
            )
        })
        .collect();
    // system 4 + user 6 + room for three 10-char messages.
    let (messages, dropped) = trim_history(Some("sys!"), &history, "latest", 40);
    assert_eq!(dropped, 7);
    assert!(total_chars(&messages) <= 40);
    assert_eq!(messages[0].role, Role::System);
    assert_eq!(messages[1].content, history[7].content);
    assert_eq!(messages.last().unwrap().content, "latest");
}

#[test]
fn system_and_user_are_kept_even_over_the_budget() {
    let history = vec![msg(Role::User, "old")];
    let (messages, dropped) = trim_history(Some("a long system prompt"), &history, "now", 5);
    assert_eq!(dropped, 1);
    assert_eq!(roles(&messages), [Role::System, Role::User]);
    let (messages, _) = trim_history(None, &history, "now", 0);
    assert_eq!(roles(&messages), [Role::User]);
}

#[test]
fn a_tool_call_group_is_kept_or_dropped_whole() {
    let history = vec![
        msg(Role::User, "add things"),
        calls(&["a", "b"]),
        result("a", "1111111111"),
        result("b", "2222222222"),
        msg(Role::Assistant, "done"),
    ];
    let call_cost = message_chars(&history[1]);
    // Room for "done" and one result but not the whole group.
    let budget = 4 + 10 + 1 + call_cost;
    let (messages, dropped) = trim_history(None, &history, "x", budget);
    assert_eq!(roles(&messages), [Role::Assistant, Role::User]);
    assert_eq!(dropped, 4);
    // Room for the whole group.
    let (messages, dropped) = trim_history(None, &history, "x", budget + 10);
    assert_eq!(
        roles(&messages),
        [
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::Assistant,
            Role::User
        ]
    );
    assert_eq!(dropped, 1);
}

#[test]
fn history_never_starts_with_a_tool_result() {
    let history = vec![
        result("gone", "orphan"),
        msg(Role::User, "q"),
        msg(Role::Assistant, "a"),
    ];
    let (messages, dropped) = trim_history(None, &history, "x", 1000);
    assert_eq!(roles(&messages), [Role::User, Role::Assistant, Role::User]);
    assert_eq!(dropped, 1);
}

#[test]
fn calls_without_all_their_results_are_left_out() {
    let history = vec![
        msg(Role::User, "q"),
        calls(&["a", "b"]),
        result("a", "1"),
        msg(Role::User, "next"),
    ];
    let (messages, dropped) = trim_history(None, &history, "x", 1000);
    assert_eq!(roles(&messages), [Role::User, Role::User, Role::User]);
    assert_eq!(dropped, 2);
}

#[test]
fn an_empty_history_gives_system_and_user() {
    let (messages, dropped) = trim_history(Some("s"), &[], "u", 0);
    assert_eq!(dropped, 0);
    assert_eq!(roles(&messages), [Role::System, Role::User]);
}

// --- stream chunks ---

fn apply_all(answer: &mut StreamedAnswer, chunks: &[&str]) -> Vec<StreamStep> {
    chunks
        .iter()
        .map(|chunk| answer.apply("", chunk).unwrap())
        .collect()
}

#[test]
fn text_deltas_accumulate_and_odd_chunks_are_tolerated() {
    let mut answer = StreamedAnswer::default();
    let steps = apply_all(
        &mut answer,
        &[
            r#"{"id":"x"}"#,
            r#"{"choices":[]}"#,
            r#"{"choices":[{"index":0,"delta":{"role":"assistant"},"extra":1}]}"#,
            r#"{"choices":[{"delta":{"content":"Hel"}}]}"#,
            "not json at all",
            r#"{"choices":[{"index":0,"delta":{"content":[{"type":"text","text":"lo"}]}}]}"#,
            r#"{"choices":[{"index":1,"delta":{"content":"other choice"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            "[DONE]",
        ],
    );
    assert_eq!(steps[3], StreamStep::Text("Hel".into()));
    assert_eq!(steps[8], StreamStep::Done);
    let answer = answer.finish(0);
    assert_eq!(answer.text, "Hello");
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
    assert!(answer.tool_calls.is_empty());
}

#[test]
fn tool_call_deltas_merge_by_index() {
    let mut answer = StreamedAnswer::default();
    apply_all(
        &mut answer,
        &[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"add","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"c2","function":{"name":"mul","arguments":"{\"x\""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":":2}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        ],
    );
    let answer = answer.finish(0);
    assert_eq!(
        answer.tool_calls,
        [
            ToolCall {
                id: "c1".into(),
                name: "add".into(),
                arguments: r#"{"a":1}"#.into()
            },
            ToolCall {
                id: "c2".into(),
                name: "mul".into(),
                arguments: r#"{"x":2}"#.into()
            },
        ]
    );
}

#[test]
fn tool_call_deltas_without_index_or_id_still_merge() {
    let mut answer = StreamedAnswer::default();
    apply_all(
        &mut answer,
        &[
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"ls"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"ls","arguments":{"path":"/"}}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"pwd"}}]}}]}"#,
        ],
    );
    let answer = answer.finish(3);
    assert_eq!(answer.tool_calls.len(), 2);
    assert_eq!(answer.tool_calls[0].id, "call_3_0");
    assert_eq!(answer.tool_calls[0].name, "ls");
    assert_eq!(answer.tool_calls[0].arguments, r#"{"path":"/"}"#);
    assert_eq!(answer.tool_calls[1].id, "b");
    assert_eq!(answer.tool_calls[1].arguments, "{}");
}

#[test]
fn a_stream_cut_before_its_end_is_not_used() {
    let mut answer = StreamedAnswer::default();
    apply_all(
        &mut answer,
        &[r#"{"choices":[{"delta":{"content":"half an ans"}}]}"#],
    );
    assert!(!answer.ended_properly(false));
    assert!(answer.ended_properly(true));
    apply_all(
        &mut answer,
        &[r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#],
    );
    assert!(
        answer.ended_properly(false),
        "a finish reason without [DONE] is enough"
    );
}

#[test]
fn an_error_chunk_carries_the_provider_message() {
    let mut answer = StreamedAnswer::default();
    let error = answer
        .apply(
            "",
            r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
        )
        .unwrap_err();
    assert_eq!(error, "overloaded");
    assert_eq!(
        answer.apply("error", "plain words").unwrap_err(),
        "plain words"
    );
    assert_eq!(
        answer.apply("", r#"{"error":"short"}"#).unwrap_err(),
        "short"
    );
}

// --- non-streamed completions ---

#[test]
fn a_completion_body_parses_text_and_tool_calls() {
    let body = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":null,
        "tool_calls":[{"id":"t1","type":"function","function":{"name":"add","arguments":"{\"a\":1}"}},
                      {"type":"function","function":{"name":"pwd","arguments":{}}}]},
        "finish_reason":"tool_calls"}]}"#;
    let answer = parse_completion(body, 2).unwrap();
    assert_eq!(answer.text, "");
    assert_eq!(answer.tool_calls[0].arguments, r#"{"a":1}"#);
    assert_eq!(answer.tool_calls[1].id, "call_2_1");
    assert_eq!(answer.tool_calls[1].arguments, "{}");
    assert_eq!(
        parse_completion(r#"{"error":{"message":"nope"}}"#, 0),
        Err(CompletionError::Provider("nope".into()))
    );
    assert_eq!(
        parse_completion("<html>", 0),
        Err(CompletionError::Unreadable)
    );
    assert_eq!(
        parse_completion(r#"{"choices":[]}"#, 0),
        Err(CompletionError::Unreadable)
    );
}

// --- wire format ---

#[test]
fn wire_messages_follow_the_api_shape() {
    let call = calls(&["a"]);
    let wire = wire_message(&call);
    assert_eq!(wire["content"], Value::Null);
    assert_eq!(wire["tool_calls"][0]["id"], "a");
    let wire = wire_message(&result("a", "42"));
    assert_eq!(
        wire,
        json!({"role": "tool", "content": "42", "tool_call_id": "a"})
    );
    let empty_calls = ChatMessage {
        tool_calls: Some(json!([])),
        ..msg(Role::Assistant, "hi")
    };
    assert_eq!(
        wire_message(&empty_calls),
        json!({"role": "assistant", "content": "hi"})
    );
}

#[test]
fn no_tools_means_no_tools_key() {
    assert_eq!(tool_specs(&[]), None);
    let specs = tool_specs(&[ToolDefinition {
        name: "add".into(),
        description: "adds".into(),
        parameters: json!({"type": "object"}),
    }])
    .unwrap();
    assert_eq!(specs[0]["type"], "function");
    assert_eq!(specs[0]["function"]["name"], "add");
}

// --- progress across rounds ---

#[test]
fn shown_text_keeps_earlier_rounds_and_drops_whitespace() {
    let progress = Progress::new();
    let mut shown = ShownText::new(&progress);
    shown.start_round();
    shown.push("\n");
    shown.start_round();
    assert_eq!(progress.snapshot(), "");
    shown.push("Let me check.");
    shown.start_round();
    shown.push("  ");
    shown.push("Found it.");
    assert_eq!(progress.snapshot(), "Let me check.\n\nFound it.");
    assert_eq!(shown.into_text(), "Let me check.\n\nFound it.");
}

// --- config ---

#[test]
fn config_defaults_and_unknown_keys() {
    let config: OpenAiConfig = toml::from_str("model = \"m\"").unwrap();
    assert_eq!(config, OpenAiConfig::new(DEFAULT_BASE_URL, "m"));
    assert!(config.validate().is_ok());
    assert!(config.stream);
    assert_eq!(config.history_budget_chars, 24_000);
    assert_eq!(config.max_tool_rounds, 8);
    assert_eq!(config.request_timeout_secs, 60);
    assert!(toml::from_str::<OpenAiConfig>("model = \"m\"\nmodle = 1").is_err());
    assert!(toml::from_str::<OpenAiConfig>("base_url = \"http://x/v1\"").is_err());
}

#[test]
fn validation_names_the_bad_key() {
    let bad = |edit: fn(&mut OpenAiConfig)| {
        let mut config = OpenAiConfig::new("http://127.0.0.1:1/v1", "m");
        edit(&mut config);
        config.validate().unwrap_err()
    };
    assert!(bad(|c| c.base_url = "ftp://host/v1".into()).contains("base_url"));
    assert!(bad(|c| c.base_url = "not a url".into()).contains("base_url"));
    assert!(bad(|c| c.model = " ".into()).contains("model"));
    assert!(bad(|c| c.api_key_env = "A-B".into()).contains("api_key_env"));
    assert!(bad(|c| c.temperature = Some(3.0)).contains("temperature"));
    assert!(bad(|c| c.max_tokens = Some(0)).contains("max_tokens"));
    assert!(bad(|c| c.request_timeout_secs = 0).contains("request_timeout_secs"));
    assert!(bad(|c| c.max_tool_rounds = 0).contains("max_tool_rounds"));
}

#[test]
fn the_api_key_comes_from_the_named_variable() {
    let config = OpenAiConfig {
        api_key_env: "MY_KEY".into(),
        ..OpenAiConfig::new(DEFAULT_BASE_URL, "m")
    };
    let key = config.api_key_from(|name| (name == "MY_KEY").then(|| "sk-1".to_string()));
    assert_eq!(key.unwrap().expose(), "sk-1");
    assert!(config.api_key_from(|_| Some("  ".to_string())).is_none());
}

#[test]
fn urls_keep_their_path_and_lose_credentials_when_shown() {
    let base = parse_base_url("https://user:pw@example.com/v1/?x=1").unwrap();
    assert_eq!(
        chat_completions_url(&base).as_str(),
        "https://user:pw@example.com/v1/chat/completions?x=1"
    );
    assert_eq!(shareable_url(&base), "https://example.com/v1");
    let base = parse_base_url("http://127.0.0.1:11434").unwrap();
    assert_eq!(
        chat_completions_url(&base).as_str(),
        "http://127.0.0.1:11434/chat/completions"
    );
}

// --- error messages ---

#[test]
fn each_http_status_class_has_its_message() {
    let config = OpenAiConfig::new("http://h/v1", "gpt-x");
    let message = |status, provider| http_error_message(status, provider, &config, "http://h/v1");
    assert_eq!(
        message(401, Some("Incorrect API key provided: sk-12***")),
        "The LLM provider rejected this bot's API key (HTTP 401). The bot's owner needs to check it."
    );
    // The chat is told in its users' words; which setting to check is the
    // owner's detail, for the log.
    for status in [401, 403, 404] {
        let text = message(status, None);
        assert!(
            !text.contains("OPENAI_API_KEY") && !text.contains("agent.openai"),
            "{text}"
        );
        assert!(!owner_hint(status, &config, status != 403).is_empty());
    }
    assert!(owner_hint(403, &config, false).contains("no API key is set"));
    let not_found = message(404, None);
    assert!(not_found.contains("\"gpt-x\"") && not_found.contains("http://h/v1"));
    assert!(message(429, Some("quota exceeded sk-1234567890")).contains("quota"));
    assert!(!message(429, Some("quota exceeded sk-1234567890")).contains("sk-"));
    assert!(message(503, Some("boom")).contains("HTTP 503"));
    assert!(!message(503, Some("boom")).contains("boom"));
    let too_long = message(400, Some("context too long for acct 42"));
    assert!(too_long.contains("too long for the model"), "{too_long}");
    assert!(!too_long.contains("acct 42"), "{too_long}");
    let other = message(400, Some("weird thing about org-secret"));
    assert!(!other.contains("org-secret"), "{other}");
}

#[test]
fn provider_messages_are_found_in_common_body_shapes() {
    assert_eq!(
        provider_message_in_body(r#"{"error":{"message":"m1"}}"#).as_deref(),
        Some("m1")
    );
    assert_eq!(
        provider_message_in_body(r#"{"detail":"m2"}"#).as_deref(),
        Some("m2")
    );
    assert_eq!(provider_message_in_body("plain"), None);
}

#[test]
fn excerpts_cut_on_character_boundaries() {
    assert_eq!(excerpt("héllo", 2), "hé…");
    assert_eq!(excerpt("hi", 2), "hi");
}

#[test]
fn usage_is_read_from_the_last_chunk_and_from_a_json_body() {
    let mut answer = StreamedAnswer::default();
    apply_all(
        &mut answer,
        &[
            r#"{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":7,"total_tokens":127,"prompt_tokens_details":{"cached_tokens":100}}}"#,
        ],
    );
    let usage = answer.finish(0).usage.unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.cached_input_tokens,
            usage.output_tokens
        ),
        (20, 100, 7)
    );
    let body = r#"{"choices":[{"message":{"content":"x"},"finish_reason":"stop"}],
        "usage":{"prompt_tokens":3,"completion_tokens":2,"cost":0.0015}}"#;
    let usage = parse_completion(body, 0).unwrap().usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (3, 2));
    assert!((usage.cost_usd - 0.0015).abs() < 1e-12);
    // A null or empty usage, or none, is no usage.
    for body in [
        r#"{"choices":[{"message":{"content":"x"}}],"usage":null}"#,
        r#"{"choices":[{"message":{"content":"x"}}],"usage":{}}"#,
        r#"{"choices":[{"message":{"content":"x"}}]}"#,
    ] {
        assert_eq!(parse_completion(body, 0).unwrap().usage, None, "{body}");
    }
}

#[test]
fn a_streamed_request_asks_for_its_usage_unless_told_not_to() {
    let agent = OpenAiAgent::new(
        OpenAiConfig::new("http://127.0.0.1:9/v1", "m"),
        None,
        Arc::new(crate::tools::NoTools),
    )
    .unwrap();
    let body = agent.request_body(&[], None);
    assert_eq!(body["stream_options"]["include_usage"], json!(true));
    let quiet = OpenAiAgent::new(
        OpenAiConfig {
            stream_usage: false,
            ..OpenAiConfig::new("http://127.0.0.1:9/v1", "m")
        },
        None,
        Arc::new(crate::tools::NoTools),
    )
    .unwrap();
    assert!(quiet
        .request_body(&[], None)
        .get("stream_options")
        .is_none());
    let unstreamed = OpenAiAgent::new(
        OpenAiConfig {
            stream: false,
            ..OpenAiConfig::new("http://127.0.0.1:9/v1", "m")
        },
        None,
        Arc::new(crate::tools::NoTools),
    )
    .unwrap();
    assert!(unstreamed
        .request_body(&[], None)
        .get("stream_options")
        .is_none());
}
