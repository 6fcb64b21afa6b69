/*
 * The human-readable report.
 *
 * Laid out like the ARC paper's tables, one row per cache size and one
 * column per policy, so a run can be checked against the published table by
 * eye.  Hit ratios are printed as percentages with two decimals, the
 * precision the paper reports.  Speed is summarised per policy over all its
 * sizes (total requests / total replay time), since it is a property of the
 * implementation rather than of one cache size.
 */

use std::fmt::Write as _;

use crate::{PolicyName, ReplayResult};

fn first_seen<T: PartialEq + Copy>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for x in items {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// Formats results as a table of hit ratios (rows = sizes, columns =
/// policies, in first-seen order), followed by one requests/second line
/// per policy.
pub fn format_table(results: &[ReplayResult]) -> String {
    let policies: Vec<PolicyName> = first_seen(results.iter().map(|r| r.policy));
    let sizes: Vec<u64> = first_seen(results.iter().map(|r| r.size));
    let size_w = sizes
        .iter()
        .map(|s| s.to_string().len())
        .max()
        .unwrap_or(0)
        .max("size".len());
    let col_w = 8;

    let mut out = String::new();
    let _ = write!(out, "{:>size_w$}", "size");
    for p in &policies {
        let _ = write!(out, "  {:>col_w$}", p.name());
    }
    out.push('\n');
    for &s in &sizes {
        let _ = write!(out, "{s:>size_w$}");
        for &p in &policies {
            match results.iter().find(|r| r.policy == p && r.size == s) {
                Some(r) => {
                    let cell = format!("{:.2}%", r.hit_ratio * 100.0);
                    let _ = write!(out, "  {cell:>col_w$}");
                }
                None => {
                    let _ = write!(out, "  {:>col_w$}", "-");
                }
            }
        }
        out.push('\n');
    }
    for &p in &policies {
        let (reqs, secs, runs) = results
            .iter()
            .filter(|r| r.policy == p)
            .fold((0u64, 0f64, 0usize), |(q, t, n), r| {
                (q + r.requests, t + r.elapsed_secs, n + 1)
            });
        let rate = if secs > 0.0 { reqs as f64 / secs } else { 0.0 };
        let _ = writeln!(
            out,
            "{p}: {} requests/s ({reqs} requests in {secs:.3} s over {runs} run{})",
            human_rate(rate),
            if runs == 1 { "" } else { "s" }
        );
    }
    out
}

fn human_rate(rate: f64) -> String {
    if rate >= 1e6 {
        format!("{:.2}M", rate / 1e6)
    } else if rate >= 1e3 {
        format!("{:.1}k", rate / 1e3)
    } else {
        format!("{rate:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(policy: PolicyName, size: u64, hits: u64) -> ReplayResult {
        ReplayResult {
            policy,
            size,
            requests: 1000,
            hits,
            hit_ratio: hits as f64 / 1000.0,
            elapsed_secs: 0.001,
        }
    }

    #[test]
    fn rows_are_sizes_columns_are_policies() {
        let results = vec![
            r(PolicyName::Arc, 1000, 389),
            r(PolicyName::Arc, 20000, 461),
            r(PolicyName::Lru, 1000, 328),
            r(PolicyName::Lru, 20000, 425),
        ];
        let t = format_table(&results);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert_eq!(lines[0], " size       arc       lru");
        assert_eq!(lines[1], " 1000    38.90%    32.80%");
        assert_eq!(lines[2], "20000    46.10%    42.50%");
        assert_eq!(
            lines[3],
            "arc: 1.00M requests/s (2000 requests in 0.002 s over 2 runs)"
        );
        assert!(lines[4].starts_with("lru: 1.00M requests/s"));
    }

    #[test]
    fn missing_cells_and_empty_input() {
        let results = vec![r(PolicyName::Arc, 1, 1), r(PolicyName::Min, 2, 2)];
        let t = format_table(&results);
        assert!(t.lines().nth(1).unwrap().ends_with('-'), "{t}");
        assert_eq!(format_table(&[]), "size\n");
    }
}
