//! `sink`: a local sink that prints each delivery and checks its signature; it can answer
//! with a status of your choosing, or fail a share of the deliveries, to watch retries and
//! the dead-letter queue happen.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use axum::http::{HeaderMap, StatusCode};

use crate::node::StopSignals;

/// What `sink` does with a delivery.
#[derive(Debug, Clone, clap::Args)]
pub struct SinkArgs {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:9999")]
    pub listen: std::net::SocketAddr,
    /// The sink's Standard Webhooks secret (`whsec_...`), to verify signatures.
    #[arg(long, env = "ANKUSA_SINK_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// The status each delivery is answered with (a 4xx or 5xx fails every one: watch the
    /// retries and the dead-letter queue).
    #[arg(long, default_value_t = 204)]
    pub status: u16,
    /// The share of deliveries (0 to 1) answered `--fail-status` instead, evenly spread:
    /// 0.25 fails every 4th.
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,
    /// The status of a delivery `--fail-rate` fails.
    #[arg(long, default_value_t = 503)]
    pub fail_status: u16,
    /// Print every header of each delivery under its line.
    #[arg(long)]
    pub print_headers: bool,
    /// Serve HTTPS with this PEM certificate chain (with `--tls-key`): a sink behind a
    /// private certificate authority, which the relay trusts through `dispatch.ca_bundle`
    /// or `sinks[].ca_bundle`.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
}

/// The TLS acceptor of `--tls-cert` and `--tls-key`.
fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("--tls-cert {}", cert.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "--tls-cert {} holds no certificate",
        cert.display()
    );
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("--tls-key {}", key.display()))?;
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .context("--tls-cert and --tls-key")?;
    Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
}

/// Serves `app` over TLS on `l` until `stop` ends: one task per connection.
async fn serve_tls(
    l: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    app: axum::Router,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        let tcp = tokio::select! {
            _ = &mut stop => return,
            accepted = l.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    eprintln!("ankusa-relay sink: accepting a connection: {e}");
                    continue;
                }
            },
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            // A client that does not trust the certificate ends the handshake here.
            let stream = match acceptor.accept(tcp).await {
                Ok(s) => s,
                Err(e) => return eprintln!("ankusa-relay sink: TLS handshake: {e}"),
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Which deliveries fail: the `n`th (from 1) when the running count of failures owed,
/// `⌊n·rate⌋`, steps up at it. Exactly `⌊n·rate⌋` of the first `n` fail, evenly spread.
fn fails(n: u64, rate: f64) -> bool {
    let owed = |k: u64| (k as f64 * rate).floor() as u64;
    owed(n) > owed(n - 1)
}

/// Serves `POST /*` on `listen`, printing each hook, whether its signature verifies, and
/// the status it answered.
pub(super) fn sink(args: SinkArgs) -> anyhow::Result<ExitCode> {
    use ankusa_verify::{standard_webhooks_key, Verifier};
    let status = StatusCode::from_u16(args.status).context("--status")?;
    let fail_status = StatusCode::from_u16(args.fail_status).context("--fail-status")?;
    if !(0.0..=1.0).contains(&args.fail_rate) {
        anyhow::bail!("--fail-rate {} is outside 0..=1", args.fail_rate);
    }
    let verifier = args.secret.as_ref().map(|s| Verifier::StandardWebhooks {
        key: standard_webhooks_key(s.as_bytes()),
        tolerance_s: 300,
    });
    let verifier = Arc::new(verifier);
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls_acceptor(cert, key)?),
        _ => None,
    };
    let received = Arc::new(AtomicU64::new(0));
    let (rate, print_headers) = (args.fail_rate, args.print_headers);
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let app =
            axum::Router::new().fallback(move |headers: HeaderMap, body: axum::body::Bytes| {
                let verifier = verifier.clone();
                let n = received.fetch_add(1, Ordering::Relaxed) + 1;
                async move {
                    let answer = if fails(n, rate) { fail_status } else { status };
                    println!(
                        "{}",
                        line(&headers, &body, verifier.as_ref().as_ref(), answer)
                    );
                    if print_headers {
                        for (name, value) in &headers {
                            println!("  {name}: {}", String::from_utf8_lossy(value.as_bytes()));
                        }
                    }
                    answer
                }
            });
        let l = ankusa_config::listen::bind(args.listen)
            .and_then(tokio::net::TcpListener::from_std)
            .with_context(|| format!("binding {}", args.listen))?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        println!(
            "ankusa-relay sink: listening on {scheme}://{}",
            l.local_addr()?
        );
        // SIGTERM too: in a container the sink is PID 1, which ignores a signal it has no
        // handler for.
        let mut signals = StopSignals::install()?;
        let stop = async move {
            signals.recv().await;
        };
        match tls {
            Some(acceptor) => serve_tls(l, acceptor, app, stop).await,
            None => axum::serve(l, app).with_graceful_shutdown(stop).await?,
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `received <id> (tenant T, source S, N bytes, signature ok): <body> → 204`.
fn line(
    headers: &HeaderMap,
    body: &[u8],
    verifier: Option<&ankusa_verify::Verifier>,
    answer: StatusCode,
) -> String {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let check = match verifier {
        None => "unchecked".to_owned(),
        Some(v) => match v.verify(headers, body, ankusa_keyspace::now_ms() / 1000) {
            Ok(()) => "signature ok".to_owned(),
            Err(e) => format!("signature BAD ({e})"),
        },
    };
    let preview: String = String::from_utf8_lossy(body).chars().take(200).collect();
    format!(
        "received {} (tenant {}, source {}, {} bytes, {check}): {preview} → {}",
        get("webhook-id"),
        get("ankusa-tenant"),
        get("ankusa-source"),
        body.len(),
        answer.as_u16()
    )
}

#[cfg(test)]
mod tests {
    use super::fails;

    #[test]
    fn the_failed_share_is_exact_and_spread() {
        let first = |rate: f64, n: u64| (1..=n).filter(|&i| fails(i, rate)).collect::<Vec<_>>();
        assert_eq!(first(0.25, 12), vec![4, 8, 12]);
        assert_eq!(first(0.5, 6), vec![2, 4, 6]);
        assert!(first(0.0, 100).is_empty());
        assert_eq!(first(1.0, 5), vec![1, 2, 3, 4, 5]);
        assert_eq!(first(0.1, 1000).len(), 100);
    }
}
