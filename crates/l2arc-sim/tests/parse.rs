//! Trace parsers: every format, compressed and not, and the error messages
//! for broken input.

use std::io::Write;
use std::path::{Path, PathBuf};

use l2arc_sim::{Request, TraceFormat, load_trace};
use tempfile::TempDir;

fn write(dir: &TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(bytes).unwrap();
    path
}

fn write_zst(dir: &TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    write(dir, name, &zstd::stream::encode_all(bytes, 3).unwrap())
}

fn unit(keys: &[u64]) -> Vec<Request> {
    keys.iter().map(|&key| Request { key, size: 1 }).collect()
}

fn err(path: &Path, format: TraceFormat) -> String {
    load_trace(path, format).unwrap_err().to_string()
}

const LIS: &str = "1 3 0 0\n10 1 0 1\n5 0 0 2\n\n7 2 -1 3\n";

#[test]
fn lis_expands_runs_into_page_requests() {
    let dir = TempDir::new().unwrap();
    let p = write(&dir, "t.lis", LIS.as_bytes());
    let t = load_trace(&p, TraceFormat::Lis).unwrap();
    assert_eq!(t, unit(&[1, 2, 3, 10, 7, 8]));
}

#[test]
fn lis_accepts_two_or_three_fields_and_crlf() {
    let dir = TempDir::new().unwrap();
    let p = write(&dir, "t.lis", b"4 2\r\n9 1 0\r\n");
    assert_eq!(load_trace(&p, TraceFormat::Lis).unwrap(), unit(&[4, 5, 9]));
}

#[test]
fn zst_is_decompressed_transparently() {
    let dir = TempDir::new().unwrap();
    let plain = write(&dir, "t.lis", LIS.as_bytes());
    let packed = write_zst(&dir, "t.lis.zst", LIS.as_bytes());
    let a = load_trace(&plain, TraceFormat::Lis).unwrap();
    let b = load_trace(&packed, TraceFormat::Lis).unwrap();
    assert_eq!(a, b);
    assert_eq!(b.len(), 6);

    let txt = write_zst(&dir, "t.txt.zst", b"5 100\n6\n");
    assert_eq!(
        load_trace(&txt, TraceFormat::Txt).unwrap(),
        vec![Request { key: 5, size: 100 }, Request { key: 6, size: 1 }]
    );
}

#[test]
fn lis_errors_name_file_and_line() {
    let dir = TempDir::new().unwrap();
    let p = write(&dir, "bad.lis", b"1 1 0 0\n2 1 0 1\n42\n");
    let e = err(&p, TraceFormat::Lis);
    assert_eq!(
        e,
        format!(
            "{}: line 3: expected 2 to 4 fields `start nblocks [_ [_]]`, found 1",
            p.display()
        )
    );

    let p = write(&dir, "bad2.lis", b"1 1 0 0\n1 x 0 0\n");
    let e = err(&p, TraceFormat::Lis);
    assert!(e.contains("bad2.lis: line 2: block count `x`"), "{e}");

    let p = write(&dir, "bad3.lis", b"1 1 0 0 0\n");
    assert!(err(&p, TraceFormat::Lis).contains("line 1: expected 2 to 4 fields"));

    let p = write(&dir, "bad4.lis", b"1 1 0 zz\n");
    assert!(err(&p, TraceFormat::Lis).contains("line 1: field 4 `zz` is not an integer"));

    let p = write(&dir, "bad5.lis", b"-1 1 0 0\n");
    assert!(err(&p, TraceFormat::Lis).contains("line 1: start block `-1`"));

    let p = write(&dir, "huge.lis", b"1 99999999999 0 0\n");
    assert!(err(&p, TraceFormat::Lis).contains("line 1: block count 99999999999 exceeds"));

    let p = write(&dir, "wrap.lis", format!("{} 2 0 0\n", u64::MAX).as_bytes());
    assert!(err(&p, TraceFormat::Lis).contains("overflows"));

    let p = write(&dir, "utf.lis", b"1 1 0 0\n\xff\xfe 1 0 0\n");
    assert!(err(&p, TraceFormat::Lis).contains("line 2: line is not valid UTF-8"));
}

#[test]
fn line_numbers_survive_compression() {
    let dir = TempDir::new().unwrap();
    let mut text = String::new();
    for i in 0..11 {
        text.push_str(&format!("{i} 1 0 {i}\n"));
    }
    text.push_str("12 1\n13\n");
    let p = write_zst(&dir, "OLTP.lis.zst", text.as_bytes());
    let e = err(&p, TraceFormat::Lis);
    assert!(
        e.ends_with(
            "OLTP.lis.zst: line 13: expected 2 to 4 fields `start nblocks [_ [_]]`, found 1"
        ),
        "{e}"
    );
}

#[test]
fn missing_file() {
    let p = Path::new("/nonexistent/dir/nope.lis");
    assert_eq!(
        err(p, TraceFormat::Lis),
        "cannot open /nonexistent/dir/nope.lis: No such file or directory"
    );
}

#[test]
fn corrupt_zst_is_an_error_not_a_panic() {
    let dir = TempDir::new().unwrap();
    let p = write(&dir, "junk.lis.zst", b"this is not zstd data at all");
    let e = err(&p, TraceFormat::Lis);
    assert!(
        e.starts_with(&format!("{}: read error:", p.display())),
        "{e}"
    );
}

fn oracle_record(ts: u32, id: u64, size: u32, next: i64) -> Vec<u8> {
    let mut r = Vec::with_capacity(24);
    r.extend_from_slice(&ts.to_le_bytes());
    r.extend_from_slice(&id.to_le_bytes());
    r.extend_from_slice(&size.to_le_bytes());
    r.extend_from_slice(&next.to_le_bytes());
    r
}

#[test]
fn oracle_records() {
    let dir = TempDir::new().unwrap();
    let mut bytes = Vec::new();
    bytes.extend(oracle_record(1, 42, 512, 2));
    bytes.extend(oracle_record(2, u64::MAX, 4096, -1));
    bytes.extend(oracle_record(3, 42, 0, -1)); // size 0 is replayed as 1
    let want = vec![
        Request { key: 42, size: 512 },
        Request {
            key: u64::MAX,
            size: 4096,
        },
        Request { key: 42, size: 1 },
    ];
    let p = write(&dir, "t.oracleGeneral.bin", &bytes);
    assert_eq!(load_trace(&p, TraceFormat::Oracle).unwrap(), want);
    let p = write_zst(&dir, "t.oracleGeneral.bin.zst", &bytes);
    assert_eq!(load_trace(&p, TraceFormat::Oracle).unwrap(), want);
}

#[test]
fn oracle_many_records_cross_buffer_boundaries() {
    // More records than one read buffer holds, through the zstd decoder
    // whose reads do not align with records.
    let dir = TempDir::new().unwrap();
    let n = 30_001u64;
    let mut bytes = Vec::new();
    for i in 0..n {
        bytes.extend(oracle_record(i as u32, i * 7, (i % 5000 + 1) as u32, -1));
    }
    let p = write_zst(&dir, "big.bin.zst", &bytes);
    let t = load_trace(&p, TraceFormat::Oracle).unwrap();
    assert_eq!(t.len() as u64, n);
    assert!(t.iter().enumerate().all(|(i, r)| {
        let i = i as u64;
        r.key == i * 7 && r.size == i % 5000 + 1
    }));
}

#[test]
fn oracle_partial_record_names_offset() {
    let dir = TempDir::new().unwrap();
    let mut bytes = Vec::new();
    bytes.extend(oracle_record(1, 1, 1, -1));
    bytes.extend(oracle_record(2, 2, 2, -1));
    bytes.extend_from_slice(&[1, 2, 3, 4, 5]);
    let p = write(&dir, "torn.bin", &bytes);
    assert_eq!(
        err(&p, TraceFormat::Oracle),
        format!(
            "{}: truncated record at byte offset 48: 5 of 24 bytes present",
            p.display()
        )
    );
    let p = write_zst(&dir, "torn.bin.zst", &bytes);
    assert!(err(&p, TraceFormat::Oracle).contains("byte offset 48"));
}

#[test]
fn csv_with_and_without_header() {
    let dir = TempDir::new().unwrap();
    let p = write(&dir, "h.csv", b"key,size\n1,100\n2\n\n3, 300\n");
    assert_eq!(
        load_trace(&p, TraceFormat::Csv).unwrap(),
        vec![
            Request { key: 1, size: 100 },
            Request { key: 2, size: 1 },
            Request { key: 3, size: 300 },
        ]
    );
    let p = write(&dir, "n.csv", b"7,70\n8,80\n");
    assert_eq!(
        load_trace(&p, TraceFormat::Csv).unwrap(),
        vec![Request { key: 7, size: 70 }, Request { key: 8, size: 80 }]
    );
}

#[test]
fn csv_errors() {
    let dir = TempDir::new().unwrap();
    // The header is line 1, so the bad row is line 3.
    let p = write(&dir, "bad.csv", b"obj,size\n1,2\n1,2,3\n");
    assert_eq!(
        err(&p, TraceFormat::Csv),
        format!(
            "{}: line 3: expected 1 or 2 fields `key[,size]`, found 3",
            p.display()
        )
    );
    // A header anywhere but the first line is an error.
    let p = write(&dir, "mid.csv", b"1,2\nkey,size\n");
    assert!(err(&p, TraceFormat::Csv).contains("line 2: key `key` is not a non-negative integer"));
    let p = write(&dir, "neg.csv", b"-5,2\n");
    assert!(err(&p, TraceFormat::Csv).contains("line 1: key `-5`"));
    let p = write(&dir, "zero.csv", b"5,0\n");
    assert!(err(&p, TraceFormat::Csv).contains("line 1: size 0"));
}

#[test]
fn txt_format() {
    let dir = TempDir::new().unwrap();
    let p = write(
        &dir,
        "t.txt",
        b"# a comment\n1\n\n  2 4096\n   # indented comment\n3\t10\n",
    );
    assert_eq!(
        load_trace(&p, TraceFormat::Txt).unwrap(),
        vec![
            Request { key: 1, size: 1 },
            Request { key: 2, size: 4096 },
            Request { key: 3, size: 10 },
        ]
    );
    let p = write(&dir, "bad.txt", b"1\n2 3 4\n");
    assert_eq!(
        err(&p, TraceFormat::Txt),
        format!(
            "{}: line 2: expected 1 or 2 fields `key [size]`, found 3",
            p.display()
        )
    );
    let p = write(&dir, "bad2.txt", b"# c\n\n1 x\n");
    assert!(err(&p, TraceFormat::Txt).contains("line 3: size `x`"));
}

#[test]
fn empty_files_load_as_empty_traces() {
    let dir = TempDir::new().unwrap();
    for (name, fmt) in [
        ("e.lis", TraceFormat::Lis),
        ("e.bin", TraceFormat::Oracle),
        ("e.csv", TraceFormat::Csv),
        ("e.txt", TraceFormat::Txt),
    ] {
        let p = write(&dir, name, b"");
        assert!(load_trace(&p, fmt).unwrap().is_empty(), "{name}");
    }
}

#[test]
fn format_names() {
    for f in TraceFormat::ALL {
        assert_eq!(f.to_string().parse::<TraceFormat>(), Ok(f));
    }
    assert_eq!("LIS".parse::<TraceFormat>(), Ok(TraceFormat::Lis));
    assert_eq!(
        "parquet".parse::<TraceFormat>().unwrap_err(),
        "unknown trace format `parquet` (expected one of: lis, oracle, csv, txt)"
    );
    let guess = |s: &str| TraceFormat::from_path(Path::new(s));
    assert_eq!(guess("OLTP.lis.zst"), Some(TraceFormat::Lis));
    assert_eq!(
        guess("cloudPhysicsIO.oracleGeneral.bin.zst"),
        Some(TraceFormat::Oracle)
    );
    assert_eq!(guess("x.csv"), Some(TraceFormat::Csv));
    assert_eq!(guess("x.TXT"), Some(TraceFormat::Txt));
    assert_eq!(guess("x.zst"), None);
    assert_eq!(guess("noext"), None);
}
