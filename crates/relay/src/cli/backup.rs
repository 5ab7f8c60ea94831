//! `backup pull | offline` and `restore`: store archives, taken from a node or a closed
//! store, and unpacked into an empty data directory.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ankusa_queue::engine::{OpenOptions, Store};
use anyhow::Context;

use super::store::open_existing;

/// Where a restore records the archive it restored: beside the data directory, so that a
/// restore run again (a retried Job) finds its own work done.
fn restored_marker(data: &Path) -> PathBuf {
    let name = data
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    data.with_file_name(format!(".{name}.restored-from"))
}

/// Where a restore keeps its report beside the data directory, for a run again to give.
fn report_beside(data: &Path) -> PathBuf {
    let marker = restored_marker(data);
    marker.with_file_name(format!(
        "{}.report.json",
        marker.file_name().unwrap_or_default().to_string_lossy()
    ))
}

/// The replaced store at `data`, opened to inspect (read-only): its next hook seq, and the
/// hooks it holds from seq `from` on (those a backup up to `from` lacks).
fn replaced_counts(data: &Path, from: u64) -> anyhow::Result<(u64, u64)> {
    let store = Store::open(data, &OpenOptions::inspect())
        .with_context(|| format!("opening {}", data.display()))?;
    let held = ankusa_queue::writer::hooks_from(&store, ankusa_keyspace::Seq(from))?;
    Ok((ankusa_queue::writer::next_seq(&store)?, held))
}

/// Writes `report` to `to` (and beside `data`, for a run again), and says it.
fn write_report(
    report: &ankusa_api::node::NodeRestoreReport,
    data: &Path,
    to: Option<&Path>,
) -> anyhow::Result<()> {
    match (report.lost_hooks, &report.replaced_unreadable) {
        (Some(n), _) => println!(
            "the replaced store held {n} hooks acked after {} that the restored store lacks (it had handed out seqs up to {}, the backup up to {})",
            report.archive,
            report.replaced_seq.unwrap_or_default(),
            report.backup_seq
        ),
        (None, Some(why)) => println!(
            "the hooks acked after {} cannot be counted: {why}",
            report.archive
        ),
        (None, None) => {}
    }
    let text = serde_json::to_string(report)?;
    std::fs::write(report_beside(data), &text)?;
    if let Some(to) = to {
        std::fs::write(to, &text).with_context(|| format!("writing {}", to.display()))?;
    }
    Ok(())
}

/// Unpacks a backup into `data` and checks the result opens (the format guard included).
/// `from` is an archive, or a node's backup directory: its newest archive (at most
/// `format_at_most`). With `replace`, a store at `data` is moved aside first; with
/// `report`, what was found is written there as JSON (the hooks the replaced store had
/// acked after the backup, when it can be read). The restore is recorded beside `data`
/// (the archive, and `once` when given): a run again that would record the same finds its
/// work done.
/// What a restore of `name` records beside the data directory (with `once`, its name too).
fn restore_record(name: &str, once: Option<&str>) -> String {
    match once {
        Some(token) => format!("{name}\n{token}"),
        None => name.to_owned(),
    }
}

/// Whether the restore recorded as `record` already ran into `data` (a retried Job): then
/// says so, and gives the report it kept to `report`.
fn done_before(
    data: &Path,
    name: &str,
    record: &str,
    report: Option<&Path>,
) -> anyhow::Result<bool> {
    if std::fs::read_to_string(restored_marker(data))
        .ok()
        .as_deref()
        != Some(record)
    {
        return Ok(false);
    }
    let store = Store::open(data, &OpenOptions::inspect())
        .with_context(|| format!("checking the restored store at {}", data.display()))?;
    println!(
        "{} holds {name} already, restored by this restore before (store format {}): nothing to do",
        data.display(),
        store.format()?
    );
    if let (Some(to), Ok(text)) = (report, std::fs::read_to_string(report_beside(data))) {
        std::fs::write(to, text).with_context(|| format!("writing {}", to.display()))?;
    }
    Ok(true)
}

/// `restore --from s3://…`: the newest backup under the prefix (at most
/// `format_at_most`) downloaded beside `data`, every file checked, opened (and given a
/// lineage of its own), then put at `data` as an archive's restore would be: `data` must
/// be empty unless `replace` moves its store aside, and `report` says what that store held
/// that the backup lacks. The restore is recorded beside `data` (the location, and `once`
/// when given): a run again that would record the same (a retried Job) finds its work
/// done. A download killed half way is started again.
pub(super) fn restore_from_bucket(
    from: &str,
    bucket: &super::objstore::Bucket,
    data: &Path,
    format_at_most: Option<u32>,
    replace: bool,
    report: Option<&Path>,
    once: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let record = restore_record(from, once);
    if (replace || once.is_some()) && done_before(data, from, &record, report)? {
        return Ok(ExitCode::SUCCESS);
    }
    anyhow::ensure!(
        replace || std::fs::read_dir(data).map_or(true, |mut d| d.next().is_none()),
        "{} is not empty",
        data.display()
    );
    let staged = data.with_file_name(format!(
        ".{}.from-bucket",
        data.file_name().unwrap_or_default().to_string_lossy()
    ));
    if staged.exists() {
        // A download killed half way.
        std::fs::remove_dir_all(&staged)
            .with_context(|| format!("clearing {}", staged.display()))?;
    }
    let m = super::objstore::restore(from, bucket, &staged, format_at_most)?;
    crate::objstore::renew_lineage(&staged)?;
    let format = open_existing(&staged, false)?.format()?;
    println!(
        "downloaded backup {} ({} files, store format {format}) from {from}",
        m.id,
        m.files.len(),
    );
    install(
        data,
        from,
        m.id.clone(),
        &record,
        Unpack::Staged(staged),
        replace,
        report,
    )
}

pub(super) fn restore(
    from: &Path,
    data: &Path,
    format_at_most: Option<u32>,
    replace: bool,
    report: Option<&Path>,
    once: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let (archive, staged) = if from.is_dir() {
        pick_archive(from, data, format_at_most)?
    } else {
        anyhow::ensure!(
            format_at_most.is_none(),
            "--format-at-most chooses among the archives of a directory; {} is one archive",
            from.display()
        );
        (from.to_path_buf(), None)
    };
    let name = archive.display().to_string();
    let record = restore_record(&name, once);
    if replace && done_before(data, &name, &record, report)? {
        if let Some(s) = &staged {
            let _ = std::fs::remove_dir_all(s);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let label = archive
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let unpack = match staged {
        Some(s) => Unpack::Staged(s),
        None => Unpack::Archive(&archive),
    };
    install(data, &name, label, &record, unpack, replace, report)
}

/// What a restore puts at the data directory: a store unpacked (and opened) beside it, or
/// an archive to unpack there.
enum Unpack<'a> {
    Staged(PathBuf),
    Archive(&'a Path),
}

/// The end of a restore: the store at `data` moved aside (with `replace`), the backup put
/// in its place and opened, the restore recorded (`record`) and, with `report`, what the
/// replaced store held that the backup lacks. `name` says where the backup came from;
/// `label` is the backup's own name in the report.
fn install(
    data: &Path,
    name: &str,
    label: String,
    record: &str,
    unpack: Unpack<'_>,
    replace: bool,
    report: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let marker = restored_marker(data);
    let occupied = std::fs::read_dir(data).is_ok_and(|mut d| d.next().is_some());
    let mut moved_to = None;
    if occupied && replace {
        let aside = data.with_file_name(format!(
            "{}.replaced-{}",
            data.file_name().unwrap_or_default().to_string_lossy(),
            ankusa_keyspace::now_ms()
        ));
        std::fs::rename(data, &aside)
            .with_context(|| format!("moving {} aside to {}", data.display(), aside.display()))?;
        println!(
            "moved the store at {} aside to {}",
            data.display(),
            aside.display()
        );
        moved_to = Some(aside);
    }
    match unpack {
        // Already unpacked (and opened) while choosing: moved into place.
        Unpack::Staged(s) => {
            if let Some(parent) = data.parent() {
                std::fs::create_dir_all(parent)?;
            }
            if data.is_dir() && !occupied {
                std::fs::remove_dir(data)?;
            }
            std::fs::rename(&s, data)
                .with_context(|| format!("moving the unpacked {name} to {}", data.display()))?;
        }
        Unpack::Archive(archive) => ankusa_queue::engine::tarball::unpack(archive, data)
            .with_context(|| format!("restoring {name} into {}", data.display()))?,
    }
    // A copy writes files of its own from here on: its object-storage backups are not its
    // origin's (an archive of a store that had pushed carries its lineage).
    if data.join(crate::objstore::LINEAGE).exists() {
        crate::objstore::renew_lineage(data)?;
    }
    let store = Store::open(data, &OpenOptions::inspect())
        .with_context(|| format!("checking the restored store at {}", data.display()))?;
    let format = store.format()?;
    let backup_seq = match report {
        Some(_) => ankusa_queue::writer::next_seq(&store)
            .with_context(|| format!("reading the restored store's seq (store format {format})"))?,
        None => 0,
    };
    drop(store);
    std::fs::write(&marker, record)
        .with_context(|| format!("recording the restore in {}", marker.display()))?;
    println!(
        "restored {name} into {} (store format {format})",
        data.display()
    );
    if report.is_some() {
        let archive = label;
        // The hooks only the replaced store had: those past the backup's seq it still
        // held (acked after the backup, not yet delivered and reclaimed).
        let replaced = match &moved_to {
            Some(aside) => replaced_counts(aside, backup_seq).map_err(|e| format!("{e:#}")),
            None => Err("no store was at the data directory".to_owned()),
        };
        let r = match replaced {
            Ok((seq, held)) => ankusa_api::node::NodeRestoreReport {
                archive,
                backup_seq,
                replaced_seq: Some(seq),
                lost_hooks: Some(held),
                replaced_unreadable: None,
            },
            Err(why) => ankusa_api::node::NodeRestoreReport {
                archive,
                backup_seq,
                replaced_unreadable: Some(why),
                ..Default::default()
            },
        };
        write_report(&r, data, report)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The archive of backup directory `dir` to restore: the newest, or with `format_at_most`
/// the newest whose store is at most that format — found by unpacking each, newest first,
/// beside `data` (the one chosen stays unpacked there: the staged directory returned).
fn pick_archive(
    dir: &Path,
    data: &Path,
    format_at_most: Option<u32>,
) -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
    let mut archives: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name.strip_suffix(".tar.zst")?;
            crate::admin::backups::is_backup_id(id)
                .then(|| id[1..].parse().ok().map(|ms| (ms, e.path())))?
        })
        .collect();
    archives.sort();
    anyhow::ensure!(
        !archives.is_empty(),
        "no backup archive (b<ms>.tar.zst) in {}",
        dir.display()
    );
    let Some(max) = format_at_most else {
        return Ok((archives.pop().map(|(_, p)| p).unwrap_or_default(), None));
    };
    let staged = data.with_file_name(format!(
        ".{}.staged",
        data.file_name().unwrap_or_default().to_string_lossy()
    ));
    let mut seen = Vec::new();
    for (_, archive) in archives.iter().rev() {
        let _ = std::fs::remove_dir_all(&staged);
        ankusa_queue::engine::tarball::unpack(archive, &staged)
            .with_context(|| format!("unpacking {}", archive.display()))?;
        let format = Store::open(&staged, &OpenOptions::inspect())
            .with_context(|| format!("opening {}", archive.display()))?
            .format()?;
        if format <= max {
            return Ok((archive.clone(), Some(staged)));
        }
        seen.push(format!(
            "{} (format {format})",
            archive.file_name().unwrap_or_default().to_string_lossy()
        ));
    }
    let _ = std::fs::remove_dir_all(&staged);
    anyhow::bail!(
        "no archive in {} is at store format {max} or lower: {}",
        dir.display(),
        seen.join(", ")
    )
}

/// Streams a backup from the node (`POST /v1/backups/stream`; a node without it, an older
/// release, is asked the old way: `POST /v1/backups`, then `GET .../archive`) into
/// `to/<id>.tar.zst`, checking it opens before it takes that name.
pub(super) fn backup_pull(
    from: &str,
    token: &str,
    to: &Path,
    keep: Option<u64>,
    idle: std::time::Duration,
    report: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    use http_body_util::BodyExt;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let client = crate::http::client(idle)?;
        let base = from.trim_end_matches('/');
        let auth = format!("Bearer {token}");
        let request = |method: hyper::Method, path: String| {
            hyper::Request::builder()
                .method(method)
                .uri(format!("{base}{path}"))
                .header("authorization", &auth)
                .body(http_body_util::Full::new(bytes::Bytes::new()))
        };
        let within = |what: &'static str| {
            move |_| anyhow::anyhow!("{what}: the node sent nothing for {} s", idle.as_secs())
        };
        let resp = tokio::time::timeout(
            idle,
            client.request(request(hyper::Method::POST, "/v1/backups/stream".into())?),
        )
        .await
        .map_err(within("asking for a backup"))?
        .context("asking for a backup")?;
        let (id, resp) = if resp.status() == hyper::StatusCode::NOT_FOUND {
            // An older node: it packs the archive on its volume, then serves it.
            let resp = tokio::time::timeout(
                idle,
                client.request(request(hyper::Method::POST, "/v1/backups".into())?),
            )
            .await
            .map_err(within("asking for a backup"))?
            .context("asking for a backup")?;
            let status = resp.status();
            let body = tokio::time::timeout(idle, resp.into_body().collect())
                .await
                .map_err(within("reading the answer"))??
                .to_bytes();
            anyhow::ensure!(
                status.is_success(),
                "POST /v1/backups answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
            let created: ankusa_api::admin::BackupCreated =
                serde_json::from_slice(&body).context("the answer is not a backup's")?;
            let id = created.id;
            anyhow::ensure!(
                crate::admin::backups::is_backup_id(&id),
                "bad backup id {id:?}"
            );
            let resp = tokio::time::timeout(
                idle,
                client.request(request(
                    hyper::Method::GET,
                    format!("/v1/backups/{id}/archive"),
                )?),
            )
            .await
            .map_err(within("fetching the archive"))?
            .context("fetching the archive")?;
            (id, resp)
        } else {
            let id = resp
                .headers()
                .get("ankusa-backup-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            (id, resp)
        };
        if !resp.status().is_success() {
            let status = resp.status();
            let body = tokio::time::timeout(idle, resp.into_body().collect())
                .await
                .map(|b| b.map(|b| b.to_bytes()).unwrap_or_default())
                .unwrap_or_default();
            anyhow::bail!(
                "the node answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        anyhow::ensure!(
            crate::admin::backups::is_backup_id(&id),
            "bad backup id {id:?}"
        );
        std::fs::create_dir_all(to)?;
        let out = to.join(format!("{id}.tar.zst"));
        let tmp = to.join(format!("{id}.tar.zst.part"));
        let mut body = resp.into_body();
        let received = async {
            let mut file = std::fs::File::create(&tmp)?;
            let mut bytes = 0u64;
            loop {
                let frame = tokio::time::timeout(idle, body.frame())
                    .await
                    .map_err(within("receiving the archive"))?;
                let Some(frame) = frame else { break };
                if let Ok(data) = frame.context("receiving the archive")?.into_data() {
                    std::io::Write::write_all(&mut file, &data)
                        .with_context(|| format!("writing {}", tmp.display()))?;
                    bytes += data.len() as u64;
                }
            }
            file.sync_all()?;
            anyhow::Ok(bytes)
        }
        .await;
        // A cut transfer or a full destination: nothing of it stays.
        let bytes = match received {
            Ok(b) => b,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let Checked {
            format,
            store_bytes,
        } = check_archive(&tmp, to, &id)?;
        std::fs::rename(&tmp, &out)?;
        crate::admin::backups::record_archive(to, &id, format, store_bytes)?;
        println!(
            "backup {id}: {bytes} bytes, store format {format}, written to {}",
            out.display()
        );
        prune_to(to, keep)?;
        report_run(report, to, &id, bytes, format)
    })?;
    Ok(ExitCode::SUCCESS)
}

/// What the check of an archive found: its store's format and size unpacked.
pub(super) struct Checked {
    pub format: u32,
    pub store_bytes: u64,
}

/// Unpacks `archive` beside it and opens the result (the format guard included): a cut or
/// corrupt archive is refused before it is called a backup.
pub(super) fn check_archive(archive: &Path, dir: &Path, id: &str) -> anyhow::Result<Checked> {
    let check = dir.join(format!("{id}.check"));
    let _ = std::fs::remove_dir_all(&check);
    let opened = ankusa_queue::engine::tarball::unpack(archive, &check)
        .map_err(anyhow::Error::from)
        .and_then(|()| {
            let store_bytes = tree_bytes(&check);
            let format = Store::open(&check, &OpenOptions::inspect())?.format()?;
            Ok(Checked {
                format,
                store_bytes,
            })
        });
    let _ = std::fs::remove_dir_all(&check);
    if opened.is_err() {
        let _ = std::fs::remove_file(archive);
    }
    opened.context("the archive is not a whole store")
}

/// The bytes of every file under `dir`.
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

/// `--keep`: only the newest N archives stay in `to`.
pub(super) fn prune_to(to: &Path, keep: Option<u64>) -> anyhow::Result<()> {
    if let Some(keep) = keep {
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        let removed = crate::admin::backups::prune(to, keep)?;
        if removed > 0 {
            println!("removed {removed} older backup(s), keeping {keep}");
        }
    }
    Ok(())
}

/// Packs a closed store into `to/<id>.tar.zst` and checks the archive opens.
pub(super) fn backup_offline(
    data: &Path,
    to: &Path,
    keep: Option<u64>,
    report: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    // Opening it read-only first: a directory that is not a store (or is open elsewhere
    // and mid-write) is refused before anything is written.
    let format = open_existing(data, true)?.format()?;
    std::fs::create_dir_all(to)?;
    let id = format!("b{}", ankusa_keyspace::now_ms());
    let out = to.join(format!("{id}.tar.zst"));
    let tmp = to.join(format!("{id}.tar.zst.part"));
    ankusa_queue::engine::tarball::pack(data, &tmp)
        .with_context(|| format!("packing {}", data.display()))?;
    let checked = check_archive(&tmp, to, &id)?;
    std::fs::rename(&tmp, &out)?;
    crate::admin::backups::record_archive(to, &id, checked.format, checked.store_bytes)?;
    let bytes = std::fs::metadata(&out)?.len();
    println!(
        "backup {id}: {bytes} bytes, store format {format}, written to {}",
        out.display()
    );
    prune_to(to, keep)?;
    report_run(report, to, &id, bytes, checked.format)?;
    Ok(ExitCode::SUCCESS)
}

/// `--report`: the archive written and the room left on `to`'s volume after the prune.
fn report_run(
    report: Option<&Path>,
    to: &Path,
    id: &str,
    bytes: u64,
    store_format: u32,
) -> anyhow::Result<()> {
    let Some(file) = report else { return Ok(()) };
    let space = ankusa_queue::engine::volume_space(to);
    let r = ankusa_api::node::BackupRunReport {
        archive: format!("{id}.tar.zst"),
        bytes,
        store_format,
        volume_free_bytes: space.map(|v| v.free),
        volume_bytes: space.map(|v| v.total),
        formats: crate::admin::backups::newest_by_format(to)?,
    };
    std::fs::write(file, serde_json::to_string(&r)?)
        .with_context(|| format!("writing the report to {}", file.display()))
}
