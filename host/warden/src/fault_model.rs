//! The never-repeat guarantee's two lists: every [`EffectKind`] Warden
//! performs or starts on a run's behalf, and every [`Fault`] a run must
//! come through around one. The guarantee is the same for each pair: a
//! write is performed at most once, no target is left torn, nothing the
//! store acknowledged is lost, and the run ends in a state the docs name
//! (completed, or waiting for the human the docs name). The suite's effects
//! matrix (`tests/tests/all/effects_matrix.rs`) crosses the two lists on
//! SQLite and PostgreSQL. A new effect kind or fault is a new variant here:
//! the matrix does not build until each of its cells is decided.

use warden_plugins::grant::EffectClass;

/// Something Warden does, or has done, on a run's behalf that changes the
/// world or decides what runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EffectKind {
    /// A plugin's tool call, run with this effect class.
    PluginTool(EffectClass),
    /// A plugin write with an idempotency key: its commitment is claimed
    /// before it runs and settled with its result, and a later run with the
    /// same key gets that result instead of running it.
    KeyedWrite,
    /// A tool of an MCP server run by Warden (`command`, over stdio, in the
    /// OS sandbox).
    McpLocalTool,
    /// A tool of a remote MCP server (`url`, streamable HTTP).
    McpRemoteTool,
    /// An agent called as a tool: one child run.
    ChildRun,
    /// Child runs started by one answer, driven at once.
    ChildBatch,
    /// A delivery to a channel plugin.
    Delivery,
    /// An external tool: the application performs it and reports back.
    ExternalTool,
    /// A write approved by a standing approval rule.
    RuleApproval,
    /// An operator's settlement of an orphaned key (`warden keys settle`),
    /// whose output later runs with the key get.
    KeySettlement,
}

/// What can happen to the process driving a run while an effect is under
/// way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The driving process dies (SIGKILL, power loss) at an append, before
    /// it is durable: at every append of every run, in turn.
    KillBeforeAppend,
    /// The driving process dies at an append after it is durable, before
    /// it learns so: at every append of every run, in turn.
    KillAfterAppend,
    /// The driver stops inside the effect (before the append that opens it,
    /// after that append, before the append that closes it) past its
    /// claim; another driver takes the run over and an operator finishes
    /// it; then the first wakes.
    PausePastClaim,
    /// The driver learns inside the effect that its claim is gone (its
    /// validity is revoked, as a failed renewal does) and goes on.
    ClaimLost,
    /// One append fails and the process goes on: a full disk (nothing
    /// written) or a server restart (written, never acknowledged); at
    /// every append of every run, in turn.
    StoreFailure,
}

impl EffectKind {
    /// Every effect kind, in the order the matrix prints them.
    pub const ALL: [EffectKind; 12] = [
        EffectKind::PluginTool(EffectClass::Read),
        EffectKind::PluginTool(EffectClass::Idempotent),
        EffectKind::PluginTool(EffectClass::Write),
        EffectKind::KeyedWrite,
        EffectKind::McpLocalTool,
        EffectKind::McpRemoteTool,
        EffectKind::ChildRun,
        EffectKind::ChildBatch,
        EffectKind::Delivery,
        EffectKind::ExternalTool,
        EffectKind::RuleApproval,
        EffectKind::KeySettlement,
    ];

    /// Its place in [`EffectKind::ALL`] (a `match`, so a new kind does not
    /// build until it is placed).
    pub const fn ordinal(self) -> usize {
        match self {
            EffectKind::PluginTool(class) => match class {
                EffectClass::Read => 0,
                EffectClass::Idempotent => 1,
                EffectClass::Write => 2,
            },
            EffectKind::KeyedWrite => 3,
            EffectKind::McpLocalTool => 4,
            EffectKind::McpRemoteTool => 5,
            EffectKind::ChildRun => 6,
            EffectKind::ChildBatch => 7,
            EffectKind::Delivery => 8,
            EffectKind::ExternalTool => 9,
            EffectKind::RuleApproval => 10,
            EffectKind::KeySettlement => 11,
        }
    }

    /// Its name, as the matrix's table shows it.
    pub const fn name(self) -> &'static str {
        match self {
            EffectKind::PluginTool(EffectClass::Read) => "plugin read",
            EffectKind::PluginTool(EffectClass::Idempotent) => "plugin idempotent",
            EffectKind::PluginTool(EffectClass::Write) => "plugin write",
            EffectKind::KeyedWrite => "keyed write",
            EffectKind::McpLocalTool => "MCP tool (local)",
            EffectKind::McpRemoteTool => "MCP tool (remote)",
            EffectKind::ChildRun => "child run",
            EffectKind::ChildBatch => "child batch",
            EffectKind::Delivery => "delivery",
            EffectKind::ExternalTool => "external tool",
            EffectKind::RuleApproval => "rule approval",
            EffectKind::KeySettlement => "key settlement",
        }
    }
}

impl Fault {
    /// Every fault, in the order the matrix prints them.
    pub const ALL: [Fault; 5] = [
        Fault::KillBeforeAppend,
        Fault::KillAfterAppend,
        Fault::PausePastClaim,
        Fault::ClaimLost,
        Fault::StoreFailure,
    ];

    /// Its place in [`Fault::ALL`].
    pub const fn ordinal(self) -> usize {
        match self {
            Fault::KillBeforeAppend => 0,
            Fault::KillAfterAppend => 1,
            Fault::PausePastClaim => 2,
            Fault::ClaimLost => 3,
            Fault::StoreFailure => 4,
        }
    }

    /// Its name, as the matrix's table shows it.
    pub const fn name(self) -> &'static str {
        match self {
            Fault::KillBeforeAppend => "kill before append",
            Fault::KillAfterAppend => "kill after append",
            Fault::PausePastClaim => "pause past claim",
            Fault::ClaimLost => "claim lost",
            Fault::StoreFailure => "store failure",
        }
    }
}

// Every kind and fault is in its `ALL`, once, at its ordinal.
const _: () = {
    let mut i = 0;
    while i < EffectKind::ALL.len() {
        assert!(EffectKind::ALL[i].ordinal() == i);
        i += 1;
    }
    let mut i = 0;
    while i < Fault::ALL.len() {
        assert!(Fault::ALL[i].ordinal() == i);
        i += 1;
    }
};
