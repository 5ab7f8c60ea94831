//! Store formats above the queue: the format migrations ([`migrations`]), the older layouts
//! they read ([`legacy`]) and the fixture stores the tests and the `store fixture` command
//! write ([`fixture`]). They use the queue's op builders and transitions, so they live in
//! the node crate; the store crate only runs them ([`crate::store::migrate::run`]) from the
//! [`builtin`] registry.

pub mod fixture;
pub mod legacy;
pub mod migrations;

use std::sync::Arc;

use crate::store::migrate::Registry;

/// The migrations this build knows, in chain order.
pub fn builtin() -> Registry {
    Registry::new().register(Arc::new(migrations::tenant_keys::TenantKeys))
}
