//! Test guest `policy`: a policy plugin, built on the guest SDK, whose
//! behaviour comes from the operator's config (`warden_guest::config`), for
//! the host's policy tests. `describe` names it `test-policy`.
//!
//! Each `decide` first counts itself when a mount `count` is granted (a
//! directory the guest sees at `/count`): it appends one line,
//! `<hook> <run-id>` (the hook as the subject's tag spells it), to
//! `/count/calls`, so tests can count how often the host asked. Then:
//!
//! - `mode`, if set, overrides everything else:
//!   - `loop`: spins forever without a host call; only fuel or the timeout
//!     stop it.
//!   - `trap`: panics, which traps the instance.
//!   - `error`: returns `failed("policy backend unavailable")`.
//!   - `feedback_everywhere`: answers `feedback` at every hook (which the
//!     host must count as a failure anywhere but `before_finish`).
//!   - `huge`: denies with a 16 MiB reason, to hit the output limit.
//!   - anything else: `failed` naming the unknown mode.
//! - The subject is parsed with the SDK; one that does not fit its hook is an
//!   `invalid-request` error.
//! - `deny_tools`, comma-separated tool model names: at `before_tool_call`, a
//!   listed tool is denied with the reason ``tool `<t>` is not allowed by
//!   policy `<policy>` `` (the policy's name in the agent).
//! - `require_in_output`, a string: at `before_finish`, an output whose JSON
//!   text lacks it gets the feedback ``the answer must mention `<s>` ``.
//! - Everything else: `allow`.
//!
//! Off wasm the SDK's export macro leaves the export out, so the plugin is
//! unused there.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use std::hint::black_box;
use std::io::Write;
use std::path::Path;

use warden_guest::{
    Decision, PolicyError, PolicyPlugin, PolicyRequest, SourceSpec, Subject, config,
};

/// The directory a granted `count` mount appears at.
const COUNT_DIR: &str = "/count";

/// The size of the reason `huge` denies with: 16 MiB.
const HUGE_REASON_BYTES: usize = 16 << 20;

struct Policy;

impl PolicyPlugin for Policy {
    fn describe() -> SourceSpec {
        SourceSpec::new(
            "test-policy",
            "Denies configured tools, asks for configured words, or fails as configured.",
        )
    }

    fn decide(request: PolicyRequest) -> Result<Decision, PolicyError> {
        count(&request)?;
        if let Some(mode) = config("mode") {
            return misbehave(&mode, &request);
        }
        match request.subject()? {
            Subject::BeforeToolCall { tool, .. } => {
                let denied = config("deny_tools").unwrap_or_default();
                if denied.split(',').any(|name| name.trim() == tool) {
                    return Ok(Decision::deny(format!(
                        "tool `{tool}` is not allowed by policy `{}`",
                        request.policy
                    )));
                }
            }
            Subject::BeforeFinish { output, .. } => {
                if let Some(required) = config("require_in_output")
                    && !output.to_string().contains(&required)
                {
                    return Ok(Decision::feedback(format!(
                        "the answer must mention `{required}`"
                    )));
                }
            }
            Subject::RunStart { .. } | Subject::AfterResponse { .. } => {}
        }
        Ok(Decision::Allow)
    }
}

warden_guest::export_policy_plugin!(Policy);

/// What the configured `mode` asks for.
fn misbehave(mode: &str, request: &PolicyRequest) -> Result<Decision, PolicyError> {
    match mode {
        "loop" => spin(),
        "trap" => panic!("policy `{}` traps as configured", request.policy),
        "error" => Err(PolicyError::failed("policy backend unavailable")),
        "feedback_everywhere" => Ok(Decision::feedback(format!(
            "feedback from policy `{}` at `{}`",
            request.policy, request.hook
        ))),
        "huge" => Ok(Decision::deny("x".repeat(HUGE_REASON_BYTES))),
        other => Err(PolicyError::failed(format!(
            "unknown mode `{other}` (expected loop, trap, error, feedback_everywhere or huge)"
        ))),
    }
}

/// Burns CPU forever without a host call.
fn spin() -> ! {
    let mut counter: u64 = 0;
    loop {
        counter = black_box(counter.wrapping_add(1));
    }
}

/// Appends `<hook> <run-id>` to `/count/calls` when `/count` is a directory.
fn count(request: &PolicyRequest) -> Result<(), PolicyError> {
    let dir = Path::new(COUNT_DIR);
    if !dir.is_dir() {
        return Ok(());
    }
    let path = dir.join("calls");
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| writeln!(file, "{} {}", request.hook, request.run_id))
        .map_err(|e| PolicyError::failed(format!("count in {}: {e}", path.display())))
}
