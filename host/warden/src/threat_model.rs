//! The threat model's two lists: every [`Surface`] where something from
//! outside Warden's trust arrives or is shown, and every [`Attacker`] that
//! can send it. docs/security.md states the model surface by surface, and
//! the suite's attack matrix (`tests/tests/all/attack_matrix.rs`) crosses
//! the two lists, naming for each pair the tests that prove containment or
//! why that attacker cannot reach that surface. A new surface is a new
//! variant here: the matrix does not build until it has a row, and the
//! documentation test fails until docs/security.md has its section.

use warden_sandbox::PluginKind;

/// Where untrusted input arrives or untrusted text is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Surface {
    /// The `warden` command line on a terminal: run output, the approval
    /// prompt, `runs show`.
    CliTerminal,
    /// The web console (`warden serve`'s pages).
    Console,
    /// `warden serve`'s JSON API and its connections, and the Prometheus
    /// `/metrics` endpoints (`warden serve`'s, `warden worker --metrics`).
    HttpApi,
    /// `warden mcp serve`: an agent's tools served to an MCP client.
    McpServe,
    /// MCP servers an agent uses as tools (`[mcp_servers]`).
    McpServersAsTools,
    /// A plugin of one world, through its grant.
    Plugin(PluginKind),
    /// Agents called as tools: child runs.
    ChildRuns,
    /// Forks of recorded runs.
    Forks,
    /// Standing approval rules (`warden approvals add`).
    StandingRules,
}

/// Who sends what Warden does not trust.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attacker {
    /// A plugin's component: its outputs, previews, errors, logs, files.
    Plugin,
    /// The model: its text, tool calls and arguments.
    Model,
    /// An MCP server used as a tool: its tool list, results and errors.
    McpServer,
    /// Anyone who can open a connection to `warden serve` or `warden mcp
    /// serve`, with or without a token.
    HttpClient,
}

impl Surface {
    /// Every surface, in the order docs/security.md states them.
    pub const ALL: [Surface; 12] = [
        Surface::CliTerminal,
        Surface::Console,
        Surface::HttpApi,
        Surface::McpServe,
        Surface::McpServersAsTools,
        Surface::Plugin(PluginKind::Tool),
        Surface::Plugin(PluginKind::Context),
        Surface::Plugin(PluginKind::Channel),
        Surface::Plugin(PluginKind::Policy),
        Surface::ChildRuns,
        Surface::Forks,
        Surface::StandingRules,
    ];

    /// Its place in [`Surface::ALL`] (a `match`, so a new surface does not
    /// build until it is placed).
    pub const fn ordinal(self) -> usize {
        match self {
            Surface::CliTerminal => 0,
            Surface::Console => 1,
            Surface::HttpApi => 2,
            Surface::McpServe => 3,
            Surface::McpServersAsTools => 4,
            Surface::Plugin(kind) => match kind {
                PluginKind::Tool => 5,
                PluginKind::Context => 6,
                PluginKind::Channel => 7,
                PluginKind::Policy => 8,
            },
            Surface::ChildRuns => 9,
            Surface::Forks => 10,
            Surface::StandingRules => 11,
        }
    }

    /// Its name, as docs/security.md's section for it is headed.
    pub const fn name(self) -> &'static str {
        match self {
            Surface::CliTerminal => "CLI terminal",
            Surface::Console => "console",
            Surface::HttpApi => "HTTP API",
            Surface::McpServe => "mcp serve",
            Surface::McpServersAsTools => "MCP servers as tools",
            Surface::Plugin(PluginKind::Tool) => "tool plugins",
            Surface::Plugin(PluginKind::Context) => "context plugins",
            Surface::Plugin(PluginKind::Channel) => "channel plugins",
            Surface::Plugin(PluginKind::Policy) => "policy plugins",
            Surface::ChildRuns => "child runs",
            Surface::Forks => "forks",
            Surface::StandingRules => "standing rules",
        }
    }
}

impl Attacker {
    /// Every attacker.
    pub const ALL: [Attacker; 4] = [
        Attacker::Plugin,
        Attacker::Model,
        Attacker::McpServer,
        Attacker::HttpClient,
    ];

    /// Its name.
    pub const fn name(self) -> &'static str {
        match self {
            Attacker::Plugin => "plugin",
            Attacker::Model => "model",
            Attacker::McpServer => "MCP server",
            Attacker::HttpClient => "HTTP client",
        }
    }
}

// Every surface is in `ALL`, once, at its ordinal.
const _: () = {
    let mut i = 0;
    while i < Surface::ALL.len() {
        assert!(Surface::ALL[i].ordinal() == i);
        i += 1;
    }
};
