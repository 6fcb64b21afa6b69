//! The scenarios, one module each, behind one trait ([`Scenario`]).
//!
//! A scenario measures ours and its baseline side by side and returns an
//! [`Outcome`]: its report (what `--json` prints, serializable), the
//! headline figures the table in `docs/benchmarks.md` is made of, the
//! human table, and for the seed experiments an HTML page. Printing,
//! stamping (commit, date, load average, arguments) and writing report
//! files happen once, in `lib.rs`, for every scenario alike.

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::BenchArgs;

pub(crate) mod demo;
pub(crate) mod feed_capture;
pub(crate) mod fleet;
pub(crate) mod fuse;
pub(crate) mod hit_path;
pub(crate) mod l2_hit;
pub(crate) mod l2_index;
pub(crate) mod l2_rebuild;
pub(crate) mod latency;
pub(crate) mod nbd;
pub(crate) mod nbd_connections;
pub(crate) mod nbd_l2_hit;
pub(crate) mod nbd_reread;
pub(crate) mod nbd_warmup;
pub(crate) mod restart;
pub(crate) mod s3;
pub(crate) mod throughput;
pub(crate) mod warmup;

/// One benchmark: what `--scenario NAME` runs.
pub(crate) trait Scenario: Sync {
    /// The `--scenario` value (kebab case).
    fn name(&self) -> &'static str;
    /// What it measures, against what: one line (`--help` prints it).
    fn measures(&self) -> &'static str;
    /// Runs it: both sides measured, the report returned (nothing printed
    /// but progress on stderr and, without `--json`, lines printed as the
    /// scenario goes).
    fn run(&self, args: &BenchArgs) -> Result<Outcome>;
    /// The scenarios this one stands for, run one after another in its
    /// place (`all`: the three seed experiments); empty for a scenario of
    /// its own.
    fn parts(&self) -> &'static [&'static dyn Scenario] {
        &[]
    }
}

/// What a scenario's run produced.
pub(crate) struct Outcome {
    /// The scenario's figures: what `--json` prints (with the stamp and
    /// the headline added).
    pub report: serde_json::Value,
    /// The figures the benchmarks table quotes.
    pub headline: Vec<Headline>,
    /// Prints the human-readable table (without `--json`).
    pub print: Box<dyn FnOnce()>,
    /// An HTML page of charts, written with the JSON into `--report-dir`.
    pub html: Option<String>,
}

impl Outcome {
    /// `report` serialized, and `print` called with it when the table is
    /// wanted.
    pub(crate) fn new<T: Serialize + 'static>(
        report: T,
        headline: Vec<Headline>,
        print: impl FnOnce(&T) + 'static,
    ) -> Result<Self> {
        Ok(Outcome {
            report: serde_json::to_value(&report)?,
            headline,
            print: Box::new(move || print(&report)),
            html: None,
        })
    }

    /// The same with an HTML page for `--report-dir`.
    pub(crate) fn with_html(mut self, html: String) -> Self {
        self.html = Some(html);
        self
    }
}

/// One headline figure: ours, the baseline measured beside it in the same
/// run, and the ratio the goal is stated on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Headline {
    /// Stable name of the figure within its scenario (`qd32_4k`).
    pub key: String,
    /// What is measured, for the table's first column.
    pub what: String,
    /// Unit of `ours` and `baseline` (`IOPS`, `MiB/s`, `s`, `B/record`).
    pub unit: String,
    /// Our figure.
    pub ours: f64,
    /// What we are measured against, in words.
    pub baseline_name: String,
    /// The baseline's figure in the same run (none where the comparison is
    /// a constant or there is no baseline).
    pub baseline: Option<f64>,
    /// The comparison the goal is on (`ours / baseline` unless
    /// `ratio_is` says otherwise); none where there is no baseline.
    pub ratio: Option<f64>,
    /// How the ratio is formed, in words (`ours / baseline`).
    pub ratio_is: String,
    /// Each paired measurement's ratio in this run (the rounds), when the
    /// scenario pairs rounds; the table pools these over runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub round_ratios: Vec<f64>,
    /// The goal, if the project has set one.
    pub goal: Option<Goal>,
}

/// A goal on one figure of a headline.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Goal {
    /// Which figure: the ratio or ours.
    pub on: GoalOn,
    /// At least or at most.
    pub at_least: bool,
    /// The bound.
    pub value: f64,
}

/// Which figure of a headline a goal bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GoalOn {
    /// The ratio.
    Ratio,
    /// Our figure.
    Ours,
}

impl Goal {
    /// The ratio at least `value`.
    pub(crate) fn ratio_at_least(value: f64) -> Option<Goal> {
        Some(Goal {
            on: GoalOn::Ratio,
            at_least: true,
            value,
        })
    }

    /// The ratio at most `value`.
    pub(crate) fn ratio_at_most(value: f64) -> Option<Goal> {
        Some(Goal {
            on: GoalOn::Ratio,
            at_least: false,
            value,
        })
    }

    /// Our figure at least (`at_least`) or at most `value`.
    pub(crate) fn ours(at_least: bool, value: f64) -> Option<Goal> {
        Some(Goal {
            on: GoalOn::Ours,
            at_least,
            value,
        })
    }

    /// Whether `figure` meets it.
    pub fn met_by(&self, figure: f64) -> bool {
        if self.at_least {
            figure >= self.value
        } else {
            figure <= self.value
        }
    }
}

impl Headline {
    /// Ours against a baseline measured beside it: the ratio is ours over
    /// the baseline.
    pub(crate) fn versus(
        key: &str,
        what: &str,
        unit: &str,
        (ours, baseline_name, baseline): (f64, &str, f64),
        goal: Option<Goal>,
    ) -> Headline {
        Headline {
            key: key.to_string(),
            what: what.to_string(),
            unit: unit.to_string(),
            ours,
            baseline_name: baseline_name.to_string(),
            baseline: Some(baseline),
            ratio: Some(ours / baseline),
            ratio_is: "ours / baseline".to_string(),
            round_ratios: Vec::new(),
            goal,
        }
    }

    /// Each round's ratio, for the table's range.
    pub(crate) fn rounds(mut self, ratios: Vec<f64>) -> Headline {
        self.round_ratios = ratios;
        self
    }

    /// The ratio formed otherwise than ours over the baseline.
    pub(crate) fn ratio_is(mut self, ratio: f64, how: &str) -> Headline {
        self.ratio = Some(ratio);
        self.ratio_is = how.to_string();
        self
    }
}

/// A scenario's working directory, removed when dropped: under `--data`
/// when given (made if missing), else a temporary one.
pub(crate) fn work_dir(data: Option<&std::path::Path>) -> Result<tempfile::TempDir> {
    Ok(match data {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            tempfile::tempdir_in(dir)?
        }
        None => tempfile::tempdir()?,
    })
}

/// The middle value (the mean of the middle two for an even count; NaN
/// for none).
pub(crate) fn median_of(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `all`: the three seed experiments, one after another.
pub(crate) struct All;

impl Scenario for All {
    fn name(&self) -> &'static str {
        "all"
    }
    fn measures(&self) -> &'static str {
        "The three seed experiments (throughput, latency, warmup) in one run."
    }
    fn run(&self, _args: &BenchArgs) -> Result<Outcome> {
        anyhow::bail!("`all` runs its parts")
    }
    fn parts(&self) -> &'static [&'static dyn Scenario] {
        &[&throughput::Throughput, &latency::Latency, &warmup::Warmup]
    }
}
