//! The write tools, `write_file` and `edit_file`, and their previews. A
//! preview runs the same checks as the tool and diffs the file's current
//! text against what the tool would write, touching nothing. Both tools
//! replace a file with the SDK's `fs::write_atomic`, so a call cut short
//! leaves the old content or the new, never a mix, and the file keeps its
//! permissions.

use std::fs;
use std::io;
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use warden_guest::Preview;

use crate::diff;
use crate::error::FsError;
use crate::mount::{Mount, Resolved};

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// The file, relative to the workspace. Created if missing, replaced if present.
    pub path: String,
    /// The complete new content.
    pub content: String,
    /// Create missing parent directories. Default false.
    #[serde(default)]
    pub create_dirs: bool,
}

/// Output of `write_file`.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct WriteFileOutput {
    /// The file, relative to the workspace.
    pub path: String,
    /// Bytes written.
    pub bytes_written: u64,
    /// Whether the file is new.
    pub created: bool,
}

/// Arguments of `edit_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFileArgs {
    /// The file, relative to the workspace.
    pub path: String,
    /// The exact text to replace, whitespace and line endings included. It must occur exactly once unless `replace_all` is set.
    pub old: String,
    /// The text to put in its place.
    pub new: String,
    /// Replace every occurrence of `old`. Default false.
    #[serde(default)]
    pub replace_all: bool,
}

/// Output of `edit_file`.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct EditFileOutput {
    /// The file, relative to the workspace.
    pub path: String,
    /// How many occurrences were replaced.
    pub replacements: usize,
}

/// What `write_file` would do, checked but not done.
struct WritePlan {
    target: Resolved,
    /// The current text, `None` if the file does not exist, `Some(Err)` if
    /// it is not UTF-8.
    old: Option<Result<String, ()>>,
    /// The parent directory, if it is missing.
    missing_dir: Option<String>,
}

fn plan_write(mount: &Mount, args: &WriteFileArgs) -> Result<WritePlan, FsError> {
    let target = mount.resolve(&args.path)?;
    let path = &target.shown;
    let old = match fs::metadata(&target.full) {
        Ok(meta) if meta.is_dir() => return Err(FsError::IsADirectory { path: path.clone() }),
        Ok(meta) if !meta.is_file() => return Err(FsError::NotAFile { path: path.clone() }),
        Ok(_) => {
            let bytes = fs::read(&target.full).map_err(|e| FsError::io("read", path, e))?;
            Some(String::from_utf8(bytes).map_err(|_| ()))
        }
        // `NotADirectory`: an ancestor is a file, which `missing_ancestor`
        // names.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            None
        }
        Err(e) => return Err(FsError::io("inspect", path, e)),
    };
    let missing_dir = if old.is_none() {
        missing_ancestor(mount, &target)?
    } else {
        None
    };
    if missing_dir.is_some() && !args.create_dirs {
        return Err(FsError::MissingParent { path: path.clone() });
    }
    Ok(WritePlan {
        target,
        old,
        missing_dir,
    })
}

/// The parent directory of `target` if it is missing, shown relative to the
/// mount. Fails if an ancestor exists but is not a directory.
fn missing_ancestor(mount: &Mount, target: &Resolved) -> Result<Option<String>, FsError> {
    let mut missing = None;
    let mut dir = target.full.parent();
    while let Some(d) = dir {
        let shown = mount.shown(d);
        match fs::metadata(d) {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) => return Err(FsError::NotADirectory { path: shown }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.get_or_insert(shown.clone());
            }
            Err(e) => return Err(FsError::io("inspect", &shown, e)),
        }
        if shown == "." {
            break;
        }
        dir = d.parent();
    }
    Ok(missing)
}

/// Writes a whole file.
pub(crate) fn write_file(mount: &Mount, args: WriteFileArgs) -> Result<WriteFileOutput, FsError> {
    let plan = plan_write(mount, &args)?;
    let path = plan.target.shown;
    if plan.missing_dir.is_some() {
        let parent = plan.target.full.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(parent).map_err(|e| FsError::io("create the directory of", &path, e))?;
    }
    warden_guest::fs::write_atomic(&plan.target.full, &args.content)
        .map_err(|e| FsError::io("write", &path, e))?;
    Ok(WriteFileOutput {
        path,
        bytes_written: args.content.len() as u64,
        created: plan.old.is_none(),
    })
}

/// Previews `write_file`: a summary line and a unified diff.
pub(crate) fn preview_write(mount: &Mount, args: WriteFileArgs) -> Result<Preview, FsError> {
    let plan = plan_write(mount, &args)?;
    let path = &plan.target.shown;
    let bytes = args.content.len();
    Ok(match &plan.old {
        None => {
            let d = diff::unified(path, "", &args.content);
            let dirs = match &plan.missing_dir {
                Some(dir) => format!(", creating directory `{dir}`"),
                None => String::new(),
            };
            Preview::new(
                format!("create `{path}`: {} lines, {bytes} bytes{dirs}", d.added),
                d.text,
            )
        }
        Some(Err(())) => Preview::new(
            format!("overwrite `{path}`, which is not utf-8 text, with {bytes} bytes"),
            String::new(),
        ),
        Some(Ok(old)) if *old == args.content => {
            Preview::new(format!("rewrite `{path}` unchanged"), String::new())
        }
        Some(Ok(old)) => {
            let d = diff::unified(path, old, &args.content);
            Preview::new(
                format!("overwrite `{path}`: +{} -{} lines", d.added, d.removed),
                d.text,
            )
        }
    })
}

/// What `edit_file` would do, checked but not done.
struct EditPlan {
    target: Resolved,
    old_text: String,
    new_text: String,
    replacements: usize,
}

fn plan_edit(mount: &Mount, args: &EditFileArgs) -> Result<EditPlan, FsError> {
    let target = mount.resolve(&args.path)?;
    let path = target.shown.clone();
    if args.old.is_empty() {
        return Err(FsError::EmptyOld { path });
    }
    if args.old == args.new {
        return Err(FsError::NoChange { path });
    }
    let meta = fs::metadata(&target.full).map_err(|e| FsError::io("edit", &path, e))?;
    if meta.is_dir() {
        return Err(FsError::IsADirectory { path });
    }
    if !meta.is_file() {
        return Err(FsError::NotAFile { path });
    }
    let bytes = fs::read(&target.full).map_err(|e| FsError::io("read", &path, e))?;
    let old_text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(err) => {
            let valid = err.utf8_error().valid_up_to();
            let line = err.as_bytes()[..valid]
                .iter()
                .filter(|&&b| b == b'\n')
                .count() as u64
                + 1;
            return Err(FsError::NotUtf8 { path, line });
        }
    };
    let count = old_text.matches(&args.old).count();
    let new_text = match count {
        0 => return Err(FsError::OldNotFound { path }),
        1 => old_text.replacen(&args.old, &args.new, 1),
        _ if args.replace_all => old_text.replace(&args.old, &args.new),
        _ => return Err(FsError::OldAmbiguous { path, count }),
    };
    Ok(EditPlan {
        target,
        old_text,
        new_text,
        replacements: count,
    })
}

/// Replaces exact text in a file.
pub(crate) fn edit_file(mount: &Mount, args: EditFileArgs) -> Result<EditFileOutput, FsError> {
    let plan = plan_edit(mount, &args)?;
    let path = plan.target.shown;
    warden_guest::fs::write_atomic(&plan.target.full, &plan.new_text)
        .map_err(|e| FsError::io("write", &path, e))?;
    Ok(EditFileOutput {
        path,
        replacements: plan.replacements,
    })
}

/// Previews `edit_file`: a summary line and a unified diff.
pub(crate) fn preview_edit(mount: &Mount, args: EditFileArgs) -> Result<Preview, FsError> {
    let plan = plan_edit(mount, &args)?;
    let path = &plan.target.shown;
    let d = diff::unified(path, &plan.old_text, &plan.new_text);
    let plural = if plan.replacements == 1 { "" } else { "s" };
    Ok(Preview::new(
        format!(
            "edit `{path}`: {} replacement{plural}, +{} -{} lines",
            plan.replacements, d.added, d.removed
        ),
        d.text,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tempfile::TempDir;

    fn workspace(files: &[(&str, &[u8])]) -> (TempDir, Mount) {
        let dir = tempfile::tempdir().unwrap();
        for (path, content) in files {
            let full = dir.path().join(path);
            fs::create_dir_all(full.parent().unwrap()).unwrap();
            fs::write(full, content).unwrap();
        }
        let mount = Mount::new(dir.path());
        (dir, mount)
    }

    fn write_args(path: &str, content: &str, create_dirs: bool) -> WriteFileArgs {
        WriteFileArgs {
            path: path.into(),
            content: content.into(),
            create_dirs,
        }
    }

    fn edit_args(path: &str, old: &str, new: &str, replace_all: bool) -> EditFileArgs {
        EditFileArgs {
            path: path.into(),
            old: old.into(),
            new: new.into(),
            replace_all,
        }
    }

    /// Every file under `dir`, with its content, to show nothing changed.
    fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in fs::read_dir(&d).unwrap() {
                let entry = entry.unwrap();
                let p = entry.path();
                if p.is_dir() {
                    out.push((p.display().to_string(), Vec::new()));
                    stack.push(p);
                } else {
                    out.push((p.display().to_string(), fs::read(&p).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn write_file_creates_and_replaces() {
        let (dir, mount) = workspace(&[("a.txt", b"old\n")]);
        let out = write_file(&mount, write_args("a.txt", "new\n", false)).unwrap();
        assert_eq!(
            out,
            WriteFileOutput {
                path: "a.txt".into(),
                bytes_written: 4,
                created: false
            }
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("a.txt")).unwrap(),
            "new\n"
        );
        let out = write_file(&mount, write_args("./b.txt", "b", false)).unwrap();
        assert_eq!((out.path.as_str(), out.created), ("b.txt", true));
    }

    #[test]
    fn write_file_creates_directories_only_when_asked() {
        let (dir, mount) = workspace(&[]);
        let err = write_file(&mount, write_args("x/y/z.txt", "z", false)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the parent directory of `x/y/z.txt` does not exist; set create_dirs to create it"
        );
        assert!(!dir.path().join("x").exists());
        write_file(&mount, write_args("x/y/z.txt", "z", true)).unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("x/y/z.txt")).unwrap(),
            "z"
        );
    }

    #[test]
    fn write_errors_name_the_path() {
        let (_dir, mount) = workspace(&[("d/f", b""), ("file", b"")]);
        let cases = [
            ("d", "`d` is a directory, not a file"),
            (".", "`.` is a directory, not a file"),
            ("file/x.txt", "`file` is not a directory"),
            ("../x", "path `../x` contains `..`"),
            ("/abs", "path `/abs` is absolute"),
        ];
        for (path, expected) in cases {
            let err = write_file(&mount, write_args(path, "x", true))
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(expected), "{path}: {err}");
            let err = preview_write(&mount, write_args(path, "x", true))
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(expected), "preview {path}: {err}");
        }
    }

    #[test]
    fn write_previews_diff_and_touch_nothing() {
        let (dir, mount) = workspace(&[("a.txt", b"one\ntwo\n"), ("bin", b"\xff")]);
        let before = snapshot(dir.path());
        let cases = [
            (
                write_args("a.txt", "one\n2\n", false),
                "overwrite `a.txt`: +1 -1 lines",
                "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n",
            ),
            (
                write_args("n/m/new.txt", "hi\n", true),
                "create `n/m/new.txt`: 1 lines, 3 bytes, creating directory `n/m`",
                "--- a/n/m/new.txt\n+++ b/n/m/new.txt\n@@ -0,0 +1 @@\n+hi\n",
            ),
            (
                write_args("a.txt", "one\ntwo\n", false),
                "rewrite `a.txt` unchanged",
                "",
            ),
            (
                write_args("bin", "text", false),
                "overwrite `bin`, which is not utf-8 text, with 4 bytes",
                "",
            ),
        ];
        for (args, summary, detail) in cases {
            let preview = preview_write(&mount, args).unwrap();
            assert_eq!(
                (preview.summary.as_str(), preview.detail.as_str()),
                (summary, detail)
            );
        }
        assert_eq!(snapshot(dir.path()), before);
    }

    #[test]
    fn edit_file_replaces_exactly_once_or_all() {
        let (dir, mount) = workspace(&[("a.rs", b"let x = 1;\nlet y = 1;\n")]);
        let out = edit_file(&mount, edit_args("a.rs", "x = 1", "x = 2", false)).unwrap();
        assert_eq!(out.replacements, 1);
        assert_eq!(
            fs::read_to_string(dir.path().join("a.rs")).unwrap(),
            "let x = 2;\nlet y = 1;\n"
        );
        let out = edit_file(&mount, edit_args("a.rs", "let", "const", true)).unwrap();
        assert_eq!(
            out,
            EditFileOutput {
                path: "a.rs".into(),
                replacements: 2
            }
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("a.rs")).unwrap(),
            "const x = 2;\nconst y = 1;\n"
        );
    }

    #[test]
    fn edit_errors_name_the_path_and_change_nothing() {
        let (dir, mount) =
            workspace(&[("a.txt", b"aa bb aa\n"), ("bin", b"x\n\xff"), ("d/x", b"")]);
        let before = snapshot(dir.path());
        let cases = [
            (
                edit_args("a.txt", "zz", "y", false),
                "the `old` text was not found in `a.txt`",
            ),
            (
                edit_args("a.txt", "aa", "y", false),
                "the `old` text occurs 2 times in `a.txt`; include more surrounding text to make it unique, or set replace_all",
            ),
            (
                edit_args("a.txt", "", "y", false),
                "`old` is empty for `a.txt`",
            ),
            (
                edit_args("a.txt", "aa", "aa", true),
                "`old` and `new` are the same for `a.txt`",
            ),
            (
                edit_args("nope.txt", "a", "b", false),
                "cannot edit `nope.txt`: not found",
            ),
            (
                edit_args("bin", "x", "y", false),
                "`bin` is not utf-8 text (line 2)",
            ),
            (
                edit_args("d", "x", "y", false),
                "`d` is a directory, not a file",
            ),
            (
                edit_args("../a.txt", "a", "b", false),
                "path `../a.txt` contains `..`",
            ),
        ];
        for (args, expected) in cases {
            let shown = format!("{args:?}");
            let err = preview_edit(&mount, args).unwrap_err().to_string();
            assert!(err.starts_with(expected), "preview {shown}: {err}");
        }
        for (args, expected) in [
            (
                edit_args("a.txt", "aa", "y", false),
                "the `old` text occurs 2 times",
            ),
            (
                edit_args("a.txt", "zz", "y", false),
                "the `old` text was not found",
            ),
        ] {
            let err = edit_file(&mount, args).unwrap_err().to_string();
            assert!(err.starts_with(expected), "{err}");
        }
        assert_eq!(snapshot(dir.path()), before);
    }

    /// The names in `dir`, sorted: no temporary file is left behind.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[cfg(unix)]
    #[test]
    fn writes_and_edits_replace_whole_files_keeping_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, mount) = workspace(&[("run.sh", b"echo one\n"), ("ro.txt", b"a\n")]);
        let mode = |name: &str| {
            fs::metadata(dir.path().join(name))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        let chmod = |name: &str, mode: u32| {
            fs::set_permissions(dir.path().join(name), fs::Permissions::from_mode(mode)).unwrap()
        };
        chmod("run.sh", 0o750);
        chmod("ro.txt", 0o640);
        edit_file(&mount, edit_args("run.sh", "one", "two", false)).unwrap();
        write_file(&mount, write_args("ro.txt", "b\n", false)).unwrap();
        assert_eq!((mode("run.sh"), mode("ro.txt")), (0o750, 0o640));
        assert_eq!(
            fs::read_to_string(dir.path().join("run.sh")).unwrap(),
            "echo two\n"
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("ro.txt")).unwrap(),
            "b\n"
        );
        assert_eq!(names(dir.path()), ["ro.txt", "run.sh"]);
    }

    #[test]
    fn edit_previews_diff_and_touch_nothing() {
        let (dir, mount) = workspace(&[("a.txt", b"one\ntwo\none\n")]);
        let before = snapshot(dir.path());
        let preview = preview_edit(&mount, edit_args("a.txt", "one", "1", true)).unwrap();
        assert_eq!(preview.summary, "edit `a.txt`: 2 replacements, +2 -2 lines");
        assert!(
            preview
                .detail
                .starts_with("--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n")
        );
        assert!(preview.detail.contains("-one\n+1\n"), "{}", preview.detail);
        let preview = preview_edit(&mount, edit_args("a.txt", "two", "2", false)).unwrap();
        assert_eq!(preview.summary, "edit `a.txt`: 1 replacement, +1 -1 lines");
        assert_eq!(snapshot(dir.path()), before);
    }
}
