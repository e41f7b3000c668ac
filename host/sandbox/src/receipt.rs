//! The usage receipt every lease produces, whatever its outcome. The engine
//! journals it next to the call's completion.

use serde::{Deserialize, Serialize};

use super::{NetworkUsage, SecretUse};

/// How a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// The guest returned a result.
    Ok,
    /// The guest returned a typed error (a tool, context or delivery error).
    GuestError,
    /// The guest used up its fuel.
    OutOfFuel,
    /// The wall-clock deadline passed.
    Timeout,
    /// The guest asked for more linear memory than its limit.
    MemoryLimit,
    /// The guest asked for a larger table than its limit.
    TableLimit,
    /// The guest returned more bytes than its output limit.
    OutputLimit,
    /// The guest trapped: a panic, a stack overflow, an invalid operation.
    Trap,
    /// The lease was cancelled by the host.
    Cancelled,
    /// The lease never ran the guest: its capabilities could not be set up.
    Refused,
}

impl Outcome {
    /// The snake_case name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::GuestError => "guest_error",
            Outcome::OutOfFuel => "out_of_fuel",
            Outcome::Timeout => "timeout",
            Outcome::MemoryLimit => "memory_limit",
            Outcome::TableLimit => "table_limit",
            Outcome::OutputLimit => "output_limit",
            Outcome::Trap => "trap",
            Outcome::Cancelled => "cancelled",
            Outcome::Refused => "refused",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one lease used, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageReceipt {
    /// How the lease ended.
    pub outcome: Outcome,
    /// Fuel the guest consumed (instantiation included).
    pub fuel_consumed: u64,
    /// Highest linear memory in use, in bytes.
    pub peak_memory_bytes: u64,
    /// Wall time of the whole lease, in microseconds.
    pub wall_time_us: u64,
    /// Bytes of the result the guest returned.
    pub output_bytes: u64,
    /// Bytes the guest wrote to stdout (kept or not).
    pub stdout_bytes: u64,
    /// Bytes the guest wrote to stderr (kept or not).
    pub stderr_bytes: u64,
    /// Bytes of messages the guest sent through the host `log` import.
    pub log_bytes: u64,
    /// Bytes of stdout, stderr and log messages dropped past the budget.
    pub stdio_dropped_bytes: u64,
    /// The first memory or table growth the limiter refused, if any. Set
    /// even when the guest coped with the refusal and returned normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_growth: Option<DeniedGrowth>,
    /// Outbound HTTP: requests, hosts contacted, bytes in and out, denials.
    /// Present only when the lease attempted a request, so receipts of
    /// plugins without network keep their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkUsage>,
    /// Directory entries left out of the guest's listings because their
    /// names are not UTF-8 (a WASI name is a string). Present only when
    /// there were some, so other receipts keep their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unlisted: Option<Unlisted>,
    /// Secrets attached to requests, withheld from them or revealed: name,
    /// version digest, action, host; never a value. Present only when
    /// there were some, so other receipts keep their bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretUse>,
    /// Which plugin bundle ran and who signed it, as the plugin host
    /// verified it at load. Absent from leases of a component loaded
    /// without a bundle (describe, a bare component), so their receipts
    /// keep their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<Provenance>,
}

/// The bundle a lease ran: the digest of its signed statement (which names
/// the component's and the manifest's sha256) and the key that signed it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// The sha256 of the bundle statement, lowercase hex.
    pub digest: String,
    /// `minisign:<KEY ID>` for a signed bundle, `builtin` for a plugin
    /// compiled into the binary, `unsigned` for one the operator allowed
    /// unsigned.
    pub signer: String,
    /// The configured publisher whose key signed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher: Option<String>,
}

/// Directory entries a lease's listings left out because their names are
/// not UTF-8: how many, and the first [`Unlisted::NAMED`] by name (the
/// mount's guest path, then the name with each byte that is not UTF-8 as
/// `\xNN` and a backslash as `\\`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unlisted {
    /// How many entries were left out.
    pub count: u64,
    /// The first of them, by name.
    pub names: Vec<String>,
}

impl Unlisted {
    /// How many names a receipt keeps.
    pub const NAMED: usize = 16;
}

/// A memory or table growth the limiter refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeniedGrowth {
    /// `memory` (bytes) or `table` (elements).
    pub resource: GrowthResource,
    /// What the guest would have had.
    pub requested: u64,
    /// The limit.
    pub limit: u64,
}

/// What a refused growth was of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrowthResource {
    /// Linear memory, in bytes.
    Memory,
    /// A table, in elements.
    Table,
}

impl UsageReceipt {
    /// A receipt with `outcome` and nothing used.
    pub fn empty(outcome: Outcome) -> Self {
        UsageReceipt {
            outcome,
            fuel_consumed: 0,
            peak_memory_bytes: 0,
            wall_time_us: 0,
            output_bytes: 0,
            stdout_bytes: 0,
            stderr_bytes: 0,
            log_bytes: 0,
            stdio_dropped_bytes: 0,
            denied_growth: None,
            network: None,
            unlisted: None,
            secrets: Vec::new(),
            bundle: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipt_without_network_keeps_its_bytes() {
        let receipt = UsageReceipt::empty(Outcome::Ok);
        let json = serde_json::to_string(&receipt).unwrap();
        assert!(!json.contains("network"), "{json}");
        let back: UsageReceipt = serde_json::from_str(&json).unwrap();
        assert_eq!(back, receipt);
        let with = UsageReceipt {
            network: Some(NetworkUsage {
                requests: 1,
                hosts: vec!["127.0.0.1:80".into()],
                bytes_out: 2,
                bytes_in: 3,
                denials: vec![super::super::NetworkDenial {
                    target: "http://evil.example:80".into(),
                    reason: super::super::DenialReason::NotGranted,
                }],
                denied: 1,
            }),
            ..receipt
        };
        let json = serde_json::to_value(&with).unwrap();
        assert_eq!(
            json["network"]["denials"][0],
            serde_json::json!({"target": "http://evil.example:80", "reason": "not_granted"})
        );
        let back: UsageReceipt = serde_json::from_value(json).unwrap();
        assert_eq!(back, with);
    }
}
