//! The verbs on idempotency keys, the commitments keyed calls hold in the
//! store: `keys` and `key` (each with the state its holder run leaves it
//! in), and a human's `release_key` and `settle_key`, each recorded in the
//! holder run's log in the transaction that changes the commitment.

use bytes::Bytes;
use serde_json::Value;

use super::Runtime;
use super::error::RuntimeError;
use crate::events::{Event, KeyReleased, KeySettled, ToolCallResult};
use crate::ids::{CallId, RunId};
use crate::keys::{KeyInfo, KeyState};
use warden_store::{CommitmentFilter, Holder, Settle, Settlement, StoreError};

impl Runtime {
    /// The idempotency keys `filter` matches, in key order, each with the
    /// state its holder run leaves it in.
    pub async fn keys(&self, filter: &CommitmentFilter) -> Result<Vec<KeyInfo>, RuntimeError> {
        let mut keys = Vec::new();
        for commitment in self.inner.store.commitments(filter).await? {
            let status = self.listed_status(&commitment.holder.run_id).await?;
            keys.push(KeyInfo::new(commitment, status));
        }
        Ok(keys)
    }

    /// The idempotency key `key`, or [`RuntimeError::UnknownKey`].
    pub async fn key(&self, key: &str) -> Result<KeyInfo, RuntimeError> {
        self.keys(&CommitmentFilter::new().key(key))
            .await?
            .pop()
            .ok_or_else(|| RuntimeError::UnknownKey {
                key: key.to_owned(),
            })
    }

    /// Releases idempotency key `key`, so that the next run with it makes
    /// the call: recorded as [`Event::KeyReleased`] in the holder run's log,
    /// in the transaction that deletes the commitment. Refused while the
    /// holder run has not ended and the key is unsettled
    /// ([`RuntimeError::KeyInUse`]: its call may be running) and when the
    /// holder run was pruned ([`RuntimeError::KeyHolderGone`]). Returns the
    /// key as it was.
    pub async fn release_key(
        &self,
        key: &str,
        by: &str,
        note: Option<String>,
    ) -> Result<KeyInfo, RuntimeError> {
        let info = self.key(key).await?;
        let holder = Holder {
            run_id: info.run_id.clone(),
            call_id: info.call_id.clone(),
        };
        let Some(status) = &info.run_status else {
            return Err(RuntimeError::KeyHolderGone {
                key: key.to_owned(),
                holder,
            });
        };
        if info.state == KeyState::Held {
            return Err(RuntimeError::KeyInUse {
                key: key.to_owned(),
                status: status.clone(),
                holder,
            });
        }
        let mut log = self.load_log(&holder.run_id).await?;
        let event = Event::KeyReleased(KeyReleased {
            key: key.to_owned(),
            call_id: CallId::from_text(holder.call_id.clone()),
            by: by.to_owned(),
            note,
        });
        let release = Settlement {
            key: key.to_owned(),
            holder,
            outcome: Settle::Release,
        };
        self.append_with(&mut log, vec![event], Some(&release))
            .await?;
        Ok(info)
    }

    /// Settles idempotency key `key`, held unsettled by a run that ended
    /// (orphaned), with `output`, the call's outcome as the operator found
    /// it: later runs with the key get it (a `tool_call_deduplicated`) and
    /// make no call. Recorded as [`Event::KeySettled`] in the holder run's
    /// log, in the transaction that settles the key, with `by` and `note`.
    /// Refused while the holder has not ended ([`RuntimeError::KeyInUse`]:
    /// `resolve` settles it there), when it is settled already
    /// ([`RuntimeError::KeyAlreadySettled`]) and when the holder was pruned.
    pub async fn settle_key(
        &self,
        key: &str,
        output: Value,
        by: &str,
        note: Option<String>,
    ) -> Result<KeyInfo, RuntimeError> {
        let info = self.key(key).await?;
        let holder = Holder {
            run_id: info.run_id.clone(),
            call_id: info.call_id.clone(),
        };
        let Some(status) = &info.run_status else {
            return Err(RuntimeError::KeyHolderGone {
                key: key.to_owned(),
                holder,
            });
        };
        match info.state {
            KeyState::Held => {
                return Err(RuntimeError::KeyInUse {
                    key: key.to_owned(),
                    status: status.clone(),
                    holder,
                });
            }
            KeyState::Settled => {
                return Err(RuntimeError::KeyAlreadySettled {
                    key: key.to_owned(),
                    holder,
                });
            }
            KeyState::Orphaned => {}
        }
        let result = ToolCallResult::Output(output.clone());
        let mut log = self.load_log(&holder.run_id).await?;
        let event = Event::KeySettled(KeySettled {
            key: key.to_owned(),
            call_id: CallId::from_text(holder.call_id.clone()),
            output,
            by: by.to_owned(),
            note,
        });
        let settle = Settlement {
            key: key.to_owned(),
            holder,
            outcome: Settle::Result(Bytes::from(
                serde_json::to_vec(&result).expect("a tool call result serializes"),
            )),
        };
        self.append_with(&mut log, vec![event], Some(&settle))
            .await?;
        Ok(info)
    }

    /// The listed status of run `run_id`, `None` when it was pruned.
    async fn listed_status(&self, run_id: &RunId) -> Result<Option<String>, RuntimeError> {
        match self.inner.store.summary(run_id).await {
            Ok(s) => Ok(Some(s.status)),
            Err(StoreError::UnknownRun { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}
