//! What `POST /ingest/{source}[/{tenant}]` answers when it takes a hook (its refusals are
//! [`crate::error::ErrorBody`]).

use serde::{Deserialize, Serialize};

/// `202` (committed by a synced write) or `200` with `duplicate` (seen within the dedupe
/// window: the first hook's id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct IngestAnswer {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<bool>,
    /// True when no sink of the source's route took the hook (every one's filter left it
    /// out): it is in the hook log as filtered and is never delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filtered: Option<bool>,
}
