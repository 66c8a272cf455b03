"""Where a MuJoCo camera images world points: the pinhole model behind grounding supervision.

Used by the built-in scene (``SimCore.project``) and by Meta-World (``metaworld.points_uv``), whose
datasets record where the first camera images the grounding points
(``observation.environment_uv.<camera>``) so ``model.grounding.attend_weight`` can supervise where
the grounding head looks.
"""

from __future__ import annotations

import numpy as np


def pinhole_uv(points: np.ndarray, cam_pos: np.ndarray, cam_mat: np.ndarray, fovy_deg: float) -> np.ndarray:
    """World points [..., 3] (metres) -> float32 [..., 2] (u, v) as fractions of a square image
    (u right, v down; the image is [0, 1]^2); a point behind the camera gets (-1, -1).

    ``cam_pos`` [3] and ``cam_mat`` [3, 3] (columns: the camera's axes in world coordinates) are
    MuJoCo's ``data.cam_xpos`` / ``data.cam_xmat``; the camera looks along its -z with y up and a
    vertical field of view ``fovy_deg``."""
    pts = np.asarray(points, np.float64)
    assert pts.shape[-1] == 3, pts.shape
    local = (pts - np.asarray(cam_pos, np.float64)) @ np.asarray(cam_mat, np.float64).reshape(3, 3)
    depth = -local[..., 2]
    f = 0.5 / np.tan(np.radians(fovy_deg) / 2)
    safe = np.where(depth > 1e-6, depth, 1.0)
    uv = np.stack([0.5 + f * local[..., 0] / safe, 0.5 - f * local[..., 1] / safe], -1)
    return np.where((depth > 1e-6)[..., None], uv, -1.0).astype(np.float32)
