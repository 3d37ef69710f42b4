//! Reading a child's output: bounded while it is read.
//!
//! A child writes as much as it likes (the diff of a 400 MB file, `yes`).
//! Whoever reads a child's pipe into memory reads it through
//! [`read_capped`]: at most the cap it chose is kept, and reading stops
//! right there (the caller then stops the child, or drains the rest into
//! nothing with [`discard`]), instead of reading everything and cutting
//! after. Readers that stream into a sink of their own (the command
//! backend's output and stderr tail, the process registry's ring, the ACP
//! agent's stderr lines) bound that sink instead.
//!
//! This module must never keep more than the cap of a stream (plus one
//! read buffer in flight).

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes read from a pipe at a time.
const CHUNK: usize = 64 * 1024;

/// What was kept of a stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capped {
    /// Its first bytes, at most the cap.
    pub bytes: Vec<u8>,
    /// The stream had more (reading stopped at the cap).
    pub cut: bool,
}

impl Capped {
    /// The bytes as text (invalid UTF-8, a character cut at the cap
    /// included, replaced).
    pub fn into_text(self) -> String {
        String::from_utf8(self.bytes)
            .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())
    }
}

/// Read `reader` until its end or until more than `cap` bytes came,
/// whichever is first; keep at most `cap`.
pub async fn read_capped<R: AsyncRead + Unpin>(reader: &mut R, cap: usize) -> io::Result<Capped> {
    let mut bytes = Vec::new();
    let mut chunk = vec![0; CHUNK];
    loop {
        let read = match reader.read(&mut chunk).await {
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if read == 0 {
            return Ok(Capped { bytes, cut: false });
        }
        let room = cap - bytes.len();
        if read > room {
            bytes.extend_from_slice(&chunk[..room]);
            return Ok(Capped { bytes, cut: true });
        }
        bytes.extend_from_slice(&chunk[..read]);
    }
}

/// Read `reader` to its end, keeping nothing (a child that must not block
/// on a full pipe after its cap was reached).
pub async fn discard<R: AsyncRead + Unpin>(reader: &mut R) -> io::Result<u64> {
    tokio::io::copy(reader, &mut tokio::io::sink()).await
}

#[cfg(test)]
mod tests {
    use super::{discard, read_capped, Capped};
    use crate::tools::procgroup::{spawn_leader, ProcessGroup};
    use std::process::Stdio;
    use std::time::Duration;

    #[tokio::test]
    async fn a_short_stream_is_kept_whole_and_a_long_one_cut_at_the_cap() {
        let mut short: &[u8] = b"hello";
        assert_eq!(
            read_capped(&mut short, 5).await.unwrap(),
            Capped {
                bytes: b"hello".to_vec(),
                cut: false
            }
        );
        let mut long: &[u8] = b"hello, world";
        let capped = read_capped(&mut long, 5).await.unwrap();
        assert!(capped.cut);
        assert_eq!(capped.into_text(), "hello");
        let mut rest: &[u8] = b"more";
        assert_eq!(discard(&mut rest).await.unwrap(), 4);
    }

    /// The cap holds while the child still writes: reading stops at it
    /// (a reader that read to the end first would wait here for ever).
    #[tokio::test]
    async fn reading_stops_at_the_cap_while_the_child_goes_on() {
        let mut command = tokio::process::Command::new("sh");
        command
            .args(["-c", "head -c 8000000 /dev/zero; exec sleep 600"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = spawn_leader(command).unwrap();
        let _group = child.id().and_then(ProcessGroup::of_leader);
        let mut stdout = child.stdout.take().unwrap();
        let capped = tokio::time::timeout(
            Duration::from_secs(20),
            read_capped(&mut stdout, 1024 * 1024),
        )
        .await
        .expect("reading stopped at the cap")
        .unwrap();
        assert!(capped.cut);
        assert_eq!(capped.bytes.len(), 1024 * 1024);
    }
}
