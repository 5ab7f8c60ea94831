//! `backup push --to s3://…` and `restore --from s3://…`: the command line's side of
//! [`crate::objstore`].

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::objstore::{Manifest, Remote, Target};

use super::store::open_existing;

/// Where backups go: an S3-compatible bucket.
#[derive(Debug, Clone, clap::Args)]
pub struct Bucket {
    /// The object store's URL (an S3-compatible server's, e.g. http://127.0.0.1:8333);
    /// without it, AWS S3 in `--region`.
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    pub endpoint: Option<String>,
    /// The bucket's region (what the endpoint's signatures name).
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    pub region: String,
    /// Allow an `http://` endpoint (a server on a private network, a test's).
    #[arg(long)]
    pub allow_http: bool,
    /// PEM certificates to trust besides the system's (an https endpoint signed by a
    /// private authority).
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Without credentials in the environment, ask the cloud's instance metadata service
    /// for them (otherwise requests go unsigned).
    #[arg(long)]
    pub instance_metadata: bool,
    /// The most a push uploads per second.
    #[arg(long)]
    pub max_bytes_per_second: Option<u64>,
}

impl Bucket {
    fn target(&self) -> Target {
        Target {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            allow_http: self.allow_http,
            ca_file: self.ca_file.clone(),
            instance_metadata: self.instance_metadata,
            max_bytes_per_second: self.max_bytes_per_second,
        }
    }
}

/// `backup push`: a checkpoint of the closed store at `data`, uploaded to `to`, only the
/// table and blob files the bucket does not hold yet.
pub(super) fn push(
    data: &Path,
    to: &str,
    bucket: &Bucket,
    keep: Option<u64>,
    release_older_formats: bool,
) -> anyhow::Result<ExitCode> {
    let remote = Remote::open(to, &bucket.target())?;
    // Opened first: a directory that is not a store is refused before anything is written.
    drop(open_existing(data, true)?);
    let store = std::sync::Arc::new(open_existing(data, false)?);
    let rt = tokio::runtime::Runtime::new()?;
    let p = rt.block_on(crate::objstore::push_store(
        store,
        data,
        &remote,
        keep.map(|k| crate::objstore::Retention {
            keep: k as usize,
            older_formats: !release_older_formats,
        }),
    ))?;
    println!(
        "backup {}: {} files, {} bytes, store format {}; uploaded {} files, {} bytes, to {}",
        p.manifest.id,
        p.manifest.files.len(),
        p.bytes(),
        p.manifest.store_format,
        p.uploaded_files,
        p.uploaded_bytes,
        remote.url()
    );
    if let Some(keep) = keep {
        println!(
            "kept the newest {keep} backups: deleted {} backups and {} files no kept backup names",
            p.pruned.backups, p.pruned.files
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `restore --from s3://…`: the newest backup under the prefix (at most `format_at_most`),
/// downloaded into the empty directory `data`, every file checked. The backup restored.
pub(super) fn restore(
    from: &str,
    bucket: &Bucket,
    data: &Path,
    format_at_most: Option<u32>,
) -> anyhow::Result<Manifest> {
    let remote = Remote::open(from, &bucket.target())?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(crate::objstore::restore_from(&remote, data, format_at_most))
}
