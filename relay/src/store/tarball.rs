//! Store directories as `.tar.zst` files: fixtures, backups and restores.
//!
//! `pack` archives a closed store directory (its info logs left out); `unpack` extracts
//! one into an empty directory, refusing entries that would escape it.

use std::path::Path;

use super::StoreError;

fn io(context: String) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Io { context, source }
}

/// Packs the files of `dir` (not its `LOG*` info logs) into `out` as tar + zstd.
/// Written to `<out>.tmp` and renamed when whole; on any error the `.tmp` is removed.
pub fn pack(dir: &Path, out: &Path) -> Result<(), StoreError> {
    let tmp = out.with_extension("tmp");
    let packed = (|| {
        let file =
            std::fs::File::create(&tmp).map_err(io(format!("creating {}", tmp.display())))?;
        let file = pack_to(dir, file)?;
        file.sync_all()
            .map_err(io(format!("syncing {}", tmp.display())))?;
        std::fs::rename(&tmp, out).map_err(io(format!("writing {}", out.display())))
    })();
    if packed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    packed
}

/// Packs the files of `dir` (not its `LOG*` info logs) as tar + zstd into `w`, as it goes
/// (a backup streams to its destination without a copy on the node). Returns `w`.
pub fn pack_to<W: std::io::Write>(dir: &Path, w: W) -> Result<W, StoreError> {
    let enc = zstd::Encoder::new(w, 9).map_err(io("zstd encoder".into()))?;
    let mut tar = tar::Builder::new(enc);
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map_err(io(format!("reading {}", dir.display())))?
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name())
        .collect();
    names.sort();
    for name in names {
        if name.to_string_lossy().starts_with("LOG") {
            continue;
        }
        tar.append_path_with_name(dir.join(&name), &name)
            .map_err(io(format!("adding {}", name.to_string_lossy())))?;
    }
    let enc = tar.into_inner().map_err(io("finishing tar".into()))?;
    enc.finish().map_err(io("finishing zstd".into()))
}

/// Unpacks `file` into `dir`, which must not exist or be empty.
pub fn unpack(file: &Path, dir: &Path) -> Result<(), StoreError> {
    if dir.exists()
        && std::fs::read_dir(dir)
            .map_err(io(format!("reading {}", dir.display())))?
            .next()
            .is_some()
    {
        return Err(StoreError::NotAStore {
            path: dir.to_path_buf(),
            reason: "refusing to unpack into a directory that is not empty".into(),
        });
    }
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    // Until the last file is in, the directory says so: a restore that is cut (a killed
    // process, a truncated archive) leaves a directory every command refuses to open.
    let marker = dir.join(super::RESTORING_MARKER);
    std::fs::File::create(&marker)
        .and_then(|f| f.sync_all())
        .map_err(io(format!("creating {}", marker.display())))?;
    sync_dir(dir)?;
    let f = std::fs::File::open(file).map_err(io(format!("opening {}", file.display())))?;
    let dec = zstd::Decoder::new(f).map_err(io("zstd decoder".into()))?;
    let mut ar = tar::Archive::new(dec);
    for entry in ar.entries().map_err(io("reading tar".into()))? {
        let mut entry = entry.map_err(io("reading tar entry".into()))?;
        // `unpack_in` refuses paths that would land outside `dir`.
        entry
            .unpack_in(dir)
            .map_err(io(format!("unpacking into {}", dir.display())))?;
    }
    // Every file durable before the marker goes.
    for e in std::fs::read_dir(dir).map_err(io(format!("reading {}", dir.display())))? {
        let path = e.map_err(io(format!("reading {}", dir.display())))?.path();
        if path.is_file() {
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io(format!("syncing {}", path.display())))?;
        }
    }
    std::fs::remove_file(&marker).map_err(io(format!("removing {}", marker.display())))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("syncing {}", dir.display())))
}
