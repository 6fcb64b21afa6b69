//! Whether the store answers: outages, and the probe that ends them.
//!
//! Why. A read's tries are bounded by its deadline, but a reader is rarely
//! alone in asking: the kernel reads a page again at once when its
//! read-ahead of it failed (so one `read(2)` was two FUSE reads, each with
//! its own full sequence of tries: 12 s where 6 were promised), a FUSE
//! getattr revalidates and then stats (two sequences), and every other
//! reader of the bucket starts its own. Against a store that does not
//! answer, each of them would wait out a whole deadline in turn. So the
//! store's state is shared: when a sequence of tries ends without a single
//! answer (every try timed out or lost its connection), the store is in an
//! outage, and every request made while it lasts fails at once with what
//! the last sequence saw (EIO to a reader; cached data instead under
//! `stale_if_error`). One read thus makes at most one sequence, and the
//! sequences of readers that came together end together.
//!
//! An outage ends at the first answer of any kind (a 404 or a 403 is an
//! answer: the store is there). Readers do not look for it: a probe does,
//! one request at a time in the background (a LIST of one key, or a HEAD
//! of the one key of an NBD export), every `PROBE_INTERVAL_MS` (the cap of
//! a request's backoff: the store is tried no more often than one request
//! tries it). A probe nobody waits for stops: when no request was refused
//! for a read deadline, the outage is forgotten, and the next request
//! tries the store as if nothing had happened (one sequence, again bounded
//! by its deadline). An idle mount with a store down thus sends nothing.
//!
//! What is not an outage: a store that answers, however badly (503
//! SlowDown, 500, 403). Throttling is retried by each request's own tries;
//! refusing everyone at once because one request was throttled would turn
//! a slow store into a dead one.

use crate::lock_order::{RankedMutex, rank};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the probe asks a store in an outage (the longest wait
/// between two tries of one request, `BACKOFF_MAX_MS`).
pub(super) const PROBE_INTERVAL_MS: u64 = super::BACKOFF_MAX_MS;

/// An outage: since when, and what the sequence that began it saw.
struct Outage {
    since: Instant,
    kind: io::ErrorKind,
    /// The failed sequence's detail ("no answer within 6.1 s ...").
    detail: String,
    /// When a request was last refused (the probe stops when nobody asks).
    last_refused: Instant,
    /// A probe task is running for it.
    probing: bool,
}

/// The store's state, shared by every request of one back end.
pub(super) struct Health {
    outage: RankedMutex<Option<Outage>, { rank::PRIMARY }>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            outage: RankedMutex::new(None),
        }
    }
}

/// What the probe asks the store.
#[derive(Clone)]
pub(super) enum Probe {
    /// A LIST of at most one key at the root.
    List,
    /// A HEAD of this key.
    Stat(String),
}

/// What a probe needs, cloned out of the back end (never the back end
/// itself: a task on its runtime must not be what drops that runtime).
pub(super) struct ProbeContext {
    pub(super) op: opendal::Operator,
    pub(super) probe: Probe,
    pub(super) request_timeout: Duration,
    pub(super) read_deadline: Duration,
    /// Requests the probe sent (counted with the back end's LISTs or HEADs).
    pub(super) sent: Arc<std::sync::atomic::AtomicU64>,
}

impl Health {
    /// The error to fail a request with at once, if the store is in an
    /// outage: its kind and a detail naming what was last seen.
    pub(super) fn refusal(&self) -> Option<(io::ErrorKind, String)> {
        let mut outage = self.outage.lock().expect("health poisoned");
        let o = outage.as_mut()?;
        o.last_refused = Instant::now();
        Some((
            o.kind,
            format!(
                "the store has not answered for {:.1} s ({}); not asked again until it answers a probe",
                o.since.elapsed().as_secs_f64(),
                o.detail
            ),
        ))
    }

    /// The store answered something: an outage, if any, is over.
    pub(super) fn answered(&self) {
        let mut outage = self.outage.lock().expect("health poisoned");
        if outage.is_some() {
            *outage = None;
        }
    }

    /// A sequence of tries ended without any answer: the store is in an
    /// outage (a new one, or the one already on). Returns true when a
    /// probe must be started for it.
    pub(super) fn no_answer(&self, kind: io::ErrorKind, detail: &str) -> bool {
        let mut outage = self.outage.lock().expect("health poisoned");
        let now = Instant::now();
        match outage.as_mut() {
            Some(o) => {
                o.detail = detail.to_string();
                o.last_refused = now;
                !std::mem::replace(&mut o.probing, true)
            }
            None => {
                *outage = Some(Outage {
                    since: now,
                    kind,
                    detail: detail.to_string(),
                    last_refused: now,
                    probing: true,
                });
                true
            }
        }
    }

    /// Whether the outage is still on and wanted: false ends the probe
    /// (the outage over, or forgotten because nobody asked for a read
    /// deadline).
    fn probe_wanted(&self, read_deadline: Duration) -> bool {
        let mut outage = self.outage.lock().expect("health poisoned");
        match outage.as_mut() {
            None => false,
            Some(o) if o.last_refused.elapsed() >= read_deadline => {
                *outage = None;
                false
            }
            Some(_) => true,
        }
    }

    /// Whether an outage is on (tests, stats).
    pub(super) fn in_outage(&self) -> bool {
        self.outage.lock().expect("health poisoned").is_some()
    }
}

/// The probe of one outage: asks the store every `PROBE_INTERVAL_MS` until
/// it answers or nobody waits (see the module comment).
pub(super) async fn probe(health: Arc<Health>, ctx: ProbeContext) {
    use std::sync::atomic::Ordering;
    loop {
        tokio::time::sleep(Duration::from_millis(PROBE_INTERVAL_MS)).await;
        if !health.probe_wanted(ctx.read_deadline) {
            return;
        }
        ctx.sent.fetch_add(1, Ordering::Relaxed);
        let asked = async {
            match &ctx.probe {
                Probe::List => ctx.op.list_with("/").limit(1).await.map(|_| ()),
                Probe::Stat(key) => ctx.op.stat(key).await.map(|_| ()),
            }
        };
        let answered = match tokio::time::timeout(ctx.request_timeout, asked).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => super::failure::failure_of(&e).answered,
            Err(_) => false,
        };
        if answered {
            health.answered();
            return;
        }
    }
}
