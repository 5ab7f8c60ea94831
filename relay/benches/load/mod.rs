//! The HTTP load of the benches that post hooks (`ingest`, `replay`): keep-alive clients
//! posting JSON bodies of a fixed size, each expecting its 202.

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub type HttpClient = Client<HttpConnector, Full<bytes::Bytes>>;

/// A client keeping up to `connections` connections alive.
pub fn client(connections: usize) -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(connections)
        .build_http()
}

/// A JSON body of exactly `size` bytes, distinct per worker and request.
pub fn body(worker: u64, n: u64, size: usize) -> Vec<u8> {
    let mut body = format!(r#"{{"worker":{worker},"n":{n},"pad":""#).into_bytes();
    body.resize(size - 2, b'x');
    body.extend_from_slice(b"\"}");
    body
}

/// Sends `req`, reads the answer, asserts it is 202; the ack latency.
pub async fn post_acked(client: &HttpClient, req: hyper::Request<Full<bytes::Bytes>>) -> Duration {
    let t = Instant::now();
    let resp = client.request(req).await.expect("response");
    let status = resp.status();
    resp.into_body().collect().await.expect("body");
    assert_eq!(status, 202, "every hook must be acked");
    t.elapsed()
}

/// The results of every client task, in one list.
pub async fn gather<T>(tasks: Vec<tokio::task::JoinHandle<Vec<T>>>) -> Vec<T> {
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client task"));
    }
    all
}
