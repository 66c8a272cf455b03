"""How a flow head serves: ``FlowServing`` (what ``Policy`` asks ``models/heads/serving.py`` for).

- ``fast=True``: ``fastpath.py``'s prepared weights and static sampler (one CUDA graph per batch
  size), for plain sampling, training-time real-time chunking and BID's candidates;
- real-time chunking (``rtc.py``): a request with an ``action_prefix`` and ``rtc_method``
  ``rtc_inference`` (guided sampling), ``rtc_training`` (the committed actions fed clean) or
  ``bid`` (bidirectional decoding: the candidate closest to the prefix).
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from vlastack.config import GUIDANCE_MODES
from vlastack.models.heads.flow.rl import flow_logprobs, flow_sample
from vlastack.models.heads.flow.rtc import guided_sample, prefix_sample, prefix_weights
from vlastack.models.heads.serving import HeadServing

ACTION_KEY = "action"


class FlowServing(HeadServing):
    OPTIONS: ClassVar[dict[str, Any]] = {
        "fast": False,  # fastpath.py: prepared weights, the whole sampler in one CUDA graph
        "compile_mode": None,  # fast + compile: fastpath.COMPILE_MODES
        "compile_scope": "whole",  # fast + compile: fastpath.COMPILE_SCOPES
        "guidance_max": 5.0,  # inference-time RTC's clip on the guidance weight (beta)
        "guidance": "vjp",  # inference-time RTC: through the VJP (the paper's) or identity (LeRobot's)
        "bid_samples": 8,  # bidirectional decoding: candidates per request
        "bid_noise_scale": 1.0,  # ... sampled at this temperature (the recipe's may be 0)
        "decoding": None,  # {key: value} of DECODING (model.head_options)
    }
    # the sampler's model.head_options a server may change: per-step noise (the stochastic sampler
    # vla rl trains), the start's temperature, the Euler steps
    DECODING = ("step_noise", "noise_scale", "num_denoise_steps")

    def __init__(self, policy: Any, compile: bool = False, **options: Any) -> None:
        self.fast_sampler = None
        super().__init__(policy, compile=compile and not options.get("fast", False), **options)
        if (self.compile_mode is not None or self.compile_scope != "whole") and not (self.fast and compile):
            raise ValueError(
                "compile_mode and compile_scope apply to fast=True with compile=True (the fast path's compiled sampler)"
            )
        if self.fast:
            self.fast_sampler = self._make_fast(compile)

    def check_rl(self) -> None:
        pass  # the noisy Euler sampler (rl.py)

    def rl_sample(
        self, batch: dict[str, Tensor], rl: Any, generator: torch.Generator
    ) -> tuple[Tensor, Tensor, Tensor]:
        actions, traj = flow_sample(self.policy.model, batch, rl.flow_sigma, generator)
        return actions, traj, torch.ones(len(actions), dtype=torch.bool)

    def rl_logprobs(
        self, model: torch.nn.Module, batch: dict[str, Tensor], sampled: Tensor, rl: Any
    ) -> tuple[Tensor, Tensor]:
        return flow_logprobs(model, batch, sampled, rl.flow_sigma, self.policy.action_dim, rl.flow_logp_steps)

    def check_options(self) -> None:
        if self.fast and self.policy.model.cfg.head_options.step_noise > 0:
            raise ValueError(
                "head_options.step_noise > 0 samples with noise at every step; the fast path's static "
                "sampler is deterministic: serve without fast=True, or with step_noise=0"
            )
        if self.guidance_max <= 0:
            raise ValueError(f"guidance_max must be > 0, got {self.guidance_max}")
        if self.guidance not in GUIDANCE_MODES:
            raise ValueError(f"guidance must be one of {' | '.join(GUIDANCE_MODES)}, got {self.guidance!r}")
        if self.bid_samples < 1:
            raise ValueError(f"bid_samples must be >= 1, got {self.bid_samples}")
        if self.bid_noise_scale <= 0:
            raise ValueError(f"bid_noise_scale must be > 0, got {self.bid_noise_scale}")

    def _make_fast(self, compile: bool) -> Any:
        """``prepare_for_inference`` on the policy's model (in place; weights stored in bf16 with
        ``dtype='bf16'``, else fp32) and a ``FastFlow`` sampler: on CUDA one captured graph per
        batch size (prefix pass + all Euler steps), on CPU the same static function without
        capture. ``compile`` compiles its prefix pass and step before capture, in
        ``compile_mode``, or one layer of each kind (``compile_scope="layers"``)."""
        from vlastack.models.heads.flow.fastpath import (
            FastFlow,
            check_compile_mode,
            check_compile_scope,
            prepare_for_inference,
        )

        p = self.policy
        # checked before the model is changed in place
        mode, scope = check_compile_mode(self.compile_mode), check_compile_scope(self.compile_scope)
        prepare_for_inference(p.model, torch.bfloat16 if p.bf16 else torch.float32)
        return FastFlow(p.model, graph=True, compile=compile, compile_mode=mode, compile_scope=scope)

    def _generic_time(self) -> Any:
        """The context real-time chunking and BID sample in: with ``fast=True`` a pi0.5 model's
        adaptive norms hold step tables for the fixed schedule; these samplers need its time path."""
        if self.fast_sampler is None:
            return contextlib.nullcontext()
        from vlastack.models.heads.flow.fastpath import generic_time

        return generic_time(self.policy.model)

    def sample(self, batch: dict[str, Tensor], noise: Tensor) -> tuple[Tensor, Tensor | None]:
        if self.fast_sampler is None:
            return super().sample(batch, noise)
        with torch.inference_mode():  # weights already in their dtype: no autocast
            return self.fast_sampler(batch, noise), None

    def metadata(self) -> dict[str, Any]:
        return {
            "num_denoise_steps": self.policy.cfg.head_options.num_denoise_steps,
            "rtc_methods": list(self.rtc_methods),
            "rtc_guidance": {"mode": self.guidance, "max": self.guidance_max},
        }

    def set_execution(self, execution: Any) -> None:
        self.guidance_max, self.guidance = execution.guidance_max, execution.guidance
        self.bid_samples, self.bid_noise_scale = execution.bid_samples, execution.bid_noise_scale
        self.check_options()

    # ------------------------------------------------------------------ real-time chunking

    @property
    def rtc_methods(self) -> tuple[str, ...]:  # type: ignore[override]
        # training-time RTC feeds one flow time per action token, which pi05's adaptive norms lack
        both = ("rtc_inference", "rtc_training", "bid")
        if self.policy.model.cfg.head_options.step_noise > 0:  # their samplers have no per-step noise
            return ()
        return tuple(m for m in both if m != "rtc_training" or not self.policy.cfg.adarms)

    def answer_prefix(
        self, obs_list: list[Any], batch: dict[str, Tensor], noise: Tensor | None = None
    ) -> np.ndarray:
        """Observations with an ``action_prefix``, all with the same ``rtc_method`` -> unnormalized
        actions float32 [B, H, A_env] that continue each prefix, in one batched sampling pass.

        A prefix comes in env units and the env's action order; it is normalized with the
        policy's own statistics and padded with weight 0 (never a zero target) on the model's
        extra dims and past its end. The delay d: guided sampling holds the first d actions hard
        and the rest of the prefix softly; the training-time method feeds the first d clean. A
        missing delay (the runtime has no estimate yet) is taken as 0: the whole prefix is then
        only soft guidance (guided) or plain sampling (training-time), never a crash. A delay
        longer than the prefix is clipped to it (the old chunk ran out)."""
        p = self.policy
        c, head = p.cfg, p.model.head
        if c.head_options.step_noise > 0:
            raise ValueError(
                "real-time chunking and BID sample without per-step noise: this policy serves with "
                f"head_options.step_noise={c.head_options.step_noise}; serve it with step_noise=0"
            )
        methods = {o.rtc_method for o in obs_list}
        assert len(methods) == 1, methods  # Policy.infer_results groups them
        b, h, a_env = len(obs_list), c.action_horizon, p.action_dim
        target, weights = torch.zeros(b, h, c.action_dim), torch.zeros(b, h, c.action_dim)
        dims = (torch.arange(c.action_dim) < a_env).float()
        delays = torch.zeros(b, dtype=torch.long)
        for i, obs in enumerate(obs_list):
            n, d = len(obs.action_prefix), obs.inference_delay
            if d is None:
                p.warn_once(
                    "missing", "real-time chunking: no inference_delay given; using 0 (soft prefix only)"
                )
                d = 0
            elif d > n:
                p.warn_once("long", f"inference_delay {d} exceeds the {n}-action prefix; clipped to {n}")
                d = n
            target[i, :n, :a_env] = torch.from_numpy(p.normalizer.normalize(ACTION_KEY, obs.action_prefix))
            weights[i] = prefix_weights(h, d, n)[:, None] * dims[None]
            delays[i] = d
        # The fast path's static samplers (plain for BID's candidates, prefix for training-time
        # RTC) need the step tables in place; guided sampling needs the generic time path.
        fast = self.fast_sampler is not None and (
            methods == {"bid"} or (methods == {"rtc_training"} and self.fast_sampler.supports_prefix)
        )
        with p.lock, contextlib.nullcontext() if fast else self._generic_time():
            target, weights = target.to(p.device), weights.to(p.device)
            if methods == {"bid"}:  # draws the noise of its K candidates itself
                out = self._bid(batch, target, weights)
            else:
                if noise is None:
                    noise = torch.randn((b, h, c.action_dim), generator=p.generator, device=p.device)
                noise = noise.to(p.device)
                if methods == {"rtc_training"} and fast:
                    with torch.inference_mode():  # prepared weights: no autocast, as plain sampling
                        out = self.fast_sampler.prefix_sample(batch, noise, target, delays.to(p.device))
                elif methods == {"rtc_training"}:
                    with torch.inference_mode(), p.autocast():
                        out = prefix_sample(head, p.model, batch, target, delays, noise)
                else:
                    with p.autocast():
                        out = guided_sample(
                            head,
                            p.model,
                            batch,
                            target,
                            weights,
                            noise,
                            self.guidance_max,
                            guidance=self.guidance,
                        )
        actions = p.normalizer.unnormalize(ACTION_KEY, out.float()[:, :, :a_env].cpu().numpy())
        return np.ascontiguousarray(actions, dtype=np.float32)

    def _bid(self, batch: dict, target: Tensor, weights: Tensor) -> Tensor:
        """Bidirectional decoding's backward coherence (Liu et al., arXiv 2408.17355): K =
        ``bid_samples`` plain chunks per observation in one batch, sampled at temperature
        ``bid_noise_scale`` (not the recipe's, which may be 0: K identical chunks), and the one
        closest to the executing chunk's leftover (``target``, normalized [B, H, A], weighted by
        ``weights``: the committed steps 1, then decaying, as RTC's guidance weighs them) is kept.
        Its forward contrast (against a weaker checkpoint's samples) is not used: it needs a
        second policy. -> normalized actions [B, H, A]. Caller holds the lock (and, with
        ``fast=True``, keeps the step tables in place: the candidates are plain samples)."""
        p = self.policy
        k, b = self.bid_samples, target.shape[0]
        many = {key: v.repeat_interleave(k, 0) for key, v in batch.items()}
        noise = torch.randn((b * k, *target.shape[1:]), generator=p.generator, device=p.device)
        if self.fast_sampler is not None:  # one static sampler (one CUDA graph) for the K x B batch
            with torch.inference_mode():
                cand = self.fast_sampler(many, noise, noise_scale=self.bid_noise_scale)
        else:
            with torch.inference_mode(), p.autocast():
                cand = p.model.sample_actions(many, noise=noise, noise_scale=self.bid_noise_scale)
        cand = cand.float().view(b, k, *target.shape[1:])
        dist = ((cand - target[:, None]) ** 2 * weights[:, None]).sum(dim=(2, 3))  # [B, K]
        return cand[torch.arange(b, device=cand.device), dist.argmin(dim=1)]
