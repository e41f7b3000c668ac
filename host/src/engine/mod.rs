//! The run engine: agent definitions, events, folding a log into state,
//! deciding the next action, budgets, and the `Runtime` that drives runs.
