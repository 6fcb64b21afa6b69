//! Deterministic benchmark datasets.
//!
//! Every byte of the dataset is a function of (seed, file, offset), so a
//! benchmark can check each read it makes against the truth without keeping
//! a copy: a cache that returns wrong bytes fails the run, however fast it
//! was. Generated once into a directory and reused when the parameters match
//! (a small manifest file records them).
//!
//! Two kinds of content (`--content`):
//!
//! - `random` (the default): every 8-byte word is a hash of its position, so
//!   nothing compresses. The L2ARC then stores every record as it is: the
//!   worst case for the flash tier, and figures that do not depend on how
//!   compressible someone's data happens to be.
//! - `mixed`: the data comes in 64-byte units; a hash of the unit's position
//!   makes 45% of them random words as above and the rest one of 16 fixed
//!   64-byte lines of text (log-like, structured words). LZ4 stores a
//!   repeated line as a short back-reference, so a 128 KiB record compresses
//!   2.0:1 (an 8 KiB record 1.75:1: fewer repeats within it), about what LZ4
//!   does to text, logs and tables; every byte is still a pure function of its
//!   position, so `verify` checks it the same way.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context, Result};
use l2arc::hash::mix64;
use serde::{Deserialize, Serialize};

const MANIFEST: &str = "l2arc-dataset.json";
const WRITE_CHUNK_BYTES: usize = 1 << 20;

/// What the dataset's bytes look like (see the module comment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Content {
    /// Incompressible: every word a hash of its position.
    #[default]
    Random,
    /// About 2:1 with LZ4: random 64-byte units mixed with repeated lines of text.
    Mixed,
}

/// Words per unit of `mixed` content (one text line is one unit).
const UNIT_WORDS: u64 = 8;
/// Share of `mixed` units that are random, in thousandths: tuned so that
/// LZ4 compresses a 128 KiB record 2:1 (see the test below).
const MIXED_RANDOM_PER_MILLE: u64 = 450;
const TEXT_LINES: usize = 16;
const MIXED_SALT: u64 = 0x6d69_7865_6443_6f6e;

/// The 16 lines of text `mixed` content draws from, as little-endian words.
fn text_lines() -> &'static [[u64; UNIT_WORDS as usize]; TEXT_LINES] {
    static LINES: OnceLock<[[u64; UNIT_WORDS as usize]; TEXT_LINES]> = OnceLock::new();
    LINES.get_or_init(|| {
        const WORDS: &[&str] = &[
            "read",
            "record",
            "cache",
            "block",
            "device",
            "object",
            "offset",
            "size=8192",
            "hit",
            "miss",
            "evict",
            "arc",
            "l2arc",
            "dataset",
            "ok",
            "INFO",
            "WARN",
            "user",
            "txg",
            "id=",
            "name",
            "path=/srv/data",
            "status",
            "200",
            "GET",
            "PUT",
            "the",
            "of",
            "and",
            "table",
            "row",
            "value",
        ];
        let mut state = 0x5eed_u64;
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            mix64(state)
        };
        let mut lines = [[0u64; UNIT_WORDS as usize]; TEXT_LINES];
        for (n, line) in lines.iter_mut().enumerate() {
            let mut text = format!("{:04} ", n * 37 % 10_000).into_bytes();
            while text.len() < 63 {
                text.extend_from_slice(WORDS[(next() % WORDS.len() as u64) as usize].as_bytes());
                text.push(if next() % 4 == 0 { b',' } else { b' ' });
            }
            text.truncate(63);
            text.push(b'\n');
            for (word, bytes) in line.iter_mut().zip(text.chunks_exact(8)) {
                *word = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
            }
        }
        lines
    })
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetSpec {
    pub files: u32,
    pub file_size_bytes: u64,
    pub seed: u64,
    /// Absent in manifests written before content modes existed: random.
    #[serde(default)]
    pub content: Content,
}

impl DatasetSpec {
    pub fn total_bytes(&self) -> u64 {
        u64::from(self.files) * self.file_size_bytes
    }

    pub fn file_name(index: u32) -> String {
        format!("file-{index:05}.bin")
    }

    /// The 8-byte word at `word_index` of file `file`.
    #[inline]
    pub fn word(&self, file: u32, word_index: u64) -> u64 {
        let base = self.seed ^ (u64::from(file) << 48);
        match self.content {
            Content::Random => mix64(base ^ word_index),
            Content::Mixed => {
                let unit = mix64(base ^ MIXED_SALT ^ (word_index / UNIT_WORDS));
                if unit % 1000 < MIXED_RANDOM_PER_MILLE {
                    mix64(base ^ word_index)
                } else {
                    text_lines()[((unit >> 32) % TEXT_LINES as u64) as usize]
                        [(word_index % UNIT_WORDS) as usize]
                }
            }
        }
    }

    /// LZ4's ratio (logical / compressed bytes) over `samples` records of
    /// `record_bytes` spread over the dataset: what `compression=lz4` can
    /// gain before the L2ARC rounds records up to 4 KiB blocks.
    pub fn lz4_ratio(&self, record_bytes: u64, samples: u64) -> f64 {
        let records_per_file = (self.file_size_bytes / record_bytes).max(1);
        let records = records_per_file * u64::from(self.files);
        let samples = samples.clamp(1, records);
        let mut data = vec![0u8; record_bytes.min(self.file_size_bytes) as usize];
        let mut compressed = Vec::new();
        let (mut logical, mut stored) = (0u64, 0u64);
        for i in 0..samples {
            let r = i * records / samples;
            let (file, offset) = (
                (r / records_per_file) as u32,
                (r % records_per_file) * record_bytes,
            );
            self.fill(file, offset, &mut data);
            logical += data.len() as u64;
            stored += if l2arc::l2arc::format::compress(
                &data,
                l2arc::l2arc::format::Compression::Lz4,
                &mut compressed,
            ) {
                compressed.len() as u64
            } else {
                data.len() as u64
            };
        }
        logical as f64 / stored.max(1) as f64
    }

    /// Fills `buf` with the bytes of `file` starting at `offset`.
    pub fn fill(&self, file: u32, offset: u64, buf: &mut [u8]) {
        if offset.is_multiple_of(8) {
            for (i, chunk) in buf.chunks_mut(8).enumerate() {
                let bytes = self.word(file, offset / 8 + i as u64).to_le_bytes();
                chunk.copy_from_slice(&bytes[..chunk.len()]);
            }
            return;
        }
        for (i, byte) in buf.iter_mut().enumerate() {
            let at = offset + i as u64;
            *byte = self.word(file, at / 8).to_le_bytes()[(at % 8) as usize];
        }
    }

    /// Checks that `buf` holds the bytes of `file` at `offset` (fast path for
    /// word-aligned reads).
    pub fn verify(&self, file: u32, offset: u64, buf: &[u8]) -> bool {
        if offset.is_multiple_of(8) && buf.len().is_multiple_of(8) {
            return buf
                .chunks_exact(8)
                .enumerate()
                .all(|(i, chunk)| chunk == self.word(file, offset / 8 + i as u64).to_le_bytes());
        }
        let mut expected = vec![0u8; buf.len()];
        self.fill(file, offset, &mut expected);
        expected == buf
    }

    /// Makes the dataset in `dir` unless a matching one is there already.
    pub fn materialise(&self, dir: &Path) -> Result<()> {
        if !dir.is_dir() {
            // Not create_dir_all: a mistyped path should fail, not grow a tree.
            fs::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let manifest = dir.join(MANIFEST);
        if let Ok(text) = fs::read_to_string(&manifest)
            && serde_json::from_str::<DatasetSpec>(&text).ok().as_ref() == Some(self)
        {
            return Ok(());
        }
        let mut chunk = vec![0u8; WRITE_CHUNK_BYTES];
        for file in 0..self.files {
            let path = dir.join(Self::file_name(file));
            let mut out = fs::File::create(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            let mut offset = 0u64;
            while offset < self.file_size_bytes {
                let n = (self.file_size_bytes - offset).min(WRITE_CHUNK_BYTES as u64) as usize;
                for (i, word) in chunk[..n].chunks_mut(8).enumerate() {
                    let bytes = self.word(file, offset / 8 + i as u64).to_le_bytes();
                    word.copy_from_slice(&bytes[..word.len()]);
                }
                out.write_all(&chunk[..n])
                    .with_context(|| format!("cannot write {}", path.display()))?;
                offset += n as u64;
            }
        }
        fs::write(&manifest, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("cannot write {}", manifest.display()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_match_the_generator_and_are_reused() {
        let dir = tempfile::tempdir().unwrap();
        let spec = DatasetSpec {
            files: 2,
            file_size_bytes: 3 * WRITE_CHUNK_BYTES as u64 + 5,
            seed: 42,
            content: Content::Random,
        };
        spec.materialise(dir.path()).unwrap();
        for file in 0..2 {
            let bytes = fs::read(dir.path().join(DatasetSpec::file_name(file))).unwrap();
            assert_eq!(bytes.len() as u64, spec.file_size_bytes);
            assert!(spec.verify(file, 0, &bytes));
            assert!(spec.verify(file, 13, &bytes[13..1000]));
            assert!(!spec.verify(1 - file, 0, &bytes[..64]), "files must differ");
        }
        let before = fs::metadata(dir.path().join(DatasetSpec::file_name(0)))
            .unwrap()
            .modified()
            .unwrap();
        spec.materialise(dir.path()).unwrap();
        let after = fs::metadata(dir.path().join(DatasetSpec::file_name(0)))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(
            before, after,
            "a matching dataset must be reused, not rewritten"
        );
    }

    #[test]
    fn mixed_content_is_verifiable_and_compresses_about_two_to_one() {
        let dir = tempfile::tempdir().unwrap();
        let spec = DatasetSpec {
            files: 2,
            file_size_bytes: 2 * WRITE_CHUNK_BYTES as u64 + 13,
            seed: 7,
            content: Content::Mixed,
        };
        spec.materialise(dir.path()).unwrap();
        let bytes = fs::read(dir.path().join(DatasetSpec::file_name(1))).unwrap();
        assert!(spec.verify(1, 0, &bytes));
        assert!(spec.verify(1, 101, &bytes[101..5000]));
        assert!(!spec.verify(0, 0, &bytes[..4096]), "files must differ");
        let mut filled = vec![0u8; 999];
        spec.fill(1, 77, &mut filled);
        assert_eq!(&filled[..], &bytes[77..77 + 999]);
        let units = bytes[..1 << 16].chunks_exact(64);
        let text = units
            .filter(|unit| {
                text_lines().iter().any(|line| {
                    unit.chunks_exact(8)
                        .zip(line)
                        .all(|(b, w)| b == w.to_le_bytes())
                })
            })
            .count();
        assert!(
            (500..650).contains(&text),
            "about 55% of the 1024 units are text lines: {text}"
        );
        let random = DatasetSpec {
            content: Content::Random,
            ..spec.clone()
        };
        assert_ne!(random.word(0, 3), spec.word(0, 3) ^ 1);
        for record in [8 << 10, 128 << 10] {
            let ratio = spec.lz4_ratio(record, 16);
            let expected = if record == 8 << 10 {
                1.6..1.9
            } else {
                1.85..2.15
            };
            assert!(
                expected.contains(&ratio),
                "LZ4 ratio {ratio:.2} at {record}"
            );
            let incompressible = random.lz4_ratio(record, 4);
            assert!(
                incompressible < 1.01,
                "random data compressed {incompressible:.2}"
            );
        }
        // A manifest from before content modes means random content.
        let old: DatasetSpec =
            serde_json::from_str(r#"{"files":1,"file_size_bytes":8,"seed":1}"#).unwrap();
        assert_eq!(old.content, Content::Random);
    }
}
