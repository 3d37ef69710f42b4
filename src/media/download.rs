//! Downloads through `getFile` and the Bot API file URL.
//!
//! The file URL is derived from `telegram.api_url`
//! (`<api_url>/file/bot<token>/<file_path>`), so a self-hosted Bot API
//! server works the same as Telegram's. A local server started with
//! `--local` answers `getFile` with an absolute path on its own disk
//! instead: that file is copied directly. Every download is capped (the
//! announced size is checked first, the bytes are counted as they arrive)
//! and written to a `.part` file that is renamed only when complete, so a
//! crash never leaves a truncated file that looks finished.
//!
//! The URL contains the bot token: it must never be logged or shown.

use std::path::{Path, PathBuf};
use std::time::Duration;

use teloxide::prelude::Requester;
use teloxide::types::FileId;
use teloxide::{ApiError, Bot, RequestError};
use tokio::io::AsyncWriteExt;

use super::human_size;

/// Why a file could not be fetched. The `Display` text is shown to the user.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// Bigger than the configured limit.
    #[error("that file is {}, above the {} limit (media.max_file_bytes)", human_size(*size), human_size(*limit))]
    TooBig {
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Telegram's cloud API serves at most 20 MB.
    #[error("Telegram lets bots download files of up to 20 MB and this one is bigger (a local Bot API server lifts that limit)")]
    TooBigForTelegram,
    /// getFile or the download failed.
    #[error("Telegram did not hand out the file ({0}); please send it again")]
    Telegram(String),
    /// Writing it failed.
    #[error("the file could not be saved ({0})")]
    Io(String),
}

/// Fetches files by `file_id`.
#[derive(Clone)]
pub struct Downloader {
    bot: Bot,
    client: reqwest::Client,
    /// `<api_url>/file/bot<token>` (no trailing slash). Secret.
    file_base: String,
}

impl std::fmt::Debug for Downloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Downloader").finish_non_exhaustive()
    }
}

impl Downloader {
    /// A downloader for `bot`, whose API root is `api_url` and token `token`.
    pub fn new(bot: Bot, api_url: &url::Url, token: &str) -> Result<Downloader, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(20))
            .timeout(Duration::from_secs(600))
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
        })
    }

    /// The URL of `file_path` as returned by getFile (relative).
    fn file_url(&self, file_path: &str) -> String {
        format!("{}/{}", self.file_base, file_path.trim_start_matches('/'))
    }

    /// Fetch `file_id` into `dest` (at most `limit` bytes). Returns the
    /// number of bytes written.
    pub async fn fetch(
        &self,
        file_id: &str,
        dest: &Path,
        limit: u64,
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
        let part = part_path(dest);
        let written = if Path::new(&file.path).is_absolute() {
            copy_local(Path::new(&file.path), &part, limit).await
        } else {
            self.fetch_url(&file.path, &part, limit).await
        };
        let written = match written {
            Ok(n) => n,
            Err(error) => {
                let _ = tokio::fs::remove_file(&part).await;
                return Err(error);
            }
        };
        tokio::fs::rename(&part, dest)
            .await
            .map_err(|e| DownloadError::Io(e.to_string()))?;
        Ok(written)
    }

    async fn fetch_url(
        &self,
        file_path: &str,
        part: &Path,
        limit: u64,
    ) -> Result<u64, DownloadError> {
        let response = self
            .client
            .get(self.file_url(file_path))
            .send()
            .await
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
        while let Some(chunk) = response
            .chunk()
            .await
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

/// A local Bot API server's absolute path: copy it (capped).
async fn copy_local(source: &Path, part: &Path, limit: u64) -> Result<u64, DownloadError> {
    let meta = tokio::fs::metadata(source).await.map_err(|e| {
        DownloadError::Telegram(format!(
            "the local Bot API server's file is not readable here: {e}"
        ))
    })?;
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

    #[test]
    fn the_file_url_follows_the_api_url() {
        let bot = Bot::new("1:T");
        let d =
            Downloader::new(bot, &url::Url::parse("http://127.0.0.1:9/").unwrap(), "1:T").unwrap();
        assert_eq!(
            d.file_url("photos/a.jpg"),
            "http://127.0.0.1:9/file/bot1:T/photos/a.jpg"
        );
        let d = Downloader::new(
            Bot::new("1:T"),
            &url::Url::parse("https://example.org/tg").unwrap(),
            "1:T",
        )
        .unwrap();
        assert_eq!(
            d.file_url("v.oga"),
            "https://example.org/tg/file/bot1:T/v.oga"
        );
        assert!(!format!("{d:?}").contains("1:T"));
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
    }
}
