//! `l2arc-fuzz`: writes the seed corpus, and runs a target under a
//! mutation loop when AFL++ is not at hand.
//!
//! Why a loop of our own. AFL++ (`fuzz/`, with `cargo afl`) is the
//! coverage-guided fuzzer; this loop is the fallback that needs nothing but
//! this workspace: it mutates the corpus of a target (bit flips, byte sets,
//! interesting values, inserts, deletes, splices), runs the target in
//! process at millions of executions a minute, and writes every input that
//! panics to `crashes/TARGET/` to be fixed and kept in the corpus.
//!
//! ```text
//! l2arc-fuzz seed CORPUS_DIR                 write the seed inputs of every target
//! l2arc-fuzz run TARGET CORPUS_DIR EXECS     mutate and run; crashes to crashes/TARGET/
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Longest input the loop makes (the largest seed is a 200-entry log block).
const INPUT_MAX_BYTES: usize = 16 << 10;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["seed", dir] => seed(Path::new(dir)),
        ["run", target, dir, execs] => match execs.parse::<u64>() {
            Ok(n) => run(target, Path::new(dir), n),
            Err(_) => Err(format!("`{execs}` is not a number of executions")),
        },
        _ => Err("usage: l2arc-fuzz seed CORPUS_DIR | run TARGET CORPUS_DIR EXECS".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("l2arc-fuzz: {e}");
            ExitCode::FAILURE
        }
    }
}

fn seed(dir: &Path) -> Result<(), String> {
    for (name, _) in l2arc_fuzz::TARGETS {
        let target_dir = dir.join(name);
        std::fs::create_dir_all(&target_dir).map_err(|e| e.to_string())?;
        for (i, input) in l2arc_fuzz::seeds(name).iter().enumerate() {
            std::fs::write(target_dir.join(format!("seed-{i}")), input)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// xorshift64*: fast, deterministic for a given start.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const INTERESTING: &[u64] = &[
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0xffff_ffff,
    4096,
    4095,
    1 << 20,
    32 << 20,
    u64::MAX,
];

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next() as u8;
            }
            2 if len > 0 => {
                // An interesting value, 1/2/4/8 bytes, either endianness.
                let width = 1 << rng.below(4);
                let value = INTERESTING[rng.below(INTERESTING.len())];
                let bytes = if rng.below(2) == 0 {
                    value.to_be_bytes()
                } else {
                    value.to_le_bytes()
                };
                let src = if rng.below(2) == 0 {
                    &bytes[8 - width..]
                } else {
                    &bytes[..width]
                };
                let at = rng.below(len);
                let n = src.len().min(len - at);
                input[at..at + n].copy_from_slice(&src[..n]);
            }
            3 if len < INPUT_MAX_BYTES => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(32);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                input.splice(at..at, bytes);
            }
            4 if len > 1 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(64));
                input.drain(at..at + n);
            }
            5 if !corpus.is_empty() => {
                // Splice: a piece of another corpus input.
                let other = &corpus[rng.below(corpus.len())];
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let n = 1 + rng.below((other.len() - from).min(256));
                    let at = rng.below(len + 1);
                    input.splice(at..at, other[from..from + n].iter().copied());
                }
            }
            6 if len > 1 => {
                // Copy a block within the input (repeats headers).
                let from = rng.below(len);
                let n = 1 + rng.below((len - from).min(64));
                let piece = input[from..from + n].to_vec();
                let at = rng.below(len);
                let m = n.min(len - at);
                input[at..at + m].copy_from_slice(&piece[..m]);
            }
            _ => {
                if len > 0 && rng.below(4) == 0 {
                    input.truncate(rng.below(len));
                }
            }
        }
    }
    input.truncate(INPUT_MAX_BYTES);
}

fn read_corpus(dir: &Path) -> Result<Vec<Vec<u8>>, String> {
    let mut corpus = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if path.is_file() {
            corpus.push(std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?);
        }
    }
    Ok(corpus)
}

fn run(name: &str, dir: &Path, execs: u64) -> Result<(), String> {
    let target = l2arc_fuzz::target(name).ok_or_else(|| format!("no target `{name}`"))?;
    let corpus = read_corpus(&dir.join(name))?;
    if corpus.is_empty() {
        return Err(format!("{}: empty corpus", dir.join(name).display()));
    }
    let crashes = PathBuf::from("crashes").join(name);
    // A panic is a finding: keep its message short and go on.
    std::panic::set_hook(Box::new(|info| eprintln!("panic: {info}")));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ execs ^ name.len() as u64);
    let started = std::time::Instant::now();
    let mut found = 0u64;
    let mut input = Vec::with_capacity(INPUT_MAX_BYTES);
    for i in 0..execs {
        input.clear();
        input.extend_from_slice(&corpus[rng.below(corpus.len())]);
        mutate(&mut rng, &mut input, &corpus);
        if std::panic::catch_unwind(|| target(&input)).is_err() {
            found += 1;
            std::fs::create_dir_all(&crashes).map_err(|e| e.to_string())?;
            let path = crashes.join(format!("crash-{i}"));
            std::fs::write(&path, &input).map_err(|e| e.to_string())?;
            eprintln!("l2arc-fuzz: {name}: crash written to {}", path.display());
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{name}: {execs} executions in {secs:.1} s ({:.0}/s), {found} crashes",
        execs as f64 / secs
    );
    if found > 0 {
        return Err(format!("{found} crashes in {name}"));
    }
    Ok(())
}
