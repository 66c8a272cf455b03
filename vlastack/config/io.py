"""(De)serialization: dataclass tree <-> dict/YAML, packaged recipes, dotted overrides, and
``load_config`` (preset -> YAML -> overrides)."""

from __future__ import annotations

import contextlib
import types
import typing
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from vlastack.config.errors import ConfigError
from vlastack.config.heads import HEAD_SPECS
from vlastack.config.presets import PRESETS, VARIANT_DEFAULTS
from vlastack.config.schema import Config, ModelConfig

# Where the heads' options lived before ``model.head_options`` held them all (flow: loose
# ``model.*`` fields; tokens: ``model.tokens``): configs and checkpoints written then load as they
# were, and the old override spellings (``model.num_denoise_steps=5``, ``model.variant=pi05``)
# still work. (Every saved config has ``variant``: for a head other than flow it is dropped.)
LEGACY_HEAD_KEYS = {
    "variant": "flow",
    "num_denoise_steps": "flow",
    "noise_scale": "flow",
    "time_min_period": "flow",
    "time_max_period": "flow",
    "tokens": "tokens",
}


def _legacy_head_keys(data: dict, head: str, prefix: str, strict: bool) -> dict:
    """A ``model`` mapping with its ``LEGACY_HEAD_KEYS`` moved into ``head_options`` (keys given
    there win). Another head's legacy key: dropped from a saved config (that model never used it),
    a ``ConfigError`` in an override (``strict``), which would otherwise be a silent no-op."""
    old = [k for k in data if k in LEGACY_HEAD_KEYS]
    if not old:
        return data
    data, moved = dict(data), {}
    for k in old:
        value, owner = data.pop(k), LEGACY_HEAD_KEYS[k]
        key = f"{prefix}.{k}" if prefix else k
        if owner != head:
            if strict:
                raise ConfigError(key, f"is an option of head {owner!r}; this model's head is {head!r}")
            continue
        if k == "tokens":
            if not isinstance(value, dict):
                raise ConfigError(key, f"expected a mapping, got {value!r}")
            moved.update(value)
        else:
            moved[k] = value
    opts = data.get("head_options")
    if isinstance(opts, dict) or opts is None:
        data["head_options"] = {**moved, **(opts or {})}
    return data


def to_dict(cfg: Any) -> Any:
    """Dataclass tree -> plain dict (tuples become lists) for YAML/JSON."""
    if is_dataclass(cfg):
        skip = set()
        if isinstance(cfg, ModelConfig) and cfg.head_options is None:
            skip.add("head_options")  # a head without its own options: the key stays out
        if isinstance(cfg, ModelConfig) and cfg.action_representation == "auto":
            skip.add("action_representation")  # unspecified: configs saved before it stay as they were
        return {f.name: to_dict(getattr(cfg, f.name)) for f in fields(cfg) if f.name not in skip}
    if isinstance(cfg, tuple | list):
        return [to_dict(v) for v in cfg]
    return cfg


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the type hint ``tp`` and convert lists to tuples and ints to floats."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(e.msg)
        raise ConfigError(key, "; ".join(errors))
    if origin is tuple:
        args = typing.get_args(tp)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError(key, f"expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(key, f"expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping, got {value!r}")
        return _from_dict(tp, value, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    return value


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _from_dict(cls: type, data: dict, prefix: str = "", base: Any = None) -> Any:
    """Build dataclass ``cls`` from ``data``, on top of ``base`` (an instance) when given."""
    hints = _hints(cls)
    names = {f.name for f in fields(cls)}
    kwargs = {}
    if cls is ModelConfig:
        data = _legacy_head_keys(data, data.get("head", getattr(base, "head", "flow")), prefix, strict=False)
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        if k not in names:
            raise ConfigError(key, f"unknown key; valid keys here: {', '.join(sorted(names))}")
        tp = hints[k]
        if cls is ModelConfig and k == "head_options":
            kwargs[k] = _head_options(data.get("head", getattr(base, "head", "flow")), v, key, base)
        elif is_dataclass(tp) and isinstance(v, dict):
            kwargs[k] = _from_dict(tp, v, key, getattr(base, k) if base is not None else None)
        else:
            kwargs[k] = _coerce(v, tp, key)
    if cls is ModelConfig:
        _switching_heads(kwargs, base)
    return _construct(cls, kwargs, prefix, base)


def _switching_heads(kwargs: dict, base: ModelConfig | None) -> None:
    """A new ``model.head`` on top of ``base`` starts from its own default options, not from the
    previous head's ``head_options``."""
    if "head_options" not in kwargs and base is not None and kwargs.get("head", base.head) != base.head:
        kwargs["head_options"] = None


def _head_options(head: str, value: Any, key: str, base: Any) -> Any:
    """``model.head_options`` of head ``head`` from a mapping, on top of ``base``'s when they are
    the same head's (``HeadSpec.options_cls``)."""
    spec = HEAD_SPECS.get(head)
    if value is None or spec is None:  # an unknown head is reported by ModelConfig itself
        return value
    if spec.options_cls is None:
        raise ConfigError(key, f"head {head!r} takes no head_options")
    if not isinstance(value, dict):
        raise ConfigError(key, f"expected a mapping, got {value!r}")
    cur = getattr(base, "head_options", None)
    return _from_dict(spec.options_cls, value, key, cur if isinstance(cur, spec.options_cls) else None)


def _construct(cls: type, kwargs: dict, prefix: str, base: Any) -> Any:
    try:
        return replace(base, **kwargs) if base is not None else cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{prefix}.{e.key}" if prefix else e.key, e.msg) from None


def from_dict(data: dict, base: Config | None = None) -> Config:
    """Plain dict (e.g. loaded YAML) -> Config, validated; keys not given keep ``base``'s values."""
    if not isinstance(data, dict):
        raise ConfigError("", f"config must be a mapping, got {type(data).__name__}")
    return _from_dict(Config, data, "", base)


def save_yaml(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def packaged_yaml(name: str) -> str | None:
    """The text of a config shipped in the package (``vlastack/configs/<name>.yaml``), or None."""
    from importlib.resources import files

    res = files("vlastack").joinpath("configs", f"{name.removesuffix('.yaml')}.yaml")
    return res.read_text() if res.is_file() else None


def load_yaml(path: str | Path, base: Config | None = None) -> Config:
    """A YAML file, or a packaged config by bare name (``demo``: vlastack/configs/demo.yaml)."""
    return from_dict(_yaml_data(path), base)


def _yaml_data(path: str | Path) -> dict:
    from vlastack.fileio import read_yaml

    p = Path(path)
    packaged = None if p.exists() or len(p.parts) > 1 else packaged_yaml(str(path))
    data = (yaml.safe_load(packaged) if packaged is not None else read_yaml(path)) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config YAML must be a mapping of sections, got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"model.expert.depth=6"`` -> (["model", "expert", "depth"], 6). Values are YAML scalars."""
    if "=" not in text:
        raise ConfigError(text, "override must look like key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(text, "override has an empty key")
    return key.split("."), yaml.safe_load(raw) if raw.strip() else ""


def apply_overrides(cfg: Config, overrides: list[str] | tuple[str, ...]) -> Config:
    """Apply dotted ``key=value`` overrides; unknown keys and bad values raise ``ConfigError``."""
    nested: dict = {}
    for text in overrides:
        path, value = parse_override(text)
        node = nested
        for p in path[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(".".join(path), "conflicts with an earlier override")
        node[path[-1]] = value
    return _apply_nested(cfg, nested, "")


def _apply_nested(obj: Any, nested: dict, prefix: str) -> Any:
    hints = _hints(type(obj))
    names = {f.name for f in fields(obj)}
    kwargs = {}
    if isinstance(obj, ModelConfig):
        nested = _legacy_head_keys(nested, nested.get("head", obj.head), prefix, strict=True)
    for k, v in nested.items():
        key = f"{prefix}.{k}" if prefix else k
        if k not in names:
            raise ConfigError(key, f"unknown key; valid keys here: {', '.join(sorted(names))}")
        cur = getattr(obj, k)
        if isinstance(obj, ModelConfig) and k == "head_options":
            kwargs[k] = _head_options(nested.get("head", obj.head), v, key, obj)
        elif is_dataclass(cur) and isinstance(v, dict):
            kwargs[k] = _apply_nested(cur, v, key)
        else:
            kwargs[k] = _coerce(v, hints[k], key)
    if isinstance(obj, ModelConfig):
        _switching_heads(kwargs, obj)
    return _construct(type(obj), kwargs, prefix, obj)


def load_config(
    preset: str = "tiny", yaml_path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> Config:
    """preset -> YAML on top -> dotted overrides on top. The one way every command builds a config."""
    if preset not in PRESETS:
        raise ConfigError("preset", f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    cfg = PRESETS[preset]()
    data = _yaml_data(yaml_path) if yaml_path is not None else {}
    cfg = _variant_defaults(preset, cfg, data, list(overrides))
    if yaml_path is not None:
        cfg = from_dict(data, cfg)
    return apply_overrides(cfg, list(overrides))


def _variant_defaults(preset: str, cfg: Config, data: dict, overrides: list[str]) -> Config:
    """``presets.VARIANT_DEFAULTS`` for the variant the YAML or overrides pick, where neither sets
    the key itself (so the tiny preset's Pi0.5 has room for its state in the prompt)."""
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    opts = model.get("head_options") if isinstance(model.get("head_options"), dict) else {}
    given = {".".join(path): value for path, value in map(parse_override, overrides)}
    variant = getattr(cfg.model.head_options, "variant", "pi0")
    for found in (model.get("variant"), opts.get("variant"), given.get("model.variant"),
                  given.get("model.head_options.variant")):  # fmt: skip
        variant = found if found is not None else variant  # later wins: YAML, then overrides
    chosen = VARIANT_DEFAULTS.get(preset, {}).get(variant, {})
    keep = {k: v for k, v in chosen.items() if k not in model and f"model.{k}" not in given}
    return replace(cfg, model=replace(cfg.model, **keep)) if keep else cfg


def model_config_from_dict(data: dict) -> ModelConfig:
    return _from_dict(ModelConfig, data, "model")
