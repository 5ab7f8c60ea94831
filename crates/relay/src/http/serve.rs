//! Serving a listener with bounds a client cannot stretch (`ingest.connections`,
//! `admin.connections`): at most `max` connections open (one more is closed as it is
//! accepted), the headers of each request within `header_read_timeout_ms` of the
//! connection's start or of its last response (an idle keep-alive connection is closed
//! then too), and each body within `body_read_timeout_ms` of its headers (the request then
//! fails with 408). HTTP/1.1, as providers post webhooks; what each bound cut is counted
//! in `ankusa_http_connections_refused_total` and `ankusa_http_timeouts_total`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ankusa_config::listen::ConnectionLimits;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};

use ankusa_api::error::ErrorCode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

/// One listener's series (the node registers them: `ankusa_http_*{listener}`).
#[derive(Debug, Clone, Default)]
pub struct Meters {
    /// Connections open.
    pub open: Gauge,
    /// Connections closed as they were accepted: the listener held its `connections.max`.
    pub refused: Counter,
    pub header_timeouts: Counter,
    pub body_timeouts: Counter,
}

/// Serves `app` on `listener` within `limits` until `stop` turns true; then stops
/// accepting, lets each open connection finish its request in hand, and returns once every
/// connection is closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: ConnectionLimits,
    meters: Meters,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let header_timeout = Duration::from_millis(limits.header_read_timeout_ms);
    let body_timeout = Duration::from_millis(limits.body_read_timeout_ms);
    let cut_bodies = meters.body_timeouts.clone();
    let app = app.layer(axum::middleware::from_fn(
        move |req: Request<Body>, next: axum::middleware::Next| {
            body_deadline(req, next, body_timeout, cut_bodies.clone())
        },
    ));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let stopping = async {
            let _ = stop.wait_for(|s| *s).await;
        };
        let accepted = tokio::select! {
            () = stopping => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // Out of descriptors, a connection reset before it was taken: the listener
            // stays; a moment's pause lets descriptors come back.
            Err(e) => {
                tracing::debug!(error = %e, "accepting a connection");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Reap the finished, so that the set holds only open connections.
        while connections.try_join_next().is_some() {}
        if meters.open.get() >= limits.max as i64 {
            meters.refused.inc();
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let guard = OpenConnection::new(&meters);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let meters = meters.clone();
        let mut stop = stop.clone();
        connections.spawn(async move {
            let _guard = guard;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            let ended = tokio::select! {
                r = conn.as_mut() => r,
                () = stopped => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                if e.is_timeout() {
                    meters.header_timeouts.inc();
                }
                tracing::debug!(error = %e, "a connection ended");
            }
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// One open connection on its listener's gauge, for as long as it lives.
struct OpenConnection(Meters);

impl OpenConnection {
    fn new(meters: &Meters) -> OpenConnection {
        meters.open.inc();
        OpenConnection(meters.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.dec();
    }
}

/// The body of `req` has `timeout` from now to arrive whole; a request whose body did not
/// is answered 408, whatever its handler made of the cut body.
async fn body_deadline(
    req: Request<Body>,
    next: axum::middleware::Next,
    timeout: Duration,
    cut_bodies: Counter,
) -> Response {
    let cut = Arc::new(AtomicBool::new(false));
    let (parts, body) = req.into_parts();
    let body = Body::new(DeadlineBody {
        inner: body,
        until: tokio::time::Instant::now() + timeout,
        deadline: None,
        cut: cut.clone(),
    });
    let resp = next.run(Request::from_parts(parts, body)).await;
    if cut.load(Ordering::Acquire) {
        cut_bodies.inc();
        return crate::http::error(
            StatusCode::REQUEST_TIMEOUT,
            ErrorCode::BodyTimeout,
            format!(
                "the request's body did not arrive within {} ms of its headers",
                timeout.as_millis()
            ),
        );
    }
    resp
}

/// A request body that fails once its deadline passes. Its timer is made only when the
/// body first has to wait: a webhook's body that came with its headers (most of them)
/// costs the request path no timer.
struct DeadlineBody {
    inner: Body,
    until: tokio::time::Instant,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    cut: Arc<AtomicBool>,
}

/// The error a [`DeadlineBody`] ends with.
#[derive(Debug, thiserror::Error)]
#[error("the request's body did not arrive in time")]
struct BodyTimedOut;

impl hyper::body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = hyper::body::Body::poll_frame(Pin::new(&mut this.inner), cx) {
            return Poll::Ready(frame);
        }
        let until = this.until;
        let deadline = this
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
        if deadline.as_mut().poll(cx).is_ready() {
            this.cut.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        hyper::body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> SizeHint {
        hyper::body::Body::size_hint(&self.inner)
    }
}
