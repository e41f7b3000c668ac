//! Benchmark of a no-op tool call through a fresh lease, side by side with
//! two raw-wasmtime baselines running the same component, plus the cost of
//! loading a component from the compiled-component cache versus compiling
//! it.
//!
//! The baselines: raw wasmtime on Warden's own engine (store, instantiate,
//! call, drop: what the lease adds to it is Warden's), and raw wasmtime on
//! an engine configured the way wasmtime's guide to fast instantiation
//! recommends (pooling allocator, copy-on-write memory images, linear
//! memory and tables kept resident and reset through `PAGEMAP_SCAN`,
//! batched decommits), with the same fuel and epoch instrumentation, which
//! Warden's limits need. A third engine, for reference only (wasmtime runs
//! it only with the Spectre mitigations of memory accesses off, which
//! Warden keeps), is the tuned one with explicit bounds checks instead of
//! guard pages: what the two `mprotect` calls (and their TLB flushes) of
//! every instance with guard pages cost here (the pool shrinks a reused memory back to its initial
//! size, and the guest's first `memory.grow` opens it again). A breakdown
//! times each part of a lease-shaped call (WASI context, store,
//! instantiate, call, drop) on each engine.
//!
//! `cargo bench -p warden-tests --bench lease` prints medians and p99s.
//! Set `LEASE_BENCH_ITERS` to change the number of measured iterations
//! (default 10,000 per variant, after 1,000 warm-up iterations).

use std::time::{Duration, Instant};

use warden::sandbox::{Capabilities, Limits, Sandbox, SandboxConfig, wit};
use warden_tests::guests;
use wasmtime::component::{Component, ComponentExportIndex, InstancePre, Linker, ResourceTable};
use wasmtime::{Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder};

#[path = "table.rs"]
mod table;
use crate::table::Row;

fn main() {
    run();
}

/// Measures and prints; returns the targets for the table.
pub(crate) fn run() -> Vec<Row> {
    let iters: usize = std::env::var("LEASE_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cache = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(SandboxConfig {
        cache_dir: Some(cache.path().to_owned()),
        ..SandboxConfig::default()
    })
    .unwrap();
    let wasm = std::fs::read(guests::NOOP).unwrap();

    // --- compile vs cache hit ---
    let engine = sandbox.engine().clone();
    let compile = sample(20, || {
        Component::new(&engine, &wasm).unwrap();
    });
    let _ = sandbox.load("noop", &wasm, None).unwrap(); // fills the cache
    let cached = sample(200, || {
        sandbox.load("noop", &wasm, None).unwrap();
    });
    let hostile = std::fs::read(guests::HOSTILE).unwrap();
    let compile_big = sample(5, || {
        Component::new(&engine, &hostile).unwrap();
    });
    let _ = sandbox.load("hostile", &hostile, None).unwrap();
    let cached_big = sample(50, || {
        sandbox.load("hostile", &hostile, None).unwrap();
    });

    // --- fresh lease vs raw wasmtime ---
    let component = sandbox.load("noop", &wasm, None).unwrap();
    let granted = sandbox.grant(&component, Capabilities::none(), Limits::default());
    let call = wit::Call {
        id: "c".into(),
        run_id: "r".into(),
        tool: "noop".into(),
        arguments: "{}".into(),
        idempotency_key: "k".into(),
    };
    let own = Raw::new(&engine, &wasm);
    let tuned = Raw::new(&tuned_engine(), &wasm);
    let checked = Raw::new(&bounds_checked_engine(), &wasm);

    let mut lease = Vec::with_capacity(iters);
    let mut raw_own = Vec::with_capacity(iters);
    let mut raw_tuned = Vec::with_capacity(iters);
    let mut raw_checked = Vec::with_capacity(iters);
    let mut parts_own = Parts::default();
    let mut parts_tuned = Parts::default();
    let mut parts_checked = Parts::default();
    rt.block_on(async {
        for _ in 0..1000 {
            assert!(granted.invoke(&call, None).await.result.unwrap().is_ok());
            own.once(&call).await;
            tuned.once(&call).await;
            checked.once(&call).await;
            own.timed(&call, &mut Parts::default()).await;
            tuned.timed(&call, &mut Parts::default()).await;
            checked.timed(&call, &mut Parts::default()).await;
        }
        // Interleave in rounds so drift affects every variant alike.
        let rounds = 10;
        for _ in 0..rounds {
            for _ in 0..iters / rounds {
                let t = Instant::now();
                let r = granted.invoke(&call, None).await;
                lease.push(t.elapsed());
                assert!(matches!(r.result, Ok(Ok(_))));
            }
            for _ in 0..iters / rounds {
                let t = Instant::now();
                own.once(&call).await;
                raw_own.push(t.elapsed());
            }
            for _ in 0..iters / rounds {
                let t = Instant::now();
                tuned.once(&call).await;
                raw_tuned.push(t.elapsed());
            }
            for _ in 0..iters / rounds {
                let t = Instant::now();
                checked.once(&call).await;
                raw_checked.push(t.elapsed());
            }
            for _ in 0..iters / rounds {
                own.timed(&call, &mut parts_own).await;
            }
            for _ in 0..iters / rounds {
                tuned.timed(&call, &mut parts_tuned).await;
            }
            for _ in 0..iters / rounds {
                checked.timed(&call, &mut parts_checked).await;
            }
        }
    });

    let (lm, lp) = stats(&mut lease);
    let (om, op) = stats(&mut raw_own);
    let (tm, tp) = stats(&mut raw_tuned);
    let (cm, cp) = stats(&mut raw_checked);
    println!(
        "no-op tool call, fresh instance per call ({} iterations each):",
        lease.len()
    );
    println!(
        "  warden lease (WASI ctx + store + limits + call + receipt): median {:>7.2} µs  p99 {:>7.2} µs",
        us(lm),
        us(lp)
    );
    println!(
        "  raw wasmtime, Warden's engine (store + instantiate + call): median {:>7.2} µs  p99 {:>7.2} µs",
        us(om),
        us(op)
    );
    println!(
        "  raw wasmtime, tuned engine (fast-instantiation settings):   median {:>7.2} µs  p99 {:>7.2} µs",
        us(tm),
        us(tp)
    );
    println!(
        "  raw wasmtime, tuned, explicit bounds checks (reference):   median {:>7.2} µs  p99 {:>7.2} µs",
        us(cm),
        us(cp)
    );
    println!(
        "  ratio lease / raw on Warden's engine: median {:.2}x  p99 {:.2}x",
        us(lm) / us(om),
        us(lp) / us(op)
    );
    println!(
        "  ratio lease / raw on the tuned engine: median {:.2}x  p99 {:.2}x  (target: <= 1.20x, and <= 15 µs)",
        us(lm) / us(tm),
        us(lp) / us(tp)
    );
    println!("  breakdown of a lease-shaped raw call, medians in µs:");
    println!(
        "    {:<16} {:>9} {:>9} {:>12} {:>9} {:>9} {:>9}",
        "engine", "WASI ctx", "store", "instantiate", "call", "drop", "sum"
    );
    for (name, parts) in [
        ("Warden's", &mut parts_own),
        ("tuned", &mut parts_tuned),
        ("bounds-checked", &mut parts_checked),
    ] {
        let m = parts.medians();
        println!(
            "    {:<16} {:>9.2} {:>9.2} {:>12.2} {:>9.2} {:>9.2} {:>9.2}",
            name,
            m[0],
            m[1],
            m[2],
            m[3],
            m[4],
            m.iter().sum::<f64>()
        );
    }
    println!("component load (noop, {} KB):", wasm.len() / 1024);
    println!(
        "  compile (Component::new):      median {:>9.2} µs",
        us(compile)
    );
    println!(
        "  Sandbox::load from cache:      median {:>9.2} µs  ({:.0}x faster)",
        us(cached),
        us(compile) / us(cached)
    );
    println!("component load (hostile, {} KB):", hostile.len() / 1024);
    println!(
        "  compile (Component::new):      median {:>9.2} µs",
        us(compile_big)
    );
    println!(
        "  Sandbox::load from cache:      median {:>9.2} µs  ({:.0}x faster)",
        us(cached_big),
        us(compile_big) / us(cached_big)
    );
    let ratio = us(lm) / us(tm);
    vec![
        Row::new(
            "lease",
            "no-op tool call through a fresh lease, median",
            format!("{:.1} µs", us(lm)),
            // What bounds it: wasmtime alone on the tuned engine; below
            // it only without guard pages, which costs the Spectre
            // mitigations.
            format!(
                "≤ 15 µs (raw tuned: {:.1} µs; bounds-checked, Spectre mitigations off, not used: {:.1} µs)",
                us(tm),
                us(cm)
            ),
            Some(us(lm) <= 15.0),
        ),
        Row::new(
            "lease",
            "lease / raw wasmtime on the tuned engine",
            format!("{ratio:.2}×"),
            format!("≤ 1.2× (tuned: {:.1} µs)", us(tm)),
            Some(ratio <= 1.2),
        ),
    ]
}

/// An engine set up as wasmtime's guide to fast instantiation recommends,
/// keeping the fuel and epoch checks every Warden lease needs.
fn tuned_engine() -> Engine {
    let mut c = wasmtime::Config::new();
    c.wasm_component_model(true);
    c.consume_fuel(true);
    c.epoch_interruption(true);
    c.memory_init_cow(true);
    c.allocation_strategy(InstanceAllocationStrategy::Pooling(tuned_pool()));
    Engine::new(&c).unwrap()
}

/// The tuned engine's pool.
fn tuned_pool() -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(128);
    pool.total_core_instances(128 * 8);
    pool.total_memories(128 * 2);
    pool.total_tables(128 * 8);
    pool.total_stacks(128);
    pool.max_memory_size(1 << 30);
    pool.linear_memory_keep_resident(16 << 20);
    pool.table_keep_resident(1 << 20);
    pool.pagemap_scan(Enabled::Auto);
    pool.decommit_batch_size(32);
    pool
}

/// The tuned engine with explicit bounds checks: no guard pages and no
/// signal handlers, so the pool never changes a memory's protection between
/// instances (a memory stays accessible up to the most any instance grew
/// it, behind the checks, and is reset all the same). Compiled code then
/// checks every access; a reference for what guard pages cost a short
/// lease on this machine, not a configuration Warden uses: without signal
/// handlers wasmtime turns the Spectre mitigations of heap and table
/// accesses off (it refuses them on), and Warden keeps them against hostile
/// plugins.
fn bounds_checked_engine() -> Engine {
    let mut c = wasmtime::Config::new();
    c.wasm_component_model(true);
    c.consume_fuel(true);
    c.epoch_interruption(true);
    c.memory_init_cow(true);
    c.signals_based_traps(false);
    c.memory_guard_size(0);
    c.guard_before_linear_memory(false);
    c.memory_reservation(1 << 30);
    c.allocation_strategy(InstanceAllocationStrategy::Pooling(tuned_pool()));
    Engine::new(&c).unwrap()
}

/// Raw wasmtime calling the no-op component's `invoke` export.
struct Raw {
    pre: InstancePre<Data>,
    invoke: ComponentExportIndex,
}

/// What a lease-shaped store holds: a WASI context and its table.
struct Data {
    _wasi: Option<WasiCtx>,
    _table: ResourceTable,
}

type Invoke = (Result<wit::ToolOutput, wit::ToolError>,);

impl Raw {
    fn new(engine: &Engine, wasm: &[u8]) -> Raw {
        let component = Component::new(engine, wasm).unwrap();
        let mut linker: Linker<Data> = Linker::new(engine);
        linker.define_unknown_imports_as_traps(&component).unwrap();
        let pre = linker.instantiate_pre(&component).unwrap();
        let tool = component
            .get_export_index(None, "warden:plugin/tool@0.1.0")
            .unwrap();
        let invoke = component.get_export_index(Some(&tool), "invoke").unwrap();
        Raw { pre, invoke }
    }

    /// Store, instantiate, one call, drop: wasmtime alone.
    async fn once(&self, call: &wit::Call) {
        let data = Data {
            _wasi: None,
            _table: ResourceTable::new(),
        };
        let mut store = Store::new(self.pre.engine(), data);
        store.set_fuel(u64::MAX).unwrap();
        store.set_epoch_deadline(1_000_000);
        let instance = self.pre.instantiate_async(&mut store).await.unwrap();
        let func = instance
            .get_typed_func::<(&wit::Call,), Invoke>(&mut store, self.invoke)
            .unwrap();
        let (out,) = func.call_async(&mut store, (call,)).await.unwrap();
        assert!(out.is_ok());
    }

    /// The same with a WASI context built as a lease builds one (captured
    /// stdout and stderr), each part timed.
    async fn timed(&self, call: &wit::Call, parts: &mut Parts) {
        let t0 = Instant::now();
        let mut builder = WasiCtxBuilder::new();
        builder.stdout(MemoryOutputPipe::new(1 << 20));
        builder.stderr(MemoryOutputPipe::new(1 << 20));
        let data = Data {
            _wasi: Some(builder.build()),
            _table: ResourceTable::new(),
        };
        let t1 = Instant::now();
        let mut store = Store::new(self.pre.engine(), data);
        store.set_fuel(u64::MAX).unwrap();
        store.set_epoch_deadline(1_000_000);
        let t2 = Instant::now();
        let instance = self.pre.instantiate_async(&mut store).await.unwrap();
        let t3 = Instant::now();
        let func = instance
            .get_typed_func::<(&wit::Call,), Invoke>(&mut store, self.invoke)
            .unwrap();
        let (out,) = func.call_async(&mut store, (call,)).await.unwrap();
        let t4 = Instant::now();
        drop(store);
        let t5 = Instant::now();
        assert!(out.is_ok());
        for (i, (a, b)) in [(t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5)]
            .into_iter()
            .enumerate()
        {
            parts.0[i].push(b - a);
        }
    }
}

/// Times of each part of a call: WASI context, store, instantiate, call,
/// drop.
#[derive(Default)]
struct Parts([Vec<Duration>; 5]);

impl Parts {
    fn medians(&mut self) -> [f64; 5] {
        self.0.each_mut().map(|v| us(stats(v).0))
    }
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

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
