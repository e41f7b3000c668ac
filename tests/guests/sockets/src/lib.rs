//! Test guest `sockets`: a tool component that opens a TCP connection with
//! `std::net`, so it imports `wasi:sockets/*`. Warden grants no sockets
//! (outbound traffic goes through `wasi:http` toward granted hosts only), so
//! the host must refuse this component at load, naming the import.
//!
//! Its one tool, `connect {"addr": "host:port"}`, would return
//! `{"connected": "<peer address>"}` or a `failed` error with the I/O error.

mod bindings {
    //! wit-bindgen glue for the `tool-plugin` world, and the export of
    //! [`Sockets`](super::Sockets): the only generated unsafe code.
    #![allow(missing_docs, unsafe_code, clippy::all)]
    wit_bindgen::generate!({ path: "../../../wit", world: "tool-plugin" });
    use super::Sockets;
    export!(Sockets with_types_in crate::bindings);
}

use std::net::TcpStream;

use bindings::exports::warden::plugin::tool::Guest;
use bindings::warden::plugin::types::{
    Call, Effect, Failure, Preview, ToolError, ToolOutput, ToolSpec,
};

struct Sockets;

impl Guest for Sockets {
    fn describe() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "connect".into(),
            description: "Opens a TCP connection to addr (host:port).".into(),
            input_schema:
                r#"{"type":"object","required":["addr"],"properties":{"addr":{"type":"string"}}}"#
                    .into(),
            effect: Effect::Read,
        }]
    }

    fn preflight(call: Call) -> Result<Preview, ToolError> {
        Ok(Preview {
            summary: format!("connect {}", call.arguments),
            detail: String::new(),
        })
    }

    fn invoke(call: Call) -> Result<ToolOutput, ToolError> {
        let addr = addr_argument(&call.arguments)?;
        match TcpStream::connect(addr.as_str()) {
            Ok(stream) => {
                let peer = stream
                    .peer_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                Ok(ToolOutput {
                    content: serde_json::json!({ "connected": peer }).to_string(),
                })
            }
            Err(e) => Err(ToolError::Failed(Failure {
                message: format!("connect {addr}: {e}"),
                retryable: false,
            })),
        }
    }
}

/// Reads `addr` from `{"addr": "host:port"}`.
fn addr_argument(arguments: &str) -> Result<String, ToolError> {
    serde_json::from_str::<serde_json::Value>(arguments)
        .ok()
        .and_then(|args| args.get("addr")?.as_str().map(str::to_owned))
        .ok_or_else(|| {
            ToolError::InvalidArguments(format!(
                "expected {{\"addr\": \"host:port\"}}, got {arguments}"
            ))
        })
}
