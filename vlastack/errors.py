"""The errors ``vla`` explains in one line instead of a traceback (see ``vlastack.cli.main``).

``explain(exc)`` returns ``(message, exit code)`` for an error the user can act on (a bad or
missing file, an invalid value, a full disk, a missing OpenGL library, a diverged run, a dead
evaluation worker), or ``None`` for anything else: an unknown exception is a bug and keeps its
traceback. Exit code 2 = the input is wrong, 1 = the run failed, 130 = interrupted, 143 = stopped
by SIGTERM (after saving a checkpoint, ``TrainingStopped``).

Nothing here imports torch or the layers: classes from other layers are recognised by name, so
``vla --help`` stays fast and this module stays a leaf.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

# RuntimeError subclasses whose message is already complete for the user (raised by the layers).
RUN_FAILURES = frozenset({"TrainingDiverged", "EvalWorkerError"})

DISK_FULL = (
    "no space left on device{where}: free some space or write elsewhere (--out); a checkpoint "
    "interrupted by this is removed when training starts again, and --resume continues from the last "
    "complete one"
)
GL_HINT = (
    "MuJoCo cannot render (MUJOCO_GL={gl}): {detail}. Install a headless OpenGL library "
    "(`apt-get install -y libosmesa6` or `libegl1`; scripts/setup.sh does this), or unset MUJOCO_GL "
    "so that vla picks one that works"
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _names(exc: BaseException) -> set[str]:
    return {c.__name__ for c in type(exc).__mro__}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:400]


def _is_disk_full(e: BaseException) -> bool:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)  # safetensors/torch wrap the OS error in their own exception types
    return "No space left on device" in text or "StorageFull" in text


def _is_gl(e: BaseException) -> bool:
    mod = type(e).__module__ or ""
    text = str(e)
    if mod.startswith(("OpenGL", "glfw")):
        return True
    if mod.startswith("mujoco") and "OpenGL" in text:
        return True
    if isinstance(e, ImportError | OSError) and any(s in text for s in ("OSMesa", "libEGL", "libGL")):
        return True
    return "no headless OpenGL backend works" in text


def explain(exc: BaseException) -> tuple[str, int] | None:
    """One line (without the ``error: `` prefix) and an exit code, or None: show the traceback."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (training keeps its last complete checkpoint: continue with --resume)", 130
    chain = list(_chain(exc))
    for e in chain:
        if _is_disk_full(e):
            name = getattr(e, "filename", None)
            need = getattr(e, "needed_bytes", None)
            where = f" (writing {name}" + (f", about {need / 2**20:.1f} MiB needed)" if need else ")")
            return DISK_FULL.format(where=where if name else ""), 1
    for e in chain:
        if _is_gl(e):
            return GL_HINT.format(gl=os.environ.get("MUJOCO_GL", "unset"), detail=_first_line(e)), 1
    if "TrainingStopped" in _names(exc):  # a stop signal, after a checkpoint: 128 + the signal
        return _first_line(exc), int(getattr(exc, "exit_code", 1))
    if _names(exc) & RUN_FAILURES:
        return _first_line(exc), 1
    if isinstance(exc, FileNotFoundError):
        return f"no such file or folder: {exc.filename or _first_line(exc)}", 2
    if isinstance(exc, IsADirectoryError | NotADirectoryError | PermissionError):
        return f"{exc.strerror or type(exc).__name__}: {exc.filename or _first_line(exc)}", 2
    if isinstance(exc, MemoryError):
        return "out of memory: use a smaller preset, batch size or dataset (data.preload=false)", 1
    if "SafetensorError" in _names(exc):  # a reader that does not name its file yet
        return f"a .safetensors file is truncated or corrupt: {_first_line(exc)}", 2
    if "YAMLError" in _names(exc):  # e.g. an override value that is not valid YAML
        return f"invalid YAML: {_first_line(exc)}", 2
    if isinstance(exc, ValueError):  # user mistakes: the message says what and where
        return str(exc).strip() or type(exc).__name__, 2
    return None
