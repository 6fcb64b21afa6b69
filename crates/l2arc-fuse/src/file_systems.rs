//! The two file systems the crate mounts, as its users see them.
//!
//! Each is the one FUSE adapter (`crate::adapter`) over a namespace: a
//! directory tree ([`CachedFs`]) or an object store bucket ([`ObjectFs`]).
//! They are types of their own, not the generic adapter, so that the
//! crate's interface stays what it names (a tree, a bucket, their options)
//! and the namespace trait, which is how the crate is built, stays inside.

use std::io;
use std::sync::Arc;

use l2arc::primary::dir::DirPrimary;
use l2arc::primary::object_store::ObjectStorePrimary;
use l2arc::{Cache, DatasetId};

use crate::adapter::FuseAdapter;
use crate::namespace::bucket::{Bucket, ObjectFsOptions};
use crate::namespace::dir::{DirTree, FsOptions};

/// A directory tree served through the cache.
pub struct CachedFs {
    pub(crate) adapter: FuseAdapter<DirTree>,
}

impl CachedFs {
    /// `dataset` must be a dataset of `cache` whose primary serves the same
    /// tree as `primary` (possibly wrapped, e.g. in an emulated HDD).
    pub fn new(
        cache: Arc<Cache>,
        dataset: DatasetId,
        primary: Arc<DirPrimary>,
        options: FsOptions,
    ) -> io::Result<Self> {
        let tree = DirTree::new(cache, dataset, primary, options)?;
        Ok(Self {
            adapter: FuseAdapter::new(tree),
        })
    }

    /// The options in force: the node and handle bounds as lowered to fit
    /// the descriptors the process may open.
    pub fn options(&self) -> &FsOptions {
        self.adapter.namespace().options()
    }

    /// Nodes in the inode table (tests, statistics).
    pub fn nodes(&self) -> usize {
        self.adapter.namespace().nodes()
    }

    /// Open files and directories (tests).
    pub fn open_handles(&self) -> usize {
        self.adapter.open_handles()
    }

    /// Checks the tables' invariants (tests).
    pub fn assert_consistent(&self) {
        self.adapter.namespace().assert_consistent();
        assert!(self.adapter.open_handles() <= self.options().max_open_handles);
    }
}

/// A bucket (or prefix) served read-only through the cache.
pub struct ObjectFs {
    pub(crate) adapter: FuseAdapter<Bucket>,
}

impl ObjectFs {
    /// `dataset` must be a dataset of `cache` whose primary is `store`.
    pub fn new(
        cache: Arc<Cache>,
        dataset: DatasetId,
        store: Arc<ObjectStorePrimary>,
        options: ObjectFsOptions,
    ) -> io::Result<Self> {
        let bucket = Bucket::new(cache, dataset, store, options)?;
        Ok(Self {
            adapter: FuseAdapter::new(bucket),
        })
    }

    /// Open files and directories (tests).
    pub fn open_handles(&self) -> usize {
        self.adapter.open_handles()
    }
}
