//! Backups in S3-compatible object storage: what a running node pushes every
//! `backup.object_store.interval_ms` ([`schedule`]), `backup push --data DIR --to
//! s3://bucket/prefix` for a closed store, and `restore --from s3://bucket/prefix`.
//!
//! A store's table and blob files (`*.sst`, `*.blob`) never change once written, and their
//! names are unique within a store (RocksDB's file numbers): each is uploaded once, under
//! `<prefix>/files/<lineage>/<name>`, and a later backup of the same store uploads only the
//! files written since. The lineage is an id of the store's own, in `.backup-lineage` in
//! its directory (made by its first push; not RocksDB's identity, which a copy keeps): a
//! restored store gets a new one, since from its backup on it writes files of its own
//! under the same numbers as files its origin may have written (and pushed) after it.
//! The rest of a checkpoint (`MANIFEST-*`, `CURRENT`, `OPTIONS-*`: small) goes by its
//! content, `<prefix>/files/sha256/<hex>` (backups whose options did not change share one
//! copy), and last the backup's manifest,
//! `<prefix>/backups/<id>/manifest.json`, which names every file of the backup with its
//! size and SHA-256: a backup exists once its manifest does. A restore downloads the files
//! a manifest names, streaming, checks each one's size and checksum, and refuses a
//! manifest whose files the bucket does not hold (naming them).
//!
//! Credentials come from the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, or a web identity's or a container's), the instance metadata
//! service only when the [`Target`] says so, and otherwise none: requests go unsigned. The
//! endpoint, region and a CA bundle come from the [`Target`].
//! Requests are path-style (`<endpoint>/<bucket>/…`), which every S3-compatible server
//! takes. Memory is bounded whatever the store's size: a file goes up in parts of
//! [`PART`], at most two in flight, and comes down as a stream.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use futures_util::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use sha2::Digest;

use ankusa_queue::engine::Store;
use anyhow::Context;
use std::path::Path;

pub mod schedule;

/// The file in a store's directory naming its backup lineage (see the module's docs).
pub const LINEAGE: &str = ".backup-lineage";

/// The lineage of the store at `data`, made now if it has none.
fn lineage(data: &Path) -> anyhow::Result<String> {
    let path = data.join(LINEAGE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let id = text.trim();
        if !id.is_empty() {
            return Ok(id.to_owned());
        }
    }
    renew_lineage(data)
}

/// Gives the store at `data` a new lineage (128 random bits, hex): a store just restored
/// (from an archive or a bucket), or one pushed for the first time. The lineage.
pub fn renew_lineage(data: &Path) -> anyhow::Result<String> {
    let id = ankusa_keyspace::hex(&rand::random::<[u8; 16]>());
    let path = data.join(LINEAGE);
    std::fs::write(&path, format!("{id}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(id)
}

/// Files up to this size go in one request; larger ones in parts of this size (the memory
/// a push or a restore holds, whatever the store's size).
const PART: usize = 8 << 20;

/// How to reach the bucket (the location itself is a URL, `s3://bucket/prefix`).
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// The server's URL (an S3-compatible server's); `None`: AWS S3 in `region`.
    pub endpoint: Option<String>,
    pub region: String,
    /// Allow an `http://` endpoint.
    pub allow_http: bool,
    /// PEM certificates trusted besides the system's.
    pub ca_file: Option<std::path::PathBuf>,
    /// Without credentials in the environment, ask the cloud's instance metadata service
    /// for them; otherwise requests go unsigned (anonymous).
    pub instance_metadata: bool,
    /// The most a push uploads per second (`None`: as fast as it goes).
    pub max_bytes_per_second: Option<u64>,
}

impl Target {
    /// The node's: from `backup.object_store`.
    pub fn of(c: &ankusa_config::ObjectStoreConfig) -> Target {
        Target {
            endpoint: c.endpoint.clone(),
            region: c.region.clone(),
            allow_http: c.allow_http(),
            ca_file: c.ca_file.clone(),
            instance_metadata: c.instance_metadata,
            max_bytes_per_second: Some(c.max_bytes_per_second).filter(|b| *b > 0),
        }
    }
}

/// `s3://bucket/prefix` split: the bucket and the prefix (no slashes at its ends).
pub fn parse_location(url: &str) -> anyhow::Result<(String, String)> {
    ankusa_config::s3_location(url).map_err(anyhow::Error::msg)
}

/// One file of a backup.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileEntry {
    /// Its name in the store's directory.
    pub name: String,
    /// Its key in the bucket.
    pub key: String,
    pub size: u64,
    /// SHA-256 of its bytes, hex.
    pub sha256: String,
}

/// A backup's manifest (`<prefix>/backups/<id>/manifest.json`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub id: String,
    pub created_ms: u64,
    /// The store's backup lineage: its files' names are unique within it.
    pub lineage: String,
    pub store_format: u32,
    pub files: Vec<FileEntry>,
}

/// A bucket and a prefix in it, open.
pub struct Remote {
    store: Box<dyn ObjectStore>,
    bucket: String,
    prefix: String,
    /// `max_bytes_per_second`, and since when and how much this push has uploaded.
    limit: Option<u64>,
    paced: std::sync::Mutex<(std::time::Instant, u64)>,
}

impl Remote {
    pub fn open(url: &str, t: &Target) -> anyhow::Result<Remote> {
        let (bucket, prefix) = parse_location(url)?;
        crate::telemetry::install_rustls_provider();
        let mut options = object_store::ClientOptions::new().with_allow_http(t.allow_http);
        if let Some(ca) = &t.ca_file {
            let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
            let certs = object_store::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("{} holds no PEM certificate", ca.display()))?;
            anyhow::ensure!(
                !certs.is_empty(),
                "{} holds no PEM certificate",
                ca.display()
            );
            for c in certs {
                options = options.with_root_certificate(c);
            }
        }
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&bucket)
            .with_region(&t.region)
            .with_virtual_hosted_style_request(false)
            .with_client_options(options);
        // No credential in the environment (keys, a web identity, a container's): the
        // instance metadata service only when asked for, never a request to it otherwise.
        let from_env = [
            "AWS_ACCESS_KEY_ID",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        ]
        .iter()
        .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()));
        if !from_env && !t.instance_metadata {
            builder = builder.with_skip_signature(true);
        }
        if let Some(e) = &t.endpoint {
            builder = builder.with_endpoint(e);
        }
        let store = builder
            .build()
            .with_context(|| format!("the object store for {url}"))?;
        Ok(Remote {
            store: Box::new(store),
            bucket,
            prefix,
            limit: t.max_bytes_per_second.filter(|l| *l > 0),
            paced: std::sync::Mutex::new((std::time::Instant::now(), 0)),
        })
    }

    /// A push begins: its pace counts from now.
    fn start_pacing(&self) {
        *self.paced.lock().unwrap_or_else(|p| p.into_inner()) = (std::time::Instant::now(), 0);
    }

    /// Waits until `n` more bytes keep this push within `max_bytes_per_second`.
    async fn pace(&self, n: usize) {
        let Some(limit) = self.limit else { return };
        let due = {
            let mut g = self.paced.lock().unwrap_or_else(|p| p.into_inner());
            let due = g.0 + std::time::Duration::from_secs_f64(g.1 as f64 / limit as f64);
            g.1 += n as u64;
            due
        };
        tokio::time::sleep_until(due.into()).await;
    }

    fn key(&self, rest: &str) -> Key {
        if self.prefix.is_empty() {
            Key::from(rest)
        } else {
            Key::from(format!("{}/{rest}", self.prefix))
        }
    }

    /// Backup `id`'s manifest: the backup exists once it does.
    fn manifest_key(&self, id: &str) -> Key {
        self.key(&format!("backups/{id}/manifest.json"))
    }

    pub fn url(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    /// Every key under `rest` with its size.
    async fn list(&self, rest: &str) -> anyhow::Result<BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        let mut s = self.store.list(Some(&self.key(rest)));
        while let Some(m) = s.next().await {
            let m = m.with_context(|| format!("listing {}/{rest}", self.url()))?;
            out.insert(m.location.to_string(), m.size);
        }
        Ok(out)
    }

    /// Deletes `key` (one already gone is fine: a prune run again).
    async fn delete(&self, key: &str) -> anyhow::Result<()> {
        match self.store.delete(&Key::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("deleting {key}")),
        }
    }

    /// The manifests under the prefix, oldest first.
    async fn manifests(&self) -> anyhow::Result<Vec<Manifest>> {
        let mut out = Vec::new();
        for key in self.list("backups").await?.into_keys() {
            if !key.ends_with("/manifest.json") {
                continue;
            }
            let bytes = self
                .store
                .get(&Key::from(key.as_str()))
                .await
                .with_context(|| format!("reading {key}"))?
                .bytes()
                .await?;
            let m: Manifest = serde_json::from_slice(&bytes)
                .with_context(|| format!("{key} is not a backup manifest"))?;
            out.push(m);
        }
        out.sort_by_key(|m| (m.created_ms, m.id.clone()));
        Ok(out)
    }

    /// Uploads `path` as `key`, streaming, and returns its SHA-256.
    async fn upload(&self, path: &Path, key: &Key) -> anyhow::Result<String> {
        let mut f = std::fs::File::open(path)?;
        let size = f.metadata()?.len() as usize;
        let mut hash = sha2::Sha256::new();
        if size <= PART {
            let mut buf = Vec::with_capacity(size);
            f.read_to_end(&mut buf)?;
            hash.update(&buf);
            self.pace(buf.len()).await;
            self.store
                .put(key, PutPayload::from(buf))
                .await
                .with_context(|| format!("uploading {key}"))?;
        } else {
            let upload = self
                .store
                .put_multipart(key)
                .await
                .with_context(|| format!("uploading {key}"))?;
            let mut w = WriteMultipart::new_with_chunk_size(upload, PART);
            let mut buf = vec![0u8; PART];
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                hash.update(&buf[..n]);
                // At most two parts in flight: memory stays bounded.
                w.wait_for_capacity(2).await?;
                self.pace(n).await;
                w.write(&buf[..n]);
            }
            w.finish()
                .await
                .with_context(|| format!("uploading {key}"))?;
        }
        Ok(ankusa_keyspace::hex(&hash.finalize()))
    }
}

fn file_sha256(path: &Path) -> anyhow::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut hash = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(ankusa_keyspace::hex(&hash.finalize()));
        }
        hash.update(&buf[..n]);
    }
}

/// Whether a store file never changes once written (a table or blob file).
fn immutable(name: &str) -> bool {
    name.ends_with(".sst") || name.ends_with(".blob")
}

/// What a push did.
#[derive(Debug, Clone)]
pub struct Pushed {
    pub manifest: Manifest,
    /// When its checkpoint was taken (ms since the epoch).
    pub at_ms: u64,
    /// How long the checkpoint took (a flush of the memtables, then hard links).
    pub checkpoint_ms: u64,
    pub uploaded_files: u64,
    pub uploaded_bytes: u64,
    /// What the retention that followed deleted.
    pub pruned: Pruned,
    /// The newest backup under the prefix at each store format, after the retention.
    pub formats: Vec<ankusa_api::node::FormatBackup>,
}

impl Pushed {
    /// The store's size in the backup.
    pub fn bytes(&self) -> u64 {
        self.manifest.files.iter().map(|f| f.size).sum()
    }
}

/// A backup of `store` (open, at `data`) to `remote`: a checkpoint (hard links beside the
/// store: the files of one consistent state, which the store's own compactions cannot
/// delete while they upload), its table and blob files the bucket does not hold yet, its
/// small files, its manifest; then what `retention` keeps is kept. The checkpoint is taken
/// on a blocking thread, and removed whatever the outcome.
pub async fn push_store(
    store: std::sync::Arc<Store>,
    data: &Path,
    remote: &Remote,
    retention: Option<Retention>,
) -> anyhow::Result<Pushed> {
    let identity = lineage(data)?;
    let at_ms = ankusa_keyspace::now_ms();
    let id = format!("b{at_ms}");
    let cp = checkpoint_dir(data, &id);
    let taken = cp.clone();
    let began = std::time::Instant::now();
    let format = tokio::task::spawn_blocking(move || -> anyhow::Result<u32> {
        let _ = std::fs::remove_dir_all(&taken);
        store
            .checkpoint(&taken)
            .with_context(|| format!("checkpointing into {}", taken.display()))?;
        Ok(store.format()?)
    })
    .await??;
    let checkpoint_ms = began.elapsed().as_millis() as u64;
    let result = push_checkpoint(remote, &cp, &identity, &id, format).await;
    let _ = std::fs::remove_dir_all(&cp);
    let (manifest, uploaded_files, uploaded_bytes) = result?;
    let pruned = match retention {
        Some(r) => prune(remote, r).await?,
        None => Pruned::default(),
    };
    let mut newest: BTreeMap<u32, ankusa_api::node::FormatBackup> = BTreeMap::new();
    for m in remote.manifests().await? {
        // Oldest first: each format's last one stays.
        newest.insert(
            m.store_format,
            ankusa_api::node::FormatBackup {
                store_format: m.store_format,
                at_ms: m.id.trim_start_matches('b').parse().unwrap_or(m.created_ms),
                bytes: m.files.iter().map(|f| f.size).sum(),
                id: m.id,
            },
        );
    }
    Ok(Pushed {
        manifest,
        at_ms,
        checkpoint_ms,
        uploaded_files,
        uploaded_bytes,
        pruned,
        formats: newest.into_values().collect(),
    })
}

/// A thread of its own running a runtime of its own, where pushes run: their hashing,
/// reading, TLS and HTTP never take a turn on the workers that serve ingest and delivery.
/// Dropped, it stops at once (a push under way is cut: no manifest, no backup).
pub struct Pusher {
    rt: Option<tokio::runtime::Runtime>,
}

impl Pusher {
    pub fn new() -> anyhow::Result<Pusher> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(2)
            .thread_name("backup-push")
            .enable_all()
            .build()
            .context("starting the backup thread")?;
        Ok(Pusher { rt: Some(rt) })
    }

    /// [`push_store`], run there.
    pub async fn push(
        &self,
        store: std::sync::Arc<Store>,
        data: std::path::PathBuf,
        remote: std::sync::Arc<Remote>,
        retention: Option<Retention>,
    ) -> anyhow::Result<Pushed> {
        let rt = self.rt.as_ref().context("the backup thread stopped")?;
        rt.spawn(async move { push_store(store, &data, &remote, retention).await })
            .await
            .context("the backup thread")?
    }
}

impl Drop for Pusher {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Where a push's checkpoint of the store at `data` goes: beside it (hard links need the
/// same file system), `.<name>.push-<id>`.
fn checkpoint_dir(data: &Path, id: &str) -> std::path::PathBuf {
    data.with_file_name(format!(
        ".{}.push-{id}",
        data.file_name().unwrap_or_default().to_string_lossy()
    ))
}

/// Removes the checkpoints pushes of the store at `data` left behind (a process killed
/// mid-push): each holds hard links to files the store has since deleted.
pub fn remove_stale_checkpoints(data: &Path) {
    for (_, path) in beside(data, ".", ".push-") {
        let _ = std::fs::remove_dir_all(path);
    }
}

/// The directories beside the data directory `data` named `<before><its name><after>…`,
/// each with the rest of its name.
pub fn beside(data: &Path, before: &str, after: &str) -> Vec<(String, std::path::PathBuf)> {
    let (Some(parent), Some(name)) = (data.parent(), data.file_name()) else {
        return Vec::new();
    };
    let lead = format!("{before}{}{after}", name.to_string_lossy());
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let rest = e
                .file_name()
                .to_string_lossy()
                .strip_prefix(&lead)?
                .to_owned();
            Some((rest, e.path()))
        })
        .collect()
}

/// What [`prune`] deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub backups: usize,
    pub files: usize,
}

/// What retention keeps: the newest `keep` backups, and with `older_formats` the newest
/// backup of each store format older than the newest backup's (what a rollback to an
/// older release restores: a migration must not leave it to age out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub keep: usize,
    pub older_formats: bool,
}

impl Retention {
    /// The backups of `manifests` (oldest first) retention keeps, by index.
    fn kept(&self, manifests: &[Manifest]) -> std::collections::BTreeSet<usize> {
        let n = manifests.len();
        let mut kept: std::collections::BTreeSet<usize> =
            (n.saturating_sub(self.keep.max(1))..n).collect();
        if self.older_formats {
            if let Some(newest) = manifests.last().map(|m| m.store_format) {
                let mut seen = std::collections::BTreeSet::new();
                for (i, m) in manifests.iter().enumerate().rev() {
                    if m.store_format < newest && seen.insert(m.store_format) {
                        kept.insert(i);
                    }
                }
            }
        }
        kept
    }
}

/// Keeps what `retention` keeps of the backups under the prefix. The others go manifest
/// first (a backup stops existing before any of its files goes), then any file of theirs
/// under their own `backups/<id>/` (older releases put the small files there); then every
/// file under `files/` no remaining manifest names (the older backups', and those a push
/// that ended before its manifest left). So no manifest in the bucket ever names a
/// deleted file, whatever step a kill stops it at (a run again finishes the job). One
/// writer per prefix: a push under way elsewhere could have its files taken.
pub async fn prune(remote: &Remote, retention: Retention) -> anyhow::Result<Pruned> {
    let manifests = remote.manifests().await?;
    let keep = retention.kept(&manifests);
    let (mut kept, mut old) = (Vec::new(), Vec::new());
    for (i, m) in manifests.iter().enumerate() {
        if keep.contains(&i) {
            kept.push(m);
        } else {
            old.push(m);
        }
    }
    let mut p = Pruned::default();
    for m in old {
        let own = remote.key(&format!("backups/{}/", m.id)).to_string();
        remote
            .delete(
                remote
                    .key(&format!("backups/{}/manifest.json", m.id))
                    .as_ref(),
            )
            .await?;
        for f in m.files.iter().filter(|f| f.key.starts_with(&own)) {
            remote.delete(&f.key).await?;
        }
        p.backups += 1;
    }
    let named: std::collections::BTreeSet<&str> = kept
        .iter()
        .flat_map(|m| m.files.iter().map(|f| f.key.as_str()))
        .collect();
    for key in remote.list("files").await?.into_keys() {
        if !named.contains(key.as_str()) {
            remote.delete(&key).await?;
            p.files += 1;
        }
    }
    Ok(p)
}

pub(crate) async fn push_checkpoint(
    remote: &Remote,
    cp: &Path,
    identity: &str,
    id: &str,
    format: u32,
) -> anyhow::Result<(Manifest, u64, u64)> {
    remote.start_pacing();
    let held = remote.list("files").await?;
    // The checksums of files uploaded before, from the manifests that name them.
    let mut known: BTreeMap<String, String> = BTreeMap::new();
    for m in remote.manifests().await? {
        for f in m.files {
            known.insert(f.key, f.sha256);
        }
    }
    let mut names: Vec<String> = std::fs::read_dir(cp)?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let (mut files, mut uploaded, mut bytes) = (Vec::new(), 0u64, 0u64);
    for name in names {
        let path = cp.join(&name);
        let size = std::fs::metadata(&path)?.len();
        // A table or blob file by its name in the lineage; a small file (CURRENT,
        // MANIFEST-*, OPTIONS-*) by its content, so that the backups whose OPTIONS are the
        // same share one copy.
        let (key, content) = if immutable(&name) {
            (remote.key(&format!("files/{identity}/{name}")), None)
        } else {
            let h = file_sha256(&path)?;
            (remote.key(&format!("files/sha256/{h}")), Some(h))
        };
        let sha256 = match (held.get(key.as_ref()), content) {
            (Some(s), Some(h)) if *s == size => h,
            (Some(s), None) if *s == size => match known.get(key.as_ref()) {
                Some(h) => h.clone(),
                // Uploaded by a push that ended before its manifest: the same bytes (the
                // name is unique to them in this store); checksummed here.
                None => file_sha256(&path)?,
            },
            _ => {
                let h = remote.upload(&path, &key).await?;
                uploaded += 1;
                bytes += size;
                h
            }
        };
        files.push(FileEntry {
            name,
            key: key.to_string(),
            size,
            sha256,
        });
    }
    let m = Manifest {
        version: 1,
        id: id.to_owned(),
        created_ms: ankusa_keyspace::now_ms(),
        lineage: identity.to_owned(),
        store_format: format,
        files,
    };
    remote
        .store
        .put(
            &remote.manifest_key(id),
            PutPayload::from(serde_json::to_vec_pretty(&m)?),
        )
        .await
        .context("writing the backup's manifest")?;
    Ok((m, uploaded, bytes))
}

/// The newest backup under the remote's prefix (at most `format_at_most`), downloaded into
/// the empty directory `data`, every file checked. The backup restored.
pub async fn restore_from(
    remote: &Remote,
    data: &Path,
    format_at_most: Option<u32>,
) -> anyhow::Result<Manifest> {
    let from = remote.url();
    let manifests = remote.manifests().await?;
    let m = manifests
        .into_iter()
        .rev()
        .find(|m| format_at_most.is_none_or(|f| m.store_format <= f))
        .ok_or_else(|| match format_at_most {
            Some(f) => anyhow::anyhow!("no backup at store format {f} or lower in {from}"),
            None => anyhow::anyhow!("no backup in {from}"),
        })?;
    // A manifest names plain files of one directory: anything else (a path, the
    // restore's own marker) is refused before anything is written.
    for f in &m.files {
        anyhow::ensure!(
            !f.name.is_empty()
                && !f.name.contains(['/', '\\'])
                && f.name != "."
                && f.name != ".."
                && f.name != ankusa_tarball::RESTORING_MARKER,
            "backup {} names a file {:?} that is not a store file's name",
            m.id,
            f.name
        );
    }
    // Its table and blob files are its own store's (its lineage's, under this prefix), and
    // its other files this prefix's: a manifest naming another store's files — copied from
    // elsewhere, or edited — is refused, naming them.
    let own = remote.key(&format!("files/{}/", m.lineage)).to_string();
    let shared = remote.key("files/sha256/").to_string();
    let legacy = remote.key(&format!("backups/{}/", m.id)).to_string();
    let foreign: Vec<&str> = m
        .files
        .iter()
        .filter(|f| {
            if immutable(&f.name) {
                !f.key.starts_with(&own)
            } else {
                !(f.key.starts_with(&shared) || f.key.starts_with(&legacy))
            }
        })
        .map(|f| f.key.as_str())
        .collect();
    anyhow::ensure!(
        foreign.is_empty() && !m.lineage.is_empty() && !m.lineage.contains('/'),
        "backup {} (store lineage {:?}) names files that are not its store's under {from}: {}",
        m.id,
        m.lineage,
        foreign.join(", ")
    );
    // Every file first: a manifest whose files are not all there is refused whole.
    let mut missing = Vec::new();
    for f in &m.files {
        match remote.store.head(&Key::from(f.key.as_str())).await {
            Ok(meta) if meta.size == f.size => {}
            Ok(meta) => missing.push(format!("{} ({} bytes, not {})", f.key, meta.size, f.size)),
            Err(object_store::Error::NotFound { .. }) => missing.push(f.key.clone()),
            Err(e) => return Err(anyhow::anyhow!("{}: {e}", f.key)),
        }
    }
    anyhow::ensure!(
        missing.is_empty(),
        "backup {} names files the bucket does not hold as named: {}",
        m.id,
        missing.join(", ")
    );
    // Room for it all first, the margin an unpack keeps left over.
    let total: u64 = m.files.iter().map(|f| f.size).sum();
    if let Some(room) = ankusa_queue::engine::tarball::room_to_unpack(data) {
        anyhow::ensure!(
            total <= room,
            "backup {} is {total} bytes; {} has room for {room} (its free space less {} bytes kept free): nothing was written",
            m.id,
            data.display(),
            ankusa_queue::engine::tarball::UNPACK_MARGIN_BYTES
        );
    }
    // Until the last file is in and synced, the marker says so: a restore killed half
    // way leaves a directory every command refuses (as an archive's restore does).
    std::fs::create_dir_all(data)?;
    let marker = data.join(ankusa_tarball::RESTORING_MARKER);
    std::fs::File::create(&marker)?.sync_all()?;
    sync_dir(data)?;
    for f in &m.files {
        let path = data.join(&f.name);
        let mut out = std::fs::File::create(&path)?;
        let mut hash = sha2::Sha256::new();
        let mut size = 0u64;
        let mut stream = remote
            .store
            .get(&Key::from(f.key.as_str()))
            .await
            .with_context(|| format!("downloading {}", f.key))?
            .into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.with_context(|| format!("downloading {}", f.key))?;
            hash.update(&chunk);
            size += chunk.len() as u64;
            // A server that sends more than the manifest says is cut off at once.
            anyhow::ensure!(
                size <= f.size,
                "{} sent more than the {} bytes backup {}'s manifest says",
                f.key,
                f.size,
                m.id
            );
            out.write_all(&chunk)?;
        }
        out.sync_all()?;
        let got = ankusa_keyspace::hex(&hash.finalize());
        anyhow::ensure!(
            size == f.size && got == f.sha256,
            "{} does not match backup {}'s manifest ({size} bytes, sha256 {got}; the manifest says {} bytes, {})",
            f.key,
            m.id,
            f.size,
            f.sha256
        );
    }
    sync_dir(data)?;
    std::fs::remove_file(&marker)?;
    sync_dir(data)?;
    Ok(m)
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The operator plans restores with the margin the node keeps.
    #[test]
    fn the_operator_counts_the_restores_margin() {
        assert_eq!(
            ankusa_queue::engine::tarball::UNPACK_MARGIN_BYTES,
            ankusa_api::node::UNPACK_MARGIN_BYTES
        );
    }

    /// What a store's directory does between backups, for the retention property.
    #[derive(Debug, Clone)]
    enum Step {
        /// `n` new table files (a flush).
        Write(u8),
        /// The oldest `n` table files replaced by one (a compaction).
        Compact(u8),
        Push,
        /// A push that uploads its new files and dies before its manifest.
        DeadPush,
        Prune(u8),
        /// The newest backup restored into an empty directory, every file checked.
        Restore,
        /// The store migrated to the next format: later backups are at it.
        Migrate,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (1u8..4).prop_map(Step::Write),
            2 => (1u8..4).prop_map(Step::Compact),
            3 => Just(Step::Push),
            1 => Just(Step::DeadPush),
            2 => (1u8..4).prop_map(Step::Prune),
            1 => Just(Step::Restore),
            1 => Just(Step::Migrate),
        ]
    }

    /// Every manifest in the bucket names only files the bucket holds, at their size.
    async fn every_manifest_whole(remote: &Remote) -> Result<(), TestCaseError> {
        let held = remote.list("").await.unwrap();
        for m in remote.manifests().await.unwrap() {
            for f in &m.files {
                prop_assert_eq!(
                    held.get(&f.key),
                    Some(&f.size),
                    "backup {} names {}, which the bucket does not hold",
                    &m.id,
                    &f.key
                );
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

        /// Any sequence of backups (some killed before their manifest), prunes,
        /// migrations and restores: no manifest in the bucket ever names a deleted file, a
        /// prune keeps the newest backups it is asked to and (unless released) the newest
        /// of every older store format, and a restore gives back the newest backup's files
        /// byte for byte.
        #[test]
        fn retention_never_deletes_a_file_a_kept_manifest_names(
            steps in proptest::collection::vec(step(), 1..30),
            older_formats in any::<bool>(),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let remote = Remote {
                store: Box::new(object_store::memory::InMemory::new()),
                bucket: "it".into(),
                prefix: "relay-0".into(),
                limit: None,
                paced: std::sync::Mutex::new((std::time::Instant::now(), 0)),
            };
            let dir = tempfile::tempdir().unwrap();
            let store = dir.path().join("store");
            std::fs::create_dir_all(&store).unwrap();
            let mut next_file = 0u32;
            let mut next_id = 0u64;
            let mut format = 2u32;
            let mut write = |store: &Path, n: u8| {
                for _ in 0..n {
                    next_file += 1;
                    std::fs::write(
                        store.join(format!("{next_file:06}.sst")),
                        format!("table {next_file}").repeat(next_file as usize % 7 + 1),
                    )
                    .unwrap();
                }
            };
            std::fs::write(store.join("CURRENT"), "MANIFEST-000001\n").unwrap();
            // What each backup's store held: its files and their bytes.
            let mut pushed: BTreeMap<String, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
            for s in &steps {
                match s {
                    Step::Write(n) => write(&store, *n),
                    Step::Compact(n) => {
                        let mut tables: Vec<_> = std::fs::read_dir(&store)
                            .unwrap()
                            .filter_map(Result::ok)
                            .map(|e| e.path())
                            .filter(|p| p.extension().is_some_and(|e| e == "sst"))
                            .collect();
                        tables.sort();
                        for t in tables.iter().take(*n as usize) {
                            std::fs::remove_file(t).unwrap();
                        }
                        write(&store, 1);
                    }
                    Step::Push | Step::DeadPush => {
                        next_id += 1;
                        let id = format!("b{next_id:06}");
                        std::fs::write(store.join("MANIFEST-000001"), &id).unwrap();
                        if matches!(s, Step::Push) {
                            rt.block_on(push_checkpoint(&remote, &store, "lineage", &id, format)).unwrap();
                            let files = std::fs::read_dir(&store)
                                .unwrap()
                                .filter_map(Result::ok)
                                .map(|e| {
                                    (
                                        e.file_name().to_string_lossy().into_owned(),
                                        std::fs::read(e.path()).unwrap(),
                                    )
                                })
                                .collect();
                            pushed.insert(id, files);
                        } else {
                            // Its table files uploaded, then the push dies.
                            for e in std::fs::read_dir(&store).unwrap().filter_map(Result::ok) {
                                let name = e.file_name().to_string_lossy().into_owned();
                                if immutable(&name) {
                                    let key = remote.key(&format!("files/lineage/{name}"));
                                    rt.block_on(remote.upload(&e.path(), &key)).unwrap();
                                }
                            }
                        }
                    }
                    Step::Migrate => format += 1,
                    Step::Prune(keep) => {
                        let before = rt.block_on(remote.manifests()).unwrap();
                        let retention = Retention { keep: *keep as usize, older_formats };
                        rt.block_on(prune(&remote, retention)).unwrap();
                        let after = rt.block_on(remote.manifests()).unwrap();
                        // The newest `keep`, and the newest of each older format.
                        let newest = before.last().map(|m| m.store_format);
                        let want: Vec<&String> = before
                            .iter()
                            .enumerate()
                            .filter(|(i, m)| {
                                *i + (*keep as usize) >= before.len()
                                    || older_formats
                                        && Some(m.store_format) < newest
                                        && !before[i + 1..]
                                            .iter()
                                            .any(|n| n.store_format == m.store_format)
                            })
                            .map(|(_, m)| &m.id)
                            .collect();
                        let got: Vec<&String> = after.iter().map(|m| &m.id).collect();
                        prop_assert_eq!(got, want);
                    }
                    Step::Restore => {
                        let newest = rt.block_on(remote.manifests()).unwrap().pop();
                        let into = dir.path().join(format!("restored-{next_id}-{}", pushed.len()));
                        match newest {
                            None => {
                                prop_assert!(rt.block_on(restore_from(&remote, &into, None)).is_err())
                            }
                            Some(m) => {
                                let got = rt.block_on(restore_from(&remote, &into, None)).unwrap();
                                prop_assert_eq!(&got.id, &m.id);
                                for (name, bytes) in &pushed[&m.id] {
                                    prop_assert_eq!(&std::fs::read(into.join(name)).unwrap(), bytes);
                                }
                                std::fs::remove_dir_all(&into).unwrap();
                            }
                        }
                    }
                }
                rt.block_on(every_manifest_whole(&remote))?;
            }
        }
    }

    #[test]
    fn a_location_is_a_bucket_and_a_prefix() {
        assert_eq!(
            parse_location("s3://hooks/prod/relay-0/").unwrap(),
            ("hooks".into(), "prod/relay-0".into())
        );
        assert_eq!(
            parse_location("s3://hooks").unwrap(),
            ("hooks".into(), String::new())
        );
        assert!(parse_location("hooks/prod").is_err());
        assert!(parse_location("s3:///prod").is_err());
    }
}
