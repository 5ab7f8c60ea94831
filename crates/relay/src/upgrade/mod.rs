//! The boot migration's progress ([`Progress`]), as `/v1/node` reports it. The format
//! migrations themselves, the older layouts they read and the fixture stores are the queue
//! crate's (`ankusa_queue::formats`): they change rows.

use ankusa_api::node::MigrationProgress;

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
