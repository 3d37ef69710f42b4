//! The environment variables telegate sets for, or keeps from, every child
//! it starts (the command backend's program, terminal commands). Names
//! only: building an environment is `crate::tools::childenv`'s job.

/// Environment variables never passed to the program, whatever the config
/// says in `remove_env`.
pub const ALWAYS_STRIPPED_ENV: &[&str] =
    &["TELEGRAM_BOT_TOKEN", "TELOXIDE_TOKEN", "OPENAI_API_KEY"];

/// Set for the program: the conversation's session id.
pub const SESSION_ID_ENV: &str = "TELEGATE_SESSION_ID";
/// Set for the program: the chat id the message came from.
pub const CHAT_ID_ENV: &str = "TELEGATE_CHAT_ID";
