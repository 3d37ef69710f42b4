//! Images for vision models: the turn's image attachments become
//! `image_url` content parts (base64 `data:` URLs) of the user's message,
//! next to its text — the OpenAI chat-completions shape
//! (`[{"type":"text","text":…},{"type":"image_url","image_url":{"url":…}}]`).
//!
//! Only the message of the current turn carries images; the history keeps
//! the text (`[photo]`, or the saved path where a tool of the model's can
//! open it, see [`super::FileAccess`]), so old images are not re-sent on
//! every turn. It must never read a file that is not one of the turn's
//! attachments.

use base64::Engine as _;
use serde_json::{json, Value};

use super::turn_files;
use crate::vocab::Attachment;

/// The `image_url` parts for `attachments` (unreadable files are skipped
/// with a log line).
pub async fn image_parts(attachments: &[Attachment]) -> Vec<Value> {
    let mut parts = Vec::new();
    for attachment in attachments.iter().filter(|a| a.is_image) {
        match tokio::fs::read(&attachment.path).await {
            Ok(bytes) => {
                let data = base64::engine::general_purpose::STANDARD.encode(bytes);
                parts.push(json!({
                    "type": "image_url",
                    "image_url": {"url": format!("data:{};base64,{data}", attachment.mime)},
                }));
            }
            Err(error) => {
                tracing::warn!(path = %attachment.path.display(), %error, "an image attachment could not be read");
            }
        }
    }
    parts
}

/// Put the current turn's images into the last user message of a chat
/// completions request `body`.
pub async fn attach_images(body: &mut Value) {
    let files = turn_files();
    if !files.attachments.iter().any(|a| a.is_image) {
        return;
    }
    let parts = image_parts(&files.attachments).await;
    put_parts(body, parts);
}

fn put_parts(body: &mut Value, images: Vec<Value>) {
    if images.is_empty() {
        return;
    }
    let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else {
        return;
    };
    let Some(user) = messages
        .iter_mut()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
    else {
        return;
    };
    let text = user
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mut content = Vec::with_capacity(images.len() + 1);
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    content.extend(images);
    user["content"] = Value::Array(content);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_go_into_the_last_user_message_next_to_its_text() {
        let mut body = json!({"messages": [
            {"role": "user", "content": "old"},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "look"},
            {"role": "tool", "content": "r", "tool_call_id": "x"},
        ]});
        put_parts(&mut body, vec![json!({"type": "image_url"})]);
        assert_eq!(body["messages"][0]["content"], "old");
        assert_eq!(
            body["messages"][2]["content"],
            json!([{"type": "text", "text": "look"}, {"type": "image_url"}])
        );
    }
}
