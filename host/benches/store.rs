//! Event store benchmarks (being written).

fn main() {}
