//! The engine's futures as asyncio awaitables. Each verb's future runs on
//! the bindings' Tokio runtime (one per process, started on first use),
//! without the GIL; the asyncio future it returns belongs to the event
//! loop running when the verb was called, and is completed on that loop's
//! thread (`call_soon_threadsafe`). Cancelling the asyncio future drops
//! the engine's future, as a crash would stop it: what was recorded stays,
//! and recovery goes on from there.
//!
//! A small bridge of its own rather than a crate: the point is that it
//! adds no dependency to the engine's graph, so building the Python module
//! reuses the artifacts the command line's build left (a crate that asks
//! for other features of `futures` or `tokio` would rebuild wasmtime).

use std::future::Future;
use std::sync::OnceLock;

use pyo3::IntoPyObjectExt as _;
use pyo3::prelude::*;
use tokio::task::AbortHandle;

/// The bindings' Tokio runtime.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("warden")
            .build()
            .expect("cannot start the bindings' Tokio runtime")
    })
}

/// An asyncio future on the running event loop, completed with what `work`
/// gives.
pub(crate) fn future_into_py<'py, F, T>(py: Python<'py>, work: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let future = event_loop.call_method0("create_future")?;
    let target = future.clone().unbind();
    let on_loop = event_loop.unbind();
    let task = runtime().spawn(async move {
        let result = work.await;
        Python::attach(|py| {
            let outcome = result.and_then(|value| value.into_py_any(py));
            let complete = match outcome {
                Ok(value) => Complete {
                    future: target,
                    value,
                    failed: false,
                },
                Err(error) => Complete {
                    future: target,
                    value: error.into_value(py).into_any(),
                    failed: true,
                },
            };
            // A loop closed meanwhile has no one left to tell.
            let _ = on_loop
                .bind(py)
                .call_method1("call_soon_threadsafe", (complete,));
        });
    });
    future.call_method1(
        "add_done_callback",
        (Abort {
            task: task.abort_handle(),
        },),
    )?;
    Ok(future)
}

/// Sets an asyncio future's result or exception, on its loop's thread,
/// unless it was cancelled meanwhile.
#[pyclass(frozen)]
struct Complete {
    future: Py<PyAny>,
    value: Py<PyAny>,
    failed: bool,
}

#[pymethods]
impl Complete {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        let future = self.future.bind(py);
        if future.call_method0("done")?.is_truthy()? {
            return Ok(());
        }
        let method = if self.failed {
            "set_exception"
        } else {
            "set_result"
        };
        future.call_method1(method, (self.value.clone_ref(py),))?;
        Ok(())
    }
}

/// Drops the engine's future when its asyncio future is cancelled.
#[pyclass(frozen)]
struct Abort {
    task: AbortHandle,
}

#[pymethods]
impl Abort {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future.call_method0("cancelled")?.is_truthy()? {
            self.task.abort();
        }
        Ok(())
    }
}
