"""{name}: a Warden tool plugin in Python.

Each tool is a typed function registered on the toolbox: its parameters'
annotations are the JSON Schema the model sees (`Annotated[T, "text"]` adds
a description), arguments that do not fit are refused before the function
runs, naming the field, and the return value (a dataclass here) is sent as
JSON. Raise `InvalidArguments`, `Denied` or `Failed` for a typed error.

Each example tool shows one thing the sandbox grants or limits: config,
the files of a mount (read-only and read-write), an environment variable,
outbound HTTP, CPU time and memory, and the size of an answer.
"""

import dataclasses
import os
from typing import Annotated

from warden_guest import (
    Effect, Failed, InvalidArguments, Toolbox, config, export_tools, http, read_text, write_text,
)

toolbox = Toolbox()


@dataclasses.dataclass
class Greeting:
    text: str


@dataclasses.dataclass
class LineCount:
    path: str
    lines: int


@dataclasses.dataclass
class Saved:
    path: str
    bytes: int


@dataclasses.dataclass
class Status:
    url: str
    status: int


@dataclasses.dataclass
class Variable:
    name: str
    visible: bool


@dataclasses.dataclass
class Primes:
    below: int
    primes: int


@dataclasses.dataclass
class Repeated:
    text: str


@toolbox.tool(effect=Effect.READ)
def greet(name: Annotated[str, "Who to greet"]) -> Greeting:
    """Greets someone, with the operator's config value `salutation` (default `hello`)."""
    if not name.strip():
        raise InvalidArguments("`name` is empty")
    salutation = config("salutation") or "hello"
    return Greeting(text=salutation + ", " + name)


@toolbox.tool(effect=Effect.READ)
def count_lines(path: Annotated[str, "A file, relative to the docs mount"]) -> LineCount:
    """Counts the lines of a text file in the docs mount."""
    # read_text refuses absolute paths and `..` as `Denied` before opening
    # anything, and turns a file error into a typed tool error.
    return LineCount(path=path, lines=len(read_text("docs", path).splitlines()))


@toolbox.tool(effect=Effect.WRITE)
def save_note(
    path: Annotated[str, "A file, relative to the notes mount"],
    text: Annotated[str, "What to write"],
) -> Saved:
    """Writes a note into the notes mount."""
    # On a mount the operator granted read-only, the sandbox refuses the
    # write; write_text reports that as `Denied`.
    write_text("notes", path, text)
    return Saved(path=path, bytes=len(text.encode()))


@toolbox.tool(effect=Effect.READ)
def fetch_status(url: Annotated[str, "An http or https URL"]) -> Status:
    """Requests a URL and returns its HTTP status."""
    try:
        response = http.fetch(url)
    except http.HttpError as e:
        # A host the operator did not grant is refused before anything is
        # sent (`e.denied`), and the call's receipt counts the denial.
        raise Failed(f"cannot fetch {url}: {e.message}") from None
    return Status(url=url, status=response.status)


@toolbox.tool(effect=Effect.READ)
def has_env(name: Annotated[str, "An environment variable's name"]) -> Variable:
    """Says whether an environment variable is visible (only those the operator grants are)."""
    return Variable(name=name, visible=name in os.environ)


@toolbox.tool(effect=Effect.READ)
def count_primes(below: Annotated[int, "Count the primes below this"]) -> Primes:
    """Counts the primes below a number, by trial division: CPU time to spend."""
    count = 0
    for n in range(2, below):
        d = 2
        while d * d <= n and n % d:
            d += 1
        if d * d > n:
            count += 1
    return Primes(below=below, primes=count)


@toolbox.tool(effect=Effect.READ)
def repeat(
    text: Annotated[str, "The text to repeat"],
    times: Annotated[int, "How many times"],
) -> Repeated:
    """Returns the text repeated: memory to take, and an answer to make big."""
    if times < 0:
        raise InvalidArguments("`times` must not be negative")
    return Repeated(text=text * times)


Tool = export_tools(toolbox)
