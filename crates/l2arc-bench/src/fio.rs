//! Running fio and reading its JSON: the yardstick several scenarios
//! measure against (the bare cache file, the FUSE mount's source, nbdkit).
//!
//! One builder (`FioJob`) makes every fio command line and one parser reads
//! every result, so the scenarios' fio runs differ only in what they say
//! they differ in (engine, pattern, block size, depth, jobs), and every
//! scenario reads the same fields the same way (fio prints notes before its
//! JSON document at times). Every job is time-based random or sequential
//! reads with latency percentiles; the command line keeps `--ioengine`
//! before the target, since an engine's own options (the nbd engine's
//! `--uri`) are only known once the engine is.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// What a fio job reads.
#[derive(Clone, Debug)]
pub(crate) enum FioTarget {
    /// Files (`--filename`, colon-separated; colons in names escaped).
    Files(Vec<PathBuf>),
    /// An NBD export (`--uri`, for the nbd engine).
    NbdUri(String),
}

/// One fio job: built with `FioJob::new`, adjusted with its setters, run
/// with `run`.
#[derive(Clone, Debug)]
pub(crate) struct FioJob {
    name: &'static str,
    ioengine: &'static str,
    target: FioTarget,
    rw: &'static str,
    block_bytes: u64,
    runtime_secs: u64,
    readonly: bool,
    direct: Option<bool>,
    keep_page_cache: bool,
    offset_bytes: Option<u64>,
    size_bytes: Option<u64>,
    iodepth: Option<usize>,
    numjobs: Option<usize>,
    random_distribution: Option<String>,
    threads: bool,
    seed: Option<u64>,
    iops_log: bool,
    verify: bool,
}

/// The read side of one fio job (or of a group, with several jobs).
#[derive(Clone, Debug)]
pub(crate) struct FioRead {
    pub iops: f64,
    pub mib_per_sec: f64,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    /// The slowest read.
    pub latency_us_max: f64,
    /// Reads done in the run (all jobs).
    pub reads: f64,
    /// CPU time (user + system) of fio's jobs per read, in microseconds.
    pub cpu_us_per_read: f64,
    /// IOPS in each whole second (with `FioJob::iops_log` only).
    pub iops_per_second: Vec<f64>,
}

impl FioJob {
    /// `rw` (`randread`, `read`) of `block_bytes` with `ioengine` from
    /// `target` for `runtime_secs` (time-based); random offsets fresh on
    /// every run (`--randrepeat=0`) unless `seed` is set.
    pub(crate) fn new(
        name: &'static str,
        ioengine: &'static str,
        target: FioTarget,
        rw: &'static str,
        block_bytes: u64,
        runtime_secs: u64,
    ) -> Self {
        Self {
            name,
            ioengine,
            target,
            rw,
            block_bytes,
            runtime_secs,
            readonly: false,
            direct: None,
            keep_page_cache: false,
            offset_bytes: None,
            size_bytes: None,
            iodepth: None,
            numjobs: None,
            random_distribution: None,
            threads: false,
            seed: None,
            iops_log: false,
            verify: false,
        }
    }

    /// `--readonly`: fio refuses to write.
    pub(crate) fn readonly(mut self) -> Self {
        self.readonly = true;
        self
    }

    /// `--direct=1` (O_DIRECT) or `--direct=0`.
    pub(crate) fn direct(mut self, direct: bool) -> Self {
        self.direct = Some(direct);
        self
    }

    /// `--invalidate=0`: the files' pages stay in the page cache.
    pub(crate) fn keep_page_cache(mut self) -> Self {
        self.keep_page_cache = true;
        self
    }

    /// `--offset`: reads start this far into the target.
    pub(crate) fn offset_bytes(mut self, offset_bytes: u64) -> Self {
        self.offset_bytes = Some(offset_bytes);
        self
    }

    /// `--size`: reads stay within this many bytes (from the offset).
    pub(crate) fn size_bytes(mut self, size_bytes: u64) -> Self {
        self.size_bytes = Some(size_bytes);
        self
    }

    /// `--iodepth`: reads in flight per job.
    pub(crate) fn iodepth(mut self, iodepth: usize) -> Self {
        self.iodepth = Some(iodepth);
        self
    }

    /// `--numjobs` with `--group_reporting`: the jobs reported as one.
    pub(crate) fn numjobs(mut self, numjobs: usize) -> Self {
        self.numjobs = Some(numjobs);
        self
    }

    /// `--random_distribution` (`zoned:80/20:20/80`, ...).
    pub(crate) fn random_distribution(mut self, distribution: &str) -> Self {
        self.random_distribution = Some(distribution.to_string());
        self
    }

    /// `--thread`: jobs are threads of one process, not processes.
    pub(crate) fn threads(mut self) -> Self {
        self.threads = true;
        self
    }

    /// `--randseed`: the same random offsets on every run with this seed.
    pub(crate) fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// `--verify=crc32c --verify_only=1`: every block read is checked
    /// against the CRC-32C fio wrote into its header (the target must have
    /// been written by [`write_verifiable`] with the same block size).
    pub(crate) fn verify_crc32c(mut self) -> Self {
        self.verify = true;
        self
    }

    /// Also log IOPS per second (`FioRead::iops_per_second`).
    pub(crate) fn iops_log(mut self) -> Self {
        self.iops_log = true;
        self
    }

    /// `--numjobs=N x` or `ENGINE iodepth N`: the job as a table names it.
    pub(crate) fn describe(&self) -> String {
        let job = match self.numjobs {
            Some(jobs) if jobs > 1 => format!("{} x{jobs} jobs", self.ioengine),
            _ => format!("{} iodepth {}", self.ioengine, self.iodepth.unwrap_or(1)),
        };
        if self.verify {
            format!("{job} +crc32c")
        } else {
            job
        }
    }

    /// `fio ARGS` as run (without an iops log's temporary prefix).
    pub(crate) fn command_line(&self) -> String {
        format!("fio {}", self.args(None).join(" "))
    }

    /// Runs fio in `dir` (or here) and returns the reads of the job (of the
    /// group, with several jobs).
    pub(crate) fn run(&self, dir: Option<&Path>) -> Result<FioRead> {
        let logs = if self.iops_log {
            Some(tempfile::tempdir()?)
        } else {
            None
        };
        let log_prefix = logs.as_ref().map(|d| d.path().join("run"));
        let args = self.args(log_prefix.as_deref());
        let mut command = Command::new("fio");
        if let Some(dir) = dir {
            command.current_dir(dir);
        }
        let out = command
            .args(&args)
            .output()
            .context("cannot run fio: install it (scripts/setup.sh does)")?;
        if !out.status.success() {
            bail!(
                "fio {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let mut read = parse_read(
            &String::from_utf8_lossy(&out.stdout),
            self.numjobs.unwrap_or(1),
        )?;
        if let Some(prefix) = &log_prefix {
            read.iops_per_second = iops_per_second(prefix)?;
        }
        Ok(read)
    }

    fn args(&self, iops_log_prefix: Option<&Path>) -> Vec<String> {
        let mut args = vec![
            format!("--name={}", self.name),
            format!("--ioengine={}", self.ioengine),
        ];
        args.push(match &self.target {
            FioTarget::Files(files) => format!("--filename={}", file_names(files)),
            FioTarget::NbdUri(uri) => format!("--uri={uri}"),
        });
        let flag = |on: bool, arg: &str| on.then(|| arg.to_string());
        let value = |name: &str, v: Option<String>| v.map(|v| format!("--{name}={v}"));
        args.extend(
            [
                flag(self.readonly, "--readonly"),
                value("direct", self.direct.map(|d| u8::from(d).to_string())),
                flag(self.keep_page_cache, "--invalidate=0"),
                Some(format!("--rw={}", self.rw)),
                Some(format!("--bs={}", self.block_bytes)),
                value("offset", self.offset_bytes.map(|n| n.to_string())),
                value("size", self.size_bytes.map(|n| n.to_string())),
                value("iodepth", self.iodepth.map(|n| n.to_string())),
                value("numjobs", self.numjobs.map(|n| n.to_string())),
                value("random_distribution", self.random_distribution.clone()),
                flag(self.threads, "--thread"),
                flag(self.numjobs.is_some(), "--group_reporting"),
                flag(self.verify, "--verify=crc32c"),
                flag(self.verify, "--verify_only=1"),
            ]
            .into_iter()
            .flatten(),
        );
        args.extend(self.timing_args(iops_log_prefix));
        args
    }

    /// How long, which offsets, and what to report.
    fn timing_args(&self, iops_log_prefix: Option<&Path>) -> Vec<String> {
        let mut args = vec![
            "--time_based".to_string(),
            format!("--runtime={}", self.runtime_secs),
            "--norandommap".into(),
            match self.seed {
                Some(seed) => format!("--randseed={seed}"),
                None => "--randrepeat=0".into(),
            },
            "--lat_percentiles=1".into(),
        ];
        if let Some(prefix) = iops_log_prefix {
            args.push(format!("--write_iops_log={}", prefix.display()));
            args.push("--log_avg_msec=1000".into());
        }
        args.push("--output-format=json".into());
        args
    }
}

/// fio's `--filename` for several files: colon-separated, colons escaped.
fn file_names(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|f| f.display().to_string().replace(':', "\\:"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The first job's reads from fio's JSON output (`jobs` jobs reported as
/// one group: fio gives the CPU share per job).
fn parse_read(output: &str, jobs: usize) -> Result<FioRead> {
    let json = &output[output.find('{').context("fio printed no JSON")?..];
    let doc: serde_json::Value = serde_json::from_str(json).context("fio's JSON")?;
    let job = &doc["jobs"][0];
    let read = &job["read"];
    let percentile = |q: &str| -> Result<f64> {
        read["lat_ns"]["percentile"][q]
            .as_f64()
            .map(|ns| ns / 1000.0)
            .with_context(|| format!("fio's JSON has no read.lat_ns percentile {q}"))
    };
    let cpu_percent =
        job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0);
    let runtime_secs = job["job_runtime"].as_f64().unwrap_or(0.0) / 1000.0;
    let reads = read["total_ios"].as_f64().unwrap_or(0.0);
    let cpu_us_per_read = if reads > 0.0 {
        cpu_percent / 100.0 * runtime_secs * jobs as f64 / reads * 1e6
    } else {
        0.0
    };
    Ok(FioRead {
        cpu_us_per_read,
        iops: read["iops"]
            .as_f64()
            .context("fio's JSON has no read.iops")?,
        mib_per_sec: read["bw_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
        latency_us_p50: percentile("50.000000")?,
        latency_us_p99: percentile("99.000000")?,
        latency_us_max: read["lat_ns"]["max"].as_f64().unwrap_or(0.0) / 1000.0,
        reads,
        iops_per_second: Vec::new(),
    })
}

/// IOPS in each whole second of a run, summed over its jobs, from the logs
/// fio writes with `--write_iops_log=PREFIX --log_avg_msec=1000` (one file
/// per job: PREFIX_iops.N.log, lines of `msec, iops, dir, bs, offset`).
/// The last, partial second of each job is left out.
fn iops_per_second(prefix: &Path) -> Result<Vec<f64>> {
    let dir = prefix
        .parent()
        .context("iops log prefix has no directory")?;
    let stem = prefix
        .file_name()
        .and_then(|s| s.to_str())
        .context("iops log prefix")?;
    let mut jobs: Vec<Vec<f64>> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(&format!("{stem}_iops.")) && name.ends_with(".log")) {
            continue;
        }
        let text = std::fs::read_to_string(dir.join(&*name))?;
        jobs.push(
            text.lines()
                .filter_map(|l| l.split(',').nth(1)?.trim().parse().ok())
                .collect(),
        );
    }
    if jobs.is_empty() {
        bail!("fio wrote no iops log under {}", prefix.display());
    }
    // Seconds every job covered in whole (each job's last one is partial).
    let seconds = jobs
        .iter()
        .map(|j| j.len().saturating_sub(1))
        .min()
        .unwrap_or(0);
    let totals = (0..seconds)
        .map(|i| jobs.iter().map(|j| j[i]).sum())
        .collect();
    Ok(totals)
}

/// `fio --version`, or an error that says how to install fio.
/// Writes `size_bytes` of `path` with fio in blocks of `block_bytes`, each
/// carrying fio's verify header (a CRC-32C of the block), for a later
/// [`FioJob::verify_crc32c`] read of the same block size.
pub(crate) fn write_verifiable(path: &Path, size_bytes: u64, block_bytes: u64) -> Result<()> {
    let out = Command::new("fio")
        .arg("--name=verifiable")
        .arg(format!("--filename={}", path.display()))
        .args([
            "--rw=write",
            "--ioengine=io_uring",
            "--iodepth=32",
            "--direct=1",
        ])
        .arg(format!("--bs={block_bytes}"))
        .arg(format!("--size={size_bytes}"))
        .args(["--verify=crc32c", "--do_verify=0", "--verify_state_save=0"])
        .arg("--output-format=json")
        .output()
        .context("cannot run fio: install it (scripts/setup.sh does)")?;
    if !out.status.success() {
        bail!(
            "fio writing {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

pub(crate) fn version() -> Result<String> {
    match Command::new("fio").arg("--version").output() {
        Ok(out) if out.status.success() => {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        }
        Ok(out) => bail!(
            "fio --version failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "fio is not installed: this scenario measures its baseline with fio; \
             install it (scripts/setup.sh does, or: apt-get install fio)"
        ),
        Err(e) => bail!("cannot run fio: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(args: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn nbd_job_is_the_command_the_reports_quote() {
        let job = FioJob::new(
            "nbd",
            "nbd",
            FioTarget::NbdUri("URI".into()),
            "randread",
            4096,
            2,
        )
        .size_bytes(1 << 24)
        .iodepth(16)
        .random_distribution("zoned:80/20:20/80")
        .seed(7);
        assert_eq!(
            job.command_line(),
            "fio --name=nbd --ioengine=nbd --uri=URI --rw=randread --bs=4096 --size=16777216 \
             --iodepth=16 --random_distribution=zoned:80/20:20/80 --time_based --runtime=2 \
             --norandommap --randseed=7 --lat_percentiles=1 --output-format=json"
        );
    }

    #[test]
    fn file_jobs_have_every_option_they_set() {
        let job = FioJob::new(
            "l2hit",
            "psync",
            FioTarget::Files(vec!["/c/f.img".into()]),
            "randread",
            8192,
            3,
        )
        .readonly()
        .direct(true)
        .offset_bytes(4096)
        .size_bytes(1 << 20)
        .iodepth(1)
        .numjobs(32)
        .threads();
        let mut args = job.args(None);
        args.sort();
        assert_eq!(
            args,
            sorted(&[
                "--name=l2hit",
                "--filename=/c/f.img",
                "--readonly",
                "--direct=1",
                "--rw=randread",
                "--bs=8192",
                "--offset=4096",
                "--size=1048576",
                "--ioengine=psync",
                "--iodepth=1",
                "--numjobs=32",
                "--thread",
                "--time_based",
                "--runtime=3",
                "--group_reporting",
                "--norandommap",
                "--randrepeat=0",
                "--lat_percentiles=1",
                "--output-format=json",
            ])
        );
        assert_eq!(job.describe(), "psync x32 jobs");
    }

    #[test]
    fn iops_logs_and_colons_in_file_names() {
        let job = FioJob::new(
            "fuse",
            "psync",
            FioTarget::Files(vec!["/m/a:b".into(), "/m/c".into()]),
            "read",
            131072,
            8,
        )
        .readonly()
        .direct(false)
        .keep_page_cache()
        .numjobs(1);
        let mut args = job.args(Some(Path::new("/l/run")));
        args.sort();
        assert_eq!(
            args,
            sorted(&[
                "--name=fuse",
                "--filename=/m/a\\:b:/m/c",
                "--readonly",
                "--direct=0",
                "--invalidate=0",
                "--rw=read",
                "--bs=131072",
                "--ioengine=psync",
                "--numjobs=1",
                "--group_reporting",
                "--time_based",
                "--runtime=8",
                "--norandommap",
                "--randrepeat=0",
                "--lat_percentiles=1",
                "--write_iops_log=/l/run",
                "--log_avg_msec=1000",
                "--output-format=json",
            ])
        );
    }
}
