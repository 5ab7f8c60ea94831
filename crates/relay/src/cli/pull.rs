//! `ankusa-relay pull`: a consumer of a pull sink from a shell. Claims with a long poll;
//! prints each hook as a JSON line and acks it, or pipes its body to a command and acks it
//! when the command exits 0 (nacks it otherwise, saying so on standard error; a run that
//! stops — `--once`, `--limit` — after a nack exits 1). A lost connection is retried with
//! a backoff: the leases it held run out and their hooks come back.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context};
use base64::Engine;

use super::client::{body, is_status, Nodes};
use ankusa_api::pull::{
    AckRequest, ClaimAnswer, ClaimRequest, ClaimedHook, NackRequest, SettleAnswer,
};

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
    let (mut settled, mut nacked) = (0u64, 0u64);
    let mut backoff = Duration::from_millis(500);
    loop {
        let ask = body(&ClaimRequest {
            max: Some(a.max),
            max_bytes: None,
            wait_ms: Some(a.wait_ms),
            lease_ms: a.lease_ms,
        })?;
        let answer: ClaimAnswer = match node
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
        let (mut acks, mut nacks) = (Vec::new(), Vec::new());
        for h in &answer.hooks {
            let ok = match &a.exec {
                None => {
                    println!("{}", serde_json::to_string(h)?);
                    true
                }
                Some(cmd) => {
                    let status = handle(cmd, h).await?;
                    if !status.success() {
                        eprintln!(
                            "pull: nacked {} (attempt {}): the command {status}",
                            h.id, h.attempt
                        );
                    }
                    status.success()
                }
            };
            if ok {
                acks.push(h.lease.clone());
            } else {
                nacks.push(h.lease.clone());
            }
        }
        for (what, leases) in [("ack", acks), ("nack", nacks)] {
            if leases.is_empty() {
                continue;
            }
            let n = leases.len() as u64;
            let settle = if what == "ack" {
                body(&AckRequest { leases })?
            } else {
                body(&NackRequest {
                    leases,
                    retry_after_ms: None,
                })?
            };
            let path = format!("{base}/{what}");
            match node
                .call::<SettleAnswer>(0, hyper::Method::POST, &path, Some(&settle))
                .await
            {
                Ok(_) => {
                    settled += n;
                    if what == "nack" {
                        nacked += n;
                    }
                }
                // A lease that ran out meanwhile: its hook comes back, to be handled again.
                Err(e) => eprintln!("pull: {what}: {e:#}"),
            }
        }
        if a.once || a.limit.is_some_and(|l| settled >= l) {
            if nacked > 0 {
                eprintln!("pull: {nacked} of {settled} hooks nacked");
                return Ok(ExitCode::FAILURE);
            }
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// A refusal that trying again cannot mend: a bad token, an unknown sink, a bad bound.
fn is_refusal(e: &anyhow::Error) -> bool {
    is_status(e, &[400, 401, 404])
}

/// The variable a forwarded header is passed in: `X-GitHub-Event` → `ANKUSA_HEADER_X_GITHUB_EVENT`.
fn header_variable(name: &str) -> String {
    let n: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("ANKUSA_HEADER_{n}")
}

/// Runs `cmd` (through `sh -c`) with the hook's body on stdin, its metadata in `ANKUSA_*`
/// variables and each forwarded provider header in `ANKUSA_HEADER_<NAME>`; how it exited.
async fn handle(cmd: &str, h: &ClaimedHook) -> anyhow::Result<std::process::ExitStatus> {
    use tokio::io::AsyncWriteExt;
    let body = match (&h.body, &h.body_base64) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| anyhow!("a hook's body_base64: {e}"))?,
        (None, None) => Vec::new(),
    };
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("ANKUSA_HOOK_ID", &h.id)
        .env("ANKUSA_TENANT", &h.tenant)
        .env("ANKUSA_SOURCE", &h.source)
        .env("ANKUSA_SINK", &h.sink)
        .env("ANKUSA_ATTEMPT", h.attempt.to_string())
        .env("ANKUSA_CONTENT_TYPE", &h.content_type)
        .env("ANKUSA_RECEIVED_AT_MS", h.received_at_ms.to_string())
        .env("ANKUSA_LEASE", &h.lease)
        .envs(
            h.headers
                .iter()
                .map(|f| (header_variable(&f.name), &f.value)),
        )
        .stdin(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd:?}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its input still decides by its exit code.
        let _ = stdin.write_all(&body).await;
    }
    Ok(child.wait().await?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_header_name_is_a_variable_name() {
        assert_eq!(
            super::header_variable("X-GitHub-Event"),
            "ANKUSA_HEADER_X_GITHUB_EVENT"
        );
        assert_eq!(
            super::header_variable("x-shopify-topic"),
            "ANKUSA_HEADER_X_SHOPIFY_TOPIC"
        );
    }
}
