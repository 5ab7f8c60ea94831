//! Store formats above the queue: the format migrations ([`migrations`]), the older layouts
//! they read ([`legacy`]) and the fixture stores the tests and the `store fixture` command
//! write ([`fixture`]). They use the queue's op builders and transitions, so they live in
//! the node crate; the store crate only runs them ([`ankusa_store::migrate::run`]) from the
//! [`builtin`] registry. [`Progress`]: the boot migration's, as `/v1/node` reports it.

pub mod fixture;
pub mod legacy;
pub mod migrations;

use std::sync::Arc;

use ankusa_api::node::MigrationProgress;
use ankusa_store::migrate::Registry;

/// The boot migration's progress, shared with `/v1/node`.
#[derive(Debug, Default)]
pub struct Progress(std::sync::Mutex<Option<MigrationProgress>>);

impl Progress {
    pub fn set(&self, p: Option<MigrationProgress>) {
        if let Ok(mut g) = self.0.lock() {
            *g = p;
        }
    }
    pub fn get(&self) -> Option<MigrationProgress> {
        self.0.lock().ok().and_then(|g| g.clone())
    }
}

/// The migrations this build knows, in chain order.
pub fn builtin() -> Registry {
    Registry::new().register(Arc::new(migrations::tenant_keys::TenantKeys))
}

/// A queue error inside a migration step, in the terms of the runner (which lives in the
/// store, below the queue). Corruption stays corruption, counted once; the tenant refusals
/// cannot arise (a migration allocates ordinals itself) and would stop the migration.
pub(crate) fn step_error(e: ankusa_queue::QueueError) -> ankusa_store::StoreError {
    use ankusa_queue::QueueError;
    use ankusa_store::StoreError;
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
