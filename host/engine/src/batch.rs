//! Parallel batches, the agent's setting: how many calls of one turn may
//! be in flight at once ([`Parallelism`]). Which calls join a batch is
//! decided in `decide/batch.rs`; the runtime's executor
//! (`runtime/batch.rs`) runs what that decides.
//!
//! ```toml
//! max_parallel_calls = 4     # calls of one turn in flight at once, 1 to 64;
//!                            # default 1 (one at a time)
//! parallel_writes = false    # let writes that need no approval (or were
//!                            # approved) run beside others; default false
//! ```
//!

use super::events::ToolCallIntent;
use warden_plugins::grant::EffectClass;

/// The most calls of one turn in flight at once that an agent may set.
pub const MAX_PARALLEL_CALLS: u32 = 64;

/// How many calls of one turn may be in flight at once, and whether
/// writes may be among them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parallelism {
    /// Calls in flight at once, from 1 (`max_parallel_calls`). Default 1:
    /// one call at a time.
    pub max_calls: u32,
    /// Whether a write that needs no approval, or was approved, may run
    /// beside other calls (`parallel_writes`). Default false.
    pub writes: bool,
}

impl Default for Parallelism {
    fn default() -> Self {
        Parallelism {
            max_calls: 1,
            writes: false,
        }
    }
}

impl Parallelism {
    /// Whether a call with this intent may be in flight beside others.
    pub fn admits(&self, intent: &ToolCallIntent) -> bool {
        self.max_calls > 1
            && intent.keyed_by.is_none()
            && (intent.effect != EffectClass::Write || self.writes)
    }
}
