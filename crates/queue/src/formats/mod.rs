//! Store formats: the format migrations ([`migrations`]), the older layouts they read
//! ([`legacy`]) and the fixture stores the tests and the `store fixture` command write
//! ([`fixture`]). They build rows with the queue's op builders and transitions, so they
//! live in the queue crate, the one crate that changes rows; the store crate only runs them
//! ([`ankusa_store::migrate::run`]) from the [`builtin`] registry. Start at [`builtin`].

pub mod fixture;
pub mod legacy;
pub mod migrations;

use std::sync::Arc;

use ankusa_store::migrate::Registry;
use ankusa_store::StoreError;

use crate::QueueError;

/// The migrations this build knows, in chain order.
pub fn builtin() -> Registry {
    Registry::new().register(Arc::new(migrations::tenant_keys::TenantKeys))
}

/// A queue error inside a migration step, in the terms of the runner (which lives in the
/// store, below the queue). Corruption stays corruption, counted once; the tenant refusals
/// cannot arise (a migration allocates ordinals itself) and would stop the migration.
pub(crate) fn step_error(e: QueueError) -> StoreError {
    match e {
        QueueError::Corrupt { family, detail } => StoreError::Corruption { family, detail },
        QueueError::Store(e) => e,
        e @ (QueueError::TenantLimit { .. }
        | QueueError::InvalidTenant(_)
        | QueueError::TenantErasing
        | QueueError::HandoffStaged { .. }) => StoreError::Io {
            context: "migration step".into(),
            source: std::io::Error::other(e.to_string()),
        },
    }
}
