//! A running service's housekeeping thread: what it tells its manager,
//! what it does on SIGHUP, and the error summaries.
//!
//! One thread per service, woken every `TICK`, does the duties that are
//! not the serving itself: it sends `STOPPING=1` as soon as a stop signal
//! arrives, reloads the config file on SIGHUP (`RELOADING=1` ... `READY=1`
//! around it), sends `WATCHDOG=1` every half `WATCHDOG_USEC` while the
//! serving loop shows it is alive (its heartbeat moved lately: a hung
//! accept loop or mount loop stops the keep-alives and systemd restarts
//! the service), and logs the error summaries every 10 s (`events`).
//! SIGHUP is taken over here at start: its default action, to end the
//! process with rc 129 and leave its sockets behind, is never what an
//! operator who sends it (`systemctl reload`) means.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::events::{ErrorSample, SUMMARY_INTERVAL, summarise};
use crate::notify::{Notifier, monotonic_usec};

/// How often the thread looks at its flags (sooner when a keep-alive is due).
const TICK: Duration = Duration::from_millis(250);
/// A heartbeat older than this (or than two watchdog periods) is a hung loop.
const HEARTBEAT_STALE: Duration = Duration::from_secs(2);

/// The service-specific parts of the duties.
pub(crate) struct Duties {
    /// Milliseconds since the serving loop last went round (`heartbeat_ms`).
    pub heartbeat_age_ms: Box<dyn Fn() -> u64 + Send>,
    /// Re-reads the config file and applies it (logs what it did).
    pub reload: Box<dyn FnMut() + Send>,
    /// The error counters now.
    pub errors: Box<dyn Fn() -> ErrorSample + Send>,
}

/// The flags a service's signals raise, registered before it serves.
pub(crate) struct Signals {
    /// SIGINT or SIGTERM arrived.
    pub stop: Arc<AtomicBool>,
    /// SIGHUP arrived and is not yet handled.
    pub hup: Arc<AtomicBool>,
}

impl Signals {
    /// Registers SIGINT and SIGTERM on `stop`, SIGHUP on a flag of its own.
    pub(crate) fn register(stop: Arc<AtomicBool>) -> Result<Self> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        for signal in [SIGINT, SIGTERM] {
            signal_hook::flag::register(signal, Arc::clone(&stop))?;
        }
        let hup = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(SIGHUP, Arc::clone(&hup))?;
        Ok(Self { stop, hup })
    }
}

/// The running housekeeping thread; stops when dropped.
pub(crate) struct Life {
    notifier: Arc<Notifier>,
    stopping_sent: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Life {
    /// Sends `READY=1` with `status`, then starts the thread.
    pub(crate) fn start(signals: &Signals, status: &str, duties: Duties) -> Result<Self> {
        let notifier = Arc::new(Notifier::from_env());
        notifier.send(&format!("READY=1\nSTATUS={status}"));
        let stopping_sent = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let mut state = State {
            notifier: Arc::clone(&notifier),
            stop: Arc::clone(&signals.stop),
            hup: Arc::clone(&signals.hup),
            stopping_sent: Arc::clone(&stopping_sent),
            done: Arc::clone(&done),
            duties,
        };
        let thread = std::thread::Builder::new()
            .name("l2arc-life".into())
            .spawn(move || state.run())?;
        Ok(Self {
            notifier,
            stopping_sent,
            done,
            thread: Some(thread),
        })
    }

    /// Sends `STOPPING=1` unless the thread did already.
    pub(crate) fn stopping(&self) {
        send_stopping(&self.notifier, &self.stopping_sent);
    }
}

impl Drop for Life {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn send_stopping(notifier: &Notifier, sent: &AtomicBool) {
    if !sent.swap(true, Ordering::SeqCst) {
        notifier.send("STOPPING=1");
    }
}

struct State {
    notifier: Arc<Notifier>,
    stop: Arc<AtomicBool>,
    hup: Arc<AtomicBool>,
    stopping_sent: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    duties: Duties,
}

impl State {
    fn run(&mut self) {
        let watchdog = self.notifier.watchdog_interval();
        let stale_ms = watchdog
            .map_or(HEARTBEAT_STALE, |w| (w * 2).max(HEARTBEAT_STALE))
            .as_millis() as u64;
        let mut next_watchdog = Instant::now();
        let mut next_summary = Instant::now() + SUMMARY_INTERVAL;
        let mut errors = (self.duties.errors)();
        while !self.done.load(Ordering::SeqCst) {
            if self.stop.load(Ordering::SeqCst) {
                send_stopping(&self.notifier, &self.stopping_sent);
            } else if self.hup.swap(false, Ordering::SeqCst) {
                self.notifier
                    .send(&format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()));
                (self.duties.reload)();
                self.notifier.send("READY=1");
            }
            let now = Instant::now();
            if let Some(period) = watchdog
                && now >= next_watchdog
                && !self.stopping_sent.load(Ordering::SeqCst)
                && (self.duties.heartbeat_age_ms)() < stale_ms
            {
                self.notifier.send("WATCHDOG=1");
                next_watchdog = now + period;
            }
            if now >= next_summary {
                let sample = (self.duties.errors)();
                for line in summarise(&errors, &sample, SUMMARY_INTERVAL) {
                    l2arc_cli::log_sink::line(log::Level::Error, &line);
                }
                errors = sample;
                next_summary = now + SUMMARY_INTERVAL;
            }
            let until_watchdog = next_watchdog.saturating_duration_since(Instant::now());
            let stopping = self.stopping_sent.load(Ordering::SeqCst);
            let nap = match watchdog {
                // A loop found stale is looked at again in 20 ms, not spun on.
                Some(_) if !stopping => TICK.min(until_watchdog).max(Duration::from_millis(20)),
                _ => TICK,
            };
            std::thread::sleep(nap);
        }
    }
}

/// A heartbeat a serving loop moves each round, and its age.
#[derive(Clone)]
pub(crate) struct Heartbeat {
    started: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Heartbeat {
    pub(crate) fn new() -> Self {
        Self {
            started: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The loop went round.
    pub(crate) fn beat(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Milliseconds since the last beat.
    pub(crate) fn age_ms(&self) -> u64 {
        let now = self.started.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_ms.load(Ordering::Relaxed))
    }
}
