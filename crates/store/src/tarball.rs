//! Store directories as `.tar.zst` files (crate `ankusa-tarball`: no RocksDB, fuzzed on
//! its own), with the store's errors.

use std::path::Path;

use super::StoreError;
use ankusa_tarball::TarballError;

fn store_error(dir: &Path) -> impl FnOnce(TarballError) -> StoreError + '_ {
    move |e| match e {
        TarballError::Io { context, source } => StoreError::Io { context, source },
        TarballError::Refused(reason) => StoreError::NotAStore {
            path: dir.to_path_buf(),
            reason,
        },
        e @ TarballError::NotEmpty(_) => StoreError::NotEmpty(e),
        e @ TarballError::NoRoom { .. } => StoreError::Io {
            context: format!("unpacking into {}", dir.display()),
            source: std::io::Error::new(std::io::ErrorKind::StorageFull, e.to_string()),
        },
    }
}

/// What an unpack leaves free on its volume: a restore that would fill it is stopped
/// before, the node and its WAL keep room.
pub const UNPACK_MARGIN_BYTES: u64 = 64 << 20;

/// Packs the files of `dir` (not its `LOG*` info logs) into `out` as tar + zstd.
pub fn pack(dir: &Path, out: &Path) -> Result<(), StoreError> {
    ankusa_tarball::pack(dir, out).map_err(store_error(dir))
}

/// Packs the files of `dir` as tar + zstd into `w`, as it goes. Returns `w`.
pub fn pack_to<W: std::io::Write>(dir: &Path, w: W) -> Result<W, StoreError> {
    ankusa_tarball::pack_to(dir, w).map_err(store_error(dir))
}

/// Unpacks `file` into `dir`, which must not exist or be empty; refuses an archive that is
/// not a store's (see `ankusa_tarball`), and one that declares more bytes than `dir`'s
/// volume has free less [`UNPACK_MARGIN_BYTES`] (a hostile or mistaken archive cannot fill
/// the volume).
pub fn unpack(file: &Path, dir: &Path) -> Result<(), StoreError> {
    let room = room_to_unpack(dir).unwrap_or(u64::MAX);
    ankusa_tarball::unpack_within(file, dir, room).map_err(store_error(dir))
}

/// What a restore may write into `dir` (which may not exist yet: its nearest existing
/// ancestor's volume): the volume's free space less [`UNPACK_MARGIN_BYTES`] (`None`: the
/// file system does not say).
pub fn room_to_unpack(dir: &Path) -> Option<u64> {
    dir.ancestors()
        .find(|a| a.exists())
        .and_then(crate::volume_space)
        .map(|v| v.free.saturating_sub(UNPACK_MARGIN_BYTES))
}
