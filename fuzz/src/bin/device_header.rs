//! AFL++ harness for the `device_header` target of crates/l2arc-fuzz (why and how: its lib.rs).

fn main() {
    afl::fuzz!(|data: &[u8]| l2arc_fuzz::device_header(data));
}
