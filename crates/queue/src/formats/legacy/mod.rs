//! Older store formats, kept so the migrations can read them and the tests and fixtures
//! can write them. Nothing here runs on a live node's request path.

pub mod v2;
