//! The breathing ARC: `c` follows the memory the system can spare.
//!
//! ZFS's ARC is not a fixed size. Its target `arc_c` moves between
//! `arc_c_min` and `arc_c_max`: the ARC grows into memory that is free
//! while it is missing, and its reaper (`arc_reap_cb`, `arc_shrink`)
//! reduces `c` and evicts as soon as free memory falls under
//! `arc_sys_free`, before the kernel has to kill anybody. We do the same
//! from user space, with `arc_max = auto` (the default):
//!
//! - The ceiling `c_max` is the least of all but 1 GiB of `MemTotal` and
//!   the memory cgroup's limit less `arc_sys_free`; `arc_min` (`c_min`) is
//!   the floor, never above the ceiling.
//! - "Free" is what can be allocated now: the host's `MemAvailable`, or
//!   the cgroup's limit less its usage (inactive file cache not counted),
//!   whichever is less (`memory::MemorySample`). Our own memory outside the
//!   ARC (the L2 index, the write-back, the front end's buffers) is in
//!   that usage, so the ARC's room is what is free, not the whole limit.
//! - Below `arc_sys_free`: shrink at once, to what is resident less the
//!   deficit and some slack (a shrink of `c` above the resident bytes
//!   would free nothing), counting `memory_throttle_count` and
//!   `arc_shrinks`, and set `arc_no_grow` for a while (ZFS's
//!   `arc_no_grow`: after a shortage, do not grow straight back into it).
//! - `c` never promises more than is free: with room `free - arc_sys_free`
//!   it is lowered, without evicting, to `size + room` when it stands
//!   above that. So the records that fill the ARC afterwards can only take
//!   memory that is free now.
//! - Well above `arc_sys_free`, with the ARC at `c` and missing, `c`
//!   grows in steps (an eighth of `c`, at least 32 MiB) towards the
//!   ceiling, keeping a quarter of `arc_sys_free` spare.
//!
//! The watcher samples every 100 ms and at once on a pressure notification
//! (`memory::Wakeups`): at a gigabyte a second a neighbour takes 100 MiB
//! between two polls, less than the `arc_sys_free` reserve (at least
//! 256 MiB), so its allocations find the memory free that our shrink
//! releases. The decision is a pure function of a sample and the ARC's
//! sizes ([`Breather::decide`]), tested with numbers; the thread only
//! applies it. After a shrink that evicted, `malloc_trim(0)` hands the
//! freed record buffers back to the kernel: glibc keeps freed chunks
//! under the mmap threshold (which rises to 32 MiB as large blocks are
//! freed) in its heaps, and only trimming returns the pages in the middle
//! of a heap; the pool of freed large buffers `buf` keeps for reuse
//! (at most 32 MiB) is emptied first. (The per-thread recycled buffers of
//! `buf` are bounded at 512 KiB a thread and are not worth chasing.)

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::live::LiveArc;
pub use super::memory::{
    ARC_MIN_DEFAULT_BYTES, ARC_SYS_FREE_MIN_BYTES, BreatheConfig, HOST_RESERVE_BYTES,
};
use super::memory::{MemoryLimits, MemorySample, MemorySource, Stopper, Wake, Wakeups};

/// How often the watcher samples memory without a notification.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Samples `arc_no_grow` stays set after a shortage or a pressure
/// notification (about two seconds at the poll interval).
const NO_GROW_TICKS: u32 = 20;
/// The least step of a grow.
const GROW_STEP_MIN_BYTES: u64 = 32 << 20;

/// The ARC's sizes a decision needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArcSizes {
    /// `c`, bytes.
    pub c_bytes: u64,
    /// `size`: bytes resident.
    pub size_bytes: u64,
    /// `misses` so far (a counter).
    pub misses: u64,
}

/// What to do with `c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Leave it.
    Hold,
    /// Free memory is short: `c` to this, evicting (an `arc_shrinks`).
    Shrink {
        /// The new `c`.
        c_bytes: u64,
    },
    /// `c` promised more than is free: to this, evicting nothing.
    Trim {
        /// The new `c`.
        c_bytes: u64,
    },
    /// Room and misses: `c` up to this.
    Grow {
        /// The new `c`.
        c_bytes: u64,
    },
}

/// A decision and the gauges it was made with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// What to do with `c`.
    pub decision: Decision,
    /// `arc_no_grow`.
    pub no_grow: bool,
    /// Free memory was under `arc_sys_free` (a `memory_throttle_count`).
    pub throttled: bool,
}

/// The breathing policy: samples in, decisions out (see the module comment).
#[derive(Debug)]
pub struct Breather {
    config: BreatheConfig,
    last_misses: u64,
    no_grow_ticks: u32,
}

impl Breather {
    /// A breather that has seen no sample yet.
    pub fn new(config: BreatheConfig) -> Breather {
        assert!(config.c_min_bytes <= config.c_max_bytes);
        Breather {
            config,
            last_misses: 0,
            no_grow_ticks: 0,
        }
    }

    /// The bounds it keeps `c` within.
    pub fn config(&self) -> BreatheConfig {
        debug_assert!(self.config.c_min_bytes <= self.config.c_max_bytes);
        self.config
    }

    /// What to do with `c` given the memory now and the ARC's sizes.
    pub fn decide(&mut self, sample: &MemorySample, arc: ArcSizes) -> Verdict {
        let BreatheConfig {
            c_min_bytes,
            c_max_bytes,
            arc_sys_free_bytes,
        } = self.config;
        let c = arc.c_bytes;
        let missing = arc.misses > self.last_misses;
        self.last_misses = arc.misses;
        self.no_grow_ticks = if sample.pressure {
            NO_GROW_TICKS
        } else {
            self.no_grow_ticks.saturating_sub(1)
        };
        let free = sample.available_bytes();
        if free < arc_sys_free_bytes {
            // ZFS's arc_reap: the deficit and some slack (ZFS takes
            // c >> arc_shrink_shift), from what is resident.
            let deficit = arc_sys_free_bytes - free;
            let slack = (arc_sys_free_bytes / 8).max(c / 128);
            let target = c
                .min(arc.size_bytes)
                .saturating_sub(deficit.saturating_add(slack))
                .max(c_min_bytes);
            self.no_grow_ticks = NO_GROW_TICKS;
            let decision = if target < c {
                Decision::Shrink { c_bytes: target }
            } else {
                Decision::Hold
            };
            debug_assert!(target >= c_min_bytes);
            return Verdict {
                decision,
                no_grow: true,
                throttled: true,
            };
        }
        let room = free - arc_sys_free_bytes;
        let reserve = arc_sys_free_bytes / 4;
        let no_grow = self.no_grow_ticks > 0 || room < reserve;
        let promised = arc
            .size_bytes
            .saturating_add(room)
            .clamp(c_min_bytes, c_max_bytes);
        let decision = if promised < c {
            Decision::Trim { c_bytes: promised }
        } else if !no_grow && missing && arc.size_bytes + c / 32 >= c && c < c_max_bytes {
            let step = (c / 8).max(GROW_STEP_MIN_BYTES);
            let target = (c + step)
                .min(arc.size_bytes.saturating_add(room - reserve))
                .min(c_max_bytes);
            if target > c {
                Decision::Grow { c_bytes: target }
            } else {
                Decision::Hold
            }
        } else {
            Decision::Hold
        };
        debug_assert!(match decision {
            Decision::Grow { c_bytes } | Decision::Trim { c_bytes } =>
                (c_min_bytes..=c_max_bytes).contains(&c_bytes),
            _ => true,
        });
        Verdict {
            decision,
            no_grow,
            throttled: false,
        }
    }
}

/// Applies one verdict to the ARC and counts it. Returns the bytes a
/// shrink evicted.
pub(crate) fn apply(arc: &LiveArc, sample: &MemorySample, verdict: Verdict) -> u64 {
    let counters = arc.memory_counters();
    debug_assert!(match verdict.decision {
        Decision::Shrink { c_bytes } | Decision::Trim { c_bytes } | Decision::Grow { c_bytes } =>
            c_bytes >= counters.c_min.load(Ordering::Relaxed),
        Decision::Hold => true,
    });
    counters
        .memory_available_bytes
        .store(sample.available_bytes(), Ordering::Relaxed);
    counters
        .arc_no_grow
        .store(u64::from(verdict.no_grow), Ordering::Relaxed);
    if verdict.throttled {
        counters
            .memory_throttle_count
            .fetch_add(1, Ordering::Relaxed);
    }
    match verdict.decision {
        Decision::Hold => 0,
        Decision::Trim { c_bytes } | Decision::Grow { c_bytes } => {
            arc.set_target_bytes(c_bytes);
            0
        }
        Decision::Shrink { c_bytes } => {
            let evicted_bytes = arc.set_target_bytes(c_bytes);
            counters.arc_shrinks.fetch_add(1, Ordering::Relaxed);
            counters
                .arc_shrunk_bytes
                .fetch_add(evicted_bytes, Ordering::Relaxed);
            if evicted_bytes > 0 {
                release_freed_memory();
            }
            evicted_bytes
        }
    }
}

/// Hands the freed buffers the pool keeps and the heap's free pages back
/// to the kernel (see the module comment).
pub fn release_freed_memory() {
    crate::buf::release_pooled();
    // SAFETY: malloc_trim takes the allocator's own locks; no memory of
    // ours is touched.
    let released = unsafe { libc::malloc_trim(0) };
    debug_assert!(released == 0 || released == 1);
}

/// The ARC's sizes for a decision.
pub(crate) fn sizes(arc: &LiveArc) -> ArcSizes {
    let stats = arc.stats();
    debug_assert!(stats.size <= stats.c);
    ArcSizes {
        c_bytes: stats.c,
        size_bytes: stats.size,
        misses: stats.misses,
    }
}

/// What `arc_max = auto` resolved to, for the front ends to print.
#[derive(Clone, Debug)]
pub struct ArcAuto {
    /// The bounds `c` breathes within.
    pub breathe: BreatheConfig,
    /// What they were resolved from.
    pub limits: MemoryLimits,
    /// The memory cgroup, if one was found.
    pub cgroup: Option<super::memory::Cgroup>,
    /// Pressure notifications that could not be armed, and why.
    pub unarmed: Vec<String>,
}

/// The watcher thread of one cache: stopped and joined on drop.
pub struct Watcher {
    stopper: Stopper,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Notifications that could not be armed (logged by the front end).
    pub unarmed: Vec<String>,
}

impl Watcher {
    /// Starts watching `memory` for `arc`, whose counters already carry
    /// `config` (`LiveArc::set_breathing`).
    pub(crate) fn start(
        arc: Arc<LiveArc>,
        config: BreatheConfig,
        mut memory: impl MemorySource + 'static,
        cgroup: Option<&super::memory::Cgroup>,
        cgroup_limit_bytes: Option<u64>,
    ) -> std::io::Result<Watcher> {
        assert!(config.c_max_bytes <= arc.config().arc_max_bytes);
        let threshold = cgroup_limit_bytes.map(|l| l.saturating_sub(config.arc_sys_free_bytes));
        let (mut wakeups, stopper) = Wakeups::arm(cgroup, threshold)?;
        let unarmed = std::mem::take(&mut wakeups.unarmed);
        let mut breather = Breather::new(config);
        // The first decision before the first read: c to what is free.
        if let Ok(sample) = memory.sample() {
            let verdict = breather.decide(&sample, sizes(&arc));
            apply(&arc, &sample, verdict);
        }
        let thread = std::thread::Builder::new()
            .name("l2arc-breathe".into())
            .spawn(move || {
                loop {
                    let wake = wakeups.wait(POLL_INTERVAL);
                    if wake == Wake::Stop {
                        break;
                    }
                    let Ok(mut sample) = memory.sample() else {
                        continue; // a file that failed to read: next time
                    };
                    sample.pressure = wake == Wake::Pressure;
                    let verdict = breather.decide(&sample, sizes(&arc));
                    apply(&arc, &sample, verdict);
                }
            })?;
        Ok(Watcher {
            stopper,
            thread: Some(thread),
            unarmed,
        })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stopper.stop();
        if let Some(thread) = self.thread.take() {
            // The watcher never panics by design; if it did, say so.
            let joined = thread.join();
            debug_assert!(joined.is_ok(), "the memory watcher panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn cgroup_gib() -> BreatheConfig {
        BreatheConfig::resolve(
            MemoryLimits {
                mem_total_bytes: 24 * GIB,
                cgroup_limit_bytes: Some(GIB),
            },
            0,
            0,
            MIB,
        )
    }

    /// `free` bytes left under a 1 GiB cgroup limit.
    fn free(bytes: u64) -> MemorySample {
        MemorySample {
            host_available_bytes: 20 * GIB,
            cgroup_limit_bytes: Some(GIB),
            cgroup_usage_bytes: GIB - bytes,
            pressure: false,
        }
    }

    #[test]
    fn auto_resolves_from_the_host_and_the_cgroup() {
        assert_eq!(
            cgroup_gib(),
            BreatheConfig {
                c_min_bytes: 64 * MIB,
                c_max_bytes: 768 * MIB,
                arc_sys_free_bytes: 256 * MIB
            }
        );
        let host = BreatheConfig::resolve(
            MemoryLimits {
                mem_total_bytes: 64 * GIB,
                cgroup_limit_bytes: None,
            },
            0,
            0,
            MIB,
        );
        assert_eq!(host.c_max_bytes, 63 * GIB);
        assert_eq!(host.arc_sys_free_bytes, 2 * GIB);
        // A tiny machine: arc_min never above the ceiling.
        let tiny = BreatheConfig::resolve(
            MemoryLimits {
                mem_total_bytes: GIB,
                cgroup_limit_bytes: None,
            },
            256 * MIB,
            0,
            MIB,
        );
        assert_eq!(tiny.c_max_bytes, MIB);
        assert_eq!(tiny.c_min_bytes, MIB);
        // Explicit values are kept.
        let set = BreatheConfig::resolve(
            MemoryLimits {
                mem_total_bytes: 24 * GIB,
                cgroup_limit_bytes: Some(8 * GIB),
            },
            128 * MIB,
            GIB,
            MIB,
        );
        assert_eq!(
            (set.c_min_bytes, set.c_max_bytes, set.arc_sys_free_bytes),
            (128 * MIB, 7 * GIB, GIB)
        );
    }

    #[test]
    fn a_shortage_shrinks_from_what_is_resident_at_once() {
        let mut b = Breather::new(cgroup_gib());
        let arc = ArcSizes {
            c_bytes: 700 * MIB,
            size_bytes: 600 * MIB,
            misses: 0,
        };
        // 100 MiB free: 156 MiB short, and 32 MiB of slack.
        let v = b.decide(&free(100 * MIB), arc);
        assert_eq!(
            v,
            Verdict {
                decision: Decision::Shrink {
                    c_bytes: (600 - 156 - 32) * MIB
                },
                no_grow: true,
                throttled: true
            }
        );
        // Nothing free: the whole reserve and the slack.
        let v = b.decide(&free(0), arc);
        assert_eq!(
            v.decision,
            Decision::Shrink {
                c_bytes: (600 - 256 - 32) * MIB
            }
        );
        // A small ARC: down to the floor, never below.
        let small = ArcSizes {
            c_bytes: 700 * MIB,
            size_bytes: 200 * MIB,
            misses: 0,
        };
        let v = b.decide(&free(0), small);
        assert_eq!(v.decision, Decision::Shrink { c_bytes: 64 * MIB });
        // At the floor already: hold (and still throttled).
        let at_floor = ArcSizes {
            c_bytes: 64 * MIB,
            size_bytes: 64 * MIB,
            misses: 0,
        };
        let v = b.decide(&free(0), at_floor);
        assert_eq!(v.decision, Decision::Hold);
        assert!(v.throttled && v.no_grow);
    }

    #[test]
    fn c_never_promises_more_than_is_free() {
        let mut b = Breather::new(cgroup_gib());
        let arc = ArcSizes {
            c_bytes: 768 * MIB,
            size_bytes: 100 * MIB,
            misses: 0,
        };
        // 400 MiB free, 256 reserved: c to 100 + 144 MiB, nothing evicted.
        let v = b.decide(&free(400 * MIB), arc);
        assert_eq!(v.decision, Decision::Trim { c_bytes: 244 * MIB });
        assert!(!v.throttled);
    }

    #[test]
    fn grows_in_steps_with_room_and_misses_only() {
        let mut b = Breather::new(cgroup_gib());
        let full = |c: u64, misses: u64| ArcSizes {
            c_bytes: c,
            size_bytes: c,
            misses,
        };
        // Room (600 free, 256 reserved) but no misses yet: hold.
        assert_eq!(
            b.decide(&free(600 * MIB), full(100 * MIB, 0)).decision,
            Decision::Hold
        );
        // Misses: one step (32 MiB, the least step).
        let v = b.decide(&free(600 * MIB), full(100 * MIB, 5));
        assert_eq!(v.decision, Decision::Grow { c_bytes: 132 * MIB });
        assert!(!v.no_grow);
        // Not at c (a quarter empty): hold, even with misses.
        let half = ArcSizes {
            c_bytes: 400 * MIB,
            size_bytes: 300 * MIB,
            misses: 10,
        };
        assert_eq!(b.decide(&free(600 * MIB), half).decision, Decision::Hold);
        // A large c steps by an eighth, up to the room less a quarter of
        // the reserve, never past c_max.
        let v = b.decide(&free(900 * MIB), full(600 * MIB, 20));
        assert_eq!(v.decision, Decision::Grow { c_bytes: 675 * MIB });
        let v = b.decide(&free(GIB), full(760 * MIB, 30));
        assert_eq!(v.decision, Decision::Grow { c_bytes: 768 * MIB });
    }

    #[test]
    fn no_grow_after_a_shortage_or_pressure() {
        let mut b = Breather::new(cgroup_gib());
        let full = |misses: u64| ArcSizes {
            c_bytes: 200 * MIB,
            size_bytes: 200 * MIB,
            misses,
        };
        assert!(matches!(
            b.decide(&free(100 * MIB), full(1)).decision,
            Decision::Shrink { .. }
        ));
        // Room again, with misses: no grow for NO_GROW_TICKS samples.
        for tick in 0..NO_GROW_TICKS - 1 {
            let v = b.decide(&free(800 * MIB), full(2 + u64::from(tick)));
            assert_eq!(v.decision, Decision::Hold, "tick {tick}");
            assert!(v.no_grow);
        }
        let v = b.decide(&free(800 * MIB), full(100));
        assert!(matches!(v.decision, Decision::Grow { .. }));
        // A pressure notification sets it again.
        let mut pressed = free(800 * MIB);
        pressed.pressure = true;
        let v = b.decide(&pressed, full(200));
        assert_eq!(v.decision, Decision::Hold);
        assert!(v.no_grow && !v.throttled);
    }

    /// A fake source drives the real ARC through `apply`: a shrink evicts
    /// to the target and is counted, a grow raises c again.
    #[test]
    fn apply_moves_the_live_arc() {
        use super::super::live::{ArcConfig, LiveArc, Lookup, Record, RecordKey};
        use super::super::policy::{AccessKind, DramPolicy};
        use crate::buf::AlignedBuf;
        let arc = LiveArc::new(ArcConfig {
            arc_max_bytes: 128 * MIB,
            shards: 4,
            dram_policy: DramPolicy::Arc,
        });
        let config = BreatheConfig {
            c_min_bytes: 4 * MIB,
            c_max_bytes: 128 * MIB,
            arc_sys_free_bytes: 16 * MIB,
        };
        arc.set_breathing(config);
        for record in 0..(48 * MIB / 65536) {
            let key = RecordKey {
                dataset: 0,
                object: 1,
                record,
            };
            if let Lookup::Claimed(claim) = arc.lookup(key, 1, AccessKind::Demand) {
                claim.complete(Ok(Arc::new(Record {
                    data: AlignedBuf::zeroed(65536),
                    generation_token: 1,
                    fill_sequence: 0,
                })));
            }
        }
        assert_eq!(arc.stats().size, 48 * MIB);
        let mut b = Breather::new(config);
        let short = MemorySample {
            host_available_bytes: 8 * MIB,
            cgroup_limit_bytes: None,
            cgroup_usage_bytes: 0,
            pressure: false,
        };
        let verdict = b.decide(&short, sizes(&arc));
        let evicted = apply(&arc, &short, verdict);
        let s = arc.stats();
        // 8 MiB short, 2 MiB of slack: 38 MiB.
        assert_eq!(s.c, 38 * MIB);
        assert!(s.size <= s.c);
        assert_eq!(evicted, 48 * MIB - s.size);
        assert_eq!(
            (s.arc_shrinks, s.memory_throttle_count, s.arc_no_grow),
            (1, 1, 1)
        );
        assert_eq!(s.arc_shrunk_bytes, evicted);
        assert_eq!(s.memory_available_bytes, 8 * MIB);
        assert_eq!(
            (s.c_min, s.c_max, s.arc_sys_free),
            (4 * MIB, 128 * MIB, 16 * MIB)
        );
        arc.assert_consistent();
        arc.set_target_bytes(64 * MIB);
        assert_eq!(arc.stats().c, 64 * MIB);
    }
}
