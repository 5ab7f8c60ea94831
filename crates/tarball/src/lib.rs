//! Store directories as `.tar.zst` files: fixtures, backups and restores.
//!
//! [`pack`] archives a closed store directory (its info logs left out); [`unpack`]
//! extracts one into an empty directory. An archive is input from outside (a backup
//! volume, an operator's upload), so unpacking trusts nothing in it:
//! - only regular files, each directly in the directory (no subdirectory, link, device or
//!   path that would land elsewhere): a store directory holds nothing else;
//! - at most [`MAX_ENTRIES`] entries, and a zstd window of at most 2^[`WINDOW_LOG_MAX`]
//!   bytes (the decoder's memory), whatever the archive claims;
//! - until the last file is in and synced, [`RESTORING_MARKER`] is in the directory, so a
//!   restore that is cut leaves a directory every command refuses to open.
//!
//! No RocksDB: fuzzed on its own (`fuzz/fuzz_targets/tarball.rs`).

use std::io::Read;
use std::path::Path;

/// Present in a data directory while a restore into it is unfinished.
pub const RESTORING_MARKER: &str = "ANKUSA-RESTORING";
/// The most entries an archive may have (a store directory has a few thousand files).
pub const MAX_ENTRIES: usize = 100_000;
/// The largest zstd window unpacking accepts (2^24 = 16 MiB; `pack` writes 2^22 at most).
pub const WINDOW_LOG_MAX: u32 = 24;

#[derive(Debug, thiserror::Error)]
pub enum TarballError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The archive is not acceptable.
    #[error("{0}")]
    Refused(String),
    /// The archive unpacks to more than the room it was given (the destination volume's
    /// free space, less a margin): stopped before the volume filled.
    #[error(
        "the archive unpacks to more than {room} bytes, the room its destination has: {detail}"
    )]
    NoRoom { room: u64, detail: String },
    /// The destination holds files (a live store, or anything else): nothing was written.
    #[error(
        "{} is not empty: restore into a new directory, or stop the node that uses it and move its store aside first",
        .0.display()
    )]
    NotEmpty(std::path::PathBuf),
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> TarballError {
    move |source| TarballError::Io { context, source }
}

/// Packs the files of `dir` (not its `LOG*` info logs) into `out` as tar + zstd.
/// Written to `<out>.tmp` and renamed when whole; on any error the `.tmp` is removed.
pub fn pack(dir: &Path, out: &Path) -> Result<(), TarballError> {
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
pub fn pack_to<W: std::io::Write>(dir: &Path, w: W) -> Result<W, TarballError> {
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

/// Unpacks the archive `file` into `dir`, which must not exist or be empty.
pub fn unpack(file: &Path, dir: &Path) -> Result<(), TarballError> {
    let f = std::fs::File::open(file).map_err(io(format!("opening {}", file.display())))?;
    unpack_from(f, dir)
}

/// [`unpack`], writing at most `room` bytes: an archive whose entries declare more is
/// refused ([`TarballError::NoRoom`]) before the entry that would pass it is written.
pub fn unpack_within(file: &Path, dir: &Path, room: u64) -> Result<(), TarballError> {
    let f = std::fs::File::open(file).map_err(io(format!("opening {}", file.display())))?;
    unpack_from_within(f, dir, room)
}

/// Unpacks a `.tar.zst` read from `r` into `dir`, which must not exist or be empty.
pub fn unpack_from<R: Read>(r: R, dir: &Path) -> Result<(), TarballError> {
    unpack_from_within(r, dir, u64::MAX)
}

/// [`unpack_from`], writing at most `room` bytes.
pub fn unpack_from_within<R: Read>(r: R, dir: &Path, room: u64) -> Result<(), TarballError> {
    if dir.exists()
        && std::fs::read_dir(dir)
            .map_err(io(format!("reading {}", dir.display())))?
            .next()
            .is_some()
    {
        return Err(TarballError::NotEmpty(dir.to_path_buf()));
    }
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let marker = dir.join(RESTORING_MARKER);
    std::fs::File::create(&marker)
        .and_then(|f| f.sync_all())
        .map_err(io(format!("creating {}", marker.display())))?;
    sync_dir(dir)?;
    let mut dec = zstd::Decoder::new(r).map_err(io("zstd decoder".into()))?;
    dec.window_log_max(WINDOW_LOG_MAX)
        .map_err(io("zstd decoder".into()))?;
    let mut ar = tar::Archive::new(dec);
    let mut n = 0usize;
    let mut written = 0u64;
    for entry in ar.entries().map_err(io("reading tar".into()))? {
        let mut entry = entry.map_err(io("reading tar entry".into()))?;
        n += 1;
        if n > MAX_ENTRIES {
            return Err(TarballError::Refused(format!(
                "the archive has more than {MAX_ENTRIES} entries: not a store"
            )));
        }
        let path = entry
            .path()
            .map_err(io("reading a tar entry's path".into()))?
            .into_owned();
        let kind = entry.header().entry_type();
        let mut parts = path.components();
        let name = match (parts.next(), parts.next()) {
            (Some(std::path::Component::Normal(name)), None) => name.to_owned(),
            _ => {
                return Err(TarballError::Refused(format!(
                "the archive's entry {} is not a file name: a store's archive holds only its files",
                path.display()
            )))
            }
        };
        if !kind.is_file() || name == RESTORING_MARKER {
            return Err(TarballError::Refused(format!(
                "the archive's entry {} is not a regular file",
                path.display()
            )));
        }
        let size = entry
            .header()
            .size()
            .map_err(io("reading a tar entry's size".into()))?;
        written = written.saturating_add(size);
        if written > room {
            return Err(TarballError::NoRoom {
                room,
                detail: format!(
                    "{} files so far declare {written} bytes, {} of them its entry {}",
                    n,
                    size,
                    path.display()
                ),
            });
        }
        let target = dir.join(&name);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&target)
            .map_err(io(format!("creating {}", target.display())))?;
        std::io::copy(&mut entry, &mut out).map_err(io(format!("writing {}", target.display())))?;
        out.sync_all()
            .map_err(io(format!("syncing {}", target.display())))?;
    }
    std::fs::remove_file(&marker).map_err(io(format!("removing {}", marker.display())))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<(), TarballError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("syncing {}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_zst(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        let raw = b.into_inner().unwrap();
        zstd::encode_all(raw.as_slice(), 3).unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        // Written raw: the builder would refuse these names itself.
        h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    /// An archive that declares more than the room given stops before the entry that
    /// would pass it: what was written stays within the room.
    #[test]
    fn an_archive_larger_than_its_room_is_refused_before_it_fills_it() {
        let d = tempfile::tempdir().unwrap();
        let archive = d.path().join("a.tar.zst");
        std::fs::write(
            &archive,
            tar_zst(|b| {
                file(b, "000001.sst", &vec![1u8; 100_000]);
                file(b, "000002.sst", &vec![2u8; 100_000]);
            }),
        )
        .unwrap();
        let out = d.path().join("small");
        let e = unpack_within(&archive, &out, 150_000).unwrap_err();
        assert!(
            matches!(e, TarballError::NoRoom { room: 150_000, .. }),
            "{e}"
        );
        assert!(!out.join("000002.sst").exists());
        let out = d.path().join("roomy");
        unpack_within(&archive, &out, 200_000).unwrap();
        assert_eq!(
            std::fs::read(out.join("000002.sst")).unwrap().len(),
            100_000
        );
    }

    #[test]
    fn a_packed_directory_unpacks_as_it_was_without_its_info_logs() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir(&src).unwrap();
        std::fs::write(src.join("CURRENT"), b"MANIFEST-1\n").unwrap();
        std::fs::write(src.join("000001.sst"), vec![7u8; 100_000]).unwrap();
        std::fs::write(src.join("LOG"), b"info").unwrap();
        pack(&src, &d.path().join("a.tar.zst")).unwrap();
        let out = d.path().join("out");
        unpack(&d.path().join("a.tar.zst"), &out).unwrap();
        let mut names: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["000001.sst", "CURRENT"]);
        assert_eq!(
            std::fs::read(out.join("000001.sst")).unwrap(),
            vec![7u8; 100_000]
        );
        // Not into a directory that holds something.
        let e = unpack(&d.path().join("a.tar.zst"), &out).unwrap_err();
        assert!(matches!(e, TarballError::NotEmpty(_)), "{e:?}");
        assert!(e
            .to_string()
            .contains("is not empty: restore into a new directory"));
    }

    #[test]
    fn hostile_entries_are_refused_and_nothing_lands_outside() {
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("dot-dot", tar_zst(|b| file(b, "../escaped", b"x"))),
            ("absolute", tar_zst(|b| file(b, "/tmp/escaped", b"x"))),
            ("subdirectory", tar_zst(|b| file(b, "sub/file", b"x"))),
            ("the marker", tar_zst(|b| file(b, RESTORING_MARKER, b"x"))),
            (
                "a symlink",
                tar_zst(|b| {
                    let mut h = tar::Header::new_gnu();
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    b.append_link(&mut h, "CURRENT", "/etc/passwd").unwrap();
                }),
            ),
            ("not zstd", b"not an archive at all".to_vec()),
        ];
        for (what, bytes) in cases {
            let d = tempfile::tempdir().unwrap();
            let out = d.path().join("data");
            let r = unpack_from(bytes.as_slice(), &out);
            assert!(r.is_err(), "{what}: accepted");
            // Only the data directory, holding at most its marker and plain files.
            let top: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
            assert_eq!(
                top.len(),
                1,
                "{what}: something landed beside the data directory"
            );
            assert!(
                out.join(RESTORING_MARKER).exists(),
                "{what}: the cut restore is not marked"
            );
        }
    }
}
