//! `l2arc serve-nbd` with real NBD clients: fio's nbd engine, qemu-io,
//! qemu-img, nbdcopy and nbdinfo. Every tool is required: a missing one
//! fails the test with a pointer to `scripts/setup.sh`, never a skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use l2arc_testkit::nbd::{LoopDevice, pattern};
use l2arc_testkit::service::{Running, Service};

const IMAGE_BYTES: usize = 64 << 20;

fn tool(name: &str) -> Command {
    l2arc_testkit::tool(name, "fio, qemu-utils, libnbd-bin and nbdkit")
}

fn run(cmd: &mut Command) -> Output {
    l2arc_testkit::run(cmd)
}

struct Served {
    dir: tempfile::TempDir,
    image: PathBuf,
    socket: PathBuf,
    service: Running,
}

impl Served {
    fn start(extra: &[&str]) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::write(&image, pattern(IMAGE_BYTES, 1)).unwrap();
        let socket = dir.path().join("nbd.sock");
        let service = Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), &image)
            .listen_unix(&socket)
            .args(["--arc-max", "16MiB"])
            .args(extra)
            .start();
        // Lines about cache devices come first when there are some.
        assert_eq!(
            service.ready_line,
            format!(
                "l2arc: serving {} on unix:{}",
                image.display(),
                socket.display()
            )
        );
        Served {
            dir,
            image,
            socket,
            service,
        }
    }

    fn uri(&self) -> String {
        self.service.uri()
    }

    /// SIGTERM; the exit status and the rest of stderr.
    fn stop(&mut self) -> (std::process::ExitStatus, String) {
        let (status, rest) = self.service.stop();
        (status, rest.join("\n"))
    }
}

#[test]
fn fio_random_writes_verify_then_sigterm_exits_cleanly() {
    let mut s = Served::start(&[]);
    let out = run(tool("fio")
        .current_dir(s.dir.path())
        .args([
            "--name=verify",
            "--ioengine=nbd",
            "--rw=randwrite",
            "--bs=4k",
            "--size=16m",
        ])
        .args([
            "--iodepth=16",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
        ])
        .arg(format!("--uri={}", s.uri())));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("verify:") || text.contains("write:"),
        "{text}"
    );
    assert!(
        !text.contains("bad magic") && !text.contains("verify failed"),
        "{text}"
    );
    // Random reads as well, several jobs at once (multi-conn).
    run(tool("fio")
        .current_dir(s.dir.path())
        .args([
            "--name=reads",
            "--ioengine=nbd",
            "--rw=randread",
            "--bs=4k",
            "--size=64m",
        ])
        .args(["--iodepth=32", "--numjobs=2", "--io_size=8m"])
        .arg(format!("--uri={}", s.uri())));
    let (status, stderr) = s.stop();
    assert!(status.success(), "exit status {status}: {stderr}");
    assert!(stderr.contains("l2arc: stopped"), "{stderr}");
    assert!(
        stderr.contains("demand_data_misses"),
        "arcstats printed on exit: {stderr}"
    );
}

#[test]
fn qemu_io_patterns_discard_and_qemu_img_compare() {
    let mut s = Served::start(&[]);
    let uri = s.uri();
    run(tool("qemu-io")
        .args(["-f", "raw", &uri])
        .args(["-c", "write -P 0xab 1M 1M", "-c", "read -P 0xab 1M 1M"])
        .args([
            "-c",
            "write -P 0xcd 12345 6789",
            "-c",
            "read -P 0xcd 12345 6789",
        ]));
    // TRIM (discard): the range then reads as zeros, through the cache.
    run(tool("qemu-io")
        .args(["-f", "raw", &uri])
        .args([
            "-c",
            "read -P 0xab 1M 64k",
            "-c",
            "discard 1M 64k",
            "-c",
            "read -P 0 1M 64k",
        ])
        .args(["-c", "write -z 4M 100k", "-c", "read -P 0 4M 100k"]));
    let file = std::fs::read(&s.image).unwrap();
    assert!(
        file[(1 << 20) + (64 << 10)..2 << 20]
            .iter()
            .all(|&b| b == 0xab)
    );
    assert!(
        file[1 << 20..(1 << 20) + (64 << 10)]
            .iter()
            .all(|&b| b == 0)
    );
    // qemu-img convert from the export and compare with the image file.
    let copy = s.dir.path().join("copy.img");
    run(tool("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &uri])
        .arg(&copy));
    run(tool("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&copy)
        .arg(&s.image));
    let (status, _) = s.stop();
    assert!(status.success());
    run(tool("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&copy)
        .arg(&s.image));
}

#[test]
fn nbdcopy_both_ways_and_nbdinfo() {
    let s = Served::start(&["--export-name", "disk"]);
    let uri = format!("nbd+unix:///disk?socket={}", s.socket.display());
    let info = run(tool("nbdinfo").args(["--json", &uri]));
    let text = String::from_utf8_lossy(&info.stdout);
    for want in [
        format!("\"export-size\": {IMAGE_BYTES}"),
        "\"block_size_minimum\": 1".to_string(),
        "\"block_size_preferred\": 4096".to_string(),
        "\"block_size_maximum\": 33554432".to_string(),
        "\"can_multi_conn\": true".to_string(),
        "\"can_trim\": true".to_string(),
    ] {
        assert!(text.contains(&want), "nbdinfo lacks {want}: {text}");
    }
    let list = run(tool("nbdinfo").args(["--list", "--json", &s.uri()]));
    assert!(String::from_utf8_lossy(&list.stdout).contains("\"export-name\": \"disk\""));
    // Another name is refused.
    let wrong = tool("nbdinfo")
        .arg(format!("nbd+unix:///other?socket={}", s.socket.display()))
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    // In: a local file onto the export; out: the export to a file.
    let src = s.dir.path().join("src.img");
    let data = pattern(IMAGE_BYTES, 7);
    std::fs::write(&src, &data).unwrap();
    run(tool("nbdcopy").arg(&src).arg(&uri));
    assert!(
        std::fs::read(&s.image).unwrap() == data,
        "the export holds what was copied in"
    );
    let back = s.dir.path().join("back.img");
    run(tool("nbdcopy").arg(&uri).arg(&back));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the copy out matches"
    );
}

#[test]
fn read_only_refuses_writes() {
    let s = Served::start(&["--read-only"]);
    let out = tool("qemu-io")
        .args(["-f", "raw", &s.uri(), "-c", "write -P 0xab 0 4k"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success()
            || text.contains("ermission")
            || text.contains("read-only")
            || text.contains("read only"),
        "a write to a read-only export must fail: {text}"
    );
    assert!(!text.contains("wrote 4096/4096"), "{text}");
    run(tool("qemu-io").args(["-f", "raw", "-r", &s.uri(), "-c", "read 0 4k"]));
    assert!(
        std::fs::read(&s.image).unwrap() == pattern(IMAGE_BYTES, 1),
        "the image is unchanged"
    );
}

#[test]
fn refuses_remote_listen_without_allow_remote() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("x.img");
    std::fs::write(&image, [0u8; 4096]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_l2arc"))
        .arg("serve-nbd")
        .arg(&image)
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-remote"));
}

#[test]
fn tcp_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("tcp.img");
    std::fs::write(&image, pattern(1 << 20, 3)).unwrap();
    let mut served = Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), &image)
        .args(["--listen", "127.0.0.1:0", "--export-name", "tcp"])
        .start();
    let line = &served.ready_line;
    let prefix = format!("l2arc: serving {} on ", image.display());
    let addr = line
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    assert!(
        addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
        "{addr}"
    );
    let out = run(tool("nbdinfo").args(["--size", &format!("nbd://{addr}/tcp")]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (1 << 20).to_string()
    );
    assert!(served.stop().0.success());
}

/// Settings from a TOML file, then cache devices added and removed through
/// `l2arc ctl` while a client reads: the export keeps serving right bytes.
#[test]
fn config_file_and_ctl_change_cache_devices_while_serving() {
    let conf_dir = tempfile::tempdir().unwrap();
    let config = conf_dir.path().join("l2arc.toml");
    let control = conf_dir.path().join("ctl.sock");
    std::fs::write(
        &config,
        format!(
            "arc_max = \"8MiB\"\nrecordsize = \"16K\"\ncompression = \"off\"\ncontrol = \"{}\"\n",
            control.display()
        ),
    )
    .unwrap();
    let mut served = Served::start(&["--config", config.to_str().unwrap()]);
    let stats = ctl(&control, &["stats"]);
    // The flag (--arc-max 16MiB in Served::start) wins over the file's 8MiB.
    assert_eq!(l2arc_testkit::kstat(&stats, "c_max"), 16 << 20);
    assert_eq!(ctl(&control, &["devices"]), "");

    let device = served.dir.path().join("l2.img");
    let added = ctl(&control, &["add-cache", device.to_str().unwrap(), "128MiB"]);
    assert!(
        added.starts_with(&format!(
            "added cache device {} as slot 0",
            device.display()
        )),
        "{added}"
    );
    let expected = pattern(IMAGE_BYTES, 1);
    let copy = served.dir.path().join("copy.img");
    for _ in 0..3 {
        run(tool("nbdcopy").arg(served.uri()).arg(&copy));
        assert!(std::fs::read(&copy).unwrap() == expected, "bytes differ");
    }
    // The whole image is 4x the ARC: the feeder must have put records on flash.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while l2arc_testkit::kstat(&ctl(&control, &["stats"]), "l2_size") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing reached the L2ARC"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let listed = ctl(&control, &["devices"]);
    assert!(listed.starts_with("0 online"), "{listed}");
    ctl(&control, &["remove-cache", "0"]);
    assert_eq!(
        l2arc_testkit::kstat(&ctl(&control, &["stats"]), "l2_devices"),
        0
    );
    run(tool("nbdcopy").arg(served.uri()).arg(&copy));
    assert!(
        std::fs::read(&copy).unwrap() == expected,
        "bytes differ after removal"
    );

    let (status, _) = served.stop();
    assert!(status.success());
    assert!(!control.exists(), "the control socket is removed at exit");
}

/// A block device's generation does not move when it is written (no ctime
/// on writes): serve-nbd says so after its ready line, and says nothing of
/// the kind for an image file. Its memory budget line follows the ready line.
#[test]
fn a_block_device_export_states_its_generation_limit() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    std::fs::write(&backing, pattern(8 << 20, 3)).unwrap();
    let device = LoopDevice::attach(&backing);
    for (image, block) in [(device.0.clone(), true), (backing.clone(), false)] {
        let socket = dir.path().join("nbd.sock");
        let mut served = Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), &image)
            .listen_unix(&socket)
            .args(["--arc-max", "16MiB", "--read-only"])
            .start();
        assert!(served.before_ready.is_empty(), "{:?}", served.before_ready);
        let memory = served.stderr.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(
            memory.starts_with("l2arc: memory: arc_max 16 MiB + L2 index"),
            "{memory}"
        );
        run(tool("nbdinfo").arg("--size").arg(served.uri()));
        let (status, rest) = served.stop();
        assert!(status.success());
        let third = rest.first().cloned().unwrap_or_default();
        assert_eq!(
            third.contains("is a block device: writes made to it by anything but this export"),
            block,
            "{image:?}: {third}"
        );
    }
}

/// serve-nbd gives 128 KiB records sector tables by default: once the
/// image is on flash, fio's random 4 KiB reads (verifying every block it
/// wrote) take 4 KiB pieces from flash, not whole records, and every byte
/// is right.
#[test]
fn random_small_reads_of_records_on_flash_read_only_their_pieces() {
    let control = tempfile::tempdir().unwrap();
    let ctl_socket = control.path().join("ctl.sock");
    let device = control.path().join("l2.img");
    let mut served = Served::start(&[
        "--recordsize",
        "128K",
        "--compression",
        "off",
        "--cache",
        device.to_str().unwrap(),
        "--cache-size",
        "128MiB",
        "--control",
        ctl_socket.to_str().unwrap(),
    ]);
    let fio_job = |extra: &[&str]| {
        let out = run(tool("fio")
            .current_dir(served.dir.path())
            .args([
                "--name=pieces",
                "--ioengine=nbd",
                "--rw=randwrite",
                "--bs=4k",
            ])
            .args(["--size=64m", "--iodepth=16", "--verify=crc32c"])
            .args(["--verify_fatal=1", "--randseed=7"])
            .args(extra)
            .arg(format!("--uri={}", served.uri())));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    fio_job(&["--do_verify=0"]);
    // Read the image whole: the ARC (16 MiB) passes it on to flash.
    run(tool("nbdcopy")
        .arg(served.uri())
        .arg(served.dir.path().join("copy.img")));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while l2arc_testkit::kstat(&ctl(&ctl_socket, &["stats"]), "l2_bufs") < 400 {
        assert!(
            std::time::Instant::now() < deadline,
            "the image did not reach flash: {}",
            ctl(&ctl_socket, &["stats"])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = ctl(&ctl_socket, &["stats"]);
    let text = fio_job(&["--verify_only"]);
    assert!(
        !text.contains("verify failed") && !text.contains("bad magic"),
        "{text}"
    );
    let after = ctl(&ctl_socket, &["stats"]);
    let delta = |name| l2arc_testkit::kstat(&after, name) - l2arc_testkit::kstat(&before, name);
    let (sector_hits, l2_read_bytes) = (delta("l2_sector_hits"), delta("l2_read_bytes"));
    eprintln!("{sector_hits} sector hits, {l2_read_bytes} bytes from flash for 16384 reads");
    // Three quarters of the image only flash holds.
    assert!(sector_hits >= 8000, "{sector_hits} sector hits");
    // Whole records would be 128 KiB a read.
    assert!(l2_read_bytes < 16384 * 16 * 1024, "{l2_read_bytes} bytes");
    let (status, _) = served.stop();
    assert!(status.success());
}

/// `l2arc ctl --socket SOCKET ARGS...` (the testkit's, with this binary).
fn ctl(socket: &std::path::Path, args: &[&str]) -> String {
    l2arc_testkit::ctl(
        std::path::Path::new(env!("CARGO_BIN_EXE_l2arc")),
        socket,
        args,
    )
}
