//! `sink`: a local sink that prints each delivery and checks its signature.

use std::process::ExitCode;

use anyhow::Context;

use crate::node::StopSignals;

/// Serves `POST /*` on `listen`, printing each hook and whether its signature verifies.
pub(super) fn sink(
    listen: std::net::SocketAddr,
    secret: Option<String>,
) -> anyhow::Result<ExitCode> {
    use ankusa_verify::{standard_webhooks_key, Verifier};
    let verifier = secret.map(|s| Verifier::StandardWebhooks {
        key: standard_webhooks_key(s.as_bytes()),
        tolerance_s: 300,
    });
    let verifier = std::sync::Arc::new(verifier);
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let app = axum::Router::new().fallback(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let verifier = verifier.clone();
                async move {
                    let get = |name: &str| {
                        headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("-")
                            .to_owned()
                    };
                    let id = get("webhook-id");
                    let from = format!(
                        "tenant {}, source {}",
                        get("ankusa-tenant"),
                        get("ankusa-source")
                    );
                    let check = match verifier.as_ref() {
                        None => "unchecked".to_owned(),
                        Some(v) => {
                            match v.verify(&headers, &body, ankusa_keyspace::now_ms() / 1000) {
                                Ok(()) => "signature ok".to_owned(),
                                Err(e) => format!("signature BAD ({e})"),
                            }
                        }
                    };
                    let preview: String =
                        String::from_utf8_lossy(&body).chars().take(200).collect();
                    println!(
                        "received {id} ({from}, {} bytes, {check}): {preview}",
                        body.len()
                    );
                    axum::http::StatusCode::NO_CONTENT
                }
            },
        );
        let l = ankusa_config::listen::bind(listen)
            .and_then(tokio::net::TcpListener::from_std)
            .with_context(|| format!("binding {listen}"))?;
        println!("ankusa-relay sink: listening on http://{}", l.local_addr()?);
        // SIGTERM too: in a container the sink is PID 1, which ignores a signal it has no
        // handler for.
        let mut signals = StopSignals::install()?;
        axum::serve(l, app)
            .with_graceful_shutdown(async move {
                signals.recv().await;
            })
            .await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
