//! The calls between the nodes of a Relay (`/cluster/v1/…` on the admin listener, with the
//! cluster token): the tenant registry's loans and ledgers, and the handoff of a tenant's
//! stored rows to its new owner (docs/architecture.md).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// `POST /cluster/v1/slots/lend`: a node out of tenant slots asks for some.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LendRequest {
    /// The node that asks (its name in `cluster.nodes`).
    pub to: String,
    /// The most slots it wants.
    pub want: u64,
}

/// What a node lent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Lent {
    /// Slots lent now (0: none free, or the asker is not in this node's list).
    pub given: u64,
    /// Every slot this node has lent the asker, this loan included: the asker keeps the
    /// largest total it heard, so the slots of a lost answer arrive with the next one.
    pub lent_total: u64,
}

/// `GET /cluster/v1/stored`: whether this node stores the tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Stored {
    pub stored: bool,
}

/// `GET /cluster/v1/slots`: this node's part of the tenant registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SlotLedger {
    /// Tenants this node admitted as their owner.
    pub registered: u64,
    /// Its slots now: its share of `tenants.max`, plus loans in, less loans out.
    pub slots: i64,
    /// Running totals this node lent, by node.
    pub lent: HashMap<String, u64>,
    /// The largest running totals other nodes said they lent it, by node.
    pub heard: HashMap<String, u64>,
}

/// The most items one handoff batch carries (the receiver refuses more).
pub const HANDOFF_MAX_ITEMS: usize = 1_024;

/// `POST /cluster/v1/handoff`: a batch of stored rows whose tenants the receiver owns,
/// from the node that stored them. The sender took the items out of its queue before it
/// sent them; the receiver imports the batch once (in one synced write that records its
/// number) and answers, and only then does the sender forget it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HandoffBatch {
    /// The sending node (its name in `cluster.nodes`).
    pub from: String,
    /// The batch's number among those the sender sent this receiver: one more than the
    /// last, or the last again (a batch sent again after a lost answer or a restart).
    pub batch: u64,
    /// The items, each a hook with every delivery it still owes (due, scheduled, parked,
    /// dead), its archive obligation and hook log, an archived copy still in its retention,
    /// a hook log record of a hook no longer stored, or a dedupe key inside its window: in the
    /// store's encoding of a moved item (version 1), base64 (standard, padded). At most
    /// [`HANDOFF_MAX_ITEMS`].
    pub items: Vec<String>,
}

/// What the receiver did with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HandoffOutcome {
    /// Committed now, with a synced write.
    Imported,
    /// This batch, or a later one, was imported before: nothing written. Answered before
    /// anything else is looked at, whatever the receiver's node list says now: a sender
    /// takes back a batch refused with `not_owner`, so that refusal must mean the batch is
    /// not there.
    Already,
}

/// The receiver's answer to a [`HandoffBatch`]: the sender may forget the batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HandoffAnswer {
    pub batch: u64,
    pub outcome: HandoffOutcome,
    /// Hooks imported now (0 when `already`).
    pub hooks: u64,
    /// Dedupe keys imported now (a key the receiver holds alive already is kept as is).
    pub dedupe: u64,
    /// Archived copies imported now (one that expired on its way is not kept).
    #[serde(default)]
    pub archived: u64,
    /// Hook log records imported now (a leaving node's, of hooks it no longer stores).
    #[serde(default)]
    pub records: u64,
    /// Tenants' endpoints imported now.
    #[serde(default)]
    pub endpoints: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handoff_batch_refuses_unknown_fields_and_answers_in_snake_case() {
        let b: HandoffBatch =
            serde_json::from_str(r#"{"from":"hooks-2","batch":3,"items":["AQ=="]}"#).unwrap();
        assert_eq!(b.batch, 3);
        assert!(serde_json::from_str::<HandoffBatch>(
            r#"{"from":"hooks-2","batch":3,"items":[],"extra":1}"#
        )
        .is_err());
        let a = HandoffAnswer {
            batch: 3,
            outcome: HandoffOutcome::Already,
            hooks: 0,
            dedupe: 0,
            archived: 0,
            records: 0,
            endpoints: 0,
        };
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"batch":3,"outcome":"already","hooks":0,"dedupe":0,"archived":0,"records":0,"endpoints":0}"#
        );
        // An answer of a release before archived copies moved.
        let old: HandoffAnswer =
            serde_json::from_str(r#"{"batch":3,"outcome":"imported","hooks":2,"dedupe":1}"#)
                .unwrap();
        assert_eq!((old.archived, old.endpoints), (0, 0));
    }
}

/// `POST /pull/{sink}/wait` (ingest listener): a node where a consumer's claim waits asks
/// another whether it has hooks of the sink for that consumer (whose token the call
/// carries), waiting up to `wait_ms` for some.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullWait {
    /// The longest to wait (at most the answering node's `pull.max_wait_ms`).
    pub wait_ms: u64,
}

/// Whether hooks wait there now: `false` when the wait ran out first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PullReady {
    pub ready: bool,
}
