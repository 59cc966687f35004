"""Reading and writing files safely.

Writes are atomic: a temporary file in the same folder, then ``os.replace``. Reads open only
regular files (a named pipe would block the reader forever), refuse JSON objects with a key
given twice, and stop past :data:`MAX_INPUT_BYTES`, compressed or not (a small gzip file can
inflate to gigabytes).

Errors are :class:`InputFileError` with the problem only, without the path: each caller
raises its own error type, naming the file.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Literal

#: The largest input any reader here accepts, decompressed: 1 GiB. The threat is memory, and it
#: depends on the size after decompression, not on the compression ratio (a ratio limit would
#: refuse honest traces, which are repetitive JSON and compress 10-30x). Parsing 1 GiB of JSON
#: already takes several GiB of Python objects, more than a CI runner has, while the biggest
#: honest inputs (records of long runs, real Kineto traces) are hundreds of MiB.
MAX_INPUT_BYTES = 2**30  # GiB (simulator.units is not imported here: it loads the simulator)
#: How old (by modification time) a temporary file of :func:`atomic_write_bytes` must be to be
#: removed as left over by a killed writer: 10 minutes. A live writer's temporary file exists only
#: while it writes and syncs one file (milliseconds to seconds), and its modification time moves
#: with every write, so a file untouched for 10 minutes has no live writer, even when two pytest
#: runs (or an xdist controller and another run) save into the same folder; the margin covers
#: slow disks and clocks of network file systems that run a few minutes apart.
STALE_TEMP_AGE_S = 600.0
#: The temporary files of :func:`atomic_write_bytes`: ``.<name>.<8 random characters>.tmp``
#: (``tempfile.mkstemp``'s random part is 8 of ``a-z``, ``0-9`` and ``_``).
_TEMP_NAME = re.compile(r"\A\..+\.[a-z0-9_]{8}\.tmp\Z")
_READ_CHUNK = 2**20
_GZIP_MAGIC = b"\x1f\x8b"


class InputFileError(ValueError):
    """A file that cannot be used; ``problem`` says why, without the path (each caller raises
    its own error type with it)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class JsonFileError(InputFileError):
    """A JSON file that cannot be used (see :class:`InputFileError`)."""


# -- writing ------------------------------------------------------------------------------------


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` as UTF-8 to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half.

    Creates the parent folder if needed. On any error the temporary file is removed and the
    old file is left as it was. After the write, temporary files that killed writers left in
    the folder are removed (:func:`remove_stale_temp_files`).

    Raises:
        OSError: the folder cannot be made or written (the error names the folder, not the
            temporary file), or the write fails.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # "Permission denied: '.../.x.json.k2j4h1d8.tmp'" named a file nobody made
        raise OSError(exc.errno, f"cannot create a file in the folder ({exc.strerror})", str(path.parent)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    remove_stale_temp_files(path.parent)


def remove_stale_temp_files(folder: Path, max_age_s: float = STALE_TEMP_AGE_S) -> list[Path]:
    """Remove the temporary files of :func:`atomic_write_bytes` in ``folder`` (only its own
    name pattern, ``.<name>.<random>.tmp``, only regular files) not modified for ``max_age_s``:
    those of writers killed between creating and renaming them. Younger ones may belong to a
    writer still at work (see :data:`STALE_TEMP_AGE_S`) and are kept. Best effort: a file that
    cannot be removed (or was removed by another cleaner) is left alone, never an error.

    Returns:
        The files removed.
    """
    removed = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not _TEMP_NAME.match(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode) or now - info.st_mtime < max_age_s:
                continue
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed


# -- reading ------------------------------------------------------------------------------------


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, for messages."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def file_state(path: Path) -> Literal["missing", "present"]:
    """Whether ``path`` is a regular file ("present", following symbolic links) or nothing
    ("missing": no such name), without opening it.

    Raises:
        InputFileError: something else is there: a symbolic link to a missing file (or a loop of
            links), a folder, a named pipe, a socket or a device; or its folder cannot be
            searched (permission denied).
    """
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        try:
            target = os.readlink(path)
        except OSError:  # not a link (or gone meanwhile): nothing there
            return "missing"
        raise InputFileError(f"is a symbolic link to {target!r}, which does not exist; "
                             "remove the link or restore its target") from None
    except NotADirectoryError:
        return "missing"  # a part of the folder path is a file: nothing can be at ``path``
    except PermissionError:
        raise InputFileError("cannot be checked: permission denied on its folder") from None
    except OSError as exc:  # ELOOP: a loop of symbolic links; ENAMETOOLONG
        raise InputFileError(f"cannot be checked ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputFileError(f"is {_kind(info.st_mode)}, not a file; remove it or give a file")
    return "present"


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading in binary mode, if it is a regular file. Anything else is
    refused without being opened for reading: a named pipe would block until a writer comes.

    Raises:
        InputFileError: missing, not a regular file (see :func:`file_state`), or unreadable.
    """
    path = Path(path)
    if file_state(path) == "missing":
        raise InputFileError("cannot be read (No such file or directory)")
    try:
        # O_NONBLOCK: should the path turn into a named pipe after the check, opening it does
        # not block; the descriptor is checked again below. Regular files ignore the flag.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise InputFileError(f"cannot be read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(f"is {_kind(info.st_mode)}, not a file; remove it or give a file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _too_big(limit: int, compressed: bool) -> InputFileError:
    from ..format import fmt_byte_limit  # here: format loads the simulator (its units)

    size = fmt_byte_limit(limit)
    if compressed:
        return InputFileError(f"decompresses to more than {size}, the most pytest-oam reads: a damaged or "
                              "malicious gzip file (a decompression bomb)? Check where it came from")
    return InputFileError(f"is larger than {size}, the most pytest-oam reads")


def read_input_bytes(path: Path, *, limit: int | None = None, gunzip: bool = True) -> bytes:
    """The bytes of the regular file ``path``, decompressed if it is gzip (and ``gunzip``);
    see :func:`read_input`."""
    return read_input(path, limit=limit, gunzip=gunzip)[0]


def read_input(path: Path, *, limit: int | None = None, gunzip: bool = True) -> tuple[bytes, bool]:
    """The bytes of the regular file ``path``, decompressed if it is gzip (and ``gunzip``), and
    whether it was compressed.

    At most ``limit`` bytes are accepted, after decompression (default: :data:`MAX_INPUT_BYTES`,
    read at the call). A compressed file is first
    decompressed without keeping the output, to count it: a decompression bomb costs time,
    never memory; an honest file is then decompressed again, which costs far less than
    parsing it.

    Raises:
        InputFileError: missing, not a regular file, unreadable, larger than ``limit`` (or
            decompressing to more), or a damaged or truncated gzip stream.
    """
    import gzip
    import zlib

    limit = MAX_INPUT_BYTES if limit is None else limit
    with open_regular(path) as fh:
        try:
            size = os.fstat(fh.fileno()).st_size
            magic = fh.read(2)
            fh.seek(0)
            if not (gunzip and magic == _GZIP_MAGIC):
                if size > limit:
                    raise _too_big(limit, compressed=False)
                data = fh.read(limit + 1)
                if len(data) > limit:  # grew since fstat
                    raise _too_big(limit, compressed=False)
                return data, False
        except OSError as exc:
            raise InputFileError(f"cannot be read ({exc.strerror or exc})") from None
        try:
            total = 0
            with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
                while chunk := gz.read(_READ_CHUNK):
                    total += len(chunk)
                    if total > limit:
                        raise _too_big(limit, compressed=True)
            fh.seek(0)
            with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
                data = gz.read(limit + 1)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise InputFileError(f"is a damaged or truncated gzip file ({exc})") from None
        except OSError as exc:
            raise InputFileError(f"cannot be read ({exc.strerror or exc})") from None
        if len(data) > limit:  # the file changed between the two passes
            raise _too_big(limit, compressed=True)
        return data, True


class DuplicateKeyError(ValueError):
    """A JSON object gives the same key twice (``json`` would keep the last one silently)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"has the key {key!r} twice in one object (which one is meant?); keep one")
        self.key = key


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``object_pairs_hook`` for :func:`json.loads` that refuses a key given twice.

    Raises:
        DuplicateKeyError: naming the key.
    """
    result = dict(pairs)
    if len(result) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return result


def loads_unique(text: str | bytes) -> object:
    """:func:`json.loads` refusing duplicate keys (:class:`DuplicateKeyError`)."""
    import json

    return json.loads(text, object_pairs_hook=unique_keys)


def read_json_object(path: Path, what: str, *, limit: int | None = None) -> dict:
    """The JSON object in the UTF-8 file ``path``. ``what`` names the kind of file in messages
    (``"a valid baseline"``, ``"a knowledge base"``).

    Raises:
        JsonFileError: the file is missing, is not a regular file (a named pipe is never
            opened), cannot be read, is larger than ``limit`` (default :data:`MAX_INPUT_BYTES`),
            is not UTF-8, is empty, ends early
            (a truncated write), is not valid JSON, gives a key twice in one object, nests too
            deeply, or holds something else than an object.
    """
    import json

    try:
        raw = read_input_bytes(path, limit=limit, gunzip=False)
    except InputFileError as exc:
        raise JsonFileError(exc.problem) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise JsonFileError("is not UTF-8 text") from None
    if not text.strip():
        raise JsonFileError("is empty (truncated write?)")
    try:
        data = loads_unique(text)
    except RecursionError:
        raise JsonFileError(f"is not {what}: its JSON nests too deeply") from None
    except DuplicateKeyError as exc:
        raise JsonFileError(f"is not {what}: it {exc}") from None
    except json.JSONDecodeError as exc:
        stripped = text.strip()
        if exc.pos >= len(stripped) or (stripped.startswith("{") and not stripped.endswith("}")):
            raise JsonFileError(f"is truncated: JSON ends early (line {exc.lineno})") from None
        raise JsonFileError(f"is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except ValueError as exc:  # an integer literal past the interpreter's digit limit
        raise JsonFileError(f"is not {what}: {exc}") from None
    if not isinstance(data, dict):
        raise JsonFileError("is not a JSON object")
    return data
