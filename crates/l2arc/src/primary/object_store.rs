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
//! concurrent GETs. Throttling (503 SlowDown, 429) and transport errors are
//! retried with capped exponential backoff, a bounded number of times;
//! each request has a timeout. Credentials go to OpenDAL and are never
//! formatted into a message: `describe` names only the bucket and prefix.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::{Generation, ObjectInfo, Primary, PrimaryObject};

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
    /// Timeout of one request.
    pub request_timeout_ms: u64,
    /// Tries of one request beyond the first (throttling, timeouts,
    /// dropped connections).
    pub retries_max: u32,
    /// First backoff between tries; doubles each try up to 2 s.
    pub backoff_base_ms: u64,
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
            .finish_non_exhaustive()
    }
}

/// Default `metadata_ttl_ms`: mountpoint-s3's with a cache (`--metadata-ttl`
/// defaults to 60 s when caching is on).
pub const METADATA_TTL_DEFAULT_MS: u64 = 60_000;
/// Default bound on one request, from its start to its last byte.
pub const REQUEST_TIMEOUT_DEFAULT_MS: u64 = 30_000;
/// Default tries after the first for throttling, timeouts and transport errors.
pub const RETRIES_DEFAULT: u32 = 6;
/// Default first backoff; each retry doubles it (with jitter).
pub const BACKOFF_BASE_DEFAULT_MS: u64 = 50;

/// Where an S3 bucket is and how to sign for it.
#[derive(Clone, Debug, Default)]
pub struct S3Location {
    /// Bucket name.
    pub bucket: String,
    /// Key prefix without leading or trailing '/' ("" for the whole bucket).
    pub prefix: String,
    /// Endpoint URL; None: AWS (or AWS_ENDPOINT_URL from the environment).
    pub endpoint: Option<String>,
    /// Region; None: AWS_REGION, AWS_DEFAULT_REGION, else us-east-1.
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
        if let Some(endpoint) = location
            .endpoint
            .clone()
            .or_else(|| env("AWS_ENDPOINT_URL"))
        {
            options.push(("endpoint".to_string(), endpoint));
        }
        let region = location
            .region
            .clone()
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".to_string());
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
}

#[derive(Default)]
struct Counters {
    gets: AtomicU64,
    get_bytes: AtomicU64,
    heads: AtomicU64,
    lists: AtomicU64,
    retries: AtomicU64,
    precondition_failed: AtomicU64,
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
    stats_cache: Mutex<HashMap<String, StatEntry>>,
    dirs: Mutex<HashMap<String, DirEntryCache>>,
    /// One object per key while any handle holds it: every handle of a key
    /// must know the same versions (the read path shares one generation
    /// per object among all its handles).
    objects: Mutex<HashMap<String, std::sync::Weak<StoreObject>>>,
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

fn to_io(e: opendal::Error, what: &str) -> io::Error {
    use opendal::ErrorKind as K;
    let text = e.to_string();
    // The store's own error code and message, when it sent one (S3's XML
    // error body as OpenDAL quotes it): shorter and clearer than the
    // request context around it, which is left out (one line, no headers).
    let quoted = |field: &str| {
        let start = text.find(&format!("{field}: \""))? + field.len() + 3;
        let end = text[start..].find('"')? + start;
        Some(text[start..end].to_string())
    };
    let code = quoted("code");
    let kind = match (e.kind(), code.as_deref()) {
        (_, Some("NoSuchBucket" | "NoSuchKey")) | (K::NotFound, _) => io::ErrorKind::NotFound,
        (_, Some("AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch"))
        | (K::PermissionDenied, _) => io::ErrorKind::PermissionDenied,
        (K::ConditionNotMatch, _) => io::ErrorKind::StaleNetworkFileHandle,
        (K::ConfigInvalid, _) => io::ErrorKind::InvalidInput,
        (K::RateLimited, _) => io::ErrorKind::ResourceBusy,
        (K::IsADirectory, _) => io::ErrorKind::IsADirectory,
        (K::NotADirectory, _) => io::ErrorKind::NotADirectory,
        _ => io::ErrorKind::Other,
    };
    let detail = match (code, quoted("message")) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code,
        _ => {
            let first = text.lines().next().unwrap_or("");
            let short: String = first.chars().take(200).collect();
            short
        }
    };
    io::Error::new(kind, format!("{what}: {detail}"))
}

fn retryable(e: &opendal::Error) -> bool {
    e.is_temporary() || e.kind() == opendal::ErrorKind::RateLimited
}

impl Shared {
    fn ttl(&self) -> Duration {
        Duration::from_millis(self.config.metadata_ttl_ms)
    }

    /// Runs one request to completion with timeouts and bounded retries.
    fn call<T, F, Fut>(&self, what: &str, mut op: F) -> io::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: IntoFuture<Output = opendal::Result<T>>,
    {
        let timeout = Duration::from_millis(self.config.request_timeout_ms.max(1));
        let mut tries = 0u32;
        loop {
            let result = self
                .runtime
                .block_on(async { tokio::time::timeout(timeout, op().into_future()).await });
            let retry_allowed = tries < self.config.retries_max;
            match result {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if !retryable(&e) => return Err(to_io(e, what)),
                Ok(Err(e)) if !retry_allowed => {
                    let e = to_io(e, what);
                    return Err(io::Error::new(
                        e.kind(),
                        format!("{e} (gave up after {} tries)", tries + 1),
                    ));
                }
                Err(_) if !retry_allowed => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "{what}: timed out after {} ms, {} tries",
                            timeout.as_millis(),
                            tries + 1
                        ),
                    ));
                }
                // Throttled, timed out or cut off, with tries left.
                Ok(Err(_)) | Err(_) => {}
            }
            tries += 1;
            self.back_off(tries);
        }
    }

    /// Counts a retry and sleeps before try `tries` + 1 (`tries` >= 1):
    /// capped exponential backoff with jitter.
    fn back_off(&self, tries: u32) {
        self.counters.retries.fetch_add(1, Ordering::Relaxed);
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
        let sleep_ms = backoff_ms / 2 + nanos % (backoff_ms / 2 + 1);
        std::thread::sleep(Duration::from_millis(sleep_ms));
    }

    /// HEAD a key, through the stat cache (positive and negative entries).
    fn stat(&self, key: &str, fresh: bool) -> io::Result<ObjectMeta> {
        if !fresh {
            let cache = self.stats_cache.lock().expect("stat cache poisoned");
            if let Some(entry) = cache.get(key)
                && entry.fetched.elapsed() < self.ttl()
            {
                return entry.meta.clone().ok_or_else(|| not_found(key));
            }
        }
        self.counters.heads.fetch_add(1, Ordering::Relaxed);
        let fetched = Instant::now();
        let result = self.call(&format!("stat {key}"), || self.op.stat(key));
        let meta = match result {
            Ok(m) if m.is_dir() => {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    format!("{key} is a prefix, not an object"),
                ));
            }
            Ok(m) => Some(meta_of(&m)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
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
        let op = {
            let _guard = runtime.enter();
            opendal::Operator::via_iter(&config.scheme, config.options.clone())
                .map_err(|e| to_io(e, &config.display_name))?
        };
        Ok(Self {
            shared: Arc::new(Shared {
                op,
                runtime,
                config,
                counters: Counters::default(),
                stats_cache: Mutex::new(HashMap::new()),
                dirs: Mutex::new(HashMap::new()),
                objects: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Proves at start that the bucket exists and takes our credentials
    /// (one LIST of at most one key), and that the single key exists when
    /// there is one. A one-line error otherwise.
    pub fn check(&self) -> io::Result<()> {
        let s = &self.shared;
        let name = &s.config.display_name;
        s.counters.lists.fetch_add(1, Ordering::Relaxed);
        s.call(&format!("list {name}"), || s.op.list_with("/").limit(1))
            .map_err(|e| {
                let hint = match e.kind() {
                    io::ErrorKind::NotFound => " (no such bucket?)",
                    io::ErrorKind::PermissionDenied => " (credentials refused?)",
                    _ => "",
                };
                io::Error::new(e.kind(), format!("{e}{hint}"))
            })?;
        if let Some(key) = &s.config.single_key {
            s.stat(key, true)?;
        }
        Ok(())
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
        }
    }

    /// What the store says of `key` (trusted for the TTL; a missing key
    /// too). `key` is relative to the prefix, without a leading '/'.
    pub fn stat(&self, key: &str) -> io::Result<ObjectMeta> {
        self.shared.stat(key, false)
    }

    /// The names directly under `dir` ("" for the top, else "a/b"), from a
    /// '/'-delimited listing trusted for the TTL. Objects' metadata from
    /// the listing fills the stat cache. NotFound if nothing is under it.
    pub fn list_dir(&self, dir: &str) -> io::Result<Arc<Vec<ListEntry>>> {
        let s = &self.shared;
        let dir = dir.trim_matches('/');
        {
            let dirs = s.dirs.lock().expect("dir cache poisoned");
            if let Some(d) = dirs.get(dir)
                && d.fetched.elapsed() < s.ttl()
            {
                return Ok(Arc::clone(&d.entries));
            }
        }
        let path = if dir.is_empty() {
            "/".to_string()
        } else {
            format!("{dir}/")
        };
        s.counters.lists.fetch_add(1, Ordering::Relaxed);
        let fetched = Instant::now();
        let listed = s.call(&format!("list {path}"), || {
            s.op.list_with(&path).recursive(false)
        })?;
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
        let meta = self.shared.stat(&key, false)?;
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
            state: Mutex::new(ObjectView::new(meta)),
        });
        objects.insert(key, Arc::downgrade(&object));
        Ok(object)
    }

    fn describe(&self) -> String {
        self.shared.config.display_name.clone()
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
    state: Mutex<ObjectView>,
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
    /// as it arrives and `*at` moved past it. The request timeout bounds
    /// the wait for each piece, not the whole stream: a long span may take
    /// longer than one timeout while it flows.
    async fn stream_get(
        &self,
        meta: &ObjectMeta,
        at: &mut u64,
        end: u64,
        sink: &mut dyn FnMut(&[u8]) -> bool,
    ) -> StreamEnd {
        use futures_core::Stream;
        let s = &self.shared;
        let timeout = Duration::from_millis(s.config.request_timeout_ms.max(1));
        let mut reader = s.op.reader_with(&self.key);
        if !meta.etag.is_empty() {
            reader = reader.if_match(&meta.etag);
        }
        let opened = async { reader.await?.into_stream(*at..end).await };
        let stream = match tokio::time::timeout(timeout, opened).await {
            Err(_) => return StreamEnd::TimedOut,
            Ok(Err(e)) => return StreamEnd::Failed(e),
            Ok(Ok(stream)) => stream,
        };
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx));
            let buffer = match tokio::time::timeout(timeout, next).await {
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
        // have asked within the TTL; an expired view asks the store.
        let expired = self.state.lock().expect("object view poisoned").expired;
        let meta = self.shared.stat(&self.key, expired)?;
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
        let result = s.call(&what, || {
            let mut read = s.op.read_with(&self.key).range(offset..end);
            if !meta.etag.is_empty() {
                read = read.if_match(&meta.etag);
            }
            read
        });
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
    /// with another GET under the same If-Match, within the retry budget:
    /// every byte handed over is of the version `expected` names, and a
    /// 412 on a later GET ends the read with what came before it.
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
        let mut at = offset;
        let mut tries = 0u32;
        loop {
            s.counters.gets.fetch_add(1, Ordering::Relaxed);
            let ended = s
                .runtime
                .block_on(self.stream_get(&meta, &mut at, end, sink));
            let what = format!("read {} [{at}, {end})", self.key);
            let error = match ended {
                StreamEnd::Done if at == end => return Ok((end - offset) as usize),
                StreamEnd::Stopped => return Ok((at - offset) as usize),
                // Ended early without an error: cut off; go on.
                StreamEnd::Done => None,
                StreamEnd::TimedOut => None,
                StreamEnd::Failed(e) if retryable(&e) => Some(to_io(e, &what)),
                StreamEnd::Failed(e) => {
                    let e = to_io(e, &what);
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
                StreamEnd::Overlong => {
                    self.expire();
                    return Err(io::Error::other(format!(
                        "{what}: the store returned more bytes than the range holds"
                    )));
                }
            };
            if tries >= s.config.retries_max {
                let (kind, reason) = error.map_or_else(
                    || {
                        (
                            io::ErrorKind::TimedOut,
                            format!("{what}: cut off or timed out"),
                        )
                    },
                    |e| (e.kind(), e.to_string()),
                );
                return Err(io::Error::new(
                    kind,
                    format!("{reason} (gave up after {} tries)", tries + 1),
                ));
            }
            tries += 1;
            s.back_off(tries);
        }
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
