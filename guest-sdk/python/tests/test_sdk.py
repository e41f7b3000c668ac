"""The SDK natively, with plain CPython: schemas from annotations, argument
checking that names the field, outputs as JSON, errors by kind, mount paths,
and what the HTTP client refuses before it needs the component.
Run: python3 guest-sdk/python/tests/test_sdk.py
"""

import dataclasses
import enum
import json
import os
import sys
import tempfile
import unittest
from typing import Annotated, Literal, Optional

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from warden_guest import (  # noqa: E402
    Call, Denied, Effect, Failed, InvalidArguments, Preview, Toolbox, file_error, http, in_mount,
    write_text,
)
from warden_guest import schema  # noqa: E402


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


@dataclasses.dataclass
class Point:
    """A point."""

    x: int
    y: int = 0


def toolbox():
    box = Toolbox()

    @box.tool()
    def greet(name: Annotated[str, "Who"], excitement: int = 0, call: Call = None) -> dict:
        """Greets  someone."""
        if not name:
            raise InvalidArguments("`name` is empty")
        return {"text": "hello " + name + "!" * excitement, "by": call.id}

    @box.tool(effect=Effect.WRITE, preflight=lambda p: Preview(f"move to {p.x},{p.y}"))
    def move(p: Point) -> Point:
        """Moves."""
        return Point(p.x + 1, p.y)

    @box.tool()
    def shapes(
        points: list[Point], mode: Mode = Mode.FAST, tag: Optional[str] = None,
        unit: Literal["m", "km"] = "m", weights: dict[str, float] = None,
    ) -> list:
        return [mode, tag, unit, weights, points]

    @box.tool()
    def boom() -> str:
        raise Failed("upstream down", retryable=True)

    return box


def call(tool, **arguments):
    return Call(tool=tool, arguments=json.dumps(arguments), id="c-7")


class Schemas(unittest.TestCase):
    def test_parameters_are_the_properties_and_defaults_are_optional(self):
        spec = {t.name: t for t in toolbox().tools()}
        self.assertEqual(spec["greet"].description, "Greets someone.")
        self.assertEqual(
            spec["greet"].input_schema,
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "Who"},
                    "excitement": {"type": "integer"},
                },
                "required": ["name"],
                "additionalProperties": False,
            },
        )

    def test_one_dataclass_parameter_is_the_whole_arguments_object(self):
        move = {t.name: t for t in toolbox().tools()}["move"]
        self.assertEqual(move.effect, Effect.WRITE)
        self.assertEqual(move.input_schema["properties"], {"x": {"type": "integer"}, "y": {"type": "integer"}})
        self.assertEqual(move.input_schema["required"], ["x"])

    def test_nested_and_composite_types(self):
        props = {t.name: t for t in toolbox().tools()}["shapes"].input_schema["properties"]
        self.assertEqual(props["points"]["items"]["description"], "A point.")
        self.assertEqual(props["mode"], {"enum": ["fast", "slow"]})
        self.assertEqual(props["tag"], {"anyOf": [{"type": "string"}, {"type": "null"}]})
        self.assertEqual(props["unit"], {"enum": ["m", "km"]})
        self.assertEqual(props["weights"], {"type": "object", "additionalProperties": {"type": "number"}})

    def test_unsupported_annotations_are_refused_when_declared(self):
        box = Toolbox()
        with self.assertRaises(schema.UnsupportedType):
            @box.tool()
            def bad(x: int | str) -> str:
                return ""
        with self.assertRaises(TypeError):
            @box.tool()
            def unannotated(x) -> str:
                return ""

    def test_tool_names_are_checked_and_unique(self):
        box = Toolbox()
        with self.assertRaises(ValueError):
            box.tool(name="Bad")(lambda: "")

        @box.tool()
        def once() -> str:
            return ""

        with self.assertRaises(ValueError):
            box.tool(name="once")(lambda: "")


class Invoke(unittest.TestCase):
    def test_output_is_json_and_the_call_is_passed(self):
        out = toolbox().invoke(call("greet", name="ada", excitement=2))
        self.assertEqual(json.loads(out), {"text": "hello ada!!", "by": "c-7"})

    def test_dataclasses_and_enums_decode_and_encode(self):
        self.assertEqual(json.loads(toolbox().invoke(call("move", x=1))), {"x": 2, "y": 0})
        out = toolbox().invoke(call("shapes", points=[{"x": 1, "y": 2}], mode="slow", weights={"a": 1}))
        self.assertEqual(json.loads(out), ["slow", None, "m", {"a": 1.0}, [{"x": 1, "y": 2}]])

    def test_arguments_that_do_not_fit_name_the_field(self):
        cases = [
            (call("greet"), "missing field `name`"),
            (call("greet", name=7), "field `name`: expected a string, got an integer"),
            (call("greet", name="a", excitement=True), "field `excitement`: expected an integer, got a boolean"),
            (call("greet", name="a", extra=1), "unknown field `extra`"),
            (call("shapes", points=[{"x": "1"}]), "field `points`[0].x: expected an integer, got a string"),
            (call("shapes", points=[], mode="medium"), "expected one of ['fast', 'slow'], got 'medium'"),
            (Call(tool="greet", arguments="[1"), "not JSON"),
            (Call(tool="greet", arguments="[1]"), "expected an object, got an array"),
            (call("nope"), "no tool `nope` in this plugin (it has `greet`, `move`, `shapes`, `boom`)"),
        ]
        for c, expected in cases:
            with self.subTest(expected):
                with self.assertRaises(InvalidArguments) as e:
                    toolbox().invoke(c)
                self.assertIn(expected, e.exception.message)

    def test_raised_errors_keep_their_kind(self):
        with self.assertRaises(InvalidArguments):
            toolbox().invoke(call("greet", name=""))
        with self.assertRaises(Failed) as e:
            toolbox().invoke(call("boom"))
        self.assertTrue(e.exception.retryable)

    def test_preflight_checks_arguments_and_uses_the_preflight_function(self):
        self.assertEqual(toolbox().preflight(call("move", x=3)), Preview("move to 3,0"))
        default = toolbox().preflight(call("greet", name="ada"))
        self.assertEqual(default.summary, "call `greet` (read)")
        self.assertIn('"name": "ada"', default.detail)
        with self.assertRaises(InvalidArguments):
            toolbox().preflight(call("move"))


class Mounts(unittest.TestCase):
    def test_paths_stay_in_the_mount(self):
        self.assertEqual(in_mount("docs", "a/b.txt"), "/docs/a/b.txt")
        for bad in ["/etc/passwd", "../x", "a/../../x", "a/.."]:
            with self.subTest(bad), self.assertRaises(Denied):
                in_mount("docs", bad)
        with self.assertRaises(InvalidArguments):
            in_mount("docs", "")

    def test_file_errors_become_tool_errors(self):
        with tempfile.TemporaryDirectory() as d:
            try:
                open(os.path.join(d, "missing"))
            except OSError as e:
                self.assertIsInstance(file_error(e, "missing"), Failed)
            try:
                open(d)
            except OSError as e:
                self.assertIn("is a directory", file_error(e, "dir").message)
        self.assertIsInstance(file_error(PermissionError(1, "Operation not permitted"), "x"), Denied)

    def test_write_text_refuses_paths_out_of_the_mount_before_writing(self):
        for bad in ["../x.txt", "/etc/x.txt"]:
            with self.subTest(bad), self.assertRaises(Denied):
                write_text("notes", bad, "text")


class Http(unittest.TestCase):
    def test_only_absolute_http_urls_are_sent(self):
        for bad in ["ftp://example.com/", "example.com", "http:///path"]:
            with self.subTest(bad), self.assertRaises(http.HttpError) as e:
                http.fetch(bad)
            self.assertIn("not an absolute http or https URL", e.exception.message)

    def test_natively_there_is_no_network(self):
        with self.assertRaises(http.HttpError) as e:
            http.fetch("https://example.com/")
        self.assertIn("only inside the component", e.exception.message)
        self.assertEqual(e.exception.host, "example.com:443")
        self.assertFalse(e.exception.denied)


if __name__ == "__main__":
    unittest.main()
