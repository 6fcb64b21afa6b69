//! The benchmarks table of `docs/benchmarks.md`, made from the committed
//! reports (`docs/benchmarks/reports/<scenario>.json`, each the stamped
//! `--json` reports of its runs, added by `--record`) by one command:
//! `l2arc-bench table` (`cargo run --release -p l2arc-bench -- table`).
//!
//! One row per headline figure of a scenario: ours and the baseline (the
//! medians over the runs), the ratio's median with its range and how many
//! measurements it is over, the goal, whether the median meets it, and
//! the scenario's page. A run's ratio counts once, or, where the scenario
//! pairs rounds within a run, each round's ratio counts once. Nothing in
//! the table is typed by hand: a row exists only where a report backs it,
//! and a test fails when the Markdown and the reports disagree.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::scenarios::{GoalOn, Headline, median_of};

/// Where the generated table starts and ends in `docs/benchmarks.md`.
pub const BEGIN: &str = "<!-- table: generated from docs/benchmarks/reports by `cargo run --release -p l2arc-bench -- table`; do not edit by hand -->";
/// The line after the table.
pub const END: &str = "<!-- end of generated table -->";

/// A scenario's committed report: its runs, oldest first.
#[derive(Serialize, Deserialize)]
pub struct Runs {
    /// The `--scenario` name.
    pub scenario: String,
    /// Each run's stamped `--json` report.
    pub runs: Vec<Value>,
}

/// Adds `stamped` as one more run to `dir/<scenario>.json` (made if
/// missing); returns its path.
pub(crate) fn record_run(dir: &Path, scenario: &str, stamped: Value) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(format!("{scenario}.json"));
    let mut runs = if path.exists() {
        read_runs(&path)?
    } else {
        Runs {
            scenario: scenario.to_string(),
            runs: Vec::new(),
        }
    };
    if runs.scenario != scenario {
        bail!(
            "{} holds runs of {}, not {scenario}",
            path.display(),
            runs.scenario
        );
    }
    runs.runs.push(stamped);
    std::fs::write(&path, serde_json::to_string_pretty(&runs)? + "\n")
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

fn read_runs(path: &Path) -> Result<Runs> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a report of runs", path.display()))
}

/// Every `<scenario>.json` in `dir`, in the scenarios' `--help` order.
pub fn read_reports(dir: &Path) -> Result<Vec<Runs>> {
    let mut reports = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            reports.push(read_runs(&path)?);
        }
    }
    let order = crate::scenario_names();
    let rank = |name: &str| order.iter().position(|n| *n == name).unwrap_or(usize::MAX);
    reports.sort_by(|a, b| {
        rank(&a.scenario)
            .cmp(&rank(&b.scenario))
            .then_with(|| a.scenario.cmp(&b.scenario))
    });
    Ok(reports)
}

/// The table (from [`BEGIN`] to [`END`], both included) for `reports`.
pub fn render(reports: &[Runs]) -> Result<String> {
    let mut out = vec![
        BEGIN.to_string(),
        String::new(),
        "| what | ours | baseline (same runs) | ratio: median [range, measurements] | goal | met | page |"
            .to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    for report in reports {
        for row in rows(report)? {
            out.push(row);
        }
    }
    out.push(String::new());
    out.push(END.to_string());
    Ok(out.join("\n") + "\n")
}

/// One row per headline key of a report: its latest run's, in order, then
/// those of older runs only.
fn rows(report: &Runs) -> Result<Vec<String>> {
    let mut headlines: Vec<Vec<Headline>> = Vec::new();
    for (i, run) in report.runs.iter().enumerate() {
        let h: Vec<Headline> = serde_json::from_value(run["headline"].clone())
            .with_context(|| format!("{}: run {} has no headline", report.scenario, i + 1))?;
        let commit = run["stamp"]["commit"].as_str().unwrap_or("");
        if commit.is_empty() || commit == "unknown" {
            bail!(
                "{}: run {} is not stamped with a commit",
                report.scenario,
                i + 1
            );
        }
        headlines.push(h);
    }
    let Some(latest) = headlines.last() else {
        return Ok(Vec::new());
    };
    let page = format!("[{0}](benchmarks/{0}.md)", report.scenario);
    // The latest run's keys, then those only older runs have (a scenario
    // run in another configuration: its rows stay in the table).
    let mut keys: Vec<&String> = latest.iter().map(|h| &h.key).collect();
    for h in headlines.iter().rev().flatten() {
        if !keys.contains(&&h.key) {
            keys.push(&h.key);
        }
    }
    let mut rows = Vec::new();
    for key in keys {
        let runs: Vec<&Headline> = headlines
            .iter()
            .filter_map(|h| h.iter().find(|x| &x.key == key))
            .collect();
        let last = runs.last().expect("a run has it");
        let ours = median_of(&runs.iter().map(|h| h.ours).collect::<Vec<_>>());
        let baseline = if runs.iter().all(|h| h.baseline.is_some()) {
            let b = median_of(&runs.iter().filter_map(|h| h.baseline).collect::<Vec<_>>());
            format!("{}: {}", last.baseline_name, figure(b, &last.unit))
        } else {
            last.baseline_name.clone()
        };
        let ratios: Vec<f64> = runs.iter().filter_map(|h| h.ratio).collect();
        let rounds: Vec<f64> = runs.iter().flat_map(|h| h.round_ratios.clone()).collect();
        // The ratio the goal is judged on: over the rounds where there are some.
        let ratio = if rounds.is_empty() {
            median_of(&ratios)
        } else {
            median_of(&rounds)
        };
        let ratio_cell = ratio_cell(&ratios, &rounds, ratio, &last.ratio_is);
        let (goal, met) = match last.goal {
            None => ("—".to_string(), String::new()),
            Some(goal) => {
                let op = if goal.at_least { "≥" } else { "≤" };
                let (text, value) = match goal.on {
                    GoalOn::Ratio => (format!("{op} {}x", ratio_text(goal.value)), ratio),
                    GoalOn::Ours => (format!("{op} {}", figure(goal.value, &last.unit)), ours),
                };
                (text, if goal.met_by(value) { "✔" } else { "✗" }.to_string())
            }
        };
        rows.push(format!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            last.what,
            figure(ours, &last.unit),
            baseline,
            ratio_cell,
            goal,
            met,
            page
        ));
    }
    Ok(rows)
}

/// The ratio's cell: its median, its range and what it is over (the runs'
/// ratios, or the rounds' where the runs have rounds).
fn ratio_cell(ratios: &[f64], rounds: &[f64], median: f64, how: &str) -> String {
    if ratios.is_empty() {
        return "—".to_string();
    }
    let runs = ratios.len();
    let runs_word = if runs == 1 { "run" } else { "runs" };
    let (samples, count) = if rounds.is_empty() {
        (ratios, format!("{runs} {runs_word}"))
    } else {
        (
            rounds,
            format!("{} rounds in {runs} {runs_word}", rounds.len()),
        )
    };
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let range = if ratio_text(min) == ratio_text(max) {
        ratio_text(min)
    } else {
        format!("{}–{}", ratio_text(min), ratio_text(max))
    };
    let how = if how == "ours / baseline" {
        String::new()
    } else {
        format!(" ({how})")
    };
    format!("{}x [{range}, {count}]{how}", ratio_text(median))
}

/// A ratio to two decimals.
fn ratio_text(r: f64) -> String {
    format!("{r:.2}")
}

/// A figure with its unit, to about three significant digits.
pub fn figure(v: f64, unit: &str) -> String {
    if unit == "%" {
        return format!("{v:.1}%");
    }
    let a = v.abs();
    let number = if a >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1} k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    if unit.is_empty() {
        number
    } else {
        format!("{number} {unit}")
    }
}

/// The generated table in `markdown` (from [`BEGIN`] to [`END`]).
pub fn extract(markdown: &str) -> Result<&str> {
    let start = markdown
        .find(BEGIN)
        .context("no generated table in the Markdown (its first line is missing)")?;
    let end = markdown[start..]
        .find(END)
        .context("the generated table has no end line")?
        + start
        + END.len();
    let end = if markdown[end..].starts_with('\n') {
        end + 1
    } else {
        end
    };
    Ok(&markdown[start..end])
}

/// `markdown` with its generated table replaced by `table`.
pub fn splice(markdown: &str, table: &str) -> Result<String> {
    let old = extract(markdown)?;
    let start = markdown.find(old).expect("extracted from it");
    Ok(format!(
        "{}{table}{}",
        &markdown[..start],
        &markdown[start + old.len()..]
    ))
}

/// `l2arc-bench table`: regenerates the table in `doc` from the reports in
/// `reports`; with `check`, fails if the file's table differs instead.
pub fn run(doc: &Path, reports: &Path, check: bool) -> Result<()> {
    let table = render(&read_reports(reports)?)?;
    let markdown =
        std::fs::read_to_string(doc).with_context(|| format!("cannot read {}", doc.display()))?;
    if check {
        if extract(&markdown)? != table {
            bail!(
                "the table in {} is not the one the reports in {} make: run `cargo run --release -p l2arc-bench -- table`",
                doc.display(),
                reports.display()
            );
        }
        return Ok(());
    }
    let updated = splice(&markdown, &table)?;
    if updated != markdown {
        std::fs::write(doc, updated).with_context(|| format!("cannot write {}", doc.display()))?;
    }
    println!("{}", table.trim_end());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::Goal;
    use serde_json::json;

    fn run_with(ratio: f64, rounds: Vec<f64>) -> Value {
        let h = Headline::versus(
            "qd1_4k",
            "4 KiB QD1",
            "IOPS",
            (ratio * 1000.0, "fio", 1000.0),
            Goal::ratio_at_least(0.95),
        )
        .rounds(rounds);
        json!({"stamp": {"commit": "abc"}, "headline": [h]})
    }

    #[test]
    fn medians_ranges_and_goals() {
        let report = Runs {
            scenario: "l2-hit".into(),
            runs: vec![
                run_with(0.90, vec![]),
                run_with(1.00, vec![]),
                run_with(0.97, vec![]),
            ],
        };
        let t = render(&[report]).unwrap();
        assert!(
            t.contains("| 4 KiB QD1 | 970 IOPS | fio: 1000 IOPS | 0.97x [0.90–1.00, 3 runs] | ≥ 0.95x | ✔ | [l2-hit](benchmarks/l2-hit.md) |"),
            "{t}"
        );
        let report = Runs {
            scenario: "l2-hit".into(),
            runs: vec![run_with(0.93, vec![0.9, 0.93, 0.99])],
        };
        let t = render(&[report]).unwrap();
        assert!(
            t.contains("0.93x [0.90–0.99, 3 rounds in 1 run] | ≥ 0.95x | ✗"),
            "{t}"
        );
    }

    #[test]
    fn unstamped_runs_are_refused() {
        let mut run = run_with(1.0, vec![]);
        run["stamp"]["commit"] = json!("unknown");
        let report = Runs {
            scenario: "l2-hit".into(),
            runs: vec![run],
        };
        assert!(render(&[report]).is_err());
    }

    #[test]
    fn splice_replaces_only_the_table() {
        let doc = format!("# B\n\n{BEGIN}\nold\n{END}\n\ntail\n");
        let new = format!("{BEGIN}\nnew\n{END}\n");
        let out = splice(&doc, &new).unwrap();
        assert_eq!(out, format!("# B\n\n{BEGIN}\nnew\n{END}\n\ntail\n"));
        assert_eq!(extract(&out).unwrap(), new);
    }

    #[test]
    fn figures() {
        assert_eq!(figure(123_456.0, "IOPS"), "123.5 k IOPS");
        assert_eq!(figure(2_500_000.0, "hits/s"), "2.50 M hits/s");
        assert_eq!(figure(15.73, "B/record"), "15.7 B/record");
        assert_eq!(figure(99.26, "%"), "99.3%");
    }
}
