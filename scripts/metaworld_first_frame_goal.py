"""Where does the first frame of a Meta-World episode draw the goal, in LeRobot 0.6.1's own env?

Meta-World's reset moves the goal site (``model.site_pos``) but runs no forward pass, so the
site's world position (``data.site_xpos``), which the renderer draws, stays where the previous
layout put it until the first step. vlastack's wrapper renders the same way (its data and its
evaluation match LeRobot's). This checks it in LeRobot's ``MetaworldEnv``: push-v3's green goal
marker's centroid in the reset frame and after one zero action, against the true goal's image
position (``vlastack.sim.metaworld.points_uv``). Run in the LeRobot venv from the repo root:

    MUJOCO_GL=egl PYTHONPATH=. /work/lrvenv/bin/python scripts/metaworld_first_frame_goal.py
"""

import lerobot  # noqa: F401  (before any renderer is made: triton's import crashes after one)
import numpy as np
from lerobot.envs.metaworld import MetaworldEnv

from vlastack.sim.metaworld import points_uv


def green_centroid(img: np.ndarray) -> tuple[float, float]:
    im = img.astype(int)
    ys, xs = np.nonzero((im[..., 1] > 120) & (im[..., 0] < 80) & (im[..., 2] < 80))
    return (xs.mean() + 0.5) / im.shape[1], (ys.mean() + 0.5) / im.shape[0]


def main() -> None:
    env = MetaworldEnv("push-v3", obs_type="pixels_agent_pos")
    for seed in (3, 1001):
        first = env.reset(seed=seed)[0]["pixels"]
        second = env.step(np.zeros(4, np.float32))[0]["pixels"]
        goal = points_uv(np.asarray(env._env._get_obs(), np.float64))[2:]
        for name, img in (("reset frame", first), ("after one step", second)):
            u, v = green_centroid(img)
            print(
                f"seed {seed} {name}: goal marker at ({u:.3f}, {v:.3f}); true goal ({goal[0]:.3f}, {goal[1]:.3f})"
            )
    env.close()


if __name__ == "__main__":
    main()
