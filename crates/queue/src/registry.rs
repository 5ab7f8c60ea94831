//! This node's part of the Relay's tenant registry: `tenants.max` held across the nodes
//! with no node whose loss stops new tenants.
//!
//! The Relay's `tenants.max` slots are split among its nodes (an escrow of slots):
//!
//! - **Shares.** Each node starts with its share of `tenants.max` — the nodes ranked by
//!   name, `max / N` each and one more for the first `max % N` — computed alike by every
//!   node from the node list, with no exchange. The shares add up to `tenants.max`.
//! - **What a node holds.** Its *slots* are its share, plus what other nodes lent it, less
//!   what it lent them. Its *registered* tenants are those its store holds and it owns
//!   (read at open) and those it admitted since. It admits a new tenant, as its owner, only while its
//!   registered tenants are fewer than its slots. Nothing is written for an admission: a
//!   tenant whose first hook never committed is not in the store, and after a restart
//!   not counted.
//! - **Loans.** A node out of slots asks another to lend some. The lender moves at most
//!   half its free slots, records the running total it lent to that node
//!   (`m:cluster_lent:<node>`, synced) *before* it answers, and answers that total. The
//!   borrower keeps the largest total it heard (`m:cluster_heard:<node>`). A lost answer
//!   leaves slots with neither node until the next answer of that lender carries the
//!   total — slots are never in two places, so the Relay never holds more than
//!   `tenants.max` tenants, whatever the network does: the sum of every node's slots is at
//!   most the sum of the shares.
//! - **Lost volume.** A node whose store is lost has forgotten what it lent; it learns it
//!   again from the totals the borrowers heard ([`Registry::learn`]). Until a borrower
//!   answers, the Relay may hold up to what was lent to it too many.
//!
//! Only loans between nodes of the current list count, so a node that leaves takes its
//! loans with it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use ankusa_keyspace::Cf;
use ankusa_keyspace::Family;
use ankusa_store::{Dir, Op, Rows, Store};

use crate::QueueError;

/// The registry kept on the first node before slots: removed at open.
const OLD_REGISTRY_PREFIX: &[u8] = b"m:cluster_tenant:";
/// Slots lent to a node, a running total: `m:cluster_lent:<node>` → u64.
const LENT_PREFIX: &[u8] = b"m:cluster_lent:";
/// The largest running total a node said it lent this one: `m:cluster_heard:<node>` → u64.
const HEARD_PREFIX: &[u8] = b"m:cluster_heard:";

/// What the registry said of a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// This node's slots are taken (another node may lend some).
    Limit,
}

/// The nodes of the Relay as this node sees them, for its slots.
#[derive(Debug, Clone)]
pub struct Shares {
    /// This node's share of `tenants.max`.
    pub share: u64,
    /// The other nodes' names.
    pub peers: Vec<String>,
}

impl Shares {
    /// The share of `me` among `names` (any order) of a Relay with `max` tenants.
    pub fn of(max: u32, names: &[&str], me: &str) -> Shares {
        let mut sorted: Vec<&str> = names.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let n = sorted.len().max(1) as u64;
        let rank = sorted.iter().position(|x| *x == me).unwrap_or(0) as u64;
        let max = u64::from(max);
        Shares {
            share: max / n + u64::from(rank < max % n),
            peers: sorted
                .into_iter()
                .filter(|x| *x != me)
                .map(str::to_owned)
                .collect(),
        }
    }
}

/// What one node's registry holds, as `GET /cluster/v1/slots` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Tenants admitted here.
    pub registered: u64,
    /// Running totals lent, by node.
    pub lent: HashMap<String, u64>,
    /// Running totals heard, by node.
    pub heard: HashMap<String, u64>,
}

#[derive(Debug, Default)]
struct State {
    names: HashSet<String>,
    lent: HashMap<String, u64>,
    heard: HashMap<String, u64>,
}

impl State {
    fn slots(&self, s: &Shares) -> i64 {
        let (mut inn, mut out) = (0u64, 0u64);
        for p in &s.peers {
            inn += self.heard.get(p).copied().unwrap_or(0);
            out += self.lent.get(p).copied().unwrap_or(0);
        }
        s.share as i64 + inn as i64 - out as i64
    }

    fn free(&self, s: &Shares) -> u64 {
        (self.slots(s) - self.names.len() as i64).max(0) as u64
    }
}

/// This node's part of the Relay's tenant registry.
#[derive(Debug)]
pub struct Registry {
    store: Arc<Store>,
    state: Mutex<State>,
}

fn u64_of(v: &[u8]) -> u64 {
    v.try_into().map_or(0, u64::from_be_bytes)
}

fn key(prefix: &[u8], name: &str) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

impl Registry {
    /// Loads the registry from `store`: the tenants it holds that this node `owns` (under
    /// the current node list: a tenant that moved away counts at its new owner) and the
    /// loans. Removes the list of every tenant id the first node kept before, in one
    /// synced batch.
    pub fn open(store: Arc<Store>, owns: impl Fn(&str) -> bool) -> Result<Registry, QueueError> {
        let mut state = State {
            names: crate::tenants::list(&store, "", None, usize::MAX)?
                .into_iter()
                .map(|(name, _)| name)
                .filter(|name| owns(name))
                .collect(),
            ..State::default()
        };
        let mut old = Vec::new();
        for prefix in [OLD_REGISTRY_PREFIX, LENT_PREFIX, HEARD_PREFIX] {
            let mut to = prefix.to_vec();
            to.push(0xFF);
            for kv in store.scan(Family::Meta, prefix, &to, Dir::Forward)? {
                let (k, v) = kv?;
                let Some(name) = k.strip_prefix(prefix) else {
                    continue;
                };
                let name = String::from_utf8_lossy(name).into_owned();
                if prefix == LENT_PREFIX {
                    state.lent.insert(name, u64_of(&v));
                } else if prefix == HEARD_PREFIX {
                    state.heard.insert(name, u64_of(&v));
                } else {
                    old.push(Op::delete(Cf::Default, k.to_vec()));
                }
            }
        }
        if !old.is_empty() {
            store.write(old, true)?;
        }
        Ok(Registry {
            store,
            state: Mutex::new(state),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `tenant`: always when `exists` (this node already stores it), otherwise
    /// only while this node has a free slot.
    pub fn admit(&self, tenant: &str, exists: bool, shares: &Shares) -> Admission {
        let mut st = self.state();
        if st.names.contains(tenant) {
            return Admission::Admitted;
        }
        if !exists && st.free(shares) == 0 {
            return Admission::Limit;
        }
        st.names.insert(tenant.to_owned());
        Admission::Admitted
    }

    /// Lends `to` (a peer of `shares`) up to `want` slots, at most half of the free ones
    /// (rounded up). Synced before it answers: the slots lent now and the running total
    /// lent to `to`.
    pub fn lend(&self, to: &str, want: u64, shares: &Shares) -> Result<(u64, u64), QueueError> {
        let mut st = self.state();
        let total = st.lent.get(to).copied().unwrap_or(0);
        if !shares.peers.iter().any(|p| p == to) {
            return Ok((0, total));
        }
        let free = st.free(shares);
        let give = want.min(free.div_ceil(2));
        if give == 0 {
            return Ok((0, total));
        }
        let total = total + give;
        self.store.write(
            vec![Op::put(
                Cf::Default,
                key(LENT_PREFIX, to),
                total.to_be_bytes().to_vec(),
            )],
            true,
        )?;
        st.lent.insert(to.to_owned(), total);
        Ok((give, total))
    }

    /// What another node said of the loans between it and this one: `lent_to_me`, the
    /// running total it lent this node, and `heard_from_me`, the largest total it heard
    /// this node lent it. Each is kept when larger than what this node holds (a lost
    /// answer's slots arrive; a lost store's loans come back). Synced when anything
    /// changed.
    pub fn learn(&self, node: &str, lent_to_me: u64, heard_from_me: u64) -> Result<(), QueueError> {
        let mut st = self.state();
        let mut ops = Vec::new();
        let heard = st.heard.get(node).copied().unwrap_or(0);
        if lent_to_me > heard {
            ops.push(Op::put(
                Cf::Default,
                key(HEARD_PREFIX, node),
                lent_to_me.to_be_bytes().to_vec(),
            ));
        }
        let lent = st.lent.get(node).copied().unwrap_or(0);
        if heard_from_me > lent {
            ops.push(Op::put(
                Cf::Default,
                key(LENT_PREFIX, node),
                heard_from_me.to_be_bytes().to_vec(),
            ));
        }
        if ops.is_empty() {
            return Ok(());
        }
        self.store.write(ops, true)?;
        st.heard.insert(node.to_owned(), heard.max(lent_to_me));
        st.lent.insert(node.to_owned(), lent.max(heard_from_me));
        Ok(())
    }

    /// Tenants admitted here.
    pub fn len(&self) -> usize {
        self.state().names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// This node's slots now (its share and loans; negative when it lent more than its
    /// share, which it never does).
    pub fn slots(&self, shares: &Shares) -> i64 {
        self.state().slots(shares)
    }

    /// Everything this registry holds, for another node.
    pub fn ledger(&self) -> Ledger {
        let st = self.state();
        Ledger {
            registered: st.names.len() as u64,
            lent: st.lent.clone(),
            heard: st.heard.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(max: u32, me: &str) -> Shares {
        Shares::of(max, &["a", "b", "c"], me)
    }

    #[test]
    fn the_shares_add_up_to_tenants_max_in_any_order_of_the_list() {
        for max in [1u32, 2, 3, 10, 11, 1000] {
            let sum: u64 = ["c", "a", "b"].iter().map(|m| shares(max, m).share).sum();
            assert_eq!(sum, u64::from(max));
            assert_eq!(
                Shares::of(max, &["c", "b", "a"], "b").share,
                shares(max, "b").share
            );
        }
        assert_eq!(shares(10, "a").peers, ["b", "c"]);
        assert_eq!(shares(10, "a").share, 4);
        assert_eq!(shares(10, "c").share, 3);
    }

    #[test]
    fn a_node_admits_up_to_its_slots_and_counts_what_its_store_holds_across_opens() {
        let mut h = crate::testkit::Harness::new();
        let store = h.store.clone();
        // The list the first node kept before slots: removed at open.
        store
            .write(
                vec![Op::put(
                    Cf::Default,
                    b"m:cluster_tenant:t9".to_vec(),
                    Vec::new(),
                )],
                true,
            )
            .unwrap();
        let s = shares(7, "b"); // 2 slots
        let r = Registry::open(store.clone(), |_| true).unwrap();
        assert!(r.is_empty());
        assert_eq!(r.admit("t1", false, &s), Admission::Admitted);
        assert_eq!(r.admit("t2", false, &s), Admission::Admitted);
        assert_eq!(r.admit("t3", false, &s), Admission::Limit);
        assert_eq!(r.admit("t1", false, &s), Admission::Admitted);
        assert_eq!(
            r.admit("t4", true, &s),
            Admission::Admitted,
            "a tenant this node already stores is registered past its slots"
        );
        assert_eq!(r.len(), 3);
        // Only t1 and t4 reach the store; t2's first hook never committed.
        h.ingest(Some("t1"), 1, 0, false);
        h.ingest(Some("t4"), 1, 0, false);
        drop(r);
        let again = Registry::open(store.clone(), |_| true).unwrap();
        assert_eq!(again.len(), 2, "what the store holds");
        assert_eq!(again.admit("t3", false, &s), Admission::Limit);
        assert!(store
            .get(Cf::Default, b"m:cluster_tenant:t9")
            .unwrap()
            .is_none());
        drop(again);
        let owning_one = Registry::open(store.clone(), |t| t == "t1").unwrap();
        assert_eq!(
            owning_one.len(),
            1,
            "a tenant that moved away counts at its new owner"
        );
    }

    #[test]
    fn loans_move_slots_and_never_put_them_in_two_places() {
        let (ha, hb) = (
            crate::testkit::Harness::new(),
            crate::testkit::Harness::new(),
        );
        let a = Registry::open(ha.store.clone(), |_| true).unwrap();
        let b = Registry::open(hb.store.clone(), |_| true).unwrap();
        let (sa, sb) = (shares(8, "a"), shares(8, "b")); // 3 and 3 (c holds 2)
        let total = |a: &Registry, b: &Registry| a.slots(&sa) + b.slots(&sb);
        assert_eq!(total(&a, &b), 6);
        // b admits its three, then borrows from a: half of a's free, rounded up.
        for t in ["x", "y", "z"] {
            assert_eq!(b.admit(t, false, &sb), Admission::Admitted);
        }
        assert_eq!(b.admit("w", false, &sb), Admission::Limit);
        let (given, lent) = a.lend("b", 5, &sa).unwrap();
        assert_eq!((given, lent), (2, 2));
        // The answer is lost: the two slots are with neither node.
        assert_eq!(total(&a, &b), 4);
        assert_eq!(b.admit("w", false, &sb), Admission::Limit);
        // The next answer carries the running total: both arrive.
        assert_eq!(a.lend("b", 5, &sa).unwrap(), (1, 3));
        b.learn("a", 3, 0).unwrap();
        assert_eq!(total(&a, &b), 6);
        assert_eq!(a.slots(&sa), 0);
        assert_eq!(b.slots(&sb), 6);
        assert_eq!(a.lend("b", 5, &sa).unwrap(), (0, 3), "a has none left");
        assert_eq!(a.lend("nobody", 5, &sa).unwrap().0, 0, "not a peer");
        // An old total changes nothing.
        b.learn("a", 1, 0).unwrap();
        assert_eq!(b.slots(&sb), 6);
        // Across opens.
        drop(b);
        let b = Registry::open(hb.store.clone(), |_| true).unwrap();
        assert_eq!(b.slots(&sb), 6);
        assert_eq!(b.ledger().heard["a"], 3);
    }

    #[test]
    fn a_lender_whose_store_was_lost_learns_its_loans_from_the_borrower() {
        let (ha, hb) = (
            crate::testkit::Harness::new(),
            crate::testkit::Harness::new(),
        );
        let a = Registry::open(ha.store.clone(), |_| true).unwrap();
        let b = Registry::open(hb.store.clone(), |_| true).unwrap();
        let (sa, sb) = (shares(6, "a"), shares(6, "b"));
        let (_, lent) = a.lend("b", 1, &sa).unwrap();
        b.learn("a", lent, 0).unwrap();
        assert_eq!(a.slots(&sa) + b.slots(&sb), 4);
        // a's store is lost: a fresh one believes it lent nothing, until b answers.
        let fresh = crate::testkit::Harness::new();
        let a = Registry::open(fresh.store.clone(), |_| true).unwrap();
        assert_eq!(
            a.slots(&sa) + b.slots(&sb),
            5,
            "one too many, until b answers"
        );
        let seen = b.ledger();
        a.learn(
            "b",
            seen.lent.get("a").copied().unwrap_or(0),
            seen.heard["a"],
        )
        .unwrap();
        assert_eq!(a.slots(&sa) + b.slots(&sb), 4);
    }

    /// One step of three nodes' registries.
    #[derive(Debug, Clone)]
    enum Step {
        /// Node `at` admits a new tenant (borrowing from `from` when out of slots; the
        /// answer lost when `lost`).
        Admit { at: usize, from: usize, lost: bool },
        /// Node `at` reads node `of`'s ledger.
        Learn { at: usize, of: usize },
        /// Node `at`'s store is lost: it starts empty and reads every other node's ledger.
        LoseStore { at: usize },
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0..3usize, 0..3usize, any::<bool>())
                .prop_map(|(at, from, lost)| Step::Admit { at, from, lost }),
            2 => (0..3usize, 0..3usize).prop_map(|(at, of)| Step::Learn { at, of }),
            1 => (0..3usize).prop_map(|at| Step::LoseStore { at }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

        /// Whatever loans are asked and answers lost, the nodes never hold more slots than
        /// `tenants.max` nor admit more tenants; once every node has read every other's
        /// ledger, every slot is somewhere.
        #[test]
        fn slots_are_never_in_two_places(
            max in 1u32..20,
            steps in proptest::collection::vec(step(), 1..80),
        ) {
            let names = ["a", "b", "c"];
            let shares: Vec<Shares> = names.iter().map(|n| Shares::of(max, &names, n)).collect();
            let mut stores: Vec<crate::testkit::Harness> =
                (0..3).map(|_| crate::testkit::Harness::new()).collect();
            let mut regs: Vec<Registry> = stores
                .iter()
                .map(|h| Registry::open(h.store.clone(), |_| true).unwrap())
                .collect();
            let mut tenant = 0;
            let learn = |regs: &[Registry], at: usize, of: usize| {
                let l = regs[of].ledger();
                let me = names[at];
                regs[at]
                    .learn(
                        names[of],
                        l.lent.get(me).copied().unwrap_or(0),
                        l.heard.get(me).copied().unwrap_or(0),
                    )
                    .unwrap();
            };
            for s in steps {
                match s {
                    Step::Admit { at, from, lost } => {
                        tenant += 1;
                        let t = format!("t{tenant}");
                        let sh = &shares[at];
                        if regs[at].admit(&t, false, sh) == Admission::Limit && from != at {
                            let (_, total) = regs[from].lend(names[at], 2, &shares[from]).unwrap();
                            if !lost {
                                regs[at].learn(names[from], total, 0).unwrap();
                                regs[at].admit(&t, false, sh);
                            }
                        }
                    }
                    Step::Learn { at, of } if at != of => learn(&regs, at, of),
                    Step::Learn { .. } => {}
                    Step::LoseStore { at } => {
                        stores[at] = crate::testkit::Harness::new();
                        regs[at] = Registry::open(stores[at].store.clone(), |_| true).unwrap();
                        for of in (0..3).filter(|o| *o != at) {
                            learn(&regs, at, of);
                        }
                    }
                }
                let slots: i64 = (0..3).map(|i| regs[i].slots(&shares[i])).sum();
                let admitted: usize = regs.iter().map(Registry::len).sum();
                proptest::prop_assert!(slots <= i64::from(max), "{slots} slots");
                proptest::prop_assert!(admitted <= max as usize, "{admitted} admitted");
                for (i, r) in regs.iter().enumerate() {
                    proptest::prop_assert!(r.len() as i64 <= r.slots(&shares[i]).max(0));
                }
            }
            for at in 0..3 {
                for of in (0..3).filter(|o| *o != at) {
                    learn(&regs, at, of);
                }
            }
            let slots: i64 = (0..3).map(|i| regs[i].slots(&shares[i])).sum();
            proptest::prop_assert_eq!(slots, i64::from(max));
        }
    }
}
