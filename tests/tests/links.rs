//! Every reference in the repository's Markdown resolves: a relative link
//! names a file or directory that exists, a `#heading` names a heading of
//! the file it points into, a repository path quoted in backticks
//! (`host/warden/src/lib.rs`, `tests/tests/all/`) exists, and a test cited by its
//! path (`all::kill::killing_the_binary_at_random_moments_…`) names a
//! function some `.rs` file defines. External links are not fetched. Its
//! own binary, apart from `all`, because it links none of the host.

use std::collections::HashSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// Quoted paths that are not the repository's, with why.
const NOT_REPOSITORY_PATHS: &[(&str, &str)] = &[
    // The file `warden plugin new` writes into the new plugin's crate.
    ("docs/plugins.md", "tests/sandbox.rs"),
];

/// Extensions of the quoted paths that are checked; others (`.jsonl`,
/// `.db`) name files a run writes, which a fresh clone does not have.
const CHECKED_EXTENSIONS: &[&str] = &["rs", "toml", "md", "wit", "wat", "sh", "lock"];

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the repository")
        .to_path_buf()
}

#[test]
fn every_link_anchor_path_and_cited_test_in_the_markdown_resolves() {
    let root = repository();
    let files = markdown_files(&root);
    for expected in ["README.md", "ARCHITECTURE.md", "docs/README.md"] {
        assert!(
            files.iter().any(|f| f == &root.join(expected)),
            "{expected} was not found among {} Markdown files",
            files.len()
        );
    }
    let repo = Repo::read(&root);
    let problems: Vec<String> = files.iter().flat_map(|f| repo.check(f)).collect();
    assert!(
        problems.is_empty(),
        "{} broken reference(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The checker itself: each kind of broken reference is reported, on its
/// line, and the sound ones next to it are not.
#[test]
fn the_checker_reports_each_broken_link_anchor_path_and_test() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    fs::create_dir_all(root.join("docs/dev")).unwrap();
    fs::create_dir_all(root.join("host/src")).unwrap();
    fs::write(
        root.join("host/src/lib.rs"),
        "#[test]\nfn a_lease_owns_its_store() {}\nasync fn racing_claims_grant_one() {}\n",
    )
    .unwrap();
    fs::write(
        root.join("docs/dev/target.md"),
        "# Target\n\n## Configuration: `warden.toml`\n\n## Twice\n\n## Twice\n\n```sh\n# not a heading\n```\n",
    )
    .unwrap();
    let text = "\
# Index

- [fine](dev/target.md) and [fine too](dev/target.md#configuration-wardentoml)
- [wrapped
  text](dev/target.md#twice-1) and [here](#index) and [web](https://example.com/x.md)
- [missing file](dev/nothing.md)
- [missing anchor](dev/target.md#no-such-heading)
- [missing here](#nowhere) and [not a heading](dev/target.md#not-a-heading)
- `host/src/lib.rs` exists, `host/src/gone.rs` does not, `host/src/lib.rs::item` is fine
- `[not a link](nowhere.md)` is code, and so is `target/debug/warden`
- `all::isolation::a_lease_owns_its_store`, `…::racing_claims_grant_one`, `store::conformance::*`
- `all::isolation::a_lease_owns_no_store` and `store::racing_{claims,leases}_grant_{one,two}`

```md
[in a fence](fenced.md) `host/src/fenced.rs`
```
[escaping](../../outside.md) and `plugins::tool`, `Runtime::start_in_session`
";
    fs::write(root.join("docs/README.md"), text).unwrap();
    let problems = Repo::read(root).check(&root.join("docs/README.md"));
    let expected = [
        "docs/README.md:6: link `dev/nothing.md`: no such file",
        "docs/README.md:7: link `dev/target.md#no-such-heading`: no heading with anchor `no-such-heading` in docs/dev/target.md",
        "docs/README.md:8: link `#nowhere`: no heading with anchor `nowhere` in docs/README.md",
        "docs/README.md:8: link `dev/target.md#not-a-heading`: no heading with anchor `not-a-heading` in docs/dev/target.md",
        "docs/README.md:9: path `host/src/gone.rs`: no such file in the repository",
        "docs/README.md:12: test `a_lease_owns_no_store` (in `all::isolation::a_lease_owns_no_store`): no such fn in the repository",
        "docs/README.md:12: test `racing_claims_grant_two` (in `store::racing_{claims,leases}_grant_{one,two}`): no such fn in the repository",
        "docs/README.md:12: test `racing_leases_grant_one` (in `store::racing_{claims,leases}_grant_{one,two}`): no such fn in the repository",
        "docs/README.md:12: test `racing_leases_grant_two` (in `store::racing_{claims,leases}_grant_{one,two}`): no such fn in the repository",
        "docs/README.md:17: link `../../outside.md`: leads out of the repository",
    ];
    assert_eq!(problems, expected);
}

#[test]
fn anchors_are_githubs() {
    let cases = [
        ("Quick start", "quick-start"),
        ("Configuration: `warden.toml`", "configuration-wardentoml"),
        (
            "For scripts: `--json` and error codes",
            "for-scripts---json-and-error-codes",
        ),
        (
            "`sandbox/` — wasmtime, components, leases",
            "sandbox--wasmtime-components-leases",
        ),
        ("5. Policies", "5-policies"),
        ("What `resume` does", "what-resume-does"),
        ("Bird's-eye view", "birds-eye-view"),
        ("The [guide](docs/README.md), **bold**", "the-guide-bold"),
        ("max_steps", "max_steps"),
    ];
    for (heading, anchor) in cases {
        assert_eq!(slug(heading), anchor, "{heading}");
    }
}

/// Every `*.md` in the repository but build output and hidden directories.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    files_ending(root, ".md")
}

/// Every file whose name ends with `suffix`, but in build output and
/// hidden directories.
fn files_ending(root: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    dirs.push(path);
                }
            } else if name.ends_with(suffix) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// What a Markdown file may refer to in the repository.
struct Repo {
    root: PathBuf,
    /// The top-level entries a quoted path may start with.
    top: HashSet<String>,
    /// Every function name some `.rs` file defines.
    fns: HashSet<String>,
}

impl Repo {
    fn read(root: &Path) -> Repo {
        let mut fns = HashSet::new();
        for file in files_ending(root, ".rs") {
            let text = fs::read_to_string(file).unwrap_or_default();
            for (at, _) in text.match_indices("fn ") {
                if at > 0 && is_ident(text.as_bytes()[at - 1]) {
                    continue;
                }
                let name: String = text[at + 3..]
                    .bytes()
                    .take_while(|b| is_ident(*b))
                    .map(char::from)
                    .collect();
                fns.insert(name);
            }
        }
        Repo {
            root: root.to_path_buf(),
            top: top_level_entries(root),
            fns,
        }
    }

    /// The problems of one Markdown file, as `file:line: what`.
    fn check(&self, file: &Path) -> Vec<String> {
        let root = &self.root;
        let text = fs::read_to_string(file).unwrap();
        let shown = relative(root, file);
        let prose = without_fences(&text);
        let (links, spans) = scan(&prose);
        let line_of = |offset: usize| prose[..offset].matches('\n').count() + 1;
        let mut problems = Vec::new();
        for (offset, target) in links {
            if let Err(why) = check_link(root, file, &text, &target) {
                let line = line_of(offset);
                problems.push((line, format!("{shown}:{line}: link `{target}`: {why}")));
            }
        }
        for (offset, span) in spans {
            if let Some(path) = quoted_path(&span, &self.top)
                && !NOT_REPOSITORY_PATHS.contains(&(shown.as_str(), path))
                && !root.join(path).exists()
            {
                let line = line_of(offset);
                problems.push((
                    line,
                    format!("{shown}:{line}: path `{path}`: no such file in the repository"),
                ));
            }
            for name in cited_tests(&span) {
                if !self.fns.contains(&name) {
                    let line = line_of(offset);
                    problems.push((
                        line,
                        format!(
                            "{shown}:{line}: test `{name}` (in `{span}`): no such fn in the repository"
                        ),
                    ));
                }
            }
        }
        problems.sort_by_key(|(line, _)| *line);
        problems.into_iter().map(|(_, problem)| problem).collect()
    }
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The test names a code span cites: a lowercase `::` path
/// (`all::kill::…`, `…::name`) whose last segment is a sentence of at least
/// three words (so `plugins::tool` is a module, not a test), with each
/// `{a,b}` expanded; none for a glob (`engine::tests::*`).
fn cited_tests(span: &str) -> Vec<String> {
    let is_path = span.contains("::")
        && span
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_:…*{},".contains(c));
    let last = span.rsplit("::").next().unwrap_or_default();
    if !is_path || last.contains('*') || last.matches('_').count() < 2 {
        return Vec::new();
    }
    expand(last)
}

/// `name` with each `{a,b}` group expanded, left to right.
fn expand(name: &str) -> Vec<String> {
    match (name.find('{'), name.find('}')) {
        (Some(open), Some(close)) if open < close => name[open + 1..close]
            .split(',')
            .flat_map(|alt| expand(&format!("{}{alt}{}", &name[..open], &name[close + 1..])))
            .collect(),
        _ => vec![name.to_owned()],
    }
}

fn check_link(root: &Path, file: &Path, text: &str, target: &str) -> Result<(), String> {
    let target = target.trim_start_matches('<').trim_end_matches('>');
    if target.contains("://") || target.starts_with("mailto:") {
        return Ok(());
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let resolved = if path.is_empty() {
        file.to_path_buf()
    } else {
        normalize(&file.parent().unwrap().join(path))
    };
    if !resolved.starts_with(root) {
        return Err("leads out of the repository".into());
    }
    if !resolved.exists() {
        return Err("no such file".into());
    }
    let Some(anchor) = anchor else {
        return Ok(());
    };
    let target_text = if path.is_empty() {
        text.to_owned()
    } else if resolved.extension().is_some_and(|e| e == "md") {
        fs::read_to_string(&resolved).unwrap()
    } else {
        return Err("an anchor into a file that is not Markdown".into());
    };
    if anchors(&target_text).contains(anchor) {
        Ok(())
    } else {
        Err(format!(
            "no heading with anchor `{anchor}` in {}",
            relative(root, &resolved)
        ))
    }
}

/// `path` with `.` and `..` taken out, without touching the filesystem.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

/// The text with fenced code blocks blanked out, line count kept.
fn without_fences(text: &str) -> String {
    let mut fence: Option<&str> = None;
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => {
                out.push_str(line);
                continue;
            }
            _ => {}
        }
        if line.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Pieces of prose, each with its byte offset.
type Found = Vec<(usize, String)>;

/// The link targets (`[text](target)`, `[label]: target`) and the code
/// spans of prose, each with its byte offset. Links inside code spans are
/// code, not links.
fn scan(prose: &str) -> (Found, Found) {
    let bytes = prose.as_bytes();
    let mut links = Vec::new();
    let mut spans = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'`' {
            let run = bytes[at..].iter().take_while(|b| **b == b'`').count();
            let fence = &prose[at..at + run];
            let start = at + run;
            match find_closing(prose, start, fence) {
                Some(end) => {
                    spans.push((at, prose[start..end].trim().to_owned()));
                    at = end + run;
                }
                None => at = start,
            }
            continue;
        }
        if prose[at..].starts_with("](") {
            let start = at + 2;
            let end = prose[start..]
                .find([')', ' ', '\n'])
                .map_or(prose.len(), |e| start + e);
            links.push((at, prose[start..end].to_owned()));
            at = end;
            continue;
        }
        if bytes[at] == b'[' && (at == 0 || bytes[at - 1] == b'\n') {
            let line = &prose[at..prose[at..].find('\n').map_or(prose.len(), |e| at + e)];
            if let Some((label, rest)) = line.split_once("]:")
                && !label.contains('`')
                && let Some(target) = rest.split_whitespace().next()
            {
                links.push((at, target.to_owned()));
            }
        }
        at += prose[at..].chars().next().map_or(1, char::len_utf8);
    }
    (links, spans)
}

/// Where the code span opened by `fence` (a run of backticks) closes: the
/// next run of exactly as many backticks.
fn find_closing(prose: &str, from: usize, fence: &str) -> Option<usize> {
    let mut at = from;
    while let Some(found) = prose[at..].find(fence) {
        let start = at + found;
        let run = prose[start..].bytes().take_while(|b| *b == b'`').count();
        if run == fence.len() {
            return Some(start);
        }
        at = start + run;
    }
    None
}

/// The repository's top-level directories and files a quoted path may start
/// with (hidden ones and build output excluded, `.ci` kept).
fn top_level_entries(root: &Path) -> HashSet<String> {
    fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| (!name.starts_with('.') || name == ".ci") && name != "target")
        .collect()
}

/// The repository path a code span quotes, if it quotes one: a plain path
/// with a `/`, starting at one of the repository's top-level entries, with
/// no placeholder in it; a trailing `::item` or `:line` is dropped.
fn quoted_path<'a>(span: &'a str, top: &HashSet<String>) -> Option<&'a str> {
    let path = span.split("::").next()?;
    let path = path.split(':').next()?;
    if !path.contains('/')
        || !path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
    {
        return None;
    }
    let first = path.split('/').next()?;
    if !top.contains(first) {
        return None;
    }
    let name = path.trim_end_matches('/').rsplit('/').next()?;
    match name.rsplit_once('.') {
        Some((_, ext)) if !CHECKED_EXTENSIONS.contains(&ext) => None,
        _ => Some(path),
    }
}

/// The anchors GitHub gives a document's headings (`#` to `######`,
/// outside fences), a repeated one suffixed `-1`, `-2`, ….
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in without_fences(text).lines() {
        let hashes = line.bytes().take_while(|b| *b == b'#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#').trim());
        let mut anchor = base.clone();
        let mut n = 0;
        while !seen.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    seen
}

/// GitHub's anchor for a heading: its text as rendered (links by their
/// text, no markup), lowercased, punctuation dropped but `-` and `_`,
/// each space a `-`.
fn slug(heading: &str) -> String {
    let mut rendered = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](") else {
            break;
        };
        let Some(end) = rest[open + close..].find(')') else {
            break;
        };
        rendered.push_str(&rest[..open]);
        rendered.push_str(&rest[open + 1..open + close]);
        rest = &rest[open + close + end + 1..];
    }
    rendered.push_str(rest);
    rendered
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .flat_map(char::to_lowercase)
        .collect()
}
