//! `backup pull | offline` and `restore`: store archives, taken from a node or a closed
//! store, and unpacked into an empty data directory.

use super::store::open_existing;
use super::*;

/// Unpacks a backup into `data` and checks the result opens (the format guard included).
pub(super) fn restore(from: &Path, data: &Path) -> anyhow::Result<ExitCode> {
    ankusa_store::tarball::unpack(from, data)
        .with_context(|| format!("restoring {} into {}", from.display(), data.display()))?;
    let store = Store::open(data, &OpenOptions::inspect())
        .with_context(|| format!("checking the restored store at {}", data.display()))?;
    println!(
        "restored {} into {} (store format {})",
        from.display(),
        data.display(),
        store.format()?
    );
    Ok(ExitCode::SUCCESS)
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
            let v: serde_json::Value = serde_json::from_slice(&body)?;
            let id = v["id"]
                .as_str()
                .context("no backup id in the answer")?
                .to_owned();
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
        let format = check_archive(&tmp, to, &id)?;
        std::fs::rename(&tmp, &out)?;
        println!(
            "backup {id}: {bytes} bytes, store format {format}, written to {}",
            out.display()
        );
        prune_to(to, keep)?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Unpacks `archive` beside it and opens the result (the format guard included): a cut or
/// corrupt archive is refused before it is called a backup. Returns the store's format.
pub(super) fn check_archive(archive: &Path, dir: &Path, id: &str) -> anyhow::Result<u32> {
    let check = dir.join(format!("{id}.check"));
    let _ = std::fs::remove_dir_all(&check);
    let opened = ankusa_store::tarball::unpack(archive, &check)
        .map_err(anyhow::Error::from)
        .and_then(|()| Ok(Store::open(&check, &OpenOptions::inspect())?.format()?));
    let _ = std::fs::remove_dir_all(&check);
    if opened.is_err() {
        let _ = std::fs::remove_file(archive);
    }
    opened.context("the archive is not a whole store")
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
) -> anyhow::Result<ExitCode> {
    // Opening it read-only first: a directory that is not a store (or is open elsewhere
    // and mid-write) is refused before anything is written.
    let format = open_existing(data, true)?.format()?;
    std::fs::create_dir_all(to)?;
    let id = format!("b{}", ankusa_keyspace::now_ms());
    let out = to.join(format!("{id}.tar.zst"));
    let tmp = to.join(format!("{id}.tar.zst.part"));
    ankusa_store::tarball::pack(data, &tmp)
        .with_context(|| format!("packing {}", data.display()))?;
    check_archive(&tmp, to, &id)?;
    std::fs::rename(&tmp, &out)?;
    let bytes = std::fs::metadata(&out)?.len();
    println!(
        "backup {id}: {bytes} bytes, store format {format}, written to {}",
        out.display()
    );
    prune_to(to, keep)?;
    Ok(ExitCode::SUCCESS)
}
