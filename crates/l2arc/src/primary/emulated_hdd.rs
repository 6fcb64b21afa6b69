//! A primary that behaves like an array of spinning disks.
//!
//! A read cache earns its keep against slow storage, and the machines that
//! benchmark this crate have only flash and DRAM. So this wrapper turns any
//! primary into a small RAID-0 of hard disks: each request waits for its
//! disk (one request at a time per spindle), then pays a random positioning
//! time (seek plus rotation, uniform between the configured bounds) and a
//! transfer time at the media rate. Each spindle has a FIFO queue (a ticket
//! lock), so a burst of misses behaves like a burst against real disks:
//! concurrency helps up to the number of spindles and no further, and a
//! request waits for exactly the requests that arrived before it. (A plain
//! mutex would let a thread that just finished jump the queue ahead of
//! sleeping waiters, inflating tail latency in a way no disk does, and
//! unevenly between systems under test whose threads arrive differently.)
//!
//! Placement is RAID-0: stripe `offset / stripe_bytes` of an object lives on
//! spindle `(hash(id) + stripe) % spindles`, so consecutive stripes go to
//! consecutive disks and different objects start on different disks. A
//! request that spans stripes is charged wholly to its first stripe's disk
//! (real arrays would split it; the cache's records are smaller than a
//! stripe, so the difference is noise). Sequential locality is not modelled:
//! every request pays a seek, which is pessimistic for streaming and right
//! for the random reads a cache exists to absorb.
//!
//! The real read of the inner primary happens while the spindle is held, and
//! the request then sleeps only for what remains of its service time, so a
//! fast inner device yields the emulated time, not the sum of both. Sleep
//! overshoots by the timer slack plus wakeup latency (about 100 µs here, 1%
//! of a seek, and systematic); we learn the overshoot as a moving average,
//! sleep that much less, and spin the last stretch. What still runs late (a
//! descheduled vCPU, a slow inner read) is carried on the spindle as debt
//! and paid back by ending its next requests early, so the mean service
//! time and the throughput match the model even on a noisy machine. `info` and `sync` are passed through uncharged:
//! metadata lives in RAM on real systems and the cache does not time syncs.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::dir::splitmix64;
use super::{ObjectInfo, Primary, PrimaryObject};
use crate::lock_order::{RankedCondvar, RankedMutex, RankedMutexGuard, rank};

const MIB: f64 = 1024.0 * 1024.0;
/// Upper bounds that keep a mistyped configuration from allocating or
/// sleeping forever.
const MAX_SPINDLES: usize = 1 << 16;
const MAX_SEEK_MS: f64 = 60_000.0;
/// First guess of `thread::sleep` overshoot before any measurement.
const INITIAL_OVERSHOOT_NS: u64 = 80_000;
/// Overshoot samples are clamped to this before averaging (one descheduled
/// wakeup should not make every later request spin for milliseconds).
const MAX_OVERSHOOT_SAMPLE_NS: u64 = 1_000_000;
/// Extra spin time beyond the learned overshoot, for its jitter.
const SPIN_MARGIN_NS: u64 = 30_000;
/// Most lateness a spindle carries forward (a long stall, e.g. a suspended
/// VM, must not turn into a burst of free requests).
const MAX_LATE_NS: u64 = 20_000_000;
/// Longest service time of one request (one hour).
const MAX_SERVICE_NS: u64 = 3_600_000_000_000;

/// Shape of the emulated disk array.
#[derive(Clone, Debug, PartialEq)]
pub struct HddConfig {
    /// Disks, each serving one request at a time.
    pub spindles: usize,
    /// Positioning time (seek plus rotation) is uniform in [min, max].
    pub seek_ms_min: f64,
    /// Longest positioning time (seek + rotation), ms.
    pub seek_ms_max: f64,
    /// Media transfer rate of one disk.
    pub transfer_mib_per_sec: f64,
    /// RAID-0 stripe unit.
    pub stripe_bytes: u64,
    /// Seed of the positioning-time generator (reproducible runs).
    pub seed: u64,
}

impl Default for HddConfig {
    fn default() -> Self {
        Self {
            spindles: 4,
            seek_ms_min: 4.0,
            seek_ms_max: 12.0,
            transfer_mib_per_sec: 150.0,
            stripe_bytes: 1 << 20,
            seed: 0x5eed,
        }
    }
}

impl HddConfig {
    /// An array of `spindles` disks whose every read positions in exactly
    /// `seek_ms`, striped in 64 KiB: reads that overlap, and how many at
    /// once, show plainly (tests of concurrency).
    pub fn constant(spindles: usize, seek_ms: f64) -> Self {
        Self {
            spindles,
            seek_ms_min: seek_ms,
            seek_ms_max: seek_ms,
            stripe_bytes: 64 << 10,
            ..Self::default()
        }
    }

    /// Mean service time of one read of `bytes` on one spindle, in ms: mean
    /// positioning plus transfer (what benchmarks call one pass's cost).
    pub fn mean_service_ms(&self, bytes: u64) -> f64 {
        (self.seek_ms_min + self.seek_ms_max) / 2.0
            + bytes as f64 / (self.transfer_mib_per_sec * (1 << 20) as f64) * 1000.0
    }

    /// Checks that the numbers describe a disk (positive, min <= max).
    pub fn validate(&self) -> io::Result<()> {
        let bad = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        if self.spindles == 0 || self.spindles > MAX_SPINDLES {
            return bad(format!(
                "emulated hdd: spindles must be 1..={MAX_SPINDLES}, got {}",
                self.spindles
            ));
        }
        let seek_ok = |v: f64| v.is_finite() && (0.0..=MAX_SEEK_MS).contains(&v);
        if !seek_ok(self.seek_ms_min)
            || !seek_ok(self.seek_ms_max)
            || self.seek_ms_min > self.seek_ms_max
        {
            return bad(format!(
                "emulated hdd: need 0 <= seek_ms_min <= seek_ms_max <= {MAX_SEEK_MS}, got {}-{}",
                self.seek_ms_min, self.seek_ms_max
            ));
        }
        if !(self.transfer_mib_per_sec.is_finite() && self.transfer_mib_per_sec > 0.0) {
            return bad(format!(
                "emulated hdd: transfer_mib_per_sec must be positive, got {}",
                self.transfer_mib_per_sec
            ));
        }
        if self.stripe_bytes == 0 {
            return bad("emulated hdd: stripe_bytes must be positive".to_string());
        }
        Ok(())
    }
}

/// Counters since the array was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HddStats {
    /// Reads served.
    pub reads: u64,
    /// Writes served.
    pub writes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Wall time spindles spent serving requests, summed over spindles.
    pub busy_ns: u64,
    /// Service time the model charged (positioning drawn for each request
    /// plus its transfer), summed over requests: what `busy_ns` follows
    /// on a quiet machine, and what tests check instead of the clock.
    pub modeled_ns: u64,
    /// Most requests a new one found ahead of it at its spindle (the one
    /// being served and those queued): a spindle serves one at a time,
    /// first come first served, so more than one means requests queued.
    pub spindle_queue_max: u64,
    /// Most requests at the array at once, queued or served: how much of
    /// its parallelism the caller could use.
    pub in_flight_max: u64,
}

/// Any primary, slowed down to the speed of an array of hard disks.
pub struct EmulatedHdd {
    inner: Arc<dyn Primary>,
    array: Arc<Array>,
}

impl EmulatedHdd {
    /// Wraps `inner`; fails on a nonsensical configuration.
    pub fn new(inner: Arc<dyn Primary>, config: HddConfig) -> io::Result<Self> {
        config.validate()?;
        let spindles = (0..config.spindles)
            .map(|i| {
                (
                    RankedMutex::new(Spindle {
                        next_ticket: 0,
                        serving_ticket: 0,
                        rng: splitmix64(config.seed ^ splitmix64(i as u64)),
                        late_ns: 0,
                    }),
                    RankedCondvar::new(),
                )
            })
            .collect();
        Ok(Self {
            inner,
            array: Arc::new(Array {
                config,
                spindles,
                reads: AtomicU64::new(0),
                writes: AtomicU64::new(0),
                bytes_read: AtomicU64::new(0),
                bytes_written: AtomicU64::new(0),
                busy_ns: AtomicU64::new(0),
                modeled_ns: AtomicU64::new(0),
                spindle_queue_max: AtomicU64::new(0),
                in_flight: AtomicU64::new(0),
                in_flight_max: AtomicU64::new(0),
                overshoot_ns: AtomicU64::new(INITIAL_OVERSHOOT_NS),
            }),
        })
    }

    /// The model this array follows.
    pub fn config(&self) -> &HddConfig {
        &self.array.config
    }

    /// What the array has served so far.
    pub fn stats(&self) -> HddStats {
        let a = &self.array;
        HddStats {
            reads: a.reads.load(Ordering::Relaxed),
            writes: a.writes.load(Ordering::Relaxed),
            bytes_read: a.bytes_read.load(Ordering::Relaxed),
            bytes_written: a.bytes_written.load(Ordering::Relaxed),
            busy_ns: a.busy_ns.load(Ordering::Relaxed),
            modeled_ns: a.modeled_ns.load(Ordering::Relaxed),
            spindle_queue_max: a.spindle_queue_max.load(Ordering::Relaxed),
            in_flight_max: a.in_flight_max.load(Ordering::Relaxed),
        }
    }
}

impl Primary for EmulatedHdd {
    fn open(&self, name: &str, writable: bool) -> io::Result<Arc<dyn PrimaryObject>> {
        let inner = self.inner.open(name, writable)?;
        let id = inner.info()?.id;
        Ok(Arc::new(HddObject {
            inner,
            array: self.array.clone(),
            id,
        }))
    }

    fn open_file(&self, file: std::fs::File, writable: bool) -> io::Result<Arc<dyn PrimaryObject>> {
        let inner = self.inner.open_file(file, writable)?;
        let id = inner.info()?.id;
        Ok(Arc::new(HddObject {
            inner,
            array: self.array.clone(),
            id,
        }))
    }

    fn describe(&self) -> String {
        let c = &self.array.config;
        format!(
            "emulated-hdd({} spindles, seek {}-{} ms, {} MiB/s) over {}",
            c.spindles,
            c.seek_ms_min,
            c.seek_ms_max,
            c.transfer_mib_per_sec,
            self.inner.describe()
        )
    }
}

struct Spindle {
    /// Ticket of the next request to arrive, and of the one being served.
    next_ticket: u64,
    serving_ticket: u64,
    /// splitmix64 state for positioning times.
    rng: u64,
    /// How far past their deadlines earlier requests ran, still to be paid
    /// back by ending later requests early.
    late_ns: u64,
}

impl Spindle {
    /// Uniform in [0, 1).
    fn next_unit(&mut self) -> f64 {
        // splitmix64 adds its increment itself: feeding it a counter is the
        // standard splitmix generator.
        self.rng = self.rng.wrapping_add(1);
        let x = splitmix64(self.rng);
        (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Serves the next ticket of a spindle's queue when dropped.
struct PassTurn<'a> {
    lock: &'a RankedMutex<Spindle, { rank::PRIMARY }>,
    turn: &'a RankedCondvar,
}

impl Drop for PassTurn<'_> {
    fn drop(&mut self) {
        let mut spindle = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        debug_assert!(spindle.serving_ticket < spindle.next_ticket);
        spindle.serving_ticket += 1;
        drop(spindle);
        self.turn.notify_all();
    }
}

/// Counts a request out of the array when dropped (also on a panic).
struct LeaveArray<'a>(&'a AtomicU64);

impl Drop for LeaveArray<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Array {
    config: HddConfig,
    spindles: Box<[(RankedMutex<Spindle, { rank::PRIMARY }>, RankedCondvar)]>,
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    busy_ns: AtomicU64,
    modeled_ns: AtomicU64,
    spindle_queue_max: AtomicU64,
    in_flight: AtomicU64,
    in_flight_max: AtomicU64,
    /// Moving average of how late `thread::sleep` wakes up.
    overshoot_ns: AtomicU64,
}

impl Array {
    fn spindle_of(&self, id: u64, offset: u64) -> usize {
        let stripe = offset / self.config.stripe_bytes;
        (splitmix64(id).wrapping_add(stripe) % self.spindles.len() as u64) as usize
    }

    /// Runs `op` on the request's spindle and holds the spindle for the
    /// emulated service time. `op` returns its result and the bytes moved.
    fn serve<T>(
        &self,
        id: u64,
        offset: u64,
        op: impl FnOnce() -> (io::Result<T>, usize),
    ) -> (io::Result<T>, usize) {
        let (lock, turn) = &self.spindles[self.spindle_of(id, offset)];
        let in_flight = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.in_flight_max.fetch_max(in_flight, Ordering::Relaxed);
        let _leave = LeaveArray(&self.in_flight);
        let relock = || -> RankedMutexGuard<'_, Spindle, { rank::PRIMARY }> {
            lock.lock().unwrap_or_else(|p| p.into_inner())
        };
        // Take a ticket and wait for it to be served: FIFO, like a disk queue.
        let (seek_unit, late_ns) = {
            let mut spindle = relock();
            let ticket = spindle.next_ticket;
            spindle.next_ticket += 1;
            // Requests ahead of this one: being served or queued.
            let waiting = ticket - spindle.serving_ticket;
            self.spindle_queue_max.fetch_max(waiting, Ordering::Relaxed);
            while spindle.serving_ticket != ticket {
                spindle = turn.wait(spindle).unwrap_or_else(|p| p.into_inner());
            }
            (spindle.next_unit(), spindle.late_ns)
        };
        // The spindle is ours until `_turn` passes it on (also on a panic in
        // `op`, or the queue behind us would wait forever).
        let _turn = PassTurn { lock, turn };
        let start = Instant::now();
        let c = &self.config;
        let seek_ms = c.seek_ms_min + (c.seek_ms_max - c.seek_ms_min) * seek_unit;
        let (result, bytes) = op();
        let transfer_s = bytes as f64 / (c.transfer_mib_per_sec * MIB);
        // Clamped so an absurd rate cannot overflow the deadline.
        let service_ns = ((seek_ms / 1e3 + transfer_s) * 1e9).min(MAX_SERVICE_NS as f64) as u64;
        self.modeled_ns.fetch_add(service_ns, Ordering::Relaxed);
        let credit_ns = late_ns.min(service_ns);
        let target_ns = service_ns - credit_ns;
        self.wait_until(start + Duration::from_nanos(target_ns));
        let busy_ns = start.elapsed().as_nanos() as u64;
        {
            let mut spindle = relock();
            let late_ns = late_ns - credit_ns + busy_ns.saturating_sub(target_ns);
            spindle.late_ns = late_ns.min(MAX_LATE_NS);
        }
        self.busy_ns.fetch_add(busy_ns, Ordering::Relaxed);
        (result, bytes)
    }

    /// Sleeps until `deadline`: the bulk in `thread::sleep`, ending early by
    /// the learned overshoot, and the rest spinning (yielding the CPU there
    /// can cost a whole scheduler slice on a busy machine).
    fn wait_until(&self, deadline: Instant) {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            let remaining = deadline - now;
            let window =
                Duration::from_nanos(self.overshoot_ns.load(Ordering::Relaxed) + SPIN_MARGIN_NS);
            if remaining > window {
                let asked = remaining - window;
                std::thread::sleep(asked);
                let late_ns = now.elapsed().saturating_sub(asked).as_nanos() as u64;
                let sample = late_ns.min(MAX_OVERSHOOT_SAMPLE_NS);
                // EWMA with weight 1/8; racy updates only lose samples.
                let old = self.overshoot_ns.load(Ordering::Relaxed);
                let new = old - old / 8 + sample / 8;
                self.overshoot_ns.store(new, Ordering::Relaxed);
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

struct HddObject {
    inner: Arc<dyn PrimaryObject>,
    array: Arc<Array>,
    id: u64,
}

impl PrimaryObject for HddObject {
    fn info(&self) -> io::Result<ObjectInfo> {
        self.inner.info()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let (result, bytes) = self.array.serve(self.id, offset, || {
            let r = self.inner.read_at(offset, buf);
            let n = *r.as_ref().unwrap_or(&0);
            (r, n)
        });
        self.array.reads.fetch_add(1, Ordering::Relaxed);
        self.array
            .bytes_read
            .fetch_add(bytes as u64, Ordering::Relaxed);
        result
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let (result, bytes) = self.array.serve(self.id, offset, || {
            let r = self.inner.write_at(offset, data);
            let n = if r.is_ok() { data.len() } else { 0 };
            (r, n)
        });
        self.array.writes.fetch_add(1, Ordering::Relaxed);
        self.array
            .bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
        result
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }

    /// Passed through uncharged, like `sync`: a discard moves no data.
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.punch_hole(offset, len)
    }

    fn read_alignment_bytes(&self) -> usize {
        self.inner.read_alignment_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primary::dir::DirPrimary;
    use rand::{Rng, SeedableRng};

    const FILE_BYTES: usize = 16 << 20;

    fn setup(config: HddConfig) -> (tempfile::TempDir, EmulatedHdd, Arc<dyn PrimaryObject>) {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("obj"), vec![7u8; FILE_BYTES]).unwrap();
        let dir: Arc<dyn Primary> = Arc::new(DirPrimary::new(tmp.path()).unwrap());
        let hdd = EmulatedHdd::new(dir, config).unwrap();
        let obj = hdd.open("obj", true).unwrap();
        (tmp, hdd, obj)
    }

    fn one_spindle(seek_ms_min: f64, seek_ms_max: f64) -> HddConfig {
        HddConfig {
            spindles: 1,
            seek_ms_min,
            seek_ms_max,
            ..HddConfig::default()
        }
    }

    /// Mean wall time of `n` sequential 4 KiB reads at random offsets, in ms.
    fn mean_read_ms(obj: &dyn PrimaryObject, n: usize, seed: u64) -> f64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut buf = vec![0u8; 4096];
        let start = Instant::now();
        for _ in 0..n {
            let off = rng.random_range(0..(FILE_BYTES / 4096) as u64) * 4096;
            assert_eq!(obj.read_at(off, &mut buf).unwrap(), 4096);
        }
        start.elapsed().as_secs_f64() * 1e3 / n as f64
    }

    fn transfer_ms(bytes: f64) -> f64 {
        bytes / (150.0 * MIB) * 1e3
    }

    #[test]
    fn mean_service_time_matches_model() {
        // Random positioning, 2-4 ms: mean 3 ms plus 4 KiB at 150 MiB/s.
        let (_tmp, hdd, obj) = setup(one_spindle(2.0, 4.0));
        let n = 200;
        let mean = mean_read_ms(obj.as_ref(), n, 1);
        let model = 3.0 + transfer_ms(4096.0);
        let err = (mean - model) / model;
        eprintln!(
            "random seek: mean {mean:.4} ms, model {model:.4} ms, error {:+.2}%, learned overshoot {} us",
            err * 100.0,
            hdd.array.overshoot_ns.load(Ordering::Relaxed) / 1000
        );
        assert!(err.abs() < 0.10, "mean {mean} ms vs model {model} ms");

        let s = hdd.stats();
        assert_eq!(s.reads, n as u64);
        assert_eq!(s.bytes_read, n as u64 * 4096);
        assert_eq!((s.writes, s.bytes_written), (0, 0));
        let busy_mean_ms = s.busy_ns as f64 / 1e6 / n as f64;
        assert!(
            ((busy_mean_ms - model) / model).abs() < 0.10,
            "busy {busy_mean_ms}"
        );

        // Fixed positioning time: every request should take exactly the model.
        let (_tmp, hdd, obj) = setup(one_spindle(3.0, 3.0));
        let mean = mean_read_ms(obj.as_ref(), 100, 2);
        let err = (mean - model) / model;
        eprintln!(
            "fixed seek: mean {mean:.4} ms, model {model:.4} ms, error {:+.2}%, learned overshoot {} us",
            err * 100.0,
            hdd.array.overshoot_ns.load(Ordering::Relaxed) / 1000
        );
        assert!(err.abs() < 0.10, "mean {mean} ms vs model {model} ms");
    }

    #[test]
    fn spindles_serve_in_parallel() {
        let per_thread = 50;
        // One spindle, one thread: the baseline rate.
        let (_tmp, one, obj) = setup(one_spindle(2.0, 4.0));
        let one_ms = mean_read_ms(obj.as_ref(), 4 * per_thread, 3);
        let one_rate = 1.0 / one_ms;
        assert_eq!(
            one.stats().in_flight_max,
            1,
            "one thread, one request at a time"
        );

        // Four spindles, four threads, each thread on its own spindle.
        let config = HddConfig {
            spindles: 4,
            seek_ms_min: 2.0,
            seek_ms_max: 4.0,
            stripe_bytes: 64 << 10,
            ..HddConfig::default()
        };
        let (_tmp, hdd, obj) = setup(config);
        let id = obj.info().unwrap().id;
        let stripes = FILE_BYTES as u64 / hdd.config().stripe_bytes;
        let start = Instant::now();
        std::thread::scope(|s| {
            for t in 0..4 {
                let obj = &obj;
                let hdd = &hdd;
                s.spawn(move || {
                    let mine: Vec<u64> = (0..stripes)
                        .map(|k| k * hdd.config().stripe_bytes)
                        .filter(|&off| hdd.array.spindle_of(id, off) == t)
                        .collect();
                    assert!(!mine.is_empty());
                    let mut buf = vec![0u8; 4096];
                    for i in 0..per_thread {
                        let off = mine[(i * 7) % mine.len()];
                        assert_eq!(obj.read_at(off, &mut buf).unwrap(), 4096);
                    }
                });
            }
        });
        let four_rate = (4 * per_thread) as f64 / (start.elapsed().as_secs_f64() * 1e3);
        let speedup = four_rate / one_rate;
        eprintln!("4 spindles x 4 threads: {speedup:.2}x one spindle");
        assert!(speedup > 2.5, "speedup {speedup}");
        assert!(speedup < 4.5, "speedup {speedup}");
        assert_eq!(hdd.stats().reads, 4 * per_thread as u64);
        let in_flight_max = hdd.stats().in_flight_max;
        assert!((2..=4).contains(&in_flight_max), "{in_flight_max} at once");
    }

    #[test]
    fn placement_is_raid0() {
        let (_tmp, hdd, obj) = setup(HddConfig::default());
        let id = obj.info().unwrap().id;
        let stripe = hdd.config().stripe_bytes;
        let first = hdd.array.spindle_of(id, 0);
        assert_eq!(hdd.array.spindle_of(id, stripe - 1), first);
        for k in 0..8u64 {
            assert_eq!(
                hdd.array.spindle_of(id, k * stripe),
                (first + k as usize) % 4
            );
        }
    }

    #[test]
    fn writes_counted_and_passed_through() {
        let (tmp, hdd, obj) = setup(one_spindle(0.0, 0.0));
        obj.write_at(10, b"abc").unwrap();
        obj.sync().unwrap();
        let mut buf = [0u8; 5];
        assert_eq!(obj.read_at(9, &mut buf).unwrap(), 5);
        assert_eq!(&buf, &[7, b'a', b'b', b'c', 7]);
        assert_eq!(obj.read_at(FILE_BYTES as u64, &mut buf).unwrap(), 0);
        let s = hdd.stats();
        assert_eq!(
            (s.reads, s.writes, s.bytes_read, s.bytes_written),
            (2, 1, 5, 3)
        );
        assert_eq!(
            std::fs::read(tmp.path().join("obj")).unwrap()[10..13],
            *b"abc"
        );
        assert!(hdd.open("missing", false).is_err());
        assert_eq!(
            hdd.describe(),
            format!(
                "emulated-hdd(1 spindles, seek 0-0 ms, 150 MiB/s) over dir {}",
                tmp.path().display()
            )
        );
        let d = EmulatedHdd::new(hdd.inner.clone(), HddConfig::default()).unwrap();
        assert!(
            d.describe()
                .starts_with("emulated-hdd(4 spindles, seek 4-12 ms, 150 MiB/s) over dir ")
        );
    }

    #[test]
    fn bad_config_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let dir: Arc<dyn Primary> = Arc::new(DirPrimary::new(tmp.path()).unwrap());
        let base = HddConfig::default();
        for bad in [
            HddConfig {
                spindles: 0,
                ..base.clone()
            },
            HddConfig {
                seek_ms_min: 5.0,
                seek_ms_max: 1.0,
                ..base.clone()
            },
            HddConfig {
                seek_ms_min: -1.0,
                ..base.clone()
            },
            HddConfig {
                seek_ms_max: f64::NAN,
                ..base.clone()
            },
            HddConfig {
                seek_ms_max: f64::INFINITY,
                ..base.clone()
            },
            HddConfig {
                transfer_mib_per_sec: 0.0,
                ..base.clone()
            },
            HddConfig {
                transfer_mib_per_sec: f64::NAN,
                ..base.clone()
            },
            HddConfig {
                stripe_bytes: 0,
                ..base.clone()
            },
        ] {
            let e = EmulatedHdd::new(dir.clone(), bad.clone())
                .err()
                .expect("rejected");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
    }
}
