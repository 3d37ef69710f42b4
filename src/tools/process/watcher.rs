//! The watcher task of one process: pump output into the ring, wait for
//! the exit, stop what the leader left in its group, record the exit and
//! send the wakeup if one is due.

use crate::tools::childgroups::RecordedGroup;
use crate::tools::process::Entry;
use crate::tools::process::DRAIN_LIMIT;
use crate::tools::process::READ_CHUNK;
use crate::tools::procgroup::ProcessGroup;
use crate::tools::ToolEvent;
use crate::tools::ToolEventSender;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncRead;
use tokio::io::AsyncReadExt;
use tokio::process::Child;

/// Pump the process's output into its ring, wait for it, stop what it left
/// in its group, record the exit and send the wakeup if one is due.
pub(super) async fn supervise(
    entry: Arc<Entry>,
    mut child: Child,
    // The group and its record, which is dropped (forgotten) with this task.
    (mut group, _recorded): (ProcessGroup, RecordedGroup),
    stdout: Option<impl AsyncRead + Unpin + Send + 'static>,
    stderr: Option<impl AsyncRead + Unpin + Send + 'static>,
    events: ToolEventSender,
    grace: Duration,
) {
    let readers = [
        stdout.map(|pipe| tokio::spawn(read_into(pipe, entry.clone()))),
        stderr.map(|pipe| tokio::spawn(read_into(pipe, entry.clone()))),
    ];
    let status = child.wait().await;
    // Whatever the leader left in its group may hold the pipes open.
    group.terminate_leftovers(grace).await;
    for reader in readers.into_iter().flatten() {
        let abort = reader.abort_handle();
        if tokio::time::timeout(DRAIN_LIMIT, reader).await.is_err() {
            tracing::warn!(process = %entry.id, "a process that left its group keeps the output open; not reading on");
            abort.abort();
        }
    }
    group.disarm();
    if let Some(wakeup) = entry.finish(status) {
        events.send(ToolEvent::Wakeup(Box::new(wakeup)));
    }
    if entry.is_background() && entry.owner.is_some() {
        events.send(ToolEvent::BackgroundEnded {
            id: entry.id.to_string(),
        });
    }
    tracing::info!(process = %entry.id, state = %entry.record().state_text(), "process ended");
}

pub(super) async fn read_into(mut pipe: impl AsyncRead + Unpin, entry: Arc<Entry>) {
    let mut buf = vec![0; READ_CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => entry.output().push(&buf[..n]),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => {
                tracing::debug!(process = %entry.id, %error, "reading output failed");
                return;
            }
        }
    }
}
