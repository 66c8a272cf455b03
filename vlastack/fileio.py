"""Reading the files a user hands us, with errors that name the file.

A truncated ``model.safetensors`` or a hand-edited ``config.json`` raises, from the libraries,
``SafetensorError: HeaderTooLarge`` or ``Expecting ',' delimiter: line 3 column 5 (char 41)``: true,
but the user cannot tell which of a dozen files is broken. These helpers raise ``BadFileError``
(a ``ValueError``, so ``vla`` prints it as one line) whose message starts with the path. A missing
file stays ``FileNotFoundError`` (which names the path already).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class BadFileError(ValueError):
    """A file exists but cannot be parsed: truncated, corrupt, or not the format its name says."""

    def __init__(self, path: str | Path, what: str, detail: str) -> None:
        self.path, self.what, self.detail = Path(path), what, detail
        super().__init__(f"{path}: {what} ({detail})"[:600])

    def __reduce__(self) -> tuple:  # picklable: evaluation workers send their errors back
        return (type(self), (str(self.path), self.what, self.detail))


def read_json(path: str | Path) -> Any:
    """``json.loads`` of a UTF-8 file; ``BadFileError`` naming the file if it does not parse."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise BadFileError(path, "is not valid JSON (not UTF-8 text)", str(e)[:120]) from None
    except json.JSONDecodeError as e:
        raise BadFileError(path, f"is not valid JSON at line {e.lineno} column {e.colno}", e.msg) from None


def read_yaml(path: str | Path) -> Any:
    """``yaml.safe_load`` of a file; ``BadFileError`` naming the file and line if it does not parse."""
    import yaml

    path = Path(path)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise BadFileError(path, "is not valid YAML (not UTF-8 text)", str(e)[:120]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise BadFileError(path, f"is not valid YAML{where}", str(problem)) from None


def _safetensors_error(path: Path, e: Exception) -> BadFileError:
    return BadFileError(
        path, "is not a valid safetensors file (truncated or corrupt?)", f"{type(e).__name__}: {e}"[:200]
    )


def load_safetensors(path: str | Path, device: str = "cpu") -> dict:
    """``safetensors.torch.load_file`` with a ``BadFileError`` naming a truncated or garbage file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    try:
        return load_file(str(path), device=device)
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:  # torch raises on bad offsets
        raise _safetensors_error(path, e) from None


def open_safetensors(path: str | Path) -> Any:
    """``safetensors.safe_open(path, framework="pt")``, failing with a ``BadFileError`` naming the file.

    Only the header is read here; a file cut short past its header fails on ``get_tensor`` (wrap
    those reads with ``safetensors_read_error``)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise _safetensors_error(path, e) from None


def safetensors_read_error(path: str | Path, e: Exception) -> BadFileError:
    """The ``BadFileError`` for a tensor read that failed in ``path`` (``raise ... from None``)."""
    return _safetensors_error(Path(path), e)
