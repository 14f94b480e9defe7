"""Reading files a user named, safely, and echoing user values in one-line messages.

A scenario can point at other files (``extends:``, trace paths, profile files). Those paths are
resolved relative to the directory of the scenario that names them and must stay inside the
*scenario's directory tree* (the directory of the top-level scenario file, or the current
directory for a scenario given as a dict): no absolute paths, no ``..`` escapes, no symlinks
leading out, unless the user opts in (``--allow-outside-paths``; library:
``allow_outside_paths=True``). Whatever the opt-in, only regular files are read (never
``/proc``, ``/sys``, ``/dev``, devices or FIFOs; a FIFO is never opened in blocking mode), and
files above a size limit are refused before they are read.

Every error is a :class:`UserFileError` (a ``ValueError``) whose ``str()`` is one line that
never quotes the file's contents. :func:`echo` caps and escapes a value for such a line.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

ECHO_CHARS = 60  # longest echo of a user value in an error message
PATH_CHARS = 160  # longest echo of a path
MAX_PATH_CHARS = 4096  # longer paths are refused before the OS sees them
SPECIAL_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))


class UserFileError(ValueError):
    """A user-named file that cannot be used; ``str()`` is one line."""


def _big_int(v: int) -> str | None:
    bits = v.bit_length()
    if bits <= 256:
        return None
    return f"an integer of about {int(bits * 0.30103) + 1} digits"


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr``-like text of a user value: control characters escaped, at most ``limit`` chars.

    Safe on hostile values: huge integers are described rather than converted, containers are
    shown shallowly (``reprlib``), and the result never contains a terminal escape or newline.
    """
    import reprlib

    if isinstance(value, bool) or value is None:
        text = repr(value)
    elif isinstance(value, int):
        text = _big_int(value) or repr(value)
    elif isinstance(value, str):
        text = repr(value[: limit + 1])
    elif isinstance(value, float):
        text = repr(value)
    else:
        r = reprlib.Repr()
        r.maxlevel, r.maxdict, r.maxlist, r.maxstring, r.maxother = 2, 4, 4, limit, limit
        r.maxlong = 80
        try:
            text = r.repr(value)
        except Exception:  # an int past Python's digit limit deep inside, say
            text = f"<{type(value).__name__}>"
    return clip(text, limit)


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` with non-printable characters escaped, cut to ``limit`` chars with an ellipsis."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show_path(path: str | os.PathLike) -> str:
    """A path for a message: escaped and capped."""
    return clip(os.fspath(path), PATH_CHARS)


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def why(err: BaseException) -> str:
    """What went wrong with a path, in a few words: the OS's reason (``strerror``), or "a
    symlink loop" (``Path.resolve`` raises RuntimeError for one on Python < 3.13, with no
    ``strerror``), or the error's type."""
    reason = getattr(err, "strerror", None)
    if reason:
        return reason
    if isinstance(err, RuntimeError) and "loop" in str(err).lower():
        return "a symlink loop"
    return type(err).__name__


def resolve_user_path(base_dir: str | os.PathLike, rel: str, what: str,
                      allow_outside: bool = False, root: str | os.PathLike | None = None
                      ) -> Path:
    """Resolve ``rel`` (as written in a scenario) against ``base_dir``, confined to ``root``.

    ``root`` is the scenario's directory tree (default: ``base_dir``). Refuses absolute paths,
    ``..`` escapes and symlinks that resolve outside ``root`` unless ``allow_outside``; refuses
    special filesystems (/proc, /sys, /dev) always. ``what`` names the key for messages, e.g.
    ``"'extends'"`` or ``"'clients.0.dataset.path'"``. Returns the resolved path; whether it
    exists and is a regular file is :func:`read_user_file`'s business.
    """
    if not isinstance(rel, str) or not rel.strip():
        raise UserFileError(f"{what} must be a file name (a non-empty string), got {echo(rel)}")
    if "\x00" in rel or len(rel) > MAX_PATH_CHARS:
        raise UserFileError(f"{what}: not a usable path ({len(rel)} characters; at most "
                            f"{MAX_PATH_CHARS}, no NUL bytes): {show_path(rel)}")
    given = Path(os.path.expanduser(rel)) if rel.startswith("~") else Path(rel)
    hint = "; pass --allow-outside-paths (library: allow_outside_paths=True) to allow it"
    try:
        base = Path(base_dir).resolve()
        top = Path(root).resolve() if root is not None else base
        resolved = (base / given).resolve()
    except (OSError, RuntimeError) as err:  # symlink loops, name too long
        raise UserFileError(f"{what}: cannot resolve {show_path(rel)} "
                            f"({clip(why(err))})") from None
    if not allow_outside and not _inside(resolved, top):
        raise UserFileError(f"{what}: {show_path(rel)} leads outside the scenario's directory "
                            f"{show_path(top)}{hint}")
    for special in SPECIAL_ROOTS:
        if _inside(resolved, special):
            raise UserFileError(f"{what}: {show_path(rel)} is on the special filesystem "
                                f"{special}; only regular files are read")
    return resolved


def open_user_file(path: str | os.PathLike, what: str, max_bytes: int) -> BinaryIO:
    """Open the regular file ``path`` (at most ``max_bytes``) for binary reading.

    The file is opened non-blocking (a FIFO never hangs) and checked with ``fstat`` on the
    open descriptor: anything but a regular file is refused, and so is a file above
    ``max_bytes``, before a byte is read. Errors are one line.
    """
    p = os.fspath(path)
    if "\x00" in p or len(p) > MAX_PATH_CHARS:
        raise UserFileError(f"{what}: not a usable path: {show_path(p)}")
    try:
        real = Path(p).resolve()
    except (OSError, RuntimeError):
        real = Path(p)
    for special in SPECIAL_ROOTS:
        if _inside(real, special):
            raise UserFileError(f"{what}: {show_path(p)} is on the special filesystem "
                                f"{special}; only regular files are read")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise UserFileError(f"{what} not found: {show_path(p)}") from None
    except IsADirectoryError:
        raise UserFileError(f"{what}: {show_path(p)} is a directory, not a file") from None
    except OSError as err:
        raise UserFileError(f"{what}: cannot open {show_path(p)} "
                            f"({clip(why(err))})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UserFileError(f"{what}: {show_path(p)} is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise UserFileError(f"{what}: {show_path(p)} is not a regular file (a device, "
                                f"FIFO or socket); only regular files are read")
        if st.st_size > max_bytes:
            raise UserFileError(f"{what}: {show_path(p)} is {st.st_size:,} bytes; the limit "
                                f"is {max_bytes:,} bytes")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_user_file(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """Bytes of the regular file ``path`` (see :func:`open_user_file`), at most ``max_bytes``."""
    with open_user_file(path, what, max_bytes) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as err:
            raise UserFileError(f"{what}: cannot read {show_path(path)} "
                                f"({clip(why(err))})") from None
    if len(data) > max_bytes:  # grew while we read it
        raise UserFileError(f"{what}: {show_path(path)} is larger than the limit of "
                            f"{max_bytes:,} bytes")
    return data


def decode_utf8(data: bytes, what: str) -> str:
    """Strict UTF-8 (a BOM is allowed); anything else is one line naming the byte offset."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        kind = ("looks like UTF-16; " if data[:2] in (b"\xff\xfe", b"\xfe\xff") else
                "looks binary; " if b"\x00" in data[:4096] else "")
        raise UserFileError(f"{what}: not UTF-8 text ({kind}undecodable byte 0x"
                            f"{data[err.start]:02x} at offset {err.start}); save it as "
                            f"UTF-8") from None
