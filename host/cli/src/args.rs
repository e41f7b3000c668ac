//! Arguments that are not valid UTF-8. Text arguments (ids, inputs,
//! grants) are refused naming the argument, instead of clap's anonymous
//! "invalid UTF-8" line; a path that a run records as text (the agent file)
//! is refused before anything is recorded, so no log holds a mangled path
//! that a later verb could not find. Paths only read (validate, inspect)
//! are used as the operating system gives them.

use std::ffi::{OsStr, OsString};
use std::path::Path;

use clap::CommandFactory as _;
use serde_json::json;

use super::Cli;
use super::errors::CliError;

/// `text` with each byte that is not part of valid UTF-8 shown as `\xNN`.
pub(crate) fn escaped(text: &OsStr) -> String {
    warden::errors::escaped(text)
}

/// The first argument in `args` (the program name first) that is not valid
/// UTF-8, as clap names it (`--run-id`, `<INPUT>`), with its text escaped;
/// `None` when every argument is UTF-8.
pub(crate) fn first_non_utf8(args: &[OsString]) -> Option<(String, String)> {
    let index = args.iter().position(|a| a.to_str().is_none())?;
    let shown = escaped(&args[index]);
    // Parse again with the bad argument replaced by a marker, and see which
    // argument received the marker.
    const MARKER: &str = "\u{1}warden-not-utf8\u{1}";
    let replaced: Vec<OsString> = args
        .iter()
        .enumerate()
        .map(|(i, a)| match (i == index, a.to_str()) {
            (true, _) => OsString::from(MARKER),
            (false, Some(_)) => a.clone(),
            (false, None) => OsString::from("x"),
        })
        .collect();
    let command = Cli::command();
    let name = command
        .clone()
        .try_get_matches_from(&replaced)
        .ok()
        .and_then(|m| holder(&command, &m, MARKER))
        .unwrap_or_else(|| format!("argument {index}"));
    Some((name, shown))
}

/// The argument of `command` (or of its subcommands) whose value in
/// `matches` is `marker`, named as its usage shows it.
fn holder(command: &clap::Command, matches: &clap::ArgMatches, marker: &str) -> Option<String> {
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let Ok(Some(mut values)) = matches.try_get_raw(id) else {
            continue;
        };
        if values.any(|v| v == OsStr::new(marker)) {
            return Some(match arg.get_long() {
                Some(long) => format!("--{long}"),
                None => format!(
                    "<{}>",
                    arg.get_value_names()
                        .and_then(|n| n.first())
                        .map_or_else(|| id.to_uppercase(), |n| n.to_string())
                ),
            });
        }
    }
    let (name, sub) = matches.subcommand()?;
    holder(command.find_subcommand(name)?, sub, marker)
}

/// The refusal of a non-UTF-8 argument, for the one-line report.
pub(crate) fn refusal(name: &str, shown: &str) -> CliError {
    CliError::new(
        "usage",
        format!("argument {name} is not valid UTF-8: `{shown}` (Warden takes text here)"),
    )
    .with_details(json!({ "argument": name, "value": shown }))
}

/// `path` as text, for a path that is kept as text (a run's agent file, a
/// backup's name given to SQLite); refused when it is not valid UTF-8,
/// since the text could only hold it mangled. `why` says who keeps it.
pub(crate) fn text_path<'p>(what: &str, path: &'p Path, why: &str) -> anyhow::Result<&'p str> {
    path.to_str().ok_or_else(|| {
        let shown = escaped(path.as_os_str());
        CliError::new(
            "path_not_utf8",
            format!(
                "{what} `{shown}`: the path is not valid UTF-8, and {why} keeps it as text; \
                 rename it (or link it) to a UTF-8 name"
            ),
        )
        .with_details(json!({ "path": shown }))
        .into()
    })
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt as _;

    fn args(list: &[&[u8]]) -> Vec<OsString> {
        list.iter()
            .map(|a| OsString::from_vec(a.to_vec()))
            .collect()
    }

    #[test]
    fn names_the_argument_holding_invalid_utf8() {
        let cases: [(&[&[u8]], &str); 4] = [
            (&[b"warden", b"run", b"a.toml", b"hi\xff"], "<INPUT>"),
            (
                &[b"warden", b"run", b"a.toml", b"--run-id", b"r\xfe"],
                "--run-id",
            ),
            (&[b"warden", b"runs", b"show", b"\xff"], "<RUN>"),
            (
                &[b"warden", b"--store", b"s\xff.db", b"runs", b"list"],
                "--store",
            ),
        ];
        for (list, name) in cases {
            let (got, _) = first_non_utf8(&args(list)).unwrap();
            assert_eq!(got, name, "{list:?}");
        }
        assert_eq!(first_non_utf8(&args(&[b"warden", b"runs", b"list"])), None);
    }

    #[test]
    fn escapes_only_the_invalid_bytes() {
        assert_eq!(
            escaped(&OsString::from_vec(b"na\xffme.toml".to_vec())),
            "na\\xFFme.toml"
        );
    }
}
