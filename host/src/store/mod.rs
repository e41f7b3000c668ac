//! Event stores: the `EventStore` trait, the in-memory store and the SQLite
//! store, with a tamper-evident hash chain per run.
