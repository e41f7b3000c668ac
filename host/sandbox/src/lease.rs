//! A lease: one invocation's sandbox. A fresh `Store` with a WASI context
//! built from the plugin's effective grants (on the guest's first WASI
//! call), an instance made from the cached `InstancePre`, one call to the
//! one export it needs, and then everything is dropped, whether the call
//! returned, failed, timed out or was cancelled. No guest state or handle
//! outlives its lease.
//!
//! Limits: fuel, an epoch deadline that traps a guest spinning in wasm, a
//! tokio deadline that also covers time spent in host calls (network waits
//! included), the memory and table limiter, the stdio budget, the output cap
//! and, for a component that imports `wasi:http`, the request and response
//! byte limits of `net.rs`; and, when the component was given one, its
//! [`ValidUntil`](super::ValidUntil), checked at the start, at every epoch
//! tick, on every effecting host call and while the lease waits
//! (`validity.rs`). When a lease fails, the failure is attributed in a
//! fixed order: validity expired, deadline, out of fuel, a recorded memory
//! or table denial, then a plain trap.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use wasmtime::component::{
    ComponentExportIndex, ComponentNamedList, Instance, InstancePre, Lift, Lower, ResourceTable,
};
use wasmtime::{Store, Trap, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtxView, WasiHttpView};

use super::bindings::types::{
    Call, ContextError, ContextItem, ContextRequest, Decision, Delivery, DeliveryError, LogLevel,
    PolicyError, PolicyRequest, Preview, SourceSpec, ToolError, ToolOutput, ToolSpec,
};
use super::bindings::{host, secrets, types};
use super::capabilities::Capabilities;
use super::capture::{Capture, Redactor, Stream};
use super::fs::{FsView, LeaseFs, Preopens};
use super::lease_threads::{Abandoned, Owner, Stop};
use super::limits::{Denial, LeaseLimiter};
use super::net::NetLease;
use super::secrets::{Form, LeaseSecrets, Refusal};
use super::validity::{Expired, LeaseFence};
use super::{ComponentInner, GrantedComponent, LeaseFailure, Limits, Outcome, UsageReceipt};

/// The data of one lease's `Store`.
pub(crate) struct LeaseState {
    /// Built on the guest's first WASI call (`wasi_ctx`): a component that
    /// makes none, like most short tools, never pays for it.
    wasi: Option<WasiCtx>,
    /// The host's filesystem layer: preopens made from the mounts' held
    /// handles, and the checks in front of wasmtime-wasi.
    fs: LeaseFs,
    table: ResourceTable,
    limiter: LeaseLimiter,
    plugin: Arc<str>,
    config: Arc<BTreeMap<String, String>>,
    /// The grant this lease runs with (whole or narrowed), for the host
    /// imports that touch mounts.
    capabilities: Arc<Capabilities>,
    capture: Capture,
    redactor: Arc<Redactor>,
    /// HTTP state, only for a component that imports `wasi:http`.
    net: Option<Box<NetLease>>,
    /// The granted secrets and the handles the guest asked for, shared
    /// with the network hooks that fill them in.
    secrets: Arc<LeaseSecrets>,
    /// The lease's validity, checked by every effecting host call.
    fence: LeaseFence,
}

impl WasiView for LeaseState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let ctx = wasi_ctx(&mut self.wasi, &self.capabilities, &self.capture);
        WasiCtxView {
            ctx,
            table: &mut self.table,
        }
    }
}

impl LeaseState {
    /// The `wasi:filesystem` view.
    pub(crate) fn fs(&mut self) -> FsView<'_> {
        let wasi = wasi_ctx(&mut self.wasi, &self.capabilities, &self.capture);
        FsView {
            wasi: wasi.filesystem(),
            table: &mut self.table,
            fs: &mut self.fs,
        }
    }
}

impl WasiHttpView for LeaseState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        // Only components linked with `wasi:http` call this, and their
        // leases have network state; should one not, it denies everything.
        let plugin = &self.plugin;
        let net = self
            .net
            .get_or_insert_with(|| Box::new(NetLease::deny_all(Arc::clone(plugin))));
        WasiHttpCtxView {
            ctx: &mut net.ctx,
            table: &mut self.table,
            hooks: &mut net.hooks,
        }
    }
}

impl wasmtime_wasi_io::IoView for LeaseState {
    fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }
}

/// Longest host-log message kept; longer ones are cut.
const MAX_LOG_LINE: usize = 4096;

impl host::Host for LeaseState {
    fn log(&mut self, level: LogLevel, message: String) {
        let mut message = message;
        if !self.capture.charge_log(message.len()) {
            return;
        }
        // Redacted whole, then cut: a cut first could split a secret so
        // that no part of it matches.
        self.redactor.redact(&mut message);
        if message.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            self.redactor.cut_partial_tail(&mut message);
            message.push('…');
        }
        let plugin = &*self.plugin;
        match level {
            LogLevel::Trace => tracing::trace!(target: "warden::plugin", plugin, "{message}"),
            LogLevel::Debug => tracing::debug!(target: "warden::plugin", plugin, "{message}"),
            LogLevel::Info => tracing::info!(target: "warden::plugin", plugin, "{message}"),
            LogLevel::Warn => tracing::warn!(target: "warden::plugin", plugin, "{message}"),
            LogLevel::Error => tracing::error!(target: "warden::plugin", plugin, "{message}"),
        }
    }

    fn config(&mut self, key: String) -> Option<String> {
        self.config.get(&key).cloned()
    }

    fn keep_permissions(&mut self, original: String, replacement: String) -> Result<(), String> {
        // Refused, not trapped (this import never traps); the refusal
        // marks the lease expired all the same.
        if let Err(expired) = self.fence.check() {
            return Err(expired.to_string());
        }
        let kept = super::permissions::keep_permissions(
            self.capabilities.mounts(),
            &original,
            &replacement,
        );
        if let Err(reason) = &kept {
            tracing::debug!(target: "warden::plugin", plugin = &*self.plugin, %reason, "keep-permissions refused");
        }
        kept
    }
}

impl types::Host for LeaseState {}

impl secrets::Host for LeaseState {
    fn handle(
        &mut self,
        name: String,
        form: secrets::SecretForm,
    ) -> Result<String, secrets::SecretError> {
        let form = match form {
            secrets::SecretForm::Plain => Form::Plain,
            secrets::SecretForm::Bearer => Form::Bearer,
            secrets::SecretForm::Basic(user) => Form::Basic(user),
        };
        // A host that echoes the header back would show this encoding,
        // which the grant's redactor cannot know.
        if let Some(encoded) = self.secrets.encoded(&name, &form) {
            self.redactor = Arc::new(self.redactor.with([(name.as_str(), encoded.as_str())]));
        }
        self.secrets.handle(&name, form).map_err(secret_error)
    }

    fn reveal(&mut self, name: String) -> Result<String, secrets::SecretError> {
        self.secrets.reveal(&name).map_err(secret_error)
    }
}

fn secret_error(refusal: Refusal) -> secrets::SecretError {
    match refusal {
        Refusal::NotGranted(m) => secrets::SecretError::NotGranted(m),
        Refusal::RevealDenied(m) => secrets::SecretError::RevealDenied(m),
        Refusal::InvalidForm(m) => secrets::SecretError::InvalidForm(m),
    }
}

/// What a lease may reach of its plugin's grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// The whole grant: an effect the engine decided to make (an invoke
    /// after approval when one is needed, a delivery).
    Full,
    /// [`Capabilities::narrowed`](super::Capabilities::narrowed): mounts
    /// read-only, no outbound host. For every call made before or instead
    /// of an approved effect.
    Narrowed,
}

/// What a lease is asked to do.
pub(crate) enum Request<'a> {
    DescribeTools,
    Preflight(&'a Call),
    Invoke(&'a Call),
    DescribeSource,
    Resolve(&'a ContextRequest),
    DescribeChannel,
    Deliver(&'a Delivery),
    DescribePolicy,
    Decide(&'a PolicyRequest),
}

impl<'a> Request<'a> {
    /// How a failure names what was asked: `tool `x``, `describe`, ...
    /// Returned as a closure so that the name is only built for a failure.
    pub(crate) fn operation(&self) -> impl FnOnce() -> String + use<'a> {
        let (kind, tool): (&'static str, Option<&'a str>) = match *self {
            Request::DescribeTools
            | Request::DescribeSource
            | Request::DescribeChannel
            | Request::DescribePolicy => ("describe", None),
            Request::Preflight(call) => ("preflight of tool", Some(&call.tool)),
            Request::Invoke(call) => ("tool", Some(&call.tool)),
            Request::Resolve(_) => ("resolve", None),
            Request::Deliver(_) => ("deliver", None),
            Request::Decide(_) => ("decide", None),
        };
        move || match tool {
            Some(tool) => format!("{kind} `{tool}`"),
            None => kind.to_owned(),
        }
    }

    /// The interface this request needs, if the component does not export it.
    fn missing_world(&self, component: &ComponentInner) -> Option<&'static str> {
        match self {
            Request::DescribeTools | Request::Preflight(_) | Request::Invoke(_) => {
                component.tool.is_none().then_some("tool")
            }
            Request::DescribeSource | Request::Resolve(_) => {
                component.context.is_none().then_some("context-source")
            }
            Request::DescribeChannel | Request::Deliver(_) => {
                component.channel.is_none().then_some("channel")
            }
            Request::DescribePolicy | Request::Decide(_) => {
                component.policy.is_none().then_some("policy")
            }
        }
    }
}

/// A [`Request`] that owns what it carries, for a lease run on a lease
/// thread.
pub(crate) enum OwnedRequest {
    DescribeTools,
    Preflight(Call),
    Invoke(Call),
    DescribeSource,
    Resolve(ContextRequest),
    DescribeChannel,
    Deliver(Delivery),
    DescribePolicy,
    Decide(PolicyRequest),
}

impl Request<'_> {
    /// The same request, owning a copy of what it carries.
    pub(crate) fn owned(&self) -> OwnedRequest {
        match *self {
            Request::DescribeTools => OwnedRequest::DescribeTools,
            Request::Preflight(call) => OwnedRequest::Preflight(call.clone()),
            Request::Invoke(call) => OwnedRequest::Invoke(call.clone()),
            Request::DescribeSource => OwnedRequest::DescribeSource,
            Request::Resolve(r) => OwnedRequest::Resolve(r.clone()),
            Request::DescribeChannel => OwnedRequest::DescribeChannel,
            Request::Deliver(d) => OwnedRequest::Deliver(d.clone()),
            Request::DescribePolicy => OwnedRequest::DescribePolicy,
            Request::Decide(r) => OwnedRequest::Decide(r.clone()),
        }
    }
}

impl OwnedRequest {
    /// The request, borrowing what this one owns.
    pub(crate) fn as_request(&self) -> Request<'_> {
        match self {
            OwnedRequest::DescribeTools => Request::DescribeTools,
            OwnedRequest::Preflight(call) => Request::Preflight(call),
            OwnedRequest::Invoke(call) => Request::Invoke(call),
            OwnedRequest::DescribeSource => Request::DescribeSource,
            OwnedRequest::Resolve(r) => Request::Resolve(r),
            OwnedRequest::DescribeChannel => Request::DescribeChannel,
            OwnedRequest::Deliver(d) => Request::Deliver(d),
            OwnedRequest::DescribePolicy => Request::DescribePolicy,
            OwnedRequest::Decide(r) => Request::Decide(r),
        }
    }
}

/// What the guest answered.
pub(crate) enum Response {
    Tools(Vec<ToolSpec>),
    Preview(Result<Preview, ToolError>),
    Output(Result<ToolOutput, ToolError>),
    Source(SourceSpec),
    Items(Result<Vec<ContextItem>, ContextError>),
    Channel(SourceSpec),
    Delivered(Result<(), DeliveryError>),
    Policy(SourceSpec),
    Decided(Result<Decision, PolicyError>),
}

impl Response {
    /// Bytes of text in the answer, counted against the output limit.
    fn output_bytes(&self) -> u64 {
        fn tool_error(e: &ToolError) -> usize {
            match e {
                ToolError::InvalidArguments(s) | ToolError::Denied(s) => s.len(),
                ToolError::Failed(f) => f.message.len(),
            }
        }
        let bytes = match self {
            Response::Tools(specs) => specs
                .iter()
                .map(|s| s.name.len() + s.description.len() + s.input_schema.len())
                .sum(),
            Response::Preview(Ok(p)) => p.summary.len() + p.detail.len(),
            Response::Output(Ok(o)) => o.content.len(),
            Response::Preview(Err(e)) | Response::Output(Err(e)) => tool_error(e),
            Response::Source(s) | Response::Channel(s) | Response::Policy(s) => {
                s.name.len() + s.description.len()
            }
            Response::Items(Ok(items)) => {
                items.iter().map(|i| i.source.len() + i.content.len()).sum()
            }
            Response::Items(Err(ContextError::InvalidRequest(s) | ContextError::Denied(s))) => {
                s.len()
            }
            Response::Items(Err(ContextError::Failed(f))) => f.message.len(),
            Response::Delivered(Ok(())) => 0,
            Response::Delivered(Err(
                DeliveryError::InvalidDelivery(s) | DeliveryError::Denied(s),
            )) => s.len(),
            Response::Delivered(Err(DeliveryError::Rejected(r))) => r.message.len(),
            Response::Delivered(Err(DeliveryError::Failed(f))) => f.message.len(),
            Response::Decided(Ok(Decision::Allow)) => 0,
            Response::Decided(Ok(Decision::Deny(s) | Decision::Feedback(s))) => s.len(),
            Response::Decided(Err(PolicyError::InvalidRequest(s))) => s.len(),
            Response::Decided(Err(PolicyError::Failed(f))) => f.message.len(),
        };
        bytes as u64
    }

    /// Whether the guest answered with its own typed error.
    fn is_guest_error(&self) -> bool {
        matches!(
            self,
            Response::Preview(Err(_))
                | Response::Output(Err(_))
                | Response::Items(Err(_))
                | Response::Delivered(Err(_))
                | Response::Decided(Err(_))
        )
    }

    /// Redacts granted secrets from every string the host passes on.
    fn redact(&mut self, r: &Redactor) {
        fn tool_error(e: &mut ToolError, r: &Redactor) {
            match e {
                ToolError::InvalidArguments(s) | ToolError::Denied(s) => r.redact(s),
                ToolError::Failed(f) => r.redact(&mut f.message),
            }
        }
        match self {
            Response::Tools(specs) => {
                for s in specs {
                    r.redact(&mut s.description);
                    r.redact(&mut s.input_schema);
                }
            }
            Response::Preview(Ok(p)) => {
                r.redact(&mut p.summary);
                r.redact(&mut p.detail);
            }
            Response::Output(Ok(o)) => r.redact(&mut o.content),
            Response::Preview(Err(e)) | Response::Output(Err(e)) => tool_error(e, r),
            Response::Source(s) | Response::Channel(s) | Response::Policy(s) => {
                r.redact(&mut s.description)
            }
            Response::Items(Ok(items)) => {
                for i in items {
                    r.redact(&mut i.source);
                    r.redact(&mut i.content);
                }
            }
            Response::Items(Err(ContextError::InvalidRequest(s) | ContextError::Denied(s))) => {
                r.redact(s)
            }
            Response::Items(Err(ContextError::Failed(f))) => r.redact(&mut f.message),
            Response::Delivered(Ok(())) => {}
            Response::Delivered(Err(
                DeliveryError::InvalidDelivery(s) | DeliveryError::Denied(s),
            )) => r.redact(s),
            Response::Delivered(Err(DeliveryError::Rejected(x))) => r.redact(&mut x.message),
            Response::Delivered(Err(DeliveryError::Failed(f))) => r.redact(&mut f.message),
            Response::Decided(Ok(Decision::Allow)) => {}
            Response::Decided(Ok(Decision::Deny(s) | Decision::Feedback(s))) => r.redact(s),
            Response::Decided(Err(PolicyError::InvalidRequest(s))) => r.redact(s),
            Response::Decided(Err(PolicyError::Failed(f))) => r.redact(&mut f.message),
        }
    }
}

/// How the call future ended, before attribution.
enum Ended {
    Returned(wasmtime::Result<Response>),
    DeadlinePassed,
    Cancelled,
    /// The lease's validity passed while it waited.
    Expired,
}

/// Runs one lease of `plugin` and attributes its outcome. A lease with
/// mounts runs on a lease thread (`lease_threads.rs`), where its filesystem
/// calls may block; one without runs here, on the caller's task.
pub(crate) async fn run(
    plugin: &GrantedComponent,
    limits: &Limits,
    reach: Reach,
    request: Request<'_>,
    cancel: Option<&CancellationToken>,
) -> (Result<Response, LeaseFailure>, UsageReceipt) {
    let started = Instant::now();
    let sandbox = &plugin.sandbox.inner;
    let refuse = |reason: String| {
        let mut receipt = UsageReceipt::empty(Outcome::Refused);
        receipt.wall_time_us = started.elapsed().as_micros() as u64;
        receipt.bundle = plugin.bundle.as_deref().cloned();
        (Err(LeaseFailure::Refused { reason }), receipt)
    };
    if let Some(world) = request.missing_world(&plugin.component.inner) {
        return refuse(format!(
            "plugin `{}` does not export the {world} interface",
            plugin.component.inner.name
        ));
    }
    let fence = LeaseFence::new(plugin.valid.clone());
    if fence.check().is_err() {
        let mut receipt = UsageReceipt::empty(LeaseFailure::Expired.outcome());
        receipt.wall_time_us = started.elapsed().as_micros() as u64;
        receipt.bundle = plugin.bundle.as_deref().cloned();
        return (Err(LeaseFailure::Expired), receipt);
    }
    let (capabilities, net_grant) = match reach {
        Reach::Full => (
            Arc::clone(&plugin.capabilities),
            Arc::clone(&plugin.net_grant),
        ),
        Reach::Narrowed => (Arc::clone(&plugin.narrowed), Arc::default()),
    };
    let preopens = match preopens(&capabilities) {
        Ok(built) => built,
        Err(reason) => return refuse(reason),
    };
    let runtime = tokio::runtime::Handle::try_current();
    let (false, Ok(runtime)) = (preopens.is_empty(), runtime) else {
        // No filesystem handle, so nothing here can block: the caller's
        // task runs it, with no hand-over.
        let _slot = sandbox
            .lease_slots
            .acquire()
            .await
            .expect("the lease semaphore is never closed");
        let setup = Setup {
            capabilities,
            net_grant,
            preopens,
            fence,
            deadline: Instant::now() + limits.timeout,
            started,
        };
        return lease(plugin, limits, request, cancel, setup).await;
    };

    // Waiting for a place among the plugin's lease threads, then for a
    // slot, counts against the lease's time.
    let deadline = Instant::now() + limits.timeout;
    let owner = Owner {
        plugin: Arc::clone(&plugin.component.inner.name),
        mounts: capabilities
            .mounts()
            .iter()
            .map(|m| m.root.identity())
            .collect(),
    };
    let setup = Setup {
        capabilities,
        net_grant,
        preopens,
        fence: fence.clone(),
        deadline,
        started,
    };
    // The lease thread owns everything the lease uses; it polls the lease
    // with this runtime's handle, under this task's subscriber and span.
    let owned = (
        plugin.clone(),
        limits.clone(),
        request.owned(),
        cancel.cloned(),
    );
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    let span = tracing::Span::current();
    let work = move || {
        let (plugin, limits, request, cancel) = owned;
        tracing::dispatcher::with_default(&dispatch, || {
            runtime.block_on(tracing::Instrument::instrument(
                lease(
                    &plugin,
                    &limits,
                    request.as_request(),
                    cancel.as_ref(),
                    setup,
                ),
                span,
            ))
        })
    };
    let stop = async {
        tokio::select! {
            biased;
            () = async {
                match cancel {
                    Some(token) => token.cancelled().await,
                    None => std::future::pending().await,
                }
            } => Stop::Cancelled,
            () = fence.expired() => Stop::Expired,
            () = tokio::time::sleep_until(deadline.into()) => Stop::Deadline,
        }
    };
    let name = Arc::clone(&owner.plugin);
    let slots = Arc::clone(&sandbox.lease_slots);
    let stop = match sandbox.lease_threads.run(owner, slots, work, stop).await {
        Ok(ended) => return ended,
        Err(Abandoned::Refused { stuck }) => {
            return refuse(format!(
                "plugin `{name}` has {stuck} leases stuck in filesystem calls that have not \
                 returned since their deadline (a file whose reads never answer, such as one \
                 served by FUSE or a network filesystem); its leases with these mounts are \
                 refused until one returns"
            ));
        }
        Err(Abandoned::Stopped(stop) | Abandoned::NoPlace(stop)) => stop,
    };
    let failure = match stop {
        Stop::Deadline => LeaseFailure::Timeout {
            limit: limits.timeout,
        },
        Stop::Cancelled => LeaseFailure::Cancelled,
        Stop::Expired => LeaseFailure::Expired,
    };
    let mut receipt = UsageReceipt::empty(failure.outcome());
    receipt.wall_time_us = started.elapsed().as_micros() as u64;
    receipt.bundle = plugin.bundle.as_deref().cloned();
    (Err(failure), receipt)
}

/// What `run` prepared for the lease.
struct Setup {
    capabilities: Arc<Capabilities>,
    net_grant: Arc<super::net::NetGrant>,
    preopens: Preopens,
    fence: LeaseFence,
    /// When the lease's time is up: the same moment for the lease and for
    /// the caller waiting on a lease thread.
    deadline: Instant,
    started: Instant,
}

/// The lease itself: store, instance, the one call, attribution, receipt.
async fn lease(
    plugin: &GrantedComponent,
    limits: &Limits,
    request: Request<'_>,
    cancel: Option<&CancellationToken>,
    setup: Setup,
) -> (Result<Response, LeaseFailure>, UsageReceipt) {
    let Setup {
        capabilities,
        net_grant,
        preopens,
        fence,
        deadline,
        started,
    } = setup;
    let sandbox = &plugin.sandbox.inner;
    let capture = Capture::new(limits.stdio_bytes);
    let lease_secrets = Arc::new(LeaseSecrets::new(
        Arc::clone(&plugin.component.inner.name),
        capabilities.shared_secrets(),
    ));
    let state = LeaseState {
        wasi: None,
        fs: LeaseFs::new(
            Arc::clone(&plugin.component.inner.name),
            preopens,
            fence.clone(),
        ),
        table: ResourceTable::new(),
        limiter: LeaseLimiter::new(limits),
        plugin: Arc::clone(&plugin.component.inner.name),
        config: plugin.capabilities.shared_config(),
        capabilities,
        capture: capture.clone(),
        redactor: Arc::clone(&plugin.redactor),
        net: plugin.component.inner.network.then(|| {
            Box::new(NetLease::new(
                Arc::clone(&plugin.component.inner.name),
                net_grant,
                Arc::clone(&plugin.redactor),
                limits.http_requests,
                limits.http_response_bytes,
                fence.clone(),
                Arc::clone(&lease_secrets),
            ))
        }),
        secrets: Arc::clone(&lease_secrets),
        fence: fence.clone(),
    };
    let mut store = Store::new(&sandbox.engine, state);
    store.limiter(|s| &mut s.limiter);
    let fuel_budget = limits.fuel.unwrap_or(u64::MAX);
    store
        .set_fuel(fuel_budget)
        .expect("the engine is configured to consume fuel");
    store.set_epoch_deadline(1);
    let ticks = fence.clone();
    store.epoch_deadline_callback(move |_| {
        // Guest code running past the validity traps too, host calls or not.
        ticks.trap()?;
        if Instant::now() >= deadline {
            Ok(UpdateDeadline::Interrupt)
        } else {
            // Let other tasks run on this thread between ticks.
            Ok(UpdateDeadline::Yield(1))
        }
    });

    let ended = {
        let call = perform(&mut store, plugin, request);
        let timed = tokio::time::timeout_at(deadline.into(), call);
        let cancelled = async {
            match cancel {
                Some(token) => token.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = cancelled => Ended::Cancelled,
            () = fence.expired() => Ended::Expired,
            r = timed => r.map_or(Ended::DeadlinePassed, Ended::Returned),
        }
    };

    let fuel_consumed = fuel_budget - store.get_fuel().unwrap_or(0);
    let peak_memory_bytes = store.data().limiter.memory_peak();
    let denial = store.data().limiter.denial();
    // The grant's redactor, with what the lease added to it.
    let redactor = Arc::clone(&store.data().redactor);
    let network = store
        .data()
        .net
        .as_ref()
        .and_then(|n| n.usage())
        .map(|mut usage| {
            // A denied target is what the guest asked for: it may carry a
            // secret (`https://<secret>.example`).
            for denial in &mut usage.denials {
                redactor.redact(&mut denial.target);
            }
            for host in &mut usage.hosts {
                redactor.redact(host);
            }
            usage
        });
    let unlisted = store.data().fs.unlisted();
    let debris = store.data_mut().fs.debris();
    drop(store);
    // A temporary file of an atomic replacement the lease could not finish
    // (cut short, or its own removal refused by the fence) is the host's
    // to remove: the guest is gone. (Only a lease with mounts has any, and
    // it runs on a lease thread, where this may block.)
    debris.clear();

    let result = match ended {
        // A refused effect ends the lease as expired, whatever the guest
        // made of the refusal.
        _ if fence.tripped() => Err(LeaseFailure::Expired),
        Ended::Expired => Err(LeaseFailure::Expired),
        Ended::Cancelled => Err(LeaseFailure::Cancelled),
        Ended::DeadlinePassed => Err(LeaseFailure::Timeout {
            limit: limits.timeout,
        }),
        Ended::Returned(Err(error)) => Err(attribute(error, limits, denial, &redactor)),
        Ended::Returned(Ok(response)) => {
            let bytes = response.output_bytes();
            if bytes > limits.output_bytes {
                Err(LeaseFailure::OutputLimit {
                    bytes,
                    limit: limits.output_bytes,
                })
            } else {
                Ok(response)
            }
        }
    };
    let result = result.map(|mut response| {
        if !redactor.is_empty() {
            response.redact(&redactor);
        }
        response
    });

    let captured = capture.take();
    let cut = captured.dropped_bytes > 0;
    emit_stdio(plugin, &redactor, Stream::Stdout, &captured.stdout, cut);
    emit_stdio(plugin, &redactor, Stream::Stderr, &captured.stderr, cut);
    if captured.dropped_bytes > 0 {
        tracing::warn!(
            target: "warden::plugin",
            plugin = &*plugin.component.inner.name,
            dropped_bytes = captured.dropped_bytes,
            "plugin output over its stdio budget was dropped"
        );
    }

    let outcome = match &result {
        Ok(response) if response.is_guest_error() => Outcome::GuestError,
        Ok(_) => Outcome::Ok,
        Err(failure) => failure.outcome(),
    };
    let receipt = UsageReceipt {
        outcome,
        fuel_consumed,
        peak_memory_bytes,
        wall_time_us: started.elapsed().as_micros() as u64,
        output_bytes: result.as_ref().map_or(0, Response::output_bytes),
        stdout_bytes: captured.stdout_bytes,
        stderr_bytes: captured.stderr_bytes,
        log_bytes: captured.log_bytes,
        stdio_dropped_bytes: captured.dropped_bytes,
        denied_growth: denial.map(Denial::to_receipt),
        network,
        unlisted,
        secrets: lease_secrets.uses(),
        bundle: plugin.bundle.as_deref().cloned(),
    };
    (result, receipt)
}

/// The lease's WASI context, built from the plugin's effective grants on
/// first use: stdout and stderr into the capture, the granted environment.
/// The mounts are the preopens of `LeaseFs`, whose descriptors run their
/// calls inline on the lease's thread (`fs.rs`).
fn wasi_ctx<'a>(
    wasi: &'a mut Option<WasiCtx>,
    capabilities: &Capabilities,
    capture: &Capture,
) -> &'a mut WasiCtx {
    wasi.get_or_insert_with(|| {
        let mut builder = WasiCtxBuilder::new();
        builder.stdout(capture.sink(Stream::Stdout));
        builder.stderr(capture.sink(Stream::Stderr));
        for (name, value) in capabilities.env_vars() {
            builder.env(name, value);
        }
        builder.build()
    })
}

/// The lease's preopens, one per granted mount, each a duplicate of its
/// mount's held handle.
fn preopens(capabilities: &Capabilities) -> Result<Preopens, String> {
    let mut preopens = Preopens::default();
    for mount in capabilities.mounts() {
        let dir = mount.root.preopen(mount.access).map_err(|e| {
            format!(
                "mount `{}`: cannot use directory `{}`: {e}",
                mount.name,
                mount.host_dir.display()
            )
        })?;
        preopens.push(dir, mount.guest_path(), mount.root.scope(&mount.exclude));
    }
    Ok(preopens)
}

/// A plugin world: its interface's name and functions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct World {
    pub(crate) name: &'static str,
    functions: &'static [&'static str],
}

impl World {
    pub(crate) const TOOL: World = World {
        name: "warden:plugin/tool",
        functions: &["describe", "preflight", "invoke"],
    };
    pub(crate) const CONTEXT: World = World {
        name: "warden:plugin/context-source",
        functions: &["describe", "resolve"],
    };
    pub(crate) const CHANNEL: World = World {
        name: "warden:plugin/channel",
        functions: &["describe", "deliver"],
    };
    pub(crate) const POLICY: World = World {
        name: "warden:plugin/policy",
        functions: &["describe", "decide"],
    };
}

/// A plugin world a component exports: the component's `InstancePre` and
/// the export index of each of the world's functions, found at load. A
/// lease instantiates from it and type-checks only the function it calls
/// (bindgen's `*Pre::instantiate_async` type-checks every function of the
/// world on every instantiation: a sixth of a no-op lease).
pub(crate) struct WorldExports {
    pre: InstancePre<LeaseState>,
    functions: Vec<(&'static str, ComponentExportIndex)>,
}

impl WorldExports {
    /// Finds each of `world`'s functions in `pre`'s component, as bindgen
    /// does (the interface at version 0.1.0, or a compatible one).
    pub(crate) fn new(pre: &InstancePre<LeaseState>, world: World) -> wasmtime::Result<Self> {
        let component = pre.component();
        let interface = format!("{}@0.1.0", world.name);
        let instance = component
            .get_export_index(None, &interface)
            .ok_or_else(|| wasmtime::format_err!("no exported instance named `{interface}`"))?;
        let functions = world
            .functions
            .iter()
            .map(|&name| {
                component
                    .get_export_index(Some(&instance), name)
                    .map(|index| (name, index))
                    .ok_or_else(|| {
                        wasmtime::format_err!(
                            "instance export `{interface}` does not have export `{name}`"
                        )
                    })
            })
            .collect::<wasmtime::Result<_>>()?;
        Ok(WorldExports {
            pre: pre.clone(),
            functions,
        })
    }

    /// The export index of `function`, one of the world's.
    fn index(&self, function: &str) -> &ComponentExportIndex {
        self.functions
            .iter()
            .find_map(|(name, index)| (*name == function).then_some(index))
            .expect("every function of the world was found at load")
    }
}

/// Instantiates the component in `store` and makes the one call.
async fn perform(
    store: &mut Store<LeaseState>,
    plugin: &GrantedComponent,
    request: Request<'_>,
) -> wasmtime::Result<Response> {
    let component = &plugin.component.inner;
    // `run` checked the world is exported before creating the store.
    let missing = |world: &str| wasmtime::format_err!("no {world} export");
    let world = match request {
        Request::DescribeTools | Request::Preflight(_) | Request::Invoke(_) => {
            component.tool.as_ref().ok_or_else(|| missing("tool"))?
        }
        Request::DescribeSource | Request::Resolve(_) => component
            .context
            .as_ref()
            .ok_or_else(|| missing("context-source"))?,
        Request::DescribeChannel | Request::Deliver(_) => component
            .channel
            .as_ref()
            .ok_or_else(|| missing("channel"))?,
        Request::DescribePolicy | Request::Decide(_) => {
            component.policy.as_ref().ok_or_else(|| missing("policy"))?
        }
    };
    let instance = world.pre.instantiate_async(&mut *store).await?;
    let exported = Exported { instance, world };
    Ok(match request {
        Request::DescribeTools => Response::Tools(exported.call(store, "describe", ()).await?),
        Request::Preflight(call) => {
            Response::Preview(exported.call(store, "preflight", (call,)).await?)
        }
        Request::Invoke(call) => Response::Output(exported.call(store, "invoke", (call,)).await?),
        Request::DescribeSource => Response::Source(exported.call(store, "describe", ()).await?),
        Request::Resolve(req) => Response::Items(exported.call(store, "resolve", (req,)).await?),
        Request::DescribeChannel => Response::Channel(exported.call(store, "describe", ()).await?),
        Request::Deliver(d) => Response::Delivered(exported.call(store, "deliver", (d,)).await?),
        Request::DescribePolicy => Response::Policy(exported.call(store, "describe", ()).await?),
        Request::Decide(req) => Response::Decided(exported.call(store, "decide", (req,)).await?),
    })
}

/// A lease's instance and the world it is called through.
struct Exported<'a> {
    instance: Instance,
    world: &'a WorldExports,
}

impl Exported<'_> {
    /// Calls `function` of the world with `params`, type-checked first: a
    /// component whose export has another type fails here, not in the guest.
    async fn call<P, R>(
        &self,
        store: &mut Store<LeaseState>,
        function: &str,
        params: P,
    ) -> wasmtime::Result<R>
    where
        P: ComponentNamedList + Lower + Send + Sync,
        R: Lift + Send + Sync + 'static,
        (R,): ComponentNamedList + Lift,
    {
        let func = self
            .instance
            .get_typed_func::<P, (R,)>(&mut *store, self.world.index(function))?;
        let (result,) = func.call_async(&mut *store, params).await?;
        Ok(result)
    }
}

/// Longest trap message kept.
const MAX_TRAP_MESSAGE: usize = 8192;

/// Names the limit a failed call hit: deadline, out of fuel, a recorded
/// denial, or else a plain trap.
fn attribute(
    error: wasmtime::Error,
    limits: &Limits,
    denial: Option<Denial>,
    redactor: &Redactor,
) -> LeaseFailure {
    if error.downcast_ref::<Expired>().is_some() {
        return LeaseFailure::Expired;
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => {
            return LeaseFailure::Timeout {
                limit: limits.timeout,
            };
        }
        Some(Trap::OutOfFuel) => {
            return LeaseFailure::OutOfFuel {
                limit: limits.fuel.unwrap_or(u64::MAX),
            };
        }
        _ => {}
    }
    match denial {
        Some(Denial::Memory { requested, limit }) => {
            return LeaseFailure::MemoryLimit { requested, limit };
        }
        Some(Denial::Table { requested, limit }) => {
            return LeaseFailure::TableLimit { requested, limit };
        }
        None => {}
    }
    let mut message = match error.downcast_ref::<wasmtime_wasi::I32Exit>() {
        Some(exit) => format!("guest exited with status {}", exit.0),
        None => format!("{error:?}"),
    };
    // Redacted before the cut, like every text the host keeps.
    redactor.redact(&mut message);
    if message.len() > MAX_TRAP_MESSAGE {
        let mut cut = MAX_TRAP_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        redactor.cut_partial_tail(&mut message);
        message.push('…');
    }
    LeaseFailure::Trap { message }
}

/// Sends captured guest output to `tracing`, one event per line, redacted;
/// when the budget `cut` the output, a secret's beginning left at its end
/// goes too.
fn emit_stdio(
    plugin: &GrantedComponent,
    redactor: &Redactor,
    stream: Stream,
    bytes: &[u8],
    cut: bool,
) {
    if bytes.is_empty() {
        return;
    }
    let text = String::from_utf8_lossy(bytes);
    let mut text = redactor.redacted(&text);
    if cut {
        redactor.cut_partial_tail(&mut text);
    }
    let stream = match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    for line in text.lines() {
        tracing::info!(target: "warden::plugin", plugin = &*plugin.component.inner.name, stream, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trap(t: Trap) -> wasmtime::Error {
        wasmtime::Error::from(t)
    }

    #[test]
    fn failures_are_attributed_deadline_then_fuel_then_denial_then_trap() {
        let none = Redactor::default();
        let limits = Limits {
            fuel: Some(7),
            ..Limits::default()
        };
        let denial = Some(Denial::Memory {
            requested: 200,
            limit: 100,
        });
        assert!(matches!(
            attribute(trap(Trap::Interrupt), &limits, denial, &none),
            LeaseFailure::Timeout { .. }
        ));
        assert_eq!(
            attribute(trap(Trap::OutOfFuel), &limits, denial, &none),
            LeaseFailure::OutOfFuel { limit: 7 }
        );
        assert_eq!(
            attribute(trap(Trap::UnreachableCodeReached), &limits, denial, &none),
            LeaseFailure::MemoryLimit {
                requested: 200,
                limit: 100
            }
        );
        let table = Some(Denial::Table {
            requested: 11,
            limit: 10,
        });
        assert_eq!(
            attribute(trap(Trap::UnreachableCodeReached), &limits, table, &none),
            LeaseFailure::TableLimit {
                requested: 11,
                limit: 10
            }
        );
        match attribute(trap(Trap::StackOverflow), &limits, None, &none) {
            LeaseFailure::Trap { message } => assert!(message.contains("stack"), "{message}"),
            other => panic!("{other:?}"),
        }
        match attribute(
            wasmtime::Error::from(wasmtime_wasi::I32Exit(3)),
            &limits,
            None,
            &none,
        ) {
            LeaseFailure::Trap { message } => {
                assert_eq!(message, "guest exited with status 3")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn long_trap_messages_are_cut() {
        let long = wasmtime::format_err!("{}", "é".repeat(MAX_TRAP_MESSAGE));
        match attribute(long, &Limits::default(), None, &Redactor::default()) {
            LeaseFailure::Trap { message } => {
                assert!(message.len() <= MAX_TRAP_MESSAGE + '…'.len_utf8());
                assert!(message.ends_with('…'));
            }
            other => panic!("{other:?}"),
        }
    }
}
