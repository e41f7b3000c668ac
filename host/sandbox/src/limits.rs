//! Per-lease resource limits, and the store limiter that enforces the memory
//! and table limits and records each denial so the receipt can name the limit
//! that was hit instead of an opaque `unreachable` trap.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What one lease may use. Every lease has a wall-clock deadline; fuel is an
/// additional budget of work.
///
/// Fuel counts WebAssembly instructions, so the fuel a unit of work costs
/// differs by guest language and toolchain by orders of magnitude (an
/// interpreter compiled to wasm burns far more than a Rust guest). Size it per
/// plugin by measuring with `warden plugin call`, which prints the fuel used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Instructions the guest may execute, or `None` for no fuel budget (the
    /// deadline still applies). Default: 10,000,000,000.
    pub fuel: Option<u64>,
    /// Wall-clock deadline for the whole lease, including instantiation and
    /// time spent in host calls. Default: 10 s.
    pub timeout: Duration,
    /// Linear memory, in bytes, summed over the component's memories.
    /// Default: 64 MiB.
    pub memory_bytes: u64,
    /// Elements any one table may hold. Default: 20,000.
    pub table_elements: u64,
    /// Bytes of output the guest may return (strings of the result summed).
    /// Default: 1 MiB.
    pub output_bytes: u64,
    /// Bytes of stdout, stderr and host log messages kept per lease; the rest
    /// is dropped and counted. Default: 64 KiB.
    pub stdio_bytes: u64,
    /// Outbound HTTP requests one lease may send; further requests are
    /// denied (`connection-limit-reached`). Denied requests do not count.
    /// Only matters to a plugin granted hosts. Default: 64.
    #[serde(default = "default_http_requests")]
    pub http_requests: u64,
    /// Response body bytes one lease may receive over all its requests; a
    /// body going past what is left fails with `HTTP-response-body-size`.
    /// Default: 16 MiB.
    #[serde(default = "default_http_response_bytes")]
    pub http_response_bytes: u64,
}

fn default_http_requests() -> u64 {
    64
}

fn default_http_response_bytes() -> u64 {
    16 << 20
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel: Some(10_000_000_000),
            timeout: Duration::from_secs(10),
            memory_bytes: 64 << 20,
            table_elements: 20_000,
            output_bytes: 1 << 20,
            stdio_bytes: 64 << 10,
            http_requests: default_http_requests(),
            http_response_bytes: default_http_response_bytes(),
        }
    }
}

impl Limits {
    /// Limits for `describe` and other metadata calls, the same whatever
    /// the operator set for calls (so the answer can be cached per
    /// component): 1,000,000,000 fuel, 2 s, 256 KiB of output, 16 KiB of
    /// stdio; memory, tables and HTTP limits as the plugin's (metadata calls
    /// run with no capabilities, so no request can pass anyway).
    pub fn for_metadata(&self) -> Limits {
        Limits {
            fuel: Some(1_000_000_000),
            timeout: Duration::from_secs(2),
            output_bytes: 256 << 10,
            stdio_bytes: 16 << 10,
            ..self.clone()
        }
    }

    /// Limits for a preflight: each of the plugin's limits, at most
    /// [`PREVIEW_CEILING`] (2,000,000,000 fuel, 5 s, 256 KiB of output,
    /// 16 KiB of stdio, no HTTP request).
    pub fn for_preview(&self) -> Limits {
        self.at_most(&PREVIEW_CEILING)
    }

    /// The operator ceilings when `warden.toml` sets none (`[ceilings]`):
    /// 100,000,000,000 fuel (an `unmetered` manifest gets this much), 60 s,
    /// 1 GiB of memory, 100,000 table elements, 16 MiB of output, 1 MiB of
    /// stdio, 256 HTTP requests and 64 MiB of response bytes per lease.
    pub const CEILINGS: Limits = Limits {
        fuel: Some(100_000_000_000),
        timeout: Duration::from_secs(60),
        memory_bytes: 1 << 30,
        table_elements: 100_000,
        output_bytes: 16 << 20,
        stdio_bytes: 1 << 20,
        http_requests: 256,
        http_response_bytes: 64 << 20,
    };

    /// These limits, with the deadline and fuel fit in what is left of a
    /// run's budgets.
    pub fn within(&self, bound: &RunBound) -> Limits {
        let fuel = match (self.fuel, bound.fuel) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, None) => a,
            (None, b) => b,
        };
        Limits {
            fuel,
            timeout: bound
                .wall_time
                .map_or(self.timeout, |left| self.timeout.min(left)),
            ..self.clone()
        }
    }

    /// Each limit, at most `ceiling`'s (no fuel budget is more than any).
    pub fn at_most(&self, ceiling: &Limits) -> Limits {
        let fuel = match (self.fuel, ceiling.fuel) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, None) => a,
            (None, b) => b,
        };
        Limits {
            fuel,
            timeout: self.timeout.min(ceiling.timeout),
            memory_bytes: self.memory_bytes.min(ceiling.memory_bytes),
            table_elements: self.table_elements.min(ceiling.table_elements),
            output_bytes: self.output_bytes.min(ceiling.output_bytes),
            stdio_bytes: self.stdio_bytes.min(ceiling.stdio_bytes),
            http_requests: self.http_requests.min(ceiling.http_requests),
            http_response_bytes: self.http_response_bytes.min(ceiling.http_response_bytes),
        }
    }
}

/// What is left of a run's budgets when it makes a lease: each lease's
/// deadline and fuel fit in it. `None`: that budget is not limited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunBound {
    /// Wall time left.
    pub wall_time: Option<Duration>,
    /// Fuel left.
    pub fuel: Option<u64>,
}

/// The most a preflight lease gets, whatever the plugin's limits say: a
/// preview is asked before approval and must be cheap.
pub const PREVIEW_CEILING: Limits = Limits {
    fuel: Some(2_000_000_000),
    timeout: Duration::from_secs(5),
    memory_bytes: u64::MAX,
    table_elements: u64::MAX,
    output_bytes: 256 << 10,
    stdio_bytes: 16 << 10,
    http_requests: 0,
    http_response_bytes: 0,
};

/// A growth the limiter refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Denial {
    /// Linear memory would have grown to `requested` bytes.
    Memory { requested: u64, limit: u64 },
    /// A table would have grown to `requested` elements.
    Table { requested: u64, limit: u64 },
}

impl Denial {
    /// The receipt's view of the denial.
    pub(crate) fn to_receipt(self) -> super::DeniedGrowth {
        use super::{DeniedGrowth, GrowthResource};
        match self {
            Denial::Memory { requested, limit } => DeniedGrowth {
                resource: GrowthResource::Memory,
                requested,
                limit,
            },
            Denial::Table { requested, limit } => DeniedGrowth {
                resource: GrowthResource::Table,
                requested,
                limit,
            },
        }
    }
}

/// The store's `ResourceLimiter`: enforces [`Limits::memory_bytes`] over all
/// memories of the instance and [`Limits::table_elements`] per table, keeps
/// the peak, and remembers the first denial.
#[derive(Debug)]
pub(crate) struct LeaseLimiter {
    memory_limit: u64,
    table_limit: u64,
    memory_in_use: u64,
    memory_peak: u64,
    denial: Option<Denial>,
}

impl LeaseLimiter {
    pub(crate) fn new(limits: &Limits) -> Self {
        LeaseLimiter {
            memory_limit: limits.memory_bytes,
            table_limit: limits.table_elements,
            memory_in_use: 0,
            memory_peak: 0,
            denial: None,
        }
    }

    pub(crate) fn memory_peak(&self) -> u64 {
        self.memory_peak
    }

    pub(crate) fn denial(&self) -> Option<Denial> {
        self.denial
    }
}

impl wasmtime::ResourceLimiter for LeaseLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let growth = desired.saturating_sub(current) as u64;
        let total = self.memory_in_use.saturating_add(growth);
        if total > self.memory_limit {
            self.denial.get_or_insert(Denial::Memory {
                requested: total,
                limit: self.memory_limit,
            });
            return Ok(false);
        }
        self.memory_in_use = total;
        self.memory_peak = self.memory_peak.max(total);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.table_limit {
            self.denial.get_or_insert(Denial::Table {
                requested: desired as u64,
                limit: self.table_limit,
            });
            return Ok(false);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    #[test]
    fn memory_is_summed_over_memories_and_the_first_denial_is_kept() {
        let limits = Limits {
            memory_bytes: 100,
            ..Limits::default()
        };
        let mut limiter = LeaseLimiter::new(&limits);
        assert!(limiter.memory_growing(0, 60, None).unwrap());
        assert!(limiter.memory_growing(0, 40, None).unwrap());
        assert!(!limiter.memory_growing(40, 41, None).unwrap());
        assert!(!limiter.memory_growing(60, 200, None).unwrap());
        assert_eq!(limiter.memory_peak(), 100);
        assert_eq!(
            limiter.denial(),
            Some(Denial::Memory {
                requested: 101,
                limit: 100
            })
        );
    }

    #[test]
    fn table_growth_past_the_limit_is_denied() {
        let limits = Limits {
            table_elements: 10,
            ..Limits::default()
        };
        let mut limiter = LeaseLimiter::new(&limits);
        assert!(limiter.table_growing(0, 10, None).unwrap());
        assert!(!limiter.table_growing(10, 11, None).unwrap());
        assert_eq!(
            limiter.denial(),
            Some(Denial::Table {
                requested: 11,
                limit: 10
            })
        );
    }

    #[test]
    fn a_ceiling_bounds_every_limit_and_unmetered_fuel() {
        let huge = Limits {
            fuel: None,
            timeout: Duration::from_secs(3600),
            memory_bytes: 1 << 40,
            table_elements: 1 << 40,
            output_bytes: 1 << 40,
            stdio_bytes: 1 << 40,
            http_requests: 1 << 40,
            http_response_bytes: 1 << 40,
        };
        assert_eq!(huge.for_preview().fuel, Some(2_000_000_000));
        assert_eq!(huge.for_preview().http_requests, 0);
        assert_eq!(huge.at_most(&Limits::default()), Limits::default());
        let small = Limits {
            fuel: Some(5),
            ..Limits::default()
        };
        assert_eq!(small.for_preview().fuel, Some(5));
        assert_eq!(
            small.at_most(&Limits {
                fuel: None,
                ..Limits::default()
            }),
            small
        );
    }

    #[test]
    fn what_is_left_of_a_run_bounds_the_deadline_and_the_fuel() {
        let unmetered = Limits {
            fuel: None,
            timeout: Duration::from_secs(3600),
            ..Limits::default()
        };
        let bound = RunBound {
            wall_time: Some(Duration::from_secs(3)),
            fuel: Some(1_000),
        };
        let within = unmetered.within(&bound);
        assert_eq!(within.timeout, Duration::from_secs(3));
        assert_eq!(within.fuel, Some(1_000));
        assert_eq!(within.memory_bytes, unmetered.memory_bytes);
        assert_eq!(
            Limits::default().within(&RunBound::default()),
            Limits::default()
        );
        assert_eq!(
            Limits::default()
                .within(&RunBound {
                    wall_time: Some(Duration::from_secs(3600)),
                    fuel: Some(u64::MAX),
                })
                .timeout,
            Limits::default().timeout
        );
    }

    #[test]
    fn metadata_limits_do_not_depend_on_the_call_limits() {
        let tight = Limits {
            fuel: Some(5),
            timeout: Duration::from_millis(10),
            output_bytes: 7,
            memory_bytes: 3 << 20,
            ..Limits::default()
        };
        assert_eq!(
            tight.for_metadata(),
            Limits {
                fuel: Some(1_000_000_000),
                timeout: Duration::from_secs(2),
                memory_bytes: 3 << 20,
                table_elements: tight.table_elements,
                output_bytes: 256 << 10,
                stdio_bytes: 16 << 10,
                http_requests: tight.http_requests,
                http_response_bytes: tight.http_response_bytes,
            }
        );
    }
}
