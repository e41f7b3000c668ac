//! The per-run hash chain: [`ChainHash`], the optional operator [`ChainKey`],
//! and the checks every store runs on what it reads back (full walk on load
//! and verify, tail check before an append).

use std::fmt;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::{ChainBreak, Finding, RunId, StoreError, StoredEvent};

/// Domain-separation tag of `h_0`; the version names the chain's format.
const GENESIS_TAG: &[u8] = b"warden.store.chain.v1\0";
/// Domain-separation tag of a key's public fingerprint.
const KEY_ID_TAG: &[u8] = b"warden.store.key-id.v1\0";

/// One link of a run's hash chain (SHA-256 or HMAC-SHA-256 output).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChainHash([u8; 32]);

impl ChainHash {
    /// Its length in bytes.
    pub const LEN: usize = 32;

    /// Wraps raw hash bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Reads a stored hash, which must be exactly 32 bytes.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn from_stored(bytes: &[u8]) -> Result<Self, ChainBreak> {
        <[u8; 32]>::try_from(bytes)
            .map(Self)
            .map_err(|_| ChainBreak::Unreadable {
                detail: format!("hash is {} bytes, expected 32", bytes.len()),
            })
    }
}

impl fmt::Display for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChainHash({})", self.to_hex())
    }
}

/// An operator's secret key: a store opened with one chains with
/// HMAC-SHA-256 under it instead of SHA-256, so rewriting a log undetected
/// needs the key as well as write access to the database.
///
/// A persistent store records the key's fingerprint ([`ChainKey::id`], not
/// the key) and refuses to open with another key or none.
#[derive(Clone)]
pub struct ChainKey {
    mac: Hmac<Sha256>,
    id: String,
}

impl ChainKey {
    /// The shortest key accepted, in bytes.
    pub const MIN_LEN: usize = 32;

    /// A key from raw secret bytes (at least [`ChainKey::MIN_LEN`] of them;
    /// use random bytes, not a password).
    pub fn new(secret: &[u8]) -> Result<Self, InvalidChainKey> {
        if secret.len() < Self::MIN_LEN {
            return Err(InvalidChainKey { len: secret.len() });
        }
        let mac = Hmac::<Sha256>::new_from_slice(secret)
            .map_err(|_| InvalidChainKey { len: secret.len() })?;
        let mut fingerprint = Sha256::new();
        fingerprint.update(KEY_ID_TAG);
        fingerprint.update(secret);
        let id = hex::encode(&fingerprint.finalize()[..8]);
        Ok(Self { mac, id })
    }

    /// HMAC-SHA-256 of `parts` (each length-prefixed) under the key, with
    /// `tag` naming what is authenticated: for records kept outside the
    /// store, such as witnesses of chain heads, and for the store's own
    /// sealed rows (`sealed.rs`).
    pub fn authenticate(&self, tag: &str, parts: &[&[u8]]) -> ChainHash {
        let mut mac = self.mac.clone();
        framed(tag, parts, |bytes| mac.update(bytes));
        let mut out = [0u8; 32];
        out.copy_from_slice(&mac.finalize().into_bytes());
        ChainHash::from_bytes(out)
    }

    /// A public fingerprint of the key (16 hex digits), safe to log.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Debug for ChainKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChainKey").field("id", &self.id).finish()
    }
}

/// Feeds `tag`, a zero byte, then each part preceded by its length (8
/// bytes, big-endian) to `update`: the framing of every tagged digest, so
/// that no two different lists of parts feed the same bytes.
fn framed(tag: &str, parts: &[&[u8]], mut update: impl FnMut(&[u8])) {
    update(tag.as_bytes());
    update(&[0]);
    for part in parts {
        update(&(part.len() as u64).to_be_bytes());
        update(part);
    }
}

/// A chain key that is too short.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("chain key is {len} bytes, expected at least 32")]
pub struct InvalidChainKey {
    len: usize,
}

/// The chain function a store computes with: plain or keyed.
#[derive(Clone, Debug, Default)]
pub(crate) struct Chain {
    key: Option<ChainKey>,
}

impl Chain {
    pub(crate) fn new(key: Option<ChainKey>) -> Self {
        Self { key }
    }

    /// The mode's name, recorded by persistent stores: `sha256`, or
    /// `hmac-sha256:<key id>`.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn mode(&self) -> String {
        match &self.key {
            None => "sha256".to_owned(),
            Some(key) => format!("hmac-sha256:{}", key.id),
        }
    }

    /// The seal of a row kept outside the run logs (`sealed.rs`): `tag`
    /// and `parts` framed as [`ChainKey::authenticate`] frames them, under
    /// the key (HMAC-SHA-256) when the store has one, else SHA-256, as the
    /// chain itself is computed.
    pub(crate) fn seal(&self, tag: &str, parts: &[&[u8]]) -> ChainHash {
        match &self.key {
            Some(key) => key.authenticate(tag, parts),
            None => {
                let mut h = Sha256::new();
                framed(tag, parts, |bytes| h.update(bytes));
                ChainHash(h.finalize().into())
            }
        }
    }

    /// `h_0` of a run.
    pub(crate) fn genesis(&self, run_id: &RunId) -> ChainHash {
        self.digest(&[GENESIS_TAG, run_id.as_str().as_bytes()])
    }

    /// `h_seq` from `h_{seq-1}` and the event's bytes.
    pub(crate) fn link(&self, prev: &ChainHash, seq: u64, bytes: &[u8]) -> ChainHash {
        let len = bytes.len() as u64;
        self.digest(&[&prev.0, &seq.to_be_bytes(), &len.to_be_bytes(), bytes])
    }

    /// The hashes of `events` appended after `head`, whose seq is `after`.
    pub(crate) fn extend(&self, head: ChainHash, after: u64, events: &[Bytes]) -> Vec<ChainHash> {
        let mut prev = head;
        (after + 1..)
            .zip(events)
            .map(|(seq, bytes)| {
                prev = self.link(&prev, seq, bytes);
                prev
            })
            .collect()
    }

    fn digest(&self, parts: &[&[u8]]) -> ChainHash {
        match &self.key {
            None => {
                let mut h = Sha256::new();
                for part in parts {
                    h.update(part);
                }
                ChainHash(h.finalize().into())
            }
            Some(key) => {
                let mut mac = key.mac.clone();
                for part in parts {
                    mac.update(part);
                }
                ChainHash(mac.finalize().into_bytes().into())
            }
        }
    }
}

/// One event row as read back from storage, not yet trusted.
pub(crate) struct RawRow {
    pub(crate) seq: u64,
    pub(crate) bytes: Result<Bytes, ChainBreak>,
    pub(crate) hash: Result<ChainHash, ChainBreak>,
}

/// What the run row records about its log.
pub(crate) struct Recorded {
    pub(crate) count: u64,
    pub(crate) head: Result<ChainHash, ChainBreak>,
}

/// The outcome of walking a run's rows.
pub(crate) struct Walk {
    pub(crate) events: Vec<StoredEvent>,
    pub(crate) findings: Vec<Finding>,
    pub(crate) rows_read: u64,
}

impl Walk {
    /// The events, or the first break as [`StoreError::Tampered`].
    pub(crate) fn into_events(self, run_id: &RunId) -> Result<Vec<StoredEvent>, StoreError> {
        match self.findings.into_iter().next() {
            None => Ok(self.events),
            Some(Finding { seq, kind }) => {
                tracing::warn!(run_id = %run_id, seq, reason = %kind, "event log fails its chain check");
                Err(StoreError::Tampered {
                    run_id: run_id.clone(),
                    seq,
                    reason: kind,
                })
            }
        }
    }
}

/// Walks the rows after `start_seq` (sorted by stored seq), starting from the
/// trusted-or-stored hash `start` at `start_seq`, recomputing each link and
/// comparing it with the stored one, then compares the end of the walk with
/// the recorded count and head. With `stop_at_first` the walk ends at the
/// first break (loads); without, it relinks on stored hashes so that one
/// edited event yields one finding (verify).
pub(crate) fn walk(
    chain: &Chain,
    start_seq: u64,
    start: ChainHash,
    rows: impl IntoIterator<Item = RawRow>,
    recorded: &Recorded,
    stop_at_first: bool,
) -> Walk {
    let mut findings = Vec::new();
    let mut events = Vec::new();
    let mut rows_read = 0;
    let mut prev = start;
    let mut next = start_seq + 1;
    let count = recorded.count;
    for row in rows {
        if stop_at_first && !findings.is_empty() {
            break;
        }
        rows_read += 1;
        let seq = row.seq;
        if seq < next {
            findings.push(Finding {
                seq,
                kind: ChainBreak::OutOfOrder,
            });
            continue;
        }
        if seq > next {
            findings.push(Finding {
                seq: next,
                kind: ChainBreak::Missing {
                    recorded_count: count,
                },
            });
        }
        if seq > count {
            findings.push(Finding {
                seq,
                kind: ChainBreak::BeyondCount {
                    recorded_count: count,
                },
            });
        }
        let stored = match row.hash {
            Ok(hash) => Some(hash),
            Err(kind) => {
                findings.push(Finding { seq, kind });
                None
            }
        };
        match row.bytes {
            Ok(bytes) => {
                let computed = chain.link(&prev, seq, &bytes);
                if stored.is_some_and(|s| s != computed) {
                    findings.push(Finding {
                        seq,
                        kind: ChainBreak::HashMismatch,
                    });
                }
                prev = stored.unwrap_or(computed);
                events.push(StoredEvent {
                    seq,
                    bytes,
                    hash: prev,
                });
            }
            Err(kind) => {
                findings.push(Finding { seq, kind });
                prev = stored.unwrap_or(prev);
            }
        }
        next = seq + 1;
    }
    let complete = !stop_at_first || findings.is_empty();
    if complete {
        let last = next - 1;
        if last < count {
            findings.push(Finding {
                seq: next,
                kind: ChainBreak::Missing {
                    recorded_count: count,
                },
            });
        } else if last == count {
            match &recorded.head {
                Err(kind) => findings.push(Finding {
                    seq: count,
                    kind: kind.clone(),
                }),
                Ok(head) if *head != prev => findings.push(Finding {
                    seq: count,
                    kind: ChainBreak::HeadMismatch,
                }),
                Ok(_) => {}
            }
        }
    }
    Walk {
        events,
        findings,
        rows_read,
    }
}

/// The cheap check before an append: the row at the recorded count exists
/// and carries the recorded head, and no row lies beyond it. `tail` holds the
/// first rows (up to two) whose seq is at least `count`, in seq order.
pub(crate) fn check_tail(
    count: u64,
    head: &ChainHash,
    tail: &[(u64, Result<ChainHash, ChainBreak>)],
) -> Result<(), Finding> {
    if count == 0 {
        return Err(Finding {
            seq: 0,
            kind: ChainBreak::Unreadable {
                detail: "the run records 0 events".to_owned(),
            },
        });
    }
    match tail.first() {
        Some((seq, _)) if *seq != count => Err(Finding {
            seq: count,
            kind: ChainBreak::Missing {
                recorded_count: count,
            },
        }),
        None => Err(Finding {
            seq: count,
            kind: ChainBreak::Missing {
                recorded_count: count,
            },
        }),
        Some((_, Err(kind))) => Err(Finding {
            seq: count,
            kind: kind.clone(),
        }),
        Some((_, Ok(last))) if last != head => Err(Finding {
            seq: count,
            kind: ChainBreak::HeadMismatch,
        }),
        Some(_) => match tail.get(1) {
            Some((seq, _)) => Err(Finding {
                seq: *seq,
                kind: ChainBreak::BeyondCount {
                    recorded_count: count,
                },
            }),
            None => Ok(()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(chain: &Chain, run: &RunId, events: &[&[u8]]) -> (Vec<RawRow>, Recorded) {
        let mut prev = chain.genesis(run);
        let mut out = Vec::new();
        for (i, bytes) in events.iter().enumerate() {
            let seq = i as u64 + 1;
            prev = chain.link(&prev, seq, bytes);
            out.push(RawRow {
                seq,
                bytes: Ok(Bytes::copy_from_slice(bytes)),
                hash: Ok(prev),
            });
        }
        let recorded = Recorded {
            count: events.len() as u64,
            head: Ok(prev),
        };
        (out, recorded)
    }

    fn findings(chain: &Chain, run: &RunId, rows: Vec<RawRow>, rec: &Recorded) -> Vec<Finding> {
        walk(chain, 0, chain.genesis(run), rows, rec, false).findings
    }

    #[test]
    fn genesis_and_link_follow_the_documented_construction() {
        let run = RunId::new("r-1").unwrap();
        let chain = Chain::default();
        let h0: [u8; 32] = Sha256::digest(b"warden.store.chain.v1\0r-1").into();
        assert_eq!(chain.genesis(&run).0, h0);
        let mut input = h0.to_vec();
        input.extend_from_slice(&1u64.to_be_bytes());
        input.extend_from_slice(&3u64.to_be_bytes());
        input.extend_from_slice(b"abc");
        let h1: [u8; 32] = Sha256::digest(&input).into();
        assert_eq!(chain.link(&ChainHash(h0), 1, b"abc").0, h1);
    }

    #[test]
    fn length_prefix_separates_bytes_from_the_next_link() {
        // Without the length, ("ab", "c") and ("a", "bc") could collide
        // across links; with it, seq and len pin each event's boundaries.
        let chain = Chain::default();
        let h = ChainHash([7; 32]);
        assert_ne!(chain.link(&h, 1, b"ab"), chain.link(&h, 1, b"abc"));
        assert_ne!(chain.link(&h, 1, b"x"), chain.link(&h, 2, b"x"));
    }

    #[test]
    fn keyed_chain_differs_by_key_and_from_plain() {
        let run = RunId::new("r").unwrap();
        let plain = Chain::default();
        let k1 = Chain::new(Some(ChainKey::new(&[1; 32]).unwrap()));
        let k2 = Chain::new(Some(ChainKey::new(&[2; 32]).unwrap()));
        assert_ne!(plain.genesis(&run), k1.genesis(&run));
        assert_ne!(k1.genesis(&run), k2.genesis(&run));
        assert_ne!(k1.mode(), k2.mode());
        assert_eq!(plain.mode(), "sha256");
        assert!(k1.mode().starts_with("hmac-sha256:"));
        // The HMAC is the standard one (RFC 2104), so other tools can check it.
        let mut mac = Hmac::<Sha256>::new_from_slice(&[1; 32]).unwrap();
        mac.update(b"warden.store.chain.v1\0r");
        let expected: [u8; 32] = mac.finalize().into_bytes().into();
        assert_eq!(k1.genesis(&run).0, expected);
    }

    #[test]
    fn short_keys_are_refused_and_debug_hides_the_secret() {
        let err = ChainKey::new(&[0; 31]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "chain key is 31 bytes, expected at least 32"
        );
        let key = ChainKey::new(&[0xab; 32]).unwrap();
        let shown = format!("{key:?}");
        assert!(shown.contains(key.id()), "{shown}");
        assert!(!shown.contains("abab"), "{shown}");
        assert_eq!(key.id().len(), 16);
    }

    #[test]
    fn intact_log_walks_clean() {
        let run = RunId::new("r").unwrap();
        let chain = Chain::default();
        let (rows, rec) = rows(&chain, &run, &[b"a", b"b", b"c"]);
        let walk = walk(&chain, 0, chain.genesis(&run), rows, &rec, true);
        assert!(walk.findings.is_empty());
        assert_eq!(walk.events.len(), 3);
        assert_eq!(walk.events[2].hash, rec.head.unwrap());
    }

    #[test]
    fn each_kind_of_damage_is_located() {
        let run = RunId::new("r").unwrap();
        let chain = Chain::default();
        let events: &[&[u8]] = &[b"a", b"b", b"c", b"d"];
        let kinds = |f: Vec<Finding>| f.into_iter().map(|f| (f.seq, f.kind)).collect::<Vec<_>>();

        // Edited bytes: exactly one finding, at the edited event.
        let (mut r, rec) = rows(&chain, &run, events);
        r[1].bytes = Ok(Bytes::from_static(b"B"));
        assert_eq!(
            kinds(findings(&chain, &run, r, &rec)),
            [(2, ChainBreak::HashMismatch)]
        );

        // Dropped event: a gap, and the next link no longer matches.
        let (mut r, rec) = rows(&chain, &run, events);
        r.remove(1);
        let missing = ChainBreak::Missing { recorded_count: 4 };
        assert_eq!(
            kinds(findings(&chain, &run, r, &rec)),
            [(2, missing.clone()), (3, ChainBreak::HashMismatch)]
        );

        // Reordered (rows renumbered): both positions mismatch.
        let (mut r, rec) = rows(&chain, &run, events);
        r.swap(1, 2);
        r[1].seq = 2;
        r[2].seq = 3;
        let found = kinds(findings(&chain, &run, r, &rec));
        assert_eq!(found[0], (2, ChainBreak::HashMismatch));

        // Truncated tail: missing from the first absent seq.
        let (mut r, rec) = rows(&chain, &run, events);
        r.truncate(2);
        assert_eq!(kinds(findings(&chain, &run, r, &rec)), [(3, missing)]);

        // Head rewritten to an earlier link.
        let (r, mut rec) = rows(&chain, &run, events);
        rec.head = Ok(r[2].hash.clone().unwrap());
        assert_eq!(
            kinds(findings(&chain, &run, r, &rec)),
            [(4, ChainBreak::HeadMismatch)]
        );

        // Event beyond the count.
        let (r, mut rec) = rows(&chain, &run, events);
        rec.count = 3;
        rec.head = Ok(r[2].hash.clone().unwrap());
        assert_eq!(
            kinds(findings(&chain, &run, r, &rec)),
            [(4, ChainBreak::BeyondCount { recorded_count: 3 })]
        );

        // Duplicate seq.
        let (mut r, rec) = rows(&chain, &run, events);
        r[2].seq = 2;
        let found = kinds(findings(&chain, &run, r, &rec));
        assert!(found.contains(&(2, ChainBreak::OutOfOrder)), "{found:?}");

        // Unreadable hash.
        let (mut r, rec) = rows(&chain, &run, events);
        r[0].hash = ChainHash::from_stored(&[1, 2, 3]);
        let found = kinds(findings(&chain, &run, r, &rec));
        let detail = "hash is 3 bytes, expected 32".to_owned();
        assert_eq!(found, [(1, ChainBreak::Unreadable { detail })]);
    }

    #[test]
    fn tail_check_catches_truncation_head_edits_and_extra_rows() {
        let h = ChainHash([1; 32]);
        let other = ChainHash([2; 32]);
        assert!(check_tail(3, &h, &[(3, Ok(h))]).is_ok());
        let f = check_tail(3, &h, &[]).unwrap_err();
        assert_eq!(f.seq, 3);
        assert!(matches!(f.kind, ChainBreak::Missing { .. }));
        let f = check_tail(3, &h, &[(4, Ok(h))]).unwrap_err();
        assert!(matches!(f.kind, ChainBreak::Missing { .. }));
        let f = check_tail(3, &h, &[(3, Ok(other))]).unwrap_err();
        assert_eq!(f.kind, ChainBreak::HeadMismatch);
        let f = check_tail(3, &h, &[(3, Ok(h)), (4, Ok(other))]).unwrap_err();
        assert_eq!(
            (f.seq, f.kind),
            (4, ChainBreak::BeyondCount { recorded_count: 3 })
        );
        assert!(check_tail(0, &h, &[]).is_err());
    }
}
