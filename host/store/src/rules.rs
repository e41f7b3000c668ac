//! Standing approval rules as the store keeps them: [`ApprovalRule`] (an
//! id, what it matches as the engine's JSON, who made it and when, an
//! optional expiry, and its revocation once revoked) and the contract of
//! the trait's rule methods (`add_rule`, `rules`, `rule`, `revoke_rule`).
//!
//! Rules live in the store, beside the runs, so that every worker and host
//! sharing it sees the same rules, and a revocation made anywhere stops
//! the next call everywhere: the engine reads the rule when it would grant
//! an approval with it, and again right before the approved call runs.
//! The store never reads `spec` (the engine owns what a rule matches), and
//! never deletes a rule: a revoked or expired one stays for the audit
//! trail that names it.

use serde::{Deserialize, Serialize};

/// One standing rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRule {
    /// Its id (`rule-<hex>`, chosen by the engine).
    pub id: String,
    /// What it approves, as the engine writes it (JSON).
    pub spec: String,
    /// Who created it (`api:<token>`, a CLI user).
    pub created_by: String,
    /// When, in milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// When it stops approving anything, if ever.
    pub expires_ms: Option<i64>,
    /// Its revocation, once revoked.
    pub revoked: Option<Revocation>,
}

/// Who revoked a rule, and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// Who.
    pub by: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: i64,
}

/// Whether a rule may approve a call at a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleStanding {
    /// It approves what it matches.
    Live,
    /// It was revoked.
    Revoked,
    /// Its time is up.
    Expired,
}

impl RuleStanding {
    /// The standing at `now_ms` of a rule that expires at `expires_ms` and
    /// is `revoked` or not: revoked before expired.
    pub fn at(revoked: bool, expires_ms: Option<i64>, now_ms: i64) -> RuleStanding {
        if revoked {
            RuleStanding::Revoked
        } else if expires_ms.is_some_and(|at| now_ms >= at) {
            RuleStanding::Expired
        } else {
            RuleStanding::Live
        }
    }
}

impl ApprovalRule {
    /// The rule's standing at `now_ms`.
    pub fn standing(&self, now_ms: i64) -> RuleStanding {
        RuleStanding::at(self.revoked.is_some(), self.expires_ms, now_ms)
    }
}
