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
import logging
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vlastack.config import GUIDANCE_MODES, ModelConfig
from vlastack.data.stats import ExactNormalizer, Normalizer, stat_dim
from vlastack.infer.chunking import ActionChunker
from vlastack.infer.obs import InputSpec, Obs, ObsError, build_batch, check_obs
from vlastack.models.heads.rtc import guided_sample, prefix_sample, prefix_weights
from vlastack.models.prompt import pi05_prompt_len
from vlastack.models.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

STATE_KEY, ACTION_KEY = "observation.state", "action"


def identity_normalizer() -> Normalizer:
    return Normalizer({}, {STATE_KEY: "identity", ACTION_KEY: "identity"})


DECODING_KEYS = ("temperature", "top_p", "max_decode_steps", "invalid_decode", "constrained", "exact_length")


def parse_decoding(items: list[str]) -> dict[str, str]:
    """``--decode KEY=VALUE`` arguments (`vla serve`, `vla eval`) -> {key: value}; keys are
    checked here, values when they are applied (``set_decoding``)."""
    pairs = [kv.split("=", 1) for kv in items]
    bad = [kv for kv, p in zip(items, pairs, strict=True) if len(p) != 2 or p[0] not in DECODING_KEYS]
    if bad:
        raise ValueError(f"--decode takes KEY=VALUE with KEY one of {list(DECODING_KEYS)}, got {bad}")
    return dict(pairs)


def set_decoding(model: torch.nn.Module, options: dict[str, Any]) -> None:
    """Change a token head's decoding options (``model.tokens.<key>``, one of ``DECODING_KEYS``;
    values may be strings, as from ``vla serve --decode top_p=0.9``), checked like any config key."""
    from vlastack.config import Config, EvalConfig, apply_overrides

    cfg = model.cfg
    if not cfg.head_spec.action_tokens:
        raise ValueError(
            f"decoding options apply to action-token heads (model.head=tokens), not {cfg.head!r}"
        )
    bad = sorted(set(options) - set(DECODING_KEYS))
    if bad:
        raise ValueError(f"unknown decoding option(s) {bad}; known: {list(DECODING_KEYS)}")
    top = Config(model=cfg, eval=EvalConfig(steps_per_chunk=min(8, cfg.action_horizon)))
    new = apply_overrides(top, [f"model.tokens.{k}={v}" for k, v in options.items()]).model
    model.cfg = model.head.cfg = new


def saved_steps_per_chunk(path: str | Path) -> int | None:
    """``eval.steps_per_chunk`` of a vlastack checkpoint's config.yaml, capped at its action horizon:
    the one source for how many actions run per chunk (``vla eval``, ``Policy``, ``vla serve``'s
    /metadata). None when the folder has no config.yaml (a LeRobot folder: ``external.lerobot_steps_per_chunk``)."""
    f = Path(path) / "config.yaml"
    if not f.is_file():
        return None
    from vlastack.config import load_yaml

    cfg = load_yaml(f)
    return min(cfg.eval.steps_per_chunk, cfg.model.action_horizon)


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
        decoding: dict[str, Any] | None = None,
        fast: bool = False,
        guidance_max: float = 5.0,
        guidance: str = "vjp",
        bid_samples: int = 8,
        bid_noise_scale: float = 1.0,
        compile_mode: str | None = None,
        compile_scope: str = "whole",
    ) -> None:
        if dtype not in (None, "fp32", "bf16"):
            raise ValueError(f"dtype must be None, 'fp32' or 'bf16', got {dtype!r}")
        self.model = model.eval()
        if decoding:
            set_decoding(model, decoding)
        self.cfg: ModelConfig = model.cfg
        self.device = torch.device(device)
        self.normalizer = normalizer or identity_normalizer()
        self.tokenizer = tokenizer or load_tokenizer(self.cfg.tokenizer)
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
        if guidance_max <= 0:
            raise ValueError(f"guidance_max must be > 0, got {guidance_max}")
        self.guidance_max = guidance_max  # inference-time RTC's clip on the guidance weight (beta)
        if guidance not in GUIDANCE_MODES:
            raise ValueError(f"guidance must be one of {' | '.join(GUIDANCE_MODES)}, got {guidance!r}")
        self.guidance = guidance  # inference-time RTC: through the VJP (the paper's) or identity (LeRobot's)
        if bid_samples < 1:
            raise ValueError(f"bid_samples must be >= 1, got {bid_samples}")
        self.bid_samples = bid_samples  # bidirectional decoding: candidates per request
        if bid_noise_scale <= 0:
            raise ValueError(f"bid_noise_scale must be > 0, got {bid_noise_scale}")
        self.bid_noise_scale = bid_noise_scale  # ... sampled at this temperature (the recipe's may be 0)
        self._warned: set[str] = set()
        h = self.cfg.action_horizon
        replan_steps = replan_steps or h
        if not 1 <= replan_steps <= h:
            raise ValueError(f"replan_steps must be in [1, {h}] (the action horizon), got {replan_steps}")
        self.chunker = ActionChunker(replan_steps, temporal_ensemble)
        self.lock = threading.Lock()
        self.preprocess = preprocess  # e.g. infer.preprocess.Pipeline (LeRobot's exact pipeline)
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(int(seed) if seed is not None else int(torch.initial_seed()) % 2**62)
        # Token heads: chunks whose tokens did not decode, and what model.tokens.invalid_decode did.
        self.invalid_decode = self.cfg.tokens.invalid_decode if self.cfg.head_spec.action_tokens else "zero"
        self.decode_stats = {"chunks": 0, "invalid": 0, "repeated": 0}
        self._last_valid: np.ndarray | None = None  # the latest valid chunk [H, A_env] (repeat_last)
        self._fast = None
        if (compile_mode is not None or compile_scope != "whole") and not (fast and compile):
            raise ValueError(
                "compile_mode and compile_scope apply to fast=True with compile=True (the fast path's compiled sampler)"
            )
        if fast:  # infer/fastpath.py: prepared weights, whole sampler in one CUDA graph
            self._fast = self._make_fast(compile, compile_mode, compile_scope)
        elif compile:
            # The per-step parts (flow: prefix pass + denoise step; tokens: the decode step), not
            # the unrolled sampler: a graph 1/N the size, so it compiles ~N times faster.
            if self.cfg.head_spec.compile_decoding:
                from vlastack.infer.fastpath import allow_recompiles

                allow_recompiles()  # one compiled variant per batch size: see fastpath.COMPILED_VARIANTS
                model.head.compile_decoding()
            else:  # never a silent no-op
                warnings.warn(
                    f"head {self.cfg.head!r} has no compilable decode step: compile=True leaves its sampling eager",
                    stacklevel=2,
                )

    def _make_fast(self, compile: bool, compile_mode: str | None = None, compile_scope: str = "whole") -> Any:
        """``fast=True``: ``prepare_for_inference`` on this policy's model (in place; weights
        stored in bf16 with ``dtype='bf16'``, else fp32) and a ``FastFlow`` sampler: on CUDA one
        captured graph per batch size (prefix pass + all Euler steps), on CPU the same static
        function without capture. ``compile`` compiles its prefix pass and step before capture,
        in ``compile_mode`` (fastpath.COMPILE_MODES), or one layer of each kind
        (``compile_scope="layers"``: fastpath.compile_layers)."""
        from vlastack.infer.fastpath import (
            FastFlow,
            check_compile_mode,
            check_compile_scope,
            prepare_for_inference,
        )

        if not self.cfg.head_spec.fast_path:
            raise ValueError(f"fast=True needs a flow head (pi0/pi05), got head={self.cfg.head!r}")
        # checked before the model is changed in place
        mode, compile_scope = check_compile_mode(compile_mode), check_compile_scope(compile_scope)
        prepare_for_inference(self.model, torch.bfloat16 if self.bf16 else torch.float32)
        return FastFlow(
            self.model, graph=True, compile=compile, compile_mode=mode, compile_scope=compile_scope
        )

    def _generic_time(self) -> Any:
        """The context real-time chunking and BID sample in: with ``fast=True`` a pi0.5 model's
        adaptive norms hold step tables for the fixed schedule; these samplers need its time path."""
        if self._fast is None:
            return contextlib.nullcontext()
        from vlastack.infer.fastpath import generic_time

        return generic_time(self.model)

    @property
    def action_representation(self) -> str:
        """What the actions mean: ``delta``, ``absolute`` (``model.action_representation``, recorded
        from the training data), or ``unspecified`` (a checkpoint that never trained here)."""
        rep = self.cfg.action_representation
        return "unspecified" if rep == "auto" else rep

    @property
    def batchable(self) -> bool:
        """Whether queries of different episodes may share one ``infer_batch`` call (evaluation's
        ``batch_episodes``): a flow head carries nothing from one query to the next; a token head
        keeps its last valid chunk for ``invalid_decode=repeat_last``."""
        return not self.cfg.head_spec.action_tokens

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
        too, with their exact input pipeline (see infer/external.py); ``overrides`` and ``strict``
        apply to those."""
        from vlastack.infer.external import load_parts

        parts = load_parts(path, overrides, strict, device=device, ema=ema)  # one reader per format
        if kwargs.get("replan_steps") is None:  # what `vla eval` runs it with
            kwargs["replan_steps"] = (
                parts.replan_steps if parts.fmt != "vlastack" else saved_steps_per_chunk(parts.folder)
            )
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
            "num_denoise_steps": c.num_denoise_steps,
            "prompt_required": self.spec.prompt_required,
            "replan_steps": self.replan_steps,
            # Real-time chunking requests (``action_prefix``, infer/realtime.py) need a flow head.
            "rtc_methods": ["rtc_inference", "rtc_training", "bid"] if c.head_spec.denoise else [],
            "rtc_guidance": {"mode": self.guidance, "max": self.guidance_max}
            if c.head_spec.denoise
            else None,
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
            n = pi05_prompt_len(self.tokenizer, o.prompt, st)
            if n > self.cfg.max_text_len:  # cut short, the prompt would lose the state
                raise ObsError(
                    f"'prompt': with the state written in, this Pi0.5 prompt needs {n} tokens and the "
                    f"policy holds {self.cfg.max_text_len} (model.max_text_len): shorten the instruction"
                )
        return o

    # ------------------------------------------------------------------ inference

    def _autocast(self):
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def _batch(self, obs_list: list[Obs]) -> dict[str, torch.Tensor]:
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
            )
        return {k: v.to(self.device) for k, v in batch.items()}

    def _warn_once(self, key: str, msg: str) -> None:
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
        batch = self._batch(obs_list)
        b = len(obs_list)
        with self.lock:
            if noise is None:
                shape = (b, c.action_horizon, c.action_dim)
                noise = torch.randn(shape, generator=self._gen, device=self.device)
            # Token heads sample (temperature > 0) from the policy's seeded generator.
            extra = {"generator": self._gen} if c.head_spec.seeded_sampling else {}
            if self._fast is not None:  # weights already in their dtype: no autocast
                with torch.inference_mode():
                    out, valid = self._fast(batch, noise.to(self.device)), None
            else:
                with torch.inference_mode(), self._autocast():
                    out, valid = self.model.sample(batch, noise=noise.to(self.device), **extra)
            # Token heads flag chunks whose tokens do not decode (e.g. a truncated FAST sequence).
            valid = None if valid is None else valid.cpu().numpy().astype(bool)
            actions = out.float()[:, :, : self.action_dim].cpu().numpy()
            actions = np.ascontiguousarray(self.normalizer.unnormalize(ACTION_KEY, actions), dtype=np.float32)
            repeated = None if valid is None else self._apply_invalid_policy(actions, valid)
        return actions, valid, repeated

    def _apply_invalid_policy(self, actions: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Count invalid chunks; with ``repeat_last`` overwrite each with the latest valid chunk
        (in place; none yet: it stays zero). -> repeated bool [B]. Under the lock."""
        repeated = np.zeros(len(valid), dtype=bool)
        for i, ok in enumerate(valid):
            if ok:
                self._last_valid = actions[i].copy()
            elif self.invalid_decode == "repeat_last" and self._last_valid is not None:
                actions[i], repeated[i] = self._last_valid, True
        s = self.decode_stats
        s["chunks"] += len(valid)
        s["invalid"] += int((~valid).sum())
        s["repeated"] += int(repeated.sum())
        return repeated

    def _run_rtc(self, obs_list: list[Obs], noise: torch.Tensor | None = None) -> np.ndarray:
        """Observations with an ``action_prefix``, all with the same ``rtc_method`` -> unnormalized
        actions float32 [B, H, A_env] that continue each prefix (real-time chunking,
        models/heads/rtc.py), in one batched sampling pass.

        A prefix comes in env units and the env's action order; it is normalized with the
        policy's own statistics and padded with weight 0 (never a zero target) on the model's
        extra dims and past its end. The delay d: guided sampling holds the first d actions hard
        and the rest of the prefix softly; the training-time method feeds the first d clean. A
        missing delay (the runtime has no estimate yet) is taken as 0: the whole prefix is then
        only soft guidance (guided) or plain sampling (training-time), never a crash. A delay
        longer than the prefix is clipped to it (the old chunk ran out)."""
        c, head = self.cfg, self.model.head
        if not c.head_spec.denoise:
            raise ValueError(f"real-time chunking needs a flow head; this policy's head is {c.head!r}")
        methods = {o.rtc_method for o in obs_list}
        assert len(methods) == 1, methods  # infer_results groups them
        b, h, a_env = len(obs_list), c.action_horizon, self.action_dim
        target, weights = torch.zeros(b, h, c.action_dim), torch.zeros(b, h, c.action_dim)
        dims = (torch.arange(c.action_dim) < a_env).float()
        delays = torch.zeros(b, dtype=torch.long)
        for i, obs in enumerate(obs_list):
            n, d = len(obs.action_prefix), obs.inference_delay
            if d is None:
                self._warn_once(
                    "missing", "real-time chunking: no inference_delay given; using 0 (soft prefix only)"
                )
                d = 0
            elif d > n:
                self._warn_once("long", f"inference_delay {d} exceeds the {n}-action prefix; clipped to {n}")
                d = n
            target[i, :n, :a_env] = torch.from_numpy(self.normalizer.normalize(ACTION_KEY, obs.action_prefix))
            weights[i] = prefix_weights(h, d, n)[:, None] * dims[None]
            delays[i] = d
        batch = self._batch(obs_list)
        # The fast path's static samplers (plain for BID's candidates, prefix for training-time
        # RTC) need the step tables in place; guided sampling needs the generic time path.
        fast = self._fast is not None and (
            methods == {"bid"} or (methods == {"rtc_training"} and self._fast.supports_prefix)
        )
        with self.lock, contextlib.nullcontext() if fast else self._generic_time():
            target, weights = target.to(self.device), weights.to(self.device)
            if methods == {"bid"}:  # draws the noise of its K candidates itself
                out = self._bid(batch, target, weights)
            else:
                if noise is None:
                    noise = torch.randn((b, h, c.action_dim), generator=self._gen, device=self.device)
                noise = noise.to(self.device)
                if methods == {"rtc_training"} and fast:
                    with torch.inference_mode():  # prepared weights: no autocast, as plain sampling
                        out = self._fast.prefix_sample(batch, noise, target, delays.to(self.device))
                elif methods == {"rtc_training"}:
                    with torch.inference_mode(), self._autocast():
                        out = prefix_sample(head, self.model, batch, target, delays, noise)
                else:
                    with self._autocast():
                        out = guided_sample(
                            head,
                            self.model,
                            batch,
                            target,
                            weights,
                            noise,
                            self.guidance_max,
                            guidance=self.guidance,
                        )
        actions = self.normalizer.unnormalize(ACTION_KEY, out.float()[:, :, :a_env].cpu().numpy())
        return np.ascontiguousarray(actions, dtype=np.float32)

    def _bid(self, batch: dict, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Bidirectional decoding's backward coherence (Liu et al., arXiv 2408.17355): K =
        ``bid_samples`` plain chunks per observation in one batch, sampled at temperature
        ``bid_noise_scale`` (not the recipe's, which may be 0: K identical chunks), and the one
        closest to the executing chunk's leftover (``target``, normalized [B, H, A], weighted by ``weights``:
        the committed steps 1, then decaying, as RTC's guidance weighs them) is kept. Its forward
        contrast (against a weaker checkpoint's samples) is not used: it needs a second policy.
        -> normalized actions [B, H, A]. Caller holds the lock (and, with ``fast=True``, keeps the
        step tables in place: the candidates are plain samples)."""
        k, b = self.bid_samples, target.shape[0]
        many = {key: v.repeat_interleave(k, 0) for key, v in batch.items()}
        noise = torch.randn((b * k, *target.shape[1:]), generator=self._gen, device=self.device)
        if self._fast is not None:  # one static sampler (one CUDA graph) for the K x B batch
            with torch.inference_mode():
                cand = self._fast(many, noise, noise_scale=self.bid_noise_scale)
        else:
            with torch.inference_mode(), self._autocast():
                cand = self.model.sample_actions(many, noise=noise, noise_scale=self.bid_noise_scale)
        cand = cand.float().view(b, k, *target.shape[1:])
        dist = ((cand - target[:, None]) ** 2 * weights[:, None]).sum(dim=(2, 3))  # [B, K]
        return cand[torch.arange(b, device=cand.device), dist.argmin(dim=1)]

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
        rtc = ["rtc_inference", "rtc_training", "bid"] if c.head_spec.denoise else []
        if c.adarms:  # a flow time per action token needs pi0
            rtc = [m for m in rtc if m != "rtc_training"]
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
        state, out = self._gen.get_state(), {}
        try:
            for m in names:
                extra = (
                    {} if m == "plain" else {"action_prefix": prefix, "inference_delay": 1, "rtc_method": m}
                )
                t0 = time.perf_counter()
                self.infer({**obs, **extra})
                out[m] = round(time.perf_counter() - t0, 2)
        finally:
            self._gen.set_state(state)
        return out

    def infer_batch(self, obs_list: list[dict]) -> list[dict[str, np.ndarray]]:
        """Several observations in one forward pass (micro-batching) -> one result dict each."""
        if not obs_list:
            return []
        return self.infer_results([self.check(o) for o in obs_list])

    # ------------------------------------------------------------------ closed loop

    def reset(self) -> None:
        """Forget queued actions and the last valid chunk (call at the start of each episode)."""
        self.chunker.reset()
        self._last_valid = None

    def select_action(self, obs: dict) -> np.ndarray:
        """One env step -> float32 [A_env]. Re-plans every ``replan_steps`` steps; with
        ``temporal_ensemble`` > 0 the chunks covering this step vote (see ``ActionChunker``)."""
        return self.chunker.step(lambda: self.infer(obs)["actions"]).astype(np.float32)
