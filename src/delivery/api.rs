//! One Bot API request with its HTTP status kept: what the delivery engine
//! needs to tell "Telegram did not carry this out" from "we do not know".
//!
//! teloxide-core turns an HTTP 5xx into the API error its JSON body
//! describes (`ApiError::Unknown("Internal Server Error")`, which reads as
//! a permanent refusal) or, for a proxy's HTML page, into `InvalidJson`
//! (which reads like a garbled 200); and it sleeps 10 s after every 5xx
//! before even reading the body, holding the chat's turn.
//! [`super::bot_api::BotApi::post`] sends the same JSON payload (token, API
//! URL, timeouts as teloxide's) but answers a 5xx at once with
//! [`AttemptError::Server`]; every other answer is read by [`read_answer`]
//! the way teloxide reads it (`retry_after`, `migrate_to_chat_id`, API
//! errors by description). [`ReadAs`] reads an
//! answer as less than the payload's own output type (a sent message's
//! id), since teloxide's `Message` is the costliest JSON a turn reads.
//!
//! This module owns the wire format of these requests only; what to do
//! with a failure is decided in [`super::telegram`]. It never logs, and
//! never puts the request URL (it contains the token) in an error.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use teloxide::requests::Payload;
use teloxide::types::ResponseParameters;
use teloxide::{ApiError, RequestError};

/// Why one attempt of a request failed.
#[derive(Debug)]
pub enum AttemptError {
    /// What teloxide (or [`post`], the same way) reported.
    Request(RequestError),
    /// Telegram, or the proxy in front of it, answered HTTP 5xx: it did not
    /// carry the request out, so trying again is safe.
    Server(u16),
    /// No connection could be made: nothing was sent, so trying again is
    /// safe (what went wrong, without the URL).
    NotSent(String),
    /// The request was written but no answer could be read (timed out,
    /// hung up on, too large): it may have been carried out.
    Unanswered(String),
}

impl From<RequestError> for AttemptError {
    fn from(error: RequestError) -> Self {
        AttemptError::Request(error)
    }
}

impl std::fmt::Display for AttemptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttemptError::Request(error) => error.fmt(f),
            AttemptError::Server(status) => write!(f, "Telegram answered HTTP {status}"),
            AttemptError::NotSent(why) | AttemptError::Unanswered(why) => f.write_str(why),
        }
    }
}

/// `payload` sent as it is, its answer read as `O` instead of the
/// payload's own output type.
///
/// teloxide's `Message` is a large type read through untagged and
/// flattened enums: reading a whole `sendMessage` answer (which repeats the
/// message it replies to) costs 15-25 us of CPU, more than the rest of a
/// turn's JSON together, for the one field delivery keeps. Reading it as
/// [`SentMessage`] (or an edit's answer as `IgnoredAny`) skips the rest of
/// the answer without building it.
pub struct ReadAs<P, O> {
    payload: P,
    output: PhantomData<fn() -> O>,
}

impl<P, O> ReadAs<P, O> {
    /// `payload`, its answer to be read as `O`.
    pub fn new(payload: P) -> ReadAs<P, O> {
        ReadAs {
            payload,
            output: PhantomData,
        }
    }
}

impl<P: Payload, O> Payload for ReadAs<P, O> {
    type Output = O;
    const NAME: &'static str = P::NAME;

    fn timeout_hint(&self) -> Option<Duration> {
        self.payload.timeout_hint()
    }
}

impl<P: Serialize, O> Serialize for ReadAs<P, O> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.payload.serialize(serializer)
    }
}

/// What delivery keeps of a sent message: its id (every other field of
/// Telegram's answer is skipped unread).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct SentMessage {
    /// The message's id in its chat.
    pub message_id: i32,
}

/// The Bot API's answer envelope.
#[derive(Deserialize)]
struct Envelope<T> {
    ok: bool,
    #[serde(default = "none")]
    result: Option<T>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<ResponseParameters>,
}

fn none<T>() -> Option<T> {
    None
}

/// Read an answer body as teloxide does: the result, or the error it
/// stands for; a body that is not the Bot API's JSON is `InvalidJson`.
pub fn read_answer<T: DeserializeOwned>(text: &str) -> Result<T, RequestError> {
    let invalid = |source: serde_json::Error| RequestError::InvalidJson {
        source: Arc::new(source),
        raw: text.into(),
    };
    let envelope: Envelope<T> = serde_json::from_str(text).map_err(invalid)?;
    if envelope.ok {
        return envelope.result.ok_or_else(|| {
            invalid(<serde_json::Error as serde::de::Error>::custom(
                "an answer with ok = true but no result",
            ))
        });
    }
    Err(match envelope.parameters {
        Some(ResponseParameters::RetryAfter(seconds)) => RequestError::RetryAfter(seconds),
        Some(ResponseParameters::MigrateToChatId(chat)) => RequestError::MigrateToChatId(chat),
        None => {
            let description = envelope.description.unwrap_or_default();
            RequestError::Api(
                serde_json::from_value::<ApiError>(serde_json::Value::String(description.clone()))
                    .unwrap_or(ApiError::Unknown(description)),
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use serde::de::IgnoredAny;
    use teloxide::payloads::{EditMessageText, SendMessage, SendMessageSetters};
    use teloxide::requests::Payload;
    use teloxide::types::{ChatId, Message, ParseMode, True};
    use teloxide::{ApiError, RequestError};

    use super::{read_answer, ReadAs, SentMessage};

    /// A `sendMessage` answer as Telegram gives it: the sent message, with
    /// the message it replies to repeated inside.
    const SENT: &str = r#"{"ok":true,"result":{"message_id":11,
        "from":{"id":42,"is_bot":true,"first_name":"Bot","username":"bench_bot"},
        "chat":{"id":5000,"type":"private","first_name":"Ann"},"date":1764979201,
        "reply_to_message":{"message_id":10,"from":{"id":5000,"is_bot":false,"first_name":"Ann"},
            "chat":{"id":5000,"type":"private","first_name":"Ann"},"date":1764979200,"text":"hi"},
        "text":"hello","entities":[{"offset":0,"length":5,"type":"bold"}]}}"#;

    #[test]
    fn a_request_read_as_another_type_is_sent_as_it_is() {
        let request = SendMessage::new(ChatId(5000), "hello").parse_mode(ParseMode::Html);
        let read_as = ReadAs::<_, SentMessage>::new(request.clone());
        assert_eq!(
            serde_json::to_value(&read_as).expect("serializes"),
            serde_json::to_value(&request).expect("serializes")
        );
        assert_eq!(
            <ReadAs<SendMessage, SentMessage> as Payload>::NAME,
            SendMessage::NAME
        );
        assert_eq!(
            <ReadAs<EditMessageText, IgnoredAny> as Payload>::NAME,
            EditMessageText::NAME
        );
    }

    #[test]
    fn a_sent_message_is_read_for_its_id_as_teloxide_reads_it() {
        let whole: Message = read_answer(SENT).expect("teloxide reads it");
        let sent: SentMessage = read_answer(SENT).expect("read for its id");
        assert_eq!(sent.message_id, whole.id.0);
        assert_eq!(sent, SentMessage { message_id: 11 });
        // An edit's answer is read as nothing, whatever it holds.
        assert!(read_answer::<IgnoredAny>(SENT).is_ok());
        assert!(read_answer::<IgnoredAny>(r#"{"ok":true,"result":true}"#).is_ok());
        // Errors are read the same, whatever the output.
        assert!(matches!(
            read_answer::<SentMessage>(
                r#"{"ok":false,"error_code":403,"description":"Forbidden: bot was blocked by the user"}"#
            ),
            Err(RequestError::Api(ApiError::BotBlocked))
        ));
        // A success without the id is not the Bot API's answer.
        assert!(matches!(
            read_answer::<SentMessage>(r#"{"ok":true,"result":{"text":"hello"}}"#),
            Err(RequestError::InvalidJson { .. })
        ));
    }

    #[test]
    fn answers_are_read_like_teloxide_reads_them() {
        assert!(matches!(
            read_answer::<True>(r#"{"ok":true,"result":true}"#),
            Ok(True)
        ));
        assert!(matches!(
            read_answer::<True>(
                r#"{"ok":false,"error_code":400,"description":"Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message"}"#
            ),
            Err(RequestError::Api(ApiError::MessageNotModified))
        ));
        assert!(matches!(
            read_answer::<True>(
                r#"{"ok":false,"error_code":403,"description":"Forbidden: bot was blocked by the user"}"#
            ),
            Err(RequestError::Api(ApiError::BotBlocked))
        ));
        match read_answer::<True>(
            r#"{"ok":false,"error_code":429,"description":"Too Many Requests","parameters":{"retry_after":7}}"#,
        ) {
            Err(RequestError::RetryAfter(seconds)) => assert_eq!(seconds.seconds(), 7),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read_answer::<True>(
                r#"{"ok":false,"description":"x","parameters":{"migrate_to_chat_id":-100}}"#
            ),
            Err(RequestError::MigrateToChatId(_))
        ));
        assert!(matches!(
            read_answer::<True>("<html>502</html>"),
            Err(RequestError::InvalidJson { .. })
        ));
        assert!(matches!(
            read_answer::<True>(r#"{"ok":true}"#),
            Err(RequestError::InvalidJson { .. })
        ));
    }
}
