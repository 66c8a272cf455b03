"""Action chunking: one action per control step from a policy that predicts chunks of H actions.

    chunker = ActionChunker(replan_steps=4, temporal_ensemble=0.0)
    chunker.reset()                                   # at the start of each episode
    action = chunker.step(lambda: policy_chunk(obs))  # [A]; calls the policy only when re-planning

Used by ``Policy.select_action`` (serving, robots) and by the simulator's evaluator, so both run
chunks the same way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np


class ActionChunker:
    """Re-plans every ``replan_steps`` steps (or when the newest chunk runs out).

    With ``temporal_ensemble = m > 0`` every chunk still covering the current step votes with
    weight ``exp(-m * i)``, i = 0 for the oldest (ACT's convention), which smooths chunk
    boundaries; otherwise the newest chunk's action is used.
    """

    def __init__(self, replan_steps: int, temporal_ensemble: float = 0.0) -> None:
        if replan_steps < 1:
            raise ValueError(f"replan_steps must be >= 1, got {replan_steps}")
        if temporal_ensemble < 0:
            raise ValueError(f"temporal_ensemble must be >= 0, got {temporal_ensemble}")
        self.replan_steps, self.temporal_ensemble = replan_steps, temporal_ensemble
        self.reset()

    def reset(self) -> None:
        """Forget queued chunks (call at the start of each episode)."""
        self.t = 0
        self.chunks: deque[tuple[int, np.ndarray]] = deque()  # (step predicted at, [H, A])

    def needs_chunk(self) -> bool:
        """Whether this step must query the policy for a new chunk."""
        if not self.chunks:
            return True
        t0, chunk = self.chunks[-1]
        return self.t - t0 >= min(self.replan_steps, len(chunk))

    def add(self, chunk: np.ndarray) -> None:
        """A chunk [H, A] predicted at the current step."""
        self.chunks.append((self.t, chunk))

    def next_action(self) -> np.ndarray:
        """The current step's action [A]; advances to the next step."""
        t = self.t
        while self.chunks and t - self.chunks[0][0] >= len(self.chunks[0][1]):
            self.chunks.popleft()  # no longer covers this step
        if not self.chunks:
            raise ValueError(f"no chunk covers step {t}; call add() when needs_chunk() is True")
        if self.temporal_ensemble > 0:
            w = np.exp(-self.temporal_ensemble * np.arange(len(self.chunks)))
            acts = np.stack([c[t - t0] for t0, c in self.chunks])
            action = (w[:, None] * acts).sum(0) / w.sum()
        else:
            t0, chunk = self.chunks[-1]
            action = chunk[t - t0]
        self.t += 1
        return action

    def step(self, predict: Callable[[], np.ndarray]) -> np.ndarray:
        """``predict() -> [H, A]`` is called only when re-planning. -> this step's action [A]."""
        if self.needs_chunk():
            self.add(predict())
        return self.next_action()
