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
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pyo3::IntoPyObjectExt as _;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::task::AbortHandle;

/// The bindings' Tokio runtime: started on first use, shut down when the
/// interpreter exits ([`shutdown`]).
static RUNTIME: Mutex<Option<tokio::runtime::Runtime>> = Mutex::new(None);

/// Set once [`shutdown`] ran: no runtime is started again.
static SHUT_DOWN: AtomicBool = AtomicBool::new(false);

/// A handle on the bindings' Tokio runtime.
fn handle() -> PyResult<tokio::runtime::Handle> {
    let mut runtime = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = runtime.as_ref() {
        return Ok(r.handle().clone());
    }
    if SHUT_DOWN.load(Ordering::SeqCst) {
        return Err(PyRuntimeError::new_err("the interpreter is exiting"));
    }
    let started = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("warden")
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start Tokio: {e}")))?;
    let handle = started.handle().clone();
    *runtime = Some(started);
    Ok(handle)
}

/// Stops the runtime's threads before the interpreter finalizes (the
/// package registers it with `atexit`): a Tokio thread that touched Python
/// and is still around while CPython finalizes makes it abort the
/// process. Runs still driven stop as a crash would stop them; their logs
/// hold what was recorded.
#[pyfunction]
pub(crate) fn _shutdown(py: Python<'_>) {
    SHUT_DOWN.store(true, Ordering::SeqCst);
    let taken = RUNTIME.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(runtime) = taken {
        py.detach(|| runtime.shutdown_timeout(Duration::from_secs(5)));
    }
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
    let task = handle()?.spawn(async move {
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

/// A value the engine's threads may still use, kept alive instead of
/// dropped when Python is finalizing: dropping a runtime then would wake
/// Tokio tasks that call back into an interpreter that is going away
/// (CPython aborts the process). Leaking at exit is harmless.
pub(crate) struct KeptAtExit<T>(Option<T>);

impl<T> KeptAtExit<T> {
    pub(crate) fn new(value: T) -> Self {
        KeptAtExit(Some(value))
    }
}

impl<T> std::ops::Deref for KeptAtExit<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.0.as_ref().expect("taken only when dropped")
    }
}

impl<T> Drop for KeptAtExit<T> {
    fn drop(&mut self) {
        let finalizing = Python::attach(|py| {
            py.import("sys")
                .and_then(|sys| sys.call_method0("is_finalizing"))
                .and_then(|b| b.is_truthy())
                .unwrap_or(true)
        });
        if finalizing {
            std::mem::forget(self.0.take());
        }
    }
}
