/*!
 * l2arc-sim: trace-driven replay of the l2arc cache policies.
 *
 * A cache policy is judged by its hit ratio on real workloads, and the
 * only way to know an implementation is right is to run the workloads its
 * designers published and get their numbers back.  This crate loads block
 * and object traces (the ARC paper's `.lis` page traces, libCacheSim's
 * oracleGeneral binary traces, and simple CSV / text files), and replays
 * them through three policies at any number of cache sizes:
 *
 *  - ARC, the engine's own `l2arc::arc::policy::ArcPolicy`, so that what is
 *    measured is exactly what the cache runs;
 *  - LRU, the baseline ARC is published against;
 *  - Belady's MIN, the offline optimum, as the ceiling.
 *
 * The tests in tests/reproduce.rs hold the engine to the ARC paper's tables
 * and to libCacheSim's results on the reference traces in shared/traces.
 */

pub mod lru;
pub mod min;
mod replay;
mod size;
mod table;
pub mod trace;

pub use replay::{PolicyName, ReplayResult, parse_policy_list, replay, replay_many};
pub use size::{parse_size, parse_size_list};
pub use table::format_table;
pub use trace::{Request, TraceError, TraceFormat, load_trace};
