//! Budgets: what a run may use ([`BudgetLimits`]), what it has used
//! ([`BudgetUsage`], folded from the log), the fixed order they are checked
//! in ([`BudgetKind::ORDER`]), pricing ([`Pricing`], recorded with each model
//! call so cost never depends on live configuration), and the extension a
//! human grants to a run parked over budget.
//!
//! Units are integers so that sums are exact and replay is deterministic:
//! cost is in nano-units of the pricing's currency, wall time in
//! milliseconds between recorded clock readings.
//!
//! | budget          | checked before             |
//! | --------------- | -------------------------- |
//! | `steps`         | a model call for a new step |
//! | `input_tokens`  | a model call               |
//! | `output_tokens` | a model call               |
//! | `cost`          | a model call               |
//! | `tool_calls`    | a tool call or its approval request |
//! | `fuel`          | a tool call or its approval request |
//! | `wall_time`     | any of the above           |
//!
//! A budget is exhausted when what was used reaches its limit; the first
//! exhausted budget in this order parks the run. Two more checks keep a
//! crossed budget from being crossed further:
//! - before a model call, the call's input alone (estimated as a token per
//!   4 bytes of the request) must fit what is left of `input_tokens` and
//!   `cost`; otherwise the run parks and the overrun records what the call
//!   needed ([`BudgetOverrun::needed`]);
//! - before a tool call or its approval request, `input_tokens`,
//!   `output_tokens` and `cost` must not be over their limits: the model
//!   call that crossed one starts none of the tool calls it asked for.
//!
//! Wall time is active time: what the recorded clock readings span while
//! the run was not parked. The time from parking (for an approval, input,
//! an external tool, a budget, a reconciliation, a timer) to the human act
//! or event that ends the park is not counted (see
//! [`RunState`](super::state::RunState)'s fold).
//!
//! A run's input has a size cap too ([`check_input_size`], the agent's
//! `max_input_size`, default [`DEFAULT_MAX_INPUT_BYTES`]); what was in force
//! when a run started is recorded in its log ([`RecordedLimits`]).

use serde::{Deserialize, Serialize};

use warden_providers::Usage;

use super::ceilings::RunCeilings;

/// One budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetKind {
    /// Model calls (steps), retries not counted.
    Steps,
    /// Model input tokens, summed over calls.
    InputTokens,
    /// Model output tokens, summed over calls.
    OutputTokens,
    /// Model cost, in nano-units of the pricing's currency.
    Cost,
    /// Tool calls executed (rejected and denied calls not counted).
    ToolCalls,
    /// Sandbox fuel, summed over every lease (previews included).
    Fuel,
    /// Active milliseconds: between recorded clock readings, parked time
    /// excluded.
    WallTime,
}

impl BudgetKind {
    /// Every budget, in the order they are checked.
    pub const ORDER: [BudgetKind; 7] = [
        BudgetKind::Steps,
        BudgetKind::InputTokens,
        BudgetKind::OutputTokens,
        BudgetKind::Cost,
        BudgetKind::ToolCalls,
        BudgetKind::Fuel,
        BudgetKind::WallTime,
    ];

    /// The snake_case name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetKind::Steps => "steps",
            BudgetKind::InputTokens => "input_tokens",
            BudgetKind::OutputTokens => "output_tokens",
            BudgetKind::Cost => "cost",
            BudgetKind::ToolCalls => "tool_calls",
            BudgetKind::Fuel => "fuel",
            BudgetKind::WallTime => "wall_time",
        }
    }

    /// The key that sets this budget in an agent file and in an extension.
    pub fn setting(self) -> &'static str {
        match self {
            BudgetKind::Steps => "max_steps",
            BudgetKind::InputTokens => "max_input_tokens",
            BudgetKind::OutputTokens => "max_output_tokens",
            BudgetKind::Cost => "max_cost",
            BudgetKind::ToolCalls => "max_tool_calls",
            BudgetKind::Fuel => "max_fuel",
            BudgetKind::WallTime => "max_wall_time",
        }
    }
}

impl std::fmt::Display for BudgetKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Limits, each optional: an unset budget is unlimited. Serialized in
/// engine units (`cost_nanos`, `wall_time_ms`), unset fields omitted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetLimits {
    /// Most model calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// Most input tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Most output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Most cost, in nano-units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_nanos: Option<u64>,
    /// Most tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u64>,
    /// Most fuel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// Most wall time, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_time_ms: Option<u64>,
}

impl BudgetLimits {
    /// The limit of `kind`, if set.
    pub fn get(&self, kind: BudgetKind) -> Option<u64> {
        match kind {
            BudgetKind::Steps => self.steps,
            BudgetKind::InputTokens => self.input_tokens,
            BudgetKind::OutputTokens => self.output_tokens,
            BudgetKind::Cost => self.cost_nanos,
            BudgetKind::ToolCalls => self.tool_calls,
            BudgetKind::Fuel => self.fuel,
            BudgetKind::WallTime => self.wall_time_ms,
        }
    }

    /// Sets the limit of `kind`.
    pub fn set(&mut self, kind: BudgetKind, limit: Option<u64>) {
        let slot = match kind {
            BudgetKind::Steps => &mut self.steps,
            BudgetKind::InputTokens => &mut self.input_tokens,
            BudgetKind::OutputTokens => &mut self.output_tokens,
            BudgetKind::Cost => &mut self.cost_nanos,
            BudgetKind::ToolCalls => &mut self.tool_calls,
            BudgetKind::Fuel => &mut self.fuel,
            BudgetKind::WallTime => &mut self.wall_time_ms,
        };
        *slot = limit;
    }

    /// These limits with every limit `other` sets replacing this one's.
    pub fn overridden_by(&self, other: &BudgetLimits) -> BudgetLimits {
        let mut out = *self;
        for kind in BudgetKind::ORDER {
            if let Some(limit) = other.get(kind) {
                out.set(kind, Some(limit));
            }
        }
        out
    }

    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        BudgetKind::ORDER.iter().all(|k| self.get(*k).is_none())
    }
}

/// What a run has used, folded from its log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetUsage {
    /// Model calls completed.
    pub steps: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Cost, in nano-units.
    pub cost_nanos: u64,
    /// Tool calls executed (intents recorded).
    pub tool_calls: u64,
    /// Fuel over every lease.
    pub fuel: u64,
    /// Active milliseconds, parked time excluded.
    pub wall_time_ms: u64,
}

impl BudgetUsage {
    /// What was used of `kind`.
    pub fn get(&self, kind: BudgetKind) -> u64 {
        match kind {
            BudgetKind::Steps => self.steps,
            BudgetKind::InputTokens => self.input_tokens,
            BudgetKind::OutputTokens => self.output_tokens,
            BudgetKind::Cost => self.cost_nanos,
            BudgetKind::ToolCalls => self.tool_calls,
            BudgetKind::Fuel => self.fuel,
            BudgetKind::WallTime => self.wall_time_ms,
        }
    }
}

/// A budget that was used up, or that the next effect would take past its
/// limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetOverrun {
    /// Which budget.
    pub budget: BudgetKind,
    /// How much was used.
    pub used: u64,
    /// The limit.
    pub limit: u64,
    /// What the refused effect needed in all (what was used plus the
    /// estimate of a model call's input), when the limit was not yet
    /// reached but the call would have crossed it. Omitted otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needed: Option<u64>,
}

impl BudgetOverrun {
    /// The overrun in human units, cost in `currency` when known:
    /// `cost: $7.87 used of $0.50`, `wall_time: 14m 10s used of 5m`.
    pub fn describe(&self, currency: Option<&str>) -> String {
        let amount = |n| format_amount(self.budget, n, currency);
        let mut text = format!(
            "{}: {} used of {}",
            self.budget,
            amount(self.used),
            amount(self.limit)
        );
        if let Some(needed) = self.needed {
            text.push_str(&format!(
                "; the next model call needs {} in all by its input alone",
                amount(needed)
            ));
        }
        text
    }

    /// The least new limit that lifts this overrun: above what was used,
    /// and at least what the refused call needed.
    pub fn least_lifting_limit(&self) -> u64 {
        self.needed.unwrap_or(0).max(self.used.saturating_add(1))
    }
}

impl std::fmt::Display for BudgetOverrun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "budget {}", self.describe(None))
    }
}

/// `n` engine units of `kind` in human units: wall time as `14m 10s`,
/// `4.5s` or `850ms`; cost as `$7.87` (`€`, `£`, else `7.87 CHF`; a bare
/// amount when the currency is not known) with every digit it has and at
/// least cents (`$0.01065`, never rounded to `$0.01`); counts
/// with thousands separators (`1,234,567`).
pub fn format_amount(kind: BudgetKind, n: u64, currency: Option<&str>) -> String {
    match kind {
        BudgetKind::WallTime => format_active_time(n),
        BudgetKind::Cost => format_cost(n, currency),
        _ => thousands(n),
    }
}

/// Milliseconds as `1h 2m 3s`, `14m 10s`, `4.5s` or `850ms`.
fn format_active_time(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        return match ms % 1000 {
            0 => format!("{}s", ms / 1000),
            _ => format!("{:.1}s", ms as f64 / 1000.0),
        };
    }
    let s = ms / 1000;
    let parts = [(s / 3600, "h"), (s % 3600 / 60, "m"), (s % 60, "s")];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Nano-units as an amount of `currency`: every digit the amount has, and
/// at least cents (`0.50`, `0.01065`, `0.000000075`). Never rounded: a
/// rounded amount is one an operator cannot act on (a limit raised to a
/// need rounded down to cents is refused again, naming the same number).
fn format_cost(nanos: u64, currency: Option<&str>) -> String {
    let fraction = format!("{:09}", nanos % 1_000_000_000);
    let digits = fraction.trim_end_matches('0').len().max(2);
    let number = format!("{}.{}", nanos / 1_000_000_000, &fraction[..digits]);
    match currency {
        Some("USD") => format!("${number}"),
        Some("EUR") => format!("€{number}"),
        Some("GBP") => format!("£{number}"),
        Some(code) => format!("{number} {code}"),
        None => number,
    }
}

/// `n` with a comma between each group of three digits.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The first of `kinds` (taken in [`BudgetKind::ORDER`]) whose usage has
/// reached its limit.
pub fn first_exhausted(
    kinds: &[BudgetKind],
    usage: &BudgetUsage,
    limits: &BudgetLimits,
) -> Option<BudgetOverrun> {
    first_where(kinds, usage, limits, |used, limit| used >= limit)
}

/// The first of `kinds` (taken in [`BudgetKind::ORDER`]) whose usage is
/// over its limit: crossed, not merely reached.
pub fn first_crossed(
    kinds: &[BudgetKind],
    usage: &BudgetUsage,
    limits: &BudgetLimits,
) -> Option<BudgetOverrun> {
    first_where(kinds, usage, limits, |used, limit| used > limit)
}

fn first_where(
    kinds: &[BudgetKind],
    usage: &BudgetUsage,
    limits: &BudgetLimits,
    over: impl Fn(u64, u64) -> bool,
) -> Option<BudgetOverrun> {
    BudgetKind::ORDER
        .into_iter()
        .filter(|k| kinds.contains(k))
        .find_map(|budget| {
            let limit = limits.get(budget)?;
            let used = usage.get(budget);
            over(used, limit).then_some(BudgetOverrun {
                budget,
                used,
                limit,
                needed: None,
            })
        })
}

/// The overrun a model call would cause by its input alone, estimated at
/// `input_tokens`: the first of `input_tokens` and `cost` (priced with
/// `pricing`) that it would take past its limit.
pub fn input_overrun(
    input_tokens: u64,
    usage: &BudgetUsage,
    limits: &BudgetLimits,
    pricing: Option<&Pricing>,
) -> Option<BudgetOverrun> {
    let over = |budget, used: u64, more: u64| {
        let limit = limits.get(budget)?;
        let needed = used.saturating_add(more);
        (needed > limit).then_some(BudgetOverrun {
            budget,
            used,
            limit,
            needed: Some(needed),
        })
    };
    over(BudgetKind::InputTokens, usage.input_tokens, input_tokens).or_else(|| {
        let price = pricing?.cost_nanos(&Usage {
            input_tokens,
            output_tokens: 0,
        });
        over(BudgetKind::Cost, usage.cost_nanos, price)
    })
}

/// The input-size cap when the agent sets none: 1 MiB.
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 1 << 20;

/// The limits in force when a run started, recorded in its `run_started`
/// so that what a run may use is read from its log (with the extensions
/// recorded since), never from the agent file as it is now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedLimits {
    /// The budgets, in engine units. Omitted when none is set.
    #[serde(default, skip_serializing_if = "BudgetLimits::is_empty")]
    pub budgets: BudgetLimits,
    /// The largest input (and resume input) accepted, in bytes of its JSON
    /// text.
    pub max_input_bytes: u64,
    /// The currency cost is counted in (the agent's pricing's). Omitted
    /// without pricing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// The host's ceilings the run started under ([`RunCeilings`]). Omitted
    /// in logs written before there were any: such a run has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceilings: Option<RunCeilings>,
}

/// An input over the size cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the input is {} of JSON, over the limit of {} (the agent's budgets.max_input_size): pass a smaller input, or raise max_input_size in the agent file",
    size_text(*.size),
    size_text(*.limit)
)]
pub struct InputTooLarge {
    /// The input's size, in bytes of its JSON text.
    pub size: u64,
    /// The cap.
    pub limit: u64,
}

/// Refuses `input` when its JSON text is longer than `limit` bytes.
pub fn check_input_size(input: &serde_json::Value, limit: u64) -> Result<(), InputTooLarge> {
    let size = json_size(input);
    if size > limit {
        return Err(InputTooLarge { size, limit });
    }
    Ok(())
}

/// The length of `value`'s JSON text, counted without building it.
fn json_size(value: &serde_json::Value) -> u64 {
    struct Counter(u64);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    serde_json::to_writer(&mut counter, value).expect("a JSON value serializes");
    counter.0
}

/// Bytes as `10.0 MiB`, `512 KiB` or `900 bytes`.
fn size_text(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} bytes"),
        1024..1_048_576 if bytes.is_multiple_of(1024) => format!("{} KiB", bytes / 1024),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ if bytes.is_multiple_of(1_048_576) => format!("{} MiB", bytes / 1_048_576),
        _ => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
    }
}

/// What model tokens cost, per million, in millionths of `currency`.
/// Recorded with every model call it priced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    /// ISO 4217 code, for example `USD`.
    pub currency: String,
    /// Price of a million input tokens, in millionths of the currency.
    pub input_micros_per_million: u64,
    /// Price of a million output tokens, in millionths of the currency.
    pub output_micros_per_million: u64,
}

impl Pricing {
    /// The cost of `usage`, in nano-units, rounded up.
    pub fn cost_nanos(&self, usage: &Usage) -> u64 {
        // tokens × (micros / 10⁶ tokens) × (10³ nanos / micro)
        let part = |tokens: u64, micros: u64| (tokens as u128 * micros as u128).div_ceil(1000);
        let total = part(usage.input_tokens, self.input_micros_per_million)
            + part(usage.output_tokens, self.output_micros_per_million);
        u64::try_from(total).unwrap_or(u64::MAX)
    }
}

/// Converts an amount of currency (as written in a file: `1.25`) to
/// nano-units.
pub fn currency_to_nanos(amount: f64) -> Option<u64> {
    (0.0..=1e9)
        .contains(&amount)
        .then(|| (amount * 1e9).round() as u64)
}

/// Converts a price per million tokens (as written: `3.0`) to millionths.
pub fn price_to_micros(amount: f64) -> Option<u64> {
    (0.0..=1e9)
        .contains(&amount)
        .then(|| (amount * 1e6).round() as u64)
}

/// An extension that cannot be granted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExtensionError {
    /// The input is not an object of budget settings.
    #[error(
        "a budget extension is an object such as {{\"max_steps\": 20}}, with keys among max_steps, max_input_tokens, max_output_tokens, max_cost, max_tool_calls, max_fuel, max_wall_time; got `{0}`"
    )]
    NotAnObject(String),
    /// A key is not a budget setting.
    #[error(
        "`{0}` is not a budget setting (use max_steps, max_input_tokens, max_output_tokens, max_cost, max_tool_calls, max_fuel or max_wall_time)"
    )]
    UnknownKey(String),
    /// A value has the wrong type or range.
    #[error("`{key}`: {message}")]
    InvalidValue {
        /// The key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// The extension leaves the exceeded budget used up (or too small for
    /// the model call that was refused).
    #[error(
        "the extension must raise `{}` to {}, got {}",
        .needed.budget.setting(),
        match .needed.needed {
            Some(_) => format!("at least {} (what the refused model call needs)", format_amount(.needed.budget, .needed.least_lifting_limit(), None)),
            None => format!("more than {} (what was used)", format_amount(.needed.budget, .needed.used, None)),
        },
        .given.map_or("no new limit".to_owned(), |l| format_amount(.needed.budget, l, None))
    )]
    TooSmall {
        /// The overrun the run is parked on.
        needed: BudgetOverrun,
        /// The new limit given, in engine units.
        given: Option<u64>,
    },
    /// The extension sets nothing.
    #[error("the extension sets no budget")]
    Empty,
    /// The run is not parked over budget.
    #[error("the run is not over budget: there is nothing to extend")]
    NotExceeded,
}

/// Reads a budget extension given as resume input: an object whose keys are
/// the agent file's budget settings (`max_steps`, `max_cost` in currency,
/// `max_wall_time` as `"10m"`, …), each the new limit.
pub fn parse_extension(input: &serde_json::Value) -> Result<BudgetLimits, ExtensionError> {
    let map = input
        .as_object()
        .ok_or_else(|| ExtensionError::NotAnObject(input.to_string()))?;
    let mut limits = BudgetLimits::default();
    for (key, value) in map {
        let kind = BudgetKind::ORDER
            .into_iter()
            .find(|k| k.setting() == key)
            .ok_or_else(|| ExtensionError::UnknownKey(key.clone()))?;
        let invalid = |message: &str| ExtensionError::InvalidValue {
            key: key.clone(),
            message: format!("{message}, got `{value}`"),
        };
        let limit = match kind {
            BudgetKind::Cost => value
                .as_f64()
                .and_then(currency_to_nanos)
                .ok_or_else(|| invalid("must be a non-negative amount"))?,
            BudgetKind::WallTime => {
                let text = value
                    .as_str()
                    .ok_or_else(|| invalid("must be a duration such as \"10m\""))?;
                let d = warden_syntax::units::parse_duration(text).map_err(|m| invalid(&m))?;
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
            }
            _ => value
                .as_u64()
                .ok_or_else(|| invalid("must be a non-negative integer"))?,
        };
        limits.set(kind, Some(limit));
    }
    if limits.is_empty() {
        return Err(ExtensionError::Empty);
    }
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn budgets_are_checked_in_the_fixed_order() {
        let usage = BudgetUsage {
            steps: 3,
            input_tokens: 10,
            output_tokens: 10,
            cost_nanos: 10,
            tool_calls: 5,
            fuel: 100,
            wall_time_ms: 1000,
        };
        let all = BudgetLimits {
            steps: Some(3),
            input_tokens: Some(10),
            output_tokens: Some(10),
            cost_nanos: Some(10),
            tool_calls: Some(5),
            fuel: Some(100),
            wall_time_ms: Some(1000),
        };
        // Everything is used up: the order decides which one is reported,
        // whatever order the caller lists them in.
        let mut expected = BudgetKind::ORDER.to_vec();
        while let Some(first) = expected.first().copied() {
            let mut kinds = expected.clone();
            kinds.reverse();
            assert_eq!(
                first_exhausted(&kinds, &usage, &all),
                Some(BudgetOverrun {
                    budget: first,
                    used: usage.get(first),
                    limit: all.get(first).unwrap(),
                    needed: None,
                })
            );
            expected.remove(0);
        }
        // Below every limit, or no limit: nothing.
        let roomy = BudgetLimits {
            steps: Some(4),
            ..BudgetLimits::default()
        };
        assert_eq!(first_exhausted(&BudgetKind::ORDER, &usage, &roomy), None);
    }

    #[test]
    fn crossed_is_over_the_limit_not_at_it() {
        let limits = BudgetLimits {
            cost_nanos: Some(10),
            output_tokens: Some(5),
            ..BudgetLimits::default()
        };
        let at = BudgetUsage {
            cost_nanos: 10,
            output_tokens: 5,
            ..BudgetUsage::default()
        };
        let kinds = [BudgetKind::OutputTokens, BudgetKind::Cost];
        assert_eq!(first_crossed(&kinds, &at, &limits), None);
        assert!(first_exhausted(&kinds, &at, &limits).is_some());
        let over = BudgetUsage {
            cost_nanos: 11,
            ..at
        };
        assert_eq!(
            first_crossed(&kinds, &over, &limits),
            Some(BudgetOverrun {
                budget: BudgetKind::Cost,
                used: 11,
                limit: 10,
                needed: None
            })
        );
    }

    #[test]
    fn a_call_whose_input_alone_would_cross_a_budget_is_an_overrun() {
        let pricing = Pricing {
            currency: "USD".into(),
            input_micros_per_million: price_to_micros(3.0).unwrap(),
            output_micros_per_million: 0,
        };
        let limits = BudgetLimits {
            cost_nanos: currency_to_nanos(0.5),
            ..BudgetLimits::default()
        };
        let usage = BudgetUsage::default();
        // 100k tokens cost $0.30: within. 200k cost $0.60: refused, with
        // what the call needed.
        assert_eq!(
            input_overrun(100_000, &usage, &limits, Some(&pricing)),
            None
        );
        let overrun = input_overrun(200_000, &usage, &limits, Some(&pricing)).unwrap();
        assert_eq!(
            overrun,
            BudgetOverrun {
                budget: BudgetKind::Cost,
                used: 0,
                limit: 500_000_000,
                needed: Some(600_000_000)
            }
        );
        assert_eq!(
            overrun.describe(Some("USD")),
            "cost: $0.00 used of $0.50; the next model call needs $0.60 in all by its input alone"
        );
        assert_eq!(overrun.least_lifting_limit(), 600_000_000);
        // Input tokens come first, and count what was used before.
        let tokens = BudgetLimits {
            input_tokens: Some(1_000),
            ..limits
        };
        let used = BudgetUsage {
            input_tokens: 900,
            ..usage
        };
        assert_eq!(
            input_overrun(101, &used, &tokens, Some(&pricing)).map(|o| (o.budget, o.needed)),
            Some((BudgetKind::InputTokens, Some(1_001)))
        );
        assert_eq!(input_overrun(100, &used, &tokens, None), None);
    }

    #[test]
    fn amounts_are_written_in_human_units() {
        let cases = [
            (BudgetKind::WallTime, 850_979, "14m 10s"),
            (BudgetKind::WallTime, 300_000, "5m"),
            (BudgetKind::WallTime, 3_723_000, "1h 2m 3s"),
            (BudgetKind::WallTime, 4_500, "4.5s"),
            (BudgetKind::WallTime, 850, "850ms"),
            (BudgetKind::Cost, 7_870_000_000, "$7.87"),
            (BudgetKind::Cost, 500_000_000, "$0.50"),
            (BudgetKind::Cost, 75, "$0.000000075"),
            (BudgetKind::Cost, 10_650_000, "$0.01065"),
            (BudgetKind::Cost, 600_150_000, "$0.60015"),
            (BudgetKind::Cost, 12_000_000_001, "$12.000000001"),
            (BudgetKind::Cost, 0, "$0.00"),
            (BudgetKind::InputTokens, 2_623_412, "2,623,412"),
            (BudgetKind::Steps, 10, "10"),
            (BudgetKind::Fuel, 50_000_000_000, "50,000,000,000"),
        ];
        for (kind, n, expected) in cases {
            assert_eq!(format_amount(kind, n, Some("USD")), expected, "{kind} {n}");
        }
        assert_eq!(
            format_amount(BudgetKind::Cost, 1_250_000_000, Some("CHF")),
            "1.25 CHF"
        );
        assert_eq!(format_amount(BudgetKind::Cost, 1_250_000_000, None), "1.25");
        let overrun = BudgetOverrun {
            budget: BudgetKind::WallTime,
            used: 850_979,
            limit: 300_000,
            needed: None,
        };
        assert_eq!(overrun.to_string(), "budget wall_time: 14m 10s used of 5m");
    }

    #[test]
    fn an_input_over_the_cap_is_refused_with_both_sizes() {
        let input = json!("x".repeat(2 * 1024 * 1024));
        let err = check_input_size(&input, DEFAULT_MAX_INPUT_BYTES).unwrap_err();
        assert_eq!(err.size, 2 * 1024 * 1024 + 2);
        assert!(
            err.to_string()
                .starts_with("the input is 2.0 MiB of JSON, over the limit of 1 MiB"),
            "{err}"
        );
        check_input_size(&json!("small"), 7).unwrap();
        assert!(check_input_size(&json!("small"), 6).is_err());
    }

    #[test]
    fn limits_serialize_in_engine_units_and_omit_unset() {
        let l = BudgetLimits {
            steps: Some(2),
            wall_time_ms: Some(60_000),
            ..BudgetLimits::default()
        };
        assert_eq!(
            serde_json::to_string(&l).unwrap(),
            r#"{"steps":2,"wall_time_ms":60000}"#
        );
        let base = BudgetLimits {
            steps: Some(1),
            fuel: Some(9),
            ..BudgetLimits::default()
        };
        assert_eq!(
            base.overridden_by(&l),
            BudgetLimits {
                steps: Some(2),
                fuel: Some(9),
                wall_time_ms: Some(60_000),
                ..BudgetLimits::default()
            }
        );
    }

    #[test]
    fn pricing_is_exact_and_rounds_up() {
        let p = Pricing {
            currency: "USD".into(),
            input_micros_per_million: price_to_micros(3.0).unwrap(),
            output_micros_per_million: price_to_micros(15.0).unwrap(),
        };
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 1,
        };
        // $3 for a million input tokens, $0.000015 for one output token.
        assert_eq!(p.cost_nanos(&usage), 3_000_000_000 + 15_000);
        let cheap = Pricing {
            currency: "USD".into(),
            input_micros_per_million: price_to_micros(0.075).unwrap(),
            output_micros_per_million: 0,
        };
        assert_eq!(cheap.input_micros_per_million, 75_000);
        assert_eq!(
            cheap.cost_nanos(&Usage {
                input_tokens: 1,
                output_tokens: 0
            }),
            75
        );
        assert_eq!(currency_to_nanos(1.25), Some(1_250_000_000));
        assert_eq!(currency_to_nanos(-1.0), None);
        assert_eq!(price_to_micros(f64::NAN), None);
    }

    #[test]
    fn extensions_are_parsed_in_file_units() {
        assert_eq!(
            parse_extension(&json!({"max_steps": 20, "max_cost": 0.5, "max_wall_time": "2m"}))
                .unwrap(),
            BudgetLimits {
                steps: Some(20),
                cost_nanos: Some(500_000_000),
                wall_time_ms: Some(120_000),
                ..BudgetLimits::default()
            }
        );
        let cases = [
            (json!(null), "is an object"),
            (json!({}), "sets no budget"),
            (json!({"steps": 1}), "`steps` is not a budget setting"),
            (
                json!({"max_steps": -1}),
                "`max_steps`: must be a non-negative integer",
            ),
            (
                json!({"max_wall_time": 5}),
                "`max_wall_time`: must be a duration",
            ),
            (json!({"max_wall_time": "5"}), "needs a unit"),
        ];
        for (input, expected) in cases {
            let err = parse_extension(&input).unwrap_err();
            assert!(err.to_string().contains(expected), "{input}: {err}");
        }
    }
}
