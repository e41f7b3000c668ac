//! Witnesses of chain heads, read back and checked: what `warden store
//! witness` wrote (each run's event count and chain head, kept outside the
//! database, HMAC'd under the chain key when one is set), and what a run's
//! stored log must still hold to be trusted.
//!
//! Why here and not in a front end: a log rolled back whole (its tail cut,
//! its run row rewound) is self-consistent, so the chain cannot tell; only
//! a head recorded elsewhere can. A rolled-back run driven again makes the
//! cut writes again. So the [`Runtime`](crate::Runtime) given a witness
//! ([`Runtime::with_witness`](crate::Runtime::with_witness)) checks every
//! log it loads against it and refuses to record anything on a run that
//! fails ([`RuntimeError::RolledBack`](crate::runtime::RuntimeError::RolledBack)),
//! at its one write path: every driving verb of every front end (the
//! command line's `runs resume`, `approve`, `deny`, `fork`, `recover`,
//! workers, `warden serve`, the Python package) goes through it, and
//! nothing is performed before an intent is written.
//!
//! Format (version 1, JSON): `{"warden_witness": 1, "store", "taken_ms",
//! "key_id", "runs": [{"run_id", "event_count", "head", "mac"}]}`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use warden_store::{ChainHash, ChainKey, EventStore, RunId, StoreError, StoredEvent};

/// The domain tag of an entry's HMAC.
const TAG: &str = "warden.witness.v1";

/// A witness file as written.
#[derive(Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WitnessFile {
    /// The format version: 1.
    pub warden_witness: u32,
    /// The store it was taken of (as configured).
    pub store: String,
    /// When, in milliseconds since the Unix epoch.
    pub taken_ms: i64,
    /// The fingerprint of the chain key its entries are keyed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// One entry per intact run.
    pub runs: Vec<WitnessEntry>,
}

impl WitnessFile {
    /// A file of `runs`, keyed with `key` when given.
    pub fn new(store: String, taken_ms: i64, key: Option<&ChainKey>) -> Self {
        WitnessFile {
            warden_witness: 1,
            store,
            taken_ms,
            key_id: key.map(|k| k.id().to_owned()),
            runs: Vec::new(),
        }
    }

    /// Adds run `run_id` with `event_count` events and head `head`,
    /// keyed with `key` when given.
    pub fn add(
        &mut self,
        key: Option<&ChainKey>,
        run_id: RunId,
        event_count: u64,
        head: &ChainHash,
    ) {
        let head = head.to_hex();
        self.runs.push(WitnessEntry {
            mac: key.map(|k| mac(k, &run_id, event_count, &head)),
            run_id,
            event_count,
            head,
        });
    }
}

/// One run in a [`WitnessFile`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WitnessEntry {
    /// The run.
    pub run_id: RunId,
    /// How many events its log held.
    pub event_count: u64,
    /// The chain hash of its last event, hex.
    pub head: String,
    /// The entry's HMAC under the chain key, hex, when keyed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

fn mac(key: &ChainKey, run_id: &RunId, count: u64, head: &str) -> String {
    key.authenticate(
        TAG,
        &[
            run_id.as_str().as_bytes(),
            &count.to_be_bytes(),
            head.as_bytes(),
        ],
    )
    .to_hex()
}

/// A witness that cannot be used: nothing was checked against it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WitnessError {
    /// A file that cannot be read, is not a witness, is keyed with another
    /// key (or the key is not set), or carries an entry whose MAC does not
    /// match (altered).
    #[error("witness `{}`: {message}", .file.display())]
    Invalid {
        /// The file.
        file: PathBuf,
        /// What is wrong, and what to do.
        message: String,
    },
}

impl WitnessError {
    /// The stable code naming this error.
    pub fn code(&self) -> &'static str {
        match self {
            WitnessError::Invalid { .. } => "witness_invalid",
        }
    }

    /// The evidence that goes with [`code`](Self::code).
    pub fn details(&self) -> serde_json::Value {
        match self {
            WitnessError::Invalid { file, .. } => serde_json::json!({ "file": file }),
        }
    }
}

/// What the witnesses read say of each run: the most events any saw.
#[derive(Clone, Debug, Default)]
pub struct Witness {
    /// Where it was read from, for messages.
    source: PathBuf,
    runs: BTreeMap<RunId, (u64, String)>,
}

impl Witness {
    /// Reads the witness at `path`: a file, or every `*.json` file in a
    /// directory. Keyed entries are checked against `key`.
    pub fn read(path: &Path, key: Option<&ChainKey>) -> Result<Witness, WitnessError> {
        let invalid = |file: &Path, message: String| WitnessError::Invalid {
            file: file.to_owned(),
            message,
        };
        let files = if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| invalid(path, format!("cannot read the directory: {e}")))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect();
            files.sort();
            files
        } else {
            vec![path.to_owned()]
        };
        let mut runs: BTreeMap<RunId, (u64, String)> = BTreeMap::new();
        for file in files {
            let text = std::fs::read(&file).map_err(|e| invalid(&file, e.to_string()))?;
            let parsed: WitnessFile =
                serde_json::from_slice(&text).map_err(|e| invalid(&file, e.to_string()))?;
            let key = match (&parsed.key_id, key) {
                (None, _) => None,
                (Some(id), Some(key)) if id == key.id() => Some(key),
                (Some(id), _) => {
                    return Err(invalid(
                        &file,
                        format!("it is keyed with key {id}: set WARDEN_CHAIN_KEY to that key"),
                    ));
                }
            };
            for entry in parsed.runs {
                if let Some(key) = key {
                    let expected = mac(key, &entry.run_id, entry.event_count, &entry.head);
                    if entry.mac.as_deref() != Some(expected.as_str()) {
                        return Err(invalid(
                            &file,
                            format!(
                                "the entry of run {} does not carry the key's MAC: it was altered",
                                entry.run_id
                            ),
                        ));
                    }
                }
                let slot = runs
                    .entry(entry.run_id)
                    .or_insert((entry.event_count, entry.head.clone()));
                if entry.event_count > slot.0 {
                    *slot = (entry.event_count, entry.head);
                }
            }
        }
        Ok(Witness {
            source: path.to_owned(),
            runs,
        })
    }

    /// Where it was read from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The runs the witness saw.
    pub fn runs(&self) -> impl Iterator<Item = &RunId> {
        self.runs.keys()
    }

    /// What is wrong with run `id`'s stored log `events` against the
    /// witness, if anything: fewer events than it saw, or another event at
    /// its position.
    pub fn problem(&self, id: &RunId, events: &[StoredEvent]) -> Option<String> {
        let (count, head) = self.runs.get(id)?;
        if (events.len() as u64) < *count {
            return Some(format!(
                "rolled back: the log holds {} events, the witness saw {count} (head {head})",
                events.len()
            ));
        }
        let at: Option<&ChainHash> = count
            .checked_sub(1)
            .and_then(|i| events.get(i as usize))
            .map(|e| &e.hash);
        if at.is_some_and(|at| at.to_hex() != *head) {
            return Some(format!(
                "event {count} is not the one the witness saw (head {head}): the log was rewritten"
            ));
        }
        None
    }

    /// What is wrong with run `id` in `store` against the witness, if
    /// anything: [`problem`](Self::problem), or no run at all (a pruned run
    /// whose tombstone covers it is fine).
    pub async fn check(
        &self,
        store: &dyn EventStore,
        id: &RunId,
    ) -> Result<Option<String>, StoreError> {
        let Some((count, head)) = self.runs.get(id) else {
            return Ok(None);
        };
        match store.load(id).await {
            Ok(events) => Ok(self.problem(id, &events)),
            Err(StoreError::Pruned { event_count, .. }) if event_count >= *count => Ok(None),
            Err(StoreError::UnknownRun { .. }) => Ok(Some(format!(
                "the run is gone, but the witness saw {count} events (head {head})"
            ))),
            Err(e) => Err(e),
        }
    }
}
