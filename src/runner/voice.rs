//! Spoken answers: `/voice on|off|auto` per user, and the live reply that
//! turns a finished answer into speech before it is delivered.
//!
//! The answer is spoken ([`crate::media::speech::Speaker`]) only once the
//! turn is done and only if the user asked for it (`auto`: when their
//! message was spoken). The audio rides on the [`Reply`]; the transport
//! sends it as a voice note carrying the text ([`crate::delivery::voice`]).
//! Any failure sends the text with one line saying so. A stop while the
//! answer is being spoken sends nothing of it (like any answer's sending).

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::reply::{DeliveryError, LiveReply, Outbound, Reply};
use crate::runner::Runner;
use crate::vocab::MessageEvent;

use crate::media::speech::{plain_text, Speaker};
use crate::reply::SendingStop;

/// `/voice`: when answers are spoken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum VoiceMode {
    /// Always.
    On,
    /// Never (the default).
    Off,
    /// When the user's message was spoken.
    Auto,
}

impl VoiceMode {
    pub(super) fn parse(text: &str) -> Option<VoiceMode> {
        match text.trim().to_ascii_lowercase().as_str() {
            "on" => Some(VoiceMode::On),
            "off" => Some(VoiceMode::Off),
            "auto" => Some(VoiceMode::Auto),
            _ => None,
        }
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            VoiceMode::On => "on",
            VoiceMode::Off => "off",
            VoiceMode::Auto => "auto",
        }
    }

    /// Is the answer to a message (`spoken`: sent as voice) spoken?
    pub(super) fn speaks(self, spoken: bool) -> bool {
        match self {
            VoiceMode::On => true,
            VoiceMode::Off => false,
            VoiceMode::Auto => spoken,
        }
    }
}

impl Runner {
    /// The speaker, if this turn's answer (to `event`) is to be spoken.
    pub(super) async fn speaker_for(&self, event: &MessageEvent) -> Option<Arc<Speaker>> {
        let speaker = self.inner.config.speech.clone()?;
        let (store, user) = (self.store()?, event.source.user_id?);
        if event.internal {
            return None;
        }
        let mode = match store.usage.voice_setting(user).await {
            Ok(setting) => setting.as_deref().and_then(VoiceMode::parse),
            Err(error) => {
                tracing::warn!(%error, "could not read the voice setting; answering in text");
                None
            }
        };
        mode.unwrap_or(VoiceMode::Off)
            .speaks(event.media.spoken)
            .then_some(speaker)
    }
}

/// `live`, speaking the answer first (see the module docs).
pub(super) fn spoken_answer(
    live: Option<Box<dyn LiveReply>>,
    speaker: Arc<Speaker>,
    outbound: Arc<dyn Outbound>,
    source: crate::vocab::SessionSource,
) -> Option<Box<dyn LiveReply>> {
    Some(Box::new(Spoken {
        inner: live,
        speaker,
        outbound,
        source,
    }))
}

struct Spoken {
    inner: Option<Box<dyn LiveReply>>,
    speaker: Arc<Speaker>,
    outbound: Arc<dyn Outbound>,
    source: crate::vocab::SessionSource,
}

impl LiveReply for Spoken {
    fn finish(self: Box<Self>, reply: Reply) -> BoxFuture<'static, Result<(), DeliveryError>> {
        // Read here, inside the sending's scope.
        let stop = SendingStop::current();
        Box::pin(async move {
            let this = *self;
            let text = plain_text(&reply.text);
            let stopped = async {
                match &stop {
                    Some(stop) => stop.token().cancelled().await,
                    None => std::future::pending().await,
                }
            };
            let spoken = tokio::select! {
                () = stopped => None,
                spoken = this.speaker.speak(&text) => Some(spoken),
            };
            let reply = match spoken {
                Some(Ok(audio)) => reply.with_voice(audio),
                Some(Err(error)) => {
                    tracing::warn!(chat_id = this.source.chat_id, %error, "the answer was not spoken; sending it as text");
                    Reply {
                        text: format!("{}\n\n{}", reply.text.trim_end(), error.user_line()),
                        ..reply
                    }
                }
                // Stopped: the text path sends nothing more either.
                None => reply,
            };
            match this.inner {
                Some(live) => live.finish(reply).await,
                None => this.outbound.deliver(&this.source, reply).await,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_decide() {
        assert_eq!(VoiceMode::parse(" ON "), Some(VoiceMode::On));
        assert_eq!(VoiceMode::parse("loud"), None);
        assert!(VoiceMode::On.speaks(false));
        assert!(!VoiceMode::Off.speaks(true));
        assert!(VoiceMode::Auto.speaks(true) && !VoiceMode::Auto.speaks(false));
        for mode in [VoiceMode::On, VoiceMode::Off, VoiceMode::Auto] {
            assert_eq!(VoiceMode::parse(mode.as_str()), Some(mode));
        }
    }
}
