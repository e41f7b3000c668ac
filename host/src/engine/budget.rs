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
//! exhausted budget in this order parks the run.

use serde::{Deserialize, Serialize};

use crate::providers::Usage;

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
    /// Milliseconds from the run's start to the latest recorded clock reading.
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
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
    /// Milliseconds from the run's start to the latest clock reading.
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

/// A budget that was used up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetOverrun {
    /// Which budget.
    pub budget: BudgetKind,
    /// How much was used.
    pub used: u64,
    /// The limit.
    pub limit: u64,
}

impl std::fmt::Display for BudgetOverrun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "budget `{}` is used up: {} used of {}",
            self.budget, self.used, self.limit
        )
    }
}

/// The first of `kinds` (taken in [`BudgetKind::ORDER`]) whose usage has
/// reached its limit.
pub fn first_exhausted(
    kinds: &[BudgetKind],
    usage: &BudgetUsage,
    limits: &BudgetLimits,
) -> Option<BudgetOverrun> {
    BudgetKind::ORDER
        .into_iter()
        .filter(|k| kinds.contains(k))
        .find_map(|budget| {
            let limit = limits.get(budget)?;
            let used = usage.get(budget);
            (used >= limit).then_some(BudgetOverrun {
                budget,
                used,
                limit,
            })
        })
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
    /// The extension leaves the exceeded budget used up.
    #[error("the extension must raise `{}` above {} (its usage), got {}", .needed.budget.setting(), .needed.used, .given.map_or("no new limit".to_owned(), |l| l.to_string()))]
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
                let d = crate::units::parse_duration(text).map_err(|m| invalid(&m))?;
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
                    limit: all.get(first).unwrap()
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
