"""Warden's exceptions: one hierarchy, each exception carrying the engine's
stable error ``code`` (the codes of docs/json-output.md, the same the
command line reports), its one-line ``message`` and its ``details`` (the
evidence: the run, the call, the file and key) as a plain dict.

Catch a family (``RunStateError``, ``AgentError``...) or look at ``code``;
a code once published keeps its meaning. A code this version does not know
raises the base ``WardenError``.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type


class WardenError(Exception):
    """A failure the runtime reports, with its stable code and details."""

    code: str
    message: str
    details: Dict[str, Any]

    def __init__(
        self, code: str, message: str, details: Optional[Mapping[str, Any]] = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = dict(details or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class InvalidError(WardenError, ValueError):
    """A value the runtime refused: a bad argument, an input or output that
    does not fit its schema, a value that is not JSON or nested too deeply."""


class UnknownRunError(WardenError, LookupError):
    """No such run, session or idempotency key, or a malformed id."""


class RunStateError(WardenError):
    """A verb that does not fit the run as it stands: it is terminal, not
    parked for this, busy, or needs a human's word first."""


class ReplayError(RunStateError):
    """Recovery found that the agent or the log does not fit the record."""


class AgentError(WardenError):
    """An agent file, its plugins, grants or policies cannot be used."""


class ProviderError(WardenError):
    """The model provider failed or refused the request."""


class StoreError(WardenError):
    """The event store cannot be opened, read or written as asked."""


class CallbackError(WardenError):
    """Application code the runtime called back (an external tool's
    handler) raised; the run was stopped and the traceback recorded. The
    original exception is the ``__cause__``."""


_FAMILIES: Dict[Type[WardenError], tuple[str, ...]] = {
    InvalidError: (
        "usage",
        "invalid",
        "path_not_utf8",
        "input_rejected",
        "input_too_large",
        "input_unreadable",
        "input_required",
        "input_not_expected",
        "external_mismatch",
        "output_rejected",
        "finish_rejected",
        "value_too_deep",
        "invalid_labels",
    ),
    UnknownRunError: (
        "unknown_run",
        "invalid_run_id",
        "pruned",
        "unknown_session",
        "invalid_session_id",
        "unknown_key",
    ),
    RunStateError: (
        "run_exists",
        "session_busy",
        "session_changed",
        "run_terminal",
        "not_parked",
        "awaiting_approval",
        "awaiting_external",
        "not_awaiting_approval",
        "not_awaiting_external",
        "nothing_to_resolve",
        "cannot_finish",
        "needs_reconciliation",
        "conflict",
        "fenced",
        "claim_expired",
        "run_claimed",
        "commitment_held",
        "commitment_orphaned",
        "key_in_use",
        "key_settled",
        "key_holder_gone",
        "fork_refused",
        "unfinished_fork",
        "child_refused",
    ),
    ReplayError: ("agent_changed", "divergence"),
    AgentError: (
        "agent_invalid",
        "agent_unreadable",
        "agent_unusable",
        "agent_unknown",
        "config_invalid",
        "policy_not_registered",
        "manifest_invalid",
        "manifest_unreadable",
        "unknown_plugin",
        "unknown_tool",
        "tool_spec_invalid",
        "wrong_kind",
        "integrity_mismatch",
        "import_refused",
        "component_refused",
        "plugin_failed",
        "io_failed",
        "build_failed",
        "grant_not_requested",
        "grant_invalid",
        "env_missing",
        "mount_invalid",
    ),
    ProviderError: (
        "provider_unreachable",
        "provider_http",
        "provider_invalid",
        "transcript_invalid",
        "provider_failed",
    ),
    StoreError: (
        "log_invalid",
        "log_unreadable",
        "tampered",
        "history_broken",
        "store_failed",
        "store_too_new",
        "store_too_old",
        "store_chain_mode",
        "store_missing",
        "store_damaged",
        "store_read_only",
        "unsupported",
        "rolled_back",
        "witness_invalid",
    ),
    CallbackError: ("callback_failed",),
}

_BY_CODE: Dict[str, Type[WardenError]] = {
    code: family for family, codes in _FAMILIES.items() for code in codes
}


def error_class(code: str) -> Type[WardenError]:
    """The exception class that carries ``code``."""
    return _BY_CODE.get(code, WardenError)


def _from_code(code: str, message: str, details: Mapping[str, Any]) -> WardenError:
    # Called by the native module to raise an engine error.
    return error_class(code)(code, message, details)


__all__ = [
    "WardenError",
    "InvalidError",
    "UnknownRunError",
    "RunStateError",
    "ReplayError",
    "AgentError",
    "ProviderError",
    "StoreError",
    "CallbackError",
    "error_class",
]
