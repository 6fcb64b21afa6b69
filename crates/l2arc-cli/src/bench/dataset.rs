//! Deterministic benchmark datasets.
//!
//! Every byte of the dataset is a function of (seed, file, offset), so a
//! benchmark can check each read it makes against the truth without keeping
//! a copy: a cache that returns wrong bytes fails the run, however fast it
//! was. Generated once into a directory and reused when the parameters match
//! (a small manifest file records them).

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use l2arc::hash::mix64;
use serde::{Deserialize, Serialize};

const MANIFEST: &str = "l2arc-dataset.json";
const WRITE_CHUNK_BYTES: usize = 1 << 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetSpec {
    pub files: u32,
    pub file_size_bytes: u64,
    pub seed: u64,
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
        mix64(self.seed ^ (u64::from(file) << 48) ^ word_index)
    }

    /// Fills `buf` with the bytes of `file` starting at `offset`.
    pub fn fill(&self, file: u32, offset: u64, buf: &mut [u8]) {
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
}
