//! The Relay's tenant registry, on its first node: every tenant id the Relay admitted,
//! `m:cluster_tenant:<tenant id>` in the default family, so that `tenants.max` holds across
//! the nodes. The node's cluster (`ankusa-relay`'s `cluster`) serves it to the others.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use ankusa_keyspace::Cf;
use ankusa_keyspace::Family;
use ankusa_store::{Dir, Op, Store, StoreError};

/// Registry keys: `m:cluster_tenant:<tenant id>`.
const REGISTRY_PREFIX: &[u8] = b"m:cluster_tenant:";

/// What the registry said of a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// The Relay holds `tenants.max` tenants.
    Limit,
}

/// The Relay's tenant registry, on its first node.
#[derive(Debug)]
pub struct Registry {
    store: Arc<Store>,
    max: u32,
    names: Mutex<HashSet<String>>,
}

impl Registry {
    /// Loads the registry from `store`.
    pub fn open(store: Arc<Store>, max: u32) -> Result<Registry, StoreError> {
        let mut names = HashSet::new();
        let mut to = REGISTRY_PREFIX.to_vec();
        to.push(0xFF);
        for kv in store.scan(Family::Meta, REGISTRY_PREFIX, &to, Dir::Forward)? {
            let (k, _) = kv?;
            if let Some(name) = k.strip_prefix(REGISTRY_PREFIX) {
                names.insert(String::from_utf8_lossy(name).into_owned());
            }
        }
        Ok(Registry {
            store,
            max,
            names: Mutex::new(names),
        })
    }

    /// Registers `tenant`: always when `exists` (a node already stores it), otherwise only
    /// below `tenants.max`. Synced before it answers.
    pub fn admit(&self, tenant: &str, exists: bool) -> Result<Admission, StoreError> {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if names.contains(tenant) {
            return Ok(Admission::Admitted);
        }
        if !exists && names.len() as u64 >= u64::from(self.max) {
            return Ok(Admission::Limit);
        }
        let mut key = REGISTRY_PREFIX.to_vec();
        key.extend_from_slice(tenant.as_bytes());
        self.store
            .write(vec![Op::put(Cf::Default, key, Vec::new())], true)?;
        names.insert(tenant.to_owned());
        Ok(Admission::Admitted)
    }

    /// Tenants registered.
    pub fn len(&self) -> usize {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_holds_tenants_max_and_remembers_across_opens() {
        let h = crate::testkit::Harness::new();
        let store = h.store.clone();
        let r = Registry::open(store.clone(), 2).unwrap();
        assert_eq!(r.admit("a", false).unwrap(), Admission::Admitted);
        assert_eq!(r.admit("b", false).unwrap(), Admission::Admitted);
        assert_eq!(r.admit("c", false).unwrap(), Admission::Limit);
        assert_eq!(
            r.admit("a", false).unwrap(),
            Admission::Admitted,
            "a known tenant"
        );
        assert_eq!(
            r.admit("d", true).unwrap(),
            Admission::Admitted,
            "a tenant a node already stores is registered past the limit"
        );
        drop(r);
        let again = Registry::open(store, 2).unwrap();
        assert_eq!(again.len(), 3);
        assert_eq!(again.admit("c", false).unwrap(), Admission::Limit);
    }
}
