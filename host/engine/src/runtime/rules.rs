//! The runtime's side of standing approval rules ([`crate::approvals`]):
//! the verbs that create, list and revoke them ([`Runtime::add_rule`],
//! [`Runtime::rules`], [`Runtime::revoke_rule`]), approving a call with a
//! wider scope ([`Runtime::approve_scoped`]), and the two reads the step
//! loop makes: the rule that approves a call about to park for a human
//! ([`Runtime::granting_rule`]), and, right before an approved call runs,
//! whether the rule that approved it still stands
//! ([`Runtime::lapsed_rule`]). Both read the store each time, so a
//! revocation made by any host stops the next call on every host.

use sha2::{Digest as _, Sha256};
use warden_store::{ApprovalRule, RuleStanding, StoreError};

use super::log::Log;
use super::{Runtime, RuntimeError};
use crate::approvals::{Rule, RuleError, RuleSpec};
use crate::decide::ApprovalRequest;
use crate::events::{ApprovalWithdrawn, Event, GrantingRule, WithdrawReason};
use crate::ids::{CallId, RunId};
use crate::state::ToolCallProgress;

/// How far an approval reaches beyond the call approved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApprovalScope {
    /// This call only.
    #[default]
    Call,
    /// This call, and later calls of the same tool in the same run.
    Run,
    /// This call, and later calls of the same tool in any run of the
    /// run's session.
    Session,
}

impl Runtime {
    /// Creates a standing rule approving what `spec` matches until
    /// `expires_ms` (never, if `None`), recorded as made by `by`. Refused
    /// with [`RuntimeError::Rule`] when the spec approves too much or is
    /// expired already.
    pub async fn add_rule(
        &self,
        spec: RuleSpec,
        by: &str,
        expires_ms: Option<i64>,
    ) -> Result<Rule, RuntimeError> {
        spec.check().map_err(RuntimeError::Rule)?;
        let created_ms = self.inner.clock.now_ms() as i64;
        if let Some(expires_ms) = expires_ms
            && expires_ms <= created_ms
        {
            return Err(RuntimeError::Rule(RuleError::AlreadyExpired {
                created_ms,
                expires_ms,
            }));
        }
        let text = serde_json::to_string(&spec).expect("a rule spec serializes");
        // Random, and distinct for distinct rules even under a fixed
        // random source (tests): the spec and the time are mixed in.
        let mut hasher = Sha256::new();
        hasher.update(self.inner.random.next_u64().to_be_bytes());
        hasher.update(created_ms.to_be_bytes());
        hasher.update(by.as_bytes());
        hasher.update(text.as_bytes());
        let id = format!("rule-{}", &hex::encode(hasher.finalize())[..16]);
        let stored = ApprovalRule {
            id,
            spec: text,
            created_by: by.to_owned(),
            created_ms,
            expires_ms,
            revoked: None,
        };
        self.inner.store.add_rule(&stored).await?;
        tracing::info!(rule = %stored.id, by, "approval rule created");
        Rule::from_stored(&stored).map_err(RuntimeError::Rule)
    }

    /// Every rule, revoked and expired ones included, oldest first. A rule
    /// this engine cannot read is an error naming it.
    pub async fn rules(&self) -> Result<Vec<Rule>, RuntimeError> {
        self.inner
            .store
            .rules()
            .await?
            .iter()
            .map(|r| Rule::from_stored(r).map_err(RuntimeError::Rule))
            .collect()
    }

    /// Revokes rule `id` as `by`: from now on it approves nothing, and a
    /// call it approved that has not run yet waits for a human again.
    pub async fn revoke_rule(&self, id: &str, by: &str) -> Result<Rule, RuntimeError> {
        let now = self.inner.clock.now_ms() as i64;
        let stored = self.inner.store.revoke_rule(id, by, now).await?;
        tracing::info!(rule = %id, by, "approval rule revoked");
        Rule::from_stored(&stored).map_err(RuntimeError::Rule)
    }

    /// [`approve_digest`](Self::approve_digest), and for a wider `scope`
    /// first a rule (made by `by`, expiring at `expires_ms`) approving
    /// later calls of the same tool in the run or its session. Returns
    /// the rule made, if any. A run outside any session cannot approve for
    /// its session (`RuntimeError::Rule`); nothing is recorded then.
    pub async fn approve_scoped(
        &self,
        run_id: &RunId,
        call_id: &CallId,
        by: &str,
        expected: Option<&str>,
        scope: ApprovalScope,
        expires_ms: Option<i64>,
    ) -> Result<Option<Rule>, RuntimeError> {
        let rule = match scope {
            ApprovalScope::Call => None,
            ApprovalScope::Run | ApprovalScope::Session => {
                let log = self.awaiting_approval(run_id, call_id).await?;
                let call = log
                    .state
                    .next_call()
                    .expect("a run awaiting approval has a next call");
                let mut spec =
                    RuleSpec::for_tool(None, Some(&call.call.name)).map_err(RuntimeError::Rule)?;
                if scope == ApprovalScope::Run {
                    spec.run = Some(run_id.clone());
                } else {
                    spec.session = Some(log.state.session_id.clone().ok_or_else(|| {
                        RuntimeError::Rule(RuleError::NoSession {
                            run_id: run_id.clone(),
                        })
                    })?);
                }
                Some(self.add_rule(spec, by, expires_ms).await?)
            }
        };
        self.approve_digest(run_id, call_id, by, expected).await?;
        Ok(rule)
    }

    /// The approval a live rule grants `request` (made by run `log`), if
    /// one does: the event to record after the request. A store that keeps
    /// no rules grants nothing.
    pub(super) async fn granting_rule(
        &self,
        log: &Log,
        request: &ApprovalRequest,
    ) -> Result<Option<Event>, RuntimeError> {
        let stored = match self.inner.store.rules().await {
            Ok(stored) => stored,
            Err(StoreError::Unsupported { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let now = self.inner.clock.now_ms();
        let session = log.state.session_id.as_ref();
        // A rule this engine cannot read approves nothing.
        let rule = stored
            .iter()
            .filter_map(|s| Rule::from_stored(s).ok())
            .find(|r| {
                r.approves(
                    now as i64,
                    &request.tool,
                    &request.arguments,
                    &log.run_id,
                    session,
                )
            });
        Ok(rule.map(|rule| {
            Event::ApprovalGranted(crate::events::ApprovalGranted {
                call_id: request.call_id.clone(),
                by: format!("rule:{}", rule.id),
                digest: Some(request.digest()),
                rule: Some(GrantingRule {
                    id: rule.id,
                    created_by: rule.created_by,
                }),
                at_ms: Some(now),
            })
        }))
    }

    /// When the next call was approved by a rule that no longer stands
    /// (revoked, expired, or gone), the withdrawal to record before it
    /// runs: checked right before its intent is written, on whichever host
    /// runs it.
    pub(super) async fn lapsed_rule(&self, log: &Log) -> Result<Option<Event>, RuntimeError> {
        let Some(call) = log.state.next_call() else {
            return Ok(None);
        };
        let ToolCallProgress::Approved {
            digest,
            rule: Some(rule),
            ..
        } = &call.progress
        else {
            return Ok(None);
        };
        let now = self.inner.clock.now_ms();
        let standing = match self.inner.store.rule(&rule.id).await? {
            Some(stored) => stored.standing(now as i64),
            None => RuleStanding::Revoked,
        };
        let reason = match standing {
            RuleStanding::Live => return Ok(None),
            RuleStanding::Revoked => WithdrawReason::RuleRevoked,
            RuleStanding::Expired => WithdrawReason::RuleExpired,
        };
        tracing::info!(run_id = %log.run_id, call_id = %call.call_id, rule = %rule.id, reason = reason.as_str(), "the rule that approved the call no longer stands; it waits for approval");
        Ok(Some(Event::ApprovalWithdrawn(ApprovalWithdrawn {
            call_id: call.call_id.clone(),
            reason,
            approved: digest.clone(),
            call: call.digest(),
            rule: Some(rule.id.clone()),
            at_ms: Some(now),
        })))
    }
}
