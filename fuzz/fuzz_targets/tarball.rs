//! `restore` of a hostile archive: any bytes as a `.tar.zst`, or any bytes as a tar then
//! zstd-compressed (so the fuzzer reaches the tar reader). Unpacking refuses or succeeds;
//! it never writes outside the data directory, and what it leaves there is plain files.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    compress: bool,
    bytes: Vec<u8>,
}

fuzz_target!(|i: Input| {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let archive = if i.compress {
        zstd::encode_all(i.bytes.as_slice(), 1).unwrap()
    } else {
        i.bytes
    };
    let r = ankusa_tarball::unpack_from(archive.as_slice(), &data);
    let beside: Vec<_> = std::fs::read_dir(root.path()).unwrap().collect();
    assert_eq!(beside.len(), 1, "something landed beside the data directory");
    for e in std::fs::read_dir(&data).unwrap() {
        let e = e.unwrap();
        assert!(e.file_type().unwrap().is_file(), "{:?} is not a plain file", e.path());
    }
    if r.is_ok() {
        assert!(!data.join(ankusa_tarball::RESTORING_MARKER).exists());
    } else {
        assert!(data.join(ankusa_tarball::RESTORING_MARKER).exists(), "a refused restore is not marked");
    }
});
