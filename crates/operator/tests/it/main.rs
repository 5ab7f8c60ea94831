//! The operator's integration tests: one binary, a module per area.

// Test helpers panic on failure: that is how a test reports it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod admission;
mod chart;
mod cli;
mod cluster;
mod exposure;
mod gate;
mod golden;
mod leader;
mod nodes;
mod ownership;
mod planner;
mod reconcile;
mod support;
