//! The WIT records, enums and variants that plugin code handles, re-exported
//! from the generated bindings under short names, with small constructors.
//!
//! Constructors for the error variants live next to the plugin kind that uses
//! them: [`ToolError`] in `tool`, [`ContextError`] in `context`,
//! [`DeliveryError`] in `channel`, [`Decision`] and [`PolicyError`] in
//! `policy`.

use std::fmt;

pub use crate::bindings::warden::plugin::types::{
    Call, ContextError, ContextItem, ContextRequest, Decision, Delivery, DeliveryError, Effect,
    Failure, LogLevel, PolicyError, PolicyHook, PolicyRequest, Preview, Rejection, SourceSpec,
    ToolError, ToolOutput, ToolSpec,
};

impl Effect {
    /// The effect's WIT name: `read`, `idempotent` or `write`.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Read => "read",
            Effect::Idempotent => "idempotent",
            Effect::Write => "write",
        }
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PolicyHook {
    /// Every hook, in the order a run meets them.
    pub const ALL: [PolicyHook; 4] = [
        PolicyHook::RunStart,
        PolicyHook::AfterResponse,
        PolicyHook::BeforeToolCall,
        PolicyHook::BeforeFinish,
    ];

    /// The hook's name as the subject's `hook` tag and an agent's `hooks`
    /// spell it: `run_start`, `after_response`, `before_tool_call` or
    /// `before_finish`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyHook::RunStart => "run_start",
            PolicyHook::AfterResponse => "after_response",
            PolicyHook::BeforeToolCall => "before_tool_call",
            PolicyHook::BeforeFinish => "before_finish",
        }
    }

    /// The hook named `name` (as [`PolicyHook::as_str`] spells it).
    pub fn from_name(name: &str) -> Option<PolicyHook> {
        PolicyHook::ALL
            .into_iter()
            .find(|hook| hook.as_str() == name)
    }
}

impl fmt::Display for PolicyHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl LogLevel {
    /// The level's WIT name: `trace`, `debug`, `info`, `warn` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Failure {
    /// A failure with `message`; `retryable` says whether trying again later
    /// may succeed.
    pub fn new(message: impl Into<String>, retryable: bool) -> Self {
        Failure {
            message: message.into(),
            retryable,
        }
    }
}

impl Preview {
    /// A preview with a one-line `summary` and a possibly empty `detail`.
    pub fn new(summary: impl Into<String>, detail: impl Into<String>) -> Self {
        Preview {
            summary: summary.into(),
            detail: detail.into(),
        }
    }
}

impl SourceSpec {
    /// What a context source or channel reports from `describe`.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        SourceSpec {
            name: name.into(),
            description: description.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effect_and_level_names_match_the_wit() {
        let effects = [Effect::Read, Effect::Idempotent, Effect::Write];
        let names: Vec<String> = effects.iter().map(|e| e.to_string()).collect();
        assert_eq!(names, ["read", "idempotent", "write"]);
        let levels = [
            LogLevel::Trace,
            LogLevel::Debug,
            LogLevel::Info,
            LogLevel::Warn,
            LogLevel::Error,
        ];
        let names: Vec<&str> = levels.iter().map(|l| l.as_str()).collect();
        assert_eq!(names, ["trace", "debug", "info", "warn", "error"]);
    }

    #[test]
    fn hook_names_are_the_subject_tags_and_parse_back() {
        let names: Vec<String> = PolicyHook::ALL.iter().map(|h| h.to_string()).collect();
        assert_eq!(
            names,
            [
                "run_start",
                "after_response",
                "before_tool_call",
                "before_finish"
            ]
        );
        for hook in PolicyHook::ALL {
            assert_eq!(PolicyHook::from_name(hook.as_str()), Some(hook));
        }
        assert_eq!(PolicyHook::from_name("run-start"), None);
        assert_eq!(PolicyHook::from_name("before_answer"), None);
    }
}
