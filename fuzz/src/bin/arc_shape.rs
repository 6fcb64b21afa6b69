//! AFL++ harness for the `arc_shape` target of crates/l2arc-fuzz (why and how: its lib.rs).

fn main() {
    afl::fuzz!(|data: &[u8]| l2arc_fuzz::arc_shape(data));
}
