"""``ConfigError`` and the checks every config dataclass (a head's options included) uses."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config key has an invalid value or does not exist. ``key`` is the dotted path."""

    def __init__(self, key: str, msg: str):
        self.key, self.msg = key, msg
        super().__init__(f"{key}: {msg}" if key else msg)

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str]]:
        # The default rebuilds from self.args (one string) and fails on a 2-argument __init__, so an
        # error raised in an eval worker process would reach the parent as a dead worker instead.
        return type(self), (self.key, self.msg)


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(key, msg)


def _positive(obj: Any, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        _check(v > 0, n, f"must be > 0, got {v!r}")
