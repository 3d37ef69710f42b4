//! Jobs made during a turn: by the model's `schedule` tool, or by a
//! command-backend program through request files. The runner binds a
//! [`TurnJobs`] around each turn (task-local, like the turn's files); what
//! was made is confirmed in one line each under the turn's reply.
//!
//! **Request files** (command backend): the program finds a directory of
//! its own in `TELEGATE_SCHEDULE` and may write small JSON files there,
//! one job each; after the program ends, telegate reads every `*.json`
//! file (in name order, at most [`MAX_REQUESTS`], each at most
//! [`MAX_REQUEST_BYTES`]) and makes the jobs for the turn's chat and user,
//! exactly as `/at` or `/every` would (same caps, same zone):
//!
//! ```json
//! {"when": "in 30m", "remind": "call Anna"}
//! {"when": "every weekday 08:00", "prompt": "summarise my inbox", "session": "fresh"}
//! ```
//!
//! `when` takes the forms of the commands (`in 30m`, `at 18:00`, `at
//! tomorrow 09:00`, `every 1h`, `every mon,fri 18:00`, `cron 0 8 * * 1-5`);
//! exactly one of `remind` (sent as is) and `prompt` (run as a turn;
//! `session` `"same"`, the default, or `"fresh"`). A file that cannot be
//! read is reported in the reply and made nothing. The directory is
//! emptied before the program starts and removed after (also when the turn
//! was stopped: then no job is made from it).
//!
//! This module must never make a job for any chat but the turn's own.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Deserialize;

use super::service::Jobs;
use super::when::{parse_when, Action, JobRequest};
use crate::vocab::{SessionKey, SessionSource};

/// The variable naming a program's request directory.
pub const SCHEDULE_ENV: &str = "TELEGATE_SCHEDULE";

/// At most this many request files are read per turn.
pub const MAX_REQUESTS: usize = 10;

/// A request file larger than this is refused.
pub const MAX_REQUEST_BYTES: u64 = 16 * 1024;

tokio::task_local! {
    static TURN_JOBS: TurnJobs;
}

/// The jobs side of one turn (cheap to clone; clones share the lines).
#[derive(Clone, Default)]
pub struct TurnJobs {
    jobs: Option<Jobs>,
    requests: Option<Arc<RequestDir>>,
    lines: Arc<Mutex<Vec<String>>>,
}

/// A turn's request directory, removed when the turn's last handle goes
/// (also when the turn was stopped before its requests were read: a
/// stopped turn makes no jobs from files).
#[derive(Debug)]
struct RequestDir(PathBuf);

impl Drop for RequestDir {
    fn drop(&mut self) {
        // A small directory of a few files at most.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::fmt::Debug for TurnJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnJobs")
            .field("requests", &self.requests)
            .finish_non_exhaustive()
    }
}

/// Run `future` with `turn` as its turn's jobs.
pub async fn with_turn_jobs<F: Future>(turn: TurnJobs, future: F) -> F::Output {
    TURN_JOBS.scope(turn, future).await
}

/// The current turn's jobs (none outside a turn).
pub fn turn_jobs() -> Option<TurnJobs> {
    TURN_JOBS.try_with(Clone::clone).ok()
}

/// Set `TELEGATE_SCHEDULE` on a program of the current turn (removed when
/// the turn has no request directory).
pub fn apply_env(command: &mut tokio::process::Command) {
    match turn_jobs().and_then(|t| t.requests) {
        Some(dir) => command.env(SCHEDULE_ENV, &dir.0),
        None => command.env_remove(SCHEDULE_ENV),
    };
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestFile {
    when: String,
    #[serde(default)]
    remind: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    session: Option<String>,
}

impl TurnJobs {
    /// The jobs side of a turn in `chat_id` answering `answering`: with a
    /// request directory (emptied) when the backend runs a program
    /// (`program`) and jobs keep one.
    pub async fn start(
        jobs: Option<&Jobs>,
        chat_id: i64,
        answering: Option<i64>,
        program: bool,
    ) -> TurnJobs {
        let Some(jobs) = jobs else {
            return TurnJobs::default();
        };
        let requests = match (program, jobs.requests_root()) {
            (true, Some(root)) => request_dir(root, chat_id, answering).await,
            _ => None,
        };
        TurnJobs {
            jobs: Some(jobs.clone()),
            requests: requests.map(|dir| Arc::new(RequestDir(dir))),
            lines: Arc::default(),
        }
    }

    /// The jobs service, when scheduling is on.
    pub fn jobs(&self) -> Option<&Jobs> {
        self.jobs.as_ref()
    }

    /// Remember a line for the turn's reply (a job made).
    pub fn note(&self, line: String) {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }

    /// After the turn: make the jobs the program asked for (as `owner` in
    /// `key`), then every line for the reply, in order.
    pub async fn finish(&self, owner: &SessionSource, key: &SessionKey) -> Vec<String> {
        if let (Some(jobs), Some(dir)) = (&self.jobs, &self.requests) {
            for line in read_requests(jobs, &dir.0, owner, key).await {
                self.note(line);
            }
            // Read once: a second `finish` finds nothing.
            let _ = tokio::fs::remove_dir_all(&dir.0).await;
        }
        std::mem::take(&mut *self.lines.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

async fn request_dir(root: &Path, chat_id: i64, answering: Option<i64>) -> Option<PathBuf> {
    let turn = match answering {
        Some(id) => id.to_string(),
        None => uuid::Uuid::new_v4().simple().to_string(),
    };
    let dir = root
        .join(crate::media::safe_component(&chat_id.to_string()))
        .join(crate::media::safe_component(&turn));
    // A replayed turn starts empty: what its first run asked for was made
    // then (and confirmed) or is asked for again.
    let _ = tokio::fs::remove_dir_all(&dir).await;
    // Every directory made here is 0700 (the root inside the data
    // directory too: invariant 27), whatever the umask.
    let made = crate::private_fs::create_private_dir(&dir).await;
    match made {
        Ok(()) => Some(dir),
        Err(error) => {
            tracing::warn!(%error, "could not create the turn's schedule request directory");
            None
        }
    }
}

/// Make the jobs of the request files in `dir`; one line per file.
async fn read_requests(
    jobs: &Jobs,
    dir: &Path,
    owner: &SessionSource,
    key: &SessionKey,
) -> Vec<String> {
    let mut names = Vec::new();
    if let Ok(mut entries) = tokio::fs::read_dir(dir).await {
        while let Ok(Some(entry)) = entries.next_entry().await {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.ends_with(".json") && !name.starts_with('.') {
                names.push(name);
            }
        }
    }
    names.sort();
    let mut lines = Vec::new();
    if names.len() > MAX_REQUESTS {
        lines.push(format!(
            "⚠️ The program asked for {} jobs; only the first {MAX_REQUESTS} were read.",
            names.len()
        ));
        names.truncate(MAX_REQUESTS);
    }
    for name in names {
        let line = match one_request(jobs, &dir.join(&name), owner, key).await {
            Ok(line) => line,
            Err(reason) => format!("⚠️ Schedule request {name}: {reason}"),
        };
        lines.push(line);
    }
    lines
}

async fn one_request(
    jobs: &Jobs,
    path: &Path,
    owner: &SessionSource,
    key: &SessionKey,
) -> Result<String, String> {
    // Never follow a link out of the directory.
    let meta = tokio::fs::symlink_metadata(path)
        .await
        .map_err(|_| "it could not be read".to_string())?;
    if !meta.is_file() {
        return Err("it is not a plain file".to_string());
    }
    if meta.len() > MAX_REQUEST_BYTES {
        return Err(format!("it is larger than {MAX_REQUEST_BYTES} bytes"));
    }
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|_| "it could not be read".to_string())?;
    let request: RequestFile = serde_json::from_slice(&bytes).map_err(|e| {
        format!(
            "it is not a request like {{\"when\": \"in 30m\", \"remind\": \"call Anna\"}} ({e})"
        )
    })?;
    let action = match (request.remind, request.prompt) {
        (Some(text), None) if !text.trim().is_empty() => Action::Message { text },
        (None, Some(text)) if !text.trim().is_empty() => Action::Prompt {
            fresh: match request.session.as_deref() {
                None | Some("same") => false,
                Some("fresh") => true,
                Some(other) => {
                    return Err(format!("session is \"same\" or \"fresh\", not {other:?}"))
                }
            },
            text,
        },
        _ => return Err("it needs exactly one of remind and prompt, not empty".to_string()),
    };
    let (_, tz) = jobs.zone_of(owner.chat_id).await;
    let (schedule, label) = parse_when(&request.when, jobs.now(), &tz)?;
    let view = jobs
        .create(
            owner,
            key,
            JobRequest {
                schedule,
                label,
                action,
            },
        )
        .await?;
    Ok(jobs.confirmation(&view).await)
}
