//! Integration tests of the `ankusa-relay` binary: one test binary, a module per area.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod admin;
mod archive;
mod backup;
mod boot;
mod cli;
mod cluster;
mod console;
mod contract;
mod crash;
mod dispatch;
mod docs;
mod endpoints;
mod erase;
mod faults;
mod filters;
mod image;
mod ingest;
mod kafka;
mod listeners;
mod logs;
mod memory;
mod nats;
mod objstore;
mod partition;
mod pause;
mod pull;
mod pull_bounds;
mod quota;
mod reload;
mod seed;
mod support;
mod tls;
mod upgrade;
