"""py-wordcount: a Warden tool plugin in Python.

`count_words` reads a text file from the `docs` mount and returns typed
counts; `peek` opens whatever absolute path it is given, with no check of
its own, to show what the sandbox itself answers outside the mount.
"""

import collections
import dataclasses
import re
from typing import Annotated

from warden_guest import Failed, Toolbox, export_tools, file_error, read_text

toolbox = Toolbox()


@dataclasses.dataclass
class Frequency:
    word: str
    count: int


@dataclasses.dataclass
class WordCount:
    path: str
    lines: int
    words: int
    top: list[Frequency]


@toolbox.tool()
def count_words(
    path: Annotated[str, "The file, relative to the docs mount"],
    top: Annotated[int, "How many of the most frequent words to return"] = 3,
) -> WordCount:
    """Counts the lines and words of a text file in the docs mount."""
    if top < 0:
        raise Failed("`top` must not be negative")
    text = read_text("docs", path)
    words = re.findall(r"[a-z0-9']+", text.lower())
    # Most frequent first, ties alphabetical. (Counter.most_common would
    # import heapq lazily, at call time: componentize-py bundles only the
    # modules imported while the app is built, so it would not be there.)
    counts = collections.Counter(words)
    common = sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))[:top]
    return WordCount(
        path=path,
        lines=len(text.splitlines()),
        words=len(words),
        top=[Frequency(w, c) for w, c in common],
    )


@toolbox.tool()
def peek(path: Annotated[str, "An absolute path, as the guest sees it"]) -> str:
    """Returns the first line of any file, trusting the sandbox to refuse."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().rstrip("\n")
    except OSError as e:
        raise file_error(e, path) from None


Tool = export_tools(toolbox)
