//! The replay driver: ordering, parallel/serial agreement, edge cases and
//! the JSON shape.

use l2arc_sim::{PolicyName, ReplayResult, Request, parse_policy_list, replay, replay_many};

/// A deterministic skewed trace: a hot set, a warm set and a scan; object
/// sizes 1..=3 when `sized`, else 1.
fn synthetic(n: usize, sized: bool) -> Vec<Request> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = match x % 10 {
                0..=5 => x % 50,
                6..=8 => 1000 + x % 500,
                _ => 1_000_000 + i as u64,
            };
            Request {
                key,
                size: if sized { 1 + key % 3 } else { 1 },
            }
        })
        .collect()
}

#[test]
fn replay_many_is_policy_major_and_matches_serial_replay() {
    let trace = synthetic(20_000, true);
    let policies = [PolicyName::Min, PolicyName::Lru, PolicyName::Arc];
    let sizes = [300, 10, 100];
    let results = replay_many(&trace, &policies, &sizes);
    let order: Vec<(PolicyName, u64)> = results.iter().map(|r| (r.policy, r.size)).collect();
    let want: Vec<(PolicyName, u64)> = policies
        .iter()
        .flat_map(|&p| sizes.iter().map(move |&s| (p, s)))
        .collect();
    assert_eq!(order, want);
    for r in &results {
        let serial = replay(&trace, r.policy, r.size);
        assert_eq!(serial.hits, r.hits, "{} {}", r.policy, r.size);
        assert_eq!(r.requests, 20_000);
        assert!((r.hit_ratio - r.hits as f64 / 20_000.0).abs() < 1e-12);
        assert!(r.elapsed_secs >= 0.0);
    }
    // Byte-accounted LRU is still a stack algorithm: more cache, more hits.
    assert!(results[4].hits <= results[5].hits && results[5].hits <= results[3].hits);
}

#[test]
fn min_bounds_online_policies_for_unit_sizes() {
    let trace = synthetic(20_000, false);
    let sizes = [10, 100, 300];
    let results = replay_many(
        &trace,
        &[PolicyName::Min, PolicyName::Lru, PolicyName::Arc],
        &sizes,
    );
    for (i, c) in sizes.iter().enumerate() {
        let min = results[i].hits;
        let (lru, arc) = (results[3 + i].hits, results[6 + i].hits);
        assert!(
            lru <= min && arc <= min,
            "c={c}: MIN {min}, LRU {lru}, ARC {arc}"
        );
        assert!(lru > 0 && arc > 0, "c={c}");
    }
    // Unit-size MIN and LRU are stack algorithms.
    assert!(results[0].hits <= results[1].hits && results[1].hits <= results[2].hits);
    assert!(results[3].hits <= results[4].hits && results[4].hits <= results[5].hits);
}

#[test]
fn degenerate_inputs() {
    assert!(replay_many(&[], &[PolicyName::Lru], &[]).is_empty());
    assert!(replay_many(&synthetic(10, true), &[], &[5]).is_empty());
    for p in PolicyName::ALL {
        let empty = replay(&[], p, 100);
        assert_eq!((empty.requests, empty.hits, empty.hit_ratio), (0, 0, 0.0));
        let zero = replay(&synthetic(1000, true), p, 0);
        assert_eq!(zero.hits, 0, "{p} with a zero-size cache");
        // Objects bigger than the cache are misses, never inserted.
        let big = vec![Request { key: 1, size: 10 }; 5];
        assert_eq!(replay(&big, p, 9).hits, 0, "{p}");
        assert_eq!(replay(&big, p, 10).hits, 4, "{p}");
    }
}

#[test]
fn unit_lru_hits_by_hand() {
    let t: Vec<Request> = [1, 2, 3, 1, 4, 1, 2]
        .iter()
        .map(|&key| Request { key, size: 1 })
        .collect();
    // c=3: 1 2 3 | 1 hit | 4 evicts 2 | 1 hit | 2 miss
    assert_eq!(replay(&t, PolicyName::Lru, 3).hits, 2);
    // MIN c=3: 1 2 3 | 1 hit | 4 evicts 3 (never used) | 1 hit | 2 hit
    assert_eq!(replay(&t, PolicyName::Min, 3).hits, 3);
}

#[test]
fn policy_names() {
    for p in PolicyName::ALL {
        assert_eq!(p.to_string().parse::<PolicyName>(), Ok(p));
    }
    assert_eq!("ARC".parse::<PolicyName>(), Ok(PolicyName::Arc));
    assert_eq!("belady".parse::<PolicyName>(), Ok(PolicyName::Min));
    assert_eq!(
        "lfu".parse::<PolicyName>().unwrap_err(),
        "unknown policy `lfu` (expected one of: arc, lru, min)"
    );
    assert_eq!(
        parse_policy_list("arc,lru, min"),
        Ok(vec![PolicyName::Arc, PolicyName::Lru, PolicyName::Min])
    );
    assert!(parse_policy_list("arc,,lru").is_err());
}

#[test]
fn json_shape() {
    let r = ReplayResult {
        policy: PolicyName::Arc,
        size: 1000,
        requests: 10,
        hits: 4,
        hit_ratio: 0.4,
        elapsed_secs: 0.5,
    };
    let v: serde_json::Value = serde_json::to_value(&r).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "policy": "arc", "size": 1000, "requests": 10, "hits": 4,
            "hit_ratio": 0.4, "elapsed_secs": 0.5
        })
    );
    assert_eq!(serde_json::to_string(&PolicyName::Min).unwrap(), "\"min\"");
    assert_eq!(r.misses(), 6);
    assert_eq!(r.requests_per_sec(), 20.0);
}
