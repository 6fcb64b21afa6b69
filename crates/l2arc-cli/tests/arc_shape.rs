//! The ARC's shape across restarts of a real `l2arc serve-nbd` with a real
//! NBD client (issue 33): saved at a clean stop and prewarmed at start,
//! checkpointed while running so that a SIGKILL loses at most the last
//! interval, and a damaged checkpoint rejected with the service starting
//! cold. The checkpoint is at its default place: the cache file's path
//! with `.arc` appended.

use std::path::{Path, PathBuf};
use std::time::Duration;

use l2arc_testkit::nbd::{NbdClient, pattern};
use l2arc_testkit::service::{Running, Service};

const IMAGE_BYTES: usize = 16 << 20;
const READ_BYTES: u32 = 64 << 10;

struct Setup {
    dir: tempfile::TempDir,
    image: PathBuf,
    data: Vec<u8>,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        let data = pattern(IMAGE_BYTES, 5);
        std::fs::write(&image, &data).unwrap();
        Setup { dir, image, data }
    }

    fn cache(&self) -> PathBuf {
        self.dir.path().join("cache.dev")
    }

    fn checkpoint(&self) -> PathBuf {
        self.dir.path().join("cache.dev.arc")
    }

    fn start(&self, extra: &[&str]) -> Running {
        let socket = self.dir.path().join("nbd.sock");
        let _ = std::fs::remove_file(&socket);
        Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), &self.image)
            .listen_unix(&socket)
            .arg("--cache")
            .arg(self.cache())
            .args([
                "--cache-size",
                "64MiB",
                "--arc-max",
                "8MiB",
                // Everything the ARC holds fits one feed: on flash within a
                // second or two of the reads.
                "--l2arc-write-max",
                "64MiB",
                "--l2arc-noprefetch",
                "false",
            ])
            .args(extra)
            .start()
    }

    /// Reads the first `bytes` of the export and checks them.
    fn read(&self, served: &Running, bytes: usize) {
        let mut client = NbdClient::open(served.socket()).unwrap();
        for offset in (0..bytes).step_by(READ_BYTES as usize) {
            let got = client.read(offset as u64, READ_BYTES).unwrap();
            assert!(
                got == self.data[offset..offset + READ_BYTES as usize],
                "bytes at {offset}"
            );
        }
    }
}

/// The prewarm's done line, printed before the ready line or after it
/// (the prewarm runs in the background).
fn done_line(served: &Running) -> String {
    let prefix = "l2arc: prewarm: done:";
    match served.line_before_ready(prefix) {
        Some(line) => line.to_string(),
        None => served
            .next_line(prefix, Duration::from_secs(60))
            .unwrap_or_else(|| panic!("no prewarm done line: {:?}", served.before_ready)),
    }
}

/// `l2arc: prewarm: done: N records ...`: N.
fn done_records(served: &Running) -> u64 {
    let line = done_line(served);
    line.trim_start_matches("l2arc: prewarm: done: ")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("{line}"))
}

#[test]
fn a_clean_stop_saves_the_shape_and_a_restart_prewarms_it() {
    let setup = Setup::new();
    let mut served = setup.start(&[]);
    assert_eq!(
        served.line_before_ready("l2arc: no ARC checkpoint at"),
        Some(
            format!(
                "l2arc: no ARC checkpoint at {} yet: the ARC starts cold",
                setup.checkpoint().display()
            )
            .as_str()
        ),
        "{:?}",
        served.before_ready
    );
    // 12 MiB through an 8 MiB ARC, then time for the feeder to write it.
    setup.read(&served, 12 << 20);
    std::thread::sleep(Duration::from_secs(3));
    let (status, rest) = served.stop();
    assert!(status.success());
    let saved = rest
        .iter()
        .find(|l| l.starts_with("l2arc: stopping: saved the ARC's shape ("))
        .unwrap_or_else(|| panic!("no save line: {rest:?}"));
    assert!(
        saved.ends_with(&format!("to {}", setup.checkpoint().display())),
        "{saved}"
    );
    let saved_records: u64 = saved
        .trim_start_matches("l2arc: stopping: saved the ARC's shape (")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(saved_records >= 100, "{saved}");

    let served = setup.start(&[]);
    let line = served
        .line_before_ready("l2arc: prewarm: ")
        .unwrap_or_else(|| panic!("{:?}", served.before_ready));
    assert!(
        line.starts_with(&format!("l2arc: prewarm: {saved_records} records (")),
        "{line}"
    );
    let prewarmed = done_records(&served);
    assert!(
        prewarmed * 10 >= saved_records * 9,
        "{prewarmed} of {saved_records} records prewarmed"
    );
    // The data is right, whatever came from where.
    setup.read(&served, IMAGE_BYTES);
}

#[test]
fn after_a_sigkill_the_last_checkpoint_is_used() {
    let setup = Setup::new();
    let mut served = setup.start(&["--l2arc-arc-checkpoint-secs", "1"]);
    setup.read(&served, 8 << 20);
    // The feeder writes, and a checkpoint follows within a second.
    std::thread::sleep(Duration::from_secs(4));
    served.child.kill().unwrap(); // SIGKILL: no stop line, no save at stop
    served.child.wait().unwrap();
    assert!(
        setup.checkpoint().exists(),
        "a checkpoint was written while running"
    );

    let served = setup.start(&[]);
    let line = served
        .line_before_ready("l2arc: prewarm: ")
        .unwrap_or_else(|| panic!("{:?}", served.before_ready));
    assert!(line.contains(" s ago"), "{line}");
    assert!(
        done_records(&served) > 0,
        "the checkpoint's records were prewarmed"
    );
    setup.read(&served, IMAGE_BYTES);
}

#[test]
fn a_damaged_checkpoint_is_rejected_and_the_service_starts_cold() {
    let setup = Setup::new();
    let mut served = setup.start(&[]);
    setup.read(&served, 4 << 20);
    std::thread::sleep(Duration::from_secs(2));
    assert!(served.stop().0.success());
    let mut bytes = std::fs::read(setup.checkpoint()).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 0xff;
    std::fs::write(setup.checkpoint(), &bytes).unwrap();

    let mut served = setup.start(&["--http", "127.0.0.1:0"]);
    let line = served
        .line_before_ready("l2arc: ARC checkpoint ")
        .unwrap_or_else(|| panic!("{:?}", served.before_ready));
    assert!(line.contains("rejected: checksum mismatch"), "{line}");
    assert!(line.ends_with("the ARC starts cold"), "{line}");
    assert!(served.line_before_ready("l2arc: prewarm:").is_none());
    let addr = served.http().unwrap();
    let (status, metrics) = l2arc_testkit::http_get(addr, "/metrics");
    assert_eq!(status, 200);
    let samples = l2arc_testkit::prometheus_samples(&metrics);
    assert_eq!(
        samples.get("l2arc_arcstats_arc_checkpoint_rejected_checksum_total"),
        Some(&1.0),
        "{metrics}"
    );
    setup.read(&served, IMAGE_BYTES);
    // A clean stop writes a good one again.
    let (status, rest) = served.stop();
    assert!(status.success());
    assert!(
        rest.iter()
            .any(|l| l.starts_with("l2arc: stopping: saved the ARC's shape (")),
        "{rest:?}"
    );
}

/// Through a directory mount: a file rewritten while the service was
/// stopped, same size, its mtime put back (`touch -d`), is not prewarmed
/// (its ctime moved) and its new bytes are read; the other file is.
#[test]
fn a_file_rewritten_while_stopped_is_not_prewarmed_through_the_mount() {
    let dir = tempfile::tempdir().unwrap();
    let (src, mnt) = (dir.path().join("src"), dir.path().join("mnt"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(src.join("kept"), pattern(4 << 20, 1)).unwrap();
    std::fs::write(src.join("rewritten"), pattern(4 << 20, 2)).unwrap();
    let cache = dir.path().join("cache.dev");
    let mount = || {
        Service::mount(Path::new(env!("CARGO_BIN_EXE_l2arc")), &src, &mnt)
            .arg("--cache")
            .arg(&cache)
            .args([
                "--cache-size",
                "64MiB",
                "--arc-max",
                "32MiB",
                "--l2arc-write-max",
                "64MiB",
            ])
            .start()
    };
    let mut served = mount();
    for name in ["kept", "rewritten"] {
        assert_eq!(
            std::fs::read(mnt.join(name)).unwrap(),
            std::fs::read(src.join(name)).unwrap()
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    assert!(served.stop().0.success());
    drop(served);

    let mtime = std::fs::metadata(src.join("rewritten"))
        .unwrap()
        .modified()
        .unwrap();
    let new = pattern(4 << 20, 3);
    std::fs::write(src.join("rewritten"), &new).unwrap();
    std::fs::File::options()
        .write(true)
        .open(src.join("rewritten"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();

    let served = mount();
    let line = done_line(&served);
    // 4 MiB of 128 KiB records each.
    assert!(line.contains(" 32 stale,"), "{line}");
    assert!(
        line.starts_with("l2arc: prewarm: done: 32 records"),
        "{line}"
    );
    assert_eq!(std::fs::read(mnt.join("rewritten")).unwrap(), new);
    assert_eq!(
        std::fs::read(mnt.join("kept")).unwrap(),
        pattern(4 << 20, 1)
    );
}
