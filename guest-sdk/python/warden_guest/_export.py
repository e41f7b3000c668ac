"""The bridge between a Toolbox and the bindings componentize-py generates
for the `py-tool-plugin` world (`wit_world`), which exist only when the app is
componentized: this module is imported by `export_tools`, never natively.
"""

import json

from wit_world import exports
from wit_world.imports import host
# `types` is Warden's (`warden:plugin/types`); the world also imports
# `wasi:http/types`, so componentize-py names both by package.
from wit_world.imports import warden_plugin_types as types
from componentize_py_types import Err

from . import tool as t

_EFFECTS = {
    t.Effect.READ: types.Effect.READ,
    t.Effect.IDEMPOTENT: types.Effect.IDEMPOTENT,
    t.Effect.WRITE: types.Effect.WRITE,
}

_LEVELS = {
    "trace": types.LogLevel.TRACE,
    "debug": types.LogLevel.DEBUG,
    "info": types.LogLevel.INFO,
    "warn": types.LogLevel.WARN,
    "error": types.LogLevel.ERROR,
}


def _call(call):
    return t.Call(
        tool=call.tool,
        arguments=call.arguments,
        id=call.id,
        run_id=call.run_id,
        idempotency_key=call.idempotency_key,
    )


def _error(error):
    if isinstance(error, t.InvalidArguments):
        return types.ToolError_InvalidArguments(error.message)
    if isinstance(error, t.Denied):
        return types.ToolError_Denied(error.message)
    retryable = isinstance(error, t.Failed) and error.retryable
    return types.ToolError_Failed(types.Failure(message=error.message, retryable=retryable))


def tool_class(toolbox):
    """A class implementing the exported `tool` interface over `toolbox`."""

    class Tool(exports.Tool):
        def describe(self):
            return [
                types.ToolSpec(
                    name=tl.name,
                    description=tl.description,
                    input_schema=json.dumps(tl.input_schema),
                    effect=_EFFECTS[tl.effect],
                )
                for tl in toolbox.tools()
            ]

        def preflight(self, call):
            try:
                p = toolbox.preflight(_call(call))
            except t.ToolError as e:
                raise Err(_error(e)) from None
            return types.Preview(summary=p.summary, detail=p.detail)

        def invoke(self, call):
            try:
                content = toolbox.invoke(_call(call))
            except t.ToolError as e:
                raise Err(_error(e)) from None
            return types.ToolOutput(content=content)

    return Tool


def log(level, message):
    host.log(_LEVELS[level], message)


def config(key):
    return host.config(key)
