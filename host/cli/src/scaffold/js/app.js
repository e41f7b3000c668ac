// {name}: a Warden tool plugin in JavaScript.
//
// Each exported `tool(...)` is one tool, named after the export
// (`countLines` is `count_lines`). Its `args` are the JSON Schema the model
// sees and the check every call passes before `run` sees the arguments: a
// refusal names the field. `run` returns any JSON value (or a promise of
// one); throw `InvalidArguments`, `Denied` or `Failed` for a typed error.
//
// Each example tool shows one thing the sandbox grants or limits: config,
// the files of a mount (read-only and read-write), an environment variable,
// outbound HTTP, CPU time and memory, and the size of an answer.

import { Failed, InvalidArguments, config, env, integer, readText, string, tool, writeText } from "warden-guest";

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
  },
  run({ path, text }) {
    // On a mount the operator granted read-only, the sandbox refuses the
    // write; writeText reports that as `Denied`.
    writeText("notes", path, text);
    return { path, bytes: new TextEncoder().encode(text).length };
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

export const hasEnv = tool({
  description: "Says whether an environment variable is visible (only those the operator grants are)",
  args: { name: string("An environment variable's name") },
  run({ name }) {
    return { name, visible: env(name) !== undefined };
  },
});

export const countPrimes = tool({
  description: "Counts the primes below a number, by trial division: CPU time to spend",
  args: { below: integer("Count the primes below this") },
  run({ below }) {
    let count = 0;
    for (let n = 2; n < below; n++) {
      let d = 2;
      while (d * d <= n && n % d !== 0) d++;
      if (d * d > n) count++;
    }
    return { below, primes: count };
  },
});

export const repeat = tool({
  description: "Returns the text repeated: memory to take, and an answer to make big",
  args: {
    text: string("The text to repeat"),
    times: integer("How many times"),
  },
  run({ text, times }) {
    if (times < 0) throw new InvalidArguments("`times` must not be negative");
    return { text: text.repeat(times) };
  },
});
