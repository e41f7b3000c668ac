//! The read tools: `read_file` (a window of lines of a text file) and
//! `list_dir` (the entries of a directory).

use std::fs::{self, File};
use std::io::{BufRead, BufReader};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::FsError;
use crate::mount::Mount;

/// Lines `read_file` returns when `limit` is not given.
pub(crate) const DEFAULT_READ_LINES: u64 = 2_000;
/// Most bytes of content `read_file` returns, whatever `limit` says.
pub(crate) const MAX_READ_BYTES: usize = 256 * 1024;
/// Most entries `list_dir` returns.
pub(crate) const MAX_DIR_ENTRIES: usize = 1_000;

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// The file, relative to the workspace.
    pub path: String,
    /// First line to return, counting from 1. Default 1.
    #[schemars(range(min = 1))]
    pub offset: Option<u64>,
    /// Most lines to return. Default 2000; at most 256 KiB of text is returned whatever the limit.
    #[schemars(range(min = 1))]
    pub limit: Option<u64>,
}

/// Output of `read_file`.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ReadFileOutput {
    /// The file, relative to the workspace.
    pub path: String,
    /// The lines `start_line..=end_line`, with their line endings as in the
    /// file.
    pub content: String,
    /// The first line returned, counting from 1.
    pub start_line: u64,
    /// The last line returned (`start_line - 1` when none is).
    pub end_line: u64,
    /// Lines in the whole file.
    pub total_lines: u64,
    /// Bytes in the whole file.
    pub total_bytes: u64,
    /// Whether the file goes on after `end_line`.
    pub truncated: bool,
}

/// Reads lines `offset..offset + limit` of a UTF-8 text file, streaming so
/// that a large file costs memory only for the lines returned.
pub(crate) fn read_file(mount: &Mount, args: ReadFileArgs) -> Result<ReadFileOutput, FsError> {
    let target = mount.resolve(&args.path)?;
    let path = target.shown;
    let start = args.offset.unwrap_or(1);
    let limit = args.limit.unwrap_or(DEFAULT_READ_LINES);
    if start == 0 {
        return Err(FsError::OutOfRange {
            name: "offset",
            value: 0,
            expected: "expected a line number counting from 1",
        });
    }
    if limit == 0 {
        return Err(FsError::OutOfRange {
            name: "limit",
            value: 0,
            expected: "expected at least 1",
        });
    }
    let meta = fs::metadata(&target.full).map_err(|e| FsError::io("read", &path, e))?;
    if meta.is_dir() {
        return Err(FsError::IsADirectory { path });
    }
    if !meta.is_file() {
        return Err(FsError::NotAFile { path });
    }
    let file = File::open(&target.full).map_err(|e| FsError::io("read", &path, e))?;
    let mut reader = BufReader::with_capacity(64 * 1024, file);

    let window_end = start.saturating_add(limit); // first line not wanted
    let mut content: Vec<u8> = Vec::new();
    let mut total_lines = 0u64;
    let mut total_bytes = 0u64;
    let mut at_line_start = true;
    let mut end_line = start - 1;
    let mut full = false; // the byte cap was reached
    let mut truncated = false;
    loop {
        let buf = reader
            .fill_buf()
            .map_err(|e| FsError::io("read", &path, e))?;
        if buf.is_empty() {
            break;
        }
        let mut rest = buf;
        while !rest.is_empty() {
            if at_line_start {
                total_lines += 1;
                at_line_start = false;
            }
            let line = total_lines;
            let (piece, ends_line) = match rest.iter().position(|&b| b == b'\n') {
                Some(at) => (&rest[..=at], true),
                None => (rest, false),
            };
            if line >= window_end || (full && line >= start) {
                truncated = true;
            } else if line >= start {
                let room = MAX_READ_BYTES - content.len();
                if piece.len() <= room {
                    content.extend_from_slice(piece);
                    end_line = line;
                } else {
                    if room > 0 {
                        content.extend_from_slice(&piece[..room]);
                        end_line = line;
                    }
                    full = true;
                    truncated = true;
                }
            }
            rest = &rest[piece.len()..];
            if ends_line {
                at_line_start = true;
            }
        }
        let consumed = buf.len();
        total_bytes += consumed as u64;
        reader.consume(consumed);
    }
    if start > total_lines.max(1) {
        return Err(FsError::OffsetPastEnd {
            path,
            offset: start,
            total_lines,
        });
    }
    let content = match String::from_utf8(content) {
        Ok(text) => text,
        Err(err) => {
            let utf8 = err.utf8_error();
            let bytes = err.into_bytes();
            // A cut at the byte cap may split a character: drop the partial
            // character. Anything else is a binary or non-UTF-8 file.
            if full && utf8.error_len().is_none() {
                String::from_utf8(bytes[..utf8.valid_up_to()].to_vec()).expect("valid up to here")
            } else {
                let newlines = bytes[..utf8.valid_up_to()]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count();
                return Err(FsError::NotUtf8 {
                    path,
                    line: start + newlines as u64,
                });
            }
        }
    };
    Ok(ReadFileOutput {
        path,
        content,
        start_line: start,
        end_line,
        total_lines,
        total_bytes,
        truncated,
    })
}

/// Arguments of `list_dir`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirArgs {
    /// The directory, relative to the workspace. Default: the workspace itself.
    #[serde(default)]
    pub path: Option<String>,
}

/// What a directory entry is. Symlinks are reported, not followed.
#[derive(Debug, Serialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// Anything else (socket, device, ...).
    Other,
}

/// One entry of `list_dir`.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's file name.
    pub name: String,
    /// What it is.
    pub kind: EntryKind,
    /// Size in bytes, for files only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// Output of `list_dir`.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ListDirOutput {
    /// The directory, relative to the workspace.
    pub path: String,
    /// Its entries, sorted by name (at most 1000).
    pub entries: Vec<DirEntry>,
    /// Whether entries were left out because there are more than 1000.
    pub truncated: bool,
}

/// Lists a directory's entries, sorted by name.
pub(crate) fn list_dir(mount: &Mount, args: ListDirArgs) -> Result<ListDirOutput, FsError> {
    let target = mount.resolve(args.path.as_deref().unwrap_or("."))?;
    let path = target.shown;
    let meta = fs::metadata(&target.full).map_err(|e| FsError::io("list", &path, e))?;
    if !meta.is_dir() {
        return Err(FsError::NotADirectory { path });
    }
    let mut entries = Vec::new();
    for entry in fs::read_dir(&target.full).map_err(|e| FsError::io("list", &path, e))? {
        let entry = entry.map_err(|e| FsError::io("list", &path, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let file_type = entry
            .file_type()
            .map_err(|e| FsError::io("inspect", &join(&path, &name), e))?;
        let (kind, size) = if file_type.is_symlink() {
            (EntryKind::Symlink, None)
        } else if file_type.is_dir() {
            (EntryKind::Dir, None)
        } else if file_type.is_file() {
            let meta = entry
                .metadata()
                .map_err(|e| FsError::io("inspect", &join(&path, &name), e))?;
            (EntryKind::File, Some(meta.len()))
        } else {
            (EntryKind::Other, None)
        };
        entries.push(DirEntry { name, kind, size });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let truncated = entries.len() > MAX_DIR_ENTRIES;
    entries.truncate(MAX_DIR_ENTRIES);
    Ok(ListDirOutput {
        path,
        entries,
        truncated,
    })
}

/// `dir/name`, or `name` when `dir` is the mount.
pub(crate) fn join(dir: &str, name: &str) -> String {
    if dir == "." {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tempfile::TempDir;

    fn mount_with(files: &[(&str, &[u8])]) -> (TempDir, Mount) {
        let dir = tempfile::tempdir().unwrap();
        for (path, content) in files {
            let full = dir.path().join(path);
            fs::create_dir_all(full.parent().unwrap()).unwrap();
            fs::write(full, content).unwrap();
        }
        let mount = Mount::new(dir.path());
        (dir, mount)
    }

    fn read(mount: &Mount, path: &str, offset: Option<u64>, limit: Option<u64>) -> ReadFileOutput {
        read_file(
            mount,
            ReadFileArgs {
                path: path.into(),
                offset,
                limit,
            },
        )
        .unwrap()
    }

    fn read_err(mount: &Mount, path: &str, offset: Option<u64>, limit: Option<u64>) -> String {
        read_file(
            mount,
            ReadFileArgs {
                path: path.into(),
                offset,
                limit,
            },
        )
        .unwrap_err()
        .to_string()
    }

    #[test]
    fn reads_line_windows() {
        let (_dir, mount) = mount_with(&[("a.txt", b"one\ntwo\nthree\nfour")]);
        // (offset, limit) -> (content, start, end, truncated)
        let cases = [
            (None, None, "one\ntwo\nthree\nfour", 1, 4, false),
            (Some(2), Some(2), "two\nthree\n", 2, 3, true),
            (Some(4), None, "four", 4, 4, false),
            (Some(1), Some(1), "one\n", 1, 1, true),
            (Some(3), Some(100), "three\nfour", 3, 4, false),
        ];
        for (offset, limit, content, start, end, truncated) in cases {
            let out = read(&mount, "a.txt", offset, limit);
            assert_eq!(
                (
                    out.content.as_str(),
                    out.start_line,
                    out.end_line,
                    out.truncated
                ),
                (content, start, end, truncated),
                "offset {offset:?} limit {limit:?}"
            );
            assert_eq!((out.total_lines, out.total_bytes), (4, 18));
            assert_eq!(out.path, "a.txt");
        }
    }

    #[test]
    fn counts_lines_like_an_editor() {
        let (_dir, mount) = mount_with(&[
            ("empty", b""),
            ("nl", b"a\n"),
            ("two", b"a\r\nb\r\n"),
            ("blank", b"\n\n"),
        ]);
        let cases = [
            ("empty", 0, 0),
            ("nl", 1, 1),
            ("two", 2, 2),
            ("blank", 2, 2),
        ];
        for (path, total, end) in cases {
            let out = read(&mount, path, None, None);
            assert_eq!((out.total_lines, out.end_line), (total, end), "{path}");
        }
        assert_eq!(read(&mount, "two", None, None).content, "a\r\nb\r\n");
    }

    #[test]
    fn caps_the_bytes_returned() {
        let line = "x".repeat(1023) + "\n";
        let big = line.repeat(300); // 300 KiB
        let (_dir, mount) = mount_with(&[("big.txt", big.as_bytes())]);
        let out = read(&mount, "big.txt", None, None);
        assert_eq!(out.content.len(), MAX_READ_BYTES);
        assert_eq!(
            (out.end_line, out.total_lines, out.truncated),
            (256, 300, true)
        );
        assert_eq!(out.total_bytes, 300 * 1024);
    }

    #[test]
    fn a_cut_inside_a_character_drops_the_partial_character() {
        let text = "é".repeat(MAX_READ_BYTES); // 2 bytes each, one line
        let (_dir, mount) = mount_with(&[("wide.txt", text.as_bytes())]);
        let out = read(&mount, "wide.txt", Some(1), None);
        assert_eq!(out.content.len(), MAX_READ_BYTES);
        assert!(out.truncated);
        let (_dir, mount) = mount_with(&[("odd.txt", format!("a{text}").as_bytes())]);
        let out = read(&mount, "odd.txt", Some(1), None);
        assert_eq!(out.content.len(), MAX_READ_BYTES - 1);
        assert_eq!((out.end_line, out.truncated), (1, true));
    }

    #[test]
    fn read_errors_name_the_path() {
        let (_dir, mount) = mount_with(&[
            ("a.txt", b"one\n"),
            ("bin", b"ok\n\xff\xfe\n"),
            ("d/x", b""),
        ]);
        let cases = [
            (
                "missing.txt",
                None,
                None,
                "cannot read `missing.txt`: not found",
            ),
            ("d", None, None, "`d` is a directory, not a file"),
            ("bin", None, None, "`bin` is not utf-8 text (line 2)"),
            (
                "a.txt",
                Some(3),
                None,
                "offset 3 is past the end of `a.txt`, which has 1 lines",
            ),
            (
                "a.txt",
                Some(0),
                None,
                "`offset` is 0, expected a line number counting from 1",
            ),
            ("a.txt", None, Some(0), "`limit` is 0, expected at least 1"),
            ("../a.txt", None, None, "path `../a.txt` contains `..`"),
            ("/a.txt", None, None, "path `/a.txt` is absolute"),
        ];
        for (path, offset, limit, expected) in cases {
            let err = read_err(&mount, path, offset, limit);
            assert!(err.starts_with(expected), "{path}: {err}");
        }
        // The binary line is outside the window: the window still reads.
        assert_eq!(read(&mount, "bin", Some(1), Some(1)).content, "ok\n");
    }

    #[test]
    fn lists_entries_sorted_with_kinds_and_sizes() {
        let (dir, mount) = mount_with(&[("b.txt", b"hello"), ("a/inner.txt", b"x")]);
        #[cfg(unix)]
        std::os::unix::fs::symlink("b.txt", dir.path().join("link")).unwrap();
        let out = list_dir(&mount, ListDirArgs { path: None }).unwrap();
        assert_eq!(out.path, ".");
        let mut expected = vec![
            DirEntry {
                name: "a".into(),
                kind: EntryKind::Dir,
                size: None,
            },
            DirEntry {
                name: "b.txt".into(),
                kind: EntryKind::File,
                size: Some(5),
            },
        ];
        if cfg!(unix) {
            expected.push(DirEntry {
                name: "link".into(),
                kind: EntryKind::Symlink,
                size: None,
            });
        }
        assert_eq!(out.entries, expected);
        assert!(!out.truncated);
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(
            json["entries"][0],
            serde_json::json!({"name": "a", "kind": "dir"})
        );
        let inner = list_dir(
            &mount,
            ListDirArgs {
                path: Some("./a".into()),
            },
        )
        .unwrap();
        assert_eq!((inner.path.as_str(), inner.entries.len()), ("a", 1));
    }

    #[test]
    fn list_dir_caps_entries() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..MAX_DIR_ENTRIES + 3 {
            fs::write(dir.path().join(format!("f{i:05}")), "").unwrap();
        }
        let out = list_dir(&Mount::new(dir.path()), ListDirArgs { path: None }).unwrap();
        assert_eq!(out.entries.len(), MAX_DIR_ENTRIES);
        assert!(out.truncated);
        assert_eq!(out.entries[0].name, "f00000");
    }

    #[test]
    fn list_errors_name_the_path() {
        let (_dir, mount) = mount_with(&[("f.txt", b"")]);
        let err = |p: &str| {
            list_dir(
                &mount,
                ListDirArgs {
                    path: Some(p.into()),
                },
            )
            .unwrap_err()
            .to_string()
        };
        assert_eq!(err("f.txt"), "`f.txt` is not a directory");
        assert_eq!(err("nope"), "cannot list `nope`: not found");
        assert!(err("a/../..").starts_with("path `a/../..` contains `..`"));
    }
}
