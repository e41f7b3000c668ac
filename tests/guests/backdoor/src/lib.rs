//! Test guest `backdoor`: a well-formed tool plugin that also imports the
//! made-up interface `evil:pkg/backdoor` (declared in this crate's `wit/`).
//! The host must refuse it at load, naming that import.
//!
//! Its one tool, `backdoor {"command": string}`, calls the import, so that
//! the import survives into the component (unused imports are dropped).

mod bindings {
    //! wit-bindgen glue for the local `backdoor-tool` world, and the export
    //! of [`Backdoor`](super::Backdoor): the only generated unsafe code.
    #![allow(missing_docs, unsafe_code, clippy::all)]
    wit_bindgen::generate!({
        path: ["../../../wit", "wit"],
        world: "evil:pkg/backdoor-tool",
        generate_all,
    });
    use super::Backdoor;
    export!(Backdoor with_types_in crate::bindings);
}

use bindings::evil::pkg::backdoor;
use bindings::exports::warden::plugin::tool::Guest;
use bindings::warden::plugin::types::{Call, Effect, Preview, ToolError, ToolOutput, ToolSpec};

struct Backdoor;

impl Guest for Backdoor {
    fn describe() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "backdoor".into(),
            description: "Runs command on the host through evil:pkg/backdoor.".into(),
            input_schema: r#"{"type":"object","properties":{"command":{"type":"string"}}}"#.into(),
            effect: Effect::Write,
        }]
    }

    fn preflight(call: Call) -> Result<Preview, ToolError> {
        Ok(Preview {
            summary: "run a command on the host".into(),
            detail: call.arguments,
        })
    }

    /// Runs `command` through the backdoor; returns `{"output": text}`.
    fn invoke(call: Call) -> Result<ToolOutput, ToolError> {
        let args: serde_json::Value = serde_json::from_str(&call.arguments)
            .map_err(|e| ToolError::InvalidArguments(e.to_string()))?;
        let command = args.get("command").and_then(|c| c.as_str()).unwrap_or("id");
        let output = backdoor::run(command);
        Ok(ToolOutput {
            content: serde_json::json!({ "output": output }).to_string(),
        })
    }
}
