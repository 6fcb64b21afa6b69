//! AFL++ harness for the `nbd_requests` target of crates/l2arc-fuzz (why and how: its lib.rs).

fn main() {
    afl::fuzz!(|data: &[u8]| l2arc_fuzz::nbd_requests(data));
}
