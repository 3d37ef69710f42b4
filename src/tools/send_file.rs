//! The `send_file` tool: the model sends a file from the workspace to the
//! chat (images as photos, everything else as documents, with an optional
//! caption).
//!
//! [`WithSendFile`] adds it to any other registry, for the terminal's
//! `workdir` only (there is no default directory: without one the tool is
//! not offered). The path rules (opened once by handle below the
//! workspace, no links, one hard link, readable by the `run_as` user), the
//! 50 MB cap and the record that keeps a replayed turn from sending a file
//! twice live in [`crate::media::outbox`]; the chat comes from the
//! task-local turn identity and the sender from the turn's
//! [`crate::media::TurnFiles`], which also counts the answer's files
//! against `max_files_per_answer`. Like every tool, it never fails the
//! turn: a refused path is an error text the model can act on. Sending is
//! the one thing this tool does in the chat, and only what the model asked
//! for.

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::json;

use super::{ToolContext, ToolDefinition, ToolError, ToolRegistry};
use crate::media::outbox::{FileRefusal, SendOutcome, Workspace};

/// The tool's name.
pub const SEND_FILE: &str = "send_file";

/// Another registry plus `send_file`.
pub struct WithSendFile {
    inner: Arc<dyn ToolRegistry>,
    workspace: Workspace,
}

impl WithSendFile {
    /// `inner`'s tools and `send_file` for files inside `workspace`.
    pub fn new(inner: Arc<dyn ToolRegistry>, workspace: Workspace) -> WithSendFile {
        WithSendFile { inner, workspace }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    path: String,
    #[serde(default)]
    caption: Option<String>,
}

fn definition() -> ToolDefinition {
    ToolDefinition {
        name: SEND_FILE.to_string(),
        description: "Send a file from the workspace to the user in this chat. Images \
            (JPEG, PNG, GIF, WebP) arrive as photos, other files as documents. The path is \
            relative to the workspace (or absolute inside it); at most 50 MB."
            .to_string(),
        parameters: json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The file, inside the workspace."},
                "caption": {"type": "string", "description": "Optional text shown with the file."}
            },
            "required": ["path"],
            "additionalProperties": false
        }),
    }
}

impl WithSendFile {
    async fn send(&self, arguments: &str) -> Result<String, ToolError> {
        let args: Arguments = serde_json::from_str(if arguments.trim().is_empty() {
            "{}"
        } else {
            arguments
        })
        .map_err(|e| ToolError::BadArguments(e.to_string()))?;
        let files = crate::media::turn_files();
        let (Some(sender), Some(identity)) = (files.sender, crate::vocab::current_identity())
        else {
            return Err(ToolError::Failed(
                "files cannot be sent from here (no chat to send them to)".into(),
            ));
        };
        let requested = PathBuf::from(&args.path);
        if files.carried.get() >= sender.max_files() {
            let refusal = FileRefusal::TooMany(sender.max_files(), args.path.clone());
            return Err(ToolError::Failed(refusal.to_string()));
        }
        let sent = sender
            .send(
                &identity.source,
                files.answering,
                &self.workspace,
                &requested,
                args.caption,
                "tool:",
            )
            .await;
        if matches!(
            sent,
            Ok(SendOutcome::Sent | SendOutcome::AlreadySent) | Err(FileRefusal::Ambiguous(_))
        ) {
            files.carried.add();
        }
        match sent {
            Ok(SendOutcome::Sent) => Ok(format!("sent {}", args.path)),
            Ok(SendOutcome::AlreadySent) => Ok(format!(
                "{} was already sent for this message; not sent again",
                args.path
            )),
            Ok(SendOutcome::Withheld) => Ok(format!(
                "{} was left unsent for this message when the user stopped it; not sent",
                args.path
            )),
            Err(refusal) => Err(ToolError::Failed(refusal.to_string())),
        }
    }
}

impl ToolRegistry for WithSendFile {
    fn definitions(&self) -> Vec<ToolDefinition> {
        let mut definitions = self.inner.definitions();
        definitions.push(definition());
        definitions
    }

    fn call<'a>(
        &'a self,
        name: &'a str,
        arguments: &'a str,
        ctx: ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        if name == SEND_FILE {
            Box::pin(async move {
                ctx.progress.still_working();
                self.send(arguments).await
            })
        } else {
            self.inner.call(name, arguments, ctx)
        }
    }

    fn prepare<'a>(&'a self, ctx: &'a ToolContext) -> BoxFuture<'a, ()> {
        self.inner.prepare(ctx)
    }

    fn attach_store(&self, child_groups: &crate::store::ChildGroups) {
        self.inner.attach_store(child_groups);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::NoTools;
    use crate::vocab::Progress;
    use std::path::Path;
    use tokio_util::sync::CancellationToken;

    #[tokio::test]
    async fn send_file_is_advertised_and_refuses_outside_a_chat() {
        let tools = WithSendFile::new(Arc::new(NoTools), Workspace::new(Path::new("/"), None));
        let names: Vec<String> = tools.definitions().into_iter().map(|d| d.name).collect();
        assert_eq!(names, vec!["send_file"]);
        let ctx = ToolContext {
            cancel: CancellationToken::new(),
            progress: Progress::new(),
        };
        let error = tools
            .call("send_file", r#"{"path":"x"}"#, ctx.clone())
            .await
            .unwrap_err();
        assert!(error.to_string().contains("cannot be sent"));
        assert!(matches!(
            tools.call("send_file", r#"{"nope":1}"#, ctx.clone()).await,
            Err(ToolError::BadArguments(_))
        ));
        assert!(matches!(
            tools.call("other", "{}", ctx).await,
            Err(ToolError::UnknownTool(_))
        ));
    }
}
