//! A run's status ([`RunStatus`]), derived from its log by the fold, and
//! how the store lists it ([`RunStatus::listing`]): the one place the
//! engine's statuses meet the store's.

use warden_store::{ListingStatus, StatusClass};

/// Where a run stands, derived from its log alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// It can make progress.
    Running,
    /// A tool call waits for a human's approval.
    AwaitingApproval,
    /// It waits for a human's input.
    Suspended,
    /// It waits for the embedding application to perform an external tool
    /// call and report its output.
    AwaitingExternal,
    /// The child run of the call in flight (an agent called as a tool)
    /// waits for a human, the application or a timer; the run goes on
    /// when a drive finds the child moved on.
    AwaitingChild,
    /// A budget is used up; a human may extend it.
    BudgetExceeded,
    /// A failed model call's next attempt is due later than a driver waits:
    /// the run is parked until its wake-up time, when a worker (or `runs
    /// resume`) drives it again.
    Waiting,
    /// A write intent has no completion: nobody knows whether the write
    /// happened, so a human must resolve it. Every automatic verb refuses.
    NeedsReconciliation,
    /// It finished with an output.
    Completed,
    /// It failed.
    Failed,
    /// It was cancelled.
    Cancelled,
    /// A human abandoned it.
    Abandoned,
}

impl RunStatus {
    /// Every status.
    pub const ALL: [RunStatus; 12] = [
        RunStatus::Running,
        RunStatus::AwaitingApproval,
        RunStatus::Suspended,
        RunStatus::AwaitingExternal,
        RunStatus::AwaitingChild,
        RunStatus::BudgetExceeded,
        RunStatus::Waiting,
        RunStatus::NeedsReconciliation,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::Abandoned,
    ];

    /// The snake_case name, as serialized.
    pub fn as_str(self) -> &'static str {
        self.listing().name()
    }

    /// The status as the store lists it. The store acts on its class (see
    /// [`warden_store::StatusClass`]): what a worker may claim,
    /// what holds a session; so this match is where the engine's statuses
    /// meet the store's, and the statuses the store acts on are its own.
    pub const fn listing(self) -> ListingStatus {
        // Consts, so a name the store gives meaning to fails the build.
        const AWAITING_APPROVAL: ListingStatus = ListingStatus::parked("awaiting_approval");
        const SUSPENDED: ListingStatus = ListingStatus::parked("suspended");
        const AWAITING_EXTERNAL: ListingStatus = ListingStatus::parked("awaiting_external");
        const AWAITING_CHILD: ListingStatus = ListingStatus::parked("awaiting_child");
        const BUDGET_EXCEEDED: ListingStatus = ListingStatus::parked("budget_exceeded");
        const NEEDS_RECONCILIATION: ListingStatus = ListingStatus::parked("needs_reconciliation");
        match self {
            RunStatus::Running => ListingStatus::RUNNING,
            RunStatus::AwaitingApproval => AWAITING_APPROVAL,
            RunStatus::Suspended => SUSPENDED,
            RunStatus::AwaitingExternal => AWAITING_EXTERNAL,
            RunStatus::AwaitingChild => AWAITING_CHILD,
            RunStatus::BudgetExceeded => BUDGET_EXCEEDED,
            RunStatus::Waiting => ListingStatus::WAITING,
            RunStatus::NeedsReconciliation => NEEDS_RECONCILIATION,
            RunStatus::Completed => ListingStatus::COMPLETED,
            RunStatus::Failed => ListingStatus::FAILED,
            RunStatus::Cancelled => ListingStatus::CANCELLED,
            RunStatus::Abandoned => ListingStatus::ABANDONED,
        }
    }

    /// Whether the run is over: what the store treats as settled.
    pub fn is_terminal(self) -> bool {
        self.listing().class() == StatusClass::Settled
    }

    /// Whether the run waits: for a human (approval, input, a budget, or a
    /// reconciliation), the application, or its wake-up time.
    pub fn is_parked(self) -> bool {
        matches!(
            self.listing().class(),
            StatusClass::Parked | StatusClass::Waiting
        )
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RunStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "`{s}` is not a run status (use one of: {})",
                    RunStatus::ALL.map(RunStatus::as_str).join(", ")
                )
            })
    }
}
