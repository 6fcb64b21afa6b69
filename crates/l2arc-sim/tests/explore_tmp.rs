use l2arc_sim::*;
use l2arc_sim::min::*;
use std::path::Path;
const D: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces");
#[test]
fn explore() {
    let t0 = std::time::Instant::now();
    let oltp = load_trace(&Path::new(D).join("OLTP.lis.zst"), TraceFormat::Lis).unwrap();
    println!("oltp {} in {:?}", oltp.len(), t0.elapsed());
    let r = replay_many(&oltp, &[PolicyName::Lru, PolicyName::Arc, PolicyName::Min], &[1000,2000,5000,10000,15000]);
    println!("{}", format_table(&r));
    let next = next_uses(&oltp);
    for c in [1000u64,2000,5000,10000,15000] {
        let a = count_hits(&oltp, &next, c, MinVariant::EvictThenInsert);
        let b = count_hits(&oltp, &next, c, MinVariant::Bypass);
        println!("c={c} evict-then-insert {a} {:.4}  bypass {b} {:.4}", a as f64*100.0/oltp.len() as f64, b as f64*100.0/oltp.len() as f64);
    }
    let t0 = std::time::Instant::now();
    let p3 = load_trace(&Path::new(D).join("P3.lis.zst"), TraceFormat::Lis).unwrap();
    println!("p3 {} in {:?}", p3.len(), t0.elapsed());
    let r = replay_many(&p3, &[PolicyName::Lru, PolicyName::Arc, PolicyName::Min], &[32768]);
    println!("{}", format_table(&r));
    let cp = load_trace(&Path::new(D).join("cloudPhysicsIO.oracleGeneral.bin.zst"), TraceFormat::Oracle).unwrap();
    let sizes: Vec<u64> = (1..=8).map(|i| i*128u64<<20).collect();
    let r = replay_many(&cp, &[PolicyName::Lru, PolicyName::Arc, PolicyName::Min], &sizes);
    for x in &r { println!("{} {} misses {}", x.policy, x.size>>20, x.misses()); }
    let next = next_uses(&cp);
    for &c in &sizes {
        let a = count_hits(&cp, &next, c, MinVariant::EvictThenInsert);
        println!("belady-eti {} misses {}", c>>20, cp.len() as u64 - a);
    }
}
