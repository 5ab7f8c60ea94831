//! The versioned value codec (crate `ankusa-values`: no RocksDB, fuzzed on its own).
pub use ankusa_values::codec::*;
