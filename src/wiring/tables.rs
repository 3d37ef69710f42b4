//! The store's tables each layer gets.
//!
//! Outside `store/` and the wiring, no file names [`Store`]: each layer
//! holds only the handles of the tables it touches (its imports say which
//! they are; `tests/it/tidy.rs` holds this). This module is where the one
//! store becomes those narrow handles, one function per layer that needs
//! more than one table.

use crate::delivery::DeliveryTables;
use crate::store::Store;

/// What delivery writes: the outbox, inline buttons, approval prompts.
pub fn delivery(store: &Store) -> DeliveryTables {
    DeliveryTables {
        outbox: store.outbox(),
        buttons: store.buttons(),
        approvals: store.approvals(),
    }
}
