/*
 * Replay: run a trace through a policy and count hits.
 *
 * A hit ratio is hits / requests with every request counted, including the
 * cold misses at the start; there is no warm-up, because the published
 * numbers we reproduce (the ARC paper's tables and libCacheSim's tests)
 * count that way.  A request larger than the whole cache is a miss and is
 * not shown to the policy at all: no policy could keep it, and letting an
 * implementation flush itself trying would measure the corner case rather
 * than the policy.
 *
 * Comparing policies means a grid of (policy, size) runs over one trace.
 * Each run is independent and single-threaded (a cache policy is inherently
 * sequential), so the grid is spread over the machine's cores with scoped
 * threads pulling jobs from a shared counter: the trace is borrowed, not
 * copied, and slow jobs (MIN, big caches) do not hold up a fixed partition.
 * Results come back in the order the jobs were asked for, whatever order
 * they finished in, so output is reproducible.
 *
 * MIN needs the next-use array, a pass over the whole trace; the grid
 * computes it once and shares it among all MIN runs, charging its time to
 * each of them so that MIN's requests/second means the same as in a
 * single `replay`.
 */

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::Request;
use crate::{lru, min};

/// The policies a trace can be replayed through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyName {
    /// The engine's ARC (`l2arc::arc::policy::ArcPolicy`).
    Arc,
    /// LRU with size accounting.
    Lru,
    /// Belady's offline optimum, demand-paging definition (see `min`).
    Min,
}

impl PolicyName {
    /// All policies, in display order.
    pub const ALL: [PolicyName; 3] = [PolicyName::Arc, PolicyName::Lru, PolicyName::Min];

    /// The lowercase name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            PolicyName::Arc => "arc",
            PolicyName::Lru => "lru",
            PolicyName::Min => "min",
        }
    }
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "arc" => Ok(PolicyName::Arc),
            "lru" => Ok(PolicyName::Lru),
            "min" | "belady" | "opt" => Ok(PolicyName::Min),
            _ => Err(format!(
                "unknown policy `{s}` (expected one of: arc, lru, min)"
            )),
        }
    }
}

/// Parses a comma-separated policy list such as `arc,lru,min`.
pub fn parse_policy_list(s: &str) -> Result<Vec<PolicyName>, String> {
    s.split(',').map(str::parse).collect()
}

/// The outcome of one (policy, cache size) replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayResult {
    /// The policy replayed.
    pub policy: PolicyName,
    /// Cache size, in the trace's unit.
    pub size: u64,
    /// Requests in the trace.
    pub requests: u64,
    /// Requests that hit.
    pub hits: u64,
    /// hits / requests, a fraction in 0..=1 (0 for an empty trace).
    pub hit_ratio: f64,
    /// Wall time of the replay, in seconds.
    pub elapsed_secs: f64,
}

impl ReplayResult {
    /// Misses (requests - hits).
    pub fn misses(&self) -> u64 {
        self.requests - self.hits
    }

    /// Replay speed, requests per second (0 if nothing was timed).
    pub fn requests_per_sec(&self) -> f64 {
        if self.elapsed_secs > 0.0 {
            self.requests as f64 / self.elapsed_secs
        } else {
            0.0
        }
    }
}

fn arc_hits(trace: &[Request], cache_size: u64) -> u64 {
    if cache_size == 0 {
        return 0;
    }
    let mut arc: l2arc::arc::policy::ArcPolicy<u64, ()> =
        l2arc::arc::policy::ArcPolicy::new(cache_size);
    let mut hits = 0u64;
    for r in trace {
        if r.size > cache_size {
            continue;
        }
        hits += u64::from(arc.access(r.key, r.size));
    }
    hits
}

fn result(
    policy: PolicyName,
    size: u64,
    trace: &[Request],
    hits: u64,
    elapsed_secs: f64,
) -> ReplayResult {
    let requests = trace.len() as u64;
    ReplayResult {
        policy,
        size,
        requests,
        hits,
        hit_ratio: if requests == 0 {
            0.0
        } else {
            hits as f64 / requests as f64
        },
        elapsed_secs,
    }
}

/// Runs one policy; `next` (with the seconds it took) is used by MIN when given.
fn run(
    trace: &[Request],
    policy: PolicyName,
    cache_size: u64,
    next: Option<(&[u64], f64)>,
) -> ReplayResult {
    let start = Instant::now();
    let (hits, extra_secs) = match policy {
        PolicyName::Arc => (arc_hits(trace, cache_size), 0.0),
        PolicyName::Lru => (lru::count_hits(trace, cache_size), 0.0),
        PolicyName::Min => match next {
            Some((next, secs)) => (
                min::count_hits(trace, next, cache_size, min::MinVariant::EvictThenInsert),
                secs,
            ),
            None => {
                let next = min::next_uses(trace);
                (
                    min::count_hits(trace, &next, cache_size, min::MinVariant::EvictThenInsert),
                    0.0,
                )
            }
        },
    };
    let elapsed = start.elapsed().as_secs_f64() + extra_secs;
    result(policy, cache_size, trace, hits, elapsed)
}

/// Replays `trace` through `policy` with a cache of `cache_size` units.
pub fn replay(trace: &[Request], policy: PolicyName, cache_size: u64) -> ReplayResult {
    run(trace, policy, cache_size, None)
}

/// Replays every (policy, size) pair, in parallel over the available
/// cores.  Results are policy-major in the order given, then by size in the
/// order given.
pub fn replay_many(trace: &[Request], policies: &[PolicyName], sizes: &[u64]) -> Vec<ReplayResult> {
    let jobs: Vec<(PolicyName, u64)> = policies
        .iter()
        .flat_map(|&p| sizes.iter().map(move |&s| (p, s)))
        .collect();
    if jobs.is_empty() {
        return Vec::new();
    }
    let next = if policies.contains(&PolicyName::Min) {
        let start = Instant::now();
        let next = min::next_uses(trace);
        Some((next, start.elapsed().as_secs_f64()))
    } else {
        None
    };
    let next_ref = next.as_ref().map(|(n, secs)| (n.as_slice(), *secs));

    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len());
    let cursor = AtomicUsize::new(0);
    let mut slots: Vec<Option<ReplayResult>> = vec![None; jobs.len()];
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = cursor.fetch_add(1, Ordering::Relaxed);
                        let Some(&(policy, size)) = jobs.get(i) else {
                            break;
                        };
                        done.push((i, run(trace, policy, size, next_ref)));
                    }
                    done
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(done) => {
                    for (i, r) in done {
                        slots[i] = Some(r);
                    }
                }
                // A policy bug panicked a worker: re-raise it on the caller.
                Err(payload) => std::panic::resume_unwind(payload),
            }
        }
    });
    slots.into_iter().flatten().collect()
}
