//! Datasets, objects and their generations: what makes a cached record
//! still the object's bytes.
//!
//! Every object the cache has opened has a shared state with its last known
//! generation (inode, size, mtime, version) and a token derived from it;
//! records carry the token they were read under, and a hit requires the
//! current one. `open` and `revalidate` compare the primary's generation
//! with the remembered one, so a file rewritten or replaced behind the
//! cache changes the token and every older record turns into a miss at
//! once, with no scan. The table of states is bounded
//! (`OBJECT_STATES_MAX`); see `Cache::object_state` for what a drop costs.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::{Arc, OnceLock};

use super::Cache;
use super::config::*;
use crate::arc::live::RecordKey;
use crate::hash::hash_one;
use crate::lock_order::{RankedMutex, rank};
use crate::primary::{Generation, ObjectInfo, Primary, PrimaryObject};

/// Identifies a dataset within one [`Cache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DatasetId(pub(crate) u32);

pub(crate) struct Dataset {
    pub(super) name: String,
    /// Stable identity across restarts (name and primary), so that L2ARC
    /// records survive a restart and can never be matched to another store.
    pub(crate) uid: u64,
    pub(super) primary: Arc<dyn Primary>,
    /// Some: sequential readers are read ahead in spans of this many bytes
    /// (whole records; `Primary::read_ahead_span_bytes`, `zstream`).
    pub(super) span_window_bytes: Option<u64>,
    pub(crate) config: DatasetConfig,
    /// The properties that may change while running (see `properties`).
    pub(crate) props: crate::cache::properties::LiveProperties,
}

/// What the cache remembers of an object, shared by all its handles.
pub(super) struct ObjectState {
    pub(super) id: u64,
    /// Records must carry this token to be hits.
    pub(super) token: AtomicU64,
    pub(super) size_bytes: AtomicU64,
    /// Last generation seen, and a count of explicit invalidations.
    pub(super) generation: RankedMutex<GenerationState, { rank::OBJECT_GENERATION }>,
    /// Writes and hole punches through the cache between their change to
    /// primary storage and their adoption of the new generation: while
    /// any is, a generation that moved may be ours, and `revalidate` does
    /// not take it for an outside change.
    pub(super) writes_in_flight: AtomicU64,
    /// Its sequential streams (`zstream`), made on the first read through
    /// a dataset that reads ahead in spans.
    pub(super) streams: OnceLock<Box<crate::cache::zstream::Streams>>,
    /// The name the object was last opened or named by, relative to its
    /// dataset: what a saved ARC shape reopens it by (`prewarm`).
    pub(super) name: RankedMutex<Option<Arc<str>>, { rank::LEAF }>,
}

/// Counts a write through the cache in `ObjectState::writes_in_flight`
/// for as long as it lives.
pub(super) struct WriteInFlight<'a>(&'a ObjectState);

impl<'a> WriteInFlight<'a> {
    pub(super) fn new(state: &'a ObjectState) -> Self {
        let before = state.writes_in_flight.fetch_add(1, Ordering::AcqRel);
        // One per writing thread: nowhere near wrapping.
        debug_assert!(before < u64::from(u32::MAX), "writes in flight leak");
        Self(state)
    }
}

impl Drop for WriteInFlight<'_> {
    fn drop(&mut self) {
        let before = self.0.writes_in_flight.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "a write left that never came in");
    }
}

/// What `ObjectState::generation` guards.
pub(super) struct GenerationState {
    /// The generation last seen (our own writes adopt theirs here without
    /// a new token).
    pub(super) current: Generation,
    /// Explicit invalidations so far.
    pub(super) epoch: u64,
    /// The generation the current token was derived from: the version a
    /// conditional primary read must ask for (`Primary::read_at_generation`).
    pub(super) of_token: Generation,
}

impl ObjectState {
    /// Notes the name the object goes by now (unchanged: no allocation).
    pub(super) fn set_name(&self, name: &str) {
        let mut slot = self.name.lock().expect("object name poisoned");
        if slot.as_deref() != Some(name) {
            *slot = Some(Arc::from(name));
        }
        debug_assert_eq!(slot.as_deref(), Some(name));
    }

    /// The name the object was last opened or named by.
    pub(super) fn name(&self) -> Option<Arc<str>> {
        let name = self.name.lock().expect("object name poisoned").clone();
        debug_assert!(name.as_ref().is_none_or(|n| n.len() < usize::MAX));
        name
    }

    /// The generation that `token` stands for, if it is still the object's
    /// token (`None`: the token moved on since the caller loaded it).
    pub(super) fn generation_of(&self, token: u64) -> Option<Generation> {
        let generation = self.generation.lock().expect("object state poisoned");
        let current = self.token.load(Ordering::Acquire);
        // Under the lock the token always stands for `of_token` at `epoch`.
        debug_assert_eq!(
            current,
            generation_token(&generation.of_token, generation.epoch)
        );
        (current == token).then_some(generation.of_token)
    }
}

pub(super) fn generation_token(generation: &Generation, epoch: u64) -> u64 {
    let file_token = || {
        hash_one(&(
            generation.ino,
            generation.size_bytes,
            generation.mtime_ns,
            generation.ctime_ns,
            epoch,
        ))
    };
    if generation.version_hash == 0 {
        // Files: the token as it was before objects had versions, so that
        // persistent caches written then keep matching.
        return file_token();
    }
    let token = hash_one(&(
        generation.ino,
        generation.size_bytes,
        generation.mtime_ns,
        generation.ctime_ns,
        generation.version_hash,
        epoch,
    ));
    // A versioned object's token is never a file's of the same stat (the
    // version is in it; 64-bit hashes, a collision is not expected).
    debug_assert_ne!(token, file_token());
    token
}

/// How many times a read re-stats and tries again when the object changed
/// under a conditional primary read (412): each try follows a fresh stat,
/// so only an object rewritten faster than we can read one record loses.
pub(super) const STALE_RETRIES_MAX: u32 = 4;

pub(super) fn is_stale(e: &io::Error) -> bool {
    let stale = e.kind() == io::ErrorKind::StaleNetworkFileHandle;
    // A stale read is retried, and a retry must be able to end.
    debug_assert!(!stale || STALE_RETRIES_MAX > 0);
    stale
}

/// An open object, ready for reads and writes through the cache. Clones
/// share the object.
#[derive(Clone)]
pub struct ObjectHandle {
    pub(super) dataset_id: DatasetId,
    pub(super) dataset: Arc<Dataset>,
    pub(super) object: Arc<dyn PrimaryObject>,
    pub(super) state: Arc<ObjectState>,
    /// The caller reads ahead itself: its reads feed no stream.
    pub(super) reads_ahead_itself: bool,
}

impl ObjectHandle {
    /// The handle of a caller that reads ahead itself (a front end with a
    /// window of its own, as the object mount's): its reads feed none of
    /// the engine's sequential streams (`zstream`), so that two read-aheads
    /// do not race for the same records.
    #[must_use]
    pub fn reads_ahead_itself(mut self) -> Self {
        self.reads_ahead_itself = true;
        debug_assert!(self.span_window_bytes().is_none(), "feeds no stream");
        self
    }

    /// The span a sequential reader of this object is read ahead in, if
    /// its dataset reads ahead in spans and this handle lets it.
    pub(crate) fn span_window_bytes(&self) -> Option<u64> {
        let window = self
            .dataset
            .span_window_bytes
            .filter(|_| !self.reads_ahead_itself);
        // Whole records, at least one, at most a span (`add_dataset`).
        debug_assert!(window.is_none_or(|w| {
            let recordsize = u64::from(self.dataset.config.recordsize_bytes);
            w >= recordsize
                && w.is_multiple_of(recordsize)
                && w <= crate::PREFETCH_SPAN_BYTES_MAX.max(recordsize)
        }));
        window
    }

    /// The object's sequential streams.
    pub(crate) fn streams(&self) -> &crate::cache::zstream::Streams {
        let streams = self.state.streams.get_or_init(Box::default);
        debug_assert!(self.state.streams.get().is_some(), "made once, kept");
        streams
    }

    /// The object's size as last seen (at open, revalidate or our own write).
    pub fn size_bytes(&self) -> u64 {
        let size_bytes = self.state.size_bytes.load(Ordering::Acquire);
        // Records split the object by a power of two (`offset / recordsize`).
        debug_assert!(self.dataset.config.recordsize_bytes.is_power_of_two());
        size_bytes
    }

    /// The object's identity within its dataset.
    pub fn object_id(&self) -> u64 {
        // Its state counts our writes in their window, one per thread.
        debug_assert!(self.state.writes_in_flight.load(Ordering::Relaxed) < u64::from(u32::MAX));
        self.state.id
    }

    /// The dataset the object belongs to.
    pub fn dataset(&self) -> DatasetId {
        debug_assert!(self.dataset.config.validate().is_ok(), "added, so checked");
        self.dataset_id
    }

    /// The dataset's recordsize when the object was opened.
    pub fn recordsize_bytes(&self) -> u32 {
        let recordsize = self.dataset.config.recordsize_bytes;
        debug_assert!(
            recordsize.is_power_of_two()
                && (RECORDSIZE_MIN_BYTES..=RECORDSIZE_MAX_BYTES).contains(&recordsize)
        );
        recordsize
    }

    /// The object's generation token now: it changes exactly when the
    /// cache stops trusting what it holds of the object (a change behind
    /// it, an invalidation), so a front end can tell when pages it handed
    /// out belong to an older version.
    pub fn generation_token(&self) -> u64 {
        #[cfg(debug_assertions)]
        {
            // Every store of the token is under the generation lock, and
            // derives it from `of_token` at `epoch`.
            let generation = self.state.generation.lock().expect("object state poisoned");
            debug_assert_eq!(
                self.token(),
                generation_token(&generation.of_token, generation.epoch)
            );
        }
        self.token()
    }

    /// The object's current generation token (records must carry it).
    pub(crate) fn token(&self) -> u64 {
        // Only writes and holes of ours hold it up, one per thread.
        debug_assert!(self.state.writes_in_flight.load(Ordering::Relaxed) < u64::from(u32::MAX));
        self.state.token.load(Ordering::Acquire)
    }

    /// The ARC key of the object's `index`-th record.
    pub(crate) fn record_key(&self, index: u64) -> RecordKey {
        // The record's offset does not overflow.
        debug_assert!(
            index
                .checked_mul(u64::from(self.dataset.config.recordsize_bytes))
                .is_some()
        );
        RecordKey {
            dataset: self.dataset_id.0,
            object: self.state.id,
            record: index,
        }
    }

    pub(crate) fn caches_in_arc(&self) -> bool {
        // Every dataset's configuration passed its checks (`add_dataset`).
        debug_assert!(self.dataset.config.validate().is_ok());
        self.dataset.props.primarycache() == CacheMode::All
    }

    /// Whether the dataset caches nothing of its data (`primarycache=none`):
    /// read-ahead would only read for nothing.
    pub(crate) fn caches_nothing(&self) -> bool {
        debug_assert!(self.dataset.config.validate().is_ok());
        self.dataset.props.primarycache() == CacheMode::None
    }
}

/// Object states kept beyond those open handles hold: each is ~100 bytes,
/// so the table stays under ~30 MiB however many objects pass through.
pub const OBJECT_STATES_MAX: usize = 1 << 18;

impl Cache {
    /// The datasets, in the order they were added, with their names and properties.
    pub fn dataset_list(&self) -> Vec<(DatasetId, String, DatasetConfig)> {
        let datasets = self.datasets.read().expect("dataset lock poisoned");
        let list: Vec<_> = (0u32..)
            .zip(datasets.iter())
            .map(|(i, d)| (DatasetId(i), d.name.clone(), d.props.current(&d.config)))
            .collect();
        assert_eq!(list.len(), datasets.len());
        list
    }

    /// Sets `primarycache`, `secondarycache` or `compression` of the
    /// dataset `name` while running (see `properties`).
    pub fn set_dataset_property(
        &self,
        name: &str,
        property: &str,
        value: &str,
    ) -> Result<(), crate::cache::properties::PropertyError> {
        let datasets = self.datasets.read().expect("dataset lock poisoned");
        let dataset = datasets
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| crate::cache::properties::PropertyError::NoDataset(name.to_string()))?;
        let recordsize = dataset.props.current(&dataset.config).recordsize_bytes;
        let set = dataset.props.set(property, value);
        // Only the live properties change: never the recordsize.
        debug_assert_eq!(
            dataset.props.current(&dataset.config).recordsize_bytes,
            recordsize
        );
        set
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
        let uid = hash_one(&(name, primary.describe()));
        let recordsize = u64::from(config.recordsize_bytes);
        let span_window_bytes = primary.read_ahead_span_bytes().map(|bytes| {
            (bytes.min(crate::PREFETCH_SPAN_BYTES_MAX) / recordsize).max(1) * recordsize
        });
        datasets.push(Arc::new(Dataset {
            name: name.to_string(),
            uid,
            primary,
            span_window_bytes,
            props: crate::cache::properties::LiveProperties::new(&config),
            config,
        }));
        // Ids are slots in the list, which only grows.
        assert_eq!(datasets.len(), id.0 as usize + 1);
        Ok(id)
    }

    pub(super) fn dataset(&self, id: DatasetId) -> io::Result<Arc<Dataset>> {
        let datasets = self.datasets.read().expect("dataset lock poisoned");
        let dataset = datasets
            .get(id.0 as usize)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such dataset"))?;
        debug_assert!(dataset.config.validate().is_ok());
        Ok(dataset)
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
        let handle = self.open_object(dataset_id, dataset, object)?;
        debug_assert_eq!(handle.dataset_id, dataset_id);
        handle.state.set_name(name);
        self.analytics
            .name_object(dataset_id.0, handle.state.id, name);
        Ok(handle)
    }

    /// Opens an object from a file the caller already opened in the
    /// dataset's tree (`Primary::open_file`), and revalidates what the cache
    /// knows of it. Hard links share one object: the identity is the inode.
    pub fn open_file(
        &self,
        dataset_id: DatasetId,
        file: std::fs::File,
        writable: bool,
    ) -> io::Result<ObjectHandle> {
        let dataset = self.dataset(dataset_id)?;
        let object = dataset.primary.open_file(file, writable)?;
        let handle = self.open_object(dataset_id, dataset, object)?;
        debug_assert_eq!(handle.dataset_id, dataset_id);
        Ok(handle)
    }

    /// Names an object for the analytics' drill-down: for front ends that
    /// open by descriptor ([`Cache::open_file`]) and know a path.
    pub fn name_object(&self, handle: &ObjectHandle, name: &str) {
        debug_assert!(
            handle.dataset.config.validate().is_ok(),
            "added, so checked"
        );
        handle.state.set_name(name);
        self.analytics
            .name_object(handle.dataset_id.0, handle.state.id, name);
    }

    pub(super) fn open_object(
        &self,
        dataset_id: DatasetId,
        dataset: Arc<Dataset>,
        object: Arc<dyn PrimaryObject>,
    ) -> io::Result<ObjectHandle> {
        let info = object.info()?;
        let state = self.object_state(dataset_id, &info);
        assert_eq!(state.id, info.id, "the state of this object");
        let handle = ObjectHandle {
            dataset_id,
            dataset,
            object,
            state,
            reads_ahead_itself: false,
        };
        self.adopt(&handle, info, true);
        Ok(handle)
    }

    /// The shared state of an object, made on its first open.
    ///
    /// The table is bounded: past `OBJECT_STATES_MAX` the states no handle
    /// holds are dropped. A dropped state's invalidation epoch is lost, so
    /// from the first drop on, new states start at an epoch never used
    /// before (not 0): a record cached under an epoch that an invalidation
    /// retired can never match again. The price is that objects first
    /// opened after a drop miss their records from before it (and from
    /// before a restart) once.
    pub(super) fn object_state(
        &self,
        dataset_id: DatasetId,
        info: &ObjectInfo,
    ) -> Arc<ObjectState> {
        let mut objects = self.objects.lock().expect("object table poisoned");
        if let Some(state) = objects.get(&(dataset_id.0, info.id)) {
            return Arc::clone(state);
        }
        if objects.len() >= OBJECT_STATES_MAX {
            objects.retain(|_, state| Arc::strong_count(state) > 1);
            self.object_states_dropped.store(true, Ordering::Relaxed);
        }
        let epoch = if self.object_states_dropped.load(Ordering::Relaxed) {
            // Each new state gets 2^32 epochs of its own for its invalidations.
            self.next_epoch.fetch_add(1, Ordering::Relaxed) << 32
        } else {
            0
        };
        let state = Arc::new(ObjectState {
            id: info.id,
            token: AtomicU64::new(generation_token(&info.generation, epoch)),
            size_bytes: AtomicU64::new(info.size_bytes()),
            generation: RankedMutex::new(GenerationState {
                current: info.generation,
                epoch,
                of_token: info.generation,
            }),
            writes_in_flight: AtomicU64::new(0),
            streams: OnceLock::new(),
            name: RankedMutex::new(None),
        });
        objects.insert((dataset_id.0, info.id), Arc::clone(&state));
        // Past the bound only once unheld states were dropped (a table of
        // held states, and the one just made).
        debug_assert!(
            objects.len() <= OBJECT_STATES_MAX
                || self.object_states_dropped.load(Ordering::Relaxed)
        );
        state
    }

    /// Objects whose state the cache holds (bounded by `OBJECT_STATES_MAX`
    /// plus those open handles hold).
    #[cfg(any(test, feature = "test-utils"))]
    pub fn object_states(&self) -> usize {
        let objects = self.objects.lock().expect("object table poisoned");
        // Past the bound only after a drop of unheld states.
        debug_assert!(
            objects.len() <= OBJECT_STATES_MAX
                || self.object_states_dropped.load(Ordering::Relaxed)
        );
        objects.len()
    }

    /// Re-reads the object's generation; if it changed behind the cache,
    /// every record cached for it becomes a miss. While a write through the
    /// cache is between primary storage and its own re-stat, a moved
    /// generation may be that write's, so it is left for the write to
    /// adopt (the window in the module comment, as wide as the writes): a
    /// watcher that calls this on every change event never drops the whole
    /// object for the cache's own writes.
    pub fn revalidate(&self, handle: &ObjectHandle) -> io::Result<ObjectInfo> {
        let info = handle.object.info()?;
        let in_flight = handle.state.writes_in_flight.load(Ordering::Acquire);
        // Writes in their window, one per writing thread.
        debug_assert!(in_flight < u64::from(u32::MAX));
        if in_flight == 0 {
            self.adopt(handle, info, true);
        }
        Ok(info)
    }

    /// Records `info` as the object's generation. `outside_change` says a
    /// difference means someone else changed the object (new token).
    pub(super) fn adopt(&self, handle: &ObjectHandle, info: ObjectInfo, outside_change: bool) {
        let state = &handle.state;
        let mut generation = state.generation.lock().expect("object state poisoned");
        let (token_before, of_token_before) =
            (state.token.load(Ordering::Acquire), generation.of_token);
        if generation.current != info.generation {
            generation.current = info.generation;
            if outside_change {
                generation.of_token = info.generation;
                state.token.store(
                    generation_token(&generation.current, generation.epoch),
                    Ordering::Release,
                );
            }
        }
        state.size_bytes.store(info.size_bytes(), Ordering::Release);
        // The token moved exactly when an outside change was adopted, to
        // the one of the generation it stands for; our own writes adopt
        // their generation without a new token.
        let token_now = state.token.load(Ordering::Acquire);
        if generation.of_token == of_token_before {
            debug_assert_eq!(token_now, token_before);
        } else {
            debug_assert!(outside_change);
            debug_assert_eq!(
                token_now,
                generation_token(&generation.of_token, generation.epoch)
            );
        }
        // Under the lock, the size is the generation's.
        assert_eq!(
            state.size_bytes.load(Ordering::Relaxed),
            generation.current.size_bytes
        );
    }

    /// Drops every cached record of the object (O(1): a new token).
    pub fn invalidate_object(&self, handle: &ObjectHandle) {
        let state = &handle.state;
        let mut generation = state.generation.lock().expect("object state poisoned");
        let before = state.token.load(Ordering::Acquire);
        generation.epoch += 1;
        // An object state owns 2^32 epochs (`object_state`): never one of
        // the next state's.
        debug_assert_ne!(generation.epoch & u64::from(u32::MAX), 0);
        generation.of_token = generation.current;
        state.token.store(
            generation_token(&generation.current, generation.epoch),
            Ordering::Release,
        );
        // A new epoch is a new token (64-bit hashes).
        debug_assert_ne!(state.token.load(Ordering::Acquire), before);
    }
}
