//! Transports: where messages come from and where replies go.
//!
//! A transport turns its input into [`MessageEvent`](crate::vocab::MessageEvent)s,
//! hands each to the adapter and returns at once; it implements
//! [`Outbound`](crate::reply::Outbound) for the replies. It must never await
//! a turn (teloxide runs one chat's updates one at a time: a handler that
//! waited for the turn would make /stop wait behind the turn it should stop)
//! and never make session decisions of its own.

pub mod console;
pub mod telegram;
