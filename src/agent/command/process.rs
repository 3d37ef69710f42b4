//! Process handling: supervising the program (its whole process group) while
//! its pipes are pumped, timeouts, stop on cancellation, leftovers, and
//! the error messages for programs that fail.
//!
//! It must never signal a group it did not create, and never leave a
//! process of a turn running after the turn ends.

use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::pin::{pin, Pin};
use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin};

use super::protocol::OutputCollector;
use super::CommandAgent;
use crate::agent::{AgentError, TurnRequest};
use crate::tools::procgroup::{signal_name, ProcessGroup};
use crate::vocab::Progress;

/// How much of stderr is kept (the tail).
const STDERR_TAIL_BYTES: usize = 4096;
/// How much of the stderr tail goes into a chat error message.
const STDERR_MESSAGE_CHARS: usize = 800;
/// At most this many stderr lines go into a chat error message.
const STDERR_MESSAGE_LINES: usize = 12;
/// Bytes read from a pipe at a time.
const READ_CHUNK: usize = 16 * 1024;
/// How long to keep reading pipes after the whole group is gone. Only a
/// process that left the group (`setsid`) can hold them open longer.
const DRAIN_LIMIT: Duration = Duration::from_secs(1);

impl CommandAgent {
    /// Wait for the program while `io` pumps its pipes; stop its whole group
    /// on cancellation or timeout, and clean up what it leaves behind.
    pub(super) async fn supervise(
        &self,
        child: &mut Child,
        mut group: ProcessGroup,
        io: impl Future<Output = ()>,
        turn: &TurnRequest,
    ) -> Result<ExitStatus, AgentError> {
        let mut io = Pumping::new(io);
        let timeout = self.config.timeout();
        let grace = self.config.kill_grace();

        let ended = io
            .alongside(async {
                tokio::select! {
                    status = child.wait() => Ended::Exited(status),
                    () = turn.cancel.cancelled() => Ended::Stopped,
                    () = sleep_for(timeout) => Ended::TimedOut,
                }
            })
            .await;
        let status = match ended {
            Ended::Exited(Ok(status)) => status,
            Ended::Exited(Err(error)) => {
                group.send(libc::SIGKILL);
                group.disarm();
                return Err(AgentError::Backend {
                    user_message: format!("Lost track of `{}` while it ran.", self.program()),
                    detail: format!("waiting for the command failed: {error:?}"),
                });
            }
            Ended::Stopped => {
                io.alongside(group.stop(child, grace)).await;
                group.disarm();
                return Err(AgentError::Cancelled);
            }
            Ended::TimedOut => {
                io.alongside(group.stop(child, grace)).await;
                group.disarm();
                return Err(self.timed_out());
            }
        };

        // The program exited: stop whatever it left running (which may hold
        // our pipes open), then read what is left in the pipes.
        let cancelled = {
            let tidy_up = async {
                io.alongside(group.terminate_leftovers(grace)).await;
                if tokio::time::timeout(DRAIN_LIMIT, io.finish())
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        program = self.program(),
                        "a process that left the command's group keeps its output open; not waiting for it"
                    );
                }
            };
            tokio::select! {
                () = tidy_up => false,
                () = turn.cancel.cancelled() => true,
            }
        };
        if cancelled {
            // The program already exited; only leftovers can remain.
            group.send(libc::SIGKILL);
        }
        group.disarm();
        if cancelled {
            Err(AgentError::Cancelled)
        } else {
            Ok(status)
        }
    }

    fn timed_out(&self) -> AgentError {
        AgentError::Backend {
            user_message: format!(
                "`{}` did not finish within {} s and was stopped. Raise agent.command.timeout_secs if it needs longer.",
                self.program(),
                self.config.timeout_secs
            ),
            detail: format!("command timed out after {} s", self.config.timeout_secs),
        }
    }

    /// The error for a program that exited unsuccessfully.
    pub(super) fn failure(&self, status: ExitStatus, stderr: &StderrTail) -> AgentError {
        let how = match (status.code(), status.signal()) {
            (Some(code), _) => format!("failed with exit code {code}"),
            (None, Some(signal)) => format!("was killed by signal {}", signal_name(signal)),
            (None, None) => format!("failed ({status})"),
        };
        let mut user_message = format!("`{}` {how}.", self.program());
        let tail = last_lines(&stderr.text(), STDERR_MESSAGE_LINES, STDERR_MESSAGE_CHARS);
        if !tail.is_empty() {
            let fence = code_fence_for(&tail);
            user_message.push_str(&format!("\n{fence}\n{tail}\n{fence}"));
        }
        AgentError::Backend {
            user_message,
            detail: format!(
                "command {:?} {how}; stderr tail: {:?}",
                self.program(),
                stderr.text()
            ),
        }
    }
}

/// How the first phase of a run ended.
enum Ended {
    Exited(io::Result<ExitStatus>),
    Stopped,
    TimedOut,
}

async fn sleep_for(limit: Option<Duration>) {
    match limit {
        Some(limit) => tokio::time::sleep(limit).await,
        None => std::future::pending().await,
    }
}

/// The pipe pump, polled alongside whatever the supervisor waits for, so
/// the program never blocks on a full pipe.
struct Pumping<F> {
    io: Pin<Box<F>>,
    done: bool,
}

impl<F: Future<Output = ()>> Pumping<F> {
    fn new(io: F) -> Self {
        Pumping {
            io: Box::pin(io),
            done: false,
        }
    }

    /// Run `work` to completion while pumping.
    async fn alongside<T>(&mut self, work: impl Future<Output = T>) -> T {
        let mut work = pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return out,
                () = self.io.as_mut(), if !self.done => self.done = true,
            }
        }
    }

    /// Pump until both output pipes are closed.
    async fn finish(&mut self) {
        if !self.done {
            self.io.as_mut().await;
            self.done = true;
        }
    }
}

/// Feed stdin and read stdout and stderr until each is done.
pub(super) async fn pump(
    stdin: Option<(ChildStdin, String)>,
    stdout: Option<impl AsyncRead + Unpin>,
    stderr: Option<impl AsyncRead + Unpin>,
    out: &mut OutputCollector,
    err: &mut StderrTail,
) {
    tokio::join!(
        feed(stdin),
        read_all(stdout, |bytes| out.push(bytes)),
        read_all(stderr, |bytes| err.push(bytes)),
    );
}

/// Write the message to stdin and close it. A program that exits without
/// reading it all is not an error.
async fn feed(stdin: Option<(ChildStdin, String)>) {
    let Some((mut pipe, text)) = stdin else {
        return;
    };
    if let Err(error) = pipe.write_all(text.as_bytes()).await {
        tracing::debug!(%error, "the command did not read all of its stdin");
    }
    // Dropping the pipe closes it: the program sees end-of-file.
}

async fn read_all(reader: Option<impl AsyncRead + Unpin>, mut sink: impl FnMut(&[u8])) {
    let Some(mut reader) = reader else {
        return;
    };
    let mut buf = vec![0; READ_CHUNK];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => sink(&buf[..n]),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => {
                tracing::debug!(%error, "reading the command's output failed");
                return;
            }
        }
    }
}

/// The last few KiB of stderr.
pub(super) struct StderrTail {
    progress: Progress,
    buf: Vec<u8>,
}

impl StderrTail {
    pub(super) fn new(progress: Progress) -> Self {
        StderrTail {
            progress,
            buf: Vec::new(),
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.progress.still_working();
        let bytes = &bytes[bytes.len().saturating_sub(STDERR_TAIL_BYTES)..];
        self.buf.extend_from_slice(bytes);
        let excess = self.buf.len().saturating_sub(STDERR_TAIL_BYTES);
        self.buf.drain(..excess);
    }

    /// The tail as text (it may start mid-character; that is replaced).
    pub(super) fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf)
            .trim_start_matches(char::REPLACEMENT_CHARACTER)
            .trim_end()
            .to_string()
    }
}

/// The last non-empty lines of `text`, at most `max_lines` lines and about
/// `max_chars` characters (a longer last line keeps its end).
fn last_lines(text: &str, max_lines: usize, max_chars: usize) -> String {
    let mut picked: Vec<&str> = Vec::new();
    let mut chars = 0;
    for line in text.lines().rev().filter(|l| !l.trim().is_empty()) {
        let len = line.chars().count() + 1;
        if picked.len() == max_lines || (chars + len > max_chars && !picked.is_empty()) {
            break;
        }
        chars += len;
        picked.push(line);
    }
    picked.reverse();
    let joined = picked.join("\n");
    let count = joined.chars().count();
    if count <= max_chars {
        return joined;
    }
    let tail: String = joined.chars().skip(count - max_chars).collect();
    format!("…{tail}")
}

/// A Markdown code fence longer than any backtick run in `text`.
fn code_fence_for(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    "`".repeat(longest.max(2) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_keeps_a_bounded_tail() {
        let mut err = StderrTail::new(Progress::new());
        for i in 0..2000 {
            err.push(format!("line {i}\n").as_bytes());
        }
        assert!(err.buf.len() <= STDERR_TAIL_BYTES);
        assert!(err.text().ends_with("line 1999"));
        let tail = last_lines(&err.text(), 3, 800);
        assert_eq!(tail, "line 1997\nline 1998\nline 1999");
        let long = "x".repeat(2000);
        assert_eq!(last_lines(&long, 3, 10).chars().count(), 11);
    }

    #[test]
    fn code_fences_outgrow_backticks() {
        assert_eq!(code_fence_for("plain"), "```");
        assert_eq!(code_fence_for("a ```` b"), "`````");
    }
}
