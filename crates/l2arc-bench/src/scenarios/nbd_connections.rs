//! `--scenario nbd-connections`: many clients at once on one export.
//!
//! Why. A server that is fast with one busy client can collapse with many
//! quiet ones: with a thread per connection that woke every 50 µs while
//! reads were in flight, 128 connections of fio's nbd engine at queue
//! depth 1 got 0.41x the IOPS of 16 on a quiet machine, and under load
//! single reads waited up to a minute. So this scenario steps the number
//! of connections (16, 32, 64, 128, 256 by default: `--connections`), each
//! a fio job of the nbd engine keeping one random 4 KiB read in flight,
//! every block checked against the CRC fio wrote into it (`--verify`),
//! and reports per step the aggregate IOPS, p50, p99 and slowest read,
//! and the server's and the rest of the machine's CPU time per request.
//! Each step is measured again with a client that keeps all its
//! connections in one thread (`nbd_client.rs`): fio's cost per request
//! grows with its threads, this one's does not, so what falls with the
//! connections there is the server's.
//!
//! Sides, in the same run, on the same image: our export with the image
//! in the ARC, our export with an ARC a sixteenth of the image (nearly
//! every read a flash read through the L2ARC: the path whose polling
//! collapsed), and nbdkit's `file` plugin with the image in the page
//! cache (a thread per connection and a pool per connection: the
//! reference server of the protocol).
//!
//! What to read. `128 / best of 16-64`: the IOPS at 128 connections over
//! the best of 16, 32 and 64 (the goal is at least 0.9x). At queue depth 1
//! per connection, N connections at a steady rate each wait N / IOPS on
//! average (Little's law), so latency grows with N by arithmetic; the
//! table gives each step's p99 over that mean (`p99/mean`), which stays
//! small when the server is fair and grows when some clients starve.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};
use serde::Serialize;

use crate::BenchArgs;

use super::l2_hit::median;
use super::nbd::{ServerProcess, nbd_randread, require_tools, spawn, wait_for_socket};
use super::{Goal, Headline, Outcome, Scenario};
use crate::fio::write_verifiable;

/// Seconds per measurement at most (`--seconds` caps it lower).
const STEP_SECS_MAX: f64 = 5.0;
const BLOCK_BYTES: u64 = 4096;
/// Whole reads of the image with nbdcopy that warm the cache file.
const WARM_PASSES: usize = 3;

/// One side of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
enum Side {
    OursArc,
    OursL2arc,
    NbdkitPageCache,
}

impl Side {
    const ALL: [Side; 3] = [Side::OursArc, Side::OursL2arc, Side::NbdkitPageCache];

    fn name(self) -> &'static str {
        match self {
            Side::OursArc => "l2arc serve-nbd, image in the ARC",
            Side::OursL2arc => "l2arc serve-nbd, ARC 1/16, L2ARC",
            Side::NbdkitPageCache => "nbdkit file (page cache)",
        }
    }
}

/// Who reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
enum Client {
    /// fio's nbd engine, a job (thread) per connection.
    Fio,
    /// `nbd_client.rs`: every connection in one thread.
    OneThread,
}

impl Client {
    const ALL: [Client; 2] = [Client::Fio, Client::OneThread];

    fn name(self) -> &'static str {
        match self {
            Client::Fio => "fio nbd engine, a thread per connection",
            Client::OneThread => "one-thread client (epoll), all connections",
        }
    }
}

/// One step of one side.
#[derive(Clone, Copy, Debug, Serialize)]
struct Step {
    connections: usize,
    iops: f64,
    latency_us_p50: f64,
    latency_us_p99: f64,
    latency_us_max: f64,
    /// The server's user + system time per request.
    server_cpu_us_per_request: f64,
    /// The rest of the machine's CPU time per request: fio's (the
    /// clients'), and whatever else ran.
    rest_cpu_us_per_request: f64,
}

impl Step {
    /// p99 over the mean wait Little's law gives at this rate.
    fn p99_over_mean(&self) -> f64 {
        let mean_us = self.connections as f64 / self.iops.max(1.0) * 1e6;
        self.latency_us_p99 / mean_us
    }
}

/// A side's medians over the rounds, per step, with one client.
#[derive(Debug, Serialize)]
struct SideReport {
    side: Side,
    client: Client,
    name: &'static str,
    steps: Vec<Step>,
    /// IOPS at 128 connections over the best of 16, 32 and 64 (when the
    /// steps include them).
    ratio_128_to_best_16_64: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    scenario: &'static str,
    image_bytes: u64,
    seconds_per_step: f64,
    rounds: usize,
    load_before: String,
    load_after: String,
    ours_command: String,
    sides: Vec<SideReport>,
}

struct Place {
    dir: PathBuf,
    image: PathBuf,
    image_bytes: u64,
    cache: PathBuf,
    secs: f64,
    connections: Vec<usize>,
    /// The image's bytes, for the one-thread client's checks.
    bytes: Vec<u8>,
}

pub(crate) fn run(args: &BenchArgs) -> Result<Outcome> {
    require_tools("nbd-connections", &["fio", "nbdkit", "nbdcopy"])?;
    let connections = args.connections.clone();
    if connections.is_empty() || connections.iter().any(|&n| n == 0 || n > 1024) {
        bail!("--connections must list counts from 1 to 1024");
    }
    let tmp = tempfile::Builder::new()
        .prefix("l2arc-bench-nbd-conns")
        .tempdir()?;
    let image_bytes = args.dataset_size / (1 << 20) * (1 << 20);
    if image_bytes < 16 << 20 {
        bail!("--dataset-size must be at least 16 MiB for --scenario nbd-connections");
    }
    let dir = args.data.as_deref().unwrap_or(tmp.path());
    std::fs::create_dir_all(dir)?;
    let image = dir.join("nbd-connections.img");
    // fio writes every block with its checksum header, so that every
    // read can be verified.
    write_verifiable(&image, image_bytes, BLOCK_BYTES)?;
    let place = Place {
        dir: tmp.path().to_path_buf(),
        cache: dir.join("nbd-connections-cache.img"),
        bytes: std::fs::read(&image)?,
        image,
        image_bytes,
        secs: args.seconds.min(STEP_SECS_MAX),
        connections,
    };
    let _ = std::fs::remove_file(&place.cache);
    let load_before = crate::load_average();
    let mut measured: Vec<(Side, Client, Vec<Step>)> = Vec::new();
    let mut command = String::new();
    for round in 0..args.rounds {
        let mut sides = Side::ALL.to_vec();
        if round % 2 == 1 {
            sides.reverse();
        }
        for side in sides {
            let seed = args.seed ^ ((round as u64) << 8) ^ side as u64;
            let runs = match side {
                Side::OursArc => place.ours(false, round == 0, seed, &mut command)?,
                Side::OursL2arc => place.ours(true, round == 0, seed, &mut command)?,
                Side::NbdkitPageCache => place.nbdkit(seed)?,
            };
            measured.extend(
                runs.into_iter()
                    .map(|(client, steps)| (side, client, steps)),
            );
        }
    }
    let _ = std::fs::remove_file(&place.cache);
    let report = Report {
        scenario: "nbd-connections",
        image_bytes,
        seconds_per_step: place.secs.ceil(),
        rounds: args.rounds,
        load_before,
        load_after: crate::load_average(),
        ours_command: command,
        sides: Side::ALL
            .iter()
            .flat_map(|&side| Client::ALL.map(|client| (side, client)))
            .map(|(side, client)| side_report(side, client, &measured))
            .collect(),
    };
    let headline = headline(&report);
    Outcome::new(report, headline, print_table)
}

/// Each of ours, per client: IOPS at 128 connections over the best of
/// 16–64 (and nbdkit's at 128 beside it).
fn headline(r: &Report) -> Vec<Headline> {
    let at_128 = |s: &SideReport| {
        s.steps
            .iter()
            .find(|x| x.connections == 128)
            .map(|x| x.iops)
    };
    let best = |s: &SideReport| {
        s.steps
            .iter()
            .filter(|x| [16, 32, 64].contains(&x.connections))
            .map(|x| x.iops)
            .fold(0.0, f64::max)
    };
    let mut h = Vec::new();
    for s in r.sides.iter().filter(|s| s.side != Side::NbdkitPageCache) {
        let (Some(iops), Some(ratio)) = (at_128(s), s.ratio_128_to_best_16_64) else {
            continue;
        };
        let (side, what) = match s.side {
            Side::OursArc => ("arc", "image in the ARC"),
            _ => ("l2arc", "image on the L2ARC (ARC 1/16)"),
        };
        let (client, how) = match s.client {
            Client::OneThread => ("one_thread", "one-thread client"),
            Client::Fio => ("fio", "fio nbd engine, a thread per connection"),
        };
        h.push(
            Headline::versus(
                &format!("{side}_{client}"),
                &format!("NBD export, 128 connections at QD1 random 4 KiB, {what}, {how}"),
                "IOPS",
                (iops, "the same run's best of 16–64 connections", best(s)),
                Goal::ratio_at_least(0.9),
            )
            .ratio_is(ratio, "ours / baseline"),
        );
    }
    h
}

impl Place {
    /// Our export: the whole image in the ARC, or an ARC a sixteenth of it
    /// over a cache file (warmed in the first round, found warm after).
    fn ours(
        &self,
        l2arc: bool,
        first_round: bool,
        seed: u64,
        command: &mut String,
    ) -> Result<Vec<(Client, Vec<Step>)>> {
        let socket = self.dir.join("ours.sock");
        let _ = std::fs::remove_file(&socket);
        let max_connections = self.connections.iter().max().copied().unwrap_or(1) + 8;
        let mut cmd = Command::new(crate::sibling_binary("l2arc")?);
        cmd.arg("serve-nbd")
            .arg(&self.image)
            .arg("--read-only")
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .arg(format!("--max-connections={max_connections}"))
            .arg("--recordsize=4K")
            .arg("--compression=off");
        if l2arc {
            cmd.arg(format!("--arc-max={}", self.image_bytes / 16))
                .arg(format!("--cache={}", self.cache.display()))
                .arg(format!(
                    "--cache-size={}",
                    self.image_bytes * 2 + (64 << 20)
                ));
        } else {
            cmd.arg(format!("--arc-max={}", self.image_bytes * 2));
            *command = super::nbd::shell_words(&cmd);
        }
        let mut server = spawn(cmd)?;
        wait_for_socket(&mut server, &socket)?;
        let uri = uri(&socket);
        // The ARC side warms at every start; the L2ARC side's cache file
        // is warmed once and restored from its log after.
        if !l2arc || first_round {
            for _ in 0..WARM_PASSES {
                let out = Command::new("nbdcopy").arg(&uri).arg("null:").output()?;
                if !out.status.success() {
                    bail!("nbdcopy failed: {}", String::from_utf8_lossy(&out.stderr));
                }
            }
        }
        let steps = self.steps(&server, &socket, seed);
        drop(server.stop());
        steps
    }

    /// nbdkit's file plugin on the image, its bytes in the page cache.
    fn nbdkit(&self, seed: u64) -> Result<Vec<(Client, Vec<Step>)>> {
        let socket = self.dir.join("nbdkit.sock");
        let _ = std::fs::remove_file(&socket);
        let mut cmd = Command::new("nbdkit");
        cmd.args(["-f", "-r", "-U"])
            .arg(&socket)
            .arg("file")
            .arg(format!("file={}", self.image.display()));
        std::io::copy(&mut std::fs::File::open(&self.image)?, &mut std::io::sink())?;
        let mut server = spawn(cmd)?;
        wait_for_socket(&mut server, &socket)?;
        let steps = self.steps(&server, &socket, seed);
        drop(server);
        steps
    }

    /// Every step with each client, fewest connections first.
    fn steps(
        &self,
        server: &ServerProcess,
        socket: &Path,
        seed: u64,
    ) -> Result<Vec<(Client, Vec<Step>)>> {
        let mut runs: Vec<(Client, Vec<Step>)> = Client::ALL.map(|c| (c, Vec::new())).to_vec();
        for &connections in &self.connections {
            for (client, steps) in &mut runs {
                let seed = seed ^ connections as u64;
                steps.push(self.step(server, socket, *client, connections, seed)?);
            }
        }
        Ok(runs)
    }

    /// One step: `connections` clients at queue depth 1 for `secs`.
    fn step(
        &self,
        server: &ServerProcess,
        socket: &Path,
        client: Client,
        connections: usize,
        seed: u64,
    ) -> Result<Step> {
        let cpu_before = server.cpu_secs()?;
        let machine_before = machine_busy_secs()?;
        let (iops, p50, p99, max, reads) = match client {
            Client::Fio => {
                let read = nbd_randread(
                    "nbd-connections",
                    &uri(socket),
                    (self.image_bytes, 1),
                    self.secs,
                    seed,
                )
                .numjobs(connections)
                .threads()
                .verify_crc32c()
                .run(Some(&self.dir))?;
                let r = &read;
                (
                    r.iops,
                    r.latency_us_p50,
                    r.latency_us_p99,
                    r.latency_us_max,
                    r.reads,
                )
            }
            Client::OneThread => {
                let r = crate::nbd_client::run(socket, connections, &self.bytes, self.secs, seed)?;
                (
                    r.iops,
                    r.latency_us_p50,
                    r.latency_us_p99,
                    r.latency_us_max,
                    r.reads,
                )
            }
        };
        let cpu_secs = server.cpu_secs()? - cpu_before;
        let machine_secs = machine_busy_secs()? - machine_before;
        Ok(Step {
            connections,
            iops,
            latency_us_p50: p50,
            latency_us_p99: p99,
            latency_us_max: max,
            server_cpu_us_per_request: cpu_secs * 1e6 / reads.max(1.0),
            rest_cpu_us_per_request: (machine_secs - cpu_secs).max(0.0) * 1e6 / reads.max(1.0),
        })
    }
}

/// CPU time the whole machine spent busy so far (all CPUs: user, nice,
/// system, interrupts), in seconds, from `/proc/stat`.
fn machine_busy_secs() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let cpu = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or_else(|| anyhow::anyhow!("/proc/stat has no cpu line"))?;
    let ticks: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle, iowait, steal.
    let busy: f64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| ticks.get(i)).sum();
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(busy / hz)
}

fn uri(socket: &Path) -> String {
    format!("nbd+unix:///?socket={}", socket.display())
}

/// One side's steps with one client: each figure the median over the
/// rounds.
fn side_report(side: Side, client: Client, measured: &[(Side, Client, Vec<Step>)]) -> SideReport {
    let runs: Vec<&Vec<Step>> = measured
        .iter()
        .filter(|(s, c, _)| (*s, *c) == (side, client))
        .map(|(_, _, steps)| steps)
        .collect();
    let steps: Vec<Step> = (0..runs.first().map_or(0, |r| r.len()))
        .map(|i| {
            let of =
                |f: fn(&Step) -> f64| median(&runs.iter().map(|r| f(&r[i])).collect::<Vec<_>>());
            Step {
                connections: runs[0][i].connections,
                iops: of(|s| s.iops),
                latency_us_p50: of(|s| s.latency_us_p50),
                latency_us_p99: of(|s| s.latency_us_p99),
                latency_us_max: of(|s| s.latency_us_max),
                server_cpu_us_per_request: of(|s| s.server_cpu_us_per_request),
                rest_cpu_us_per_request: of(|s| s.rest_cpu_us_per_request),
            }
        })
        .collect();
    SideReport {
        side,
        client,
        name: side.name(),
        ratio_128_to_best_16_64: ratio_128_to_best(&steps),
        steps,
    }
}

/// IOPS at 128 connections over the best of 16, 32 and 64; `None` unless
/// the steps include 128 and at least one of the others.
fn ratio_128_to_best(steps: &[Step]) -> Option<f64> {
    let at = |n: usize| steps.iter().find(|s| s.connections == n).map(|s| s.iops);
    let best = [16, 32, 64]
        .into_iter()
        .filter_map(at)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))?;
    Some(at(128)? / best.max(1.0))
}

fn print_table(report: &Report) {
    println!(
        "NBD connections: random 4 KiB reads, fio nbd engine, one job (connection) per client at queue depth 1, every block verified (crc32c); {} MiB image; {:.0} s per step, medians of {} rounds; load before {}, after {}",
        report.image_bytes >> 20,
        report.seconds_per_step,
        report.rounds,
        report.load_before,
        report.load_after
    );
    println!("ours: {}", report.ours_command);
    println!("nbdkit: nbdkit -f -r -U SOCKET file file=IMAGE");
    for side in &report.sides {
        println!();
        println!("{}; {}", side.name, side.client.name());
        println!(
            "{:>6} {:>9} {:>8} {:>9} {:>9} {:>9} {:>12} {:>12}",
            "conns", "IOPS", "p50 us", "p99 us", "max ms", "p99/mean", "server us/r", "rest us/r"
        );
        for s in &side.steps {
            println!(
                "{:>6} {:>9.0} {:>8.0} {:>9.0} {:>9.1} {:>9.2} {:>12.1} {:>12.1}",
                s.connections,
                s.iops,
                s.latency_us_p50,
                s.latency_us_p99,
                s.latency_us_max / 1000.0,
                s.p99_over_mean(),
                s.server_cpu_us_per_request,
                s.rest_cpu_us_per_request
            );
        }
        if let Some(r) = side.ratio_128_to_best_16_64 {
            println!("128 connections / best of 16-64: {r:.2}x");
        }
    }
    println!();
    println!(
        "server us/r: the server's user + system CPU time per request; rest us/r: the rest of the machine's (fio's, the kernel's interrupts, anything else)"
    );
    println!(
        "p99/mean: the p99 over the mean wait at that rate (connections / IOPS, Little's law): at queue depth 1 a client's wait grows with the number of clients by arithmetic; this ratio grows only when some are served less than others"
    );
}

/// `--scenario nbd-connections`.
pub(crate) struct NbdConnections;

impl Scenario for NbdConnections {
    fn name(&self) -> &'static str {
        "nbd-connections"
    }
    fn measures(&self) -> &'static str {
        "Many clients on one export: 16 to 256 connections of fio's nbd engine at queue depth 1, random 4 KiB reads verified, IOPS, p99, slowest read and CPU per request per step, ours (ARC, L2ARC) against nbdkit's file plugin (needs fio, nbdkit, nbdcopy)."
    }
    fn run(&self, args: &BenchArgs) -> Result<Outcome> {
        run(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(connections: usize, iops: f64) -> Step {
        Step {
            connections,
            iops,
            latency_us_p50: 0.0,
            latency_us_p99: connections as f64 / iops * 1e6 * 3.0,
            latency_us_max: 0.0,
            server_cpu_us_per_request: 0.0,
            rest_cpu_us_per_request: 0.0,
        }
    }

    #[test]
    fn the_ratio_takes_the_best_of_16_to_64() {
        let steps = [
            step(16, 100.0),
            step(32, 120.0),
            step(64, 90.0),
            step(128, 108.0),
        ];
        assert!((ratio_128_to_best(&steps).unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(ratio_128_to_best(&steps[..3]), None, "no 128 step");
        assert_eq!(ratio_128_to_best(&steps[3..]), None, "nothing to compare");
        assert!((steps[1].p99_over_mean() - 3.0).abs() < 1e-9);
    }

    #[test]
    fn a_side_report_takes_medians_per_step() {
        let fio = Client::Fio;
        let measured = vec![
            (Side::OursArc, fio, vec![step(16, 100.0), step(128, 50.0)]),
            (
                Side::NbdkitPageCache,
                fio,
                vec![step(16, 1.0), step(128, 1.0)],
            ),
            (
                Side::OursArc,
                Client::OneThread,
                vec![step(16, 9.0), step(128, 9.0)],
            ),
            (Side::OursArc, fio, vec![step(16, 300.0), step(128, 70.0)]),
            (Side::OursArc, fio, vec![step(16, 200.0), step(128, 60.0)]),
        ];
        let r = side_report(Side::OursArc, fio, &measured);
        assert_eq!(r.steps.len(), 2);
        assert_eq!(r.steps[0].iops, 200.0);
        assert_eq!(r.steps[1].iops, 60.0);
        assert!((r.ratio_128_to_best_16_64.unwrap() - 0.3).abs() < 1e-9);
    }
}
