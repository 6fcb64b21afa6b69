//! The `l2arc` binary as a system installs it: `--version`, the shell
//! completions and man pages it generates from its own CLI, the systemd
//! units (checked by `systemd-analyze verify` against an installed tree),
//! the example settings (started as a real export), scripts/install.sh's
//! layout and the Debian package's (cargo-deb over the binary this test
//! build already has, unpacked with `dpkg-deb -x`).
//!
//! Every outside tool is required, never skipped: `scripts/setup.sh`
//! installs them (bash, zsh, fish, man-db, groff, systemd, dpkg, cargo-deb).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use l2arc_testkit::{run, tool};

/// The subcommands every generated artefact must know.
const SUBCOMMANDS: [&str; 9] = [
    "trace",
    "bench",
    "mount",
    "serve-nbd",
    "ctl",
    "stat",
    "iostat",
    "shared-cache",
    "completions",
];

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_l2arc"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn l2arc(args: &[&str]) -> String {
    stdout(&run(Command::new(bin()).args(args)))
}

#[test]
fn version_names_the_commit_the_features_and_the_profile() {
    let text = l2arc(&["--version"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some(format!("l2arc {}", env!("CARGO_PKG_VERSION")).as_str()),
        "{text}"
    );
    let head = stdout(&run(tool("git", "git")
        .arg("-C")
        .arg(repo())
        .args(["rev-parse", "HEAD"])));
    let commit = lines
        .iter()
        .find_map(|l| l.strip_prefix("commit: "))
        .unwrap_or_else(|| panic!("no commit line in {text:?}"));
    assert!(
        commit == head.trim() || commit == format!("{}-dirty", head.trim()),
        "commit {commit:?} is not HEAD {head:?} (with -dirty or not)"
    );
    let features = lines.iter().find_map(|l| l.strip_prefix("features: "));
    // The engine's features: the command always reads s3:// sources.
    assert!(
        features.is_some_and(|f| f.split(',').any(|f| f == "object-store")),
        "{text}"
    );
    assert!(lines.iter().any(|l| l.starts_with("profile: ")), "{text}");
    // -V stays one line, as scripts expect.
    assert_eq!(
        l2arc(&["-V"]).trim(),
        format!("l2arc {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn completions_pass_each_shells_syntax_check() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, check) in [
        ("bash", ["bash", "-n"]),
        ("zsh", ["zsh", "-n"]),
        ("fish", ["fish", "--no-execute"]),
    ] {
        let script = l2arc(&["completions", shell]);
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell} completions lack {sub}");
        }
        let path = dir.path().join(format!("l2arc.{shell}"));
        std::fs::write(&path, &script).unwrap();
        run(tool(check[0], check[0]).arg(check[1]).arg(&path));
    }
    // A closed pipe ends it quietly, as every filter does.
    let out = run(Command::new("bash").args([
        "-o",
        "pipefail",
        "-c",
        &format!("'{}' completions bash | head -c 1", bin().display()),
    ]));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn man_pages_render_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let listed = l2arc(&["manpages", dir.path().to_str().unwrap()]);
    let pages: Vec<PathBuf> = listed.lines().map(PathBuf::from).collect();
    let names: Vec<String> = pages
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(names.contains(&"l2arc.1".to_string()), "{names:?}");
    for sub in SUBCOMMANDS {
        assert!(names.contains(&format!("l2arc-{sub}.1")), "{names:?}");
    }
    assert!(
        names.contains(&"l2arc-ctl-devices.1".to_string()),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n.contains("manpages")), "{names:?}");
    for page in &pages {
        let out = run(tool("man", "man-db")
            .env("MANWIDTH", "80")
            .env_remove("MANPAGER")
            .env_remove("PAGER")
            .args(["--warnings", "-l"])
            .arg(page));
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(warnings.is_empty(), "{}: {warnings}", page.display());
        let text = stdout(&out);
        assert!(text.contains("SYNOPSIS"), "{}: {text}", page.display());
    }
}

/// Runs scripts/install.sh PREFIX with this build's binary; returns PREFIX.
fn install_into(root: &Path) -> PathBuf {
    let prefix = root.join("usr");
    run(Command::new(repo().join("scripts/install.sh"))
        .arg(&prefix)
        .env("L2ARC_BIN", bin()));
    prefix
}

/// The files install.sh and the package put under /usr (`usr`), relative.
const USR_FILES: [&str; 10] = [
    "bin/l2arc",
    "share/man/man1/l2arc.1.gz",
    "share/man/man1/l2arc-serve-nbd.1.gz",
    "share/man/man1/l2arc-mount.1.gz",
    "share/bash-completion/completions/l2arc",
    "share/fish/vendor_completions.d/l2arc.fish",
    "lib/systemd/system/l2arc-nbd@.service",
    "lib/systemd/system/l2arc-mount@.service",
    "share/doc/l2arc/l2arc.toml.example",
    "share/doc/l2arc/l2arc-nbd.env.example",
];

#[test]
fn install_script_lays_out_the_tree() {
    let root = tempfile::tempdir().unwrap();
    let prefix = install_into(root.path());
    for file in USR_FILES {
        assert!(prefix.join(file).is_file(), "install.sh left no {file}");
    }
    // Not /usr: zsh's site directory.
    assert!(prefix.join("share/zsh/site-functions/_l2arc").is_file());
    let installed = prefix.join("bin/l2arc");
    let version = stdout(&run(Command::new(&installed).arg("--version")));
    assert!(version.contains("commit: "), "{version}");
    // Debug info stripped: smaller than the build's binary.
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    assert!(size(&installed) < size(bin()), "install.sh kept debug info");
    let unit = std::fs::read_to_string(prefix.join("lib/systemd/system/l2arc-nbd@.service"));
    let exec = format!("ExecStart={} serve-nbd", installed.display());
    assert!(
        unit.unwrap().contains(&exec),
        "ExecStart does not name PREFIX/bin"
    );
}

/// What each unit must say for systemd to run it as docs/operations.md tells.
const UNIT_MUST: [&str; 10] = [
    "Type=notify",
    "NotifyAccess=main",
    "ExecReload=/bin/kill -HUP $MAINPID",
    "WatchdogSec=",
    "Restart=on-failure",
    "KillSignal=SIGTERM",
    "TimeoutStopSec=",
    "NoNewPrivileges=yes",
    "CapabilityBoundingSet=",
    "--config /etc/l2arc/%i.toml",
];

/// systemd waits `TimeoutStopSec` for the whole stop: the drain (serve-nbd's
/// `--stop-timeout`, 10 s by default) and then the stop flush
/// (`l2arc_stop_budget_secs`), with room to spare for the closing lines.
fn assert_stop_fits(name: &str, unit: &str) {
    const STOP_TIMEOUT_DEFAULT_SECS: f64 = 10.0;
    let stop_budget_secs = l2arc::L2ArcConfig::default().l2arc_stop_budget_secs;
    let timeout_secs: f64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.strip_suffix('s'))
        .unwrap_or_else(|| panic!("{name}: TimeoutStopSec= in seconds"))
        .parse()
        .unwrap();
    assert!(
        timeout_secs >= 2.0 * (STOP_TIMEOUT_DEFAULT_SECS + stop_budget_secs),
        "{name}: TimeoutStopSec={timeout_secs}s leaves no room for the drain and the stop flush"
    );
}

#[test]
fn installed_units_pass_systemd_analyze_verify() {
    let root = tempfile::tempdir().unwrap();
    let prefix = install_into(root.path());
    let units = prefix.join("lib/systemd/system");
    for name in ["l2arc-nbd@.service", "l2arc-mount@.service"] {
        let text = std::fs::read_to_string(units.join(name)).unwrap();
        for must in UNIT_MUST {
            assert!(text.contains(must), "{name} lacks {must}");
        }
        assert_stop_fits(name, &text);
        // An instance of the template, as systemctl would load it; verify
        // checks that ExecStart's binary exists (here, the installed one).
        let instance = units.join(name.replace("@.", "@example."));
        std::fs::copy(units.join(name), &instance).unwrap();
        let out = tool("systemd-analyze", "systemd")
            .args(["verify", "--man=no"])
            .arg(&instance)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("l2arc")).collect();
        assert!(
            out.status.success() && ours.is_empty(),
            "systemd-analyze verify {name}: {}\n{stderr}",
            out.status
        );
    }
    // The mount's unit must not give it a mount namespace of its own: the
    // FUSE mount would not be seen outside it.
    let mount = std::fs::read_to_string(units.join("l2arc-mount@.service")).unwrap();
    for namespacing in [
        "ProtectSystem=",
        "PrivateTmp=",
        "ProtectHome=",
        "ReadWritePaths=",
    ] {
        let set = mount.lines().any(|l| l.starts_with(namespacing));
        assert!(!set, "l2arc-mount@.service sets {namespacing}");
    }
}

#[test]
fn example_config_starts_an_export() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(repo().join("packaging/l2arc.toml.example")).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let config = example
        .replace("/var/lib/l2arc/example", state.to_str().unwrap())
        .replace("\"127.0.0.1:9112\"", "\"127.0.0.1:0\"");
    assert_ne!(config, example, "the example's paths moved");
    let config_path = dir.path().join("example.toml");
    std::fs::write(&config_path, config).unwrap();
    let image = dir.path().join("disk.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let mut service = l2arc_testkit::service::Service::serve_nbd(bin(), &image)
        .listen_unix(&dir.path().join("nbd.sock"))
        .arg("--config")
        .arg(&config_path)
        .start();
    assert!(
        service.http().is_some(),
        "the example's http key was not taken"
    );
    assert!(state.join("cache0.img").is_file(), "no cache device made");
    let (status, _) = service.stop();
    assert!(status.success(), "{status}");
}

/// `.deb` layout beyond `usr/`: the settings in /etc, marked conffiles.
fn check_etc_and_conffiles(root: &Path, deb: &Path) {
    assert!(root.join("etc/l2arc/l2arc.toml.example").is_file());
    let control = tempfile::tempdir().unwrap();
    run(tool("dpkg-deb", "dpkg")
        .arg("-e")
        .arg(deb)
        .arg(control.path()));
    let conffiles = std::fs::read_to_string(control.path().join("conffiles")).unwrap();
    assert!(
        conffiles.contains("/etc/l2arc/l2arc.toml.example"),
        "{conffiles}"
    );
}

#[test]
fn deb_package_holds_the_install_layout() {
    // The binary this build already has: no release build in the suite.
    let target = bin().parent().unwrap().parent().unwrap();
    tool("cargo-deb", "cargo-deb");
    let out = run(Command::new(repo().join("scripts/package.sh"))
        .args(["--no-build", "--profile", "dev", "--fast"])
        .env("CARGO_TARGET_DIR", target));
    let deb = PathBuf::from(stdout(&out).trim());
    assert!(deb.is_file(), "no package at {}", deb.display());
    let root = tempfile::tempdir().unwrap();
    run(tool("dpkg-deb", "dpkg")
        .arg("-x")
        .arg(&deb)
        .arg(root.path()));
    let usr = root.path().join("usr");
    for file in USR_FILES {
        assert!(usr.join(file).is_file(), "the package holds no /usr/{file}");
    }
    assert!(usr.join("share/zsh/vendor-completions/_l2arc").is_file());
    check_etc_and_conffiles(root.path(), &deb);
    let version = stdout(&run(Command::new(usr.join("bin/l2arc")).arg("--version")));
    assert!(version.contains("commit: "), "{version}");
    let sections = stdout(&run(tool("readelf", "binutils")
        .arg("-S")
        .arg(usr.join("bin/l2arc"))));
    assert!(
        !sections.contains(".debug_info"),
        "debug info left in the package"
    );
    let ddeb = std::fs::read_dir(deb.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().starts_with("l2arc-dbgsym_"));
    assert!(ddeb, "no -dbgsym package beside {}", deb.display());
    let size = stdout(&run(tool("dpkg-deb", "dpkg")
        .arg("-f")
        .arg(&deb)
        .arg("Installed-Size")));
    assert!(
        size.trim().parse::<u64>().is_ok_and(|kib| kib > 0),
        "{size}"
    );
}
