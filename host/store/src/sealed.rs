//! Sealed rows: the integrity check over the rows kept outside the run
//! logs whose content decides what the engine does. Two tables hold them:
//!
//! - `approval_rules`: a standing rule approves calls without a human, so
//!   widening its spec, moving its expiry or clearing its revocation would
//!   let a write run that should wait;
//! - `commitments`: a settled commitment's result is what every later call
//!   with the same idempotency key records instead of running, so
//!   rewriting it forges a result, and rewriting its holder hands the key
//!   to another run.
//!
//! Each row carries a seal: the store's chain function (HMAC-SHA-256 under
//! the operator's [`ChainKey`](crate::ChainKey) when the store has one,
//! else SHA-256; one mechanism with the run logs' chain, see
//! `Chain::seal`) over a tag naming the table and the format, the row's
//! identity (the rule's id; the commitment's key and holder) and every
//! column the engine acts on. A seal moved from another row, or from
//! another store, does not match: the identity is inside it.
//!
//! The store writes the seal with the row (in the same statement) and
//! checks it on every read the engine acts on: a row whose seal does not
//! match is [`StoreError::RowTampered`] naming the table and the row, and
//! nothing acts on it. [`EventStore::verify_rows`](crate::EventStore::verify_rows)
//! checks every row and reports each one that fails.
//!
//! What this proves, honestly, mirrors the chain: with a key, changing a
//! row's content undetected needs the key; without one, a seal only
//! catches edits made by someone who does not recompute it. Neither mode
//! detects a row deleted whole, nor a row put back to an earlier state of
//! its own with the seal it had then (a revoked rule un-revoked by
//! restoring its earlier row): that, like a run rolled back whole, needs a
//! record kept outside the database.
//!
//! Rows a store held before seals existed (schema migration SQLite 11,
//! PostgreSQL 10) are sealed as found by that migration, in its
//! transaction, with the store's chain: from then on an unsealed row is a
//! finding like any other.

use super::chain::Chain;
use super::{ApprovalRule, ChainHash, StoreError};

/// The table of standing approval rules.
pub const RULES: &str = "approval_rules";
/// The table of idempotency commitments.
pub const COMMITMENTS: &str = "commitments";

/// The tag of a rule's seal; the version names the format of the parts.
const RULE_TAG: &str = "warden.store.seal.approval_rule.v1";
/// The tag of a commitment's seal.
const COMMITMENT_TAG: &str = "warden.store.seal.commitment.v1";

/// How a sealed row fails its check.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RowBreak {
    /// The row has no seal (it was inserted, or its seal cleared, behind
    /// the store's back).
    #[error("the row carries no seal")]
    Unsealed,
    /// The seal does not match the row's content and identity: the row was
    /// edited, or its seal copied from another row.
    #[error("its seal does not match its content")]
    Mismatch,
    /// The stored seal cannot be read as one.
    #[error("its seal is unreadable: {detail}")]
    Unreadable {
        /// What was wrong.
        detail: String,
    },
}

/// One sealed row that fails its check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowFinding {
    /// The table ([`RULES`] or [`COMMITMENTS`]).
    pub table: &'static str,
    /// The row: a rule's id, a commitment's key.
    pub row: String,
    /// What is wrong with it.
    pub reason: RowBreak,
}

/// The result of checking every sealed row of a store
/// ([`EventStore::verify_rows`](crate::EventStore::verify_rows)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RowsReport {
    /// Each sealed table checked, with the number of rows read.
    pub tables: Vec<(&'static str, u64)>,
    /// Every row that fails, by table then row.
    pub findings: Vec<RowFinding>,
}

impl RowsReport {
    /// A report over `tables` (with their row counts) and `findings`.
    pub fn new(tables: Vec<(&'static str, u64)>, findings: Vec<RowFinding>) -> Self {
        RowsReport { tables, findings }
    }

    /// Whether every row checked out.
    pub fn is_intact(&self) -> bool {
        self.findings.is_empty()
    }
}

/// An optional value as a part: empty for none, a marker byte then the
/// value otherwise, so `None` and `Some("")` differ.
fn optional(value: Option<&[u8]>) -> Vec<u8> {
    match value {
        None => Vec::new(),
        Some(bytes) => {
            let mut part = Vec::with_capacity(bytes.len() + 1);
            part.push(1);
            part.extend_from_slice(bytes);
            part
        }
    }
}

/// The seal of rule `rule`: its id and every column.
pub(crate) fn rule(chain: &Chain, rule: &ApprovalRule) -> ChainHash {
    let created = rule.created_ms.to_be_bytes();
    let expires = optional(
        rule.expires_ms
            .map(i64::to_be_bytes)
            .as_ref()
            .map(|b| &b[..]),
    );
    let revoked_by = optional(rule.revoked.as_ref().map(|r| r.by.as_bytes()));
    let revoked_at = optional(
        rule.revoked
            .as_ref()
            .map(|r| r.at_ms.to_be_bytes())
            .as_ref()
            .map(|b| &b[..]),
    );
    chain.seal(
        RULE_TAG,
        &[
            rule.id.as_bytes(),
            rule.spec.as_bytes(),
            rule.created_by.as_bytes(),
            &created,
            &expires,
            &revoked_by,
            &revoked_at,
        ],
    )
}

/// The seal of commitment `key` held by `run_id`'s call `call_id`, settled
/// with `result` or not yet.
pub(crate) fn commitment(
    chain: &Chain,
    key: &str,
    run_id: &str,
    call_id: &str,
    result: Option<&[u8]>,
) -> ChainHash {
    chain.seal(
        COMMITMENT_TAG,
        &[
            key.as_bytes(),
            run_id.as_bytes(),
            call_id.as_bytes(),
            &optional(result),
        ],
    )
}

/// Compares a stored seal with the one its row should carry.
pub(crate) fn compare(stored: Option<&[u8]>, expected: &ChainHash) -> Result<(), RowBreak> {
    let Some(stored) = stored else {
        return Err(RowBreak::Unsealed);
    };
    if stored.len() != ChainHash::LEN {
        return Err(RowBreak::Unreadable {
            detail: format!("it is {} bytes, expected {}", stored.len(), ChainHash::LEN),
        });
    }
    // Every byte compared, whatever the first difference.
    let differ = stored
        .iter()
        .zip(expected.as_bytes())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    if differ == 0 {
        Ok(())
    } else {
        Err(RowBreak::Mismatch)
    }
}

/// [`compare`], as the error a read that would act on the row returns.
pub(crate) fn check(
    table: &'static str,
    row: &str,
    stored: Option<&[u8]>,
    expected: &ChainHash,
) -> Result<(), StoreError> {
    compare(stored, expected).map_err(|reason| {
        tracing::warn!(table, row, %reason, "a sealed row fails its integrity check");
        StoreError::RowTampered {
            table,
            row: row.to_owned(),
            reason,
        }
    })
}

/// Collects the finding of one row into `findings`.
pub(crate) fn collect(
    findings: &mut Vec<RowFinding>,
    table: &'static str,
    row: &str,
    stored: Option<&[u8]>,
    expected: &ChainHash,
) {
    if let Err(reason) = compare(stored, expected) {
        findings.push(RowFinding {
            table,
            row: row.to_owned(),
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChainKey, Revocation};

    fn a_rule() -> ApprovalRule {
        ApprovalRule {
            id: "rule-1".into(),
            spec: r#"{"tool":"fs"}"#.into(),
            created_by: "ops".into(),
            created_ms: 10,
            expires_ms: None,
            revoked: None,
        }
    }

    #[test]
    fn every_column_and_the_identity_are_sealed() {
        let chain = Chain::new(Some(ChainKey::new(&[3; 32]).unwrap()));
        let base = rule(&chain, &a_rule());
        let edits: [fn(&mut ApprovalRule); 6] = [
            |r| r.id = "rule-2".into(),
            |r| r.spec = r#"{"tool":"*"}"#.into(),
            |r| r.created_by = "else".into(),
            |r| r.created_ms = 11,
            |r| r.expires_ms = Some(0),
            |r| {
                r.revoked = Some(Revocation {
                    by: String::new(),
                    at_ms: 0,
                })
            },
        ];
        for edit in edits {
            let mut edited = a_rule();
            edit(&mut edited);
            assert_ne!(rule(&chain, &edited), base, "{edited:?}");
        }
        let held = commitment(&chain, "k", "run-a", "c1", None);
        assert_ne!(held, commitment(&chain, "k", "run-a", "c1", Some(b"")));
        assert_ne!(held, commitment(&chain, "k2", "run-a", "c1", None));
        assert_ne!(held, commitment(&chain, "k", "run-b", "c1", None));
        // Parts cannot slide into each other.
        assert_ne!(
            commitment(&chain, "ab", "c", "d", None),
            commitment(&chain, "a", "bc", "d", None)
        );
    }

    #[test]
    fn a_seal_depends_on_the_key_and_is_checked_whole() {
        let plain = Chain::default();
        let k1 = Chain::new(Some(ChainKey::new(&[1; 32]).unwrap()));
        let k2 = Chain::new(Some(ChainKey::new(&[2; 32]).unwrap()));
        let r = a_rule();
        assert_ne!(rule(&plain, &r), rule(&k1, &r));
        assert_ne!(rule(&k1, &r), rule(&k2, &r));
        let seal = rule(&k1, &r);
        assert_eq!(compare(Some(seal.as_bytes()), &seal), Ok(()));
        assert_eq!(compare(None, &seal), Err(RowBreak::Unsealed));
        let other = rule(&k2, &r);
        assert_eq!(
            compare(Some(other.as_bytes()), &seal),
            Err(RowBreak::Mismatch)
        );
        assert!(matches!(
            compare(Some(&[1, 2]), &seal),
            Err(RowBreak::Unreadable { .. })
        ));
        // The keyed seal is the key's `authenticate`, so a tool holding the
        // key can check it.
        let key = ChainKey::new(&[1; 32]).unwrap();
        assert_eq!(
            commitment(&k1, "k", "r", "c", None),
            key.authenticate(COMMITMENT_TAG, &[b"k", b"r", b"c", b""])
        );
    }
}
