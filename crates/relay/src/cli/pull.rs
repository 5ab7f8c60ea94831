//! `ankusa-relay pull`: a consumer of a pull sink from a shell. Claims with a long poll;
//! prints each hook as a JSON line and acks it, or pipes its body to a command and acks it
//! when the command exits 0 (nacks it otherwise). A lost connection is retried with a
//! backoff: the leases it held run out and their hooks come back.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context};
use base64::Engine;
use serde_json::{json, Value};

use crate::admin::client::Nodes;

/// What one run does.
#[derive(Debug, Clone)]
pub(super) struct PullArgs {
    pub url: String,
    pub token: String,
    pub sink: String,
    pub max: usize,
    pub wait_ms: u64,
    pub lease_ms: Option<u64>,
    pub exec: Option<String>,
    /// Stop after this many hooks settled (acked or nacked).
    pub limit: Option<u64>,
    /// Stop after one claim, whatever it brought.
    pub once: bool,
}

pub(super) fn pull(a: PullArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(run(a))
}

async fn run(a: PullArgs) -> anyhow::Result<ExitCode> {
    // A call waits for its long poll, then some.
    let timeout = Duration::from_millis(a.wait_ms) + Duration::from_secs(30);
    let node = Nodes::resolve(std::slice::from_ref(&a.url), false, &a.token, timeout).await?;
    let base = format!("/pull/{}", a.sink);
    let mut settled = 0u64;
    let mut backoff = Duration::from_millis(500);
    loop {
        let mut ask = json!({ "max": a.max, "wait_ms": a.wait_ms });
        if let Some(l) = a.lease_ms {
            ask["lease_ms"] = json!(l);
        }
        let answer = match node
            .call(0, hyper::Method::POST, &format!("{base}/claim"), Some(&ask))
            .await
        {
            Ok(v) => {
                backoff = Duration::from_millis(500);
                v
            }
            Err(e) if !a.once && !is_refusal(&e) => {
                eprintln!("pull: {e:#}; again in {} ms", backoff.as_millis());
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
            Err(e) => return Err(e),
        };
        let hooks = answer["hooks"].as_array().cloned().unwrap_or_default();
        let (mut acks, mut nacks) = (Vec::new(), Vec::new());
        for h in &hooks {
            let lease = h["lease"].as_str().unwrap_or_default().to_owned();
            let ok = match &a.exec {
                None => {
                    println!("{h}");
                    true
                }
                Some(cmd) => handle(cmd, h).await?,
            };
            if ok {
                acks.push(lease);
            } else {
                nacks.push(lease);
            }
        }
        for (what, leases) in [("ack", acks), ("nack", nacks)] {
            if leases.is_empty() {
                continue;
            }
            let n = leases.len() as u64;
            let body = json!({ "leases": leases });
            match node
                .call(
                    0,
                    hyper::Method::POST,
                    &format!("{base}/{what}"),
                    Some(&body),
                )
                .await
            {
                Ok(_) => settled += n,
                // A lease that ran out meanwhile: its hook comes back, to be handled again.
                Err(e) => eprintln!("pull: {what}: {e:#}"),
            }
        }
        if a.once || a.limit.is_some_and(|l| settled >= l) {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// A refusal that trying again cannot mend: a bad token, an unknown sink, a bad bound.
fn is_refusal(e: &anyhow::Error) -> bool {
    let s = e.to_string();
    [": 400 ", ": 401 ", ": 404 "].iter().any(|c| s.contains(c))
}

/// Runs `cmd` (through `sh -c`) with the hook's body on stdin and its metadata in
/// `ANKUSA_*` variables; whether it exited 0.
async fn handle(cmd: &str, h: &Value) -> anyhow::Result<bool> {
    use tokio::io::AsyncWriteExt;
    let body = match (h["body"].as_str(), h["body_base64"].as_str()) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| anyhow!("a hook's body_base64: {e}"))?,
        (None, None) => Vec::new(),
    };
    let var = |k: &str| match &h[k] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        v => v.to_string(),
    };
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("ANKUSA_HOOK_ID", var("id"))
        .env("ANKUSA_TENANT", var("tenant"))
        .env("ANKUSA_SOURCE", var("source"))
        .env("ANKUSA_SINK", var("sink"))
        .env("ANKUSA_ATTEMPT", var("attempt"))
        .env("ANKUSA_CONTENT_TYPE", var("content_type"))
        .env("ANKUSA_RECEIVED_AT_MS", var("received_at_ms"))
        .env("ANKUSA_LEASE", var("lease"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd:?}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its input still decides by its exit code.
        let _ = stdin.write_all(&body).await;
    }
    Ok(child.wait().await?.success())
}
