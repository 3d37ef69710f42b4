//! The shared vocabulary: the words every layer speaks, at the bottom of
//! the stack so that no layer has to reach up for them.
//!
//! What a message is ([`MessageEvent`], its [`EventMedia`]) and where it
//! comes from ([`SessionSource`], [`SessionKey`]); whom a turn works for
//! ([`SessionId`], [`TurnGeneration`], [`TurnIdentity`]); a turn's
//! [`Progress`]; conversation messages ([`ChatMessage`], [`Role`]); the
//! commands ([`parse_command`], [`KnownCommand`]); inline [`Button`]s; the
//! inbox states; the names of the child environment; the reply texts more
//! than one layer says; the http(s) URL rule of every settings table.
//!
//! This module uses nothing else of the crate. It must never do I/O or
//! hold process state beyond the turn identity's task-local and the
//! generation counter.

mod bot;
mod button;
mod child_env;
mod command;
mod event;
mod identity;
mod inbox;
mod media;
mod message;
mod progress;
mod route;
mod session;
mod texts;
mod url;

pub use bot::BotId;
pub use button::{
    button_id, callback_data, new_button_id, Button, ButtonAction, JobButton, WorktreeButton,
};
pub use child_env::{ALWAYS_STRIPPED_ENV, CHAT_ID_ENV, SESSION_ID_ENV};
pub use command::{parse_command, Command, KnownCommand, COMMANDS};
pub use event::{MessageEvent, MessageKind, Origin};
pub use identity::{
    bind_turn_identity, current_identity, current_session_id, SessionId, TurnGeneration,
    TurnIdentity,
};
pub use inbox::InboxState;
pub use media::{Attachment, EventMedia, FileCandidate, MediaKind, MediaRef};
pub use message::{ChatMessage, Role};
pub use progress::{Progress, ProgressWatch, TurnEnd};
pub use route::{route, slot_in_topic, KeyPolicy, Route, RouteInput, Slot, TopicsMode};
pub use session::{ChatType, Platform, SessionKey, SessionSource};
pub use texts::RESET_HINT;
pub use url::check_http_url;
