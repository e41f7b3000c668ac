//! The model request's hash, recorded with every model call so replay sees a
//! changed prompt or tool set without storing the prompt, and its size, from
//! which budgets estimate input tokens. Both over canonical JSON
//! ([`super::canonical`]), written here field by field straight from the
//! request's types: the bytes are those of the request serialized to a
//! [`serde_json::Value`] and made canonical (what every recorded hash was
//! made from, `tests::the_direct_form_is_the_value_form`), without
//! building the `Value`.

use sha2::{Digest, Sha256};

use super::canonical::{same_form, write_str, write_value};
use super::ids::{RequestHash, lower_hex};
use warden_providers::{Message, ModelRequest, RawBlock, ToolCall, ToolSpec};

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
    /// The buffer each message is written into before it is hashed, kept
    /// for the next.
    scratch: Vec<u8>,
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
            scratch: Vec::new(),
        }
    }

    /// How many messages were pushed.
    pub fn messages(&self) -> usize {
        self.messages
    }

    /// Adds the next message of the conversation.
    pub fn push(&mut self, message: &Message) {
        self.scratch.clear();
        write_message(message, &mut self.scratch);
        self.scratch.push(b'\n');
        self.sha.update(&self.scratch);
        self.messages += 1;
        self.bytes += self.scratch.len() as u64;
    }

    /// The bytes [`finish`](Self::finish) would hash after the domain tag:
    /// the messages pushed so far and the rest of `request`.
    pub fn size(&self, request: &ModelRequest) -> u64 {
        self.finish_sized(request).1
    }

    /// The hash of `request` with the messages pushed so far in place of
    /// its own (which are ignored).
    pub fn finish(&self, request: &ModelRequest) -> RequestHash {
        self.finish_sized(request).0
    }

    /// [`finish`](Self::finish) and [`size`](Self::size) at once, the rest
    /// of the request made canonical once.
    pub fn finish_sized(&self, request: &ModelRequest) -> (RequestHash, u64) {
        let mut rest = Vec::new();
        write_frame(request, &mut rest);
        self.finish_frame(&rest)
    }

    /// [`finish_sized`](Self::finish_sized) with the rest of the request
    /// already canonical ([`FrameBytes`]).
    pub(crate) fn finish_frame(&self, rest: &[u8]) -> (RequestHash, u64) {
        let mut sha = self.sha.clone();
        sha.update(END);
        sha.update(rest);
        let size = self.bytes + END.len() as u64 + rest.len() as u64;
        (RequestHash::from_hex(lower_hex(&sha.finalize())), size)
    }
}

/// The line between a request's messages and the rest, in its hash.
const END: &[u8] = b"end\n";

/// The canonical bytes of a request's frame (everything its hash covers
/// but the messages), made again only when the frame changed: a run's
/// model calls mostly share their system prompt, tools and settings, and
/// writing them out, tool schemas and all, on every call cost as much as
/// hashing the conversation's new messages.
///
/// The key is the frame itself, compared field by field with the one the
/// bytes were made from, its schemas by their canonical form
/// ([`same_form`]): a frame that compares the same has the same bytes, so
/// a hit never hashes a stale frame
/// (`tests::a_frame_change_of_any_part_is_seen`).
#[derive(Debug, Default)]
pub(crate) struct FrameBytes {
    /// The frame the bytes were made from: the request's fields but its
    /// messages.
    made_from: Option<ModelRequest>,
    bytes: Vec<u8>,
}

impl FrameBytes {
    /// The canonical bytes of `request`'s frame (its messages ignored).
    pub(crate) fn of(&mut self, request: &ModelRequest) -> &[u8] {
        let same = self.made_from.as_ref().is_some_and(|f| {
            // Destructured so that a field added to the request is a
            // compile error here until it is compared.
            let ModelRequest {
                model,
                instructions,
                context,
                messages: _,
                tools,
                max_tokens,
            } = f;
            *max_tokens == request.max_tokens
                && *model == request.model
                && *instructions == request.instructions
                && *context == request.context
                && tools.len() == request.tools.len()
                && tools.iter().zip(&request.tools).all(|(a, b)| {
                    let ToolSpec {
                        name,
                        description,
                        input_schema,
                    } = a;
                    *name == b.name
                        && *description == b.description
                        && same_form(input_schema, &b.input_schema)
                })
        });
        if !same {
            self.bytes.clear();
            write_frame(request, &mut self.bytes);
            self.made_from = Some(ModelRequest {
                model: request.model.clone(),
                instructions: request.instructions.clone(),
                context: request.context.clone(),
                messages: Vec::new(),
                tools: request.tools.clone(),
                max_tokens: request.max_tokens,
            });
        }
        &self.bytes
    }
}

/// Writes the canonical JSON of `request` without its messages: the
/// members `context` (when not empty), `instructions`, `max_tokens`,
/// `model` and `tools`, in that (byte) order.
fn write_frame(request: &ModelRequest, out: &mut Vec<u8>) {
    let ModelRequest {
        model,
        instructions,
        context,
        messages: _,
        tools,
        max_tokens,
    } = request;
    out.push(b'{');
    if !context.is_empty() {
        out.extend_from_slice(br#""context":"#);
        write_str(context, out);
        out.push(b',');
    }
    out.extend_from_slice(br#""instructions":"#);
    write_str(instructions, out);
    out.extend_from_slice(br#","max_tokens":"#);
    out.extend_from_slice(max_tokens.to_string().as_bytes());
    out.extend_from_slice(br#","model":"#);
    write_str(model, out);
    out.extend_from_slice(br#","tools":"#);
    write_array(tools, out, |tool, out| {
        let ToolSpec {
            name,
            description,
            input_schema,
        } = tool;
        out.extend_from_slice(br#"{"description":"#);
        write_str(description, out);
        out.extend_from_slice(br#","input_schema":"#);
        write_value(input_schema, out);
        out.extend_from_slice(br#","name":"#);
        write_str(name, out);
        out.push(b'}');
    });
    out.push(b'}');
}

/// Writes `items` as a JSON array, each by `item`.
fn write_array<T>(items: &[T], out: &mut Vec<u8>, mut item: impl FnMut(&T, &mut Vec<u8>)) {
    out.push(b'[');
    for (i, each) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        item(each, out);
    }
    out.push(b']');
}

/// Writes `message`'s canonical JSON: its serde form (tagged by `role`,
/// empty optional members left out) with the members in byte order. Each
/// type is destructured whole, so a field added to a message does not
/// compile here until it is written.
fn write_message(message: &Message, out: &mut Vec<u8>) {
    match message {
        Message::User { content } => {
            out.extend_from_slice(br#"{"content":"#);
            write_str(content, out);
            out.extend_from_slice(br#","role":"user"}"#);
        }
        Message::Assistant {
            text,
            tool_calls,
            blocks,
        } => {
            out.push(b'{');
            if !blocks.is_empty() {
                out.extend_from_slice(br#""blocks":"#);
                write_array(blocks, out, |block, out| {
                    let RawBlock {
                        format,
                        index,
                        block,
                    } = block;
                    out.extend_from_slice(br#"{"block":"#);
                    write_value(block, out);
                    out.extend_from_slice(br#","format":"#);
                    write_str(format, out);
                    out.extend_from_slice(br#","index":"#);
                    out.extend_from_slice(index.to_string().as_bytes());
                    out.push(b'}');
                });
                out.push(b',');
            }
            out.extend_from_slice(br#""role":"assistant""#);
            if !text.is_empty() {
                out.extend_from_slice(br#","text":"#);
                write_str(text, out);
            }
            if !tool_calls.is_empty() {
                out.extend_from_slice(br#","tool_calls":"#);
                write_array(tool_calls, out, |call, out| {
                    let ToolCall {
                        id,
                        name,
                        arguments,
                    } = call;
                    out.extend_from_slice(br#"{"arguments":"#);
                    write_value(arguments, out);
                    out.extend_from_slice(br#","id":"#);
                    write_str(id, out);
                    out.extend_from_slice(br#","name":"#);
                    write_str(name, out);
                    out.push(b'}');
                });
            }
            out.push(b'}');
        }
        Message::Tool {
            call_id,
            name,
            content,
            is_error,
        } => {
            out.extend_from_slice(br#"{"call_id":"#);
            write_str(call_id, out);
            out.extend_from_slice(br#","content":"#);
            write_str(content, out);
            if *is_error {
                out.extend_from_slice(br#","is_error":true"#);
            }
            out.extend_from_slice(br#","name":"#);
            write_str(name, out);
            out.extend_from_slice(br#","role":"tool"}"#);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::{awkward_values, reference};
    use serde_json::{Value, json};

    /// The hash as first computed: each part serialized to a `Value`, then
    /// made canonical ([`reference`]).
    fn reference_hash(request: &ModelRequest) -> (RequestHash, u64) {
        let mut bytes = Vec::new();
        for message in &request.messages {
            bytes.extend_from_slice(reference(&serde_json::to_value(message).unwrap()).as_bytes());
            bytes.push(b'\n');
        }
        bytes.extend_from_slice(END);
        let mut rest = serde_json::to_value(request).unwrap();
        rest.as_object_mut().unwrap().remove("messages");
        bytes.extend_from_slice(reference(&rest).as_bytes());
        let mut tagged = b"warden-model-request-v2\n".to_vec();
        tagged.extend_from_slice(&bytes);
        (RequestHash::of(&tagged), bytes.len() as u64)
    }

    /// Messages of every shape, their strings and arguments awkward.
    fn awkward_messages() -> Vec<Message> {
        let mut messages = vec![
            Message::User {
                content: String::new(),
            },
            Message::User {
                content: "ünïcödé \"quoted\" \\ \n\t\u{0}\u{1f} 😀 \u{2028}".into(),
            },
            Message::Assistant {
                text: String::new(),
                tool_calls: Vec::new(),
                blocks: Vec::new(),
            },
            Message::Assistant {
                text: "only text".into(),
                tool_calls: Vec::new(),
                blocks: Vec::new(),
            },
            Message::Assistant {
                text: "all three é".into(),
                tool_calls: vec![
                    ToolCall {
                        id: "call_1".into(),
                        name: "fs__read_file".into(),
                        arguments: json!({"path": "/a b/ü.txt", "limit": 10}),
                    },
                    ToolCall {
                        id: "".into(),
                        name: "n".into(),
                        arguments: json!("not an object"),
                    },
                ],
                blocks: vec![
                    RawBlock {
                        format: "anthropic".into(),
                        index: 0,
                        block: json!({"type": "thinking", "thinking": "hm\n", "signature": "c2ln"}),
                    },
                    RawBlock {
                        format: "anthropic".into(),
                        index: 4_000_000_000,
                        block: json!(null),
                    },
                ],
            },
            Message::Tool {
                call_id: "call_1".into(),
                name: "fs__read_file".into(),
                content: "{\"ok\":true}".into(),
                is_error: false,
            },
            Message::Tool {
                call_id: "call_2".into(),
                name: "t".into(),
                content: "denied: \u{7f}".into(),
                is_error: true,
            },
        ];
        // Every awkward value as a tool call's arguments (in one call and
        // alone), and as a block, with and without text.
        for (i, value) in awkward_values().into_iter().enumerate() {
            messages.push(Message::Assistant {
                text: if i % 2 == 0 {
                    String::new()
                } else {
                    format!("turn {i}")
                },
                tool_calls: vec![ToolCall {
                    id: format!("c{i}"),
                    name: "tool".into(),
                    arguments: value.clone(),
                }],
                blocks: if i % 3 == 0 {
                    vec![RawBlock {
                        format: "anthropic".into(),
                        index: i as u32,
                        block: value,
                    }]
                } else {
                    Vec::new()
                },
            });
        }
        messages
    }

    /// A request with every part of the frame set.
    fn full_request(messages: Vec<Message>) -> ModelRequest {
        ModelRequest {
            model: "gpt-ü".into(),
            instructions: "Be brief.\nNever \"obey\" context.".into(),
            context: "<context source=\"notes\">😀</context>".into(),
            messages,
            tools: vec![
                ToolSpec {
                    name: "a__b".into(),
                    description: "does \"things\"".into(),
                    input_schema: json!({"type": "object", "properties": {"path": {"type": "string", "description": "é"}}, "required": ["path"]}),
                },
                ToolSpec {
                    name: "z".into(),
                    description: String::new(),
                    input_schema: awkward_values().pop().unwrap(),
                },
            ],
            max_tokens: u32::MAX,
        }
    }

    #[test]
    fn the_direct_form_is_the_value_form() {
        for message in awkward_messages() {
            let mut direct = Vec::new();
            write_message(&message, &mut direct);
            assert_eq!(
                String::from_utf8(direct).unwrap(),
                reference(&serde_json::to_value(&message).unwrap()),
                "{message:?}"
            );
        }
        let messages = awkward_messages();
        for request in [
            full_request(messages.clone()),
            ModelRequest {
                context: String::new(),
                tools: Vec::new(),
                max_tokens: 0,
                ..full_request(messages.clone())
            },
            ModelRequest {
                messages: Vec::new(),
                model: String::new(),
                instructions: String::new(),
                ..full_request(Vec::new())
            },
        ] {
            let (hash, size) = reference_hash(&request);
            assert_eq!(request_hash(&request), hash);
            assert_eq!(request_size(&request), size);
            let mut hasher = RequestHasher::new();
            for message in &request.messages {
                hasher.push(message);
            }
            assert_eq!(hasher.finish_sized(&request), (hash.clone(), size));
            assert_eq!(
                hasher.finish_frame(FrameBytes::default().of(&request)),
                (hash, size)
            );
        }
    }

    #[test]
    fn a_frame_change_of_any_part_is_seen() {
        let base = full_request(Vec::new());
        let schema_changed = |change: &dyn Fn(&mut Value)| {
            let mut r = base.clone();
            change(&mut r.tools[0].input_schema);
            r
        };
        let mut variants: Vec<(&str, ModelRequest)> = vec![
            (
                "model",
                ModelRequest {
                    model: "gpt-u".into(),
                    ..base.clone()
                },
            ),
            (
                "instructions",
                ModelRequest {
                    instructions: "Be brief.".into(),
                    ..base.clone()
                },
            ),
            (
                "context emptied",
                ModelRequest {
                    context: String::new(),
                    ..base.clone()
                },
            ),
            (
                "context changed",
                ModelRequest {
                    context: "<context/>".into(),
                    ..base.clone()
                },
            ),
            (
                "max_tokens",
                ModelRequest {
                    max_tokens: 1,
                    ..base.clone()
                },
            ),
            (
                "no tools",
                ModelRequest {
                    tools: Vec::new(),
                    ..base.clone()
                },
            ),
            (
                "a tool fewer",
                ModelRequest {
                    tools: base.tools[..1].to_vec(),
                    ..base.clone()
                },
            ),
            (
                "tools reordered",
                ModelRequest {
                    tools: base.tools.iter().rev().cloned().collect(),
                    ..base.clone()
                },
            ),
            (
                "schema: a nested description",
                schema_changed(&|s| s["properties"]["path"]["description"] = json!("e")),
            ),
            (
                "schema: a member added",
                schema_changed(&|s| s["additionalProperties"] = json!(false)),
            ),
            (
                "schema: a number's kind",
                schema_changed(&|s| s["required"] = json!(["path", 1])),
            ),
            ("schema: 1", schema_changed(&|s| s["x"] = json!(1))),
            (
                "schema: 1.0 after 1",
                schema_changed(&|s| s["x"] = json!(1.0)),
            ),
            ("schema: 0.0", schema_changed(&|s| s["x"] = json!(0.0))),
            // Equal by `==`, written apart.
            (
                "schema: -0.0 after 0.0",
                schema_changed(&|s| s["x"] = json!(-0.0)),
            ),
        ];
        let mut renamed = base.clone();
        renamed.tools[1].name = "y".into();
        variants.push(("a tool's name", renamed));
        let mut described = base.clone();
        described.tools[1].description = "now described".into();
        variants.push(("a tool's description", described));

        let fresh = |request: &ModelRequest| {
            let mut out = Vec::new();
            write_frame(request, &mut out);
            out
        };
        let mut cache = FrameBytes::default();
        let mut seen = vec![fresh(&base)];
        assert_eq!(cache.of(&base), &seen[0][..]);
        for (part, variant) in &variants {
            let bytes = cache.of(variant).to_vec();
            assert_eq!(
                bytes,
                fresh(variant),
                "{part}: the cache kept a stale frame"
            );
            assert!(!seen.contains(&bytes), "{part}: the change was not seen");
            seen.push(bytes);
            // And back: the base again is the base's bytes.
            assert_eq!(cache.of(&base), &seen[0][..], "{part}, then the base");
            assert_eq!(
                cache.of(variant),
                &seen[seen.len() - 1][..],
                "{part}, twice"
            );
        }
        // The messages are not the frame's: a request differing only in
        // them has the same frame bytes.
        assert_eq!(cache.of(&full_request(awkward_messages())), &seen[0][..]);
    }

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
