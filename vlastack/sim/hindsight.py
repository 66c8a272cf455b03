"""Grounding labels from a demonstration's own columns (hindsight), instead of the simulator's.

``model.grounding`` regresses two points per frame, the task's object and its goal. Meta-World's
recorded ``observation.environment_state`` holds them, but LeRobot's ``lerobot/metaworld_mt50``
does not: a policy trained on it must not see them (issue #64). The demonstrations say where both
were all the same, through the end effector (``observation.state`` 0:3) and the gripper command
(``action`` 3):

- **object**: where the hand was when the gripper first closed (the command rises above its
  first value), and from then on where the hand is (the object moves with it);
- **goal**: where the hand was at the episode's last frame.

On an episode whose gripper command never changes (reach, drawer, button, window tasks) both
points are the last frame's hand. On the MT10 demonstrations the labels differ from the simulator's
object and goal by a per-task offset (the hand holds the object above its centre; the expert stops
a few cm from the goal) whose spread across layouts is 0.1-1.2 cm, against 3-7 cm of layout spread
(docs/research/metaworld.md).

``hindsight_dataset`` writes a copy of a dataset whose ``observation.environment_state`` is these
6 numbers (object x, y, z, goal x, y, z) and whose ``observation.environment_uv.<camera>`` is
where the camera images them, the columns the grounding recipe reads: the simulator's 39-d state
is gone from the copy, so a policy trained on it cannot have seen it. Videos are hard links.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

NAMES = ["hindsight_object_x", "hindsight_object_y", "hindsight_object_z",
         "hindsight_goal_x", "hindsight_goal_y", "hindsight_goal_z"]  # fmt: skip
CLOSE_MARGIN = 0.1  # the gripper command must rise this much above its first value to count


def hindsight_points(state: np.ndarray, action: np.ndarray, episode: np.ndarray) -> np.ndarray:
    """Per frame -> float32 [N, 6] (object xyz, goal xyz) from state [N, >=3] (hand xyz first),
    action [N, >=4] (gripper command at 3) and episode indices [N] or [N, 1]; each episode's frames
    must be contiguous and in time order (as a LeRobot data file stores them)."""
    state, action = np.asarray(state, np.float64), np.asarray(action, np.float64)
    episode = np.asarray(episode).reshape(-1)
    n = len(episode)
    if state.ndim != 2 or state.shape[0] != n or state.shape[1] < 3:
        raise ValueError(f"state must be [N, >=3] with N={n} frames, got {state.shape}")
    if action.ndim != 2 or action.shape[0] != n or action.shape[1] < 4:
        raise ValueError(f"action must be [N, >=4] with N={n} frames, got {action.shape}")
    out = np.empty((n, 6), np.float64)
    starts = np.flatnonzero(np.r_[True, episode[1:] != episode[:-1]])
    ends = np.r_[starts[1:], n]
    if len(np.unique(episode[starts])) != len(starts):
        raise ValueError("an episode's frames are not contiguous")
    for lo, hi in zip(starts, ends, strict=True):
        hand, grip = state[lo:hi, :3], action[lo:hi, 3]
        last = hand[-1]
        closed = np.flatnonzero(grip > grip[0] + CLOSE_MARGIN)
        obj = np.repeat(last[None], hi - lo, 0)
        if len(closed):
            t = closed[0]
            obj[:t] = hand[t]
            obj[t:] = hand[t:]
        out[lo:hi, :3] = obj
        out[lo:hi, 3:] = last
    return out.astype(np.float32)


def hindsight_dataset(src: str | Path, dst: str | Path) -> dict:
    """Copy the Meta-World dataset at ``src`` to ``dst`` with hindsight grounding labels in place
    of the simulator's (module docstring) -> the new ``observation.environment_state`` feature.
    ``dst`` must not exist; videos are hard-linked (copied where links fail)."""
    from vlastack.data.edit import write_new_dataset
    from vlastack.data.format import load_info
    from vlastack.data.samples import ACTION_KEY, STATE_KEY

    src = Path(src)
    info = load_info(src)
    feats = info["features"]
    for k in (STATE_KEY, ACTION_KEY, "episode_index"):
        if k not in feats:
            raise ValueError(f"{src}: needs {k!r} for hindsight labels; it has {sorted(feats)}")
    return write_new_dataset(dst, lambda tmp: _fill(src, tmp, feats), "hindsight_dataset")


def _fill(src: Path, tmp: Path, feats: dict) -> dict:
    """``hindsight_dataset``'s work, into ``tmp``."""
    from vlastack.data.edit import add_feature, copy_dataset_files
    from vlastack.data.samples import ACTION_KEY, ENV_KEY, ENV_UV_KEY, STATE_KEY
    from vlastack.sim.generate import ENV_UV_NAMES
    from vlastack.sim.metaworld import fixed_camera, project

    copy_dataset_files(src, tmp)
    inputs = [STATE_KEY, ACTION_KEY, "episode_index"]
    ft = add_feature(
        tmp, ENV_KEY, inputs, lambda c: hindsight_points(c[STATE_KEY], c[ACTION_KEY], c["episode_index"]),
        overwrite=True, names=NAMES,
    )  # fmt: skip
    cams = [k for k, f in feats.items() if f["dtype"] in ("video", "image")]
    stale = [k for k in feats if k.startswith(ENV_UV_KEY + ".")]
    for cam in [k.rsplit(".", 1)[-1] for k in cams]:
        if fixed_camera(cam):
            key = f"{ENV_UV_KEY}.{cam}"
            add_feature(tmp, key, [ENV_KEY],
                        lambda c, cam=cam: project(c[ENV_KEY].reshape(-1, 2, 3), cam).reshape(-1, 4),
                        overwrite=True, names=ENV_UV_NAMES)  # fmt: skip
            stale = [k for k in stale if k != key]
    if stale:  # a camera without a fixed projection: its simulator uv must not stay behind
        raise ValueError(f"{src}: cannot recompute {stale} from hindsight points")
    return ft
