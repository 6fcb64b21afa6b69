//! The fuzz corpus kept in the tree, replayed through every target on each
//! `cargo test`: seeds, and every input that once made a target panic
//! (`corpus/TARGET/crash-*`, each named after the bug it found). A decoder
//! that panics again, or whose encode/decode round trip breaks, fails here.

use std::path::Path;

fn corpus(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(name);
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.unwrap().path();
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&path).unwrap(),
            )
        })
        .collect();
    inputs.sort();
    inputs
}

#[test]
fn every_target_has_a_corpus_and_replays_it_without_panic() {
    for (name, target) in l2arc_fuzz::TARGETS {
        let inputs = corpus(name);
        assert!(
            inputs.len() >= l2arc_fuzz::seeds(name).len(),
            "corpus/{name} lacks its seeds: run `l2arc-fuzz seed crates/l2arc-fuzz/corpus`"
        );
        for (file, input) in inputs {
            if std::panic::catch_unwind(|| target(&input)).is_err() {
                panic!("corpus/{name}/{file} makes {name} panic");
            }
        }
    }
}

#[test]
fn the_seeds_in_the_tree_are_the_current_seeds() {
    // The seeds reach past every checksum and magic check; if an encoder
    // changes, the corpus must be rewritten with it.
    for (name, _) in l2arc_fuzz::TARGETS {
        let kept = corpus(name);
        for (i, seed) in l2arc_fuzz::seeds(name).iter().enumerate() {
            let file = format!("seed-{i}");
            let found = kept.iter().find(|(f, _)| *f == file);
            assert_eq!(
                found.map(|(_, b)| b),
                Some(seed),
                "corpus/{name}/{file} differs from seeds(): run `l2arc-fuzz seed crates/l2arc-fuzz/corpus`"
            );
        }
    }
}

#[test]
fn the_block_seeds_decode() {
    use l2arc::internals::format::{DeviceHeader, decode_log_block};
    for seed in l2arc_fuzz::seeds("device_header") {
        DeviceHeader::decode(&seed[1..]).expect("a header seed decodes");
    }
    for seed in l2arc_fuzz::seeds("log_block") {
        let guid = u128::from_le_bytes(seed[17..33].try_into().unwrap());
        decode_log_block(&seed[1..], guid).expect("a log block seed decodes");
    }
    for seed in l2arc_fuzz::seeds("control") {
        let line = std::str::from_utf8(&seed).unwrap().trim_end();
        l2arc_cli::control::ControlCommand::parse(line).expect("a control seed parses");
    }
    for seed in l2arc_fuzz::seeds("config") {
        l2arc_cli::service::CacheOptions::default()
            .resolve_toml(std::str::from_utf8(&seed).unwrap(), 64 << 10)
            .expect("a config seed resolves");
    }
}
