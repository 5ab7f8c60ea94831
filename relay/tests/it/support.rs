//! Helpers shared by the integration tests: the real binary, stores built through the
//! library, and a minimal HTTP/1.1 GET over a real TCP connection.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use ankusa_relay::queue::deliveries::Envelope;
use ankusa_relay::queue::writer::Assembler;
use ankusa_relay::store::keys::AtMs;
use ankusa_relay::store::{OpenOptions, Store};

pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ankusa-relay"))
}

pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run ankusa-relay")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A format-3 store at `dir` holding `hooks` hooks over three tenants, closed again.
pub fn store_with_hooks(dir: &Path, hooks: u64) {
    let store = Store::open(dir, &OpenOptions::default()).expect("open");
    let mut asm = Assembler::open(&store, 1_000).expect("assembler");
    let envs: Vec<Envelope> = (0..hooks)
        .map(|i| Envelope {
            id: format!("hk_{i}"),
            tenant: match i % 3 {
                0 => None,
                1 => Some("acme".into()),
                _ => Some("globex".into()),
            },
            source: "it".into(),
            received_at: AtMs(1_000 + i),
            content_type: "application/json".into(),
            sinks: vec!["a".into(), "b".into()],
            body: b"{}".to_vec(),
        })
        .collect();
    let batch = asm.assemble(&store, &envs, true).expect("assemble");
    asm.commit(&store, batch, true).expect("commit");
}

/// `GET path` on 127.0.0.1:port; returns (status, body).
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Ok((status, body))
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Every file of a directory with its bytes.
pub fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect();
    v.sort();
    v
}
