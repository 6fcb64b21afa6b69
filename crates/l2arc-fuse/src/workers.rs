//! The mounts' background threads, each behind a bounded queue.
//!
//! Both file systems hand work that must not hold up a request to threads
//! of their own: read-ahead (a pool: several reads below in flight), and
//! the kernel notifications (one thread each: the kernel may need a
//! request thread to finish before it can act on one). Every queue is
//! bounded and its senders `try_send`: what does not fit is a hint lost,
//! never a request kept waiting. A thread ends when the file system, which
//! holds the sender, is dropped.

use std::io;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Mutex};

/// `threads` threads named `{name}-{i}` taking jobs from one queue of
/// `queue_len`, each job given to `work`.
pub(crate) fn spawn_pool<J: Send + 'static>(
    name: &str,
    threads: usize,
    queue_len: usize,
    work: impl Fn(J) + Send + Sync + 'static,
) -> io::Result<SyncSender<J>> {
    assert!(threads > 0 && queue_len > 0);
    let (tx, rx) = sync_channel::<J>(queue_len);
    let rx = Arc::new(Mutex::new(rx));
    let work = Arc::new(work);
    for i in 0..threads {
        let rx = Arc::clone(&rx);
        let work = Arc::clone(&work);
        std::thread::Builder::new()
            .name(format!("{name}-{i}"))
            .spawn(move || {
                loop {
                    // The lock is held only while waiting for a job.
                    let job = rx.lock().expect("work queue poisoned").recv();
                    let Ok(job) = job else {
                        return; // the file system is gone
                    };
                    work(job);
                }
            })?;
    }
    Ok(tx)
}

/// One thread named `name` doing `work` on each job of a queue of
/// `queue_len`, in order.
pub(crate) fn spawn_worker<J: Send + 'static>(
    name: &str,
    queue_len: usize,
    mut work: impl FnMut(J) + Send + 'static,
) -> io::Result<SyncSender<J>> {
    assert!(queue_len > 0);
    let (tx, rx) = sync_channel::<J>(queue_len);
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            while let Ok(job) = rx.recv() {
                work(job);
            }
        })?;
    Ok(tx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn pools_and_workers_do_every_job_sent_and_refuse_past_the_bound() {
        let done = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&done);
        let pool = spawn_pool("t-pool", 3, 8, move |n: usize| {
            counted.fetch_add(n, Ordering::SeqCst);
        })
        .unwrap();
        for _ in 0..100 {
            pool.send(1).unwrap();
        }
        let (tx, rx) = sync_channel(3);
        let (taken_tx, taken) = sync_channel(3);
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock().unwrap();
        let worker_gate = Arc::clone(&gate);
        let worker = spawn_worker("t-worker", 2, move |n: usize| {
            taken_tx.send(()).unwrap();
            drop(worker_gate.lock().unwrap());
            tx.send(n).unwrap();
        })
        .unwrap();
        // One job taken and blocked, two queued: the fourth does not fit.
        worker.send(1).unwrap();
        taken.recv().unwrap();
        worker.try_send(2).unwrap();
        worker.try_send(3).unwrap();
        assert!(worker.try_send(4).is_err(), "the queue is bounded");
        drop(held);
        let got: Vec<usize> = (0..3).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(got, [1, 2, 3], "in order");
        drop(pool);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while done.load(Ordering::SeqCst) < 100 {
            assert!(std::time::Instant::now() < deadline, "pool jobs lost");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
