"""The Python guest SDK for Warden tool plugins.

Write each tool as a typed function, register it on a `Toolbox`, and export
the toolbox from the app module as `Tool`:

    from warden_guest import Toolbox, export_tools

    toolbox = Toolbox()

    @toolbox.tool()
    def greet(name: str, excitement: int = 0) -> str:
        "Greets someone."
        return "hello " + name + "!" * excitement

    Tool = export_tools(toolbox)

The parameters' annotations are the JSON Schema `describe` reports
(`schema`), arguments that do not fit come back as `invalid-arguments`
naming the field, the return value is sent as JSON, and the `ToolError`
subclasses `InvalidArguments`, `Denied` and `Failed` become the WIT's
`tool-error` cases. `fs` holds the mount helpers, `http` the outbound
HTTP client (`http.fetch`). `warden_build` (beside
this package) turns the app into a component the sandbox accepts.
"""

from .fs import file_error, in_mount, read_text, write_text
from .tool import Call, Denied, Effect, Failed, InvalidArguments, Preview, Tool, ToolError, Toolbox

__all__ = [
    "Call",
    "Denied",
    "Effect",
    "Failed",
    "InvalidArguments",
    "Preview",
    "Tool",
    "ToolError",
    "Toolbox",
    "config",
    "export_tools",
    "file_error",
    "in_mount",
    "log",
    "read_text",
    "write_text",
]


def export_tools(toolbox):
    """The class componentize-py exports as the `tool` interface; bind it to
    the name `Tool` in the app module."""
    from . import _export

    return _export.tool_class(toolbox)


def log(level, message):
    """Sends one line to the host's log; `level` is trace, debug, info, warn or error."""
    from . import _export

    _export.log(level, message)


def config(key):
    """The value the operator set for `key`, or None."""
    from . import _export

    return _export.config(key)
