//! The configuration parser and its validation on any text and any `ANKUSA_*` overrides:
//! an answer (a config or an error naming the key), never a panic or a hang.
//!
//! Input: the YAML, then optionally a line `---env` and `KEY=VALUE` lines, each applied as
//! `ANKUSA_KEY=VALUE` (so the seeds are readable files).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (yaml, env) = text.split_once("\n---env\n").unwrap_or((&text, ""));
    let env = env
        .lines()
        .take(16)
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (format!("ANKUSA_{k}"), v.to_owned()));
    if let Ok(cfg) = ankusa_config::Config::from_yaml_unresolved(yaml, env) {
        // What parsed validates again.
        assert!(cfg.validate_with(ankusa_config::Secrets::Skip).is_ok());
    }
});
