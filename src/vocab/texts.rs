//! Reply texts more than one layer says (the adapter and the runner both
//! end a failure report with the same hint). A text one layer owns stays
//! with that layer.

/// The hint appended to every failure message.
pub const RESET_HINT: &str = "If this keeps happening, send /reset to start a fresh session.";
