//! The same tool plugin in each language, side by side: the scaffold of
//! `warden plugin new --lang rust|python|js`, built with `warden plugin
//! build`, then per component: its size, its compile time (optimised, as
//! Warden compiles, and quick, `SandboxConfig::quick_compile_bytes`), its
//! load time from the compiled-component
//! cache, and a no-op call (`greet`) through a fresh lease, with ratios
//! against the Rust guest.
//!
//! A Python or JavaScript component carries its interpreter (CPython,
//! SpiderMonkey) and a snapshot of its initialised heap. What the pooling
//! allocator and copy-on-write memory images make of that is measured
//! directly: instantiating each component on Warden's engine (pooling,
//! copy-on-write images), on an on-demand engine with copy-on-write
//! images, and on one without them, where every instance copies its data
//! segments.
//!
//! `cargo bench -p warden-tests --bench guests`. Needs what the scaffolds' builds
//! need: the `wasm32-wasip2` target, componentize-py and wasm-tools
//! (PyPI), and the JavaScript build tools in `target/js-tools` (`.ci/run`
//! installs them). Set `GUEST_BENCH_ITERS` for the number of measured
//! calls per component (default 200, after 20 warm-up calls).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use warden::sandbox::{Capabilities, Limits, Sandbox, SandboxConfig, wit};
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, InstanceAllocationStrategy, Store};

#[path = "table.rs"]
mod table;
use crate::table::Row;

const LANGS: [&str; 3] = ["rust", "python", "js"];

fn main() {
    run();
}

/// Measures and prints; returns each figure, per language, for the table.
pub(crate) fn run() -> Vec<Row> {
    let iters: usize = std::env::var("GUEST_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let warden = warden_binary();
    let components: Vec<Vec<u8>> = LANGS
        .iter()
        .map(|lang| build(&warden, work.path(), lang))
        .collect();

    let mut rows: Vec<(&str, [f64; 3], &str)> = Vec::new();
    let sizes = components.map_ref(|w| w.len() as f64 / 1024.0);
    rows.push(("component size", sizes, "KiB"));

    // Compile: optimised (as every Warden command compiles), then quick
    // (`SandboxConfig::quick_compile_bytes`, which no command sets).
    let optimised = sandbox(None, None);
    let mut compiled = Vec::new();
    let compile = components.map_ref(|w| {
        let t = Instant::now();
        compiled.push(optimised.engine().precompile_component(w).unwrap());
        ms(t.elapsed())
    });
    rows.push(("compile, optimised", compile, "ms"));
    let quick = sandbox(None, Some(0));
    let quick_compile = components.map_ref(|w| {
        let t = Instant::now();
        quick.load("guest", w, None).unwrap();
        ms(t.elapsed())
    });
    rows.push(("compile, quick", quick_compile, "ms"));

    // Load from the cache: the compiled code is read and mapped.
    let cache = tempfile::tempdir().unwrap();
    let cached = sandbox(Some(cache.path()), None);
    let load = components.map_ref(|w| {
        cached.load("guest", w, None).unwrap();
        ms(sample(20, || {
            cached.load("guest", w, None).unwrap();
        }))
    });
    rows.push(("load, cache hit", load, "ms"));

    // A no-op call through a fresh lease, on optimised code.
    let call = wit::Call {
        id: "call-1".into(),
        run_id: "bench".into(),
        tool: "greet".into(),
        arguments: r#"{"name": "ada"}"#.into(),
        idempotency_key: "bench/call-1".into(),
    };
    let limits = Limits {
        fuel: Some(10_000_000_000),
        timeout: Duration::from_secs(30),
        memory_bytes: 256 << 20,
        ..Limits::default()
    };
    let mut medians = [0.0; 3];
    let mut p99s = [0.0; 3];
    let mut fuel = [0.0; 3];
    let mut memory = [0.0; 3];
    for (i, wasm) in components.iter().enumerate() {
        let component = cached.load("guest", wasm, None).unwrap();
        let granted = cached.grant(&component, Capabilities::none(), limits.clone());
        let mut times = rt.block_on(async {
            for _ in 0..20 {
                let r = granted.invoke(&call, None).await;
                assert!(matches!(r.result, Ok(Ok(_))), "{:?}", r.result);
            }
            let mut times = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = Instant::now();
                let r = granted.invoke(&call, None).await;
                times.push(t.elapsed());
                fuel[i] = r.receipt.fuel_consumed as f64;
                memory[i] = r.receipt.peak_memory_bytes as f64 / (1 << 20) as f64;
            }
            times
        });
        let (m, p) = stats(&mut times);
        medians[i] = ms(m);
        p99s[i] = ms(p);
    }
    rows.push(("no-op call, fresh lease (median)", medians, "ms"));
    rows.push(("no-op call, fresh lease (p99)", p99s, "ms"));
    rows.push(("fuel of the call", fuel, ""));
    rows.push(("peak memory of the call", memory, "MiB"));

    // Instantiation alone, on three engines: Warden's, and two on-demand
    // engines with Warden's features (so its code loads into the first).
    let on_demand = |cow: bool| {
        let mut c = wasmtime::Config::new();
        c.wasm_component_model(true);
        c.consume_fuel(true);
        c.epoch_interruption(true);
        c.wasm_memory64(false);
        c.wasm_tail_call(false);
        c.wasm_relaxed_simd(false);
        c.wasm_custom_page_sizes(false);
        c.wasm_wide_arithmetic(false);
        c.memory_init_cow(cow);
        // Code quality does not matter to instantiation: compile fast.
        c.cranelift_opt_level(wasmtime::OptLevel::None);
        c.allocation_strategy(InstanceAllocationStrategy::OnDemand);
        Engine::new(&c).unwrap()
    };
    let cow = on_demand(true);
    let copy = on_demand(false);
    let engines: [(&str, &Engine, bool); 3] = [
        (
            "instantiate, Warden's pool + CoW images",
            optimised.engine(),
            true,
        ),
        ("instantiate, on demand + CoW images", &cow, true),
        ("instantiate, on demand, no CoW", &copy, false),
    ];
    for (label, engine, reuse) in engines {
        let mut i = 0;
        let times = components.map_ref(|w| {
            let component = if reuse {
                deserialize(engine, &compiled[i])
            } else {
                Component::new(engine, w).unwrap()
            };
            i += 1;
            let mut linker: Linker<()> = Linker::new(engine);
            linker.define_unknown_imports_as_traps(&component).unwrap();
            let pre = linker.instantiate_pre(&component).unwrap();
            rt.block_on(async {
                let mut v = Vec::new();
                for round in 0..60 {
                    let mut store = Store::new(engine, ());
                    store.set_fuel(u64::MAX).unwrap();
                    store.set_epoch_deadline(1_000_000);
                    let t = Instant::now();
                    pre.instantiate_async(&mut store).await.unwrap();
                    drop(store);
                    if round >= 10 {
                        v.push(t.elapsed());
                    }
                }
                ms(stats(&mut v).0)
            })
        });
        rows.push((label, times, "ms"));
    }

    println!("the scaffold's tool plugin per language (ratio to Rust in parentheses):");
    println!(
        "{:<42} {:>20} {:>20} {:>20}",
        "", "Rust", "Python", "JavaScript"
    );
    let mut table = Vec::new();
    for (label, values, unit) in rows {
        let cell = |i: usize| {
            let v = values[i];
            let text = if v >= 100.0 {
                format!("{v:.0} {unit}")
            } else {
                format!("{v:.2} {unit}")
            };
            if i == 0 || values[0] == 0.0 {
                text
            } else {
                format!("{text} ({:.0}×)", v / values[0])
            }
        };
        println!(
            "{label:<42} {:>20} {:>20} {:>20}",
            cell(0),
            cell(1),
            cell(2)
        );
        table.push(Row::new(
            "guests",
            format!("{label}: Python, JavaScript"),
            format!("{}, {}", cell(1), cell(2)),
            format!("Rust: {}", cell(0)),
            None,
        ));
    }
    table
}

trait MapRef<T> {
    fn map_ref(&self, f: impl FnMut(&T) -> f64) -> [f64; 3];
}

impl<T> MapRef<T> for Vec<T> {
    fn map_ref(&self, mut f: impl FnMut(&T) -> f64) -> [f64; 3] {
        [f(&self[0]), f(&self[1]), f(&self[2])]
    }
}

#[allow(unsafe_code)]
fn deserialize(engine: &Engine, code: &[u8]) -> Component {
    // SAFETY: `code` is what `precompile_component` of Warden's engine just
    // made, in this process; wasmtime checks the engine is compatible.
    unsafe { Component::deserialize(engine, code) }.unwrap()
}

fn sandbox(cache: Option<&Path>, quick: Option<u64>) -> Sandbox {
    Sandbox::new(SandboxConfig {
        cache_dir: cache.map(Path::to_owned),
        quick_compile_bytes: quick,
        ..SandboxConfig::default()
    })
    .unwrap()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// target/<profile>/deps/guests-<hash> → target/<profile>
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The `warden` binary Cargo built for this run (`warden-under-test`, the
/// CLI's `main` in this package).
fn warden_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_warden-under-test"))
}

/// The scaffold of `lang`, created and built in `root`; its component.
fn build(warden: &Path, root: &Path, lang: &str) -> Vec<u8> {
    let target = profile_dir().parent().unwrap().to_path_buf();
    let run = |args: &[&str], dir: &Path| {
        let mut cmd = Command::new(warden);
        for var in warden_build_support::LEAKING_ENV {
            cmd.env_remove(var);
        }
        let out = cmd
            .args(args)
            .current_dir(dir)
            .env("CARGO_TARGET_DIR", &target)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "warden {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let name = format!("bench-{lang}");
    let checkout = repo();
    let mut new = vec!["plugin", "new", &name, "--lang", lang];
    if lang == "rust" {
        new.extend(["--warden-path", checkout.to_str().unwrap()]);
    }
    run(&new, root);
    let dir = root.join(&name);
    if lang == "js" {
        let tools = target.join("js-tools/node_modules");
        assert!(
            tools.join(".bin/componentize-js").is_file(),
            "the JavaScript build tools are not in {} (.ci/run installs them)",
            tools.display()
        );
        std::os::unix::fs::symlink(&tools, dir.join("node_modules")).unwrap();
    }
    let t = Instant::now();
    run(&["plugin", "build"], &dir);
    eprintln!("built the {lang} scaffold in {:.1?}", t.elapsed());
    std::fs::read(dir.join(format!("{name}.wasm"))).unwrap()
}

fn sample(n: usize, mut f: impl FnMut()) -> Duration {
    let mut v: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    stats(&mut v).0
}

fn stats(v: &mut [Duration]) -> (Duration, Duration) {
    v.sort();
    let median = v[v.len() / 2];
    let p99 = v[(v.len() * 99 / 100).min(v.len() - 1)];
    (median, p99)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
