//! The runner's answers to the commands that need to know who sends them
//! and act on the team or on the user's own settings: /pair (from someone
//! who has access), /invite, /users, /role, /revoke, /usage, /voice, and
//! the conversation commands (/sessions, /resume, /title, see
//! `conversations.rs`).
//!
//! Like every command they are answered at once, never touching a running
//! turn; the rules and texts of the team commands live in
//! [`crate::access`]. Nothing here sends anything.

use super::voice;
use crate::adapter::DispatchContext;
use crate::reply::Reply;
use crate::runner::Runner;
use crate::vocab::{KnownCommand, MessageEvent};

use crate::access::commands::{self as team, TeamContext};

/// Said when the team commands are used where there is no team (the
/// console, a bot without a store).
pub(super) const NO_TEAMS_TEXT: &str =
    "Teams (invites, roles, usage) work with the Telegram bot and its store.";

/// The commands answered by [`Runner::team_command`].
pub(super) fn answers(known: KnownCommand) -> bool {
    matches!(
        known,
        KnownCommand::Pair
            | KnownCommand::Invite
            | KnownCommand::Users
            | KnownCommand::Role
            | KnownCommand::Revoke
            | KnownCommand::Usage
            | KnownCommand::Voice
            | KnownCommand::Sessions
            | KnownCommand::Resume
            | KnownCommand::Title
    )
}

impl Runner {
    /// Answer one of the commands [`answers`] names, sent in `event`.
    pub(super) async fn team_command(
        &self,
        known: KnownCommand,
        args: &str,
        event: &MessageEvent,
        ctx: &DispatchContext,
    ) -> Reply {
        match known {
            KnownCommand::Sessions => return self.sessions_command(&ctx.key, &event.source).await,
            KnownCommand::Resume => return self.resume_command(args, ctx).await,
            KnownCommand::Title => return self.title_command(&ctx.key, args).await,
            KnownCommand::Voice => return self.voice_command(&event.source, args).await,
            _ => {}
        }
        let Some(store) = self.store() else {
            return Reply::command(NO_TEAMS_TEXT);
        };
        let access = self.access();
        if access.is_none() && known != KnownCommand::Usage {
            return Reply::command(NO_TEAMS_TEXT);
        }
        let context = TeamContext {
            access,
            limits: &self.inner.config.limits,
            usage: &store.usage,
            jobs: &store.jobs,
            actor: &event.source,
            bot: event.bot_username.as_deref(),
        };
        Reply::command(match known {
            KnownCommand::Pair => team::already_paired(&context),
            KnownCommand::Invite => team::invite(&context, args).await,
            KnownCommand::Users => team::users(&context).await,
            KnownCommand::Role => team::role(&context, args).await,
            KnownCommand::Revoke => team::revoke(&context, args).await,
            _ => team::usage(&context, args).await,
        })
    }

    /// /voice [on|off|auto]: the sender's choice of voice answers.
    async fn voice_command(&self, source: &crate::vocab::SessionSource, args: &str) -> Reply {
        if self.inner.config.speech.is_none() {
            return Reply::command("Voice answers are not set up on this bot.");
        }
        let (Some(store), Some(user)) = (self.store(), source.user_id) else {
            return Reply::command("Voice answers need the bot's store.");
        };
        let Some(wanted) = args.split_whitespace().next() else {
            let current = store.usage.voice_setting(user).await.ok().flatten();
            let mode = voice::VoiceMode::parse(current.as_deref().unwrap_or("off"))
                .unwrap_or(voice::VoiceMode::Off);
            return Reply::command(format!(
                "Voice answers: {}. Change it with /voice on, /voice off or /voice auto \
                 (auto: a voice answer when you sent a voice message).",
                mode.as_str()
            ));
        };
        let Some(mode) = voice::VoiceMode::parse(wanted) else {
            return Reply::command("Send /voice on, /voice off or /voice auto.");
        };
        match store.usage.set_voice_setting(user, mode.as_str()).await {
            Ok(()) => Reply::command(match mode {
                voice::VoiceMode::On => "🔊 I will answer you with voice notes.",
                voice::VoiceMode::Off => "🔇 I will answer you in text.",
                voice::VoiceMode::Auto => {
                    "🔉 I will answer with a voice note when you send me one."
                }
            }),
            Err(error) => {
                tracing::error!(%error, "could not record a voice setting");
                Reply::command("⚠️ I could not save that setting; please try again later.")
            }
        }
    }
}
