"""Paths the user names for files to read or write, checked before any work, with errors that say what the path
really is: missing, a directory, a FIFO or device, a name too long for the file system, a NUL byte.

Reading a FIFO or a device blocks or never ends, and writing one sends the data elsewhere, so only regular
files (or links to one) are read or replaced.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import InvalidInputError, OutputPathError

NAME_MAX = 255  # bytes in one file or folder name: the limit of ext4, XFS, APFS and NTFS alike
PATH_MAX = 4096  # bytes in a whole path (Linux)

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind(mode: int) -> str:
    """What a stat mode is, in words: 'a regular file', 'a directory', 'a FIFO (named pipe)', ..."""
    return next((what for test, what in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode) else
                "not a regular file")


def check_name(path, label: str, error=InvalidInputError) -> Path:
    """`path` as a Path, or `error` if no file system can hold it: a NUL byte, a character the file system
    encoding cannot take, a name over NAME_MAX bytes or a path over PATH_MAX bytes."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\0" in text:
        raise error(f"{label} {text!r} contains a NUL byte, which no file name can hold; remove it.")
    try:
        raw = os.fsencode(text)
    except UnicodeEncodeError as exc:
        raise error(f"{label} {text!r} holds a character the file system cannot store ({exc.reason}); "
                    "rename it.") from exc
    long = next((part for part in raw.split(b"/") if len(part) > NAME_MAX), None)
    if long is not None:
        shown = os.fsdecode(long[:24]) + "..." + os.fsdecode(long[-16:])  # the end holds the extension
        raise error(f"{label}: the name {shown!r} is {len(long)} bytes long, but file systems allow at most "
                    f"{NAME_MAX} bytes per name; choose a shorter name.")
    if len(raw) > PATH_MAX:
        raise error(f"{label}: the path is {len(raw)} bytes long, more than the {PATH_MAX} a path may have; "
                    "choose a shorter path.")
    return Path(text)


def input_file(path, label: str, error=InvalidInputError) -> os.stat_result:
    """The stat of `path` if it is a regular file (or a link to one) that can be read, else `error` saying
    what it is instead."""
    p = check_name(path, label, error)
    try:
        st = p.stat()
    except FileNotFoundError:
        dangling = p.is_symlink()
        raise error(f"{label} {p} does not exist" + (" (it is a link to a missing file)" if dangling else "")
                    + "; check the path.") from None
    except NotADirectoryError:
        raise error(f"{label} {p} does not exist: a folder on its path is a file; check the path.") from None
    except OSError as exc:
        raise error(f"{label} {p} cannot be read ({exc.strerror or exc}); check the path and its "
                    "permissions.") from exc
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{label} {p} is a directory, not a file; give the file inside it.")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{label} {p} is not a regular file (it is {kind(st.st_mode)}); give a file saved on disk.")
    if not os.access(p, os.R_OK):
        raise error(f"{label} {p} is not readable (permission denied); check its permissions.")
    return st


def output_file(path, label: str, error=OutputPathError) -> Path:
    """`path` as a Path if a file can be written there: a valid name in an existing, writable folder, and
    nothing there yet or a writable regular file (never a directory, FIFO or device, nor a link to one or a
    link to nothing, which a write would follow)."""
    p = check_name(path, label, error)
    if p.is_symlink() and not p.exists():
        raise error(f"{label} {p} is a link to a missing file; remove the link or choose another name.")
    try:
        st = p.stat()
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        st = None  # the folder check below names the file that stands where a folder should be
    except OSError as exc:
        raise error(f"{label} {p} cannot be used ({exc.strerror or exc}); choose another path.") from exc
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise error(f"{label} {p} is a directory; give a file name, e.g. {p / 'out.wav'}.")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise error(f"{label} {p} is not a regular file (it is {kind(st.st_mode)}) and is never replaced; "
                    "choose a file name.")
    folder = p.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise error(f"{label} {p}: the folder {folder} {what}. Create it first (mkdir -p {folder}) or choose a "
                    "file in an existing folder.")
    if st is not None and not os.access(p, os.W_OK):
        raise error(f"{label} {p} exists and is read-only; choose another file or make it writable.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise error(f"{label} {p}: the folder {folder} is not writable; choose a folder you can write to.")
    return p
