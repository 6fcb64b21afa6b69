//! A latency histogram cheap enough for the read path.
//!
//! Why not `hdrhistogram`: its recorder takes `&mut self`, so a shared one
//! needs a lock (or one histogram per thread and a merge), and it may
//! allocate when a value falls outside its range. The read path's ARC hit
//! costs about 250 ns; a lock or an allocation there would show. This is
//! the same log-linear idea in a fixed array of relaxed atomic counters:
//! `SUB_BUCKETS` linear steps per power of two (relative error at most
//! 1/`SUB_BUCKETS`, 12.5%), from 1 ns up to 2^`OCTAVES_MAX` ns (about 18
//! minutes; longer values land in the last bucket). Recording is one
//! `leading_zeros`, one shift and one relaxed `fetch_add` on a slot of the
//! recording thread's stripe (the stripes keep two cores that record the
//! same latency off each other's cache line); reading sums the stripes.
//! No lock, no allocation, no bound to overflow in practice (u64 counts).

use std::sync::atomic::{AtomicU64, Ordering};

/// Linear steps per power of two, as a power of two.
const SUB_BUCKET_BITS: u32 = 3;
/// Linear steps per power of two.
pub const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
/// Values up to 2^OCTAVES_MAX ns are told apart; larger ones share the last bucket.
pub const OCTAVES_MAX: u32 = 40;
/// Buckets of one histogram.
pub const BUCKETS: usize = (OCTAVES_MAX - SUB_BUCKET_BITS + 1) as usize * SUB_BUCKETS;
/// Stripes of one histogram (see the module comment).
const STRIPES: usize = 8;

/// The bucket of a value in nanoseconds.
#[inline]
pub fn bucket_of(value_ns: u64) -> usize {
    if value_ns < SUB_BUCKETS as u64 {
        return value_ns as usize;
    }
    let octave = 63 - value_ns.leading_zeros(); // >= SUB_BUCKET_BITS
    let sub = (value_ns >> (octave - SUB_BUCKET_BITS)) as usize & (SUB_BUCKETS - 1);
    let index = (octave - SUB_BUCKET_BITS + 1) as usize * SUB_BUCKETS + sub;
    index.min(BUCKETS - 1)
}

/// The smallest value (ns) of a bucket.
pub fn bucket_low_ns(bucket: usize) -> u64 {
    assert!(bucket < BUCKETS);
    if bucket < SUB_BUCKETS {
        return bucket as u64;
    }
    let octave = (bucket / SUB_BUCKETS) as u32 + SUB_BUCKET_BITS - 1;
    let sub = (bucket % SUB_BUCKETS) as u64;
    (1u64 << octave) + (sub << (octave - SUB_BUCKET_BITS))
}

/// One past the largest value (ns) of a bucket (`u64::MAX` for the last).
pub fn bucket_high_ns(bucket: usize) -> u64 {
    if bucket + 1 == BUCKETS {
        u64::MAX
    } else {
        bucket_low_ns(bucket + 1)
    }
}

#[repr(align(128))]
struct Stripe {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

/// A log-linear latency histogram of relaxed atomic counters.
pub struct LatencyHistogram {
    stripes: Box<[Stripe]>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES)
                .map(|_| Stripe {
                    counts: std::array::from_fn(|_| AtomicU64::new(0)),
                    sum_ns: AtomicU64::new(0),
                })
                .collect(),
        }
    }
}

impl LatencyHistogram {
    /// Counts `weight` events of `value_ns` (a sampled recorder passes its
    /// sampling period, so that counts estimate every event).
    #[inline]
    pub fn record_n(&self, value_ns: u64, weight: u64) {
        let stripe = &self.stripes[crate::stats::stripe_index() % STRIPES];
        stripe.counts[bucket_of(value_ns)].fetch_add(weight, Ordering::Relaxed);
        stripe
            .sum_ns
            .fetch_add(value_ns.saturating_mul(weight), Ordering::Relaxed);
    }

    #[inline]
    /// Counts one latency.
    pub fn record(&self, value_ns: u64) {
        self.record_n(value_ns, 1);
    }

    /// The counts so far, summed over stripes.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut counts = vec![0u64; BUCKETS];
        let mut sum_ns = 0u64;
        for stripe in self.stripes.iter() {
            for (total, count) in counts.iter_mut().zip(&stripe.counts) {
                *total += count.load(Ordering::Relaxed);
            }
            sum_ns = sum_ns.wrapping_add(stripe.sum_ns.load(Ordering::Relaxed));
        }
        HistogramSnapshot { counts, sum_ns }
    }
}

/// The counts of a histogram at one moment (`BUCKETS` of them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Count per bucket (see [`bucket_low_ns`]).
    pub counts: Vec<u64>,
    /// Sum of all latencies counted.
    pub sum_ns: u64,
}

impl HistogramSnapshot {
    /// Latencies counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Events of at most `bound_ns` (exact when `bound_ns` + 1 is a bucket
    /// boundary, as every power of two is).
    pub fn count_at_most(&self, bound_ns: u64) -> u64 {
        self.counts
            .iter()
            .enumerate()
            .take_while(|(b, _)| bucket_high_ns(*b) <= bound_ns.saturating_add(1))
            .map(|(_, c)| c)
            .sum()
    }

    /// The value (ns, a bucket's low end) below which `q` of the events lie.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return bucket_low_ns(bucket);
            }
        }
        bucket_low_ns(BUCKETS - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_log_linear() {
        for b in 0..BUCKETS - 1 {
            assert!(bucket_low_ns(b) < bucket_low_ns(b + 1), "bucket {b}");
            assert_eq!(bucket_of(bucket_low_ns(b)), b);
            assert_eq!(bucket_of(bucket_high_ns(b) - 1), b);
        }
        // Every power of two starts a bucket; widths are 1/8 of the octave.
        for octave in SUB_BUCKET_BITS..OCTAVES_MAX {
            let b = bucket_of(1 << octave);
            assert_eq!(bucket_low_ns(b), 1 << octave);
            assert_eq!(bucket_high_ns(b) - bucket_low_ns(b), 1 << (octave - 3));
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_of(0), 0);
    }

    #[test]
    fn records_from_threads_sum_and_quantiles_land_in_the_right_bucket() {
        let h = LatencyHistogram::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        h.record(300); // an ARC hit
                    }
                    h.record_n(10_000_000, 10); // a disk read, sampled 1 in 10
                });
            }
        });
        let snap = h.snapshot();
        assert_eq!(snap.count(), 4 * 1000 + 40);
        assert_eq!(snap.sum_ns, 4 * 1000 * 300 + 40 * 10_000_000);
        let p50 = snap.quantile_ns(0.5);
        assert!((256..=300).contains(&p50), "{p50}");
        let p999 = snap.quantile_ns(0.999);
        assert!((8_388_608..=10_000_000).contains(&p999), "{p999}");
        assert_eq!(snap.count_at_most(511), 4000);
        assert_eq!(snap.count_at_most((1 << 24) - 1), 4040);
    }
}
