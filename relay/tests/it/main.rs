//! Integration tests of the `ankusa-relay` binary: one test binary, a module per area.

mod cli;
mod support;
