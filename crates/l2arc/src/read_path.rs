//! The read path: records, generations, and the tiers in order.
//!
//! A read of `(dataset, object, offset, len)` is split into the dataset's
//! records (`recordsize`, 4 KiB to 1 MiB, a power of two, as in ZFS). Each
//! record is looked up in the ARC; a miss claims the record's fill (one read
//! below per record at a time), reads the whole record from primary storage
//! into an aligned buffer, inserts it, and wakes any reader that waited.
//! Whole records are the unit of caching because that is what makes a cache
//! cheap to index; the cost is read amplification on small random reads,
//! which `recordsize` trades off per dataset.
//!
//! Generations. A record is only as good as the object version it was read
//! from. Every object the cache has opened has a shared state with its last
//! known generation (inode, size, mtime) and a token derived from it; records
//! carry the token they were read under, and a hit requires the current one.
//! `open` and `revalidate` compare the primary's generation with the
//! remembered one, so a file rewritten or replaced behind the cache changes
//! the token and every older record turns into a miss at once, with no scan.
//! Writes through the cache go to primary first, then drop the records they
//! touched, then adopt the object's new generation without changing its token:
//! untouched records stay valid. (An outside change that lands between our
//! write and our re-stat is taken for ours: a known, narrow window that every
//! write-through cache over a shared file system shares.)
//!
//! Reads past the end behave as `pread`: short at the end, empty beyond it.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use smallvec::SmallVec;
use std::sync::{Arc, Mutex, RwLock};

use crate::arc::live::{ArcConfig, LiveArc, Lookup, Record, RecordKey};
use crate::arc::policy::AccessKind;
use crate::buf::AlignedBuf;
use crate::hash::{FastHashMap, hash_one};
use crate::primary::{Generation, ObjectInfo, Primary, PrimaryObject};
use crate::stats::{CacheStats, ReadPathCounters};

pub const RECORDSIZE_MIN_BYTES: u32 = 4 * 1024;
pub const RECORDSIZE_MAX_BYTES: u32 = 1024 * 1024;
pub const RECORDSIZE_DEFAULT_BYTES: u32 = 128 * 1024;

/// Errors in configuration: always a one-line message naming the setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "recordsize {0} is out of range: it must be a power of two from 4K to 1M (4096 to 1048576 bytes)"
    )]
    RecordSize(u64),
    #[error("arc_max {0} bytes is too small: it must hold at least one 4 KiB record per shard")]
    ArcMax(u64),
    #[error("arc_shards must be from 1 to 1024, not {0}")]
    Shards(usize),
    #[error("dataset {0:?} already exists")]
    DuplicateDataset(String),
}

/// ZFS's `primarycache` / `secondarycache` property values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// Cache all records.
    #[default]
    All,
    /// Cache nothing: reads go straight to the tier below.
    None,
}

/// Per-dataset properties.
#[derive(Clone, Copy, Debug)]
pub struct DatasetConfig {
    pub recordsize_bytes: u32,
    pub primarycache: CacheMode,
    pub secondarycache: CacheMode,
}

impl Default for DatasetConfig {
    fn default() -> Self {
        Self {
            recordsize_bytes: RECORDSIZE_DEFAULT_BYTES,
            primarycache: CacheMode::All,
            secondarycache: CacheMode::All,
        }
    }
}

impl DatasetConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_recordsize(u64::from(self.recordsize_bytes)).map(|_| ())
    }
}

/// Checks a `recordsize` value as ZFS does.
pub fn validate_recordsize(bytes: u64) -> Result<u32, ConfigError> {
    let ok = bytes.is_power_of_two()
        && (u64::from(RECORDSIZE_MIN_BYTES)..=u64::from(RECORDSIZE_MAX_BYTES)).contains(&bytes);
    if ok {
        Ok(bytes as u32)
    } else {
        Err(ConfigError::RecordSize(bytes))
    }
}

/// Whole-cache settings.
#[derive(Clone, Copy, Debug)]
pub struct CacheConfig {
    /// `arc_max`: DRAM for record buffers.
    pub arc_max_bytes: u64,
    /// Independent ARC shards (locks). Default: 4 per core, at least 1.
    pub arc_shards: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            arc_max_bytes: 1 << 30,
            arc_shards: (cores * 4).clamp(1, 1024),
        }
    }
}

/// Identifies a dataset within one [`Cache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DatasetId(u32);

struct Dataset {
    name: String,
    primary: Arc<dyn Primary>,
    config: DatasetConfig,
}

/// What the cache remembers of an object, shared by all its handles.
struct ObjectState {
    id: u64,
    /// Records must carry this token to be hits.
    token: AtomicU64,
    size_bytes: AtomicU64,
    /// Last generation seen, and a count of explicit invalidations.
    generation: Mutex<(Generation, u64)>,
}

fn generation_token(generation: &Generation, epoch: u64) -> u64 {
    hash_one(&(
        generation.ino,
        generation.size_bytes,
        generation.mtime_ns,
        epoch,
    ))
}

/// An open object, ready for reads and writes through the cache.
pub struct ObjectHandle {
    dataset_id: DatasetId,
    dataset: Arc<Dataset>,
    object: Arc<dyn PrimaryObject>,
    state: Arc<ObjectState>,
}

impl ObjectHandle {
    /// The object's size as last seen (at open, revalidate or our own write).
    pub fn size_bytes(&self) -> u64 {
        self.state.size_bytes.load(Ordering::Acquire)
    }

    pub fn object_id(&self) -> u64 {
        self.state.id
    }

    pub fn dataset(&self) -> DatasetId {
        self.dataset_id
    }

    pub fn recordsize_bytes(&self) -> u32 {
        self.dataset.config.recordsize_bytes
    }
}

/// Bytes of a read, as shared record buffers (no copy).
pub struct ReadView {
    /// Inline for reads within one or two records: no allocation on a hit.
    pub segments: SmallVec<[(Arc<Record>, Range<usize>); 2]>,
}

impl ReadView {
    pub fn len(&self) -> usize {
        self.segments.iter().map(|(_, r)| r.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the view into `out` (which must be at least `len()` long).
    pub fn copy_to(&self, out: &mut [u8]) -> usize {
        let mut at = 0;
        for (record, range) in &self.segments {
            let n = range.len();
            out[at..at + n].copy_from_slice(&record.data[range.clone()]);
            at += n;
        }
        at
    }
}

/// The cache: datasets over primary storage, with the ARC in front.
pub struct Cache {
    arc: LiveArc,
    datasets: RwLock<Vec<Arc<Dataset>>>,
    objects: Mutex<FastHashMap<(u32, u64), Arc<ObjectState>>>,
    counters: ReadPathCounters,
}

impl Cache {
    pub fn new(config: CacheConfig) -> Result<Self, ConfigError> {
        if !(1..=1024).contains(&config.arc_shards) {
            return Err(ConfigError::Shards(config.arc_shards));
        }
        if config.arc_max_bytes < u64::from(RECORDSIZE_MIN_BYTES) * config.arc_shards as u64 {
            return Err(ConfigError::ArcMax(config.arc_max_bytes));
        }
        Ok(Self {
            arc: LiveArc::new(ArcConfig {
                arc_max_bytes: config.arc_max_bytes,
                shards: config.arc_shards,
            }),
            datasets: RwLock::new(Vec::new()),
            objects: Mutex::new(FastHashMap::default()),
            counters: ReadPathCounters::default(),
        })
    }

    /// Adds a dataset: a primary store with its own properties.
    pub fn add_dataset(
        &self,
        name: &str,
        primary: Arc<dyn Primary>,
        config: DatasetConfig,
    ) -> Result<DatasetId, ConfigError> {
        config.validate()?;
        let mut datasets = self.datasets.write().expect("dataset lock poisoned");
        if datasets.iter().any(|d| d.name == name) {
            return Err(ConfigError::DuplicateDataset(name.to_string()));
        }
        let id = DatasetId(u32::try_from(datasets.len()).expect("fewer than 2^32 datasets"));
        datasets.push(Arc::new(Dataset {
            name: name.to_string(),
            primary,
            config,
        }));
        Ok(id)
    }

    fn dataset(&self, id: DatasetId) -> io::Result<Arc<Dataset>> {
        let datasets = self.datasets.read().expect("dataset lock poisoned");
        datasets
            .get(id.0 as usize)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such dataset"))
    }

    /// Opens an object and revalidates what the cache knows of it.
    pub fn open(
        &self,
        dataset_id: DatasetId,
        name: &str,
        writable: bool,
    ) -> io::Result<ObjectHandle> {
        let dataset = self.dataset(dataset_id)?;
        let object = dataset.primary.open(name, writable)?;
        let info = object.info()?;
        let state = {
            let mut objects = self.objects.lock().expect("object table poisoned");
            Arc::clone(objects.entry((dataset_id.0, info.id)).or_insert_with(|| {
                Arc::new(ObjectState {
                    id: info.id,
                    token: AtomicU64::new(generation_token(&info.generation, 0)),
                    size_bytes: AtomicU64::new(info.size_bytes()),
                    generation: Mutex::new((info.generation, 0)),
                })
            }))
        };
        let handle = ObjectHandle {
            dataset_id,
            dataset,
            object,
            state,
        };
        self.adopt(&handle, info, true);
        Ok(handle)
    }

    /// Re-reads the object's generation; if it changed behind the cache,
    /// every record cached for it becomes a miss.
    pub fn revalidate(&self, handle: &ObjectHandle) -> io::Result<ObjectInfo> {
        let info = handle.object.info()?;
        self.adopt(handle, info, true);
        Ok(info)
    }

    /// Records `info` as the object's generation. `outside_change` says a
    /// difference means someone else changed the object (new token).
    fn adopt(&self, handle: &ObjectHandle, info: ObjectInfo, outside_change: bool) {
        let state = &handle.state;
        let mut generation = state.generation.lock().expect("object state poisoned");
        if generation.0 != info.generation {
            generation.0 = info.generation;
            if outside_change {
                state.token.store(
                    generation_token(&generation.0, generation.1),
                    Ordering::Release,
                );
            }
        }
        state.size_bytes.store(info.size_bytes(), Ordering::Release);
    }

    /// Drops every cached record of the object (O(1): a new token).
    pub fn invalidate_object(&self, handle: &ObjectHandle) {
        let state = &handle.state;
        let mut generation = state.generation.lock().expect("object state poisoned");
        generation.1 += 1;
        state.token.store(
            generation_token(&generation.0, generation.1),
            Ordering::Release,
        );
    }

    /// Reads like `pread`: fills `buf` from `offset`, short at end of object.
    pub fn read(&self, handle: &ObjectHandle, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        if handle.dataset.config.primarycache == CacheMode::None {
            return self.read_uncached(handle, offset, buf);
        }
        let recordsize = u64::from(handle.dataset.config.recordsize_bytes);
        let size_bytes = handle.size_bytes();
        let end = offset.saturating_add(buf.len() as u64).min(size_bytes);
        if offset < end && offset / recordsize == (end - 1) / recordsize {
            // Within one record: copy straight out of the record buffer.
            let index = offset / recordsize;
            let record = self.get_record(handle, index, AccessKind::Demand)?;
            let from = (offset - index * recordsize) as usize;
            let to = ((end - index * recordsize) as usize)
                .min(record.data.len())
                .max(from);
            buf[..to - from].copy_from_slice(&record.data[from..to]);
            self.counters.reads.add(1);
            self.counters.read_bytes.add((to - from) as u64);
            return Ok(to - from);
        }
        let view = self.read_view(handle, offset, buf.len(), AccessKind::Demand)?;
        Ok(view.copy_to(buf))
    }

    /// Warms the cache with the records under a range (read-ahead): they are
    /// flagged as prefetched and do not count as reuse.
    pub fn prefetch(&self, handle: &ObjectHandle, offset: u64, len: usize) -> io::Result<()> {
        if handle.dataset.config.primarycache == CacheMode::None {
            return Ok(());
        }
        self.read_view(handle, offset, len, AccessKind::Prefetch)
            .map(|_| ())
    }

    /// Reads a range as shared record buffers, without copying.
    pub fn read_view(
        &self,
        handle: &ObjectHandle,
        offset: u64,
        len: usize,
        kind: AccessKind,
    ) -> io::Result<ReadView> {
        let size_bytes = handle.size_bytes();
        let mut segments = SmallVec::new();
        if len == 0 || offset >= size_bytes {
            return Ok(ReadView { segments });
        }
        let end = offset.saturating_add(len as u64).min(size_bytes);
        let recordsize = u64::from(handle.dataset.config.recordsize_bytes);
        for index in offset / recordsize..=(end - 1) / recordsize {
            let record = self.get_record(handle, index, kind)?;
            let record_start = index * recordsize;
            let from = (offset.max(record_start) - record_start) as usize;
            let to = ((end - record_start) as usize).min(record.data.len());
            let short = record.data.len() < recordsize as usize;
            if from < to {
                segments.push((record, from..to));
            }
            if short {
                break; // end of object as the primary saw it
            }
        }
        if kind == AccessKind::Demand {
            let view = ReadView { segments };
            self.counters.reads.add(1);
            self.counters.read_bytes.add(view.len() as u64);
            return Ok(view);
        }
        Ok(ReadView { segments })
    }

    fn get_record(
        &self,
        handle: &ObjectHandle,
        index: u64,
        kind: AccessKind,
    ) -> io::Result<Arc<Record>> {
        let key = RecordKey {
            dataset: handle.dataset_id.0,
            object: handle.state.id,
            record: index,
        };
        loop {
            let token = handle.state.token.load(Ordering::Acquire);
            match self.arc.lookup(key, token, kind) {
                Lookup::Hit(record) => return Ok(record),
                Lookup::InFlight(fill) => {
                    let record = fill.wait()?;
                    if record.generation_token == token {
                        return Ok(record);
                    }
                    // Filled under another generation: look again.
                }
                Lookup::Claimed(claim) => {
                    let result = self.fill_record(handle, index).map(|data| {
                        Arc::new(Record {
                            data,
                            generation_token: token,
                        })
                    });
                    match result {
                        Ok(record) => {
                            claim.complete(Ok(Arc::clone(&record)));
                            return Ok(record);
                        }
                        Err(e) => {
                            let message = e.to_string();
                            claim.complete(Err(e));
                            return Err(io::Error::other(message));
                        }
                    }
                }
            }
        }
    }

    /// Produces a record's bytes from below the ARC.
    ///
    /// This is the seam where the L2ARC plugs in: look the key up in the
    /// L2ARC index, read and verify the cache device, and fall back to
    /// primary storage on any miss or error.
    fn fill_record(&self, handle: &ObjectHandle, index: u64) -> io::Result<AlignedBuf> {
        let recordsize = handle.dataset.config.recordsize_bytes as usize;
        let mut data = AlignedBuf::zeroed(recordsize);
        let offset = index * recordsize as u64;
        match handle.object.read_at(offset, data.as_mut_slice()) {
            Ok(n) => {
                data.set_len(n);
                self.counters.primary_reads.add(1);
                self.counters.primary_read_bytes.add(n as u64);
                Ok(data)
            }
            Err(e) => {
                self.counters.primary_errors.add(1);
                Err(e)
            }
        }
    }

    fn read_uncached(
        &self,
        handle: &ObjectHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let align = handle.object.read_alignment_bytes() as u64;
        let n = if align <= 1 {
            handle.object.read_at(offset, buf)?
        } else {
            // O_DIRECT below: read whole aligned blocks, then copy out.
            let start = offset / align * align;
            let end = offset
                .checked_add(buf.len() as u64)
                .and_then(|end| end.checked_next_multiple_of(align))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("read {offset}+{} is beyond the largest offset", buf.len()),
                    )
                })?;
            let mut bounce = AlignedBuf::zeroed((end - start) as usize);
            let got = handle.object.read_at(start, bounce.as_mut_slice())?;
            let skip = (offset - start) as usize;
            let n = got.saturating_sub(skip).min(buf.len());
            buf[..n].copy_from_slice(&bounce[skip..skip + n]);
            n
        };
        self.counters.primary_reads.add(1);
        self.counters.primary_read_bytes.add(n as u64);
        self.counters.reads.add(1);
        self.counters.read_bytes.add(n as u64);
        Ok(n)
    }

    /// Writes through to primary storage, then drops every cached record the
    /// write touched (and the old last record, whose short length the write
    /// may have made wrong).
    pub fn write(&self, handle: &ObjectHandle, offset: u64, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let old_size_bytes = handle.size_bytes();
        if let Err(e) = handle.object.write_at(offset, data) {
            // Part of it may have landed (ENOSPC, EIO, end of a device):
            // drop every record of the object rather than serve old bytes.
            self.invalidate_object(handle);
            return Err(e);
        }
        let recordsize = u64::from(handle.dataset.config.recordsize_bytes);
        let first = offset.min(old_size_bytes) / recordsize;
        let last = (offset + data.len() as u64 - 1) / recordsize;
        for record in first..=last {
            self.arc.invalidate(RecordKey {
                dataset: handle.dataset_id.0,
                object: handle.state.id,
                record,
            });
        }
        let info = handle.object.info()?;
        self.adopt(handle, info, false);
        self.counters.writes.add(1);
        self.counters.write_bytes.add(data.len() as u64);
        Ok(())
    }

    /// Makes written data durable on primary storage.
    pub fn sync(&self, handle: &ObjectHandle) -> io::Result<()> {
        handle.object.sync()
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            arc: self.arc.stats(),
            arc_max: self.arc.config().arc_max_bytes,
            reads: c.reads.get(),
            read_bytes: c.read_bytes.get(),
            writes: c.writes.get(),
            write_bytes: c.write_bytes.get(),
            primary_reads: c.primary_reads.get(),
            primary_read_bytes: c.primary_read_bytes.get(),
            primary_errors: c.primary_errors.get(),
        }
    }

    /// Checks the ARC's invariants (tests; O(entries)).
    pub fn assert_consistent(&self) {
        self.arc.assert_consistent();
    }
}
