//! What a store's tests and the engine's tests need of a store, public
//! behind the `testing` feature so that any crate can use them, in this
//! crate's own tests and in the integration tests (`tests/`):
//!
//! - The **conformance suite** ([`suite`]): every behaviour of
//!   [`EventStore`](crate::EventStore) written once as a function over a
//!   [`Backend`] (how to open the store and how to damage its storage), and
//!   [`conformance_suite!`](crate::conformance_suite), which turns it into
//!   one `#[tokio::test]` per function for one backend. This crate runs it
//!   against the memory, SQLite and PostgreSQL stores; a store written
//!   elsewhere joins with its own `Backend` and one line:
//!
//!   ```ignore
//!   warden_store::conformance_suite!(my_store, MyBackend::new(), durable);
//!   ```
//!
//!   The calling crate needs `tokio` (features `macros`, `rt-multi-thread`)
//!   among its dev-dependencies, for the tests the macro writes.
//! - The **intercepting store** ([`Intercepted`]): an `EventStore` that
//!   forwards every call to an inner store and lets a test act around the
//!   calls it cares about ([`Hooks`]): a crash at the n-th append, a stalled
//!   driver, a count, a timing.
//!
//! Nothing here is meant for a production build: the feature adds no
//! dependency but `tokio`, which the SQLite and PostgreSQL stores already
//! use.

mod intercepted;
pub mod suite;

pub use intercepted::{AppendVia, BeforeAppend, Hooks, Intercepted, Read};
pub use suite::{Backend, HistoryTamper, MemoryBackend, RowTamper, Tamper};

/// Runs the [conformance suite](crate::testing::suite) against one store:
/// `conformance_suite!(name, backend)` writes a module `name` with one
/// `#[tokio::test]` per behaviour, each on a fresh `backend` (an expression
/// whose value implements [`Backend`](crate::testing::Backend)), and
/// `conformance_suite!(name, backend, durable)` adds the tests for stores
/// whose data outlives the store value (reopening). `backend` is evaluated
/// inside each async test, so it may `.await` (connect to a server) and may
/// `return` early (skip, loudly, where no server is reachable).
#[macro_export]
macro_rules! conformance_suite {
    ($store:ident, $backend:expr) => {
        $crate::conformance_suite!(@module $store, $backend, []);
    };
    ($store:ident, $backend:expr, durable) => {
        $crate::conformance_suite!(@module $store, $backend, [
            reopened_store_keeps_everything,
            commitments_survive_reopening,
            rules_are_shared_by_every_store_on_the_data,
            history_survives_reopening,
            export_cursors_survive_reopening,
            a_widened_rule_is_refused_and_reported,
            a_rewritten_commitment_result_is_refused_and_reported,
            a_seal_copied_from_another_row_is_caught,
            rows_written_before_seals_are_sealed_when_migrated
        ]);
    };
    (@module $store:ident, $backend:expr, [$($extra:ident),*]) => {
        mod $store {
            $crate::conformance_suite!(@tests $backend;
                create_then_load,
                create_refuses_an_id_with_history,
                append_extends_the_log_in_order,
                conflicting_append_writes_nothing,
                unknown_runs_and_empty_appends_are_typed,
                status_and_updated_time_change_with_the_append,
                load_after_returns_the_tail,
                load_many_reads_each_log_checked_and_skips_the_missing,
                list_filters_each_and_combined,
                list_summaries_carry_every_column,
                verify_reports_intact_runs_and_run_ids_lists_all,
                tamper_edited_event_is_detected,
                tamper_dropped_event_is_detected,
                tamper_reordered_events_are_detected,
                tamper_truncated_log_is_detected,
                tamper_edited_hash_is_detected,
                tamper_rolled_back_head_is_detected,
                concurrent_appends_on_one_run_have_one_winner,
                concurrent_runs_each_keep_their_own_log,
                keyed_chain_differs_and_verifies,
                key_claims_grant_the_first_holder_and_name_it_to_others,
                settling_appends_and_records_the_result_for_everyone_after,
                settling_needs_the_unsettled_key_and_writes_nothing_otherwise,
                racing_key_claims_grant_exactly_one,
                commitments_are_listed_by_key_and_by_run,
                a_release_frees_the_key_for_the_next_claimant,
                a_replaced_claim_is_fenced,
                a_child_is_fenced_by_its_parents_claim,
                an_expired_claim_nobody_replaced_still_writes,
                a_released_claim_frees_the_run_and_fences_its_holder,
                racing_acquirers_have_one_winner,
                claims_take_queued_runs_and_runs_whose_driver_died,
                claims_take_runs_that_owe_deliveries_and_nothing_else,
                claims_take_waiting_runs_once_they_are_due,
                concurrent_claims_never_share_a_run,
                prune_leaves_tombstones_and_keeps_the_id,
                a_session_holds_one_active_run_until_it_ends,
                a_start_that_read_a_changed_session_is_refused,
                a_session_head_is_kept_as_runs_start_and_settle,
                racing_starts_in_one_session_have_one_winner,
                rules_are_added_listed_and_revoked_once,
                history_written_with_creates_loads_back_as_one_chain,
                a_create_whose_history_does_not_link_writes_nothing,
                tampered_history_is_detected,
                pruning_deletes_the_history_no_remaining_run_reaches,
                export_cursors_move_forward_per_reader_and_run
                $(, $extra)*
            );
        }
    };
    (@tests $backend:expr; $($test:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                let backend = $backend;
                $crate::testing::suite::$test(&backend).await;
            }
        )*
    };
}
