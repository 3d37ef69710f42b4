//! The `schedule` tool (openai backend): the model turns "remind me
//! tomorrow at nine" into a job, lists the chat's jobs or deletes one.
//!
//! [`WithSchedule`] adds it to any other registry. The chat and the user
//! come from the task-local turn identity, the jobs service from the
//! turn's [`super::requests::TurnJobs`]; a job is made exactly as `/at`,
//! `/in`, `/every` or `/cron` would make it (same caps, same authority),
//! the result states the resolved time in the chat's zone, and the user
//! sees one confirmation line under the turn's reply. Like every tool it
//! never fails the turn: a refusal is an error text the model can act on.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::json;

use super::requests::turn_jobs;
use super::service::Change;
use super::when::{parse_when, Action, JobRequest};
use crate::tools::{ToolContext, ToolDefinition, ToolError, ToolRegistry};

/// The tool's name.
pub const SCHEDULE: &str = "schedule";

/// Another registry plus `schedule`.
pub struct WithSchedule {
    inner: Arc<dyn ToolRegistry>,
}

impl WithSchedule {
    /// `inner`'s tools and `schedule`.
    pub fn new(inner: Arc<dyn ToolRegistry>) -> WithSchedule {
        WithSchedule { inner }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    action: String,
    #[serde(default)]
    when: Option<String>,
    #[serde(default)]
    remind: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    id: Option<i64>,
}

fn definition() -> ToolDefinition {
    ToolDefinition {
        name: SCHEDULE.to_string(),
        description: "Schedule work in this chat, list its jobs, or delete one. \
            action=create needs `when` and exactly one of `remind` (a text sent to the user as is, \
            for reminders) or `prompt` (run as a task for you at that time; session \"same\" \
            continues this conversation, \"fresh\" starts a new one each run). `when` is in the \
            chat's time zone, written like \"in 30m\", \"at 18:00\", \"at tomorrow 09:00\", \
            \"at 2026-12-24 18:00\", \"every 1h\", \"every weekday 08:00\", \"every mon,fri \
            18:30\" or \"cron 0 8 * * 1-5\". The result says when the job runs; tell the user. \
            action=list shows the jobs; action=delete needs `id`."
            .to_string(),
        parameters: json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["create", "list", "delete"]},
                "when": {"type": "string", "description": "When it runs (create)."},
                "remind": {"type": "string", "description": "A reminder text sent as is (create)."},
                "prompt": {"type": "string", "description": "A task to run then (create)."},
                "session": {"type": "string", "enum": ["same", "fresh"]},
                "id": {"type": "integer", "description": "The job to delete (delete)."}
            },
            "required": ["action"],
            "additionalProperties": false
        }),
    }
}

impl WithSchedule {
    async fn schedule(&self, arguments: &str) -> Result<String, ToolError> {
        let args: Arguments = serde_json::from_str(if arguments.trim().is_empty() {
            "{}"
        } else {
            arguments
        })
        .map_err(|e| ToolError::BadArguments(e.to_string()))?;
        let turn = turn_jobs();
        let (Some(turn), Some(identity)) = (turn, crate::vocab::current_identity()) else {
            return Err(ToolError::Failed(
                "scheduling is not available here (no chat to schedule in)".into(),
            ));
        };
        let Some(jobs) = turn.jobs() else {
            return Err(ToolError::Failed(
                "scheduling is turned off here ([schedule] enabled = false)".into(),
            ));
        };
        let source = &identity.source;
        match args.action.as_str() {
            "list" => {
                let (text, _) = jobs
                    .list_text(source.chat_id)
                    .await
                    .map_err(|e| ToolError::Failed(format!("the job store is failing: {e}")))?;
                Ok(text)
            }
            "delete" => {
                let id = args
                    .id
                    .ok_or_else(|| ToolError::BadArguments("delete needs id".into()))?;
                let (text, _) = jobs
                    .change(source, id, Change::Delete)
                    .await
                    .map_err(ToolError::Failed)?;
                turn.note(text.clone());
                Ok(text)
            }
            "create" => self.create(args, &turn, &identity).await,
            other => Err(ToolError::BadArguments(format!(
                "action is create, list or delete, not {other:?}"
            ))),
        }
    }

    /// `action = "create"`: a job for the turn's chat and user.
    async fn create(
        &self,
        args: Arguments,
        turn: &super::requests::TurnJobs,
        identity: &crate::vocab::TurnIdentity,
    ) -> Result<String, ToolError> {
        let Some(jobs) = turn.jobs() else {
            return Err(ToolError::Failed("scheduling is turned off here".into()));
        };
        let source = &identity.source;
        let when = args
            .when
            .ok_or_else(|| ToolError::BadArguments("create needs when".into()))?;
        let action = match (args.remind, args.prompt) {
            (Some(text), None) if !text.trim().is_empty() => Action::Message { text },
            (None, Some(text)) if !text.trim().is_empty() => Action::Prompt {
                fresh: match args.session.as_deref() {
                    None | Some("same") => false,
                    Some("fresh") => true,
                    Some(other) => {
                        return Err(ToolError::BadArguments(format!(
                            "session is \"same\" or \"fresh\", not {other:?}"
                        )))
                    }
                },
                text,
            },
            _ => {
                return Err(ToolError::BadArguments(
                    "create needs exactly one of remind and prompt".into(),
                ))
            }
        };
        let (zone, tz) = jobs.zone_of(source.chat_id).await;
        let (schedule, label) = parse_when(&when, jobs.now(), &tz).map_err(ToolError::Failed)?;
        let request = JobRequest {
            schedule,
            label,
            action,
        };
        let view = jobs
            .create(source, &identity.session_key, request)
            .await
            .map_err(ToolError::Failed)?;
        let line = jobs.confirmation(&view).await;
        turn.note(line.clone());
        let exact = view
            .next
            .map(|at| {
                at.to_zoned(tz.clone())
                    .strftime("%Y-%m-%d %H:%M:%S %Z")
                    .to_string()
            })
            .unwrap_or_default();
        Ok(format!(
            "Created job {} (time zone {zone}): next run {exact}. The user sees: {line}",
            view.id
        ))
    }
}

impl ToolRegistry for WithSchedule {
    fn prepare<'a>(&'a self, ctx: &'a ToolContext) -> BoxFuture<'a, ()> {
        self.inner.prepare(ctx)
    }

    fn attach_store(&self, child_groups: &crate::store::ChildGroups) {
        self.inner.attach_store(child_groups);
    }

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
        if name == SCHEDULE {
            Box::pin(async move {
                ctx.progress.still_working();
                self.schedule(arguments).await
            })
        } else {
            self.inner.call(name, arguments, ctx)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::NoTools;
    use crate::vocab::Progress;
    use tokio_util::sync::CancellationToken;

    #[tokio::test]
    async fn schedule_is_advertised_and_refuses_outside_a_chat() {
        let tools = WithSchedule::new(Arc::new(NoTools));
        let names: Vec<String> = tools.definitions().into_iter().map(|d| d.name).collect();
        assert_eq!(names, vec!["schedule"]);
        let ctx = ToolContext {
            cancel: CancellationToken::new(),
            progress: Progress::new(),
        };
        let error = tools
            .call("schedule", r#"{"action":"list"}"#, ctx.clone())
            .await
            .unwrap_err();
        assert!(error.to_string().contains("not available"), "{error}");
        assert!(matches!(
            tools.call("schedule", r#"{"nope":1}"#, ctx.clone()).await,
            Err(ToolError::BadArguments(_))
        ));
        assert!(matches!(
            tools.call("other", "{}", ctx).await,
            Err(ToolError::UnknownTool(_))
        ));
    }
}
