//! Backups.
//!
//! - `POST /v1/backups/stream` takes a RocksDB checkpoint (hard links to the immutable
//!   files, beside the store) and answers with it packed as `.tar.zst` while it is packed:
//!   nothing the size of the store is staged on the node's volume. The operator's backup
//!   Job (`ankusa-relay backup pull`) writes it to the backup claim.
//! - `POST /v1/backups` packs a checkpoint as `.tar.zst` in the backup staging directory
//!   and `GET /v1/backups/{id}/archive` serves it (for copies kept on the node; at most
//!   `admin.backup_keep` archives stay).
//!
//! Both accept an admin token or a backup-scope token (which can do nothing else).
//! `ankusa-relay restore` unpacks an archive into an empty data directory. A backup never
//! blocks writers.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http_body_util::StreamBody;
use hyper::body::Frame;

use super::api::{backup_caller, Api, ApiError};
use ankusa_api::admin::BackupCreated;
use ankusa_api::error::ErrorCode;
use ankusa_api_macros::answers;
use ankusa_queue::engine::{tarball, Store, StoreError};

/// A backup id: `b` and the Unix milliseconds it was taken.
pub fn is_backup_id(id: &str) -> bool {
    id.len() > 1 && id.starts_with('b') && id[1..].bytes().all(|c| c.is_ascii_digit())
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Io { context, source }
}

/// Takes a checkpoint of `store`, packs it as `<dir>/<id>.tar.zst`, prunes to `keep`.
/// Returns the id and the archive's size.
pub fn take(store: &Store, dir: &Path, keep: usize) -> Result<(String, u64), StoreError> {
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let id = format!("b{}", ankusa_keyspace::now_ms());
    let ckpt = dir.join(format!("{id}.checkpoint"));
    // RocksDB builds a checkpoint in `<dir>.tmp` and renames it when whole.
    let ckpt_tmp = dir.join(format!("{id}.checkpoint.tmp"));
    let out = dir.join(format!("{id}.tar.zst"));
    let half_packed = out.with_extension("tmp");
    let clean = || {
        let _ = std::fs::remove_dir_all(&ckpt);
        let _ = std::fs::remove_dir_all(&ckpt_tmp);
    };
    clean();
    // Whatever fails (a full volume, say), nothing of this backup stays behind.
    if let Err(e) = store.checkpoint(&ckpt) {
        clean();
        return Err(e);
    }
    let packed = tarball::pack(&ckpt, &out);
    clean();
    if packed.is_err() {
        let _ = std::fs::remove_file(&half_packed);
    }
    packed?;
    let size = std::fs::metadata(&out)
        .map_err(io(format!("reading {}", out.display())))?
        .len();
    prune(dir, keep)?;
    Ok((id, size))
}

/// Records beside archive `<id>.tar.zst` in `dir` the store format it holds
/// (`<id>.format`), for [`prune`] to keep the newest archive of each older format.
pub fn record_format(dir: &Path, id: &str, format: u32) -> Result<(), StoreError> {
    let path = dir.join(format!("{id}.format"));
    std::fs::write(&path, format.to_string()).map_err(io(format!("writing {}", path.display())))
}

/// [`record_format`], and the size of the store the archive unpacks to (`<id>.store-bytes`),
/// what a restore of it needs free on the data volume.
pub fn record_archive(
    dir: &Path,
    id: &str,
    format: u32,
    store_bytes: u64,
) -> Result<(), StoreError> {
    record_format(dir, id, format)?;
    let path = dir.join(format!("{id}.store-bytes"));
    std::fs::write(&path, store_bytes.to_string())
        .map_err(io(format!("writing {}", path.display())))
}

/// The archives in `dir` (`b<ms>.tar.zst`), oldest first, by the id's number.
fn archives_in(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut archives: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .map_err(io(format!("reading {}", dir.display())))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?;
            let id = name.strip_suffix(".tar.zst")?;
            // Ordered by the id's number: names of different lengths do not sort as text.
            is_backup_id(id).then(|| id[1..].parse().ok().map(|n: u64| (n, p.clone())))?
        })
        .collect();
    archives.sort();
    Ok(archives)
}

/// The newest archive of each store format recorded in `dir`, oldest format first.
pub fn newest_by_format(dir: &Path) -> Result<Vec<ankusa_api::node::ArchiveAtFormat>, StoreError> {
    let mut by_format = std::collections::BTreeMap::new();
    for (n, path) in archives_in(dir)? {
        let id = format!("b{n}");
        let Some(f) = recorded_format(dir, &id) else {
            continue;
        };
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let store_bytes = std::fs::read_to_string(dir.join(format!("{id}.store-bytes")))
            .ok()
            .and_then(|t| t.trim().parse().ok());
        by_format.insert(
            f,
            ankusa_api::node::ArchiveAtFormat {
                store_format: f,
                archive: format!("{id}.tar.zst"),
                bytes,
                store_bytes,
            },
        );
    }
    Ok(by_format.into_values().collect())
}

/// The store format recorded beside archive `id` in `dir`, if any.
fn recorded_format(dir: &Path, id: &str) -> Option<u32> {
    std::fs::read_to_string(dir.join(format!("{id}.format")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Deletes the oldest backup archives (`b<ms>.tar.zst`) in `dir` beyond the newest `keep`,
/// but the newest archive of each store format older than the newest archive's, where
/// their formats are recorded ([`record_format`]): what a rollback to an older release
/// restores does not age out with the schedule. Other files are left alone (a backup
/// volume may be shared). Returns how many went.
pub fn prune(dir: &Path, keep: usize) -> Result<usize, StoreError> {
    let mut archives = archives_in(dir)?;
    let format_of = |n: u64| recorded_format(dir, &format!("b{n}"));
    let newest = archives.last().and_then(|(n, _)| format_of(*n));
    let mut older_kept = std::collections::BTreeSet::new();
    let excess = archives.len().saturating_sub(keep);
    let mut removed = 0;
    // Newest first among the excess: the first of each older format stays.
    for (n, old) in archives.drain(..excess).rev() {
        if let (Some(f), Some(top)) = (format_of(n), newest) {
            if f < top && older_kept.insert(f) {
                continue;
            }
        }
        std::fs::remove_file(&old).map_err(io(format!("removing {}", old.display())))?;
        let _ = std::fs::remove_file(dir.join(format!("b{n}.format")));
        let _ = std::fs::remove_file(dir.join(format!("b{n}.store-bytes")));
        removed += 1;
    }
    Ok(removed)
}

/// Removes what backups a stop (a SIGKILL, a crash) cut short left in `dir`: checkpoints
/// of streams (`*.stream-checkpoint`) and of staged backups (`b<ms>.checkpoint`, and
/// `.checkpoint.tmp` while RocksDB builds one), whose
/// hard links would keep deleted files on the volume, and half-packed archives
/// (`b<ms>.tar.tmp`, never renamed to `.tar.zst`). Other files are left alone (a backup
/// volume may be shared). Run at boot, before any backup starts. Returns how many went.
pub fn remove_cut_backups(dir: &Path) -> Result<usize, StoreError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(0);
    };
    let mut n = 0;
    for e in entries.filter_map(Result::ok) {
        let path = e.path();
        let Some(name) = path.file_name().and_then(|x| x.to_str()) else {
            continue;
        };
        let ours = |suffix: &str| name.strip_suffix(suffix).is_some_and(is_backup_id);
        if name.ends_with(".stream-checkpoint")
            || name.ends_with(".stream-checkpoint.tmp")
            || ours(".checkpoint")
            || ours(".checkpoint.tmp")
        {
            std::fs::remove_dir_all(&path).map_err(io(format!("removing {}", path.display())))?;
            n += 1;
        } else if ours(".tar.tmp") {
            std::fs::remove_file(&path).map_err(io(format!("removing {}", path.display())))?;
            n += 1;
        }
    }
    Ok(n)
}

/// `POST /v1/backups` (admin or backup scope).
#[answers]
#[utoipa::path(
    post,
    path = "/v1/backups",
    tag = "admin",
    responses(
        (status = 200, description = "The backup's archive was written to admin.backup_dir"),
        (status = 500, description = "The backup failed (backup_failed); nothing of it was kept", body = ankusa_api::error::ErrorBody),
        crate::http::AuthErrors,
        crate::http::Forbidden,
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
) -> Result<Json<BackupCreated>, ApiError> {
    let c = backup_caller(&api, &headers)?;
    let a = api.clone();
    tokio::task::spawn_blocking(move || {
        let (id, bytes) = take(
            &a.store,
            &a.config.load().backup_dir(),
            a.config.load().admin.backup_keep,
        )
        .map_err(|e| {
            tracing::error!(error = %e, "backup failed");
            ApiError::Failed {
                code: ErrorCode::BackupFailed,
                message: format!("the backup failed and nothing of it was kept: {e}"),
            }
        })?;
        let format = a.store.format()?;
        let audit = a.audit.op(
            &c.name,
            "backup.create",
            None,
            serde_json::json!({ "id": id, "bytes": bytes }),
        );
        ankusa_queue::commit(&a.store, vec![audit], true)?;
        Ok(Json(BackupCreated {
            id,
            bytes,
            store_format: format,
        }))
    })
    .await
    .map_err(|_| ApiError::Internal)?
}

/// A body fed by a reader thread, 64 KiB at a time.
struct Chunks(tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>);

impl futures_core::Stream for Chunks {
    type Item = Result<Frame<Bytes>, std::io::Error>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// `GET /v1/backups/{id}/archive` (admin): the archive, streamed.
#[utoipa::path(
    get,
    path = "/v1/backups/{id}/archive",
    tag = "admin",
    params(("id" = String, Path, description = "A backup id")),
    responses(
        (status = 200, description = "The backup's archive", content_type = "application/zstd", body = Vec<u8>),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
        crate::http::Forbidden,
    ),
    security(("bearer" = []))
)]
pub async fn archive(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
) -> Result<Response, ApiError> {
    backup_caller(&api, &headers)?;
    if !is_backup_id(&id) {
        return Err(ApiError::NotFound("backup"));
    }
    let path = api.config.load().backup_dir().join(format!("{id}.tar.zst"));
    let file = std::fs::File::open(&path).map_err(|_| ApiError::NotFound("backup"))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut file = file;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match file.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if tx
                        .blocking_send(Ok(Frame::data(Bytes::copy_from_slice(&buf[..n]))))
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/zstd".to_owned()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::new(StreamBody::new(Chunks(rx))),
    )
        .into_response())
}

/// A `Write` that sends what is written as body frames (a backup packed as it streams).
struct FrameWriter(tokio::sync::mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>);

impl std::io::Write for FrameWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(Frame::data(Bytes::copy_from_slice(buf))))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client left"))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `POST /v1/backups/stream` (admin or backup scope): a checkpoint, packed into the answer
/// as it is read. The answer's headers carry its id and store format; a cut stream is a
/// broken archive, which `backup pull` refuses.
#[utoipa::path(
    post,
    path = "/v1/backups/stream",
    tag = "admin",
    responses(
        (status = 200, description = "A RocksDB checkpoint as .tar.zst, streamed while it is packed", content_type = "application/zstd", body = Vec<u8>),
        (status = 500, description = "The checkpoint could not be taken", body = ankusa_api::error::ErrorBody),
        crate::http::AuthErrors,
        crate::http::Forbidden,
    ),
    security(("bearer" = []))
)]
pub async fn stream(State(api): State<Arc<Api>>, headers: HeaderMap) -> Result<Response, ApiError> {
    let c = backup_caller(&api, &headers)?;
    let id = format!("b{}", ankusa_keyspace::now_ms());
    let dir = api.config.load().backup_dir();
    let ckpt = dir.join(format!("{id}.stream-checkpoint"));
    let a = api.clone();
    let (id2, ckpt2) = (id.clone(), ckpt.clone());
    // The checkpoint first: a failure is an error status, not a cut stream.
    let format = tokio::task::spawn_blocking(move || -> Result<u32, ApiError> {
        let failed = |e: StoreError| {
            tracing::error!(error = %e, "backup stream failed");
            ApiError::Failed {
                code: ErrorCode::BackupFailed,
                message: format!("the backup failed and nothing of it was kept: {e}"),
            }
        };
        std::fs::create_dir_all(&dir)
            .map_err(io(format!("creating {}", dir.display())))
            .map_err(failed)?;
        // RocksDB builds a checkpoint in `<dir>.tmp`; whatever fails, neither stays.
        let clean = || {
            let _ = std::fs::remove_dir_all(&ckpt2);
            let _ = std::fs::remove_dir_all(ckpt2.with_extension("stream-checkpoint.tmp"));
        };
        clean();
        if let Err(e) = a.store.checkpoint(&ckpt2) {
            clean();
            return Err(failed(e));
        }
        let audit = a.audit.op(
            &c.name,
            "backup.stream",
            None,
            serde_json::json!({ "id": id2 }),
        );
        ankusa_queue::commit(&a.store, vec![audit], true)?;
        Ok(a.store.format()?)
    })
    .await
    .map_err(|_| ApiError::Internal)??;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::task::spawn_blocking(move || {
        let err = tx.clone();
        if let Err(e) = tarball::pack_to(&ckpt, FrameWriter(tx)) {
            tracing::warn!(error = %e, "backup stream stopped");
            let _ = err.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
        let _ = std::fs::remove_dir_all(&ckpt);
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/zstd".to_owned()),
            (header::HeaderName::from_static("ankusa-backup-id"), id),
            (
                header::HeaderName::from_static("ankusa-store-format"),
                format.to_string(),
            ),
        ],
        Body::new(StreamBody::new(Chunks(rx))),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn prune_keeps_the_newest_by_number_and_only_touches_backups() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "b999.tar.zst",
            "b1000.tar.zst",
            "b1001.tar.zst",
            "other.tar.zst",
            "b12.txt",
        ] {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        assert_eq!(prune(dir.path(), 2).unwrap(), 1);
        let left = names(dir.path());
        // b999 is the oldest although it sorts last as text.
        assert_eq!(
            left,
            ["b1000.tar.zst", "b1001.tar.zst", "b12.txt", "other.tar.zst"]
        );
        assert_eq!(prune(dir.path(), 5).unwrap(), 0);
    }

    #[test]
    fn prune_keeps_the_newest_archive_of_each_older_store_format() {
        let dir = tempfile::tempdir().unwrap();
        // Format 1, then 2 (an upgrade), then 3 (another); b5 has no format recorded.
        for (n, format) in [
            (1, Some(1)),
            (2, Some(1)),
            (3, Some(2)),
            (4, Some(2)),
            (5, None),
        ]
        .into_iter()
        .chain((6..=9).map(|n| (n, Some(3))))
        {
            std::fs::write(dir.path().join(format!("b{n}.tar.zst")), "x").unwrap();
            if let Some(f) = format {
                record_archive(dir.path(), &format!("b{n}"), f, 100 + n).unwrap();
            }
        }
        assert_eq!(prune(dir.path(), 2).unwrap(), 5);
        let left = names(dir.path());
        // The two newest, and format 1's and 2's newest, each with its record.
        assert_eq!(
            left,
            [
                "b2.format",
                "b2.store-bytes",
                "b2.tar.zst",
                "b4.format",
                "b4.store-bytes",
                "b4.tar.zst",
                "b8.format",
                "b8.store-bytes",
                "b8.tar.zst",
                "b9.format",
                "b9.store-bytes",
                "b9.tar.zst"
            ]
        );
        // What a rollback to each format would restore.
        let newest: Vec<(u32, String, Option<u64>)> = newest_by_format(dir.path())
            .unwrap()
            .into_iter()
            .map(|a| (a.store_format, a.archive, a.store_bytes))
            .collect();
        assert_eq!(
            newest,
            [
                (1, "b2.tar.zst".to_owned(), Some(102)),
                (2, "b4.tar.zst".to_owned(), Some(104)),
                (3, "b9.tar.zst".to_owned(), Some(109))
            ]
        );
    }
}
