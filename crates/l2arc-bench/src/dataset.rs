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
//!
//! Two layouts. `DatasetSpec` is `files` files of one size (the demo and the
//! hit-path benchmarks). `MixedSizeDataset` (the seed experiments' scenarios) is a
//! spread of file sizes drawn log-uniformly from a range (1 MiB to 64 MiB by
//! default) until they sum to the requested total, as a directory of real
//! files would be: a few large files hold most of the bytes, many small ones
//! most of the names. Sizes are whole 128 KiB units, so a reader can always
//! fit eight aligned 128 KiB reads in a file. Both layouts write the same
//! manifest file, in shapes neither parses as the other, so a directory made
//! by one is regenerated, never misused, by the other; the manifest is
//! removed before files are rewritten and written last, so an interrupted
//! generation is never taken for a complete one.

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
pub(crate) struct DatasetSpec {
    pub files: u32,
    pub file_size_bytes: u64,
    pub seed: u64,
    /// Absent in manifests written before content modes existed: random.
    #[serde(default)]
    pub content: Content,
}

impl DatasetSpec {
    pub(crate) fn total_bytes(&self) -> u64 {
        u64::from(self.files) * self.file_size_bytes
    }

    pub(crate) fn file_name(index: u32) -> String {
        format!("file-{index:05}.bin")
    }

    /// The 8-byte word at `word_index` of file `file`.
    #[inline]
    pub(crate) fn word(&self, file: u32, word_index: u64) -> u64 {
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
    pub(crate) fn lz4_ratio(&self, record_bytes: u64, samples: u64) -> f64 {
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
            stored += if l2arc::internals::format::compress(
                &data,
                l2arc::Compression::Lz4,
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
    pub(crate) fn fill(&self, file: u32, offset: u64, buf: &mut [u8]) {
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
    pub(crate) fn verify(&self, file: u32, offset: u64, buf: &[u8]) -> bool {
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
    pub(crate) fn materialise(&self, dir: &Path) -> Result<()> {
        let sizes = vec![self.file_size_bytes; self.files as usize];
        write_files(
            dir,
            self,
            &sizes,
            &serde_json::to_string_pretty(self)?,
            |text| serde_json::from_str::<DatasetSpec>(text).ok().as_ref() == Some(self),
        )
    }
}

/// Writes the files of `spec` with `sizes_bytes` into `dir` and then the
/// manifest `manifest_json`, unless the manifest there already satisfies
/// `matches`. Files beyond the new count from an older dataset are removed.
fn write_files(
    dir: &Path,
    spec: &DatasetSpec,
    sizes_bytes: &[u64],
    manifest_json: &str,
    matches: impl Fn(&str) -> bool,
) -> Result<()> {
    if !dir.is_dir() {
        // Not create_dir_all: a mistyped path should fail, not grow a tree.
        fs::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let manifest = dir.join(MANIFEST);
    if let Ok(text) = fs::read_to_string(&manifest)
        && matches(&text)
    {
        return Ok(());
    }
    match fs::remove_file(&manifest) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", manifest.display())),
    }
    let mut chunk = vec![0u8; WRITE_CHUNK_BYTES];
    for (file, &size_bytes) in sizes_bytes.iter().enumerate() {
        let file = file as u32;
        let path = dir.join(DatasetSpec::file_name(file));
        let mut out =
            fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut offset = 0u64;
        while offset < size_bytes {
            let n = (size_bytes - offset).min(WRITE_CHUNK_BYTES as u64) as usize;
            for (i, word) in chunk[..n].chunks_mut(8).enumerate() {
                let bytes = spec.word(file, offset / 8 + i as u64).to_le_bytes();
                word.copy_from_slice(&bytes[..word.len()]);
            }
            out.write_all(&chunk[..n])
                .with_context(|| format!("cannot write {}", path.display()))?;
            offset += n as u64;
        }
    }
    // Leftovers of a larger dataset would only confuse someone listing the dir.
    for file in sizes_bytes.len() as u32.. {
        let path = dir.join(DatasetSpec::file_name(file));
        if fs::remove_file(&path).is_err() {
            break;
        }
    }
    fs::write(&manifest, manifest_json)
        .with_context(|| format!("cannot write {}", manifest.display()))?;
    Ok(())
}

/// Layout tag of `MixedSizeDataset` manifests; bump when the generator changes.
const MIXED_SIZES_LAYOUT: &str = "mixed_sizes_v1";
/// File sizes are whole multiples of this (eight of them fit the smallest file).
pub(crate) const SIZE_UNIT_BYTES: u64 = 128 << 10;

/// Files of mixed sizes summing to a total (see the module comment).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MixedSizeDataset {
    /// Always `MIXED_SIZES_LAYOUT`: tells this manifest from a `DatasetSpec` one.
    pub layout: String,
    pub seed: u64,
    pub content: Content,
    pub total_bytes: u64,
    pub min_file_bytes: u64,
    pub max_file_bytes: u64,
    /// Size of file `i` (`DatasetSpec::file_name(i)`).
    pub file_sizes_bytes: Vec<u64>,
}

impl MixedSizeDataset {
    /// Draws file sizes log-uniformly from [min, max] (whole `SIZE_UNIT_BYTES`)
    /// until they reach `total_bytes`; a last piece smaller than `min` is
    /// added to the file before it. Pure function of the arguments.
    pub(crate) fn new(
        total_bytes: u64,
        min_file_bytes: u64,
        max_file_bytes: u64,
        seed: u64,
        content: Content,
    ) -> Result<Self> {
        if !(min_file_bytes >= SIZE_UNIT_BYTES
            && min_file_bytes.is_multiple_of(SIZE_UNIT_BYTES)
            && max_file_bytes >= min_file_bytes
            && total_bytes >= min_file_bytes)
        {
            anyhow::bail!(
                "dataset: need 128 KiB <= min file size (a multiple of 128 KiB) <= max file size, and total >= min; got total {total_bytes}, min {min_file_bytes}, max {max_file_bytes}"
            );
        }
        // At most a million files: a bound on a mistyped total.
        if total_bytes / min_file_bytes > 1 << 20 {
            anyhow::bail!("dataset: more than 2^20 files of at least {min_file_bytes} bytes");
        }
        let mut state = seed ^ 0x6669_6c65_7369_7a65;
        let (ln_min, ln_max) = ((min_file_bytes as f64).ln(), (max_file_bytes as f64).ln());
        let mut sizes: Vec<u64> = Vec::new();
        let mut sum = 0u64;
        while sum < total_bytes {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let unit = (mix64(state) >> 11) as f64 / (1u64 << 53) as f64;
            let drawn = (ln_min + unit * (ln_max - ln_min)).exp() as u64;
            let size = (drawn / SIZE_UNIT_BYTES * SIZE_UNIT_BYTES)
                .clamp(min_file_bytes, max_file_bytes)
                .min(total_bytes - sum);
            if size < min_file_bytes {
                *sizes.last_mut().expect("total >= min: one file exists") += size;
            } else {
                sizes.push(size);
            }
            sum += size;
        }
        assert_eq!(sizes.iter().sum::<u64>(), total_bytes);
        Ok(Self {
            layout: MIXED_SIZES_LAYOUT.to_string(),
            seed,
            content,
            total_bytes,
            min_file_bytes,
            max_file_bytes,
            file_sizes_bytes: sizes,
        })
    }

    pub(crate) fn files(&self) -> u32 {
        self.file_sizes_bytes.len() as u32
    }

    /// The byte generator (every byte is a function of seed, file, offset).
    pub(crate) fn spec(&self) -> DatasetSpec {
        DatasetSpec {
            files: self.files(),
            file_size_bytes: self.min_file_bytes,
            seed: self.seed,
            content: self.content,
        }
    }

    /// How many of the first files come closest to `bytes` (at least one):
    /// the scenarios use prefixes of one dataset as their smaller datasets.
    pub(crate) fn prefix_files(&self, bytes: u64) -> usize {
        let mut sum = 0u64;
        for (i, &size) in self.file_sizes_bytes.iter().enumerate() {
            if sum + size >= bytes {
                let over = sum + size - bytes;
                let under = bytes - sum;
                return if over <= under || i == 0 { i + 1 } else { i };
            }
            sum += size;
        }
        self.file_sizes_bytes.len()
    }

    /// LZ4's ratio over `samples` records of `record_bytes` spread over the
    /// dataset's bytes (see `DatasetSpec::lz4_ratio`).
    pub(crate) fn lz4_ratio(&self, record_bytes: u64, samples: u64) -> f64 {
        let spec = self.spec();
        let records = (self.total_bytes / record_bytes).max(1);
        let samples = samples.clamp(1, records);
        let mut data = vec![0u8; record_bytes as usize];
        let mut compressed = Vec::new();
        let (mut logical, mut stored) = (0u64, 0u64);
        for i in 0..samples {
            // Global offset of the sample, then the file holding it.
            let mut at = i * records / samples * record_bytes;
            let mut file = 0usize;
            while at >= self.file_sizes_bytes[file] {
                at -= self.file_sizes_bytes[file];
                file += 1;
            }
            let size_bytes = self.file_sizes_bytes[file];
            let n = record_bytes.min(size_bytes);
            let at = at.min(size_bytes - n) / record_bytes * record_bytes;
            let file = file as u32;
            let n = n as usize;
            spec.fill(file, at, &mut data[..n]);
            logical += n as u64;
            stored += if l2arc::internals::format::compress(
                &data[..n],
                l2arc::Compression::Lz4,
                &mut compressed,
            ) {
                compressed.len() as u64
            } else {
                n as u64
            };
        }
        logical as f64 / stored.max(1) as f64
    }

    /// Makes the dataset in `dir` unless a matching one is there already.
    pub(crate) fn materialise(&self, dir: &Path) -> Result<()> {
        write_files(
            dir,
            &self.spec(),
            &self.file_sizes_bytes,
            &serde_json::to_string(self)?,
            |text| serde_json::from_str::<MixedSizeDataset>(text).ok().as_ref() == Some(self),
        )
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

    #[test]
    fn mixed_sizes_are_deterministic_spread_and_sum_to_the_total() {
        let total = 300 << 20;
        let a = MixedSizeDataset::new(total, 1 << 20, 64 << 20, 9, Content::Mixed).unwrap();
        let b = MixedSizeDataset::new(total, 1 << 20, 64 << 20, 9, Content::Mixed).unwrap();
        let c = MixedSizeDataset::new(total, 1 << 20, 64 << 20, 10, Content::Mixed).unwrap();
        assert_eq!(a, b, "same seed, same sizes");
        assert_ne!(
            a.file_sizes_bytes, c.file_sizes_bytes,
            "another seed, other sizes"
        );
        assert_eq!(a.file_sizes_bytes.iter().sum::<u64>(), total);
        assert!(a.file_sizes_bytes.iter().all(|s| s % SIZE_UNIT_BYTES == 0));
        assert!(a.file_sizes_bytes.iter().all(|&s| s >= 1 << 20));
        let (min, max) = (
            *a.file_sizes_bytes.iter().min().unwrap(),
            *a.file_sizes_bytes.iter().max().unwrap(),
        );
        assert!(max >= 8 * min, "sizes are spread: {min}..{max}");
        assert_eq!(a.prefix_files(total), a.files() as usize);
        assert_eq!(a.prefix_files(1), 1);
        let half = a.prefix_files(total / 2);
        let sum: u64 = a.file_sizes_bytes[..half].iter().sum();
        assert!(
            sum.abs_diff(total / 2) <= 64 << 20,
            "prefix {sum} near half"
        );
        // Bytes: same seed same bytes, another seed other bytes.
        let mut x = vec![0u8; 4096];
        let mut y = vec![0u8; 4096];
        a.spec().fill(3, 8192, &mut x);
        b.spec().fill(3, 8192, &mut y);
        assert_eq!(x, y);
        c.spec().fill(3, 8192, &mut y);
        assert_ne!(x, y);
        assert!(MixedSizeDataset::new(100, 1 << 20, 2 << 20, 1, Content::Mixed).is_err());
        assert!(MixedSizeDataset::new(8 << 20, 1000, 2 << 20, 1, Content::Mixed).is_err());
    }

    #[test]
    fn mixed_content_lz4_ratio_is_about_two_on_128k_records() {
        let d = MixedSizeDataset::new(64 << 20, 1 << 20, 8 << 20, 3, Content::Mixed).unwrap();
        let ratio = d.lz4_ratio(128 << 10, 128);
        assert!((1.8..=2.2).contains(&ratio), "LZ4 ratio {ratio:.2}");
        let random = MixedSizeDataset {
            content: Content::Random,
            ..d.clone()
        };
        assert!(random.lz4_ratio(128 << 10, 16) < 1.01);
    }

    #[test]
    fn mixed_size_dataset_is_written_reused_and_regenerated_on_change() {
        let dir = tempfile::tempdir().unwrap();
        let d = MixedSizeDataset::new(6 << 20, 1 << 20, 2 << 20, 5, Content::Mixed).unwrap();
        d.materialise(dir.path()).unwrap();
        for (file, &size) in d.file_sizes_bytes.iter().enumerate() {
            let bytes = fs::read(dir.path().join(DatasetSpec::file_name(file as u32))).unwrap();
            assert_eq!(bytes.len() as u64, size);
            assert!(d.spec().verify(file as u32, 0, &bytes));
        }
        let manifest = dir.path().join(MANIFEST);
        let before = fs::metadata(&manifest).unwrap().modified().unwrap();
        d.materialise(dir.path()).unwrap();
        assert_eq!(before, fs::metadata(&manifest).unwrap().modified().unwrap());
        // Another seed: regenerated, and the manifest says so.
        let e = MixedSizeDataset::new(6 << 20, 1 << 20, 2 << 20, 6, Content::Mixed).unwrap();
        e.materialise(dir.path()).unwrap();
        let text = fs::read_to_string(&manifest).unwrap();
        assert_eq!(serde_json::from_str::<MixedSizeDataset>(&text).unwrap(), e);
        let bytes = fs::read(dir.path().join(DatasetSpec::file_name(0))).unwrap();
        assert!(e.spec().verify(0, 0, &bytes));
        // A uniform dataset in the same directory replaces it, and back.
        let uniform = DatasetSpec {
            files: 2,
            file_size_bytes: 1 << 20,
            seed: 6,
            content: Content::Mixed,
        };
        uniform.materialise(dir.path()).unwrap();
        assert!(
            serde_json::from_str::<MixedSizeDataset>(&fs::read_to_string(&manifest).unwrap())
                .is_err()
        );
        assert!(
            !dir.path().join(DatasetSpec::file_name(2)).exists(),
            "leftover files removed"
        );
        e.materialise(dir.path()).unwrap();
        let bytes = fs::read(dir.path().join(DatasetSpec::file_name(1))).unwrap();
        assert_eq!(bytes.len() as u64, e.file_sizes_bytes[1]);
        // A manifest of the old layout (equal-size files) never parses as this one.
        let old = r#"{"files":1,"file_size_bytes":8,"seed":1}"#;
        assert!(serde_json::from_str::<MixedSizeDataset>(old).is_err());
    }
}
