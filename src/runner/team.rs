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
use super::InvalidateReason;
use crate::adapter::DispatchContext;
use crate::reply::{Outgoing, Reply};
use crate::runner::Runner;
use crate::tools::approval::Denial;
use crate::vocab::{KnownCommand, MessageEvent, SessionSource};

use crate::access::commands::{self as team, Ended, TeamContext};

/// Said when the team commands are used where there is no team (the
/// console, a bot without a store).
pub(super) const NO_TEAMS_TEXT: &str =
    "Teams (invites, roles, usage) work with the Telegram bot and its store.";

/// Said instead of running a message (or a scheduled run) whose user lost
/// access after it was accepted.
pub(super) const NO_LONGER_ALLOWED_TEXT: &str =
    "🔒 This was not run: you no longer have access to this bot.";

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
            KnownCommand::Revoke => match team::revoke(&context, args).await {
                Ok(target) => {
                    let text = team::revoked_text(target, &self.end_work_of(target).await);
                    self.tell_owner(&event.source, &text);
                    text
                }
                Err(refusal) => refusal,
            },
            _ => team::usage(&context, args).await,
        })
    }

    /// `user` lost access: nothing of theirs may go on. Their waiting
    /// messages are dropped (first, so a stopped turn hands its slot to
    /// none of them), their running turns stopped, the approvals their
    /// turns wait for refused. What is left that could start later checks
    /// access when it starts (`admit`).
    async fn end_work_of(&self, user: u64) -> Ended {
        let queued = self.adapter().map_or(0, |a| a.drop_queued_of(user));
        let keys = self.state().slots.started_by(user);
        for key in &keys {
            self.stop_running(key, InvalidateReason::Revoked);
            // No command reply goes to that chat: the stopped turn's
            // preview gets its marker at once.
            if let Some(gate) = self.state().reply_gates.remove(key) {
                gate.cancel();
            }
        }
        let approvals = self
            .approvals()
            .map_or(0, |gate| gate.deny_started_by(user, Denial::Stopped));
        tracing::info!(
            user,
            turns = keys.len(),
            approvals,
            queued,
            "a revoked user's work was ended"
        );
        let jobs = match self.jobs() {
            Some(jobs) => jobs.pause_jobs_of(user).await,
            None => Vec::new(),
        };
        Ended {
            turns: keys.len(),
            approvals,
            queued,
            jobs,
        }
    }

    /// Whether `event`'s sender may still use the bot in its chat, asked
    /// as each turn (and scheduled run) starts: a message queued, recovered
    /// or journaled while they had access does not run once it is gone.
    /// `Err`: the refusal, to the chat.
    pub(super) fn still_allowed(&self, event: &MessageEvent) -> Result<(), Outgoing> {
        let (Some(access), Some(user)) = (self.access(), event.source.user_id) else {
            return Ok(());
        };
        if access.may_use(user, event.source.chat_id) {
            return Ok(());
        }
        tracing::info!(
            user,
            chat_id = event.source.chat_id,
            internal = event.internal,
            "turn refused: its user no longer has access"
        );
        Err(Reply::notice(NO_LONGER_ALLOWED_TEXT)
            .in_reply_to(event.message_id)
            .into())
    }

    /// When someone other than the owner revoked a user, the owner is told
    /// too, in their private chat (from its own task: a notice never holds
    /// up the command).
    fn tell_owner(&self, actor: &SessionSource, text: &str) {
        let Some(owner) = self.access().and_then(crate::access::Access::owner) else {
            return;
        };
        if actor.user_id == Some(owner) {
            return;
        }
        let who = actor
            .user_name
            .clone()
            .unwrap_or_else(|| format!("user {}", actor.user_id.unwrap_or_default()));
        let mut to = SessionSource::dm(actor.platform, i64::try_from(owner).unwrap_or_default());
        to.user_id = Some(owner);
        let notice = Reply::notice(format!("{who} revoked access: {text}"));
        let outbound = self.inner.outbound.clone();
        tokio::spawn(async move {
            if let Err(error) = outbound.deliver(&to, notice).await {
                tracing::warn!(%error, "could not tell the owner about a revoke");
            }
        });
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
