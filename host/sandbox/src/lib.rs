//! The sandbox: wasmtime engine, component loading and cache, capabilities,
//! limits and leases.
//!
//! Three moments, as in every wasmtime embedding:
//! - **engine** ([`Sandbox::new`]): one per process; component model, async,
//!   fuel, epoch interruption and the pooling allocator, with the wasm
//!   proposals no plugin needs turned off, and an epoch ticker thread;
//! - **load** ([`Sandbox::load`]): the component's sha256 checked against the
//!   manifest, compiled or taken from the on-disk cache, its imports checked
//!   against the allow-list, and one `InstancePre` kept with the export
//!   index of each plugin function;
//!   a huge component may be compiled quickly instead of optimised
//!   ([`SandboxConfig::quick_compile_bytes`]);
//! - **lease** ([`GrantedComponent`] methods): a fresh `Store` and instance
//!   per call, built from the plugin's effective [`Capabilities`] and
//!   [`Limits`], dropped when the call ends, with a [`UsageReceipt`]; a
//!   lease with mounts runs on a lease thread of its own, where its
//!   filesystem calls may block (`lease_threads`).
//!
//! Outbound HTTP (`net`) is linked only for components that import
//! `wasi:http`, and every request is checked against the granted hosts.
//! The `keep-permissions` host import (`permissions`) copies a file's
//! permission bits within the lease's mounts, for atomic replacement.
//! Granted secrets (`secrets`) reach a plugin as handles the host fills in
//! outgoing requests for the secret's hosts only.
//! A component may be given a [`ValidUntil`] (`validity`): once it passes,
//! its leases make no further effect.
//!
//! The sandbox knows nothing about manifests, runs or events.

mod bindings;
mod cache;
mod capabilities;
mod capture;
mod compile;
mod error;
mod exclusions;
mod fs;
mod imports;
mod lease;
mod lease_threads;
mod limits;
mod net;
mod nofollow;
mod permissions;
mod receipt;
mod secrets;
mod validity;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use wasmtime::component::{InstancePre, Linker};
use wasmtime::{
    Enabled, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig,
    RegallocAlgorithm,
};

pub use cache::CacheStatus;
pub use capabilities::{Access, Capabilities, Mount, MountError, is_valid_mount_name};
pub use capture::MIN_REDACTED_LEN;
pub use compile::{CompileCommand, CompileLimit, CompileLimits, run_compile_child};
pub use error::{LeaseError, LeaseFailure, SandboxError};
pub use exclusions::{ExclusionError, Exclusions};
pub use limits::{Limits, PREVIEW_CEILING, RunBound};
pub use net::{DenialReason, HostPattern, NetworkDenial, NetworkUsage, is_public};
pub use nofollow::{NoFollowError, OpenedDir, open_dir as open_dir_nofollow};
pub use receipt::{DeniedGrowth, GrowthResource, Outcome, Provenance, Unlisted, UsageReceipt};
pub use secrets::{Secret, SecretAction, SecretUse};
pub use validity::{Moment, ProcessFence, ValidUntil};

/// The top-level imports of the component `wasm` that the sandbox does not
/// offer, read without compiling it: a loader refuses any such component,
/// naming the first. Builders call this to name them all at build time. The
/// error says why the bytes are not a component.
pub fn refused_imports(wasm: &[u8]) -> Result<Vec<String>, String> {
    Ok(imports::declared(wasm)?
        .into_iter()
        .filter(|i| !imports::is_allowed(i))
        .collect())
}

/// The WIT types plugins exchange with the host.
pub mod wit {
    pub use super::bindings::types::{
        Call, ContextError, ContextItem, ContextRequest, Decision, Delivery, DeliveryError, Effect,
        Failure, LogLevel, PolicyError, PolicyHook, PolicyRequest, Preview, Rejection, SourceSpec,
        ToolError, ToolOutput, ToolSpec,
    };
}

use cache::ComponentCache;
use capture::Redactor;
use lease::{LeaseState, Reach, Request, Response, World, WorldExports};
use net::NetGrant;
use wit::{
    Call, ContextError, ContextItem, ContextRequest, Decision, Delivery, DeliveryError,
    PolicyError, PolicyRequest, Preview, SourceSpec, ToolError, ToolOutput, ToolSpec,
};

/// How the process-wide sandbox is set up.
#[derive(Clone, Debug)]
pub struct SandboxConfig {
    /// Where compiled components are cached. Default: none (compile on every
    /// load).
    pub cache_dir: Option<PathBuf>,
    /// Leases that may run at once; more wait for a slot. Sizes the pooling
    /// allocator, and bounds the lease threads that leases with mounts run
    /// on (a stuck one keeps its slot until it returns). Default: 128.
    pub max_concurrent_leases: u32,
    /// The largest linear memory any plugin may be granted, in bytes.
    /// Default: 1 GiB.
    pub max_memory_bytes: u64,
    /// The largest table any plugin may be granted, in elements. Default:
    /// 100,000.
    pub max_table_elements: u64,
    /// How often the epoch ticks; deadlines are checked at each tick.
    /// Default: 5 ms.
    pub epoch_tick: Duration,
    /// The operator's ceiling for every limit: no manifest or grant gets
    /// more. Default: [`Limits::CEILINGS`].
    pub ceilings: Limits,
    /// Components of at least this many bytes are compiled quickly:
    /// without Cranelift's optimisations and with its single-pass register
    /// allocator. A component carrying an interpreter (CPython, 19 MB;
    /// SpiderMonkey, 13 MB) then compiles several times faster, and its code
    /// runs slower; fuel, epochs and every limit are exactly the same, since
    /// the optimisation level changes no semantics (wasmtime loads either
    /// code into this engine). Quickly compiled code is cached apart from
    /// optimised code, and an optimised entry is preferred when there is
    /// one. Quick code uses more native stack per WebAssembly frame (the
    /// single-pass allocator spills), so a deeply recursive guest exhausts
    /// the stack limit sooner: CPython's abstract-class checks did, in a
    /// call that optimised code serves. Default: `None` (everything
    /// optimised); no Warden command sets it.
    pub quick_compile_bytes: Option<u64>,
    /// How much compiling one component may take (`compile.rs`). Default:
    /// [`CompileLimits::DEFAULT`].
    pub compile_limits: CompileLimits,
    /// The program that compiles components in a child process, where the
    /// compile's time and memory can be bounded. Default: none (compiled
    /// on a thread of this process: its size and time are bounded, and a
    /// compile past its deadline is abandoned, not stopped).
    pub compile_command: Option<CompileCommand>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            cache_dir: None,
            max_concurrent_leases: 128,
            max_memory_bytes: 1 << 30,
            max_table_elements: 100_000,
            epoch_tick: Duration::from_millis(5),
            ceilings: Limits::CEILINGS,
            quick_compile_bytes: None,
            compile_limits: CompileLimits::DEFAULT,
            compile_command: None,
        }
    }
}

/// The process-wide sandbox: one wasmtime engine, its linker and component
/// cache. Cheap to clone.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<SandboxInner>,
}

struct SandboxInner {
    engine: Engine,
    linker: Linker<LeaseState>,
    /// `linker` plus `wasi:http`, for components that import it.
    network_linker: Linker<LeaseState>,
    cache: Option<ComponentCache>,
    lease_slots: Arc<Semaphore>,
    /// Where leases with mounts run, and the account of stuck ones.
    lease_threads: Arc<lease_threads::LeaseThreads>,
    config: SandboxConfig,
    /// The engine quick compiles run on, made on first use: this engine's
    /// configuration with Cranelift's fast settings and no pool (it never
    /// instantiates anything).
    quick: OnceLock<Result<Engine, String>>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Creates the engine, its linker and the epoch ticker.
    pub fn new(config: SandboxConfig) -> Result<Self, SandboxError> {
        let engine = engine(&config).map_err(|e| SandboxError::Engine {
            reason: format!("{e:#}"),
        })?;
        let linker = imports::linker(&engine).map_err(|e| SandboxError::Engine {
            reason: format!("{e:#}"),
        })?;
        let network_linker =
            imports::network_linker(&engine).map_err(|e| SandboxError::Engine {
                reason: format!("{e:#}"),
            })?;
        let cache = match &config.cache_dir {
            Some(dir) => Some(ComponentCache::new(dir.clone(), &engine)?),
            None => None,
        };
        start_epoch_ticker(&engine, config.epoch_tick);
        Ok(Sandbox {
            inner: Arc::new(SandboxInner {
                engine,
                linker,
                network_linker,
                cache,
                lease_slots: Arc::new(Semaphore::new(config.max_concurrent_leases as usize)),
                lease_threads: Arc::default(),
                config,
                quick: OnceLock::new(),
            }),
        })
    }

    /// The configuration the sandbox was made with.
    pub fn config(&self) -> &SandboxConfig {
        &self.inner.config
    }

    /// The wasmtime engine, for embedders that measure or extend it.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Loads a component: checks `wasm` against `expected_sha256` (hex) when
    /// given, refuses it if it imports anything the sandbox does not offer
    /// (read from its bytes before compiling, and again from the compiled
    /// component), compiles it or takes it from the cache, and prepares its
    /// `InstancePre` and the export index of each function of each plugin
    /// world it exports. Only a component that imports `wasi:http` is linked
    /// against it.
    ///
    /// Compiling is CPU-heavy; call it from a blocking context.
    pub fn load(
        &self,
        name: &str,
        wasm: &[u8],
        expected_sha256: Option<&str>,
    ) -> Result<PluginComponent, SandboxError> {
        let sha256 = hex::encode(Sha256::digest(wasm));
        if let Some(expected) = expected_sha256
            && !expected.eq_ignore_ascii_case(&sha256)
        {
            return Err(SandboxError::IntegrityMismatch {
                plugin: name.to_owned(),
                expected: expected.to_owned(),
                actual: sha256,
            });
        }
        // Refuse on the declared names before compiling; the compiled
        // component's own import list is checked again below.
        let declared = imports::declared(wasm).map_err(|reason| SandboxError::Compile {
            plugin: name.to_owned(),
            reason,
        })?;
        if let Some(import) = declared.iter().find(|i| !imports::is_allowed(i)) {
            tracing::warn!(plugin = name, import = %import, "component refused before compiling: disallowed import");
            return Err(SandboxError::DisallowedImport {
                plugin: name.to_owned(),
                import: import.clone(),
            });
        }
        let limits = &self.inner.config.compile_limits;
        if wasm.len() as u64 > limits.max_bytes {
            return Err(compile::too_large(name, wasm.len() as u64, limits));
        }
        let engine = &self.inner.engine;
        let quick = match self.inner.config.quick_compile_bytes {
            Some(min) if wasm.len() as u64 >= min => Some(self.quick_engine(name)?.clone()),
            _ => None,
        };
        let compile = || {
            let (owned, quick_engine) = (engine.clone(), quick.clone());
            let (plugin, bytes) = (name.to_owned(), wasm.to_vec());
            compile::bounded(
                name,
                wasm,
                limits,
                self.inner.config.compile_command.as_ref(),
                quick.is_some(),
                engine,
                move || cache::compile(&owned, quick_engine.as_ref(), &plugin, &bytes),
            )
        };
        let (component, cache_status) = match &self.inner.cache {
            Some(cache) => {
                cache.load_or_compile(engine, quick.is_some(), name, &sha256, compile)?
            }
            None => (compile()?, CacheStatus::Uncached),
        };
        let ty = component.component_type();
        let imports: Vec<String> = ty.imports(engine).map(|(n, _)| n.to_owned()).collect();
        let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_owned()).collect();
        if let Some(import) = imports.iter().find(|i| !imports::is_allowed(i)) {
            tracing::warn!(plugin = name, import = %import, "component refused: disallowed import");
            return Err(SandboxError::DisallowedImport {
                plugin: name.to_owned(),
                import: import.clone(),
            });
        }
        let network = imports.iter().any(|i| imports::is_http(i));
        let linker = if network {
            &self.inner.network_linker
        } else {
            &self.inner.linker
        };
        let pre: InstancePre<LeaseState> =
            linker
                .instantiate_pre(&component)
                .map_err(|e| SandboxError::Link {
                    plugin: name.to_owned(),
                    reason: format!("{e:#}"),
                })?;
        let exports_world = |world: World| {
            let exported = exports
                .iter()
                .any(|e| e.starts_with(&format!("{}@0.1.", world.name)));
            exported
                .then(|| WorldExports::new(&pre, world))
                .transpose()
                .map_err(|e| SandboxError::Link {
                    plugin: name.to_owned(),
                    reason: format!("{e:#}"),
                })
        };
        let tool = exports_world(World::TOOL)?;
        let context = exports_world(World::CONTEXT)?;
        let channel = exports_world(World::CHANNEL)?;
        let policy = exports_world(World::POLICY)?;
        if tool.is_none() && context.is_none() && channel.is_none() && policy.is_none() {
            return Err(SandboxError::NotAPlugin {
                plugin: name.to_owned(),
                exports: exports.join(", "),
            });
        }
        Ok(PluginComponent {
            inner: Arc::new(ComponentInner {
                name: Arc::from(name),
                sha256,
                imports,
                exports,
                cache_status,
                network,
                tool,
                context,
                channel,
                policy,
            }),
        })
    }

    /// Binds a loaded component to its effective capabilities and limits,
    /// ready to lease.
    ///
    /// Every limit is clamped to the operator's
    /// [`SandboxConfig::ceilings`], memory and tables also to what the
    /// allocator was sized for ([`SandboxConfig::max_memory_bytes`],
    /// [`SandboxConfig::max_table_elements`]).
    pub fn grant(
        &self,
        component: &PluginComponent,
        capabilities: Capabilities,
        limits: Limits,
    ) -> GrantedComponent {
        let config = &self.inner.config;
        let limits = limits.at_most(&config.ceilings);
        let limits = Limits {
            memory_bytes: limits.memory_bytes.min(config.max_memory_bytes),
            table_elements: limits.table_elements.min(config.max_table_elements),
            ..limits
        };
        // Every granted secret, revealed or not: a host that echoes a
        // credential back must not get it into what the plugin returns.
        let redactor = Redactor::new(
            capabilities
                .env_vars()
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .chain(capabilities.secrets().iter().map(|s| (s.name(), s.value()))),
        );
        let net_grant = NetGrant::new(component.name(), capabilities.hosts());
        let narrowed = capabilities.narrowed();
        GrantedComponent {
            sandbox: self.clone(),
            component: component.clone(),
            capabilities: Arc::new(capabilities),
            narrowed: Arc::new(narrowed),
            widened: false,
            limits,
            redactor: Arc::new(redactor),
            net_grant: Arc::new(net_grant),
            valid: None,
            bundle: None,
        }
    }
}

impl Sandbox {
    /// The engine quick compiles run on, made on first use.
    fn quick_engine(&self, plugin: &str) -> Result<&Engine, SandboxError> {
        self.inner
            .quick
            .get_or_init(|| quick_engine(&self.inner.config).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|reason| SandboxError::Compile {
                plugin: plugin.to_owned(),
                reason: format!("cannot make the quick-compile engine: {reason}"),
            })
    }
}

/// The engine's configuration with Cranelift's fastest settings, and the
/// on-demand allocator (it only compiles): its code loads into the engine,
/// whose compatibility check ignores the optimisation level and register
/// allocator (they change no semantics), while every setting that makes
/// fuel, epochs and memory checks is the same.
fn quick_engine(config: &SandboxConfig) -> wasmtime::Result<Engine> {
    let mut c = engine_config(config);
    c.cranelift_opt_level(OptLevel::None);
    c.cranelift_regalloc_algorithm(RegallocAlgorithm::SinglePass);
    c.allocation_strategy(InstanceAllocationStrategy::OnDemand);
    Engine::new(&c)
}

/// The engine a compiling child process makes (`compile.rs`): the
/// settings every sandbox's engine has, allocated on demand as the quick
/// engine is (it only compiles), quick with `quick`. Its code loads into
/// any sandbox's engine: the pool's sizes are not among the settings
/// wasmtime checks.
pub(crate) fn compile_engine(quick: bool) -> wasmtime::Result<Engine> {
    let config = SandboxConfig::default();
    if quick {
        return quick_engine(&config);
    }
    let mut c = engine_config(&config);
    c.allocation_strategy(InstanceAllocationStrategy::OnDemand);
    Engine::new(&c)
}

/// Builds the engine: component model, async, fuel, epochs, pooling.
fn engine(config: &SandboxConfig) -> wasmtime::Result<Engine> {
    Engine::new(&engine_config(config))
}

/// The engine's configuration: component model, async, fuel, epochs,
/// pooling.
fn engine_config(config: &SandboxConfig) -> wasmtime::Config {
    let mut c = wasmtime::Config::new();
    c.wasm_component_model(true);
    c.consume_fuel(true);
    c.epoch_interruption(true);
    // Proposals no plugin toolchain needs; fewer features, less surface.
    // (Threads, GC and component-model async are compiled out entirely.)
    c.wasm_memory64(false);
    c.wasm_tail_call(false);
    c.wasm_relaxed_simd(false);
    c.wasm_custom_page_sizes(false);
    c.wasm_wide_arithmetic(false);
    // Linear memories keep wasmtime's guard pages and signal-based traps.
    // Explicit bounds checks instead would spare a short lease its two
    // `mprotect`s (tests/benches/lease.rs measures both), but wasmtime runs
    // them only with the heap's and tables' Spectre mitigations off, which
    // would let a hostile plugin read the host's memory speculatively.

    let slots = config.max_concurrent_leases.max(1);
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(slots);
    // A Rust component has a handful of core instances and tables and one
    // memory; leave headroom for other toolchains.
    pool.total_core_instances(slots * 8);
    pool.total_memories(slots * 2);
    pool.total_tables(slots * 8);
    pool.total_stacks(slots);
    pool.max_memory_size(config.max_memory_bytes as usize);
    pool.table_elements(config.max_table_elements as usize);
    // Resetting a slot for the next lease is most of a short lease's cost.
    // `PAGEMAP_SCAN` (Linux 6.7+; elsewhere the plain reset below) finds
    // the pages the last lease wrote, and up to `KEEP_RESIDENT` of them are
    // restored in place (memset, or the copy-on-write image's bytes) and stay
    // resident; the rest are released with madvise. Without the scan the
    // first `KEEP_RESIDENT` bytes are restored whole, written or not. Either
    // way every byte a lease wrote is reset before the slot is used again
    // (tests/tests/all/isolation.rs proves it from inside a guest), and a
    // used slot keeps at most this much resident between leases.
    pool.linear_memory_keep_resident(KEEP_RESIDENT);
    pool.table_keep_resident(TABLE_KEEP_RESIDENT);
    pool.pagemap_scan(Enabled::Auto);
    // Released pages are returned in batches (one madvise call per batch);
    // a slot waiting in a batch is not reused until the batch is flushed.
    pool.decommit_batch_size(DECOMMIT_BATCH);
    c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    c
}

/// The most bytes of a linear memory restored in place, and kept resident,
/// when its slot is reset for the next lease.
const KEEP_RESIDENT: usize = 1 << 20;
/// The same for a table.
const TABLE_KEEP_RESIDENT: usize = 64 << 10;
/// How many released regions are returned to the kernel in one batch.
const DECOMMIT_BATCH: usize = 32;

/// Increments the engine's epoch every `tick` until the engine is dropped.
fn start_epoch_ticker(engine: &Engine, tick: Duration) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("warden-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(tick);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        })
        .expect("cannot spawn the epoch ticker thread");
}

/// A loaded, checked and prepared component. Cheap to clone.
#[derive(Clone)]
pub struct PluginComponent {
    inner: Arc<ComponentInner>,
}

struct ComponentInner {
    name: Arc<str>,
    sha256: String,
    imports: Vec<String>,
    exports: Vec<String>,
    cache_status: CacheStatus,
    /// Whether it imports `wasi:http` (and was linked with the network
    /// linker).
    network: bool,
    tool: Option<WorldExports>,
    context: Option<WorldExports>,
    channel: Option<WorldExports>,
    policy: Option<WorldExports>,
}

impl std::fmt::Debug for PluginComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginComponent")
            .field("name", &self.inner.name)
            .field("sha256", &self.inner.sha256)
            .finish_non_exhaustive()
    }
}

/// Which plugin worlds a component exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PluginKind {
    /// `warden:plugin/tool`.
    Tool,
    /// `warden:plugin/context-source`.
    Context,
    /// `warden:plugin/channel`.
    Channel,
    /// `warden:plugin/policy`.
    Policy,
}

impl std::fmt::Display for PluginKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PluginKind::Tool => "tool",
            PluginKind::Context => "context",
            PluginKind::Channel => "channel",
            PluginKind::Policy => "policy",
        })
    }
}

impl PluginComponent {
    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The component's sha256, hex.
    pub fn sha256(&self) -> &str {
        &self.inner.sha256
    }

    /// Everything the component imports.
    pub fn imports(&self) -> &[String] {
        &self.inner.imports
    }

    /// Everything the component exports.
    pub fn exports(&self) -> &[String] {
        &self.inner.exports
    }

    /// Whether the compiled code came from the cache.
    pub fn cache_status(&self) -> CacheStatus {
        self.inner.cache_status
    }

    /// Whether the component imports `wasi:http/outgoing-handler`.
    pub fn imports_http(&self) -> bool {
        self.inner.network
    }

    /// The plugin worlds the component exports.
    pub fn kinds(&self) -> Vec<PluginKind> {
        let mut kinds = Vec::new();
        if self.inner.tool.is_some() {
            kinds.push(PluginKind::Tool);
        }
        if self.inner.context.is_some() {
            kinds.push(PluginKind::Context);
        }
        if self.inner.channel.is_some() {
            kinds.push(PluginKind::Channel);
        }
        if self.inner.policy.is_some() {
            kinds.push(PluginKind::Policy);
        }
        kinds
    }
}

/// The result of one lease and what it used.
#[derive(Debug)]
pub struct Leased<T> {
    /// What the guest returned, or why the host stopped it.
    pub result: Result<T, LeaseError>,
    /// What the lease used and how it ended.
    pub receipt: UsageReceipt,
}

/// A component bound to its effective capabilities and limits. Each method
/// call is one lease. Cheap to clone.
#[derive(Clone)]
pub struct GrantedComponent {
    sandbox: Sandbox,
    component: PluginComponent,
    capabilities: Arc<Capabilities>,
    /// [`Capabilities::narrowed`]: what calls ahead of an effect run with.
    narrowed: Arc<Capabilities>,
    /// Whether `resolve` and `decide` run with the whole grant.
    widened: bool,
    limits: Limits,
    redactor: Arc<Redactor>,
    net_grant: Arc<NetGrant>,
    /// When set, every lease stops making effects once it passes.
    valid: Option<ValidUntil>,
    /// The verified bundle this grant runs, stamped on every receipt.
    bundle: Option<Arc<Provenance>>,
}

impl std::fmt::Debug for GrantedComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantedComponent")
            .field("name", &self.component.inner.name)
            .field("capabilities", &self.capabilities)
            .field("widened", &self.widened)
            .field("limits", &self.limits)
            .field("valid", &self.valid)
            .finish_non_exhaustive()
    }
}

impl GrantedComponent {
    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.component.inner.name
    }

    /// The loaded component.
    pub fn component(&self) -> &PluginComponent {
        &self.component
    }

    /// The effective capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// The limits each lease runs under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The same component whose every lease also fits in what is left of a
    /// run's budgets: its deadline at most `bound.wall_time`, its fuel at
    /// most `bound.fuel`.
    pub fn bounded(&self, bound: &RunBound) -> GrantedComponent {
        GrantedComponent {
            limits: self.limits.within(bound),
            ..self.clone()
        }
    }

    /// The same component whose every lease makes no further effect once
    /// `valid` has passed: it is not started, its effecting host calls and
    /// its guest code trap, and it ends with [`LeaseFailure::Expired`] (see
    /// `validity.rs`).
    pub fn valid_until(&self, valid: ValidUntil) -> GrantedComponent {
        GrantedComponent {
            valid: Some(valid),
            ..self.clone()
        }
    }

    /// The same component, each of whose leases' receipts names `bundle`:
    /// the plugin host's verified provenance, so every call records which
    /// bundle ran and who signed it.
    pub fn with_bundle(mut self, bundle: Provenance) -> GrantedComponent {
        self.bundle = Some(Arc::new(bundle));
        self
    }

    /// The bundle this grant runs, when the plugin host verified one.
    pub fn bundle(&self) -> Option<&Provenance> {
        self.bundle.as_deref()
    }

    /// The narrowed capabilities (mounts read-only, no outbound host) that
    /// preflight and describe always run with, and `resolve` and `decide`
    /// unless [`widened`](Self::widened).
    pub fn narrowed_capabilities(&self) -> &Capabilities {
        &self.narrowed
    }

    /// Lets `resolve` (a context source) and `decide` (a policy) run with
    /// the whole grant instead of the narrowed one: the operator's explicit
    /// choice for a source or policy that must write or reach a host.
    /// Preflight and describe are never widened.
    pub fn widened(mut self) -> Self {
        self.widened = true;
        self
    }

    /// Whether `resolve` and `decide` run with the whole grant.
    pub fn is_widened(&self) -> bool {
        self.widened
    }

    /// The reach of `resolve` and `decide` leases.
    fn read_reach(&self) -> Reach {
        if self.widened {
            Reach::Full
        } else {
            Reach::Narrowed
        }
    }

    /// Asks a tool plugin for its tool specs, under [`Limits::for_metadata`].
    pub async fn describe_tools(&self) -> Leased<Vec<ToolSpec>> {
        let limits = self.limits.for_metadata();
        self.lease(&limits, Reach::Narrowed, Request::DescribeTools, None)
            .await
            .map(|r| match r {
                Response::Tools(specs) => specs,
                _ => unreachable!("describe answers with tool specs"),
            })
    }

    /// Asks a tool for a side-effect-free preview of `call`. The preview
    /// comes before the human's approval, so it always runs under the
    /// narrowed grant (mounts read-only, no outbound host) and
    /// [`Limits::for_preview`]: a plugin cannot make its effect happen, or
    /// reach out, before it is approved.
    pub async fn preflight(
        &self,
        call: &Call,
        cancel: Option<&CancellationToken>,
    ) -> Leased<Result<Preview, ToolError>> {
        let limits = self.limits.for_preview();
        self.lease(&limits, Reach::Narrowed, Request::Preflight(call), cancel)
            .await
            .map(|r| match r {
                Response::Preview(p) => p,
                _ => unreachable!("preflight answers with a preview"),
            })
    }

    /// Invokes a tool.
    pub async fn invoke(
        &self,
        call: &Call,
        cancel: Option<&CancellationToken>,
    ) -> Leased<Result<ToolOutput, ToolError>> {
        self.lease(&self.limits, Reach::Full, Request::Invoke(call), cancel)
            .await
            .map(|r| match r {
                Response::Output(o) => o,
                _ => unreachable!("invoke answers with an output"),
            })
    }

    /// Asks a context source to describe itself, under
    /// [`Limits::for_metadata`].
    pub async fn describe_source(&self) -> Leased<SourceSpec> {
        let limits = self.limits.for_metadata();
        self.lease(&limits, Reach::Narrowed, Request::DescribeSource, None)
            .await
            .map(|r| match r {
                Response::Source(s) => s,
                _ => unreachable!("describe answers with a source spec"),
            })
    }

    /// Resolves a context request into items, under the narrowed grant
    /// unless [`widened`](Self::widened): a source is read before the model
    /// call it feeds, ahead of any approved effect.
    pub async fn resolve(
        &self,
        request: &ContextRequest,
        cancel: Option<&CancellationToken>,
    ) -> Leased<Result<Vec<ContextItem>, ContextError>> {
        self.lease(
            &self.limits,
            self.read_reach(),
            Request::Resolve(request),
            cancel,
        )
        .await
        .map(|r| match r {
            Response::Items(items) => items,
            _ => unreachable!("resolve answers with items"),
        })
    }

    /// Asks a channel to describe itself, under [`Limits::for_metadata`].
    pub async fn describe_channel(&self) -> Leased<SourceSpec> {
        let limits = self.limits.for_metadata();
        self.lease(&limits, Reach::Narrowed, Request::DescribeChannel, None)
            .await
            .map(|r| match r {
                Response::Channel(s) => s,
                _ => unreachable!("describe answers with a channel spec"),
            })
    }

    /// Delivers one message through a channel.
    pub async fn deliver(
        &self,
        delivery: &Delivery,
        cancel: Option<&CancellationToken>,
    ) -> Leased<Result<(), DeliveryError>> {
        self.lease(
            &self.limits,
            Reach::Full,
            Request::Deliver(delivery),
            cancel,
        )
        .await
        .map(|r| match r {
            Response::Delivered(d) => d,
            _ => unreachable!("deliver answers with a delivery result"),
        })
    }

    /// Asks a policy to describe itself, under [`Limits::for_metadata`].
    pub async fn describe_policy(&self) -> Leased<SourceSpec> {
        let limits = self.limits.for_metadata();
        self.lease(&limits, Reach::Narrowed, Request::DescribePolicy, None)
            .await
            .map(|r| match r {
                Response::Policy(s) => s,
                _ => unreachable!("describe answers with a policy spec"),
            })
    }

    /// Asks a policy for its decision, under the narrowed grant unless
    /// [`widened`](Self::widened): a decision comes before the effect it
    /// allows.
    pub async fn decide(
        &self,
        request: &PolicyRequest,
        cancel: Option<&CancellationToken>,
    ) -> Leased<Result<Decision, PolicyError>> {
        self.lease(
            &self.limits,
            self.read_reach(),
            Request::Decide(request),
            cancel,
        )
        .await
        .map(|r| match r {
            Response::Decided(d) => d,
            _ => unreachable!("decide answers with a decision"),
        })
    }

    async fn lease(
        &self,
        limits: &Limits,
        reach: Reach,
        request: Request<'_>,
        cancel: Option<&CancellationToken>,
    ) -> Leased<Response> {
        // Named only when the lease fails: a name is an allocation.
        let operation = request.operation();
        let (result, receipt) = lease::run(self, limits, reach, request, cancel).await;
        let result = result.map_err(|failure| {
            let operation = operation();
            tracing::debug!(plugin = self.name(), operation, %failure, "lease failed");
            LeaseError {
                plugin: self.name().to_owned(),
                operation,
                failure,
            }
        });
        Leased { result, receipt }
    }
}

impl<T> Leased<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Leased<U> {
        Leased {
            result: self.result.map(f),
            receipt: self.receipt,
        }
    }
}
