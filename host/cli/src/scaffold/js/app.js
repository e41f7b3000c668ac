// {name}: a Warden tool plugin in JavaScript.
//
// Each exported `tool(...)` is one tool, named after the export
// (`countLines` is `count_lines`). Its `args` are the JSON Schema the model
// sees and the check every call passes before `run` sees the arguments: a
// refusal names the field. `run` returns any JSON value (or a promise of
// one); throw `InvalidArguments`, `Denied` or `Failed` for a typed error.

import { Failed, InvalidArguments, config, integer, optional, readText, string, tool, writeText } from "warden-guest";

export const greet = tool({
  description: "Greets someone, with the operator's config value `salutation` (default `hello`)",
  args: { name: string("Who to greet") },
  run({ name }) {
    if (name.trim() === "") throw new InvalidArguments("`name` is empty");
    return { text: (config("salutation") ?? "hello") + ", " + name };
  },
});

export const countLines = tool({
  description: "Counts the lines of a text file in the docs mount",
  args: { path: string("A file, relative to the docs mount") },
  run({ path }) {
    // readText refuses absolute paths and `..` as `Denied` before opening
    // anything, and turns a file error into a typed tool error.
    const text = readText("docs", path);
    return { path, lines: text === "" ? 0 : text.replace(/\n$/, "").split("\n").length };
  },
});

export const saveNote = tool({
  description: "Writes a note into the notes mount",
  effect: "write",
  args: {
    path: string("A file, relative to the notes mount"),
    text: string("What to write"),
    copies: optional(integer("How many times to repeat the text"), 1),
  },
  run({ path, text, copies }) {
    if (copies < 1) throw new Failed("`copies` must be at least 1");
    writeText("notes", path, text.repeat(copies));
    return { path, bytes: text.length * copies };
  },
});

export const fetchStatus = tool({
  description: "Requests a URL and returns its HTTP status",
  args: { url: string("An http or https URL") },
  // `run` may be async: the call waits for the promise.
  async run({ url }) {
    let response;
    try {
      response = await fetch(url);
    } catch (e) {
      // The sandbox refuses a host the operator did not grant before
      // anything is sent; `fetch` reports that as a NetworkError (it cannot
      // tell it from others), and the call's receipt counts the denial.
      throw new Failed(`cannot fetch ${url}: ${e.message}`);
    }
    return { url, status: response.status };
  },
});
