//! Every bench in one run, then one table: the machine's cores and the
//! fdatasync latency of its temporary directory (where every bench puts
//! its stores) measured first, then each target of issue 22 next to its
//! floor, baseline or bound, as the benches measured them in this run.
//!
//! `cargo bench --profile dev --bench all` from the repository root (the
//! default members: a `-p` selection re-resolves features and rebuilds
//! wasmtime), or `cargo bench --bench all` for an optimised build (longer
//! to build; the table says which profile it came from). Each bench's own
//! settings apply (`LEASE_BENCH_ITERS`, `ENGINE_BENCH_RUNS`, …, see each
//! file); the workers bench needs PostgreSQL (`WARDEN_TEST_POSTGRES`), the
//! guests bench the scaffolds' toolchains.

// Each bench includes `table.rs` for when it runs alone; here those copies
// go unused (every bench names `crate::table`, this file's).
#![allow(dead_code, clippy::duplicate_mod)]

#[path = "engine.rs"]
mod engine;
#[path = "guests.rs"]
mod guests;
#[path = "lease.rs"]
mod lease;
#[path = "mcp_serve.rs"]
mod mcp_serve;
#[path = "model_call.rs"]
mod model_call;
#[path = "plugins.rs"]
mod plugins;
#[path = "sessions.rs"]
mod sessions;
#[path = "../../host/store/benches/store.rs"]
mod store;
mod table;
#[path = "workers.rs"]
mod workers;

use std::time::Instant;

use table::Row;

/// The first line of `/proc/loadavg`: absolute times move with it.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| {
            let mut f = l.split_whitespace();
            Some(format!("{} {} {}", f.next()?, f.next()?, f.next()?))
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// A bench: its name, and its `run`.
type Bench = (&'static str, fn() -> Vec<Row>);

fn main() {
    let began = Instant::now();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let dir = std::env::temp_dir();
    let fsync = table::fdatasync_us(&dir, 200);
    let profile = table::profile();
    let header = format!(
        "{cores} cores; fdatasync of a 100-byte write in {}: median {fsync:.0} µs (200 samples); profile `{profile}`",
        dir.display()
    );
    println!("{header}; load average {}", load());
    let benches: [Bench; 9] = [
        ("lease", lease::run),
        ("plugins", plugins::run),
        ("model_call", model_call::run),
        ("engine", engine::run),
        ("sessions", sessions::run),
        ("mcp_serve", mcp_serve::run),
        ("workers", workers::run),
        ("store", || {
            store::run();
            Vec::new()
        }),
        ("guests", guests::run),
    ];
    let mut rows = Vec::new();
    for (name, run) in benches {
        println!("\n== {name} (load average {}) ==", load());
        let t = Instant::now();
        // A bench that cannot run here (a service or a toolchain missing)
        // says so in the table; the others still run.
        match std::panic::catch_unwind(run) {
            Ok(measured) => rows.extend(measured),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic");
                let why: String = why
                    .replace('\n', " ")
                    .replace('|', "/")
                    .chars()
                    .take(200)
                    .collect();
                rows.push(Row::new(name, "the bench failed", why, "", Some(false)));
            }
        }
        println!("== {name}: {:.0} s ==", t.elapsed().as_secs_f64());
    }
    println!(
        "\n{header}; load average at the end {}; all benches took {:.0} s\n",
        load(),
        began.elapsed().as_secs_f64()
    );
    table::print(&rows);
}
