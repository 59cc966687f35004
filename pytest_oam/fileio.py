"""Atomic file writes: a temporary file in the same folder, then ``os.replace``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
    old file is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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


class JsonFileError(ValueError):
    """A JSON file that cannot be used; ``problem`` says why, without the path (each caller
    raises its own error type with it)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def read_json_object(path: Path, what: str) -> dict:
    """The JSON object in the UTF-8 file ``path``. ``what`` names the kind of file in messages
    (``"a valid baseline"``, ``"a knowledge base"``).

    Raises:
        JsonFileError: the file cannot be read, is not UTF-8, is empty, ends early (a truncated
            write), is not valid JSON, nests too deeply, or holds something else than an object.
    """
    import json

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JsonFileError(f"cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise JsonFileError("is not UTF-8 text") from None
    if not text.strip():
        raise JsonFileError("is empty (truncated write?)")
    try:
        data = json.loads(text)
    except RecursionError:
        raise JsonFileError(f"is not {what}: its JSON nests too deeply") from None
    except json.JSONDecodeError as exc:
        stripped = text.strip()
        if exc.pos >= len(stripped) or (stripped.startswith("{") and not stripped.endswith("}")):
            raise JsonFileError(f"is truncated: JSON ends early (line {exc.lineno})") from None
        raise JsonFileError(f"is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    if not isinstance(data, dict):
        raise JsonFileError("is not a JSON object")
    return data
