"""``Policy``: a trained VLA behind the env-facing interface shared by sim, eval and serving.

    policy = Policy.from_pretrained("runs/train/final")          # folder written by training
    out = policy.infer({"images": {"scene": img}, "state": s, "prompt": "pick the cube"})
    out["actions"]                                               # float32 [H, A_env], env units
    a = policy.select_action(obs)                                # one step, re-plans every n

Policy folder: ``model.safetensors`` + ``config.json`` (``VLA.save_pretrained``), optional
``config.yaml``, ``norm_stats.json`` (the data ``Normalizer``; it fixes the env's unpadded state and
action dims; absent = identity with the model's dims), optional ``ema/`` (same files) and
``action_tokenizer/`` (token head, loaded by ``VLA.from_pretrained``). Everything goes through
``model.sample`` so flow and token heads behave the same here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vlastack.config import ModelConfig
from vlastack.data.stats import ExactNormalizer, Normalizer, stat_dim
from vlastack.infer.chunking import ActionChunker
from vlastack.infer.obs import InputSpec, Obs, ObsError, build_batch, check_obs
from vlastack.models.heads import serving_class
from vlastack.models.prompt import pi05_prompt_len
from vlastack.models.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

STATE_KEY, ACTION_KEY = "observation.state", "action"


def identity_normalizer() -> Normalizer:
    return Normalizer({}, {STATE_KEY: "identity", ACTION_KEY: "identity"})


class Policy:
    """A VLA + normalizer + tokenizer. Thread-safe: one forward pass at a time (``self.lock``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        normalizer: Normalizer | ExactNormalizer | None = None,
        tokenizer: Any = None,
        *,
        device: str | torch.device = "cpu",
        dtype: str | None = None,
        compile: bool = False,
        replan_steps: int | None = None,
        temporal_ensemble: float = 0.0,
        default_prompt: str = "",
        seed: int | None = None,
        preprocess: Any = None,
        **head_options: Any,
    ) -> None:
        """``head_options``: how the head serves, asked of the head (its spec's ``serving``,
        models/heads/serving.py): the flow head's ``fast``, ``compile_mode``, ``compile_scope``,
        ``guidance``, ``guidance_max``, ``bid_samples``, ``bid_noise_scale``; the token and flow
        heads' ``decoding`` ({key: value} of their ``DECODING``: temperature, step_noise...).
        Another head's option is accepted at its default and refused otherwise."""
        if dtype not in (None, "fp32", "bf16"):
            raise ValueError(f"dtype must be None, 'fp32' or 'bf16', got {dtype!r}")
        self.model = model.eval()
        self.cfg: ModelConfig = model.cfg
        self.device = torch.device(device)
        self.normalizer = normalizer or identity_normalizer()
        self.tokenizer = tokenizer or load_tokenizer(self.cfg.tokenizer)
        # RECAP (model.advantage_conditioning): the indicator every prompt carries; "positive"
        # serves the policy improved, False asks for the "negative" one (an ablation).
        self.advantage: bool | None = True if self.cfg.advantage_conditioning else None
        self.bf16 = dtype == "bf16"
        # The env's dims: the length of the statistics, or the model's (identity normalization).
        self.state_dim = stat_dim(self.normalizer, STATE_KEY) or self.cfg.state_dim
        self.action_dim = stat_dim(self.normalizer, ACTION_KEY) or self.cfg.action_dim
        if self.state_dim > self.cfg.state_dim or self.action_dim > self.cfg.action_dim:
            raise ValueError(
                f"norm stats dims (state {self.state_dim}, action {self.action_dim}) exceed the model's "
                f"(state {self.cfg.state_dim}, action {self.cfg.action_dim})"
            )
        self.spec = InputSpec.make(
            self.cfg.camera_names, self.state_dim, self.cfg.vision.image_size, default_prompt,
            image_resize=self.cfg.image_resize, action_dim=self.action_dim,
            action_horizon=self.cfg.action_horizon,
        )  # fmt: skip
        self._warned: set[str] = set()
        h = self.cfg.action_horizon
        replan_steps = replan_steps or h
        if not 1 <= replan_steps <= h:
            raise ValueError(f"replan_steps must be in [1, {h}] (the action horizon), got {replan_steps}")
        self.chunker = ActionChunker(replan_steps, temporal_ensemble)
        self.lock = threading.Lock()
        self.preprocess = preprocess  # e.g. infer.preprocess.Pipeline (LeRobot's exact pipeline)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed) if seed is not None else int(torch.initial_seed()) % 2**62)
        # Everything that depends on the head (fast path, real-time chunking, decoding options,
        # invalid chunks) is the head's: this shell only asks.
        self.serving = serving_class(self.cfg)(self, compile=compile, **head_options)
        self.cfg = model.cfg  # decoding options may have replaced it

    @property
    def action_representation(self) -> str:
        """What the actions mean: ``delta``, ``absolute`` (``model.action_representation``, recorded
        from the training data), or ``unspecified`` (a checkpoint that never trained here)."""
        rep = self.cfg.action_representation
        return "unspecified" if rep == "auto" else rep

    # Queries of different episodes may share one ``infer_batch`` call (evaluation's
    # ``batch_episodes``): what a head keeps between queries is kept per stream (``Obs.stream``).
    batchable = True

    @property
    def decode_stats(self) -> dict[str, int] | None:
        """Chunks whose tokens did not decode, and what ``invalid_decode`` did (token heads)."""
        return self.serving.decode_stats

    def set_execution(self, execution: Any) -> None:
        """Real-time execution settings (``ExecutionConfig``: RTC's guidance, BID's candidates),
        where the head uses them."""
        self.serving.set_execution(execution)

    @property
    def replan_steps(self) -> int:
        return self.chunker.replan_steps

    @property
    def temporal_ensemble(self) -> float:
        return self.chunker.temporal_ensemble

    @temporal_ensemble.setter
    def temporal_ensemble(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"temporal_ensemble must be >= 0, got {value}")
        self.chunker.temporal_ensemble = value

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        compile: bool = False,
        dtype: str | None = None,
        ema: bool = False,
        strict: bool = True,
        overrides: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> Policy:
        """Load a policy folder (see module docstring). ``ema=True`` uses the ``ema/`` weights.
        LeRobot / openpi pi0 and pi05 checkpoints (a folder or a Hub id in the local cache) load
        too, with their exact input pipeline (infer/readers/: one reader per format); ``overrides``
        and ``strict`` apply to those."""
        from vlastack.infer.readers import load_parts

        parts = load_parts(path, overrides, strict, device=device, ema=ema)
        if kwargs.get("replan_steps") is None:  # what `vla eval` runs it with, as its reader says
            kwargs["replan_steps"] = parts.replan_steps
        return cls(parts.model, parts.normalizer, parts.tokenizer, device=device, dtype=dtype,
                   compile=compile, preprocess=parts.pipeline, **kwargs)  # fmt: skip

    # ------------------------------------------------------------------ description

    @property
    def metadata(self) -> dict[str, Any]:
        """Plain-typed description of inputs and outputs (sent to clients on connect)."""
        c = self.cfg
        return {
            "policy": "vlastack",
            "head": c.head,
            "camera_names": list(c.camera_names),
            "image_size": c.vision.image_size,
            "image_dtype": "uint8",
            "max_image_side": self.spec.max_image_side,
            "state_dim": self.state_dim,
            "action_dim": self.action_dim,
            "action_horizon": c.action_horizon,
            "action_representation": self.action_representation,
            "model_state_dim": c.state_dim,
            "model_action_dim": c.action_dim,
            "max_text_len": c.max_text_len,
            "prompt_required": self.spec.prompt_required,
            "replan_steps": self.replan_steps,
            # the head's part: real-time chunking requests (``action_prefix``, infer/realtime.py)
            # it answers, the flow head's steps and guidance
            **self.serving.metadata(),
            "flat_keys": [*sorted(self.spec.aliases), "observation/state"],
        }

    def check(self, obs: object) -> Obs:
        """Validate one observation (raises ``ObsError`` with the reason), including that its
        state stays finite once normalized (3e38 with a std below 1 overflows to inf)."""
        o = check_obs(obs, self.spec)
        with np.errstate(over="ignore", invalid="ignore"):
            st = np.asarray(self.normalizer.normalize("observation.state", o.state), dtype=np.float32)
        if not np.isfinite(st).all():
            raise ObsError(
                f"'state' overflows when normalized with this policy's statistics (max |x| = "
                f"{np.abs(o.state).max():.3g}): not a state this policy can act on"
            )
        if self.cfg.state_in_prompt and self.preprocess is None:
            n = pi05_prompt_len(self.tokenizer, o.prompt, st, self.advantage)
            if n > self.cfg.max_text_len:  # cut short, the prompt would lose the state
                raise ObsError(
                    f"'prompt': with the state written in, this Pi0.5 prompt needs {n} tokens and the "
                    f"policy holds {self.cfg.max_text_len} (model.max_text_len): shorten the instruction"
                )
        return o

    # ------------------------------------------------------------------ inference

    def autocast(self):
        """bf16 autocast with ``dtype='bf16'`` (on weights not prepared by a fast path)."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def model_batch(self, obs_list: list[Obs]) -> dict[str, torch.Tensor]:
        """Checked observations -> the model's input batch on ``self.device`` (``vla rl``
        rebuilds it for its update)."""
        c = self.cfg
        if self.preprocess is not None:  # e.g. a LeRobot checkpoint's exact pipeline
            batch = self.preprocess.build_batch(obs_list, self.tokenizer)
        else:
            batch = build_batch(
                obs_list,
                self.spec,
                c.state_dim,
                c.max_text_len,
                self.tokenizer,
                self.normalizer,
                c.state_in_prompt,
                self.advantage,
            )
        return {k: v.to(self.device) for k, v in batch.items()}

    def warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg)

    def _run(
        self, obs_list: list[Obs], noise: torch.Tensor | None
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """-> unnormalized actions float32 [B, H, A_env], and for token heads validity bool [B] and
        whether the chunk is a repeat of the last valid one bool [B] (None for the flow head). All
        are read under the lock, so they belong to the same batch."""
        c = self.cfg
        batch = self.model_batch(obs_list)
        with self.lock:
            if noise is None:
                shape = (len(obs_list), c.action_horizon, c.action_dim)
                noise = torch.randn(shape, generator=self.generator, device=self.device)
            out, valid = self.serving.sample(batch, noise.to(self.device))
            # Token heads flag chunks whose tokens do not decode (e.g. a truncated FAST sequence).
            valid = None if valid is None else valid.cpu().numpy().astype(bool)
            actions = self.to_env_actions(out)
            repeated = self.serving.after_sample(actions, valid, [o.stream for o in obs_list])
        return actions, valid, repeated

    def to_env_actions(self, out: torch.Tensor) -> np.ndarray:
        """The model's normalized actions [B, H, A] -> env units float32 [B, H, A_env]."""
        actions = out.float()[:, :, : self.action_dim].cpu().numpy()
        return np.ascontiguousarray(self.normalizer.unnormalize(ACTION_KEY, actions), dtype=np.float32)

    def _run_rtc(self, obs_list: list[Obs], noise: torch.Tensor | None = None) -> np.ndarray:
        """Observations with an ``action_prefix``, all with the same ``rtc_method`` -> env-unit
        actions [B, H, A_env] continuing each prefix: the head's real-time chunking (the flow
        head's: models/heads/flow/serving.py); ``noise`` [B, H, A] fixed for tests."""
        return self.serving.answer_prefix(obs_list, self.model_batch(obs_list), noise)

    def infer_checked(self, obs_list: list[Obs], noise: torch.Tensor | None = None) -> np.ndarray:
        """Checked observations -> unnormalized actions float32 [B, H, A_env] (one forward pass)."""
        return self._run(obs_list, noise)[0]

    def infer_results(self, obs_list: list[Obs]) -> list[dict]:
        """Checked observations -> one reply each: ``{"actions": [H, A_env]}`` plus, for token
        heads, ``"valid"`` (False: the tokens did not decode to a full chunk) and ``"repeated"``
        (True: ``invalid_decode=repeat_last`` sent the last valid chunk instead; False with valid
        False: the actions are zeros, do not execute them). Observations with an
        ``action_prefix`` (real-time chunking) are batched per ``rtc_method``, the others together."""
        groups: dict[str | None, list[int]] = {}
        for i, o in enumerate(obs_list):
            groups.setdefault(None if o.action_prefix is None else o.rtc_method, []).append(i)
        if set(groups) != {None}:
            out: list[dict] = [{} for _ in obs_list]
            for method, idx in groups.items():
                part = [obs_list[i] for i in idx]
                res = (
                    self.infer_results(part)
                    if method is None
                    else [{"actions": a} for a in self._run_rtc(part)]
                )
                for i, r in zip(idx, res, strict=True):
                    out[i] = r
            return out
        actions, valid, repeated = self._run(obs_list, None)
        if valid is None:
            return [{"actions": a} for a in actions]
        return [
            {"actions": a, "valid": bool(v), "repeated": bool(r)} for a, v, r in zip(actions, valid, repeated)
        ]

    def infer(self, obs: dict) -> dict[str, np.ndarray]:
        """One observation -> ``{"actions": float32 [H, A_env]}`` in env units (+ ``"valid"``
        for token heads)."""
        return self.infer_results([self.check(obs)])[0]

    def warmup(self, methods: str | tuple[str, ...] = "all") -> dict[str, float]:
        """Answer one made-up observation per sampling method, so that the first real request
        does not pay the compile and the CUDA-graph capture (``fast``/``compile``: a minute on a
        GPU for each sampler). ``methods``: ``"plain"``, ``"rtc_inference"``, ``"rtc_training"``,
        ``"bid"``, or ``"all"`` = plain and every RTC method this policy answers (training-time RTC
        needs pi0). Batch 1 (BID: its K candidates); a server's micro-batches of another size still
        compile on first use. The sampling generator is restored after, so a warmed-up policy
        draws what a fresh one does. -> seconds per method."""
        c = self.cfg
        rtc = list(self.serving.rtc_methods)
        names = (
            ["plain", *rtc] if methods == "all" else [methods] if isinstance(methods, str) else list(methods)
        )
        if bad := [m for m in names if m not in ("plain", *rtc)]:
            raise ValueError(f"warmup: this policy cannot warm up {bad}; it answers plain and {rtc}")
        s = c.vision.image_size
        obs: dict[str, Any] = {
            "images": {cam: np.zeros((s, s, 3), np.uint8) for cam in c.camera_names},
            "state": np.zeros(self.state_dim, np.float32),
            "prompt": self.spec.default_prompt or "warm up",
        }
        prefix = np.zeros((c.action_horizon // 2, self.action_dim), np.float32)
        state, out = self.generator.get_state(), {}
        try:
            for m in names:
                extra = (
                    {} if m == "plain" else {"action_prefix": prefix, "inference_delay": 1, "rtc_method": m}
                )
                t0 = time.perf_counter()
                self.infer({**obs, **extra})
                out[m] = round(time.perf_counter() - t0, 2)
        finally:
            self.generator.set_state(state)
        return out

    def infer_batch(
        self, obs_list: list[dict], streams: Sequence[Hashable | None] | None = None
    ) -> list[dict[str, np.ndarray]]:
        """Several observations in one forward pass (micro-batching) -> one result dict each.
        ``streams``: whose each observation is (an episode's or client's key, ``Obs.stream``), for
        what a head keeps between queries (a token head's last valid chunk); None: all the
        policy's own single caller's."""
        if not obs_list:
            return []
        checked = [self.check(o) for o in obs_list]
        if streams is not None:
            if len(streams) != len(obs_list):
                raise ValueError(f"infer_batch: {len(obs_list)} observations but {len(streams)} streams")
            checked = [dataclasses.replace(o, stream=k) for o, k in zip(checked, streams, strict=True)]
        return self.infer_results(checked)

    # ------------------------------------------------------------------ closed loop

    def reset(self, stream: Hashable | None = None) -> None:
        """Forget queued actions and the last valid chunk (call at the start of each episode);
        ``stream``: only what was kept for that episode or client (``Obs.stream``)."""
        if stream is None:
            self.chunker.reset()
        # Without the lock (the serving's reset is safe without it): a server calls this on its
        # event loop, which must never wait for a forward pass.
        self.serving.reset(stream)

    def select_action(self, obs: dict) -> np.ndarray:
        """One env step -> float32 [A_env]. Re-plans every ``replan_steps`` steps; with
        ``temporal_ensemble`` > 0 the chunks covering this step vote (see ``ActionChunker``)."""
        return self.chunker.step(lambda: self.infer(obs)["actions"]).astype(np.float32)
