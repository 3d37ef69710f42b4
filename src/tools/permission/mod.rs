//! Claude Code's permission prompts on telegate's approval card.
//!
//! With `[agent.command] permission_prompt = true` (claude preset), each
//! turn runs Claude Code with `--mcp-config <file> --permission-prompt-tool
//! mcp__telegate__approve`. The file names one MCP server, `telegate`:
//! this very binary in helper mode ([`helper`], `telegate
//! permission-helper --socket PATH`), which Claude Code starts as its own
//! child (so it lives in the turn's process group and dies with it). When
//! Claude Code wants a tool it was not allowed in advance, it calls the
//! helper's `approve` tool; the helper forwards the request over a private
//! Unix socket to the running telegate, which asks the chat through the
//! same [`ApprovalGate`] as every other tool (card, one-time id,
//! `may_decide`, buttons, /approve, /deny, /stop, "no answer in time =
//! denied") and sends the decision back as Claude Code's
//! `{"behavior":"allow",…}` / `{"behavior":"deny",…}`.
//!
//! Why it is safe to offer a socket:
//! * it lives in a 0700 directory under the data directory, the socket
//!   itself 0600: only telegate's user (and root) can connect;
//! * each turn gets a fresh random token ([`TurnPrompt`]), written only
//!   into the 0600 MCP config file Claude Code reads (never on a command
//!   line, which every local user can read); a request with a token that
//!   belongs to no running turn is refused, so no other process can put a
//!   card into a chat, and a finished turn's token is dead;
//! * the answer always comes from the chat's card: nothing on the socket
//!   can approve anything;
//! * everything is bounded: the request size ([`wire::MAX_REQUEST_BYTES`]),
//!   the time to send it, the connections served at once, and the wait
//!   (the gate's timeout, and the turn's cancellation).
//!
//! The helper needs no secret: Claude Code gives it the environment it
//! has itself, telegate's minimal child environment, plus the token.
//!
//! This module owns the socket, the tokens and the per-turn config file.
//! It must never answer a request without the gate, and never answer a
//! request whose token is not a running turn's.

pub mod helper;
pub mod wire;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::approval::{ApprovalGate, Verdict};
use super::process::ProcessOwner;
use crate::vocab::Progress;
use wire::Decision;

/// The MCP server's name in Claude Code's config.
pub const SERVER_NAME: &str = "telegate";
/// The helper's one tool.
pub const TOOL_NAME: &str = "approve";
/// What `--permission-prompt-tool` names.
pub const PROMPT_TOOL: &str = "mcp__telegate__approve";
/// The hidden subcommand of the helper mode.
pub const HELPER_SUBCOMMAND: &str = "permission-helper";
/// The variable holding the turn's token, for the helper.
pub const TOKEN_ENV: &str = "TELEGATE_PERMISSION_TOKEN";
/// The variable telling the helper how long to wait for an answer (s).
pub const WAIT_ENV: &str = "TELEGATE_PERMISSION_WAIT_SECS";
/// The socket's file name inside the private directory.
const SOCKET_NAME: &str = "permission.sock";
/// The longest a helper may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests served at once (a turn asks one at a time).
const MAX_CONNECTIONS: usize = 16;
/// The longest socket path the kernel takes (`sun_path`, with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// What a request needs from its turn.
#[derive(Clone)]
struct TurnEntry {
    owner: ProcessOwner,
    cancel: CancellationToken,
    progress: Progress,
}

struct Inner {
    dir: PathBuf,
    gate: ApprovalGate,
    /// How long the helper waits (the gate's timeout and a margin).
    helper_wait: Duration,
    helper_program: PathBuf,
    turns: Mutex<HashMap<String, TurnEntry>>,
    listening: tokio::sync::OnceCell<Result<(), String>>,
}

/// The permission prompts of one command backend. Cheap to clone.
#[derive(Clone)]
pub struct PermissionPrompts {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PermissionPrompts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PermissionPrompts")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

impl PermissionPrompts {
    /// Prompts answered through `gate` (whose timeout is `timeout`), with
    /// the socket and the per-turn files in `dir` (created 0700 when the
    /// first turn needs it). `helper_program` is telegate's own binary.
    pub fn new(
        dir: PathBuf,
        gate: ApprovalGate,
        timeout: Duration,
        helper_program: PathBuf,
    ) -> PermissionPrompts {
        PermissionPrompts {
            inner: Arc::new(Inner {
                dir,
                gate,
                helper_wait: timeout + Duration::from_secs(30),
                helper_program,
                turns: Mutex::new(HashMap::new()),
                listening: tokio::sync::OnceCell::new(),
            }),
        }
    }

    /// The approval gate the prompts ask through.
    pub fn gate(&self) -> &ApprovalGate {
        &self.inner.gate
    }

    fn socket_path(&self) -> PathBuf {
        self.inner.dir.join(SOCKET_NAME)
    }

    /// Make the turn of `owner` able to ask: the socket listens (from the
    /// first turn on), a token is issued and the MCP config file written.
    /// Dropping the result ends it (token dead, file removed).
    pub async fn open_turn(
        &self,
        owner: ProcessOwner,
        cancel: CancellationToken,
        progress: Progress,
    ) -> Result<TurnPrompt, String> {
        self.inner
            .listening
            .get_or_init(|| async { self.listen() })
            .await
            .clone()?;
        let token = random_hex(32)?;
        let file = self.inner.dir.join(format!("mcp-{}.json", random_hex(8)?));
        let config = json!({
            "mcpServers": {
                SERVER_NAME: {
                    "type": "stdio",
                    "command": self.inner.helper_program,
                    "args": [HELPER_SUBCOMMAND, "--socket", self.socket_path()],
                    "env": {
                        TOKEN_ENV: token,
                        WAIT_ENV: self.inner.helper_wait.as_secs().to_string(),
                    }
                }
            }
        });
        write_private(&file, config.to_string().as_bytes())
            .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
        self.turns().insert(
            token.clone(),
            TurnEntry {
                owner,
                cancel,
                progress,
            },
        );
        Ok(TurnPrompt {
            prompts: self.clone(),
            token,
            file,
        })
    }

    fn turns(&self) -> std::sync::MutexGuard<'_, HashMap<String, TurnEntry>> {
        self.inner
            .turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Bind the socket (a leftover from a killed run is replaced) and
    /// serve it for as long as the runtime runs.
    fn listen(&self) -> Result<(), String> {
        let dir = &self.inner.dir;
        crate::private_fs::private_dir(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = self.socket_path();
        if path.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(format!(
                "the permission socket path {} is longer than the {MAX_SOCKET_PATH} bytes a socket \
                 path may have: choose a shorter store.data_dir",
                path.display()
            ));
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot replace {}: {e}", path.display())),
        }
        // The config files of turns a killed run left (their tokens are dead).
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with("mcp-") && name.ends_with(".json") {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let listener = UnixListener::bind(&path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("cannot restrict {}: {e}", path.display()))?;
        tracing::info!(socket = %path.display(), "Claude Code permission prompts listen");
        let prompts = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let Some(inner) = prompts.upgrade() else {
                    return;
                };
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    tracing::warn!("too many permission requests at once; one was refused");
                    continue;
                };
                let prompts = PermissionPrompts { inner };
                tokio::spawn(async move {
                    prompts.serve(stream).await;
                    drop(permit);
                });
            }
        });
        Ok(())
    }

    /// One connection: one request, one answer.
    async fn serve(&self, mut stream: UnixStream) {
        let line = match tokio::time::timeout(
            READ_TIMEOUT,
            read_line(&mut stream, wire::MAX_REQUEST_BYTES),
        )
        .await
        {
            Ok(Ok(line)) => line,
            Ok(Err(why)) => {
                let _ = reply(&mut stream, &Decision::deny(why)).await;
                return;
            }
            Err(_) => return,
        };
        let decision = match wire::parse_request(&line) {
            Ok(request) => self.decide(request, &mut stream).await,
            Err(why) => Decision::deny(why),
        };
        let _ = reply(&mut stream, &decision).await;
    }

    /// Ask the chat of the request's turn, while the helper is still there.
    async fn decide(&self, request: wire::Request, stream: &mut UnixStream) -> Decision {
        let entry = self.turns().get(&request.token).cloned();
        let Some(entry) = entry else {
            tracing::warn!(tool = %request.tool_name, "a permission request with an unknown token was refused");
            return Decision::deny("this permission request belongs to no running task");
        };
        let subject = request_subject(&request);
        let asked_at = std::time::SystemTime::now();
        let verdict = {
            let ask = self.inner.gate.ask(
                &entry.owner,
                &subject,
                "Claude Code asks before using a tool it was not allowed in advance",
                &entry.cancel,
                &entry.progress,
            );
            tokio::pin!(ask);
            let mut probe = [0u8; 1];
            tokio::select! {
                verdict = &mut ask => verdict,
                // The helper went away (Claude Code stopped): withdraw.
                _ = stream.read(&mut probe) => return Decision::deny("the request was withdrawn"),
            }
        };
        tracing::info!(
            session_key = %entry.owner.session_key,
            chat_id = entry.owner.source.chat_id,
            started_by = ?entry.owner.source.user_id,
            tool = %request.tool_name,
            tool_use_id = request.tool_use_id.as_deref().unwrap_or_default(),
            asked_at_ms = asked_at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis()),
            ?verdict,
            "Claude Code permission prompt decided"
        );
        match verdict {
            Verdict::Approved => Decision::Allow {
                updated_input: request.input,
            },
            Verdict::Denied(denial) => Decision::deny(denial.to_string()),
        }
    }
}

/// What the card shows: the tool and its whole input.
fn request_subject(request: &wire::Request) -> String {
    let input = serde_json::to_string_pretty(&request.input).unwrap_or_default();
    format!(
        "Claude Code wants to use the tool {} with the input\n{input}",
        request.tool_name
    )
}

/// A running turn's permission prompts: the arguments for Claude Code.
/// Dropping it ends the turn's token and removes its config file.
pub struct TurnPrompt {
    prompts: PermissionPrompts,
    token: String,
    file: PathBuf,
}

impl TurnPrompt {
    /// `--mcp-config <file> --permission-prompt-tool mcp__telegate__approve`.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--mcp-config".to_string(),
            self.file.display().to_string(),
            "--permission-prompt-tool".to_string(),
            PROMPT_TOOL.to_string(),
        ]
    }

    /// The config file Claude Code reads.
    pub fn config_file(&self) -> &Path {
        &self.file
    }
}

impl Drop for TurnPrompt {
    fn drop(&mut self) {
        self.prompts.turns().remove(&self.token);
        let _ = std::fs::remove_file(&self.file);
    }
}

/// `n` random bytes as hex.
fn random_hex(n: usize) -> Result<String, String> {
    use ring::rand::SecureRandom;
    let mut bytes = vec![0u8; n];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "no randomness available".to_string())?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Write `bytes` to a new 0600 file.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)
}

/// Read up to a newline (or the end), at most `max` bytes.
pub(crate) async fn read_line<R: AsyncReadExt + Unpin>(
    reader: &mut R,
    max: usize,
) -> Result<Vec<u8>, String> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let read = reader
            .read(&mut chunk)
            .await
            .map_err(|_| "the request could not be read".to_string())?;
        if read == 0 {
            return Ok(line);
        }
        if let Some(end) = chunk[..read].iter().position(|b| *b == b'\n') {
            line.extend_from_slice(&chunk[..end]);
            return if line.len() > max {
                Err("the request is too large to show for approval".to_string())
            } else {
                Ok(line)
            };
        }
        line.extend_from_slice(&chunk[..read]);
        if line.len() > max {
            return Err("the request is too large to show for approval".to_string());
        }
    }
}

async fn reply(stream: &mut UnixStream, decision: &Decision) -> std::io::Result<()> {
    let mut text = decision.to_text();
    text.push('\n');
    stream.write_all(text.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::{Platform, SessionKey, SessionSource};

    fn owner() -> ProcessOwner {
        ProcessOwner {
            session_key: SessionKey::from_raw("k"),
            source: SessionSource::dm(Platform::Console, 7),
            spawn_session_id: None,
        }
    }

    async fn ask(socket: &Path, request: &wire::Request) -> Decision {
        let mut stream = UnixStream::connect(socket).await.unwrap();
        let mut line = serde_json::to_vec(request).unwrap();
        line.push(b'\n');
        stream.write_all(&line).await.unwrap();
        let answer = read_line(&mut stream, wire::MAX_REPLY_BYTES).await.unwrap();
        serde_json::from_slice(&answer).unwrap()
    }

    #[tokio::test]
    async fn only_a_running_turns_token_reaches_the_card() {
        let dir = std::env::temp_dir().join(format!("telegate-perm-{}", random_hex(4).unwrap()));
        let (events, mut rx) = crate::tools::tool_events();
        let gate = ApprovalGate::new(Duration::from_secs(60), events);
        let prompts = PermissionPrompts::new(
            dir.clone(),
            gate.clone(),
            Duration::from_secs(60),
            "/bin/telegate".into(),
        );
        let turn = prompts
            .open_turn(owner(), CancellationToken::new(), Progress::new())
            .await
            .unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&prompts.socket_path()), 0o600);
        assert_eq!(mode(turn.config_file()), 0o600);
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(turn.config_file()).unwrap()).unwrap();
        let server = &config["mcpServers"]["telegate"];
        assert_eq!(server["args"][0], HELPER_SUBCOMMAND);
        assert_eq!(server["env"][TOKEN_ENV], turn.token.as_str());
        assert!(
            !turn.args().join(" ").contains(&turn.token),
            "never on a command line"
        );

        let stranger = wire::Request {
            token: "0".repeat(64),
            tool_name: "Bash".into(),
            input: json!({"command": "ls"}),
            tool_use_id: None,
        };
        assert!(matches!(
            ask(&prompts.socket_path(), &stranger).await,
            Decision::Deny { .. }
        ));
        assert!(
            rx.try_recv().is_none(),
            "a stranger's request shows no card"
        );

        let request = wire::Request {
            token: turn.token.clone(),
            ..stranger.clone()
        };
        let socket = prompts.socket_path();
        let asking = tokio::spawn(async move { ask(&socket, &request).await });
        let Some(crate::tools::ToolEvent::Approval { ticket, text, .. }) = rx.recv().await else {
            panic!("a card");
        };
        assert!(
            text.contains("Bash") && text.contains("\"command\": \"ls\""),
            "{text}"
        );
        gate.answer_ticket(&owner().session_key, &ticket, true)
            .unwrap();
        assert_eq!(
            asking.await.unwrap(),
            Decision::Allow {
                updated_input: json!({"command": "ls"})
            }
        );

        let file = turn.config_file().to_path_buf();
        let token = turn.token.clone();
        drop(turn);
        assert!(!file.exists());
        let late = wire::Request { token, ..stranger };
        assert!(matches!(
            ask(&prompts.socket_path(), &late).await,
            Decision::Deny { .. }
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
