//! Session history as shared, content-addressed chunks: [`HistoryChunk`],
//! [`HistoryDigest`], and the check every store runs when it reads a chain
//! of them back.
//!
//! A run in a session sees the transcripts of the session's earlier runs.
//! Copying them into every run's first event would make a session's storage
//! grow with the square of its length; instead each run's first event names
//! the newest chunk of its history (the *head*), and each chunk names the one
//! before it. A chunk is written once, in the transaction that creates the
//! first run that needs it ([`RunMeta::history`](crate::RunMeta::history)),
//! and every later run shares it.
//!
//! The store treats a chunk's body as opaque bytes (the engine writes the
//! runs and messages it holds). Its digest covers the body and the previous
//! chunk's digest:
//!
//! ```text
//! d = SHA-256("warden.store.history.v1" 0x00 || 0x00)              || body   (first chunk)
//! d = SHA-256("warden.store.history.v1" 0x00 || 0x01 || previous) || body   (any other)
//! ```
//!
//! so a head commits to the whole chain, and the head is in the run's first
//! event, which the run's own hash chain covers (keyed, when the store is).
//! [`EventStore::load_history`](crate::EventStore::load_history) recomputes
//! every digest on the way back from the head: an edited, missing or
//! relinked chunk is [`StoreError::HistoryBroken`], never a silently
//! different history.

use std::fmt;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::StoreError;

/// Domain-separation tag of a chunk's digest; the version names the format.
const TAG: &[u8] = b"warden.store.history.v1\0";

/// The digest of a [`HistoryChunk`]: its content address. Written as
/// `sha256:` and 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HistoryDigest([u8; 32]);

impl HistoryDigest {
    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Reads raw stored bytes, which must be exactly 32.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn from_stored(bytes: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(bytes).ok().map(Self)
    }
}

impl fmt::Display for HistoryDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for HistoryDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HistoryDigest({self})")
    }
}

/// Text that is not a [`HistoryDigest`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a history digest: expected `sha256:` and 64 lowercase hex digits")]
pub struct InvalidHistoryDigest(String);

impl std::str::FromStr for HistoryDigest {
    type Err = InvalidHistoryDigest;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidHistoryDigest(s.to_owned());
        let hex_digits = s.strip_prefix("sha256:").ok_or_else(invalid)?;
        if hex_digits.len() != 64 || hex_digits.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(invalid());
        }
        let mut bytes = [0; 32];
        hex::decode_to_slice(hex_digits, &mut bytes).map_err(|_| invalid())?;
        Ok(Self(bytes))
    }
}

impl serde::Serialize for HistoryDigest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for HistoryDigest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// One chunk of a session's history: opaque bytes, the chunk before it, and
/// the digest of both. Built only by [`HistoryChunk::new`] (or by a store
/// reading one back and checking it), so a chunk's digest is always its
/// content's.
#[derive(Clone, PartialEq, Eq)]
pub struct HistoryChunk {
    digest: HistoryDigest,
    previous: Option<HistoryDigest>,
    body: Bytes,
}

impl HistoryChunk {
    /// The chunk holding `body`, after `previous` (`None`: the first).
    pub fn new(previous: Option<HistoryDigest>, body: impl Into<Bytes>) -> Self {
        let body = body.into();
        Self {
            digest: digest_of(previous.as_ref(), &body),
            previous,
            body,
        }
    }

    /// Its content address.
    pub fn digest(&self) -> &HistoryDigest {
        &self.digest
    }

    /// The chunk before it, if any.
    pub fn previous(&self) -> Option<&HistoryDigest> {
        self.previous.as_ref()
    }

    /// What it holds.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// A chunk read back from storage as `digest`: `Err` (what is wrong)
    /// when its content does not have that digest.
    pub(crate) fn stored(
        digest: HistoryDigest,
        previous: Option<HistoryDigest>,
        body: Bytes,
    ) -> Result<Self, String> {
        let chunk = Self::new(previous, body);
        if chunk.digest == digest {
            Ok(chunk)
        } else {
            Err(format!(
                "its content has digest {}, not the one it is stored under",
                chunk.digest
            ))
        }
    }
}

impl fmt::Debug for HistoryChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HistoryChunk")
            .field("digest", &self.digest)
            .field("previous", &self.previous)
            .field("body_len", &self.body.len())
            .finish()
    }
}

fn digest_of(previous: Option<&HistoryDigest>, body: &[u8]) -> HistoryDigest {
    let mut hash = Sha256::new();
    hash.update(TAG);
    match previous {
        None => hash.update([0]),
        Some(previous) => {
            hash.update([1]);
            hash.update(previous.0);
        }
    }
    hash.update(body);
    HistoryDigest(hash.finalize().into())
}

/// Orders the chunks a store found from `head` back into a chain, oldest
/// first, checking each link: every store's
/// [`load_history`](crate::EventStore::load_history) ends here. `found`
/// holds each stored chunk already checked against its digest, or what was
/// wrong with it; a chunk may appear in it though it is not on the chain.
pub(crate) fn chain_from(
    head: &HistoryDigest,
    mut found: std::collections::HashMap<HistoryDigest, Result<HistoryChunk, String>>,
) -> Result<Vec<HistoryChunk>, StoreError> {
    let broken = |at: &HistoryDigest, reason: String| StoreError::HistoryBroken {
        head: *head,
        at: *at,
        reason,
    };
    let mut chain = Vec::new();
    let mut next = Some(*head);
    while let Some(digest) = next {
        let chunk = match found.remove(&digest) {
            Some(Ok(chunk)) => chunk,
            Some(Err(reason)) => return Err(broken(&digest, reason)),
            // A digest seen twice would be a loop: unreachable through
            // checked digests, so it reads as the chunk missing.
            None => return Err(broken(&digest, "the store holds no such chunk".to_owned())),
        };
        next = chunk.previous;
        chain.push(chunk);
    }
    chain.reverse();
    Ok(chain)
}

/// The statement a database's prune ends with: deletes the chunks no
/// remaining run's `history_head` reaches (the same SQL in SQLite and
/// PostgreSQL).
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) const DELETE_UNREACHED_SQL: &str = "WITH RECURSIVE live (digest) AS (
         SELECT history_head FROM runs WHERE history_head IS NOT NULL
         UNION
         SELECT h.previous FROM history_chunks h JOIN live l ON h.digest = l.digest
         WHERE h.previous IS NOT NULL
     )
     DELETE FROM history_chunks WHERE digest NOT IN (SELECT digest FROM live)";

/// A chunk's row as a database returns it: digest, previous, body.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) type RawChunk = (Vec<u8>, Option<Vec<u8>>, Vec<u8>);

/// Stored rows (digest, previous, body, as raw bytes) checked one by one,
/// for [`chain_from`]: a row whose digest or link is not 32 bytes, or whose
/// content does not have its digest, is kept as what is wrong with it.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) fn checked_rows(
    rows: Vec<RawChunk>,
) -> std::collections::HashMap<HistoryDigest, Result<HistoryChunk, String>> {
    let mut found = std::collections::HashMap::new();
    for (digest, previous, body) in rows {
        let Some(digest) = HistoryDigest::from_stored(&digest) else {
            continue;
        };
        let chunk = match previous.map(|p| HistoryDigest::from_stored(&p)) {
            Some(None) => Err("its link to the chunk before it is not 32 bytes".to_owned()),
            link => HistoryChunk::stored(digest, link.flatten(), Bytes::from(body)),
        };
        found.insert(digest, chunk);
    }
    found
}

/// The check a create runs on the chunks it is given and the head its run
/// names: each chunk's previous chunk, and the head, is stored already or
/// among `chunks` (earlier, for a previous chunk). `stored` answers whether
/// the store holds a digest.
pub(crate) fn check_new_chunks(
    chunks: &[HistoryChunk],
    head: Option<&HistoryDigest>,
    mut stored: impl FnMut(&HistoryDigest) -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    let named = chunks
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.previous().map(|p| (i, p, Some(c))))
        .chain(head.map(|h| (chunks.len(), h, None)));
    for (before, digest, by) in named {
        if chunks[..before].iter().any(|c| c.digest() == digest) || stored(digest)? {
            continue;
        }
        let reason = match by {
            Some(chunk) => format!(
                "chunk {} names it as the chunk before it, and the store holds no such chunk",
                chunk.digest()
            ),
            None => "the run names it as its history, and the store holds no such chunk".to_owned(),
        };
        return Err(StoreError::HistoryBroken {
            head: *head
                .or(chunks.last().map(HistoryChunk::digest))
                .unwrap_or(digest),
            at: *digest,
            reason,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_cover_the_body_and_the_link() {
        let first = HistoryChunk::new(None, &b"a"[..]);
        let second = HistoryChunk::new(Some(*first.digest()), &b"b"[..]);
        assert_ne!(first.digest(), HistoryChunk::new(None, &b"b"[..]).digest());
        assert_ne!(
            second.digest(),
            HistoryChunk::new(None, &b"b"[..]).digest(),
            "the link is part of the digest"
        );
        // Pinned (the module docs' formula, computed apart from this code),
        // so every store and every build agree on a content address.
        assert_eq!(
            first.digest().to_string(),
            "sha256:1323bc1a18425d2fc09a9949551f4f798e45d8b1ec0092901738b6c4a9e2e2a9"
        );
    }

    #[test]
    fn digests_read_back_from_their_text_only() {
        let d = *HistoryChunk::new(None, &b"a"[..]).digest();
        assert_eq!(d.to_string().parse::<HistoryDigest>().unwrap(), d);
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<HistoryDigest>(&json).unwrap(), d);
        for bad in [
            "1323bc1a18425d2fc09a9949551f4f798e45d8b1ec0092901738b6c4a9e2e2a9",
            "sha256:1323BC1A18425D2FC09A9949551F4F798E45D8B1EC0092901738B6C4A9E2E2A9",
            "sha256:4d0e",
            "sha256:zz23bc1a18425d2fc09a9949551f4f798e45d8b1ec0092901738b6c4a9e2e2a9",
        ] {
            assert!(bad.parse::<HistoryDigest>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_chain_is_walked_from_its_head_and_every_break_is_named() {
        let a = HistoryChunk::new(None, &b"a"[..]);
        let b = HistoryChunk::new(Some(*a.digest()), &b"b"[..]);
        let c = HistoryChunk::new(Some(*b.digest()), &b"c"[..]);
        let all = |chunks: &[&HistoryChunk]| {
            chunks
                .iter()
                .map(|c| (*c.digest(), Ok((*c).clone())))
                .collect()
        };
        let chain = chain_from(c.digest(), all(&[&a, &b, &c])).unwrap();
        assert_eq!(chain, [a.clone(), b.clone(), c.clone()]);
        match chain_from(c.digest(), all(&[&a, &c])) {
            Err(StoreError::HistoryBroken { head, at, .. }) => {
                assert_eq!((head, at), (*c.digest(), *b.digest()));
            }
            other => panic!("{other:?}"),
        }
        let edited = HistoryChunk::stored(*b.digest(), Some(*a.digest()), Bytes::from("B"));
        let reason = edited.unwrap_err();
        let mut found: std::collections::HashMap<_, _> = all(&[&a, &c]);
        found.insert(*b.digest(), Err(reason));
        match chain_from(c.digest(), found) {
            Err(StoreError::HistoryBroken { at, reason, .. }) => {
                assert_eq!(at, *b.digest());
                assert!(
                    reason.contains("not the one it is stored under"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn new_chunks_and_the_head_must_link_to_stored_or_earlier_ones() {
        let a = HistoryChunk::new(None, &b"a"[..]);
        let b = HistoryChunk::new(Some(*a.digest()), &b"b"[..]);
        check_new_chunks(&[a.clone(), b.clone()], Some(b.digest()), |_| Ok(false)).unwrap();
        check_new_chunks(std::slice::from_ref(&b), None, |d| Ok(d == a.digest())).unwrap();
        match check_new_chunks(std::slice::from_ref(&b), None, |_| Ok(false)) {
            Err(StoreError::HistoryBroken { at, .. }) => assert_eq!(at, *a.digest()),
            other => panic!("{other:?}"),
        }
        // A run naming a head it neither brings nor finds (a fork of a run
        // whose history was pruned meanwhile, say).
        check_new_chunks(&[], Some(b.digest()), |d| Ok(d == b.digest())).unwrap();
        match check_new_chunks(&[], Some(b.digest()), |_| Ok(false)) {
            Err(StoreError::HistoryBroken { head, at, .. }) => {
                assert_eq!((head, at), (*b.digest(), *b.digest()));
            }
            other => panic!("{other:?}"),
        }
    }
}
