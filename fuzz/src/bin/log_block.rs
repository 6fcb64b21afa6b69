//! AFL++ harness for the `log_block` target of crates/l2arc-fuzz (why and how: its lib.rs).

fn main() {
    afl::fuzz!(|data: &[u8]| l2arc_fuzz::log_block(data));
}
