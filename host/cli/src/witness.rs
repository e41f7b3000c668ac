//! Witnesses of chain heads: `warden store witness` writes, for every
//! intact run, its event count and chain head to a file the operator keeps
//! outside the database; `runs verify --witness` and `runs recover
//! --witness` then refuse a log that holds fewer events than its witness
//! saw, or another event at that position.
//!
//! Why: someone with write access to the database can cut a run's tail and
//! rewind its run row to an earlier count and stored head. The result is
//! self-consistent, so the chain (keyed or not) cannot tell; only a head
//! recorded elsewhere can. With `WARDEN_CHAIN_KEY` set, each entry carries
//! an HMAC under the key, so a witness cannot be forged without it either.
//!
//! Format (version 1, JSON): `{"warden_witness": 1, "store", "taken_ms",
//! "key_id", "runs": [{"run_id", "event_count", "head", "mac"}]}`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Context;
use super::config::Settings;
use super::errors::CliError;
use super::store::{Access, open};
use warden::store::{ChainHash, ChainKey, EventStore, RunId, StoreError};

const TAG: &str = "warden.witness.v1";

#[derive(Debug, Serialize, Deserialize)]
struct File {
    warden_witness: u32,
    store: String,
    taken_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_id: Option<String>,
    runs: Vec<Entry>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    run_id: RunId,
    event_count: u64,
    head: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mac: Option<String>,
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

/// `warden store witness DEST`.
pub(crate) async fn write(ctx: &Context, dest: PathBuf) -> anyhow::Result<()> {
    let store = open(&ctx.settings, Access::Read).await?;
    let key = ctx.settings.chain_key.as_ref();
    let mut runs = Vec::new();
    let mut skipped = Vec::new();
    for id in store.run_ids().await? {
        let report = store.verify(&id).await?;
        match (report.is_intact(), report.recorded_head) {
            (true, Some(head)) => {
                let head = head.to_hex();
                runs.push(Entry {
                    mac: key.map(|k| mac(k, &id, report.recorded_count, &head)),
                    run_id: id,
                    event_count: report.recorded_count,
                    head,
                });
            }
            _ => skipped.push(id.to_string()),
        }
    }
    let taken_ms = super::runs::now_ms();
    let file = File {
        warden_witness: 1,
        store: ctx.settings.store.value.to_string(),
        taken_ms,
        key_id: key.map(|k| k.id().to_owned()),
        runs,
    };
    let path = if dest.is_dir() {
        dest.join(format!("witness-{taken_ms}.json"))
    } else {
        dest
    };
    let bytes = serde_json::to_vec_pretty(&file)?;
    {
        use std::io::Write as _;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| {
                CliError::new(
                    "usage",
                    format!("cannot create the witness `{}`: {e}", path.display()),
                )
            })?;
        out.write_all(&bytes)
            .and_then(|()| out.sync_all())
            .with_context(|| format!("cannot write the witness `{}`", path.display()))?;
    }
    if ctx.json {
        println!(
            "{}",
            json!({ "witness": path, "runs": file.runs.len(), "keyed": file.key_id.is_some(), "skipped": skipped })
        );
    } else {
        println!(
            "witnessed {} run(s) in {}{}",
            file.runs.len(),
            path.display(),
            if file.key_id.is_some() {
                " (keyed)"
            } else {
                " (not keyed: set WARDEN_CHAIN_KEY to key it)"
            }
        );
        if !skipped.is_empty() {
            println!(
                "   not witnessed, their chains are broken: {}",
                skipped.join(", ")
            );
        }
    }
    Ok(())
}

/// What the witnesses read say of each run: the most events any saw.
pub(crate) struct Witness {
    runs: BTreeMap<RunId, (u64, String)>,
}

impl Witness {
    /// Reads the witness at `path`: a file, or every `*.json` file in a
    /// directory. Keyed entries are checked against the settings' key.
    pub(crate) fn read(path: &Path, settings: &Settings) -> anyhow::Result<Witness> {
        let files = if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("cannot read the witness directory `{}`", path.display()))?
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
            let invalid = |message: String| {
                CliError::new(
                    "witness_invalid",
                    format!("witness `{}`: {message}", file.display()),
                )
                .with_details(json!({ "file": file }))
            };
            let text = std::fs::read(&file).map_err(|e| invalid(e.to_string()))?;
            let parsed: File = serde_json::from_slice(&text).map_err(|e| invalid(e.to_string()))?;
            let key = match (&parsed.key_id, &settings.chain_key) {
                (None, _) => None,
                (Some(id), Some(key)) if id == key.id() => Some(key),
                (Some(id), _) => {
                    return Err(invalid(format!(
                        "it is keyed with key {id}: set WARDEN_CHAIN_KEY to that key"
                    ))
                    .into());
                }
            };
            for entry in parsed.runs {
                if let Some(key) = key {
                    let expected = mac(key, &entry.run_id, entry.event_count, &entry.head);
                    if entry.mac.as_deref() != Some(expected.as_str()) {
                        return Err(invalid(format!(
                            "the entry of run {} does not carry the key's MAC: it was altered",
                            entry.run_id
                        ))
                        .into());
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
        Ok(Witness { runs })
    }

    /// The runs the witness saw.
    pub(crate) fn runs(&self) -> impl Iterator<Item = &RunId> {
        self.runs.keys()
    }

    /// What is wrong with run `id` in `store` against the witness, if
    /// anything: fewer events than it saw, another event at its position,
    /// or no run at all (a pruned run whose tombstone covers it is fine).
    pub(crate) async fn check(
        &self,
        store: &dyn EventStore,
        id: &RunId,
    ) -> anyhow::Result<Option<String>> {
        let Some((count, head)) = self.runs.get(id) else {
            return Ok(None);
        };
        let events = match store.load(id).await {
            Ok(events) => events,
            Err(StoreError::Pruned { event_count, .. }) if event_count >= *count => {
                return Ok(None);
            }
            Err(StoreError::UnknownRun { .. }) => {
                return Ok(Some(format!(
                    "the run is gone, but the witness saw {count} events (head {head})"
                )));
            }
            Err(e) => return Err(e.into()),
        };
        if (events.len() as u64) < *count {
            return Ok(Some(format!(
                "rolled back: the log holds {} events, the witness saw {count} (head {head})",
                events.len()
            )));
        }
        let at: Option<&ChainHash> = count
            .checked_sub(1)
            .and_then(|i| events.get(i as usize))
            .map(|e| &e.hash);
        if at.is_some_and(|at| at.to_hex() != *head) {
            return Ok(Some(format!(
                "event {count} is not the one the witness saw (head {head}): the log was rewritten"
            )));
        }
        Ok(None)
    }
}
