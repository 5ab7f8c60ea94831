//! Only for the features of the host's `memchr` (see `[build-dependencies]` in
//! Cargo.toml): the node built alone then shares RocksDB's build with the test build.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Named, so the dependency is one the build uses.
    let _ = memchr::memchr(b'\n', b"");
}
