//! The model request's hash, recorded with every model call so replay sees a
//! changed prompt or tool set without storing the prompt, and its size, from
//! which budgets estimate input tokens. Both over canonical JSON
//! ([`super::canonical`]).

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::canonical::canonical_json;
use super::ids::RequestHash;
use warden_providers::{Message, ModelRequest, ToolSpec};

/// The hash recorded with every model call: sha256 of a versioned domain
/// tag, each message's canonical JSON on a line of its own, a line `end`,
/// and the canonical JSON of the rest of the request. Messages come first
/// so that the hash can be computed incrementally as a conversation grows
/// ([`RequestHasher`]); canonical JSON has no raw newlines, so the framing
/// is unambiguous.
pub fn request_hash(request: &ModelRequest) -> RequestHash {
    let mut hasher = RequestHasher::new();
    for message in &request.messages {
        hasher.push(message);
    }
    hasher.finish(request)
}

/// How many bytes [`request_hash`] covers after its domain tag: the
/// request's canonical size, from which budgets estimate its input tokens.
pub fn request_size(request: &ModelRequest) -> u64 {
    let mut hasher = RequestHasher::new();
    for message in &request.messages {
        hasher.push(message);
    }
    hasher.size(request)
}

/// Computes [`request_hash`] over a growing conversation: push each
/// message once, finish as often as needed.
#[derive(Clone)]
pub struct RequestHasher {
    sha: Sha256,
    messages: usize,
    /// Bytes hashed for the messages so far.
    bytes: u64,
}

impl Default for RequestHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for RequestHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestHasher")
            .field("messages", &self.messages)
            .finish_non_exhaustive()
    }
}

impl RequestHasher {
    /// A hasher over no messages yet.
    pub fn new() -> Self {
        let mut sha = Sha256::new();
        sha.update(b"warden-model-request-v2\n");
        RequestHasher {
            sha,
            messages: 0,
            bytes: 0,
        }
    }

    /// How many messages were pushed.
    pub fn messages(&self) -> usize {
        self.messages
    }

    /// Adds the next message of the conversation.
    pub fn push(&mut self, message: &Message) {
        let value = serde_json::to_value(message).expect("a message serializes to JSON");
        let text = canonical_json(&value);
        self.sha.update(text.as_bytes());
        self.sha.update(b"\n");
        self.messages += 1;
        self.bytes += text.len() as u64 + 1;
    }

    /// The bytes [`finish`](Self::finish) would hash after the domain tag:
    /// the messages pushed so far and the rest of `request`.
    pub fn size(&self, request: &ModelRequest) -> u64 {
        self.bytes + END.len() as u64 + canonical_json(&rest_of(request)).len() as u64
    }

    /// The hash of `request` with the messages pushed so far in place of
    /// its own (which are ignored).
    pub fn finish(&self, request: &ModelRequest) -> RequestHash {
        self.finish_sized(request).0
    }

    /// [`finish`](Self::finish) and [`size`](Self::size) at once, the rest
    /// of the request made canonical once.
    pub fn finish_sized(&self, request: &ModelRequest) -> (RequestHash, u64) {
        let rest = canonical_json(&rest_of(request));
        let mut sha = self.sha.clone();
        sha.update(END);
        sha.update(rest.as_bytes());
        let size = self.bytes + END.len() as u64 + rest.len() as u64;
        (RequestHash::from_hex(hex::encode(sha.finalize())), size)
    }
}

/// The line between a request's messages and the rest, in its hash.
const END: &[u8] = b"end\n";

/// A request without its messages, as its hash covers it.
fn rest_of(request: &ModelRequest) -> Value {
    #[derive(serde::Serialize)]
    struct Rest<'a> {
        model: &'a str,
        instructions: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        context: &'a str,
        tools: &'a [ToolSpec],
        max_tokens: u32,
    }
    serde_json::to_value(Rest {
        model: &request.model,
        instructions: &request.instructions,
        context: &request.context,
        tools: &request.tools,
        max_tokens: request.max_tokens,
    })
    .expect("a model request serializes to JSON")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_request_hash_is_pinned_and_sees_every_field() {
        let request = ModelRequest {
            model: "m".into(),
            instructions: "be brief".into(),
            context: String::new(),
            messages: vec![Message::User {
                content: "hi".into(),
            }],
            tools: vec![ToolSpec {
                name: "t".into(),
                description: "d".into(),
                input_schema: json!({"type": "object"}),
            }],
            max_tokens: 10,
        };
        let hash = request_hash(&request);
        // Pinned: a recorded hash must stay comparable across versions.
        assert_eq!(
            hash.as_str(),
            RequestHash::of(
                br#"warden-model-request-v2
{"content":"hi","role":"user"}
end
{"instructions":"be brief","max_tokens":10,"model":"m","tools":[{"description":"d","input_schema":{"type":"object"},"name":"t"}]}"#
            )
            .as_str()
        );
        // Incremental: the same hash, whatever messages the request carries.
        let mut hasher = RequestHasher::new();
        hasher.push(&request.messages[0]);
        let hollow = ModelRequest {
            messages: vec![],
            ..request.clone()
        };
        assert_eq!(hasher.finish(&hollow), hash);
        assert_eq!(hasher.messages(), 1);
        let mut changed = request.clone();
        changed.messages.push(Message::User {
            content: "more".into(),
        });
        assert_ne!(request_hash(&changed), hash);
        let mut changed = request.clone();
        changed.max_tokens = 11;
        assert_ne!(request_hash(&changed), hash);
        let mut changed = request.clone();
        changed.instructions.push('!');
        assert_ne!(request_hash(&changed), hash);
        // Context is hashed when present; absent, the bytes (and so the
        // hashes recorded before context existed) are unchanged.
        let mut changed = request.clone();
        changed.context = "quoted".into();
        assert_ne!(request_hash(&changed), hash);
    }
}
