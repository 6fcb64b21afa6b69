//! FUSE front end (being built).
