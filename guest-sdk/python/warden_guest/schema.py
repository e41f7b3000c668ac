"""Python type annotations as JSON Schema, and JSON values checked against them.

A tool's parameters are read from its signature: each annotated parameter is
one property of the arguments object, a parameter with a default is
optional. `schema_of` gives the JSON Schema that `describe` reports;
`decode` turns a JSON value into the annotated type (a dataclass instance, an
enum member, a list of them...) or raises `SchemaError` naming the field, so
the author's function never sees arguments that do not fit.

Supported: str, int, float, bool, None, list[T], dict[str, T], Optional[T]
and `T | None`, Literal[...], Enum subclasses, dataclasses (nested objects),
and Annotated[T, "description"].
"""

import dataclasses
import enum
import types
import typing


class SchemaError(Exception):
    """A value does not fit its declared type; the message names where."""


class UnsupportedType(TypeError):
    """An annotation this module cannot express as JSON Schema."""


def _is_optional(tp):
    """(True, inner) for Optional[inner] / inner | None, else (False, tp)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return True, args[0]
        raise UnsupportedType(f"unions other than Optional are not supported: {tp!r}")
    return False, tp


def _unwrap_annotated(tp):
    """(inner type, description or None) for Annotated[inner, "text"]."""
    if typing.get_origin(tp) is typing.Annotated:
        inner, *meta = typing.get_args(tp)
        text = next((m for m in meta if isinstance(m, str)), None)
        return inner, text
    return tp, None


def schema_of(tp):
    """The JSON Schema (a dict) of values of the annotation `tp`."""
    tp, description = _unwrap_annotated(tp)
    optional, tp = _is_optional(tp)
    schema = _schema_of_plain(tp)
    if optional:
        schema = {"anyOf": [schema, {"type": "null"}]}
    if description:
        schema = dict(schema, description=description)
    return schema


def _schema_of_plain(tp):
    origin = typing.get_origin(tp)
    if tp is str:
        return {"type": "string"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is type(None):
        return {"type": "null"}
    if origin is list:
        (item,) = typing.get_args(tp) or (typing.Any,)
        return {"type": "array", "items": schema_of(item)}
    if origin is dict:
        key, value = typing.get_args(tp)
        if key is not str:
            raise UnsupportedType(f"dict keys must be str: {tp!r}")
        return {"type": "object", "additionalProperties": schema_of(value)}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(tp))}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if dataclasses.is_dataclass(tp):
        return object_schema(_dataclass_fields(tp), doc=_own_doc(tp))
    if tp is typing.Any:
        return {}
    raise UnsupportedType(f"no JSON Schema for {tp!r}")


class Field(typing.NamedTuple):
    name: str
    annotation: object
    required: bool
    default: object


def _dataclass_fields(cls):
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        has_default = (
            f.default is not dataclasses.MISSING
            or f.default_factory is not dataclasses.MISSING
        )
        out.append(Field(f.name, hints[f.name], not has_default, None))
    return out


def _own_doc(cls):
    # A dataclass without a docstring gets a generated one ("Name(a: int)"),
    # which is noise in a schema.
    doc = cls.__dict__.get("__doc__")
    if not doc or doc.startswith(cls.__name__ + "("):
        return None
    return " ".join(doc.split())


def object_schema(fields, doc=None):
    """The schema of an object with `fields`; unknown properties refused."""
    schema = {
        "type": "object",
        "properties": {f.name: schema_of(f.annotation) for f in fields},
        "required": [f.name for f in fields if f.required],
        "additionalProperties": False,
    }
    if doc:
        schema["description"] = doc
    return schema


_JSON_NAMES = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


def _kind(value):
    for py, name in _JSON_NAMES.items():
        # bool is an int in Python; JSON keeps them apart.
        if type(value) is py:
            return name
    return type(value).__name__


def decode(tp, value, where="arguments"):
    """`value` (parsed JSON) as the annotation `tp`, or SchemaError naming `where`."""
    tp, _ = _unwrap_annotated(tp)
    optional, tp = _is_optional(tp)
    if value is None and optional:
        return None
    origin = typing.get_origin(tp)
    if tp is float:
        if type(value) in (int, float):
            return float(value)
        raise SchemaError(f"{where}: expected a number, got {_kind(value)}")
    if tp in (str, bool, int, type(None)):
        if type(value) is tp:
            return value
        raise SchemaError(f"{where}: expected {_JSON_NAMES[tp]}, got {_kind(value)}")
    if origin is list:
        (item,) = typing.get_args(tp) or (typing.Any,)
        if type(value) is not list:
            raise SchemaError(f"{where}: expected an array, got {_kind(value)}")
        return [decode(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(tp)
        if type(value) is not dict:
            raise SchemaError(f"{where}: expected an object, got {_kind(value)}")
        return {k: decode(item, v, f"{where}.{k}") for k, v in value.items()}
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value in allowed and type(value) in {type(a) for a in allowed}:
            return value
        raise SchemaError(f"{where}: expected one of {list(allowed)!r}, got {value!r}")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if member.value == value and type(member.value) is type(value):
                return member
        raise SchemaError(
            f"{where}: expected one of {[m.value for m in tp]!r}, got {value!r}"
        )
    if dataclasses.is_dataclass(tp):
        return tp(**decode_object(_dataclass_fields(tp), value, where))
    if tp is typing.Any:
        return value
    raise UnsupportedType(f"cannot decode {tp!r}")


def decode_object(fields, value, where="arguments"):
    """`value` as keyword arguments for `fields`, checked the way `object_schema` says."""
    if type(value) is not dict:
        raise SchemaError(f"{where}: expected an object, got {_kind(value)}")
    known = {f.name for f in fields}
    unknown = sorted(set(value) - known)
    if unknown:
        raise SchemaError(
            f"{where}: unknown field `{unknown[0]}`, expected one of {sorted(known)!r}"
        )
    out = {}
    for f in fields:
        inner = f"`{f.name}`" if where == "arguments" else f"{where}.{f.name}"
        if f.name not in value:
            if f.required:
                raise SchemaError(f"{where}: missing field `{f.name}`")
            continue
        out[f.name] = decode(f.annotation, value[f.name], f"field {inner}")
    return out


def encode(value):
    """A tool's return value as plain JSON data: dataclasses become objects,
    enums their values, tuples arrays."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return encode(value.value)
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if value is None or type(value) in (str, int, float, bool):
        return value
    raise TypeError(f"cannot send {type(value).__name__} as JSON")
