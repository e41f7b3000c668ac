//! `FsError`, every way a tool of this plugin fails, and its mapping onto
//! the WIT `tool-error`: path escapes and permission refusals are `denied`,
//! bad arguments `invalid-arguments`, everything else `failed`. Each message
//! names the path (relative to the mount) or the offending value.

use std::io;

use warden_guest::ToolError;

/// A failure of one of the fs tools.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// The path is absolute; tool paths are relative to the mount.
    #[error("path `{path}` is absolute; paths are relative to the workspace mount")]
    AbsolutePath {
        /// The path as given.
        path: String,
    },
    /// The path has a `..` component.
    #[error("path `{path}` contains `..`; paths must stay inside the workspace mount")]
    ParentComponent {
        /// The path as given.
        path: String,
    },
    /// The component sees no `workspace` directory: the operator did not
    /// grant the mount. Said as such, not as a missing file.
    #[error(
        "mount `workspace` was requested and not granted, so this plugin sees no files; \
         grant it: `--mount workspace=DIR` with `warden plugin call`, or \
         `[plugins.<key>.grant.mounts.workspace]` in the agent file"
    )]
    MountNotGranted,
    /// An I/O operation failed.
    #[error("cannot {action} `{path}`: {}", io_reason(source))]
    Io {
        /// What the tool was doing: `read`, `list`, `write`, ...
        action: &'static str,
        /// The path, relative to the mount.
        path: String,
        /// The underlying error.
        source: io::Error,
    },
    /// The path names a directory where a file is needed.
    #[error("`{path}` is a directory, not a file")]
    IsADirectory {
        /// The path, relative to the mount.
        path: String,
    },
    /// The path names something that is neither a regular file nor a
    /// directory (a FIFO, a device, a socket): reading or writing it could
    /// wait forever or never end, so the tools refuse it.
    #[error(
        "`{path}` is not a regular file (a FIFO, device or socket); the tools only read and write regular files"
    )]
    NotAFile {
        /// The path, relative to the mount.
        path: String,
    },
    /// The path names something other than a directory where one is needed.
    #[error("`{path}` is not a directory")]
    NotADirectory {
        /// The path, relative to the mount.
        path: String,
    },
    /// The file is not UTF-8 text.
    #[error("`{path}` is not utf-8 text (line {line})")]
    NotUtf8 {
        /// The path, relative to the mount.
        path: String,
        /// The first line with invalid bytes.
        line: u64,
    },
    /// `offset` is past the end of the file.
    #[error("offset {offset} is past the end of `{path}`, which has {total_lines} lines")]
    OffsetPastEnd {
        /// The path, relative to the mount.
        path: String,
        /// The requested first line.
        offset: u64,
        /// How many lines the file has.
        total_lines: u64,
    },
    /// The file's parent directory is missing and `create_dirs` is off.
    #[error("the parent directory of `{path}` does not exist; set create_dirs to create it")]
    MissingParent {
        /// The path, relative to the mount.
        path: String,
    },
    /// `old` is empty.
    #[error("`old` is empty for `{path}`; use write_file to write a whole file")]
    EmptyOld {
        /// The path, relative to the mount.
        path: String,
    },
    /// `old` equals `new`.
    #[error("`old` and `new` are the same for `{path}`; nothing would change")]
    NoChange {
        /// The path, relative to the mount.
        path: String,
    },
    /// `old` does not occur in the file.
    #[error("the `old` text was not found in `{path}`")]
    OldNotFound {
        /// The path, relative to the mount.
        path: String,
    },
    /// `old` occurs more than once and `replace_all` is off.
    #[error(
        "the `old` text occurs {count} times in `{path}`; include more surrounding text to make it unique, or set replace_all"
    )]
    OldAmbiguous {
        /// The path, relative to the mount.
        path: String,
        /// How many times it occurs.
        count: usize,
    },
    /// The search pattern is not a valid regex.
    #[error("invalid regex `{pattern}`: {reason}")]
    BadPattern {
        /// The pattern as given.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The glob is malformed.
    #[error("invalid glob `{glob}`: {reason}")]
    BadGlob {
        /// The glob as given.
        glob: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A numeric argument is out of range.
    #[error("`{name}` is {value}, {expected}")]
    OutOfRange {
        /// The argument's name.
        name: &'static str,
        /// Its value.
        value: u64,
        /// What it must be.
        expected: &'static str,
    },
}

impl FsError {
    pub(crate) fn io(action: &'static str, path: &str, source: io::Error) -> Self {
        FsError::Io {
            action,
            path: path.to_string(),
            source,
        }
    }
}

impl From<FsError> for ToolError {
    fn from(err: FsError) -> Self {
        let message = err.to_string();
        match &err {
            FsError::AbsolutePath { .. }
            | FsError::ParentComponent { .. }
            | FsError::NotAFile { .. }
            | FsError::MountNotGranted => ToolError::denied(message),
            FsError::Io { source, .. } => match source.kind() {
                // `Unsupported`: the host refused to open a file that is not
                // a regular one.
                io::ErrorKind::PermissionDenied
                | io::ErrorKind::ReadOnlyFilesystem
                | io::ErrorKind::Unsupported => ToolError::denied(message),
                io::ErrorKind::Interrupted
                | io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::ResourceBusy => ToolError::retryable(message),
                _ => ToolError::failed(message),
            },
            FsError::EmptyOld { .. }
            | FsError::NoChange { .. }
            | FsError::OffsetPastEnd { .. }
            | FsError::BadPattern { .. }
            | FsError::BadGlob { .. }
            | FsError::OutOfRange { .. } => ToolError::invalid_arguments(message),
            FsError::IsADirectory { .. }
            | FsError::NotADirectory { .. }
            | FsError::NotUtf8 { .. }
            | FsError::MissingParent { .. }
            | FsError::OldNotFound { .. }
            | FsError::OldAmbiguous { .. } => ToolError::failed(message),
        }
    }
}

impl From<warden_guest::glob::GlobError> for FsError {
    fn from(e: warden_guest::glob::GlobError) -> Self {
        FsError::BadGlob {
            glob: e.glob,
            reason: e.reason,
        }
    }
}

/// A lowercase reason for an I/O error, without the `(os error N)` suffix.
fn io_reason(err: &io::Error) -> String {
    use io::ErrorKind::*;
    let known = match err.kind() {
        NotFound => "not found",
        PermissionDenied => "permission denied",
        AlreadyExists => "already exists",
        IsADirectory => "is a directory",
        NotADirectory => "a path component is not a directory",
        ReadOnlyFilesystem => "read-only file system",
        StorageFull => "no space left on the device",
        DirectoryNotEmpty => "directory not empty",
        InvalidFilename => "invalid file name",
        FileTooLarge => "file too large",
        Unsupported => "not a regular file or directory (refused by the host)",
        _ => "",
    };
    if !known.is_empty() {
        return known.to_string();
    }
    let text = err.to_string();
    let text = match text.rfind(" (os error ") {
        Some(at) => &text[..at],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => format!("{:?}", err.kind()).to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_map_onto_tool_errors() {
        let denied = ToolError::from(FsError::ParentComponent {
            path: "../x".into(),
        });
        assert_eq!(
            denied,
            ToolError::denied(
                "path `../x` contains `..`; paths must stay inside the workspace mount"
            )
        );
        let perm = io::Error::from(io::ErrorKind::PermissionDenied);
        assert_eq!(
            ToolError::from(FsError::io("write", "a.txt", perm)),
            ToolError::denied("cannot write `a.txt`: permission denied")
        );
        let missing = io::Error::from(io::ErrorKind::NotFound);
        assert_eq!(
            ToolError::from(FsError::io("read", "a.txt", missing)),
            ToolError::failed("cannot read `a.txt`: not found")
        );
        let busy = io::Error::from(io::ErrorKind::WouldBlock);
        assert!(matches!(
            ToolError::from(FsError::io("read", "a", busy)),
            ToolError::Failed(f) if f.retryable
        ));
        assert!(matches!(
            ToolError::from(FsError::EmptyOld { path: "a".into() }),
            ToolError::InvalidArguments(_)
        ));
    }

    #[test]
    fn io_reasons_are_lowercase_without_os_codes() {
        let err = io::Error::from_raw_os_error(5); // EIO
        let reason = io_reason(&err);
        assert!(!reason.contains("os error"), "{reason}");
        assert!(reason.chars().next().unwrap().is_lowercase(), "{reason}");
        assert_eq!(io_reason(&io::Error::other("Boom")), "boom");
    }
}
