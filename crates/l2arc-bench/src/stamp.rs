//! The stamp every `--json` report carries: which tree ran (the git
//! commit), when (UTC), how loaded the machine was before and after, and
//! the scenario with its arguments.

use anyhow::Result;
use serde_json::{Value, json};

use crate::scenarios::Headline;

/// What is taken before a scenario runs.
pub(crate) struct Before {
    date: String,
    load: String,
}

impl Before {
    pub(crate) fn now() -> Self {
        Before {
            date: utc_now(),
            load: crate::load_average(),
        }
    }
}

/// `report` with a `stamp` and its `headline` added (a report that is a
/// list becomes `{"rows": [...]}`).
pub(crate) fn stamped(
    scenario: &str,
    before: &Before,
    report: Value,
    headline: &[Headline],
) -> Result<Value> {
    let mut object = match report {
        Value::Object(map) => map,
        other => {
            let mut map = serde_json::Map::new();
            map.insert("rows".to_string(), other);
            map
        }
    };
    let (commit, dirty) = commit();
    object.insert(
        "stamp".to_string(),
        json!({
            "scenario": scenario,
            "args": std::env::args().skip(1).collect::<Vec<_>>(),
            "commit": commit,
            "dirty": dirty,
            "date": before.date,
            "load_before": before.load,
            "load_after": crate::load_average(),
        }),
    );
    object.insert("headline".to_string(), serde_json::to_value(headline)?);
    Ok(Value::Object(object))
}

/// The commit this binary was built from and whether `crates/` had
/// uncommitted changes then (`build.rs`): ("unknown", false) when it was
/// not built in a git tree.
fn commit() -> (String, bool) {
    (
        env!("L2ARC_BENCH_COMMIT").to_string(),
        env!("L2ARC_BENCH_DIRTY") == "true",
    )
}

/// Now, UTC, as `2026-11-27T13:54:00Z`.
pub(crate) fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc(secs)
}

/// Seconds since the epoch as a UTC date and time (the civil calendar from
/// days since 1970-01-01, Howard Hinnant's algorithm).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn a_list_report_is_wrapped_and_stamped() {
        let before = Before::now();
        let v = stamped("arc-hit", &before, json!([1, 2]), &[]).unwrap();
        assert_eq!(v["rows"], json!([1, 2]));
        assert_eq!(v["stamp"]["scenario"], "arc-hit");
        assert!(v["stamp"]["commit"].is_string());
        assert!(v["stamp"]["date"].as_str().unwrap().ends_with('Z'));
        assert_eq!(v["headline"], json!([]));
    }
}
