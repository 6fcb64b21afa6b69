//! Running fio and reading its JSON: the yardstick several scenarios
//! measure against (the bare cache file, the FUSE mount's source, nbdkit).
//! One place parses fio's output, so every scenario reads the same fields
//! the same way (fio prints notes before its JSON document at times).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::Serialize;

/// The read side of one fio job (or of a group, with `--group_reporting`).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FioRead {
    pub iops: f64,
    pub mib_per_sec: f64,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    /// CPU time (user + system) of fio's jobs per read, in microseconds.
    pub cpu_us_per_read: f64,
}

/// Runs fio with `args` (which must include `--output-format=json` and
/// `--lat_percentiles=1`) in `dir` and returns its first job's reads.
pub(crate) fn run_json(dir: Option<&Path>, args: &[String]) -> Result<FioRead> {
    let mut command = Command::new("fio");
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let out = command
        .args(args)
        .output()
        .context("cannot run fio: install it (scripts/setup.sh does)")?;
    if !out.status.success() {
        bail!(
            "fio {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let json = &text[text.find('{').context("fio printed no JSON")?..];
    let doc: serde_json::Value = serde_json::from_str(json).context("fio's JSON")?;
    let read = &doc["jobs"][0]["read"];
    let percentile = |q: &str| -> Result<f64> {
        read["lat_ns"]["percentile"][q]
            .as_f64()
            .map(|ns| ns / 1000.0)
            .with_context(|| format!("fio's JSON has no read.lat_ns percentile {q}"))
    };
    let job = &doc["jobs"][0];
    let cpu_percent =
        job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0);
    let runtime_secs = job["job_runtime"].as_f64().unwrap_or(0.0) / 1000.0;
    let reads = read["total_ios"].as_f64().unwrap_or(0.0);
    // With several jobs (group reporting) fio gives the CPU share per job.
    let jobs = args
        .iter()
        .find_map(|a| a.strip_prefix("--numjobs="))
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or(1.0);
    let cpu_us_per_read = if reads > 0.0 {
        cpu_percent / 100.0 * runtime_secs * jobs / reads * 1e6
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
    })
}

/// IOPS in each whole second of a run, summed over its jobs, from the logs
/// fio writes with `--write_iops_log=PREFIX --log_avg_msec=1000` (one file
/// per job: PREFIX_iops.N.log, lines of `msec, iops, dir, bs, offset`).
/// The last, partial second of each job is left out.
pub(crate) fn iops_per_second(prefix: &Path) -> Result<Vec<f64>> {
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
