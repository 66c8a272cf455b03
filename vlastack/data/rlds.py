"""RLDS (TFDS-built) datasets without TensorFlow, and their conversion to LeRobot v3.

A TFDS RLDS folder holds ``dataset_info.json``, ``features.json`` and TFRecord shards named like
``<name>-<split>.tfrecord-00000-of-00004``. Each record is one episode, a ``tf.train.Example``
whose features are the flattened episode: ``steps/observation/<cam>`` (encoded JPEG/PNG, one per
step), ``steps/observation/state``, ``steps/action`` (floats, T * dim), ``steps/language_instruction``
(bytes per step), ``steps/is_first`` / ``steps/is_last`` (int64), plus ``episode_metadata/...``.
Shapes come from ``features.json`` when present, otherwise they are inferred from the step count.

    vla data convert --from rlds SRC --out DST [--fps 10] [--images video|image]
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from vlastack.data.reader import decode_image_bytes
from vlastack.data.tfrecord import encode_example, parse_example, read_tfrecord, write_tfrecord

_IMG_MAGIC = (b"\x89PNG", b"\xff\xd8\xff")


def _walk(node: dict, prefix: str, out: dict[str, dict[str, Any]]) -> None:
    if "featuresDict" in node:
        for name, sub in node["featuresDict"]["features"].items():
            _walk(sub, f"{prefix}/{name}" if prefix else name, out)
    elif "sequence" in node:
        _walk(node["sequence"]["feature"], prefix, out)
    elif "image" in node:
        dims = [int(d) for d in node["image"].get("shape", {}).get("dimensions", [])]
        out[prefix] = {"kind": "image", "shape": dims, "format": node["image"].get("encodingFormat", "")}
    elif "tensor" in node:
        dims = [int(d) for d in node["tensor"].get("shape", {}).get("dimensions", [])]
        out[prefix] = {"kind": "tensor", "shape": dims, "dtype": node["tensor"].get("dtype", "float32")}
    elif "text" in node:
        out[prefix] = {"kind": "text", "shape": []}


def read_features_json(root: Path) -> dict[str, dict[str, Any]] | None:
    """Flattened feature specs {"steps/observation/image": {"kind": "image", "shape": [H,W,3]}, ...}."""
    p = root / "features.json"
    if not p.is_file():
        return None
    try:
        out: dict[str, dict[str, Any]] = {}
        _walk(json.loads(p.read_text()), "", out)
        return out
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{p}: cannot parse TFDS features ({e})") from None


def shard_files(root: str | Path, split: str = "train") -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory")
    files = sorted(root.glob(f"*-{split}.tfrecord*")) or sorted(root.glob("*.tfrecord*"))
    files = [f for f in files if not f.name.endswith(".partial")]
    if not files:
        raise ValueError(f"{root}: no TFRecord shards (*-{split}.tfrecord-*) found")
    return files


def _num_steps(ex: dict[str, Any], where: str) -> int:
    for k in ("steps/is_first", "steps/is_last"):
        if k in ex:
            return len(ex[k])
    raise ValueError(f"{where}: episode has no steps/is_first or steps/is_last to count steps")


def decode_episode(ex: dict[str, Any], specs: dict[str, dict] | None, where: str) -> dict[str, Any]:
    """Parsed Example -> {key: array [T, ...] | list[bytes]}, shapes checked against ``specs``."""
    t = _num_steps(ex, where)
    out: dict[str, Any] = {"_steps": t}
    for key, val in ex.items():
        if not key.startswith("steps/"):
            continue
        spec = (specs or {}).get(key)
        if isinstance(val, list):
            if len(val) != t and (spec is None or spec["kind"] != "text"):
                raise ValueError(f"{where}: {key} has {len(val)} values for {t} steps")
            out[key] = val
            continue
        shape = spec["shape"] if spec else ([len(val) // t] if len(val) != t else [])
        size = int(np.prod(shape)) if shape else 1
        if len(val) != t * size:
            raise ValueError(f"{where}: {key} has {len(val)} values, expected {t} steps x {shape}")
        out[key] = val.reshape(t, *shape) if shape else val
    return out


def iter_episodes(root: str | Path, split: str = "train") -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ("file: episode i", decoded episode) for every record of every shard."""
    root = Path(root)
    specs = read_features_json(root)
    for f in shard_files(root, split):
        for i, rec in enumerate(read_tfrecord(f)):
            where = f"{f}: episode {i}"
            try:
                ex = parse_example(rec)
            except ValueError as e:
                raise ValueError(f"{where}: bad tf.train.Example ({e})") from None
            yield where, decode_episode(ex, specs, where)


def _images(val: list[bytes], where: str, key: str) -> np.ndarray:
    frames = []
    for s, b in enumerate(val):
        if not b.startswith(_IMG_MAGIC):
            raise ValueError(f"{where}: {key} step {s} is not PNG/JPEG data")
        try:
            frames.append(decode_image_bytes(b))
        except OSError as e:
            raise ValueError(f"{where}: {key} step {s}: cannot decode image ({e})") from None
    shapes = {f.shape for f in frames}
    if len(shapes) != 1:
        raise ValueError(f"{where}: {key} images change size within the episode: {sorted(shapes)}")
    return np.stack(frames)


def convert_rlds_to_lerobot(
    src: str | Path,
    dst: str | Path,
    fps: int = 10,
    images: str = "video",
    state_key: str = "steps/observation/state",
    action_key: str = "steps/action",
    instruction_key: str = "steps/language_instruction",
    split: str = "train",
    robot_type: str | None = None,
    progress: bool = True,
) -> int:
    """Convert an RLDS folder to a LeRobot v3 dataset at ``dst``; returns the episode count.

    ``progress``: show a live count of converted episodes (episodes/s)."""
    from vlastack.data.lerobot import LeRobotWriter
    from vlastack.progress import track

    if images not in ("video", "image"):
        raise ValueError(f"images must be 'video' or 'image', got {images!r}")
    writer, n = None, 0
    try:
        for where, ep in track(iter_episodes(src, split), desc="convert", unit="episode", enabled=progress):
            for k in (state_key, action_key):
                if k not in ep:
                    have = sorted(k2 for k2 in ep if not k2.startswith("_"))
                    raise ValueError(f"{where}: missing key {k!r} (has {have})")
            data = {
                "observation.state": np.asarray(ep[state_key], np.float32).reshape(ep["_steps"], -1),
                "action": np.asarray(ep[action_key], np.float32).reshape(ep["_steps"], -1),
            }
            for k, v in ep.items():
                if (
                    k.startswith("steps/observation/")
                    and isinstance(v, list)
                    and v
                    and v[0].startswith(_IMG_MAGIC)
                ):
                    data["observation.images." + k.split("/")[-1]] = _images(v, where, k)
            task = "do the task"
            if ep.get(instruction_key):
                task = ep[instruction_key][0].decode("utf-8", errors="replace").strip() or task
            if writer is None:
                features = {
                    k: {"dtype": images, "shape": list(v.shape[1:]), "names": ["height", "width", "channels"]}
                    if k.startswith("observation.images.")
                    else {"dtype": "float32", "shape": [v.shape[1]], "names": None}
                    for k, v in data.items()
                }
                writer = LeRobotWriter(dst, fps=fps, features=features, robot_type=robot_type)
            try:
                writer.add_episode(data, task=task)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            n += 1
        if writer is None:
            raise ValueError(f"{src}: no episodes found")
        writer.finalize()
    except BaseException:
        if writer is not None and not writer._closed:
            writer.abort()
        raise
    return n


def _png(img: np.ndarray, fmt: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG" if fmt == "png" else "JPEG", quality=95)
    return buf.getvalue()


def write_rlds(
    root: str | Path,
    episodes: list[dict[str, Any]],
    name: str = "toy_rlds",
    image_format: str = "png",
    shards: int = 1,
    features_json: bool = True,
) -> list[Path]:
    """Write a TFDS-style RLDS folder (for tests and tools). Each episode: {"images": {cam: uint8
    [T,H,W,3]}, "state": f32 [T,S], "action": f32 [T,A], "instruction": str}."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    ep0 = episodes[0]

    def tensor(shape: list[int], dtype: str = "float32") -> dict:
        return {"pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
                "tensor": {"shape": {"dimensions": [str(s) for s in shape]}, "dtype": dtype, "encoding": "none"}}  # fmt: skip

    def fdict(d: dict) -> dict:
        return {"pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
                "featuresDict": {"features": d}}  # fmt: skip

    obs = {cam: {"pythonClassName": "tensorflow_datasets.core.features.image_feature.Image",
                 "image": {"shape": {"dimensions": [str(s) for s in im.shape[1:]]}, "dtype": "uint8",
                           "encodingFormat": image_format}} for cam, im in ep0["images"].items()}  # fmt: skip
    obs["state"] = tensor([ep0["state"].shape[1]])
    step = fdict({
        "observation": fdict(obs), "action": tensor([ep0["action"].shape[1]]),
        "language_instruction": {"pythonClassName": "tensorflow_datasets.core.features.text_feature.Text", "text": {}},
        "is_first": tensor([], "bool"), "is_last": tensor([], "bool"), "is_terminal": tensor([], "bool"),
        "reward": tensor([], "float32"),
    })  # fmt: skip
    feats = fdict({"steps": {"pythonClassName": "tensorflow_datasets.core.features.dataset_feature.Dataset",
                             "sequence": {"feature": step, "length": "-1"}}})  # fmt: skip
    if features_json:
        (root / "features.json").write_text(json.dumps(feats, indent=2))
    per = np.array_split(np.arange(len(episodes)), shards)
    files = []
    for s, idx in enumerate(per):
        recs = []
        for i in idx:
            ep = episodes[int(i)]
            t = len(ep["action"])
            ex: dict[str, Any] = {f"steps/observation/{c}": [_png(f, image_format) for f in im]
                                  for c, im in ep["images"].items()}  # fmt: skip
            first = np.zeros(t, np.int64)
            first[0] = 1
            ex.update({
                "steps/observation/state": np.asarray(ep["state"], np.float32).reshape(-1),
                "steps/action": np.asarray(ep["action"], np.float32).reshape(-1),
                "steps/language_instruction": [ep["instruction"]] * t,
                "steps/is_first": first, "steps/is_last": first[::-1].copy(), "steps/is_terminal": first[::-1].copy(),
                "steps/reward": np.zeros(t, np.float32),
            })  # fmt: skip
            recs.append(encode_example(ex))
        f = root / f"{name}-train.tfrecord-{s:05d}-of-{shards:05d}"
        write_tfrecord(f, recs)
        files.append(f)
    info = {"name": name, "version": "1.0.0", "fileFormat": "tfrecord", "moduleName": name,
            "splits": [{"name": "train", "shardLengths": [str(len(p)) for p in per],
                        "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"}]}  # fmt: skip
    (root / "dataset_info.json").write_text(json.dumps(info, indent=2))
    return files
