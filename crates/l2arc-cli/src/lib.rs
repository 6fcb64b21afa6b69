//! The parts of the `l2arc` command that the binary (`main.rs`) and the
//! fuzz targets (crates/l2arc-fuzz) share: the decoders of outside bytes —
//! the control socket's command line and the TOML config file — and the
//! services built on them (the HTTP endpoint and its metrics, which a
//! service starts).

pub mod control;
mod history;
pub mod http;
pub mod log_sink;
pub mod metrics;
pub mod service;
