//! NBD front end (being built).
