//! Downloads through `getFile` and the Bot API file URL.
//!
//! The file URL is derived from `telegram.api_url`
//! (`<api_url>/file/bot<token>/<file_path>`), so a self-hosted Bot API
//! server works the same as Telegram's. A local server started with
//! `--local` answers `getFile` with an absolute path on its own disk
//! instead: that file is copied directly, but only when the config says
//! the server is local (`[telegram] local_bot_api = true`); from any other
//! server an absolute path is refused, so no Bot API answer can make
//! telegate read a file of its own machine. Every download is capped (the
//! announced size is checked first, the bytes are counted as they arrive),
//! bounded in time by its size ([`DownloadTime`]: a floor plus the size at
//! a minimum throughput, capped by `[media] download_timeout_secs`, and an
//! idle limit for a body that stops sending) and written to a `.part` file
//! that is renamed only when complete, so a crash never leaves a truncated
//! file that looks finished.
//!
//! The URL contains the bot token: it must never be logged or shown.

use std::path::{Path, PathBuf};
use std::time::Duration;

use teloxide::prelude::Requester;
use teloxide::types::FileId;
use teloxide::{ApiError, Bot, RequestError};
use tokio::io::AsyncWriteExt;

use super::human_size;

/// Why a file could not be fetched. The `Display` text is the owner's
/// detail (for the log); [`DownloadError::user_text`] is what the chat is
/// told.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// Bigger than the configured limit.
    #[error("the file is {}, above the {} limit (media.max_file_bytes)", human_size(*size), human_size(*limit))]
    TooBig {
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Telegram's cloud API serves at most 20 MB.
    #[error("Telegram's cloud Bot API serves files of up to 20 MB (a local Bot API server, telegram.local_bot_api, lifts that limit)")]
    TooBigForTelegram,
    /// getFile or the download failed.
    #[error("the Bot API did not hand out the file: {0}")]
    Telegram(String),
    /// The download took longer than its size allows, or stopped sending.
    #[error("the download {0}")]
    TooSlow(String),
    /// getFile answered a path on this machine, but the Bot API server is
    /// not configured as local.
    #[error("getFile answered a local path, which is only read from a local Bot API server (telegram.local_bot_api = true); refused")]
    NotLocal,
    /// Writing it failed.
    #[error("the file could not be saved: {0}")]
    Io(String),
}

impl DownloadError {
    /// What the chat is told (no config keys, no internals).
    pub fn user_text(&self) -> String {
        match self {
            DownloadError::TooBig { size, limit } => format!(
                "it is {}, and I can only read files of up to {}",
                human_size(*size),
                human_size(*limit)
            ),
            DownloadError::TooBigForTelegram => {
                "Telegram lets bots download files of up to 20 MB and this one is bigger"
                    .to_string()
            }
            DownloadError::Telegram(_) | DownloadError::NotLocal => {
                "Telegram did not hand it out; please send it again".to_string()
            }
            DownloadError::TooSlow(_) => {
                "the download from Telegram was too slow; please send it again".to_string()
            }
            DownloadError::Io(_) => "I could not save it here; please try again later".to_string(),
        }
    }
}

/// How long one download may take: [`DownloadTime::deadline`] for the
/// whole transfer, and `idle` between two pieces of it (headers included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DownloadTime {
    /// Every download gets at least this long.
    pub floor: Duration,
    /// Plus its size at this throughput (bytes per second).
    pub min_bytes_per_sec: u64,
    /// Never more than this (`[media] download_timeout_secs`).
    pub cap: Duration,
    /// A download that receives nothing for this long is given up.
    pub idle: Duration,
}

impl DownloadTime {
    /// The defaults (30 s floor, 64 KiB/s, 30 s idle) under `cap`.
    pub fn capped(cap: Duration) -> DownloadTime {
        DownloadTime {
            floor: Duration::from_secs(30),
            min_bytes_per_sec: 64 * 1024,
            cap,
            idle: Duration::from_secs(30),
        }
    }

    /// The time allowed for a file of `size` bytes.
    pub fn deadline(&self, size: u64) -> Duration {
        let rate = self.min_bytes_per_sec.max(1);
        let transfer = Duration::from_secs(size.div_ceil(rate));
        self.floor.saturating_add(transfer).min(self.cap)
    }
}

/// Fetches files by `file_id`.
#[derive(Clone)]
pub struct Downloader {
    bot: Bot,
    client: reqwest::Client,
    /// `<api_url>/file/bot<token>` (no trailing slash). Secret.
    file_base: String,
    /// The Bot API server runs on this machine (`--local`): absolute
    /// paths from getFile are copied from disk.
    local: bool,
    time: DownloadTime,
}

impl std::fmt::Debug for Downloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Downloader").finish_non_exhaustive()
    }
}

impl Downloader {
    /// A downloader for `bot`, whose API root is `api_url` and token
    /// `token`; `local`: that server runs on this machine (`--local`).
    pub fn new(
        bot: Bot,
        api_url: &url::Url,
        token: &str,
        local: bool,
        time: DownloadTime,
    ) -> Result<Downloader, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(20))
            .build()
            .map_err(|e| format!("cannot set up the download client: {e}"))?;
        Ok(Downloader {
            bot,
            client,
            file_base: format!(
                "{}/file/bot{}",
                api_url.as_str().trim_end_matches('/'),
                token
            ),
            local,
            time,
        })
    }

    /// The URL of `file_path` as returned by getFile (relative).
    fn file_url(&self, file_path: &str) -> String {
        format!("{}/{}", self.file_base, file_path.trim_start_matches('/'))
    }

    /// Fetch `file_id` into `dest` (at most `limit` bytes; `expected`: the
    /// size the message announced, 0 if unknown). Returns the number of
    /// bytes written.
    pub async fn fetch(
        &self,
        file_id: &str,
        dest: &Path,
        limit: u64,
        expected: u64,
    ) -> Result<u64, DownloadError> {
        let file = self
            .bot
            .get_file(FileId(file_id.to_string()))
            .await
            .map_err(|error| match error {
                RequestError::Api(ApiError::Unknown(ref d)) if d.contains("file is too big") => {
                    DownloadError::TooBigForTelegram
                }
                other => DownloadError::Telegram(short(&other.to_string())),
            })?;
        let announced = u64::from(file.meta.size);
        if announced > limit {
            return Err(DownloadError::TooBig {
                size: announced,
                limit,
            });
        }
        if let Some(parent) = dest.parent() {
            crate::private_fs::create_private_dir(parent)
                .await
                .map_err(|e| DownloadError::Io(e.to_string()))?;
        }
        let absolute = Path::new(&file.path).is_absolute();
        if absolute && !self.local {
            return Err(DownloadError::NotLocal);
        }
        let part = part_path(dest);
        // Removed unless renamed: on a failure, and when the download is
        // cancelled (/stop, a shutdown) by dropping this future.
        let mut unfinished = Unfinished(Some(part.clone()));
        let size = announced.max(expected).min(limit);
        let deadline = self.time.deadline(size);
        let transfer = async {
            if absolute {
                copy_local(Path::new(&file.path), &part, limit).await
            } else {
                self.fetch_url(&file.path, &part, limit).await
            }
        };
        let written = match tokio::time::timeout(deadline, transfer).await {
            Ok(written) => written,
            Err(_) => Err(DownloadError::TooSlow(format!(
                "of {} took longer than the {} s its size allows",
                human_size(size),
                deadline.as_secs()
            ))),
        };
        let written = written?;
        tokio::fs::rename(&part, dest)
            .await
            .map_err(|e| DownloadError::Io(e.to_string()))?;
        unfinished.0 = None;
        Ok(written)
    }

    async fn fetch_url(
        &self,
        file_path: &str,
        part: &Path,
        limit: u64,
    ) -> Result<u64, DownloadError> {
        let idle = self.time.idle;
        let stalled =
            || DownloadError::TooSlow(format!("received nothing for {} s", idle.as_secs()));
        let request = self.client.get(self.file_url(file_path)).send();
        let response = tokio::time::timeout(idle, request)
            .await
            .map_err(|_| stalled())?
            // reqwest's error text contains the URL: keep only the kind.
            .map_err(|e| DownloadError::Telegram(network_kind(&e)))?;
        if !response.status().is_success() {
            return Err(DownloadError::Telegram(format!(
                "HTTP {}",
                response.status().as_u16()
            )));
        }
        if let Some(length) = response.content_length().filter(|l| *l > limit) {
            return Err(DownloadError::TooBig {
                size: length,
                limit,
            });
        }
        let mut out = tokio::fs::File::create(part)
            .await
            .map_err(|e| DownloadError::Io(e.to_string()))?;
        let mut response = response;
        let mut written = 0u64;
        while let Some(chunk) = tokio::time::timeout(idle, response.chunk())
            .await
            .map_err(|_| stalled())?
            .map_err(|e| DownloadError::Telegram(network_kind(&e)))?
        {
            written += chunk.len() as u64;
            if written > limit {
                return Err(DownloadError::TooBig {
                    size: written,
                    limit,
                });
            }
            out.write_all(&chunk)
                .await
                .map_err(|e| DownloadError::Io(e.to_string()))?;
        }
        out.flush()
            .await
            .map_err(|e| DownloadError::Io(e.to_string()))?;
        Ok(written)
    }
}

/// A local Bot API server's absolute path: copy it (capped; a regular
/// file only, never through a symlink).
async fn copy_local(source: &Path, part: &Path, limit: u64) -> Result<u64, DownloadError> {
    let meta = tokio::fs::symlink_metadata(source).await.map_err(|e| {
        DownloadError::Telegram(format!(
            "the local Bot API server's file is not readable here: {e}"
        ))
    })?;
    if !meta.is_file() {
        return Err(DownloadError::Telegram(
            "the local Bot API server's path is not a regular file".to_string(),
        ));
    }
    if meta.len() > limit {
        return Err(DownloadError::TooBig {
            size: meta.len(),
            limit,
        });
    }
    tokio::fs::copy(source, part)
        .await
        .map_err(|e| DownloadError::Io(e.to_string()))
}

/// A `.part` file that is removed when dropped, unless taken out.
struct Unfinished(Option<PathBuf>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(part) = self.0.take() {
            // Small and local: not worth a blocking-pool round trip.
            let _ = std::fs::remove_file(part);
        }
    }
}

fn part_path(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    dest.with_file_name(name)
}

fn network_kind(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        "timed out".into()
    } else if error.is_connect() {
        "could not connect".into()
    } else {
        "network error".into()
    }
}

fn short(text: &str) -> String {
    text.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn downloader(api_url: &str, time: DownloadTime) -> Downloader {
        Downloader::new(
            Bot::new("1:T"),
            &url::Url::parse(api_url).unwrap(),
            "1:T",
            false,
            time,
        )
        .unwrap()
    }

    #[test]
    fn the_file_url_follows_the_api_url() {
        let time = DownloadTime::capped(Duration::from_secs(600));
        let d = downloader("http://127.0.0.1:9/", time);
        assert_eq!(
            d.file_url("photos/a.jpg"),
            "http://127.0.0.1:9/file/bot1:T/photos/a.jpg"
        );
        let d = downloader("https://example.org/tg", time);
        assert_eq!(
            d.file_url("v.oga"),
            "https://example.org/tg/file/bot1:T/v.oga"
        );
        assert!(!format!("{d:?}").contains("1:T"));
    }

    #[test]
    fn the_time_allowed_grows_with_the_size_from_a_floor_up_to_the_cap() {
        let time = DownloadTime::capped(Duration::from_secs(600));
        assert_eq!(time.deadline(0), Duration::from_secs(30));
        assert_eq!(time.deadline(64 * 1024), Duration::from_secs(31));
        assert_eq!(time.deadline(64 * 1024 + 1), Duration::from_secs(32));
        // 20 MB at 64 KiB/s: 320 s, plus the floor.
        assert_eq!(time.deadline(20 * 1024 * 1024), Duration::from_secs(350));
        assert_eq!(time.deadline(u64::MAX), Duration::from_secs(600));
        let short = DownloadTime::capped(Duration::from_secs(10));
        assert_eq!(short.deadline(0), Duration::from_secs(10), "capped");
    }

    #[test]
    fn what_the_user_is_told_names_no_setting() {
        let errors = [
            DownloadError::TooBig { size: 10, limit: 5 },
            DownloadError::TooBigForTelegram,
            DownloadError::Telegram("HTTP 404".into()),
            DownloadError::TooSlow("received nothing for 30 s".into()),
            DownloadError::NotLocal,
            DownloadError::Io("disk full".into()),
        ];
        for error in errors {
            let text = error.user_text();
            for key in [
                "media.",
                "telegram.",
                "max_file_bytes",
                "local_bot_api",
                "disk full",
            ] {
                assert!(!text.contains(key), "{text}");
            }
        }
    }

    /// A server that answers headers and a first byte, then sends nothing.
    async fn stalling_server() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = [0u8; 1024];
                    let _ = socket.read(&mut request).await;
                    let head = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nx";
                    let _ = socket.write_all(head.as_bytes()).await;
                    std::future::pending::<()>().await;
                    drop(socket);
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_body_that_stops_sending_is_given_up_after_the_idle_time() {
        let addr = stalling_server().await;
        let time = DownloadTime {
            idle: Duration::from_millis(200),
            ..DownloadTime::capped(Duration::from_secs(600))
        };
        let d = downloader(&format!("http://{addr}/"), time);
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("f.part");
        let result = d.fetch_url("files/f.bin", &part, 1000).await;
        assert!(
            matches!(result, Err(DownloadError::TooSlow(_))),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn local_absolute_paths_are_copied_within_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("src.bin");
        std::fs::write(&source, b"12345").unwrap();
        let part = dir.path().join("out.part");
        assert_eq!(copy_local(&source, &part, 5).await.unwrap(), 5);
        assert!(matches!(
            copy_local(&source, &part, 4).await,
            Err(DownloadError::TooBig { size: 5, limit: 4 })
        ));
        let link = dir.path().join("link.bin");
        std::os::unix::fs::symlink(&source, &link).unwrap();
        assert!(
            matches!(
                copy_local(&link, &part, 5).await,
                Err(DownloadError::Telegram(_))
            ),
            "a symlink is not followed"
        );
    }
}
