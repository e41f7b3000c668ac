//! The store's side of a run's status: the contract between the engine,
//! which names statuses, and the store, which acts on some of them.
//!
//! A listing carries a [`ListingStatus`]: a name (what `runs list` shows
//! and filters on) and a [`StatusClass`], the only thing the store's
//! behaviour depends on:
//! - [`Queued`](StatusClass::Queued), [`Running`](StatusClass::Running) and
//!   [`Waiting`](StatusClass::Waiting) decide what a worker may claim (see
//!   [the queue](crate::claim));
//! - [`Settled`](StatusClass::Settled) runs no longer hold their session
//!   ([`crate::session`]);
//! - [`Parked`](StatusClass::Parked) runs wait for something the store
//!   never wakes (a human, the application, a budget, a child run); their
//!   names are the engine's alone.
//!
//! The store's SQL (claim queries, the session check, partial indexes)
//! matches on the names of the store's own statuses, so those names are
//! fixed here and nowhere else: a parked status can never take one of them
//! ([`ListingStatus::parked`] refuses it at compile time), and a test reads
//! the store's schema to check that its indexes name exactly these.

/// What the store does with a run in a status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StatusClass {
    /// Submitted; no worker has started it. Claimable.
    Queued,
    /// Being driven, or to be driven again: claimable when a worker's
    /// claim on it has lapsed.
    Running,
    /// Parked until its wake-up time: claimable once that time is due.
    Waiting,
    /// Parked for something outside the store. Holds its session.
    Parked,
    /// Over. Releases its session; prunable.
    Settled,
}

/// A run's status as its listing records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ListingStatus {
    name: &'static str,
    class: StatusClass,
}

/// The store's settled statuses as a SQL list, for queries that must match
/// the partial indexes' predicates exactly (the planner uses an index only
/// when the query's predicate implies the index's).
macro_rules! settled_sql {
    () => {
        "'completed', 'failed', 'cancelled', 'abandoned'"
    };
}
pub(crate) use settled_sql;

impl ListingStatus {
    /// A submitted run no worker has started.
    pub const QUEUED: ListingStatus = ListingStatus::store("queued", StatusClass::Queued);
    /// A run being driven.
    pub const RUNNING: ListingStatus = ListingStatus::store("running", StatusClass::Running);
    /// A run parked until its wake-up time.
    pub const WAITING: ListingStatus = ListingStatus::store("waiting", StatusClass::Waiting);
    /// A run that finished with an output.
    pub const COMPLETED: ListingStatus = ListingStatus::store("completed", StatusClass::Settled);
    /// A run that failed.
    pub const FAILED: ListingStatus = ListingStatus::store("failed", StatusClass::Settled);
    /// A cancelled run.
    pub const CANCELLED: ListingStatus = ListingStatus::store("cancelled", StatusClass::Settled);
    /// A run a human abandoned.
    pub const ABANDONED: ListingStatus = ListingStatus::store("abandoned", StatusClass::Settled);

    /// Every settled status, in the order the store's SQL lists them.
    pub const SETTLED: [ListingStatus; 4] = [
        ListingStatus::COMPLETED,
        ListingStatus::FAILED,
        ListingStatus::CANCELLED,
        ListingStatus::ABANDONED,
    ];

    /// Every status whose name the store fixes.
    pub(crate) const OWN: [ListingStatus; 7] = [
        ListingStatus::QUEUED,
        ListingStatus::RUNNING,
        ListingStatus::WAITING,
        ListingStatus::COMPLETED,
        ListingStatus::FAILED,
        ListingStatus::CANCELLED,
        ListingStatus::ABANDONED,
    ];

    const fn store(name: &'static str, class: StatusClass) -> ListingStatus {
        ListingStatus { name, class }
    }

    /// A parked status named `name` (snake_case, as the engine names it).
    ///
    /// # Panics
    /// If `name` is one of the store's own names or is empty; in a `const`
    /// this is a compile error.
    pub const fn parked(name: &'static str) -> ListingStatus {
        assert!(!name.is_empty(), "a status needs a name");
        let mut i = 0;
        while i < ListingStatus::OWN.len() {
            assert!(
                !same(ListingStatus::OWN[i].name, name),
                "a parked status cannot take a name the store gives meaning to"
            );
            i += 1;
        }
        ListingStatus {
            name,
            class: StatusClass::Parked,
        }
    }

    /// The name stored, shown and filtered on.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// What the store does with a run in this status.
    pub const fn class(&self) -> StatusClass {
        self.class
    }
}

impl std::fmt::Display for ListingStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The names of [`ListingStatus::SETTLED`], for comparing with a listing
/// read back (a [`RunSummary::status`](crate::RunSummary::status)).
pub const SETTLED_STATUSES: [&str; 4] = [
    ListingStatus::COMPLETED.name(),
    ListingStatus::FAILED.name(),
    ListingStatus::CANCELLED.name(),
    ListingStatus::ABANDONED.name(),
];

/// The listing name of a submitted run no worker has started.
pub const QUEUED: &str = ListingStatus::QUEUED.name();
/// The listing name of a run being driven.
pub const RUNNING: &str = ListingStatus::RUNNING.name();
/// The listing name of a run parked until its wake-up time.
pub const WAITING: &str = ListingStatus::WAITING.name();

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sql_list_names_exactly_the_settled_statuses() {
        let listed: Vec<String> = SETTLED_STATUSES.iter().map(|s| format!("'{s}'")).collect();
        assert_eq!(settled_sql!(), listed.join(", "));
    }

    #[test]
    #[should_panic(expected = "cannot take a name the store gives meaning to")]
    fn a_parked_status_cannot_pass_for_one_the_store_acts_on() {
        let name = String::from("running").leak();
        ListingStatus::parked(name);
    }

    /// Every status literal in the store's schemas (partial indexes,
    /// triggers, as applied by every migration) is a name of the class the
    /// statement acts on: an index over claimable runs names exactly the
    /// queued and running statuses, a session index exactly the settled.
    #[test]
    fn the_schemas_name_the_statuses_this_module_fixes() {
        let schemas = [
            include_str!("sqlite/schema.rs"),
            include_str!("postgres/schema.rs"),
        ];
        let claimable = format!("status IN ('{QUEUED}', '{RUNNING}')");
        let waking = format!("status = '{WAITING}'");
        let settled = concat!("status NOT IN (", settled_sql!(), ")");
        // The sessions table counts completed runs (`session_head`).
        let completed = format!("status = '{}'", ListingStatus::COMPLETED.name());
        for schema in schemas {
            let mut found = [0; 4];
            for (at, _) in schema.match_indices("status") {
                let rest = &schema[at..];
                let clause = &rest[..rest.find(';').unwrap_or(rest.len())];
                let compares = ["status IN", "status =", "status NOT IN"];
                if !compares.iter().any(|c| clause.starts_with(c)) {
                    continue;
                }
                let which = [&claimable[..], &waking[..], settled, &completed[..]]
                    .iter()
                    .position(|want| clause.starts_with(want));
                match which {
                    Some(i) => found[i] += 1,
                    None => panic!("a status literal the store does not fix: {clause}"),
                }
            }
            assert!(found.iter().all(|&n| n > 0), "{found:?}");
        }
    }
}
