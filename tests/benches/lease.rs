//! Benchmark of a no-op tool call through a fresh lease, side by side with a
//! raw-wasmtime baseline on the same engine and component, plus the cost of
//! loading a component from the compiled-component cache versus compiling
//! it.
//!
//! `cargo bench -p warden-tests --bench lease` prints medians and p99s.
//! Set `LEASE_BENCH_ITERS` to change the number of measured iterations
//! (default 10,000 per variant, after 1,000 warm-up iterations).

use std::time::{Duration, Instant};

use warden::sandbox::{Capabilities, Limits, Sandbox, SandboxConfig, wit};
use warden_tests::guests;
use wasmtime::Store;
use wasmtime::component::{Component, Linker};

fn main() {
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

    let raw_component = Component::new(&engine, &wasm).unwrap();
    let mut linker: Linker<()> = Linker::new(&engine);
    linker
        .define_unknown_imports_as_traps(&raw_component)
        .unwrap();
    let raw_pre = linker.instantiate_pre(&raw_component).unwrap();
    let tool_index = raw_component
        .get_export_index(None, "warden:plugin/tool@0.1.0")
        .unwrap();
    let invoke_index = raw_component
        .get_export_index(Some(&tool_index), "invoke")
        .unwrap();

    let mut lease = Vec::with_capacity(iters);
    let mut raw = Vec::with_capacity(iters);
    rt.block_on(async {
        for _ in 0..1000 {
            assert!(granted.invoke(&call, None).await.result.unwrap().is_ok());
            raw_once(&raw_pre, invoke_index, &call).await;
        }
        // Interleave in rounds so drift affects both alike.
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
                raw_once(&raw_pre, invoke_index, &call).await;
                raw.push(t.elapsed());
            }
        }
    });

    let (lm, lp) = stats(&mut lease);
    let (rm, rp) = stats(&mut raw);
    println!(
        "no-op tool call, fresh instance per call ({} iterations each):",
        lease.len()
    );
    println!(
        "  warden lease (Store + WASI ctx + limits + receipt): median {:>7.2} µs  p99 {:>7.2} µs",
        us(lm),
        us(lp)
    );
    println!(
        "  raw wasmtime (Store + instantiate + call):          median {:>7.2} µs  p99 {:>7.2} µs",
        us(rm),
        us(rp)
    );
    println!(
        "  ratio lease / raw: median {:.2}x  p99 {:.2}x",
        us(lm) / us(rm),
        us(lp) / us(rp)
    );
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
}

/// Store, instantiate, one call, drop: wasmtime alone.
async fn raw_once(
    pre: &wasmtime::component::InstancePre<()>,
    invoke: wasmtime::component::ComponentExportIndex,
    call: &wit::Call,
) {
    let mut store = Store::new(pre.engine(), ());
    store.set_fuel(u64::MAX).unwrap();
    store.set_epoch_deadline(1_000_000);
    let instance = pre.instantiate_async(&mut store).await.unwrap();
    let func = instance
        .get_typed_func::<(&wit::Call,), (Result<wit::ToolOutput, wit::ToolError>,)>(
            &mut store, invoke,
        )
        .unwrap();
    let (out,) = func.call_async(&mut store, (call,)).await.unwrap();
    assert!(out.is_ok());
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
