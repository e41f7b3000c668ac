//! The one table `cargo bench --bench all` prints: each bench's `run`
//! returns its targets as [`Row`]s (a measure, what it came to, the floor,
//! baseline or target it stands next to, and whether it was met), and the
//! `all` bench prints them after the machine's cores and its fdatasync
//! latency. The measures a table needs on every run (the fdatasync of a
//! small write, the build profile) are here too.
//!
//! Every bench includes this file as its own `table` module and names it
//! `crate::table`: run alone a bench's rows are its own; included in `all`,
//! they are `all`'s.

#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

/// One target as a bench measured it.
pub(crate) struct Row {
    /// The bench, as `--bench` names it.
    pub(crate) bench: &'static str,
    /// What was measured.
    pub(crate) measure: String,
    /// What it came to in this run.
    pub(crate) value: String,
    /// The target, floor or baseline it stands next to (measured in the
    /// same run where it is a measure).
    pub(crate) against: String,
    /// Met (`Some(true)`), not met, or a figure with no target (`None`).
    pub(crate) met: Option<bool>,
}

impl Row {
    pub(crate) fn new(
        bench: &'static str,
        measure: impl Into<String>,
        value: impl Into<String>,
        against: impl Into<String>,
        met: Option<bool>,
    ) -> Row {
        Row {
            bench,
            measure: measure.into(),
            value: value.into(),
            against: against.into(),
            met,
        }
    }
}

/// The median time, in µs, of a 100-byte write and `fdatasync` to a file
/// in `dir`: what one synced append cannot beat on that filesystem.
pub(crate) fn fdatasync_us(dir: &Path, samples: usize) -> f64 {
    use std::io::Write;
    let path = dir.join("fdatasync-probe");
    let mut file = std::fs::File::create(&path).unwrap();
    let mut times: Vec<Duration> = (0..samples)
        .map(|i| {
            let t = Instant::now();
            file.write_all(format!("{i:0>100}").as_bytes()).unwrap();
            file.sync_data().unwrap();
            t.elapsed()
        })
        .collect();
    drop(file);
    let _ = std::fs::remove_file(path);
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1e6
}

/// The cargo profile directory this bench binary was built into
/// (`debug` for `--profile dev`, `release` for `cargo bench`'s default).
pub(crate) fn profile() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            // target/<profile>/deps/<bench>-<hash>
            let deps = exe.parent()?;
            Some(deps.parent()?.file_name()?.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// `met`, `NOT met`, or nothing for a figure with no target.
pub(crate) fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "",
    }
}

/// Prints `rows` as one Markdown table.
pub(crate) fn print(rows: &[Row]) {
    println!("| bench | measure | this run | against | |");
    println!("| --- | --- | --- | --- | --- |");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} |",
            r.bench,
            r.measure,
            r.value,
            r.against,
            verdict(r.met)
        );
    }
}
