//! An object store bucket as primary storage (S3, and any other OpenDAL
//! service by configuration).
//!
//! Why a cache here at all: a bucket answers each request in 20-100 ms and
//! bills it, so what matters is how few GETs a workload costs and how soon
//! a restarted cache is warm again. The ARC and the L2ARC keep whole
//! records; this back end turns a record miss into one ranged GET of
//! exactly that record, aligned to records, and nothing else.
//!
//! Versions, not times. A file's generation is (inode, size, mtime, ctime);
//! an object's is its ETag (and version id, in a versioned bucket) plus its
//! size, folded into `Generation::version_hash`. Every ranged GET carries
//! If-Match with the ETag of the generation the record will be filed under
//! (`read_at_generation`): the server either returns bytes of exactly that
//! version or 412, which we report as `StaleNetworkFileHandle` and the read
//! path answers by re-stating and reading again under the new generation.
//! So a record is never assembled from two versions, whatever races a
//! writer wins; and because the token of a record depends only on the key
//! and the ETag, records on flash written before a restart match again
//! after it as long as the objects did not change (the mountpoint-s3 cache
//! is wiped at every mount; ours is not).
//!
//! Trust is bounded in time, as in mountpoint-s3: a stat (HEAD) or a
//! directory listing is believed for `metadata_ttl_ms`, a missing key is
//! remembered as missing for the same time, and after that the next use
//! asks the store again. A changed object is thus seen at most one TTL
//! late by a reader that only hits the cache, and at once by any read that
//! reaches the store (412). Listings fill the stat cache too, so `ls -l`
//! over a directory costs one LIST, not a HEAD per file.
//!
//! OpenDAL is asynchronous; the cache calls from plain threads. The back
//! end owns a small tokio runtime and each blocking call enters it with
//! `block_on`: concurrent callers (FUSE threads, read-ahead workers) give
//! concurrent GETs. Credentials go to OpenDAL and are never formatted into
//! a message: `describe` names only the bucket and prefix.
//!
//! Bounded waits. A reader of a file or a block device expects an answer,
//! and an error is an answer; a read that hangs for minutes behind a dead
//! store takes the application with it. So every operation (a stat, a
//! listing, a read of a record, and each stretch of a streamed span
//! without progress) is one sequence of tries bounded twice: by
//! `retries_max` tries, each within `request_timeout_ms` and separated by
//! capped exponential backoff with jitter, and above all by
//! `read_deadline_ms`, which no try, backoff or timeout of the sequence
//! outlives (a try gets what is left of it). A sequence that runs out
//! without a single answer from the store fails with `TimedOut` (EIO in
//! the front ends: a reader's `read(2)` gets the errno the documentation
//! promises, not ETIMEDOUT, which readers of files do not expect) and puts
//! the store in an outage (`health`): until a background probe gets an
//! answer, every request fails at once, so the kernel's second try of a
//! page, a getattr's second stat, and every other reader do not each wait
//! out a deadline of their own. Throttling (503 SlowDown, 429) and 5xx are
//! answers: retried within the same bounds, never an outage.
//!
//! Stale if error (`stale_if_error`, off by default; HTTP caches' name for
//! it, RFC 5861): past the TTL, a stat or listing that cannot be refreshed
//! because the store does not answer (or answers 5xx, or throttles) is
//! served from what was last known, counted in `stale_if_error_hits`, so
//! the records cached under the last known ETag keep being served while
//! the store is away. Never when the store answered that the object
//! changed (412) or is gone (404): those drop what was known at once.
//!
//! Messages keep their cause (`failure`): the store's error code and
//! message, the HTTP status of an answer that is not S3, or the root of a
//! transport error with the endpoint it was for; at start the check adds
//! what to look at (the bucket's name, the access key, the secret, the
//! endpoint, where credentials are looked for).

use std::collections::HashMap;
use std::future::IntoFuture;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use super::{Generation, ObjectInfo, Primary, PrimaryObject, SourceIdentity};

mod aws_config;
mod failure;
mod health;

use crate::lock_order::{RankedMutex, rank};
use failure::{Cause, Failure, failure_of};
use health::{Health, Probe, ProbeContext};

/// Entries of the stat cache (positive and negative) before it is pruned.
const STAT_CACHE_MAX_ENTRIES: usize = 1 << 18;
/// Directory listings kept before the cache is pruned.
const DIR_CACHE_MAX_ENTRIES: usize = 4096;
/// Entries of one directory listing we hold at most (a listing beyond it
/// fails with EFBIG rather than grow without bound).
const DIR_ENTRIES_MAX: usize = 1 << 20;
/// Longest wait between two tries of a request.
const BACKOFF_MAX_MS: u64 = 2_000;
/// Versions of one object whose ETags a handle remembers (the current and
/// the ones records may still be filed under while a change is adopted).
const VERSIONS_REMEMBERED_MAX: usize = 4;
/// Size of the table of open objects at which closed ones are swept out.
const OPEN_OBJECTS_PRUNE_AT: usize = 1 << 16;

/// How to reach the store and how far to trust what it said.
#[derive(Clone)]
pub struct ObjectStoreConfig {
    /// OpenDAL service scheme: "s3" (others work by configuration alone).
    pub scheme: String,
    /// OpenDAL options of the service (bucket, root, endpoint, region,
    /// credentials...). Never printed.
    pub options: Vec<(String, String)>,
    /// What `describe` says: "s3://bucket/prefix". Must not hold secrets;
    /// it also names the dataset's records on flash, so it must stay the
    /// same across restarts for the L2ARC to be reused.
    pub display_name: String,
    /// How long a stat, a listing or a missing key may be trusted.
    pub metadata_ttl_ms: u64,
    /// Timeout of one request (of its first byte, for a streamed span),
    /// cut to what is left of the read deadline.
    pub request_timeout_ms: u64,
    /// Tries of one request beyond the first (throttling, timeouts,
    /// dropped connections).
    pub retries_max: u32,
    /// First backoff between tries; doubles each try up to 2 s.
    pub backoff_base_ms: u64,
    /// The longest one operation may take, every try, timeout and backoff
    /// of it included (for a streamed span: since it last made progress).
    pub read_deadline_ms: u64,
    /// Past the TTL, serve what was last known of an object when the store
    /// cannot be reached (see the module comment).
    pub stale_if_error: bool,
    /// When set, the object named "" is this key (an NBD export of one
    /// image object).
    pub single_key: Option<String>,
}

impl std::fmt::Debug for ObjectStoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Options hold credentials: only their names are shown.
        let keys: Vec<&str> = self.options.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("ObjectStoreConfig")
            .field("scheme", &self.scheme)
            .field("option_names", &keys)
            .field("display_name", &self.display_name)
            .field("metadata_ttl_ms", &self.metadata_ttl_ms)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("retries_max", &self.retries_max)
            .field("read_deadline_ms", &self.read_deadline_ms)
            .field("stale_if_error", &self.stale_if_error)
            .finish_non_exhaustive()
    }
}

/// Default `metadata_ttl_ms`: mountpoint-s3's with a cache (`--metadata-ttl`
/// defaults to 60 s when caching is on).
pub const METADATA_TTL_DEFAULT_MS: u64 = 60_000;
/// Default bound on one request, from its start to its last byte (its
/// first byte for a streamed span).
pub const REQUEST_TIMEOUT_DEFAULT_MS: u64 = 5_000;
/// Default tries after the first for throttling, timeouts and transport errors.
pub const RETRIES_DEFAULT: u32 = 4;
/// Default first backoff; each retry doubles it (with jitter).
pub const BACKOFF_BASE_DEFAULT_MS: u64 = 50;
/// Default bound on one operation, all its tries included: well under the
/// minute after which readers (and people) give up on storage, and enough
/// for the default sequence of tries, so that with the defaults the
/// deadline cuts nothing short that the tries would have finished.
pub const READ_DEADLINE_DEFAULT_MS: u64 = 30_000;

/// The longest the default sequence of tries takes: every try timed out,
/// every backoff at its longest (base << n, capped).
const fn default_sequence_max_ms() -> u64 {
    let mut total = REQUEST_TIMEOUT_DEFAULT_MS * (RETRIES_DEFAULT as u64 + 1);
    let mut retry = 0;
    while retry < RETRIES_DEFAULT {
        let backoff = BACKOFF_BASE_DEFAULT_MS << retry;
        total += if backoff < BACKOFF_MAX_MS {
            backoff
        } else {
            BACKOFF_MAX_MS
        };
        retry += 1;
    }
    total
}
const _: () = assert!(default_sequence_max_ms() <= READ_DEADLINE_DEFAULT_MS);

/// Where an S3 bucket is and how to sign for it.
#[derive(Clone, Debug, Default)]
pub struct S3Location {
    /// Bucket name.
    pub bucket: String,
    /// Key prefix without leading or trailing '/' ("" for the whole bucket).
    pub prefix: String,
    /// Endpoint URL; None: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the
    /// selected profile's `endpoint_url` in ~/.aws/config, else AWS.
    pub endpoint: Option<String>,
    /// Region; None: AWS_REGION, AWS_DEFAULT_REGION, the selected profile's
    /// `region`, else us-east-1.
    pub region: Option<String>,
    /// Virtual-host addressing (bucket.endpoint); default path style,
    /// which every S3 server that is not AWS understands.
    pub virtual_host_style: bool,
}

impl ObjectStoreConfig {
    /// An S3 bucket with the default limits. Credentials come the way the
    /// AWS tools take them (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
    /// AWS_SESSION_TOKEN, AWS_PROFILE, ~/.aws/credentials and ~/.aws/config),
    /// loaded by OpenDAL's signer.
    pub fn s3(location: &S3Location) -> Self {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mut options = vec![
            ("bucket".to_string(), location.bucket.clone()),
            ("root".to_string(), format!("/{}", location.prefix)),
        ];
        // AWS's precedence (aws_config's comment): the flag, the
        // environment, the profile.
        let profile = aws_config::selected_profile(&env);
        let region = location
            .region
            .clone()
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or(profile.region)
            .unwrap_or_else(|| "us-east-1".to_string());
        let ignore_configured = env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let endpoint = location.endpoint.clone().or_else(|| {
            if ignore_configured {
                // OpenDAL would take AWS_ENDPOINT_URL itself: name AWS's.
                Some(format!("https://s3.{region}.amazonaws.com"))
            } else {
                env("AWS_ENDPOINT_URL_S3")
                    .or_else(|| env("AWS_ENDPOINT_URL"))
                    .or(profile.endpoint_url)
            }
        });
        if let Some(endpoint) = endpoint {
            options.push(("endpoint".to_string(), endpoint));
        }
        options.push(("region".to_string(), region));
        if location.virtual_host_style {
            options.push(("enable_virtual_host_style".to_string(), "true".to_string()));
        }
        let display_name = if location.prefix.is_empty() {
            format!("s3://{}", location.bucket)
        } else {
            format!("s3://{}/{}", location.bucket, location.prefix)
        };
        Self {
            scheme: "s3".to_string(),
            options,
            display_name,
            metadata_ttl_ms: METADATA_TTL_DEFAULT_MS,
            request_timeout_ms: REQUEST_TIMEOUT_DEFAULT_MS,
            retries_max: RETRIES_DEFAULT,
            backoff_base_ms: BACKOFF_BASE_DEFAULT_MS,
            read_deadline_ms: READ_DEADLINE_DEFAULT_MS,
            stale_if_error: false,
            single_key: None,
        }
    }
}

/// Parses "s3://BUCKET[/PREFIX]" into (bucket, prefix). None if `uri` is
/// not an s3:// URI; an error if it is one without a bucket.
pub fn parse_s3_uri(uri: &str) -> Option<io::Result<(String, String)>> {
    let rest = uri.strip_prefix("s3://")?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Some(Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{uri}: no bucket name (expected s3://BUCKET[/PREFIX])"),
        )));
    }
    Some(Ok((
        bucket.to_string(),
        prefix.trim_matches('/').to_string(),
    )))
}

/// Requests made and what became of them (for stats and benchmarks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectStoreStats {
    /// Ranged GETs issued (data reads).
    pub gets: u64,
    /// Bytes those GETs returned.
    pub get_bytes: u64,
    /// HEADs issued (stats of keys).
    pub heads: u64,
    /// Listings issued (each page counts).
    pub lists: u64,
    /// Tries repeated after throttling, a timeout or a transport error.
    pub retries: u64,
    /// Conditional GETs refused because the object changed (412).
    pub precondition_failed: u64,
    /// Times the store was found not answering (outages begun).
    pub outages: u64,
    /// Requests failed at once during an outage, unsent.
    pub refused_in_outage: u64,
    /// Requests the outage probe sent.
    pub probes: u64,
    /// Stats and listings served past their TTL because the store could
    /// not be reached (`stale_if_error`).
    pub stale_if_error_hits: u64,
}

#[derive(Default)]
struct Counters {
    gets: AtomicU64,
    get_bytes: AtomicU64,
    heads: AtomicU64,
    lists: AtomicU64,
    retries: AtomicU64,
    precondition_failed: AtomicU64,
    outages: AtomicU64,
    refused_in_outage: AtomicU64,
    probes: Arc<AtomicU64>,
    stale_if_error_hits: AtomicU64,
}

/// What the store said about a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Object size.
    pub size_bytes: u64,
    /// The ETag as the store spells it (quotes included); empty if none.
    pub etag: String,
    /// Version id in a versioned bucket; empty otherwise.
    pub version_id: String,
    /// Last-modified time, if the store gave one.
    pub mtime: Option<SystemTime>,
}

impl ObjectMeta {
    fn version_hash(&self) -> u64 {
        Generation::version_hash_of(&self.etag, &self.version_id)
    }
}

/// One name in a directory listing.
#[derive(Clone, Debug)]
pub struct ListEntry {
    /// The last component, without a trailing '/'.
    pub name: String,
    /// A common prefix (a directory), not an object.
    pub is_dir: bool,
    /// For objects: what the listing said (size, ETag, mtime).
    pub meta: Option<ObjectMeta>,
}

/// A stat cache entry: Some(meta) or None for a key known to be missing.
struct StatEntry {
    meta: Option<ObjectMeta>,
    fetched: Instant,
}

struct DirEntryCache {
    entries: Arc<Vec<ListEntry>>,
    fetched: Instant,
}

struct Shared {
    op: opendal::Operator,
    runtime: tokio::runtime::Runtime,
    config: ObjectStoreConfig,
    counters: Counters,
    /// Whether the store answers (outages, `health`).
    health: Arc<Health>,
    stats_cache: RankedMutex<HashMap<String, StatEntry>, { rank::PRIMARY }>,
    dirs: RankedMutex<HashMap<String, DirEntryCache>, { rank::PRIMARY }>,
    /// One object per key while any handle holds it: every handle of a key
    /// must know the same versions (the read path shares one generation
    /// per object among all its handles).
    objects: RankedMutex<HashMap<String, std::sync::Weak<StoreObject>>, { rank::PRIMARY_OBJECTS }>,
}

/// A bucket (or a prefix of one) as primary storage. Read-only.
pub struct ObjectStorePrimary {
    shared: Arc<Shared>,
}

fn stable_key_id(key: &str) -> u64 {
    // The object id must be the same in every run: records on flash are
    // filed under it.
    Generation::version_hash_of(key, "object id")
}

fn retryable(e: &opendal::Error) -> bool {
    e.is_temporary() || e.kind() == opendal::ErrorKind::RateLimited
}

/// A failure of `what`, as the read path and the front ends see it.
fn to_io(e: &opendal::Error, what: &str) -> io::Error {
    failure_of(e).into_io(what)
}

impl Shared {
    fn ttl(&self) -> Duration {
        Duration::from_millis(self.config.metadata_ttl_ms)
    }

    fn read_deadline(&self) -> Duration {
        Duration::from_millis(self.config.read_deadline_ms.max(1))
    }

    fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms.max(1))
    }

    /// Fails at once while the store is in an outage (`health`).
    fn refuse_in_outage(&self) -> Result<(), Failure> {
        match self.health.refusal() {
            None => Ok(()),
            Some((kind, detail)) => {
                self.counters
                    .refused_in_outage
                    .fetch_add(1, Ordering::Relaxed);
                Err(Failure {
                    kind,
                    cause: Cause::NoAnswer,
                    detail,
                    answered: false,
                    transient: true,
                })
            }
        }
    }

    /// Notes what one try said of the store: any answer ends an outage.
    fn note_try(&self, failure: Option<&Failure>) {
        if failure.is_none_or(|f| f.answered) {
            self.health.answered();
        }
    }

    /// The failure a sequence of `tries` ends with, begun at `started`
    /// (see the module comment); a sequence without a single answer puts
    /// the store in an outage and starts its probe.
    fn gave_up(&self, last: Failure, tries: u32, started: Instant, answered: bool) -> Failure {
        let secs = started.elapsed().as_secs_f64();
        let detail = if last.cause == Cause::NoAnswer && last.kind == io::ErrorKind::TimedOut {
            format!(
                "no answer within {secs:.1} s ({tries} tries of at most {:.1} s; read deadline {:.1} s)",
                self.request_timeout().as_secs_f64(),
                self.read_deadline().as_secs_f64()
            )
        } else {
            format!(
                "{} (gave up after {tries} tries in {secs:.1} s)",
                last.detail
            )
        };
        if !answered && last.cause == Cause::NoAnswer {
            self.begin_outage(last.kind, &detail);
        }
        Failure { detail, ..last }
    }

    /// The store did not answer a whole sequence: an outage, with a probe
    /// to find its end (one probe an outage).
    fn begin_outage(&self, kind: io::ErrorKind, detail: &str) {
        if !self.health.no_answer(kind, detail) {
            return;
        }
        self.counters.outages.fetch_add(1, Ordering::Relaxed);
        let probe = match &self.config.single_key {
            Some(key) => Probe::Stat(key.clone()),
            None => Probe::List,
        };
        let ctx = ProbeContext {
            op: self.op.clone(),
            probe,
            request_timeout: self.request_timeout(),
            read_deadline: self.read_deadline(),
            sent: Arc::clone(&self.counters.probes),
        };
        self.runtime
            .spawn(health::probe(Arc::clone(&self.health), ctx));
    }

    /// Runs one request to completion: tries, each within the request
    /// timeout, all within the read deadline (see the module comment).
    fn call<T, F, Fut>(&self, mut op: F) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: IntoFuture<Output = opendal::Result<T>>,
    {
        self.refuse_in_outage()?;
        let started = Instant::now();
        let deadline = started + self.read_deadline();
        let mut tries = 0u32;
        let mut answered = false;
        let last = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let timeout = self.request_timeout().min(left);
            tries += 1;
            let result = self
                .runtime
                .block_on(async { tokio::time::timeout(timeout, op().into_future()).await });
            let failure = match result {
                Ok(Ok(value)) => {
                    self.note_try(None);
                    return Ok(value);
                }
                Ok(Err(e)) => {
                    let failure = failure_of(&e);
                    answered |= failure.answered;
                    self.note_try(Some(&failure));
                    if !retryable(&e) {
                        return Err(failure);
                    }
                    failure
                }
                Err(_) => {
                    Failure::timed_out(format!("no answer within {:.1} s", timeout.as_secs_f64()))
                }
            };
            // Throttled, timed out or cut off: again, if tries and time
            // are left.
            if tries > self.config.retries_max || !self.back_off(tries, deadline) {
                break failure;
            }
        };
        Err(self.gave_up(last, tries, started, answered))
    }

    /// Counts a retry and sleeps before try `tries` + 1 (`tries` >= 1):
    /// capped exponential backoff with jitter. False, without sleeping,
    /// when the sleep would reach `deadline`: no time for another try.
    fn back_off(&self, tries: u32, deadline: Instant) -> bool {
        let backoff_ms = self
            .config
            .backoff_base_ms
            .saturating_mul(1u64 << (tries - 1).min(16))
            .min(BACKOFF_MAX_MS);
        // Half the backoff plus jitter from the clock's low bits: many
        // clients throttled together must not come back together.
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| u64::from(d.subsec_nanos()))
            .unwrap_or(0);
        let sleep = Duration::from_millis(backoff_ms / 2 + nanos % (backoff_ms / 2 + 1));
        if Instant::now() + sleep >= deadline {
            return false;
        }
        self.counters.retries.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(sleep);
        true
    }

    /// Whether `failure` of a refresh may be answered with what was last
    /// known (`stale_if_error`): it says nothing of the object.
    fn may_serve_stale(&self, failure: &Failure) -> bool {
        self.config.stale_if_error && failure.transient
    }

    fn note_stale_served(&self) {
        self.counters
            .stale_if_error_hits
            .fetch_add(1, Ordering::Relaxed);
    }

    /// HEAD a key, through the stat cache (positive and negative entries).
    /// `fresh`: ask the store even within the TTL, and never answer from
    /// what is stale (the store said the object changed). Otherwise, under
    /// `stale_if_error`, a HEAD the store does not answer is answered with
    /// the expired entry, else with `known` (what the caller last knew).
    fn stat(&self, key: &str, fresh: bool, known: Option<&ObjectMeta>) -> io::Result<ObjectMeta> {
        let mut stale = None;
        if !fresh {
            let cache = self.stats_cache.lock().expect("stat cache poisoned");
            if let Some(entry) = cache.get(key) {
                if entry.fetched.elapsed() < self.ttl() {
                    return entry.meta.clone().ok_or_else(|| not_found(key));
                }
                stale = Some(entry.meta.clone());
            }
        }
        self.counters.heads.fetch_add(1, Ordering::Relaxed);
        let fetched = Instant::now();
        let meta = match self.call(|| self.op.stat(key)) {
            Ok(m) if m.is_dir() => {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    format!("{key} is a prefix, not an object"),
                ));
            }
            Ok(m) => Some(meta_of(&m)),
            Err(f) if f.kind == io::ErrorKind::NotFound => None,
            Err(f) if !fresh && self.may_serve_stale(&f) => {
                let Some(meta) = stale.or_else(|| known.map(|m| Some(m.clone()))) else {
                    return Err(f.into_io(&format!("stat {key}")));
                };
                self.note_stale_served();
                return meta.ok_or_else(|| not_found(key));
            }
            Err(f) => return Err(f.into_io(&format!("stat {key}"))),
        };
        self.remember(key, meta.clone(), fetched);
        meta.ok_or_else(|| not_found(key))
    }

    fn remember(&self, key: &str, meta: Option<ObjectMeta>, fetched: Instant) {
        let mut cache = self.stats_cache.lock().expect("stat cache poisoned");
        if cache.len() >= STAT_CACHE_MAX_ENTRIES {
            let ttl = self.ttl();
            cache.retain(|_, e| e.fetched.elapsed() < ttl);
            if cache.len() >= STAT_CACHE_MAX_ENTRIES {
                cache.clear();
            }
        }
        cache.insert(key.to_string(), StatEntry { meta, fetched });
    }

    fn forget(&self, key: &str) {
        self.stats_cache
            .lock()
            .expect("stat cache poisoned")
            .remove(key);
    }
}

fn not_found(key: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{key}: no such object"))
}

fn meta_of(m: &opendal::Metadata) -> ObjectMeta {
    ObjectMeta {
        size_bytes: m.content_length(),
        etag: m.etag().unwrap_or("").to_string(),
        version_id: m.version().unwrap_or("").to_string(),
        mtime: m.last_modified().map(SystemTime::from),
    }
}

impl ObjectStorePrimary {
    /// Connects (builds the OpenDAL operator and its runtime). Checks
    /// nothing on the network: call [`Self::check`] for that.
    pub fn new(config: ObjectStoreConfig) -> io::Result<Self> {
        opendal::install_default();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("l2arc-objstore")
            .enable_all()
            .build()?;
        assert!(
            config.read_deadline_ms > 0 && config.request_timeout_ms > 0,
            "{config:?}: timeouts must be positive"
        );
        let op = {
            let _guard = runtime.enter();
            opendal::Operator::via_iter(&config.scheme, config.options.clone())
                .map_err(|e| to_io(&e, &config.display_name))?
        };
        Ok(Self {
            shared: Arc::new(Shared {
                op,
                runtime,
                config,
                counters: Counters::default(),
                health: Arc::new(Health::default()),
                stats_cache: RankedMutex::new(HashMap::new()),
                dirs: RankedMutex::new(HashMap::new()),
                objects: RankedMutex::new(HashMap::new()),
            }),
        })
    }

    /// Proves at start that the bucket exists and takes our credentials
    /// (one LIST of at most one key), and that the single key exists when
    /// there is one. A one-line error otherwise, naming its cause and what
    /// to look at (`failure::check_hint`).
    pub fn check(&self) -> io::Result<()> {
        let s = &self.shared;
        let name = &s.config.display_name;
        s.counters.lists.fetch_add(1, Ordering::Relaxed);
        s.call(|| s.op.list_with("/").limit(1)).map_err(|f| {
            let hint = failure::check_hint(&f);
            io::Error::new(f.kind, format!("list {name}: {}{hint}", f.detail))
        })?;
        if let Some(key) = &s.config.single_key {
            s.stat(key, true, None)?;
        }
        Ok(())
    }

    /// Whether the store is in an outage now (see the module comment).
    pub fn is_unreachable(&self) -> bool {
        self.shared.health.in_outage()
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &ObjectStoreConfig {
        &self.shared.config
    }

    /// Requests made so far and what became of them.
    pub fn stats(&self) -> ObjectStoreStats {
        let c = &self.shared.counters;
        ObjectStoreStats {
            gets: c.gets.load(Ordering::Relaxed),
            get_bytes: c.get_bytes.load(Ordering::Relaxed),
            heads: c.heads.load(Ordering::Relaxed),
            lists: c.lists.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            precondition_failed: c.precondition_failed.load(Ordering::Relaxed),
            outages: c.outages.load(Ordering::Relaxed),
            refused_in_outage: c.refused_in_outage.load(Ordering::Relaxed),
            probes: c.probes.load(Ordering::Relaxed),
            stale_if_error_hits: c.stale_if_error_hits.load(Ordering::Relaxed),
        }
    }

    /// What the store says of `key` (trusted for the TTL; a missing key
    /// too; past it, under `stale_if_error`, what was last known when the
    /// store cannot be reached). `key` is relative to the prefix, without a
    /// leading '/'.
    pub fn stat(&self, key: &str) -> io::Result<ObjectMeta> {
        self.shared.stat(key, false, None)
    }

    /// The names directly under `dir` ("" for the top, else "a/b"), from a
    /// '/'-delimited listing trusted for the TTL. Objects' metadata from
    /// the listing fills the stat cache. NotFound if nothing is under it.
    pub fn list_dir(&self, dir: &str) -> io::Result<Arc<Vec<ListEntry>>> {
        let s = &self.shared;
        let dir = dir.trim_matches('/');
        let stale = {
            let dirs = s.dirs.lock().expect("dir cache poisoned");
            match dirs.get(dir) {
                Some(d) if d.fetched.elapsed() < s.ttl() => return Ok(Arc::clone(&d.entries)),
                Some(d) => Some(Arc::clone(&d.entries)),
                None => None,
            }
        };
        let path = if dir.is_empty() {
            "/".to_string()
        } else {
            format!("{dir}/")
        };
        s.counters.lists.fetch_add(1, Ordering::Relaxed);
        let fetched = Instant::now();
        let listed = match s.call(|| s.op.list_with(&path).recursive(false)) {
            Ok(listed) => listed,
            Err(f) if s.may_serve_stale(&f) && stale.is_some() => {
                s.note_stale_served();
                return Ok(stale.expect("checked"));
            }
            Err(f) => return Err(f.into_io(&format!("list {path}"))),
        };
        if listed.len() > DIR_ENTRIES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("{path}: more than {DIR_ENTRIES_MAX} entries"),
            ));
        }
        let mut entries = Vec::with_capacity(listed.len());
        for entry in listed {
            let rel = entry.path().trim_start_matches('/');
            let name = rel
                .strip_prefix(path.trim_start_matches('/'))
                .unwrap_or(rel)
                .trim_end_matches('/');
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                continue; // the directory itself, or a name we cannot show
            }
            let is_dir = entry.metadata().is_dir();
            let meta = (!is_dir).then(|| meta_of(entry.metadata()));
            if let Some(meta) = &meta {
                let key = if dir.is_empty() {
                    name.to_string()
                } else {
                    format!("{dir}/{name}")
                };
                s.remember(&key, Some(meta.clone()), fetched);
            }
            entries.push(ListEntry {
                name: name.to_string(),
                is_dir,
                meta,
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        entries.dedup_by(|a, b| a.name == b.name && a.is_dir == b.is_dir);
        let entries = Arc::new(entries);
        self.remember_dir(dir, &entries, fetched);
        Ok(entries)
    }

    /// Keeps a listing for the TTL; the cache is bounded: expired listings
    /// go first, and if all are fresh, all go (a re-list is only a miss).
    fn remember_dir(&self, dir: &str, entries: &Arc<Vec<ListEntry>>, fetched: Instant) {
        let s = &self.shared;
        let mut dirs = s.dirs.lock().expect("dir cache poisoned");
        if dirs.len() >= DIR_CACHE_MAX_ENTRIES {
            let ttl = s.ttl();
            dirs.retain(|_, d| d.fetched.elapsed() < ttl);
            if dirs.len() >= DIR_CACHE_MAX_ENTRIES {
                dirs.clear();
            }
        }
        dirs.insert(
            dir.to_string(),
            DirEntryCache {
                entries: Arc::clone(entries),
                fetched,
            },
        );
    }

    fn key_of(&self, name: &str) -> io::Result<String> {
        if name.is_empty()
            && let Some(key) = &self.shared.config.single_key
        {
            return Ok(key.clone());
        }
        let key = name.trim_start_matches('/');
        if key.is_empty() || key.ends_with('/') {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{name:?} is not an object key"),
            ));
        }
        Ok(key.to_string())
    }
}

impl Primary for ObjectStorePrimary {
    fn open(&self, name: &str, writable: bool) -> io::Result<Arc<dyn PrimaryObject>> {
        if writable {
            return Err(io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                format!("{} is read-only", self.describe()),
            ));
        }
        let key = self.key_of(name)?;
        let existing = self
            .shared
            .objects
            .lock()
            .expect("object table poisoned")
            .get(&key)
            .and_then(std::sync::Weak::upgrade);
        if let Some(object) = existing {
            object.info()?; // gone, or changed, within the TTL's trust
            return Ok(object);
        }
        let meta = self.shared.stat(&key, false, None)?;
        let mut objects = self.shared.objects.lock().expect("object table poisoned");
        if let Some(object) = objects.get(&key).and_then(std::sync::Weak::upgrade) {
            return Ok(object); // opened meanwhile by another thread
        }
        if objects.len() >= OPEN_OBJECTS_PRUNE_AT {
            objects.retain(|_, o| o.strong_count() > 0);
        }
        let object = Arc::new(StoreObject {
            shared: Arc::clone(&self.shared),
            id: stable_key_id(&key),
            key: key.clone(),
            state: RankedMutex::new(ObjectView::new(meta)),
        });
        objects.insert(key, Arc::downgrade(&object));
        Ok(object)
    }

    fn describe(&self) -> String {
        self.shared.config.display_name.clone()
    }

    /// A GET's round trip is worth megabytes: sequential readers are read
    /// ahead in spans of the engine's largest, one GET each.
    fn read_ahead_span_bytes(&self) -> Option<u64> {
        Some(crate::PREFETCH_SPAN_BYTES_MAX)
    }
}

/// What one open object knows of its versions.
struct ObjectView {
    current: ObjectMeta,
    fetched: Instant,
    /// Forces the next `info` to ask the store (after a 412 or a 404).
    expired: bool,
    /// version_hash -> (ETag, size) of the versions seen, newest last.
    versions: Vec<(u64, ObjectMeta)>,
}

impl ObjectView {
    fn new(meta: ObjectMeta) -> Self {
        let mut view = Self {
            current: meta.clone(),
            fetched: Instant::now(),
            expired: false,
            versions: Vec::new(),
        };
        view.adopt(meta);
        view
    }

    fn adopt(&mut self, meta: ObjectMeta) {
        let hash = meta.version_hash();
        self.versions.retain(|(h, _)| *h != hash);
        self.versions.push((hash, meta.clone()));
        if self.versions.len() > VERSIONS_REMEMBERED_MAX {
            self.versions.remove(0);
        }
        self.current = meta;
        self.fetched = Instant::now();
        self.expired = false;
    }
}

struct StoreObject {
    shared: Arc<Shared>,
    key: String,
    id: u64,
    state: RankedMutex<ObjectView, { rank::PRIMARY_OBJECT }>,
}

impl StoreObject {
    fn info_of(&self, meta: &ObjectMeta) -> ObjectInfo {
        ObjectInfo {
            id: self.id,
            generation: Generation {
                ino: self.id,
                size_bytes: meta.size_bytes,
                mtime_ns: 0,
                ctime_ns: 0,
                version_hash: meta.version_hash(),
            },
        }
    }

    fn expire(&self) {
        self.state.lock().expect("object view poisoned").expired = true;
        self.shared.forget(&self.key);
    }
}

/// How one streamed GET ended.
enum StreamEnd {
    /// The server sent its last byte.
    Done,
    Failed(opendal::Error),
    /// No piece within the request timeout.
    TimedOut,
    /// More bytes than the range holds: not trusted.
    Overlong,
    /// The sink wanted no more.
    Stopped,
}

impl StoreObject {
    /// What we know of the version `expected` names (its ETag), or
    /// `StaleNetworkFileHandle` if it is none we remember.
    fn version_of(&self, expected: Option<&Generation>) -> io::Result<ObjectMeta> {
        let meta = expected.and_then(|expected| {
            let view = self.state.lock().expect("object view poisoned");
            view.versions
                .iter()
                .rev()
                .find(|(h, _)| *h == expected.version_hash)
                .map(|(_, m)| m.clone())
        });
        let meta = meta.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::StaleNetworkFileHandle,
                format!("{}: object changed", self.key),
            )
        })?;
        debug_assert_eq!(Some(meta.size_bytes), expected.map(|e| e.size_bytes));
        Ok(meta)
    }

    /// One GET of `[*at, end)` under If-Match, each piece handed to `sink`
    /// as it arrives and `*at` moved past it. The first piece must come by
    /// `first_by` (what is left of the read deadline) and within the
    /// request timeout; each later one within the request timeout (and
    /// the read deadline, counted again from the piece before: a stream
    /// that flows is no hung store). So a long span may take longer than
    /// one timeout while it flows; time the sink spends (pacing to its
    /// reader) is not counted.
    async fn stream_get(
        &self,
        meta: &ObjectMeta,
        at: &mut u64,
        end: u64,
        first_by: Instant,
        sink: &mut dyn FnMut(&[u8]) -> bool,
    ) -> StreamEnd {
        use futures_core::Stream;
        let s = &self.shared;
        let piece_timeout = s.request_timeout().min(s.read_deadline());
        let first_timeout = piece_timeout.min(first_by.saturating_duration_since(Instant::now()));
        let mut reader = s.op.reader_with(&self.key);
        if !meta.etag.is_empty() {
            reader = reader.if_match(&meta.etag);
        }
        let opened = async { reader.await?.into_stream(*at..end).await };
        let stream = match tokio::time::timeout(first_timeout, opened).await {
            Err(_) => return StreamEnd::TimedOut,
            Ok(Err(e)) => return StreamEnd::Failed(e),
            Ok(Ok(stream)) => stream,
        };
        let mut stream = std::pin::pin!(stream);
        let mut timeout = first_timeout;
        loop {
            let next = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx));
            let waited = tokio::time::timeout(timeout, next).await;
            timeout = piece_timeout;
            let buffer = match waited {
                Err(_) => return StreamEnd::TimedOut,
                Ok(None) => return StreamEnd::Done,
                Ok(Some(Err(e))) => return StreamEnd::Failed(e),
                Ok(Some(Ok(buffer))) => buffer,
            };
            for chunk in buffer {
                if chunk.len() as u64 > end - *at {
                    return StreamEnd::Overlong;
                }
                let more = sink(&chunk);
                *at += chunk.len() as u64;
                s.counters
                    .get_bytes
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                if !more {
                    return StreamEnd::Stopped;
                }
            }
        }
    }
}

impl PrimaryObject for StoreObject {
    fn info(&self) -> io::Result<ObjectInfo> {
        let (fresh, meta) = {
            let view = self.state.lock().expect("object view poisoned");
            (
                view.expired || view.fetched.elapsed() >= self.shared.ttl(),
                view.current.clone(),
            )
        };
        if !fresh {
            return Ok(self.info_of(&meta));
        }
        // Through the shared stat cache: another handle (or a listing) may
        // have asked within the TTL; an expired view asks the store, and is
        // never answered from what it knew (the store said it changed).
        let expired = self.state.lock().expect("object view poisoned").expired;
        let meta = self.shared.stat(&self.key, expired, Some(&meta))?;
        self.state
            .lock()
            .expect("object view poisoned")
            .adopt(meta.clone());
        Ok(self.info_of(&meta))
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        // Unconditional callers get the current version's bytes, still
        // never a mix: the GET is conditional on the current ETag.
        let generation = self.info()?.generation;
        self.read_at_generation(offset, buf, Some(&generation))
    }

    fn read_at_generation(
        &self,
        offset: u64,
        buf: &mut [u8],
        expected: Option<&Generation>,
    ) -> io::Result<usize> {
        let meta = self.version_of(expected)?;
        if offset >= meta.size_bytes || buf.is_empty() {
            return Ok(0);
        }
        let end = offset.saturating_add(buf.len() as u64).min(meta.size_bytes);
        let want = (end - offset) as usize;
        let s = &self.shared;
        s.counters.gets.fetch_add(1, Ordering::Relaxed);
        let what = format!("read {} [{offset}, {end})", self.key);
        let result = s
            .call(|| {
                let mut read = s.op.read_with(&self.key).range(offset..end);
                if !meta.etag.is_empty() {
                    read = read.if_match(&meta.etag);
                }
                read
            })
            .map_err(|f| f.into_io(&what));
        let data = match result {
            Ok(data) => data,
            Err(e) if e.kind() == io::ErrorKind::StaleNetworkFileHandle => {
                s.counters
                    .precondition_failed
                    .fetch_add(1, Ordering::Relaxed);
                self.expire();
                return Err(e);
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::NotFound {
                    self.expire();
                }
                return Err(e);
            }
        };
        if data.len() != want {
            // Under If-Match the server owes us exactly the range; anything
            // else is not trusted.
            self.expire();
            return Err(io::Error::other(format!(
                "{what}: the store returned {} bytes, not {want}",
                data.len()
            )));
        }
        let mut at = 0;
        for chunk in data {
            buf[at..at + chunk.len()].copy_from_slice(&chunk);
            at += chunk.len();
        }
        s.counters
            .get_bytes
            .fetch_add(want as u64, Ordering::Relaxed);
        Ok(want)
    }

    /// One conditional GET for the whole range, streamed. A stream cut off
    /// midway (a transport error, a timeout) goes on from where it stopped
    /// with another GET under the same If-Match: every byte handed over is
    /// of the version `expected` names, and a 412 on a later GET ends the
    /// read with what came before it. Tries and the read deadline count
    /// from the last progress: a span that flows is never cut by the
    /// deadline, one that stops gets one sequence of tries (module
    /// comment), and none while the store is in an outage.
    fn read_span_at_generation(
        &self,
        offset: u64,
        len: usize,
        expected: Option<&Generation>,
        sink: &mut dyn FnMut(&[u8]) -> bool,
    ) -> io::Result<usize> {
        let meta = self.version_of(expected)?;
        if offset >= meta.size_bytes || len == 0 {
            return Ok(0);
        }
        let end = offset.saturating_add(len as u64).min(meta.size_bytes);
        let s = &self.shared;
        let what = |at: u64| format!("read {} [{at}, {end})", self.key);
        let mut at = offset;
        let mut tries = 0u32;
        let mut answered = false;
        let mut started = Instant::now();
        loop {
            s.refuse_in_outage().map_err(|f| f.into_io(&what(at)))?;
            s.counters.gets.fetch_add(1, Ordering::Relaxed);
            tries += 1;
            let from = at;
            let first_by = started + s.read_deadline();
            let ended = s
                .runtime
                .block_on(self.stream_get(&meta, &mut at, end, first_by, sink));
            if at > from {
                // Progress: the store answers; a new sequence from here.
                s.note_try(None);
                (tries, started, answered) = (1, Instant::now(), true);
            }
            let failure = match ended {
                StreamEnd::Done if at == end => return Ok((end - offset) as usize),
                StreamEnd::Stopped => return Ok((at - offset) as usize),
                // Ended early without an error: cut off; go on.
                StreamEnd::Done => Failure {
                    kind: io::ErrorKind::UnexpectedEof,
                    cause: Cause::Other,
                    detail: format!("the answer ended {} bytes short", end - at),
                    answered: true,
                    transient: true,
                },
                StreamEnd::TimedOut => Failure::timed_out("no answer".to_string()),
                StreamEnd::Failed(e) => {
                    let failure = failure_of(&e);
                    answered |= failure.answered;
                    s.note_try(Some(&failure));
                    if !retryable(&e) {
                        let e = failure.into_io(&what(at));
                        if e.kind() == io::ErrorKind::StaleNetworkFileHandle {
                            s.counters
                                .precondition_failed
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        if matches!(
                            e.kind(),
                            io::ErrorKind::StaleNetworkFileHandle | io::ErrorKind::NotFound
                        ) {
                            self.expire();
                        }
                        return Err(e);
                    }
                    failure
                }
                StreamEnd::Overlong => {
                    self.expire();
                    return Err(io::Error::other(format!(
                        "{}: the store returned more bytes than the range holds",
                        what(at)
                    )));
                }
            };
            if tries > s.config.retries_max || !s.back_off(tries, first_by) {
                return Err(s
                    .gave_up(failure, tries, started, answered)
                    .into_io(&what(at)));
            }
        }
    }

    fn source_identity(&self, generation: &Generation) -> Option<SourceIdentity> {
        let meta = self.version_of(Some(generation)).ok()?;
        // A store that gives no ETag names no version: nothing to share.
        if meta.etag.is_empty() && meta.version_id.is_empty() {
            return None;
        }
        let option = |name: &str| {
            let options = &self.shared.config.options;
            options
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let root = option("root").unwrap_or("").trim_matches('/');
        let key = if root.is_empty() {
            self.key.clone()
        } else {
            format!("{root}/{}", self.key)
        };
        // No endpoint: AWS's, of the region.
        let endpoint = option("endpoint").map_or_else(
            || {
                format!(
                    "https://s3.{}.amazonaws.com",
                    option("region").unwrap_or("us-east-1")
                )
            },
            str::to_string,
        );
        Some(SourceIdentity::new(
            endpoint,
            option("bucket").unwrap_or("").to_string(),
            key,
            format!("{}\0{}", meta.etag, meta.version_id),
        ))
    }

    fn write_at(&self, _offset: u64, _data: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::ReadOnlyFilesystem,
            format!("{}: the object store is read-only", self.key),
        ))
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse() {
        assert_eq!(
            parse_s3_uri("s3://b/x/y/").unwrap().unwrap(),
            ("b".to_string(), "x/y".to_string())
        );
        assert_eq!(
            parse_s3_uri("s3://b").unwrap().unwrap(),
            ("b".to_string(), String::new())
        );
        assert!(parse_s3_uri("s3:///x").unwrap().is_err());
        assert!(parse_s3_uri("/srv/data").is_none());
    }

    #[test]
    fn version_hashes_are_stable_and_separate_fields() {
        assert_eq!(
            Generation::version_hash_of("\"abc\"", ""),
            Generation::version_hash_of("\"abc\"", "")
        );
        assert_ne!(
            Generation::version_hash_of("ab", "c"),
            Generation::version_hash_of("a", "bc")
        );
        assert_ne!(Generation::version_hash_of("", ""), 0);
        // Fixed value: records on flash are filed under it across releases.
        assert_eq!(stable_key_id("a/b"), stable_key_id("a/b"));
    }

    #[test]
    fn config_debug_hides_secrets() {
        let mut c = ObjectStoreConfig::s3(&S3Location {
            bucket: "b".into(),
            ..Default::default()
        });
        c.options
            .push(("secret_access_key".into(), "SECRET123".into()));
        let shown = format!("{c:?}");
        assert!(!shown.contains("SECRET123"), "{shown}");
        assert!(shown.contains("secret_access_key"));
    }
}
