"""Paths inside a mount, and file errors as typed tool errors.

A mount the operator grants is plain filesystem access at `/<mount>`: open
`/data/notes.txt` with `open()`. The sandbox refuses everything else, but not
uniformly: a path climbing out with `..` fails with PermissionError, while an
absolute path outside every mount fails with FileNotFoundError, as if it did
not exist. `in_mount` refuses both before any file is touched, the same way,
as `Denied`; `file_error` turns whatever the open or read raised into the
tool error the model should see.
"""

import errno
import posixpath

from .tool import Denied, Failed, InvalidArguments


def in_mount(mount, path):
    """The absolute path of `path` (relative to the mount) inside `/<mount>`.

    Raises Denied for absolute paths and for any `..` component, and
    InvalidArguments for an empty path."""
    if not path:
        raise InvalidArguments("the path is empty")
    if path.startswith("/"):
        raise Denied(f"`{path}` is absolute: paths are relative to the `{mount}` mount")
    if ".." in path.split("/"):
        raise Denied(f"`{path}` climbs out of the `{mount}` mount")
    return posixpath.join("/" + mount, path)


def file_error(error, path):
    """The ToolError for an OSError raised while touching `path`."""
    code = getattr(error, "errno", None)
    if isinstance(error, PermissionError) or code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return Denied(f"`{path}`: not permitted by the sandbox ({error.strerror or error})")
    if isinstance(error, FileNotFoundError):
        return Failed(f"`{path}` does not exist (or is outside every mount)")
    if isinstance(error, IsADirectoryError):
        return Failed(f"`{path}` is a directory")
    return Failed(f"`{path}`: {error.strerror or error}")


def read_text(mount, path):
    """The UTF-8 text of `path` inside `mount`, or a ToolError."""
    full = in_mount(mount, path)
    try:
        with open(full, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise Failed(f"`{path}` is not UTF-8 text") from None
    except OSError as e:
        raise file_error(e, path) from None


def write_text(mount, path, text):
    """Writes `text` (UTF-8) to `path` inside `mount`, replacing the file,
    or raises a ToolError (a read-only mount is `Denied`)."""
    full = in_mount(mount, path)
    try:
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise file_error(e, path) from None
