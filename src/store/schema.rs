//! Versioned schema migrations.
//!
//! # Why this shape
//!
//! The database outlives any one build of telegate: a user upgrades the
//! binary and keeps their `telegate.db`. The schema therefore has to evolve
//! forward without losing anything, and an *older* binary must never write
//! into a database whose layout it does not understand (it could silently
//! drop columns it does not know about, or misread rows).
//!
//! * The schema version lives in SQLite's own header field
//!   (`PRAGMA user_version`), so it is atomic with the data: there is no
//!   separate version table that could disagree with the tables it
//!   describes.
//! * [`MIGRATIONS`] is an ordered, append-only list. Migration `n` (1-based)
//!   takes the database from version `n - 1` to version `n`.
//! * Each migration runs in its own `IMMEDIATE` transaction together with the
//!   `user_version` bump, so a crash or an error mid-migration leaves the
//!   database at the previous version, never half-migrated. `IMMEDIATE`
//!   also means two processes opening the same file cannot both migrate: the
//!   second waits, then re-reads the version inside its own transaction and
//!   finds nothing to do.
//! * A database whose version is higher than `MIGRATIONS.len()` was written
//!   by a newer telegate; opening it is refused with
//!   [`StoreError::TooNew`] instead of guessing.
//!
//! # How to add a migration
//!
//! 1. Write the SQL as a new `const` below (e.g. `const V2_LEDGER: &str =
//!    "CREATE TABLE inbox (...);"`). Several statements are fine; do not put
//!    `BEGIN`/`COMMIT` in it, the runner owns the transaction.
//! 2. Append one line to [`MIGRATIONS`]:
//!    `Migration::new("inbox/outbox ledger", V2_LEDGER),`
//!
//! That is all: [`SCHEMA_VERSION`] follows from the list length, and the
//! tests in this file check that every migration applies on a fresh database
//! and that reopening is a no-op.
//!
//! **Never edit or reorder a migration that has shipped**: databases in the
//! field have already applied it and will not run it again. Fix mistakes with
//! a new migration.

use rusqlite::{Connection, TransactionBehavior};

use super::{checks, StoreError};

/// One step of the schema history: the SQL that moves the database from the
/// previous version to this one.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// What the step is for; shown in logs when it is applied.
    pub description: &'static str,
    /// The SQL batch to run (one or more statements, no transaction control).
    pub sql: &'static str,
    /// A step SQL alone cannot say, run after `sql` in the same
    /// transaction.
    pub edit: Option<Edit>,
}

/// A migration step in Rust: what SQL alone cannot say.
pub type Edit = fn(&Connection) -> Result<(), StoreError>;

impl Migration {
    /// A migration step; `const` so the list below stays a plain constant.
    pub const fn new(description: &'static str, sql: &'static str) -> Self {
        Migration {
            description,
            sql,
            edit: None,
        }
    }

    /// A migration step done by `edit` (in the step's transaction).
    pub const fn edit(description: &'static str, edit: Edit) -> Self {
        Migration {
            description,
            sql: "",
            edit: Some(edit),
        }
    }
}

/// Version 4: the CLI agent's own session per telegate session (what the
/// next turn resumes) and the usage and cost it reported. Keyed by the
/// telegate session id, so a rotated session keeps its figures and /new
/// starts the agent afresh.
const V4_AGENT_SESSIONS: &str = "
CREATE TABLE agent_sessions (
    session_id          TEXT PRIMARY KEY,
    backend             TEXT NOT NULL,
    agent_session_id    TEXT,
    turns               INTEGER NOT NULL DEFAULT 0,
    input_tokens        INTEGER NOT NULL DEFAULT 0,
    cached_input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens       INTEGER NOT NULL DEFAULT 0,
    cost_usd            REAL NOT NULL DEFAULT 0,
    updated_at          INTEGER NOT NULL
) STRICT;
";

/// Version 5: files sent to chats, per answered message, so a
/// replayed turn never sends a file twice.
const V5_OUTBOX_FILES: &str = "
CREATE TABLE outbox_files (
    chat_id         INTEGER NOT NULL,
    answering_id    INTEGER NOT NULL,
    file_key        TEXT NOT NULL,
    sent_message_id INTEGER NOT NULL,
    sent_at         INTEGER NOT NULL,
    PRIMARY KEY (chat_id, answering_id, file_key)
);
";

/// Version 6: inline buttons and undone exchanges.
///
/// * `buttons`: one row per inline button shown, found by the short id its
///   `callback_data` carries. `row_id` groups the buttons shown together (a
///   press uses up the whole row: Approve and Deny of one prompt); `owner_*`
///   is the user whose session it acts on; `used_by` is the update id of the
///   press that used it, so a press replayed after a restart is recognised
///   as the same press, and any other press as a second one.
/// * `transcripts.undone_at`: set by /undo and /retry on the exchange they
///   take out of the history; the rows stay (the transcript keeps what was
///   said), marked, and are no longer given to the agent.
const V6_CONTROLS: &str = "
CREATE TABLE buttons (
    id          TEXT PRIMARY KEY NOT NULL,
    row_id      TEXT NOT NULL,
    chat_id     INTEGER NOT NULL,
    chat_type   TEXT NOT NULL,
    thread_id   INTEGER,
    owner_id    INTEGER,
    owner_name  TEXT,
    action      TEXT NOT NULL CHECK (json_valid(action)),
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    used_by     INTEGER,
    used_at     INTEGER
) STRICT;
CREATE INDEX buttons_by_row ON buttons (row_id);
CREATE INDEX buttons_by_expiry ON buttons (expires_at);
ALTER TABLE transcripts ADD COLUMN undone_at INTEGER;
";

/// Version 7: the intent to send an answer.
///
/// `outbox.sending_at` is set, durably, just before an answer's first
/// `sendMessage` and cleared when the answer's message ids are recorded.
/// A row still carrying it after a restart is an ambiguous send: the
/// answer may or may not have reached the chat, and it is never sent again
/// (Telegram has no idempotent send). Edits of a preview need no intent.
const V7_SEND_INTENTS: &str = "
ALTER TABLE outbox ADD COLUMN sending_at INTEGER;
";

/// Version 8: what makes a restart safe.
///
/// * `reserved_ids`: the highest turn generation a process may have handed
///   out (`name = 'generation'`), reserved in blocks ahead of use, so the
///   next process starts above it: a Stop button or a draft from before a
///   restart never names a turn of the new process.
/// * `child_groups`: every process group telegate started and that may
///   still run (the command backend's program, terminal commands), with
///   what identifies its leader beyond the reusable id: start time in
///   clock ticks since boot, session and boot id. The next start kills the
///   groups that are verifiably still the ones recorded, before recovery
///   runs anything again.
const V8_RESTART_SAFETY: &str = "
CREATE TABLE reserved_ids (
    name TEXT PRIMARY KEY NOT NULL,
    upto INTEGER NOT NULL
) STRICT;
CREATE TABLE child_groups (
    pgid         INTEGER PRIMARY KEY,
    leader_start INTEGER NOT NULL,
    session_id   INTEGER NOT NULL,
    boot_id      TEXT NOT NULL,
    what         TEXT NOT NULL,
    recorded_at  INTEGER NOT NULL
) STRICT;
";

/// Version 9: scheduled jobs (`src/store/jobs.rs`).
///
/// * `jobs`: one row per job; `id` is `AUTOINCREMENT`, so an id a user saw
///   (and may type or press) is never given to another job, even after a
///   delete. `next_run` (unix ms) is set exactly while the job is active:
///   the scheduler's one "what is due next" query reads the partial index
///   `jobs_due`. `last_fired` is the newest instant journaled, advanced in
///   the same transaction that writes the run's inbox row.
/// * `chat_timezones`: a chat's `/timezone`.
const V9_JOBS: &str = "
CREATE TABLE jobs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id      INTEGER NOT NULL,
    chat_type    TEXT NOT NULL,
    thread_id    INTEGER,
    session_key  TEXT NOT NULL,
    creator_id   INTEGER,
    creator_name TEXT,
    schedule     TEXT NOT NULL CHECK (json_valid(schedule)),
    label        TEXT NOT NULL,
    timezone     TEXT NOT NULL,
    action       TEXT NOT NULL CHECK (json_valid(action)),
    state        TEXT NOT NULL CHECK (state IN ('active', 'paused', 'done')),
    next_run     INTEGER,
    last_fired   INTEGER,
    failures     INTEGER NOT NULL DEFAULT 0,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    CHECK ((state = 'active') = (next_run IS NOT NULL))
) STRICT;
CREATE INDEX jobs_due ON jobs (next_run) WHERE state = 'active';
CREATE INDEX jobs_by_chat ON jobs (chat_id, id);
CREATE TABLE chat_timezones (
    chat_id    INTEGER PRIMARY KEY,
    timezone   TEXT NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;
";

/// Version 11: teams (pairing, roles, invites, usage, voice replies).
///
/// * `members`: who may use the bot besides the config's allowlist, with
///   their role; at most one owner (a unique partial index, so two
///   pairings can never both make an owner).
/// * `access_codes`: pairing codes and invites, by the SHA-256 of the code
///   (the code itself is shown once and never stored), single use
///   (`used_by`), expiring.
/// * `access_attempts`: wrong codes tried, per user and time, so the
///   guessing limits survive a restart.
/// * `usage_turns`: one row per turn a user started (for turns per hour),
///   with the tokens and cost the backend reported.
/// * `user_settings`: per user preferences (`/voice`).
const V11_TEAMS: &str = "
CREATE TABLE members (
    user_id   INTEGER PRIMARY KEY,
    role      TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'user')),
    name      TEXT,
    added_by  INTEGER,
    added_at  INTEGER NOT NULL,
    via       TEXT NOT NULL CHECK (via IN ('pairing', 'invite'))
) STRICT;
CREATE UNIQUE INDEX members_one_owner ON members (role) WHERE role = 'owner';
CREATE TABLE access_codes (
    code_hash  TEXT PRIMARY KEY NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('pairing', 'invite')),
    role       TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'user')),
    created_by INTEGER,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    used_by    INTEGER,
    used_at    INTEGER
) STRICT;
CREATE TABLE access_attempts (
    id      INTEGER PRIMARY KEY,
    user_id INTEGER NOT NULL,
    at      INTEGER NOT NULL
) STRICT;
CREATE INDEX access_attempts_by_user ON access_attempts (user_id, at);
CREATE INDEX access_attempts_by_time ON access_attempts (at);
CREATE TABLE usage_turns (
    id                  INTEGER PRIMARY KEY,
    user_id             INTEGER NOT NULL,
    chat_id             INTEGER NOT NULL,
    session_id          TEXT NOT NULL,
    at                  INTEGER NOT NULL,
    input_tokens        INTEGER NOT NULL DEFAULT 0,
    cached_input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens       INTEGER NOT NULL DEFAULT 0,
    cost_usd            REAL NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX usage_turns_by_user ON usage_turns (user_id, at);
CREATE TABLE user_settings (
    user_id INTEGER PRIMARY KEY,
    voice   TEXT NOT NULL DEFAULT 'off' CHECK (voice IN ('on', 'off', 'auto'))
) STRICT;
";

/// Version 12: approval decisions: how every request of the approval gate ended
/// (`tools::approval_gate`): which option who chose and when, or why
/// nobody did (`timed_out`, `stopped`, `superseded`). Kept for the
/// operator; nothing reads it back to decide. `approval_prompts`: the
/// message that shows a request (its last part, which carries the
/// buttons), so an answer typed or a timeout can edit it too.
const V12_APPROVAL_DECISIONS: &str = "
CREATE TABLE approval_decisions (
    id              INTEGER PRIMARY KEY,
    ticket          TEXT NOT NULL,
    session_key     TEXT NOT NULL,
    chat_id         INTEGER NOT NULL,
    subject         TEXT NOT NULL,
    outcome         TEXT NOT NULL,
    option_id       TEXT,
    option_label    TEXT,
    option_kind     TEXT,
    decided_by      INTEGER,
    decided_by_name TEXT,
    asked_at        INTEGER NOT NULL,
    decided_at      INTEGER NOT NULL
) STRICT;
CREATE INDEX approval_decisions_by_slot ON approval_decisions (session_key, id);
CREATE TABLE approval_prompts (
    ticket     TEXT PRIMARY KEY NOT NULL,
    chat_id    INTEGER NOT NULL,
    thread_id  INTEGER,
    message_id INTEGER NOT NULL,
    text       TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;
";

/// Version 3: background processes that are running, with the chat that
/// started them. Processes do not survive a restart of telegate; a row still
/// here at start means its owner was never told how the job ended, so the
/// start tells them.
const V3_PROCESSES: &str = "
CREATE TABLE background_processes (
    process_id  TEXT PRIMARY KEY,
    chat_id     INTEGER NOT NULL,
    thread_id   INTEGER,
    command     TEXT NOT NULL,
    started_at  INTEGER NOT NULL
) STRICT;
";

/// Version 2: the crash-safety ledger.
///
/// * `inbox` has one row per Telegram update (unique `update_id`, so a
///   redelivered update is recognised), written *before* the update is
///   confirmed to Telegram, with its state `received → running → answered |
///   failed | dropped` and the raw update to replay after a restart.
/// * `outbox` records, per answered user message (chat + message id), the
///   Telegram message ids of its reply: `streaming` while a preview exists,
///   `delivered` once the final text went out, so a restart never sends a
///   final reply twice and finishes a half-streamed one by editing it.
const V2_LEDGER: &str = "
CREATE TABLE inbox (
    update_id   INTEGER PRIMARY KEY,
    chat_id     INTEGER NOT NULL,
    message_id  INTEGER,
    payload     TEXT NOT NULL CHECK (json_valid(payload)),
    state       TEXT NOT NULL
                CHECK (state IN ('received', 'running', 'answered', 'failed', 'dropped')),
    reason      TEXT,
    received_at INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
) STRICT;
CREATE INDEX inbox_by_message ON inbox (chat_id, message_id);
CREATE INDEX inbox_open ON inbox (state) WHERE state IN ('received', 'running');

CREATE TABLE outbox (
    chat_id     INTEGER NOT NULL,
    message_id  INTEGER NOT NULL,
    reply_ids   TEXT NOT NULL CHECK (json_valid(reply_ids)),
    state       TEXT NOT NULL CHECK (state IN ('streaming', 'delivered')),
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (chat_id, message_id)
) STRICT;
";

/// Version 1: sessions, their history, and transcripts.
///
/// * `session_history` holds every session id ever issued, current or
///   rotated, so a session id always resolves to the chat key that owned it
///   and ids are never reused (primary key). `last_active_at` and
///   `overrides` there are the values frozen at rotation; for the current
///   session the live values are in `sessions`.
/// * `sessions` is one row per chat key: the current session and its
///   per-session settings (`overrides`, a JSON object).
/// * `transcripts` deliberately has no foreign key to the session tables: a
///   message must be recorded even if something upstream got the session
///   bookkeeping wrong; losing a message is worse than an orphan row.
///
/// Tables are `STRICT` so a wrongly typed value is an error at insert time
/// rather than a surprise at read time.
const V1_SESSIONS: &str = "
CREATE TABLE session_history (
    session_id     TEXT PRIMARY KEY NOT NULL,
    session_key    TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    last_active_at INTEGER NOT NULL,
    rotated_at     INTEGER,
    overrides      TEXT CHECK (overrides IS NULL OR json_valid(overrides))
) STRICT;
CREATE INDEX session_history_by_key ON session_history (session_key, created_at);

CREATE TABLE sessions (
    session_key    TEXT PRIMARY KEY NOT NULL,
    session_id     TEXT NOT NULL UNIQUE REFERENCES session_history (session_id),
    created_at     INTEGER NOT NULL,
    last_active_at INTEGER NOT NULL,
    overrides      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(overrides))
) STRICT;

CREATE TABLE transcripts (
    id           INTEGER PRIMARY KEY,
    session_id   TEXT NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    content      TEXT NOT NULL,
    tool_calls   TEXT CHECK (tool_calls IS NULL OR json_valid(tool_calls)),
    tool_call_id TEXT,
    name         TEXT,
    interrupted  INTEGER NOT NULL DEFAULT 0 CHECK (interrupted IN (0, 1)),
    created_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX transcripts_by_session ON transcripts (session_id, id);
";

/// Version 10: the usage a CLI agent's thread last reported, for agents
/// whose usage after a resume counts the whole thread (Codex: 2,000 →
/// 3,000 → 4,000 input tokens over three turns). A turn's own usage is the
/// difference to the thread's previous report.
const V10_THREAD_USAGE: &str = "
CREATE TABLE agent_thread_usage (
    thread_id           TEXT PRIMARY KEY,
    backend             TEXT NOT NULL,
    input_tokens        INTEGER NOT NULL,
    cached_input_tokens INTEGER NOT NULL,
    output_tokens       INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL
) STRICT;
";

/// Version 13: the forum topic `createForumTopic` made for a message
/// (`thread_id` NULL while its answer is not recorded), so a message
/// replayed after a crash runs in its topic instead of making a second.
const V13_TOPIC_CREATIONS: &str = "
CREATE TABLE topic_creations (
    chat_id    INTEGER NOT NULL,
    message_id INTEGER NOT NULL,
    thread_id  INTEGER,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (chat_id, message_id)
) STRICT;
";

/// Version 14: every row carries its bot (`bot_id`, `getMe`'s id), so
/// several bots share one store: two bots in one group have the same chat
/// and message ids, and a private chat's id is the user's with any bot.
///
/// * Tables keyed by something not unique across bots are rebuilt with the
///   bot first in their key and no default, so a write that forgets its
///   bot fails: Telegram's ids (an update, a chat's message, a chat, a
///   user), and ids telegate makes unique only within one bot or one
///   process (background process ids are a counter, approval tickets six
///   hex digits, process group ids the OS's, an agent's thread id, a code's
///   hash), and the agent's session per telegate session (upserted: a
///   conflict must never update another bot's row).
/// * The rest are keyed by ids unique everywhere (session UUIDs, button
///   ids, job ids, row ids); they gain the column (default 0) and their
///   indexes lead with it where a bot lists its own.
/// * `reserved_ids` stays global: generations are unique across bots.
/// * `store_meta`: facts about the database itself; the adoption below is
///   remembered there.
///
/// Rows already there get 0 ([`crate::vocab::BotId::UNCLAIMED`]); the
/// first configured bot adopts them at start
/// ([`super::Store::adopt_unclaimed_rows`]).
const V14_BOT_IDS: &str = "
CREATE TABLE store_meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
) STRICT;

CREATE TABLE inbox_v14 (
    bot_id      INTEGER NOT NULL,
    update_id   INTEGER NOT NULL,
    chat_id     INTEGER NOT NULL,
    message_id  INTEGER,
    payload     TEXT NOT NULL CHECK (json_valid(payload)),
    state       TEXT NOT NULL
                CHECK (state IN ('received', 'running', 'answered', 'failed', 'dropped')),
    reason      TEXT,
    received_at INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (bot_id, update_id)
) STRICT;
INSERT INTO inbox_v14
    SELECT 0, update_id, chat_id, message_id, payload, state, reason, received_at, updated_at
    FROM inbox;
DROP TABLE inbox;
ALTER TABLE inbox_v14 RENAME TO inbox;
CREATE INDEX inbox_by_message ON inbox (bot_id, chat_id, message_id);
CREATE INDEX inbox_open ON inbox (bot_id, state) WHERE state IN ('received', 'running');

CREATE TABLE outbox_v14 (
    bot_id      INTEGER NOT NULL,
    chat_id     INTEGER NOT NULL,
    message_id  INTEGER NOT NULL,
    reply_ids   TEXT NOT NULL CHECK (json_valid(reply_ids)),
    state       TEXT NOT NULL CHECK (state IN ('streaming', 'delivered')),
    updated_at  INTEGER NOT NULL,
    sending_at  INTEGER,
    PRIMARY KEY (bot_id, chat_id, message_id)
) STRICT;
INSERT INTO outbox_v14
    SELECT 0, chat_id, message_id, reply_ids, state, updated_at, sending_at FROM outbox;
DROP TABLE outbox;
ALTER TABLE outbox_v14 RENAME TO outbox;

CREATE TABLE sessions_v14 (
    bot_id         INTEGER NOT NULL,
    session_key    TEXT NOT NULL,
    session_id     TEXT NOT NULL UNIQUE REFERENCES session_history (session_id),
    created_at     INTEGER NOT NULL,
    last_active_at INTEGER NOT NULL,
    overrides      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(overrides)),
    PRIMARY KEY (bot_id, session_key)
) STRICT;
INSERT INTO sessions_v14
    SELECT 0, session_key, session_id, created_at, last_active_at, overrides FROM sessions;
DROP TABLE sessions;
ALTER TABLE sessions_v14 RENAME TO sessions;
ALTER TABLE session_history ADD COLUMN bot_id INTEGER NOT NULL DEFAULT 0;
DROP INDEX session_history_by_key;
CREATE INDEX session_history_by_key ON session_history (bot_id, session_key, created_at);

CREATE TABLE outbox_files_v14 (
    bot_id          INTEGER NOT NULL,
    chat_id         INTEGER NOT NULL,
    answering_id    INTEGER NOT NULL,
    file_key        TEXT NOT NULL,
    sent_message_id INTEGER NOT NULL,
    sent_at         INTEGER NOT NULL,
    PRIMARY KEY (bot_id, chat_id, answering_id, file_key)
) STRICT;
INSERT INTO outbox_files_v14
    SELECT 0, chat_id, answering_id, file_key, sent_message_id, sent_at FROM outbox_files;
DROP TABLE outbox_files;
ALTER TABLE outbox_files_v14 RENAME TO outbox_files;

CREATE TABLE chat_timezones_v14 (
    bot_id     INTEGER NOT NULL,
    chat_id    INTEGER NOT NULL,
    timezone   TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (bot_id, chat_id)
) STRICT;
INSERT INTO chat_timezones_v14 SELECT 0, chat_id, timezone, updated_at FROM chat_timezones;
DROP TABLE chat_timezones;
ALTER TABLE chat_timezones_v14 RENAME TO chat_timezones;

CREATE TABLE members_v14 (
    bot_id    INTEGER NOT NULL,
    user_id   INTEGER NOT NULL,
    role      TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'user')),
    name      TEXT,
    added_by  INTEGER,
    added_at  INTEGER NOT NULL,
    via       TEXT NOT NULL CHECK (via IN ('pairing', 'invite')),
    PRIMARY KEY (bot_id, user_id)
) STRICT;
INSERT INTO members_v14 SELECT 0, user_id, role, name, added_by, added_at, via FROM members;
DROP TABLE members;
ALTER TABLE members_v14 RENAME TO members;
CREATE UNIQUE INDEX members_one_owner ON members (bot_id, role) WHERE role = 'owner';

CREATE TABLE user_settings_v14 (
    bot_id  INTEGER NOT NULL,
    user_id INTEGER NOT NULL,
    voice   TEXT NOT NULL DEFAULT 'off' CHECK (voice IN ('on', 'off', 'auto')),
    PRIMARY KEY (bot_id, user_id)
) STRICT;
INSERT INTO user_settings_v14 SELECT 0, user_id, voice FROM user_settings;
DROP TABLE user_settings;
ALTER TABLE user_settings_v14 RENAME TO user_settings;

CREATE TABLE topic_creations_v14 (
    bot_id     INTEGER NOT NULL,
    chat_id    INTEGER NOT NULL,
    message_id INTEGER NOT NULL,
    thread_id  INTEGER,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (bot_id, chat_id, message_id)
) STRICT;
INSERT INTO topic_creations_v14 SELECT 0, chat_id, message_id, thread_id, created_at
    FROM topic_creations;
DROP TABLE topic_creations;
ALTER TABLE topic_creations_v14 RENAME TO topic_creations;

CREATE TABLE background_processes_v14 (
    bot_id      INTEGER NOT NULL,
    process_id  TEXT NOT NULL,
    chat_id     INTEGER NOT NULL,
    thread_id   INTEGER,
    command     TEXT NOT NULL,
    started_at  INTEGER NOT NULL,
    PRIMARY KEY (bot_id, process_id)
) STRICT;
INSERT INTO background_processes_v14
    SELECT 0, process_id, chat_id, thread_id, command, started_at FROM background_processes;
DROP TABLE background_processes;
ALTER TABLE background_processes_v14 RENAME TO background_processes;

CREATE TABLE child_groups_v14 (
    bot_id       INTEGER NOT NULL,
    pgid         INTEGER NOT NULL,
    leader_start INTEGER NOT NULL,
    session_id   INTEGER NOT NULL,
    boot_id      TEXT NOT NULL,
    what         TEXT NOT NULL,
    recorded_at  INTEGER NOT NULL,
    PRIMARY KEY (bot_id, pgid)
) STRICT;
INSERT INTO child_groups_v14
    SELECT 0, pgid, leader_start, session_id, boot_id, what, recorded_at FROM child_groups;
DROP TABLE child_groups;
ALTER TABLE child_groups_v14 RENAME TO child_groups;

CREATE TABLE agent_sessions_v14 (
    bot_id              INTEGER NOT NULL,
    session_id          TEXT NOT NULL,
    backend             TEXT NOT NULL,
    agent_session_id    TEXT,
    turns               INTEGER NOT NULL DEFAULT 0,
    input_tokens        INTEGER NOT NULL DEFAULT 0,
    cached_input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens       INTEGER NOT NULL DEFAULT 0,
    cost_usd            REAL NOT NULL DEFAULT 0,
    updated_at          INTEGER NOT NULL,
    PRIMARY KEY (bot_id, session_id)
) STRICT;
INSERT INTO agent_sessions_v14
    SELECT 0, session_id, backend, agent_session_id, turns, input_tokens, cached_input_tokens,
           output_tokens, cost_usd, updated_at
    FROM agent_sessions;
DROP TABLE agent_sessions;
ALTER TABLE agent_sessions_v14 RENAME TO agent_sessions;

CREATE TABLE agent_thread_usage_v14 (
    bot_id              INTEGER NOT NULL,
    thread_id           TEXT NOT NULL,
    backend             TEXT NOT NULL,
    input_tokens        INTEGER NOT NULL,
    cached_input_tokens INTEGER NOT NULL,
    output_tokens       INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    PRIMARY KEY (bot_id, thread_id)
) STRICT;
INSERT INTO agent_thread_usage_v14
    SELECT 0, thread_id, backend, input_tokens, cached_input_tokens, output_tokens, updated_at
    FROM agent_thread_usage;
DROP TABLE agent_thread_usage;
ALTER TABLE agent_thread_usage_v14 RENAME TO agent_thread_usage;

CREATE TABLE approval_prompts_v14 (
    bot_id     INTEGER NOT NULL,
    ticket     TEXT NOT NULL,
    chat_id    INTEGER NOT NULL,
    thread_id  INTEGER,
    message_id INTEGER NOT NULL,
    text       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (bot_id, ticket)
) STRICT;
INSERT INTO approval_prompts_v14
    SELECT 0, ticket, chat_id, thread_id, message_id, text, created_at FROM approval_prompts;
DROP TABLE approval_prompts;
ALTER TABLE approval_prompts_v14 RENAME TO approval_prompts;
ALTER TABLE approval_decisions ADD COLUMN bot_id INTEGER NOT NULL DEFAULT 0;
DROP INDEX approval_decisions_by_slot;
CREATE INDEX approval_decisions_by_slot ON approval_decisions (bot_id, session_key, id);

CREATE TABLE access_codes_v14 (
    bot_id     INTEGER NOT NULL,
    code_hash  TEXT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('pairing', 'invite')),
    role       TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'user')),
    created_by INTEGER,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    used_by    INTEGER,
    used_at    INTEGER,
    PRIMARY KEY (bot_id, code_hash)
) STRICT;
INSERT INTO access_codes_v14
    SELECT 0, code_hash, kind, role, created_by, created_at, expires_at, used_by, used_at
    FROM access_codes;
DROP TABLE access_codes;
ALTER TABLE access_codes_v14 RENAME TO access_codes;
ALTER TABLE access_attempts ADD COLUMN bot_id INTEGER NOT NULL DEFAULT 0;
DROP INDEX access_attempts_by_user;
CREATE INDEX access_attempts_by_user ON access_attempts (bot_id, user_id, at);

ALTER TABLE transcripts ADD COLUMN bot_id INTEGER NOT NULL DEFAULT 0;
ALTER TABLE buttons ADD COLUMN bot_id INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage_turns ADD COLUMN bot_id INTEGER NOT NULL DEFAULT 0;
DROP INDEX usage_turns_by_user;
CREATE INDEX usage_turns_by_user ON usage_turns (bot_id, user_id, at);
ALTER TABLE jobs ADD COLUMN bot_id INTEGER NOT NULL DEFAULT 0;
DROP INDEX jobs_due;
CREATE INDEX jobs_due ON jobs (bot_id, next_run) WHERE state = 'active';
DROP INDEX jobs_by_chat;
CREATE INDEX jobs_by_chat ON jobs (bot_id, chat_id, id);
";

/// Version 15: the bots that used this store, each under the name and
/// username it last started with (`bots::record_bot`), so `telegate pair
/// --bot NAME` finds a bot's id offline, without its token.
const V15_BOTS: &str = "
CREATE TABLE bots (
    bot_id     INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    username   TEXT NOT NULL,
    started_at INTEGER NOT NULL
) STRICT;
";

/// The schema history, oldest first. Append only; see the module docs.
pub const MIGRATIONS: &[Migration] = &[
    Migration::new("sessions and transcripts", V1_SESSIONS),
    Migration::new("inbox and outbox ledger", V2_LEDGER),
    Migration::new("running background processes", V3_PROCESSES),
    Migration::new("CLI agent sessions and usage", V4_AGENT_SESSIONS),
    Migration::new("outbox files", V5_OUTBOX_FILES),
    Migration::new("inline buttons and undone exchanges", V6_CONTROLS),
    Migration::new("outbox send intents", V7_SEND_INTENTS),
    Migration::new(
        "restart safety: reserved generations, child groups",
        V8_RESTART_SAFETY,
    ),
    Migration::new("scheduled jobs", V9_JOBS),
    Migration::new("cumulative thread usage of CLI agents", V10_THREAD_USAGE),
    Migration::new(
        "teams: members, access codes, usage, user settings",
        V11_TEAMS,
    ),
    Migration::new("approval decisions and prompts", V12_APPROVAL_DECISIONS),
    Migration::new("forum topics made for messages", V13_TOPIC_CREATIONS),
    Migration::new("the bot of every row", V14_BOT_IDS),
    Migration::new("the bots of this store", V15_BOTS),
    Migration::edit(
        "state and role checks without a temporary table",
        checks::rewrite_list_checks,
    ),
    // Append new migrations here, one line each; never edit the ones above.
];

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Reads the schema version recorded in the database header.
pub fn schema_version(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn.pragma_query_value(None, "user_version", |row| row.get(0))?)
}

/// Brings the database up to [`SCHEMA_VERSION`].
///
/// Returns how many migrations were applied (0 when already current).
/// Fails with [`StoreError::TooNew`] if the database is newer than this
/// build.
pub fn migrate(conn: &mut Connection) -> Result<usize, StoreError> {
    apply(conn, MIGRATIONS)
}

/// Applies the pending steps of `migrations`, one transaction per step.
///
/// Split from [`migrate`] so tests can run it against made-up histories
/// (for example one with a failing step).
pub(super) fn apply(conn: &mut Connection, migrations: &[Migration]) -> Result<usize, StoreError> {
    let supported = i64::try_from(migrations.len()).unwrap_or(i64::MAX);
    let mut applied = 0;
    loop {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Read inside the transaction: another process may have migrated
        // while we waited for the write lock.
        let found = schema_version(&tx)?;
        if found < 0 || found > supported {
            return Err(StoreError::TooNew { found, supported });
        }
        let Some(step) = usize::try_from(found).ok().and_then(|i| migrations.get(i)) else {
            return Ok(applied);
        };
        let target = found + 1;
        tracing::info!(
            version = target,
            description = step.description,
            "applying store migration"
        );
        tx.execute_batch(step.sql)?;
        if let Some(edit) = step.edit {
            edit(&tx)?;
        }
        tx.pragma_update(None, "user_version", target)?;
        tx.commit()?;
        applied += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_names(conn: &Connection) -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    #[test]
    fn fresh_database_gets_every_migration() {
        let mut conn = Connection::open_in_memory().unwrap();
        assert_eq!(schema_version(&conn).unwrap(), 0);
        assert_eq!(migrate(&mut conn).unwrap(), MIGRATIONS.len());
        assert_eq!(schema_version(&conn).unwrap(), SCHEMA_VERSION);
        let tables = table_names(&conn);
        for t in ["session_history", "sessions", "transcripts"] {
            assert!(
                tables.iter().any(|n| n == t),
                "missing table {t}: {tables:?}"
            );
        }
    }

    /// `(table, column)` of every unique index on a fresh database.
    fn unique_keys(conn: &Connection) -> Vec<(String, Vec<String>)> {
        let mut stmt = conn
            .prepare(
                "SELECT m.name, i.name FROM sqlite_schema m, pragma_index_list(m.name) i
                 WHERE m.type = 'table' AND i.\"unique\" = 1 ORDER BY m.name, i.name",
            )
            .unwrap();
        let indexes: Vec<(String, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        indexes
            .into_iter()
            .map(|(table, index)| {
                let mut stmt = conn
                    .prepare("SELECT name FROM pragma_index_info(?1) ORDER BY seqno")
                    .unwrap();
                let columns = stmt
                    .query_map([&index], |r| r.get(0))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect();
                (table, columns)
            })
            .collect()
    }

    #[test]
    fn every_table_but_the_global_ones_carries_a_bot_id() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let global = ["reserved_ids", "sqlite_sequence", "store_meta"];
        for table in table_names(&conn) {
            let has: i64 = conn
                .query_row(
                    "SELECT count(*) FROM pragma_table_info(?1) WHERE name = 'bot_id'",
                    [&table],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(has == 1, !global.contains(&table.as_str()), "{table}");
        }
    }

    #[test]
    fn only_ids_unique_everywhere_are_unique_without_the_bot() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        // Session UUIDs and button ids are random; the rest are global by
        // design (reserved_ids, store_meta).
        let global = [
            ("buttons", "id"),
            ("reserved_ids", "name"),
            ("session_history", "session_id"),
            ("sessions", "session_id"),
            ("store_meta", "name"),
        ];
        for (table, columns) in unique_keys(&conn) {
            if columns.first().map(String::as_str) == Some("bot_id") {
                continue;
            }
            let key = (table.as_str(), columns.join(","));
            assert!(
                global.iter().any(|(t, c)| (*t, c.to_string()) == key),
                "{table} ({}) is unique without its bot",
                columns.join(", ")
            );
        }
        let fk: i64 = conn
            .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(fk, 0);
    }

    #[test]
    fn migrating_twice_is_a_no_op() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let before = table_names(&conn);
        assert_eq!(migrate(&mut conn).unwrap(), 0);
        assert_eq!(schema_version(&conn).unwrap(), SCHEMA_VERSION);
        assert_eq!(table_names(&conn), before);
    }

    #[test]
    fn newer_database_is_refused_untouched() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let err = migrate(&mut conn).unwrap_err();
        assert!(
            matches!(err, StoreError::TooNew { found, supported }
                if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
            "{err:?}"
        );
        assert!(table_names(&conn).is_empty());
        assert!(err.to_string().contains("newer"), "{err}");
    }

    #[test]
    fn failed_step_leaves_the_previous_version_intact() {
        const STEPS: &[Migration] = &[
            Migration::new("one", "CREATE TABLE a (x INTEGER);"),
            Migration::new("two", "CREATE TABLE b (x INTEGER); THIS IS NOT SQL;"),
        ];
        let mut conn = Connection::open_in_memory().unwrap();
        assert!(apply(&mut conn, STEPS).is_err());
        assert_eq!(schema_version(&conn).unwrap(), 1);
        // Step two's first statement was rolled back with the rest of it.
        assert_eq!(table_names(&conn), vec!["a".to_string()]);
    }

    #[test]
    fn later_migrations_apply_on_top_of_earlier_ones() {
        const V1: &[Migration] = &[Migration::new("one", "CREATE TABLE a (x INTEGER);")];
        const V2: &[Migration] = &[
            Migration::new("one", "CREATE TABLE a (x INTEGER);"),
            Migration::new("two", "ALTER TABLE a ADD COLUMN y TEXT;"),
        ];
        let mut conn = Connection::open_in_memory().unwrap();
        assert_eq!(apply(&mut conn, V1).unwrap(), 1);
        conn.execute("INSERT INTO a (x) VALUES (7)", []).unwrap();
        assert_eq!(apply(&mut conn, V2).unwrap(), 1);
        let (x, y): (i64, Option<String>) = conn
            .query_row("SELECT x, y FROM a", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        assert_eq!((x, y), (7, None));
    }
}
