//! The embedded SQLite store: telegate's durable memory.
//!
//! # What it owns
//!
//! * **Sessions** ([`sessions`]): which agent session each chat key is
//!   currently talking to, per-session settings (`overrides`, e.g. the
//!   model), and the history of every session id ever issued, so that after
//!   a rotation (`/new`) the old id still resolves to the key it belonged to
//!   and to when it was created and rotated.
//! * **Transcripts** ([`transcript`]): every message of every session in
//!   order, which is what the agent is replayed from after a restart.
//! * **Scheduled jobs** ([`jobs`]): jobs, the journal of their runs (one
//!   transaction moves a job on and writes its runs' inbox rows) and the
//!   chats' time zones.
//! * **Inbox and outbox** ([`inbox`]): every accepted update before it is
//!   confirmed to Telegram, its state as the message is handled, and every
//!   final reply's send intent and outcome, so a restart resumes what was
//!   unfinished and never sends an answer twice.
//! * **Buttons** ([`buttons`]): inline buttons kept server-side, claimed
//!   once per row, and pending approvals ([`approvals`]) with who decided.
//! * **Agents' own sessions** ([`agent_sessions`]): a CLI or ACP agent's
//!   session id per telegate session and its usage; generations reserved
//!   in blocks ([`generations`]) so ids stay unique across restarts.
//! * **Child process groups** ([`child_groups`]): every group telegate
//!   started, so the next start kills what a crash left running.
//! * **Team and budgets** ([`users`], [`usage`]): pairing, invites, roles,
//!   per-user usage.
//! * **Health and upkeep** (`write_health`, `integrity`,
//!   `retention`): write failures per kind, the start-up integrity check,
//!   pruning of old inbox rows.
//! * **The schema** ([`schema`]): versioned, forward-only migrations, and
//!   the one-off adoption of a pre-bot database's rows (`adoption`).
//!
//! # Several bots
//!
//! Every row carries its bot (`bot_id`, [`BotId`]) and every handle is
//! scoped to one: [`Store::for_bot`] gives the same store (one thread, one
//! connection) whose handles read and write only that bot's rows, so two
//! bots in one group never see each other's updates, sessions or team.
//! [`Store::open`] and its siblings give [`BotId::UNCLAIMED`] (0). Rows of
//! a database from before several bots are 0 until the first bot calls
//! [`Store::adopt_unclaimed_rows`] (`adoption`). Only the reserved turn
//! generations ([`generations`]) and the schema's own bookkeeping are
//! global.
//!
//! # How it runs, and why
//!
//! All SQLite work happens on **one dedicated OS thread** that owns the only
//! [`rusqlite::Connection`]. [`Store`] is a cheap, cloneable handle holding
//! the sending side of a bounded channel; every method packages its work as
//! a closure ([`Store::call`]), sends it to the thread and awaits a oneshot
//! reply. This gives us:
//!
//! * **The async runtime is never blocked.** SQLite calls block (disk I/O,
//!   fsync at checkpoints, busy waits); none of them run on a tokio worker.
//!   WAL checkpoints do not run on the store thread either: a thread of
//!   their own copies the WAL back (`checkpointer`), so no batch waits
//!   for a checkpoint's copy and fsync.
//! * **No lock is ever held across an `.await`.** There is no
//!   `Mutex<Connection>` to forget about; callers only hold a channel handle.
//! * **Writes are naturally serialised.** SQLite allows one writer at a time
//!   anyway; one connection means no `SQLITE_BUSY` between our own tasks and
//!   a prepared-statement cache that stays warm.
//! * **Backpressure.** The channel is bounded, so a flood of callers waits
//!   (asynchronously) instead of growing an unbounded queue.
//! * **Atomic calls.** Each call runs inside its own `SAVEPOINT`: if it
//!   returns an error (or panics) everything it wrote is rolled back, and
//!   only its own caller sees the error. If the calling future is cancelled
//!   after the job was sent, the job still runs to completion or not at all;
//!   it is never half applied. A call whose only change is one statement
//!   ([`Store::call_one_write`]: the turn's send intent, reply record and
//!   single transcript entries) skips the savepoint, whose page copies were
//!   a quarter of the store thread's time per turn: SQLite undoes a failed
//!   statement by itself. Should such a call fail after changing rows
//!   anyway, its batch is rolled back (never half a call kept). Deferred
//!   writes ([`carried`]) never take a savepoint, however many statements
//!   they run: one that fails after changing rows rolls its batch back,
//!   and the deferred writes before it in that batch run again in the next
//!   transaction, so only the failing one is lost.
//! * **Plans do not depend on bound values** (`SQLITE_DBCONFIG_ENABLE_QPSG`):
//!   otherwise SQLite re-parses a cached statement whose plan could depend
//!   on a parameter (the history query) every time it is bound again.
//!
//! A panic inside a job is caught on the store thread (which keeps serving
//! other callers; the job's writes are rolled back) and resumed in the
//! calling task, exactly as if the closure had run there.
//!
//! # Group commit
//!
//! One SQLite commit per call made every state change pay for a WAL append
//! of every page it touched (and, with `synchronous = "full"`, an fsync).
//! The store thread therefore **batches**: it takes the first queued job,
//! then every job already waiting behind it (at most [`batch::MAX_BATCH`]), and
//! runs them all in one `BEGIN IMMEDIATE … COMMIT`, each in its own
//! savepoint. There is no artificial delay: a lone call is committed at
//! once, and under load the calls that queued up while the previous commit
//! ran share the next one.
//!
//! **No caller hears about its call before the batch's `COMMIT` returned.**
//! A caller that got `Ok` from a writing call knows its rows are as durable
//! as the `synchronous` setting makes any commit (the polling loop relies on
//! this: it confirms an update to Telegram only after its inbox row is
//! written, which now means committed). If the commit fails, every call of
//! the batch gets an error, including those whose own work succeeded. If a
//! job ends the shared transaction itself (a `COMMIT`/`ROLLBACK` in its SQL,
//! or SQLite rolling back after `SQLITE_FULL`/`SQLITE_IOERR`), the calls
//! that ran before it in the batch get an error and the rest run in a new
//! transaction. Reads share the batch (they see the earlier calls' writes,
//! as they would one commit later). If the write lock cannot be taken for
//! a batch (another process holds it past the busy timeout), its jobs run
//! one by one, each committed alone, as before group commit.
//!
//! Jobs must not use transaction control (`BEGIN`, `COMMIT`,
//! [`Connection::transaction`]): it fails inside the batch's transaction.
//! Use [`Connection::savepoint`] for a multi-statement all-or-nothing step
//! (a call is all-or-nothing already). [`Store::stats`] counts calls,
//! commits and the thread's busy time (the pipeline benchmark prints them
//! per turn).
//!
//! # What it must never do
//!
//! * Never hold a lock or a connection across an `.await`.
//! * Never block a tokio worker thread with SQLite work. The one exception
//!   is the synchronous [`Store::open`], meant for startup before serving;
//!   use [`Store::open_async`] from inside the runtime.
//! * Never log message contents at info level or above: transcripts are
//!   users' private conversations. Logs carry keys, ids and counts only.

mod adoption;
pub mod agent_sessions;
pub mod approvals;
mod batch;
pub mod bots;
pub mod buttons;
mod carried;
mod checkpointer;
mod checks;
pub mod child_groups;
mod connection;
mod files;
pub mod generations;
pub mod inbox;
mod integrity;
mod job;
pub mod jobs;
pub mod resume;
mod retention;
pub mod schema;
pub mod sessions;
pub mod topic_creations;
pub mod transcript;
pub mod undo;
pub mod usage;
pub mod users;
mod write_health;

use std::fmt;
use std::panic;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use crate::vocab::BotId;

pub use agent_sessions::AgentUsage;
pub use approvals::{ApprovalPrompt, ApprovalRecord};
pub use batch::StoreStats;
pub use buttons::{NewButton, StoredButton};
pub use child_groups::{ChildGroup, ChildGroupChange};
pub use files::FileSend;
pub use inbox::{InboxEntry, NewUpdate, OutboxEntry, RunningProcess};
pub use integrity::marker_path;
pub use jobs::{JobFiring, JobOutcome, JobState, NewJob, NewRun, StoredJob};
pub use resume::{Conversation, Resumed};
pub use schema::SCHEMA_VERSION;
pub use sessions::{Overrides, SessionHistoryEntry, SessionRecord};
pub use topic_creations::TopicClaim;
pub use transcript::TranscriptEntry;
pub use undo::UndoneExchange;
pub use usage::TurnUsage;
pub use users::{Attempt, CodeKind, GuessLimits, Member, NewCode, Redeemed};
pub use write_health::{WriteHealth, WriteKind};

/// How long SQLite retries when another process holds the write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Prepared statements kept parsed (the store uses about 60 distinct ones).
const STATEMENT_CACHE: usize = 128;

/// How many jobs may wait for the store thread before senders wait too.
const QUEUE_CAPACITY: usize = 1024;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite reported an error (constraint violation, I/O, corruption...).
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The store thread has stopped ([`Store::close`] was called, or it
    /// could not start), so the request was not carried out.
    #[error("the store is closed")]
    Closed,
    /// The database was written by a newer telegate whose schema this build
    /// does not know; it is left untouched.
    #[error(
        "database schema version {found} is newer than this build supports \
         (up to {supported}); upgrade telegate or use another database file"
    )]
    TooNew {
        /// The version recorded in the database.
        found: i64,
        /// The newest version this build knows ([`SCHEMA_VERSION`]).
        supported: i64,
    },
    /// A filesystem error (creating the database directory, starting the
    /// store thread).
    #[error("store i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A JSON column (overrides, tool calls) could not be encoded or decoded.
    #[error("store json: {0}")]
    Serde(#[from] serde_json::Error),
    /// `PRAGMA quick_check` found damage (or SQLite says the file is not a
    /// database): the file is left untouched and the store does not open.
    #[error(
        "the database {} is damaged ({detail}). Stop telegate and keep a copy of the file; \
         then restore a backup, or try `sqlite3 {} .recover | sqlite3 recovered.db` and put \
         recovered.db in its place, or move the file away to start with an empty store",
        path.display(), path.display()
    )]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// What SQLite reported.
        detail: String,
    },
    /// The database is missing or 0 bytes long, but its marker says
    /// telegate created one there: refused instead of starting empty.
    #[error(
        "the database {} is {}, but {} says telegate created it earlier: it was probably \
         truncated or deleted by accident. Restore it from a backup; to really start with an \
         empty store, delete {} as well",
        path.display(),
        if *empty { "empty (0 bytes)" } else { "missing" },
        marker.display(),
        marker.display()
    )]
    Vanished {
        /// The database file.
        path: PathBuf,
        /// The marker written when it was created.
        marker: PathBuf,
        /// True for a 0-byte file, false for a missing one.
        empty: bool,
    },
    /// The operation needs a current session for this key and there is none.
    #[error("no session for key {key:?}")]
    NoSuchSession {
        /// The chat key that has no session.
        key: String,
    },
}

use batch::{Call, Counters, Msg};

/// Which database to open.
#[derive(Debug, Clone)]
enum Target {
    File(PathBuf, Synchronous),
    Memory,
}

/// `[store] synchronous`: when SQLite waits for the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// A committed write survives a crash of telegate (WAL with
    /// `synchronous=NORMAL`); a power loss or OS crash may lose the last
    /// commits, never the file.
    #[default]
    Normal,
    /// Also survives a power loss or OS crash (`synchronous=FULL`: every
    /// commit waits for the disk), at the cost of slower writes.
    Full,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// The store's owner: opens the database, runs migrations, reports stats
/// and write health, closes, and hands out the narrow handles below. Cheap
/// to clone (a channel sender inside); all clones talk to the same store
/// thread and connection. `Send + Sync`.
///
/// Only the layers that assemble telegate hold a `Store` (`wiring`,
/// `engine`, the Telegram transport's start): everything else keeps only
/// the handles of the tables it touches, so its imports say which they
/// are (`tests/it/tidy.rs` checks who names `Store`).
#[derive(Clone)]
pub struct Store {
    link: Link,
    counters: Arc<Counters>,
}

/// The sending side of the store thread's channel and the shared write
/// health: what every handle is made of.
#[derive(Clone)]
struct Link {
    tx: mpsc::Sender<Msg>,
    /// Deferred writes waiting for the next batch ([`carried`]).
    carried: Arc<carried::Carried>,
    write_health: WriteHealth,
    /// The bot whose rows this handle reads and writes (every table has a
    /// `bot_id` column; see [`Store::for_bot`]).
    bot: BotId,
}

/// Defines the narrow handles: each a cheap `Clone` newtype around the
/// store's channel, with its table group's methods in its own file and
/// the store's call primitives for them (visible inside `store` only).
macro_rules! handles {
    ($($(#[$doc:meta])* $name:ident => $getter:ident;)*) => {
        $(
            $(#[$doc])*
            #[derive(Clone)]
            pub struct $name {
                link: Link,
            }

            impl fmt::Debug for $name {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.debug_struct(stringify!($name))
                        .field("closed", &self.link.tx.is_closed())
                        .finish()
                }
            }

            #[allow(dead_code)]
            impl $name {
                /// The bot whose rows this handle touches, as stored.
                fn bot(&self) -> i64 {
                    self.link.bot.get()
                }

                async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
                where
                    R: Send + 'static,
                    F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
                {
                    self.link.call(f).await
                }

                async fn call_one_write<R, F>(&self, f: F) -> Result<R, StoreError>
                where
                    R: Send + 'static,
                    F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
                {
                    self.link.call_one_write(f).await
                }

                async fn write<R, F>(&self, kind: WriteKind, f: F) -> Result<R, StoreError>
                where
                    R: Send + 'static,
                    F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
                {
                    self.link.write(kind, f).await
                }

                async fn write_one<R, F>(&self, kind: WriteKind, f: F) -> Result<R, StoreError>
                where
                    R: Send + 'static,
                    F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
                {
                    self.link.write_one(kind, f).await
                }

                async fn write_with_writes<R, F>(
                    &self,
                    kind: WriteKind,
                    writes: usize,
                    f: F,
                ) -> Result<R, StoreError>
                where
                    R: Send + 'static,
                    F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
                {
                    self.link.write_with_writes(kind, writes, f).await
                }

                #[allow(dead_code)] // not every handle defers a write
                fn defer<F>(&self, kinds: &'static [WriteKind], failed: Arc<OnceLock<WriteKind>>, what: &'static str, f: F)
                where
                    F: Fn(&mut Connection) -> Result<(), StoreError> + Send + 'static,
                {
                    self.link.defer(kinds, failed, what, f)
                }
            }
        )*

        impl Store {
            $(
                #[doc = concat!("The [`", stringify!($name), "`] handle over this store's thread.")]
                pub fn $getter(&self) -> $name {
                    $name {
                        link: self.link.clone(),
                    }
                }
            )*
        }
    };
}

handles! {
    /// Sessions ([`sessions`], [`resume`]): the current session per chat
    /// key, overrides, the history of ids, resuming an earlier one.
    Sessions => sessions;
    /// Transcripts ([`transcript`], [`undo`]): every session's messages in
    /// order, the last exchange undone.
    Transcripts => transcripts;
    /// The inbox ([`inbox`]): Telegram's updates by update id and the
    /// state of each message; held by the Telegram transport only.
    Inbox => inbox;
    /// The outbox ([`inbox`]): each final reply's send intent, its
    /// messages and whether it was delivered.
    Outbox => outbox;
    /// The terminal tool's running processes ([`inbox`]), so a restart
    /// tells whom a lost process belonged to.
    Processes => processes;
    /// Inline buttons kept server-side ([`buttons`]), claimed once.
    Buttons => buttons;
    /// Pending approvals' prompts and who decided ([`approvals`]).
    Approvals => approvals;
    /// Scheduled jobs, their runs and the chats' time zones ([`jobs`]).
    Jobs => jobs;
    /// A CLI or ACP agent's own session id and usage per telegate session
    /// ([`agent_sessions`]).
    AgentSessions => agent_sessions;
    /// Turn generations reserved in blocks ([`generations`]).
    Generations => generations;
    /// Every child process group telegate started ([`child_groups`]).
    ChildGroups => child_groups;
    /// Files sent from a turn's outbox, so a restart sends none twice
    /// (`files`).
    FileSends => file_sends;
    /// The team: members, roles, pairing and invite codes ([`users`]).
    Users => users;
    /// Per-user turn usage and settings (voice) ([`usage`]).
    Usage => usage;
    /// Whether the store answers and its writes work ([`write_health`]):
    /// for /healthz and the systemd watchdog.
    StoreHealth => health;
    /// The forum topic made for each message ([`topic_creations`]).
    TopicCreations => topic_creations;
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("closed", &self.link.tx.is_closed())
            .finish()
    }
}

impl Store {
    /// Opens (creating if needed, with parent directories) the database at
    /// `path`, configures it and runs pending migrations. The directory is
    /// made 0700 and the database files 0600 whatever the umask, looser
    /// existing ones are tightened (see [`crate::private_fs`]).
    ///
    /// This blocks the calling thread until the database is ready; call it
    /// at startup or from `spawn_blocking`, or use [`Store::open_async`].
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Self::open_blocking(Target::File(path.to_path_buf(), Synchronous::default()))
    }

    /// Like [`Store::open`], but waits asynchronously: the file is opened
    /// and migrated on the store thread, not on the caller's.
    pub async fn open_async(path: impl Into<PathBuf>) -> Result<Store, StoreError> {
        Self::open_with(path, Synchronous::default()).await
    }

    /// Like [`Store::open_async`], with the given `synchronous` setting.
    pub async fn open_with(
        path: impl Into<PathBuf>,
        synchronous: Synchronous,
    ) -> Result<Store, StoreError> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let store = Self::spawn(Target::File(path.into(), synchronous), move |r| {
            let _ = ready_tx.send(r);
        })?;
        ready_rx.await.map_err(|_| StoreError::Closed)??;
        Ok(store)
    }

    /// A private, empty, fully migrated in-memory database (for tests). It
    /// disappears when the store closes.
    pub fn open_in_memory() -> Result<Store, StoreError> {
        Self::open_blocking(Target::Memory)
    }

    fn open_blocking(target: Target) -> Result<Store, StoreError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let store = Self::spawn(target, move |r| {
            let _ = ready_tx.send(r);
        })?;
        ready_rx.recv().map_err(|_| StoreError::Closed)??;
        Ok(store)
    }

    /// Starts the store thread; `ready` is told whether opening worked.
    fn spawn(
        target: Target,
        ready: impl FnOnce(Result<(), StoreError>) + Send + 'static,
    ) -> Result<Store, StoreError> {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let counters = Arc::new(Counters::default());
        let thread_counters = counters.clone();
        let carried = Arc::new(carried::Carried::default());
        let thread_carried = carried.clone();
        let to_itself = tx.downgrade();
        std::thread::Builder::new()
            .name("telegate-store".into())
            .spawn(move || match connection::open_connection(&target) {
                Ok(conn) => {
                    let checkpointer = connection::start_checkpointer(&conn, &target, to_itself);
                    ready(Ok(()));
                    connection::serve(conn, rx, &thread_carried, &thread_counters, checkpointer);
                }
                Err(e) => ready(Err(e)),
            })?;
        Ok(Store {
            link: Link {
                tx,
                carried,
                write_health: WriteHealth::default(),
                bot: BotId::UNCLAIMED,
            },
            counters,
        })
    }

    /// The same store (thread, connection, counters), its handles scoped
    /// to `bot`'s rows: what each of several bots in one process holds.
    pub fn for_bot(&self, bot: BotId) -> Store {
        let mut scoped = self.clone();
        scoped.link.bot = bot;
        scoped
    }

    /// The bot this store's handles are scoped to.
    pub fn bot(&self) -> BotId {
        self.link.bot
    }

    /// Whether writes work, as reported by the writers (see
    /// [`WriteHealth`]); shared by all clones.
    pub fn write_health(&self) -> &WriteHealth {
        &self.link.write_health
    }

    /// Calls run, transactions committed and time spent by the store
    /// thread since it started (shared by all clones). Cheap: three atomic
    /// loads.
    pub fn stats(&self) -> StoreStats {
        self.counters.snapshot()
    }

    /// Runs `f` on the store thread with exclusive use of the connection and
    /// returns its result: the raw access the handles are built on, for
    /// the owner's own queries (tests, checks the typed API does not
    /// cover). See [`Link::call`].
    pub async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        self.link.call(f).await
    }

    /// [`Store::call`] for work that changes the database with at most one
    /// statement (see [`Link::call_one_write`]).
    pub async fn call_one_write<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        self.link.call_one_write(f).await
    }

    /// Shuts the store down and waits until it is closed: jobs queued before
    /// this call complete, later ones (from other clones) fail with
    /// [`StoreError::Closed`], the WAL is checkpointed into the main file and
    /// the connection is closed.
    pub async fn close(self) -> Result<(), StoreError> {
        let (done_tx, done_rx) = oneshot::channel();
        self.link
            .tx
            .send(Msg::Shutdown(done_tx))
            .await
            .map_err(|_| StoreError::Closed)?;
        done_rx.await.map_err(|_| StoreError::Closed)?
    }
}

impl Link {
    /// Runs `f` on the store thread with exclusive use of the connection and
    /// returns its result.
    ///
    /// This is the building block of every method; use it for queries the
    /// typed API does not cover. Keep `f` short. It runs inside the
    /// store's shared transaction, in a savepoint of its own: if it returns
    /// an error or panics, all its writes are rolled back; if it succeeds,
    /// its writes commit with its batch, and the result is returned only
    /// after that commit (see "Group commit" in the module docs). `f` must
    /// not use transaction control (`BEGIN`/`COMMIT`,
    /// [`Connection::transaction`]); [`Connection::savepoint`] works. If
    /// `f` panics, the panic resumes in the caller.
    ///
    /// Fails with [`StoreError::Closed`] if the store thread is gone, and
    /// with the commit's error if its batch could not be committed.
    async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let (reply_tx, reply_rx) = oneshot::channel();
        self.submit(Box::new(Call::new(f, reply_tx)), reply_rx)
            .await
    }

    /// [`Link::call`] for work that changes the database with at most one
    /// statement, as its last fallible step (reads before it are fine).
    /// Such a call runs without a savepoint of its own, which is most of a
    /// small call's cost: a failed statement is undone by SQLite itself.
    /// Should the work fail after changing rows anyway, its whole batch is
    /// rolled back and reported as not saved, so no half call is kept.
    async fn call_one_write<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let (reply_tx, reply_rx) = oneshot::channel();
        self.submit(Box::new(Call::one_write(f, reply_tx)), reply_rx)
            .await
    }

    /// [`Link::call_one_write`] when the work changes the database with at
    /// most one statement (`writes <= 1`), else [`Link::call`].
    async fn call_with_writes<R, F>(&self, writes: usize, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        if writes <= 1 {
            self.call_one_write(f).await
        } else {
            self.call(f).await
        }
    }

    /// A write nobody waits for, carried by the store thread's next batch
    /// (see [`carried`]): reported to the write health under `kinds` (a
    /// failure under the kind the work set in `failed`, if it did) and
    /// logged as `what` if it fails. `f` may run more than once (it runs
    /// again when another job's failure rolls its batch back), so it reads
    /// what it writes from what it owns.
    fn defer<F>(
        &self,
        kinds: &'static [WriteKind],
        failed: Arc<OnceLock<WriteKind>>,
        what: &'static str,
        f: F,
    ) where
        F: Fn(&mut Connection) -> Result<(), StoreError> + Send + 'static,
    {
        let health = self.write_health.clone();
        let job = carried::Deferred::new(f, kinds, failed, what, health);
        if self.carried.push(Box::new(job)) {
            // A full queue has batches coming that carry the list.
            if let Err(mpsc::error::TrySendError::Closed(_)) = self.tx.try_send(Msg::Flush) {
                drop(self.carried.take(usize::MAX));
                tracing::error!(what, "could not record: the store is closed");
            }
        }
    }

    async fn submit<R>(
        &self,
        job: Box<dyn job::Job>,
        reply: oneshot::Receiver<batch::Outcome<R>>,
    ) -> Result<R, StoreError> {
        self.tx
            .send(Msg::Job(job))
            .await
            .map_err(|_| StoreError::Closed)?;
        match reply.await {
            Ok(Ok(result)) => result,
            Ok(Err(panic_payload)) => panic::resume_unwind(panic_payload),
            Err(_) => Err(StoreError::Closed),
        }
    }
}

/// Milliseconds since the Unix epoch, the unit of every timestamp column.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync_clone<T: Send + Sync + Clone + 'static>() {}

    #[test]
    fn store_is_send_sync_clone() {
        assert_send_sync_clone::<Store>();
    }

    #[tokio::test]
    async fn call_runs_on_the_store_thread() {
        let store = Store::open_in_memory().unwrap();
        let name = store
            .call(|_| Ok(std::thread::current().name().map(str::to_owned)))
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("telegate-store"));
    }

    #[tokio::test]
    async fn open_creates_parent_dirs_and_uses_wal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/telegate.db");
        let store = Store::open_async(&path).await.unwrap();
        assert!(path.exists());
        let (mode, fk, version): (String, i64, i64) = store
            .call(|c| {
                let mode = c.pragma_query_value(None, "journal_mode", |r| r.get(0))?;
                let fk = c.pragma_query_value(None, "foreign_keys", |r| r.get(0))?;
                Ok((mode, fk, schema::schema_version(c)?))
            })
            .await
            .unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(fk, 1);
        assert_eq!(version, SCHEMA_VERSION);
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn reopening_does_not_migrate_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        Store::open(&path).unwrap().close().await.unwrap();
        Store::open(&path).unwrap().close().await.unwrap();
        let mut conn = Connection::open(&path).unwrap();
        assert_eq!(schema::migrate(&mut conn).unwrap(), 0);
    }

    #[tokio::test]
    async fn newer_database_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "user_version", SCHEMA_VERSION + 5)
                .unwrap();
        }
        let err = Store::open(&path).unwrap_err();
        assert!(matches!(err, StoreError::TooNew { .. }), "{err:?}");
        let err = Store::open_async(&path).await.unwrap_err();
        assert!(matches!(err, StoreError::TooNew { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn close_rejects_later_calls_from_other_clones() {
        let store = Store::open_in_memory().unwrap();
        let other = store.clone();
        store.close().await.unwrap();
        let err = other.call(|_| Ok(())).await.unwrap_err();
        assert!(matches!(err, StoreError::Closed), "{err:?}");
        assert!(matches!(other.close().await, Err(StoreError::Closed)));
    }

    #[tokio::test]
    async fn jobs_queued_before_close_complete() {
        let store = Store::open_in_memory().unwrap();
        let pending: Vec<_> = (0..50)
            .map(|i| {
                let s = store.clone();
                tokio::spawn(async move { s.call(move |_| Ok(i)).await })
            })
            .collect();
        for (i, p) in pending.into_iter().enumerate() {
            assert_eq!(p.await.unwrap().unwrap(), i);
        }
        store.close().await.unwrap();
    }

    fn wal_path(db: &Path) -> PathBuf {
        let mut name = db.as_os_str().to_owned();
        name.push("-wal");
        PathBuf::from(name)
    }

    #[tokio::test]
    async fn close_checkpoints_and_removes_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("close.db");
        let store = Store::open(&path).unwrap();
        store
            .call(|c| Ok(c.execute_batch("CREATE TABLE x (a INTEGER); INSERT INTO x VALUES (1);")?))
            .await
            .unwrap();
        assert!(wal_path(&path).exists());
        store.close().await.unwrap();
        assert!(!wal_path(&path).exists());
    }

    #[tokio::test]
    async fn dropping_the_last_handle_stops_the_thread_cleanly() {
        thread_local! {
            // Dropped when the thread that set it exits.
            static EXIT_GUARD: std::cell::RefCell<Option<std::sync::mpsc::Sender<()>>> =
                const { std::cell::RefCell::new(None) };
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drop.db");
        let store = Store::open(&path).unwrap();
        let (guard_tx, guard_rx) = std::sync::mpsc::channel::<()>();
        store
            .call(move |_| {
                EXIT_GUARD.with(|g| *g.borrow_mut() = Some(guard_tx));
                Ok(())
            })
            .await
            .unwrap();
        let other = store.clone();
        drop(store);
        other.call(|_| Ok(())).await.unwrap();
        drop(other);
        let waited =
            tokio::task::spawn_blocking(move || guard_rx.recv_timeout(Duration::from_secs(30)))
                .await
                .unwrap();
        assert_eq!(waited, Err(std::sync::mpsc::RecvTimeoutError::Disconnected));
        assert!(!wal_path(&path).exists(), "thread exited without closing");
    }

    #[tokio::test]
    async fn a_panicking_job_reaches_the_caller_and_the_store_survives() {
        let store = Store::open_in_memory().unwrap();
        let s = store.clone();
        let joined = tokio::spawn(async move {
            s.call(|conn| -> Result<(), StoreError> {
                conn.execute("CREATE TABLE doomed_too (x INTEGER)", [])?;
                let tx = conn.savepoint()?;
                tx.execute("CREATE TABLE doomed (x INTEGER)", [])?;
                panic!("boom");
            })
            .await
        })
        .await;
        assert!(joined.unwrap_err().is_panic());
        // Its writes were rolled back and the thread still serves.
        let n: i64 = store
            .call(|c| {
                Ok(c.query_row(
                    "SELECT count(*) FROM sqlite_schema WHERE name LIKE 'doomed%'",
                    [],
                    |r| r.get(0),
                )?)
            })
            .await
            .unwrap();
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn a_call_with_transaction_control_fails_and_leaves_nothing() {
        let store = Store::open_in_memory().unwrap();
        let error = store
            .call(|c| {
                c.execute_batch("CREATE TABLE leaked (x INTEGER); BEGIN;")?;
                Ok(())
            })
            .await
            .unwrap_err();
        assert!(matches!(error, StoreError::Sqlite(_)), "{error:?}");
        let n: i64 = store
            .call(|c| {
                Ok(c.query_row(
                    "SELECT count(*) FROM sqlite_schema WHERE name = 'leaked'",
                    [],
                    |r| r.get(0),
                )?)
            })
            .await
            .unwrap();
        assert_eq!(n, 0);
    }

    #[test]
    fn errors_read_clearly() {
        let e = StoreError::TooNew {
            found: 9,
            supported: 1,
        };
        assert!(e.to_string().contains("version 9"));
        assert_eq!(StoreError::Closed.to_string(), "the store is closed");
        let e = StoreError::NoSuchSession {
            key: "chat:1".into(),
        };
        assert_eq!(e.to_string(), "no session for key \"chat:1\"");
    }
}
