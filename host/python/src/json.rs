//! JSON values between the engine and Python: the engine's
//! [`serde_json::Value`]s become plain Python objects (`dict`, `list`,
//! `str`, `int`, `float`, `bool`, `None`) and back. A Python value that is
//! not JSON (a set, bytes, a float that is not finite, a key that is not a
//! string) is refused (`warden.InvalidError`, code `invalid`) naming what was found, before
//! anything is recorded.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

use crate::errors::invalid;

/// Python's nesting is bounded by its recursion limit; the engine refuses
/// deeper values anyway (`value_too_deep`), so conversion stops well before.
const MAX_DEPTH: usize = 256;

/// A JSON value handed to Python as a plain object.
#[derive(Debug)]
pub(crate) struct Json(pub(crate) Value);

impl<'py> IntoPyObject<'py> for Json {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        to_python(py, &self.0)
    }
}

/// `value` as a plain Python object.
pub(crate) fn to_python<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_python(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, to_python(py, v)?)?;
            }
            dict.into_any()
        }
    })
}

/// The JSON value of a plain Python object; `what` names it in an error.
pub(crate) fn from_python(object: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    convert(object, what, 0)
}

fn convert(object: &Bound<'_, PyAny>, at: &str, depth: usize) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(invalid(format!(
            "{at}: nested deeper than {MAX_DEPTH} levels"
        )));
    }
    if object.is_none() {
        return Ok(Value::Null);
    }
    // `bool` is a subclass of `int`: look at it first.
    if let Ok(b) = object.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if object.is_instance_of::<PyInt>() {
        if let Ok(i) = object.extract::<i64>() {
            return Ok(Value::from(i));
        }
        if let Ok(u) = object.extract::<u64>() {
            return Ok(Value::from(u));
        }
        return Err(invalid(format!(
            "{at}: the integer {object} does not fit in 64 bits"
        )));
    }
    if let Ok(f) = object.cast::<PyFloat>() {
        let value = f.value();
        return Number::from_f64(value)
            .map(Value::Number)
            .ok_or_else(|| invalid(format!("{at}: {value} is not a finite number")));
    }
    if let Ok(s) = object.cast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_owned()));
    }
    if let Ok(list) = object.cast::<PyList>() {
        return list
            .iter()
            .enumerate()
            .map(|(i, item)| convert(&item, &format!("{at}[{i}]"), depth + 1))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Array);
    }
    if let Ok(tuple) = object.cast::<PyTuple>() {
        return tuple
            .iter()
            .enumerate()
            .map(|(i, item)| convert(&item, &format!("{at}[{i}]"), depth + 1))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Array);
    }
    if let Ok(dict) = object.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in dict.iter() {
            let key = k.cast::<PyString>().map_err(|_| {
                invalid(format!(
                    "{at}: the key {} is a {}, not a string",
                    k.repr().map(|r| r.to_string()).unwrap_or_default(),
                    type_name(&k)
                ))
            })?;
            let key = key.to_str()?.to_owned();
            let value = convert(&v, &format!("{at}[{key:?}]"), depth + 1)?;
            map.insert(key, value);
        }
        return Ok(Value::Object(map));
    }
    Err(invalid(format!(
        "{at}: a {} is not a JSON value (dict, list, str, int, float, bool or None)",
        type_name(object)
    )))
}

fn type_name(object: &Bound<'_, PyAny>) -> String {
    object
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "value".to_owned())
}
