"""Tools as typed Python functions, their errors, and dispatch by name.

Nothing here imports the component bindings, so a toolbox is unit-tested
with plain CPython: `toolbox.invoke(Call(tool=..., arguments=...))` behaves
as it does in the component.
"""

import dataclasses
import enum
import inspect
import json
import re
import typing

from . import schema

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


class Effect(enum.Enum):
    """How repeatable a tool's effect is (the WIT's `effect`)."""

    READ = "read"
    IDEMPOTENT = "idempotent"
    WRITE = "write"


@dataclasses.dataclass
class Call:
    """One invocation (the WIT's `call`). Annotate a parameter with `Call`
    to receive it; it is not part of the schema."""

    tool: str
    arguments: str = "{}"
    id: str = "call-1"
    run_id: str = ""
    idempotency_key: str = ""


@dataclasses.dataclass
class Preview:
    """What the human approving a call sees (the WIT's `preview`)."""

    summary: str
    detail: str = ""


class ToolError(Exception):
    """A failure the tool understood; raise a subclass."""

    def __init__(self, message):
        super().__init__(message)
        self.message = message


class InvalidArguments(ToolError):
    """The arguments do not fit the tool's schema or meaning."""


class Denied(ToolError):
    """The tool refused: outside its mount, not permitted, and so on."""


class Failed(ToolError):
    """The tool tried and failed; `retryable` says whether later may work."""

    def __init__(self, message, retryable=False):
        super().__init__(message)
        self.retryable = retryable


class Tool:
    """One tool: a function, its name, description, effect and schema."""

    def __init__(self, function, name, description, effect, preflight=None):
        if not _NAME.match(name) or len(name) > 64:
            raise ValueError(f"tool name `{name}` must match [a-z][a-z0-9_]*, at most 64 bytes")
        self.function = function
        self.name = name
        self.description = description
        self.effect = effect
        self.preflight_function = preflight
        self._call_param, self._fields, self._whole = _parameters(function)
        self.input_schema = schema.object_schema(self._fields, doc=None)

    def _arguments(self, call):
        try:
            value = json.loads(call.arguments)
        except ValueError as e:
            raise InvalidArguments(
                f"invalid arguments for tool `{self.name}`: not JSON: {e}"
            ) from None
        try:
            kwargs = schema.decode_object(self._fields, value)
        except schema.SchemaError as e:
            raise InvalidArguments(f"invalid arguments for tool `{self.name}`: {e}") from None
        if self._whole is not None:
            name, cls = self._whole
            kwargs = {name: cls(**kwargs)}
        if self._call_param:
            kwargs[self._call_param] = call
        return kwargs

    def invoke(self, call):
        """Runs the tool; returns its output as JSON text or raises ToolError."""
        output = self.function(**self._arguments(call))
        return json.dumps(schema.encode(output))

    def preflight(self, call):
        """The preflight function's preview, or one naming the call."""
        kwargs = self._arguments(call)
        if self.preflight_function is not None:
            return self.preflight_function(**kwargs)
        detail = json.dumps(json.loads(call.arguments), indent=2)
        return Preview(f"call `{self.name}` ({self.effect.value})", detail)


def _parameters(function):
    """(name of the Call parameter, schema fields, (name, dataclass) when one
    dataclass parameter is the whole arguments object)."""
    hints = typing.get_type_hints(function, include_extras=True)
    call_param = None
    fields = []
    for p in inspect.signature(function).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"{function.__name__}: *args and **kwargs have no schema")
        if p.name not in hints:
            raise TypeError(f"{function.__name__}: parameter `{p.name}` needs a type annotation")
        if hints[p.name] is Call:
            call_param = p.name
            continue
        required = p.default is inspect.Parameter.empty
        fields.append(schema.Field(p.name, hints[p.name], required, p.default))
    if len(fields) == 1 and dataclasses.is_dataclass(fields[0].annotation):
        # One dataclass parameter: its fields are the arguments, as with
        # one argument struct in the Rust SDK.
        only = fields[0]
        return call_param, schema._dataclass_fields(only.annotation), (only.name, only.annotation)
    return call_param, fields, None


class Toolbox:
    """The tools a plugin offers. Register with the `tool` decorator, then
    export with `warden_guest.export_tools(toolbox)`."""

    def __init__(self):
        self._tools = {}

    def tool(self, name=None, effect=Effect.READ, description=None, preflight=None):
        """Decorator: the function becomes a tool named after it (or `name`),
        described by its docstring (or `description`)."""

        def register(function):
            tool_name = name or function.__name__
            if tool_name in self._tools:
                raise ValueError(f"tool `{tool_name}` is declared twice")
            text = description or " ".join((function.__doc__ or "").split())
            self._tools[tool_name] = Tool(function, tool_name, text, effect, preflight)
            return function

        return register

    def tools(self):
        return list(self._tools.values())

    def _find(self, call):
        tool = self._tools.get(call.tool)
        if tool is None:
            known = ", ".join(f"`{n}`" for n in self._tools)
            raise InvalidArguments(f"no tool `{call.tool}` in this plugin (it has {known})")
        return tool

    def invoke(self, call):
        """The named tool's output as JSON text; raises ToolError."""
        return self._find(call).invoke(call)

    def preflight(self, call):
        """The named tool's preview; raises ToolError."""
        return self._find(call).preflight(call)
