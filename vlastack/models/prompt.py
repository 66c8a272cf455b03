"""Prompts with the robot state written into them (Pi0.5, ``model.head_options.variant='pi05'``).

    pi05_prompt("pick up the cube", state)   # "Task: pick up the cube, State: 128 0 255;\\nAction: "
    ids, mask = tokenize_prompt(tokenizer, task, state, max_len=200, state_in_prompt=True)

As openpi (``PaligemmaTokenizer.tokenize``) and LeRobot (``Pi05PrepareStateTokenizerProcessorStep``)
do it: the normalized state (values in [-1, 1], the env's own dims, not the zero padding) is cut
into 256 uniform bins with ``np.digitize(state, linspace(-1, 1, 257)[:-1]) - 1``, with no
clipping, so a value below -1 becomes -1 and a value at or above 1 becomes 255.
"""

from __future__ import annotations

import numpy as np

from vlastack.models.tokenizer import clean_prompt

STATE_BINS = 256
# RECAP's advantage indicator, written into the prompt (pi*0.6, arXiv 2511.14759; rl/recap.py):
# ``model.advantage_conditioning`` trains on both and serves "positive".
ADVANTAGE_TEXT = {True: "Advantage: positive\n", False: "Advantage: negative\n"}


def discretize_state(state: np.ndarray, bins: int = STATE_BINS) -> np.ndarray:
    """Normalized state [S] -> int64 [S] bin indices (-1 below -1, ``bins - 1`` at or above 1)."""
    edges = np.linspace(-1, 1, bins + 1)[:-1]
    return (np.digitize(np.asarray(state, dtype=np.float32), bins=edges) - 1).astype(np.int64)


def pi05_prompt(task: str, state: np.ndarray, advantage: bool | None = None) -> str:
    """The Pi0.5 prompt: ``"Task: {task}, State: {bins};\\nAction: "`` (task cleaned as openpi does);
    with an ``advantage`` indicator, its line goes before ``"Action: "``."""
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    adv = "" if advantage is None else ADVANTAGE_TEXT[advantage]
    return f"Task: {cleaned}, State: {' '.join(map(str, discretize_state(state)))};\n{adv}Action: "


def pi05_prompt_len(tokenizer, task: str, state: np.ndarray, advantage: bool | None = None) -> int:
    """Tokens of the Pi0.5 prompt for ``task`` and normalized ``state``; an all-ones state gives
    the longest one (every bin "255")."""
    return len(tokenizer.encode(pi05_prompt(task, state, advantage)))


def tokenize_prompt(
    tokenizer,
    task: str,
    state: np.ndarray | None,
    max_len: int,
    state_in_prompt: bool,
    advantage: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """-> ids int64 [max_len] (right-padded, truncated) and mask bool [max_len] for one sample.

    ``state_in_prompt``: the Pi0.5 prompt from ``task`` and the normalized, unpadded ``state``;
    otherwise the tokenizer's own prompt handling of ``task`` (Pi0). ``advantage`` (RECAP,
    ``model.advantage_conditioning``): the indicator's line follows the instruction; a Pi0 prompt
    too long for both loses the end of its instruction, never the indicator.
    """
    if not state_in_prompt:
        if advantage is None:
            return tokenizer.tokenize(task, max_len)
        tail = tokenizer.encode("\n" + ADVANTAGE_TEXT[advantage], bos=False)
        if len(tail) >= max_len:
            raise ValueError(
                f"max_text_len {max_len} cannot hold the advantage indicator ({len(tail)} tokens)"
            )
        # "<instruction>\nAdvantage: positive\n", the instruction cut first when both do not fit
        ids = tokenizer.encode(clean_prompt(task).rstrip("\n"))[: max_len - len(tail)] + tail
    else:
        assert state is not None, "a state-in-prompt model needs the state to build its prompt"
        ids = tokenizer.encode(pi05_prompt(task, state, advantage))[:max_len]
    out = np.full(max_len, tokenizer.pad_id, dtype=np.int64)
    out[: len(ids)] = ids
    mask = np.zeros(max_len, dtype=bool)
    mask[: len(ids)] = True
    return out, mask
