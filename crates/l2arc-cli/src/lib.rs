//! The decoders of the `l2arc` command that take outside bytes — the
//! control socket's command line and the TOML config file — as a library,
//! so that the fuzz targets (crates/l2arc-fuzz) can drive them; the binary
//! (`main.rs`) uses them from here.

pub mod control;
pub mod service;
