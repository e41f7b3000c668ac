//! Engine errors as Python exceptions: the code and details come from the
//! library's one mapping ([`warden::errors::code_of`], the same the command
//! line reports), the class from the code (`warden.errors`, written in
//! Python so applications can subclass and catch by family). The message is
//! the error's whole chain on one line, as the command line prints it.

use pyo3::prelude::*;
use serde_json::{Value, json};

use crate::json::to_python;

/// The exception for an engine error.
pub(crate) fn engine_error(error: &(dyn std::error::Error + 'static)) -> PyErr {
    let (code, details) = warden::errors::code_of(error);
    raise(code, &chain(error), details)
}

/// An `invalid` exception (`warden.InvalidError`): a value Python handed
/// over that the bindings refuse before the engine sees it.
pub(crate) fn invalid(message: impl Into<String>) -> PyErr {
    raise(warden::errors::INVALID, &message.into(), json!({}))
}

/// The `warden.errors` exception for `code`, built under the GIL.
pub(crate) fn raise(code: &str, message: &str, details: Value) -> PyErr {
    Python::attach(|py| {
        let built = (|| -> PyResult<Bound<'_, PyAny>> {
            let module = py.import("warden.errors")?;
            module
                .getattr("_from_code")?
                .call1((code, message, to_python(py, &details)?))
        })();
        match built {
            Ok(exception) => PyErr::from_value(exception),
            // The package's own module is missing or broken: say so rather
            // than lose the engine's error.
            Err(e) => e,
        }
    })
}

/// `error` and its sources, joined by `: `: the command line's one line
/// (anyhow's `{:#}`).
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

/// The text of a Python exception with its traceback, as `traceback`
/// formats it: what a failed callback leaves in the log.
pub(crate) fn traceback_text(py: Python<'_>, error: &PyErr) -> String {
    let formatted = (|| -> PyResult<String> {
        let lines = py
            .import("traceback")?
            .getattr("format_exception")?
            // The traceback given apart: on Python 3.11 a raised error's
            // value does not carry it.
            .call1((error.get_type(py), error.value(py), error.traceback(py)))?;
        let text: String = PyModule::import(py, "builtins")?
            .getattr("str")?
            .getattr("join")?
            .call1(("", lines))?
            .extract()?;
        Ok(text)
    })();
    formatted
        .map(|t| t.trim_end().to_owned())
        .unwrap_or_else(|_| error.to_string())
}
