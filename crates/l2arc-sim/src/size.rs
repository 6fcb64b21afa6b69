/*
 * Cache sizes on the command line.
 *
 * A cache size is in the trace's own unit: pages for `.lis` and size-less
 * text traces, bytes for oracleGeneral.  Page traces are sized with plain
 * numbers ("1000"), byte traces with suffixes ("128MiB").  The suffix rules
 * follow the storage convention ZFS itself uses (`zfs set quota=2G` is two
 * GiB): a bare K, M, G, T, P, E means a power of 1024, as does the explicit
 * IEC form KiB, MiB, ...; the SI forms with a B (KB, MB, GB, ...) are
 * powers of 1000, because that is what they mean on a disk's label.  Case
 * does not matter, a trailing "B" alone means bytes (a factor of 1), and
 * space between the number and the suffix is allowed.
 *
 * Only whole numbers are accepted: "1.5GiB" would need a rounding rule, and
 * silently choosing one changes the experiment.  Zero is rejected, since a
 * cache of nothing never hits and is almost certainly a typo.
 */

/// Parses a cache size such as `1000`, `512KiB`, `128MiB`, `2G` (= 2 GiB)
/// or `128MB` (= 128 * 10^6).  See the module comment for the rules.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(format!(
            "invalid size `{s}`: expected a whole number with an optional unit such as 128MiB"
        ));
    }
    let suffix = suffix.trim_start();
    let multiplier = match suffix_multiplier(suffix) {
        Some(m) => m,
        None if suffix.starts_with('.') => {
            return Err(format!(
                "invalid size `{s}`: fractions are not accepted, use a smaller unit"
            ));
        }
        None => {
            return Err(format!(
                "invalid size `{s}`: unknown unit `{suffix}` (use K/M/G/T or KiB/MiB/GiB/TiB for powers of 1024, KB/MB/GB/TB for powers of 1000)"
            ));
        }
    };
    let value: u64 = num
        .parse()
        .map_err(|_| format!("invalid size `{s}`: number too large"))?;
    let bytes = value
        .checked_mul(multiplier)
        .ok_or_else(|| format!("invalid size `{s}`: too large for 64 bits"))?;
    if bytes == 0 {
        return Err(format!(
            "invalid size `{s}`: a cache size must be at least 1"
        ));
    }
    Ok(bytes)
}

fn suffix_multiplier(suffix: &str) -> Option<u64> {
    let u = suffix.to_ascii_uppercase();
    let (prefix, rest) = match u.char_indices().next() {
        None => return Some(1),
        Some((_, c)) => (c, &u[c.len_utf8()..]),
    };
    if prefix == 'B' && rest.is_empty() {
        return Some(1);
    }
    let power = match prefix {
        'K' => 1,
        'M' => 2,
        'G' => 3,
        'T' => 4,
        'P' => 5,
        'E' => 6,
        _ => return None,
    };
    let base: u64 = match rest {
        "" | "IB" | "I" => 1024,
        "B" => 1000,
        _ => return None,
    };
    base.checked_pow(power)
}

/// Parses a comma-separated list of sizes, e.g. `1000,2000,5000` or
/// `128MiB,1GiB`.
pub fn parse_size_list(s: &str) -> Result<Vec<u64>, String> {
    s.split(',').map(parse_size).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_binary_units() {
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size(" 1000 "), Ok(1000));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("128MiB"), Ok(128 << 20));
        assert_eq!(parse_size("128 MiB"), Ok(128 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1gib"), Ok(1 << 30));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("3T"), Ok(3 << 40));
        assert_eq!(parse_size("7B"), Ok(7));
    }

    #[test]
    fn decimal_units() {
        assert_eq!(parse_size("128MB"), Ok(128_000_000));
        assert_eq!(parse_size("1KB"), Ok(1000));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
    }

    #[test]
    fn errors() {
        for bad in [
            "",
            "MiB",
            "abc",
            "12x",
            "1.5GiB",
            "-1",
            "0",
            "0MiB",
            "1 2",
            "16EiB",
            "99999999999999999999",
            "1MiBs",
        ] {
            let e = parse_size(bad).expect_err(bad);
            assert!(e.contains("invalid size"), "{bad}: {e}");
        }
        assert!(parse_size("1.5GiB").unwrap_err().contains("fractions"));
        assert!(parse_size("0").unwrap_err().contains("at least 1"));
    }

    #[test]
    fn lists() {
        assert_eq!(parse_size_list("1000,2000"), Ok(vec![1000, 2000]));
        assert_eq!(
            parse_size_list("128MiB, 1GiB"),
            Ok(vec![128 << 20, 1 << 30])
        );
        assert!(parse_size_list("1000,,2000").is_err());
    }
}
