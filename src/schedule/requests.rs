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
//! `session` `"same"`, the default, or `"fresh"`). Each file is read by
//! handle, the way files to send are ([`crate::media::handle`]): opened
//! once below the directory's handle, non-blocking, through no link, a
//! regular file with no other hard link, read bounded. A file that cannot
//! be read is reported in the reply and made nothing. The directory is
//! emptied before the program starts and removed after (also when the turn
//! was stopped: then no job is made from it).
//!
//! This module must never make a job for any chat but the turn's own.

use std::future::Future;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Deserialize;

use super::service::Jobs;
use super::when::{parse_when, Action, JobRequest};
use crate::media::handle::{check_file, list, open_file_beneath, open_root, Facts, Unfit};
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
    let at = dir.to_path_buf();
    let read = tokio::task::spawn_blocking(move || read_request_files(&at))
        .await
        .unwrap_or_default();
    let mut lines = Vec::new();
    if read.found > MAX_REQUESTS {
        lines.push(format!(
            "⚠️ The program asked for {} jobs; only the first {MAX_REQUESTS} were read.",
            read.found
        ));
    }
    for (name, bytes) in read.files {
        let made = match bytes {
            Ok(bytes) => one_request(jobs, &bytes, owner, key).await,
            Err(reason) => Err(reason),
        };
        lines.push(made.unwrap_or_else(|reason| format!("⚠️ Schedule request {name}: {reason}")));
    }
    lines
}

/// The request files of a directory, each read through one handle.
#[derive(Debug, Default)]
struct RequestFiles {
    /// How many `*.json` files there were.
    found: usize,
    /// The first [`MAX_REQUESTS`] in name order: their bytes, or why not.
    files: Vec<(String, Result<Vec<u8>, String>)>,
}

/// Read the `*.json` files of `dir` (blocking). The directory is opened by
/// handle (not through a link) and listed from it; each file is opened
/// once below that handle, non-blocking and through no link, checked on
/// the handle (a regular file with no other hard link, at most
/// [`MAX_REQUEST_BYTES`]) and read from it, bounded.
fn read_request_files(dir: &Path) -> RequestFiles {
    let Ok(root) = open_root(dir) else {
        return RequestFiles::default();
    };
    let mut names: Vec<String> = list(root.as_fd())
        .unwrap_or_default()
        .into_iter()
        .filter(|name| name.ends_with(".json") && !name.starts_with('.'))
        .collect();
    let found = names.len();
    names.truncate(MAX_REQUESTS);
    let files = names
        .into_iter()
        .map(|name| {
            let read = read_one(root.as_fd(), &name);
            (name, read)
        })
        .collect();
    RequestFiles { found, files }
}

/// One request file below the open directory `dir`: its bytes, or why not.
fn read_one(dir: BorrowedFd<'_>, name: &str) -> Result<Vec<u8>, String> {
    fn unreadable<E>(_: E) -> String {
        "it could not be read".to_string()
    }
    let too_big = || format!("it is larger than {MAX_REQUEST_BYTES} bytes");
    let fd = open_file_beneath(dir, Path::new(name), None).map_err(unreadable)?;
    let facts = Facts::of(fd.as_fd()).map_err(unreadable)?;
    check_file(&facts, MAX_REQUEST_BYTES, None).map_err(|why| match why {
        Unfit::TooBig(_) => too_big(),
        Unfit::Empty => "it is empty".to_string(),
        Unfit::NotAFile | Unfit::Linked | Unfit::Unreadable => "it is not a plain file".to_string(),
    })?;
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_REQUEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_REQUEST_BYTES {
        return Err(too_big());
    }
    Ok(bytes)
}

async fn one_request(
    jobs: &Jobs,
    bytes: &[u8],
    owner: &SessionSource,
    key: &SessionKey,
) -> Result<String, String> {
    let request: RequestFile = serde_json::from_slice(bytes).map_err(|e| {
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

#[cfg(test)]
mod tests {
    use super::{read_request_files, MAX_REQUESTS, MAX_REQUEST_BYTES};
    use std::path::Path;

    const PLAIN: &str = r#"{"when": "in 1h", "remind": "plain"}"#;
    const SECRET: &str = r#"{"when": "in 1h", "remind": "SECRET"}"#;

    fn texts(dir: &Path) -> Vec<(String, Result<String, String>)> {
        read_request_files(dir)
            .files
            .into_iter()
            .map(|(name, read)| (name, read.map(|b| String::from_utf8(b).unwrap())))
            .collect()
    }

    #[test]
    fn only_plain_files_of_the_directory_are_read() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret.json");
        std::fs::write(&secret, SECRET).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a.json"), PLAIN).unwrap();
        std::os::unix::fs::symlink(&secret, d.join("b.json")).unwrap();
        std::fs::hard_link(&secret, d.join("c.json")).unwrap();
        let fifo =
            std::ffi::CString::new(d.join("d.json").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::fs::write(d.join("e.json"), vec![b' '; MAX_REQUEST_BYTES as usize + 1]).unwrap();
        std::fs::write(d.join(".hidden.json"), PLAIN).unwrap();
        std::fs::write(d.join("notes.txt"), PLAIN).unwrap();
        let read = texts(d);
        let names: Vec<&str> = read.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a.json", "b.json", "c.json", "d.json", "e.json"]);
        assert_eq!(read[0].1.as_deref(), Ok(PLAIN));
        for (name, got) in &read[1..] {
            assert!(got.is_err(), "{name}: {got:?}");
        }
        assert_eq!(
            read[4].1,
            Err(format!("it is larger than {MAX_REQUEST_BYTES} bytes"))
        );
    }

    #[test]
    fn at_most_max_requests_are_read_and_all_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..MAX_REQUESTS + 2 {
            std::fs::write(dir.path().join(format!("{i:02}.json")), PLAIN).unwrap();
        }
        let read = read_request_files(dir.path());
        assert_eq!(read.found, MAX_REQUESTS + 2);
        assert_eq!(read.files.len(), MAX_REQUESTS);
    }

    /// A program swapping its request file for a link to a file elsewhere,
    /// over and over, never gets that file read: what is checked is what
    /// is read.
    #[test]
    fn a_file_swapped_for_a_link_is_never_read_through_it() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret.json");
        std::fs::write(&secret, SECRET).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        std::fs::write(d.join("a.json"), PLAIN).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (d, stop) = (d.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let next = d.join(format!(".next{i}"));
                    if i.is_multiple_of(2) {
                        std::os::unix::fs::symlink(&secret, &next).unwrap();
                    } else {
                        std::fs::write(&next, PLAIN).unwrap();
                    }
                    std::fs::rename(&next, d.join("a.json")).unwrap();
                    i += 1;
                }
            })
        };
        let mut plain = 0;
        for _ in 0..2000 {
            for (_, got) in texts(&d) {
                if let Ok(text) = got {
                    assert_eq!(text, PLAIN, "read through a link");
                    plain += 1;
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
        assert!(plain > 0, "the plain file was read at times");
    }
}
