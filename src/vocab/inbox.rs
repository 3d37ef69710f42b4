//! Where a message stands in the inbox: the states of the store's inbox
//! rows, which the transport writes, recovery reads and the metrics count.

/// Where a message stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InboxState {
    /// Recorded, not started yet (queued or just arrived).
    Received,
    /// Its turn runs.
    Running,
    /// Its answer (or command reply) was delivered.
    Answered,
    /// Its turn failed and the user was told.
    Failed,
    /// It will not be answered (ignored, stopped, refused…); `reason` says why.
    Dropped,
}

impl InboxState {
    /// All states, in order.
    pub const ALL: [InboxState; 5] = [
        InboxState::Received,
        InboxState::Running,
        InboxState::Answered,
        InboxState::Failed,
        InboxState::Dropped,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            InboxState::Received => "received",
            InboxState::Running => "running",
            InboxState::Answered => "answered",
            InboxState::Failed => "failed",
            InboxState::Dropped => "dropped",
        }
    }

    /// The state stored as `s`.
    pub fn parse(s: &str) -> Option<InboxState> {
        InboxState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
    }

    /// True for the states a message never leaves.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            InboxState::Answered | InboxState::Failed | InboxState::Dropped
        )
    }
}
