"""LeRobot 0.6.1's real-time chunking beside ours, on the same trained policy, tasks and timeline.

Run in LeRobot's own virtualenv with this repository importable (nothing is downloaded):

    PYTHONPATH=. /path/to/lerobot-venv/bin/python bench/lerobot_rtc.py \
        --representation absolute --protocol published [--episodes 25]

The policies are ``bench/rtc.py``'s (train them first). They carry the grounding head, which
LeRobot's ``PI0Policy`` does not have, so ``vla export-lerobot`` refuses them; instead LeRobot's own
RTC code runs around our model's denoising step: ``lerobot.policies.common.flow_matching.euler_integrate``
with ``lerobot.policies.rtc.modeling_rtc.RTCProcessor`` (its guidance, soft mask and weight clip),
fed the previous chunk's leftover in the model's normalized space exactly as LeRobot's
``ActionQueue.get_left_over`` hands it over (unpadded, ``[n, A_env]``; LeRobot pads it). Requests
without a prefix (the first chunk) are plain sampling, as in LeRobot. The timeline (delay,
execution horizon, when requests go out) is our evaluator's, so only the sampler differs from
``rtc_inference``'s row. Two settings: LeRobot's defaults (``RTCConfig()``: LINEAR schedule,
max_guidance_weight 10) and the published ones (EXP schedule, beta 5, as ours).

Writes ``representations.<rep>.<protocol>.lerobot_rtc`` (rows and goals) into
``bench/results/rtc.json`` and the goals into ``goals_by_representation.<rep>.lerobot_rtc*``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import time

import numpy as np
import torch

from bench import rtc as ours

SETTINGS = {
    "lerobot_rtc": {"schedule": "LINEAR", "max_guidance_weight": 10.0},  # RTCConfig() defaults
    "lerobot_rtc exp beta=5": {"schedule": "EXP", "max_guidance_weight": 5.0},  # the published ones
}


class LeRobotRTCPolicy:
    """A vlastack ``Policy`` whose real-time-chunking requests are answered by LeRobot's RTC code."""

    def __init__(self, path: str, schedule: str, max_guidance_weight: float) -> None:
        from lerobot.configs import RTCAttentionSchedule
        from lerobot.policies.rtc.configuration_rtc import RTCConfig
        from lerobot.policies.rtc.modeling_rtc import RTCProcessor

        from vlastack.infer.policy import Policy

        self.policy = Policy.from_pretrained(path)
        cfg = RTCConfig(
            prefix_attention_schedule=RTCAttentionSchedule[schedule], max_guidance_weight=max_guidance_weight
        )
        self.rtc = RTCProcessor(cfg)
        self.calls = {"plain": 0, "lerobot_rtc": 0}

    def reset(self) -> None:
        self.policy.reset()

    def infer(self, obs: dict) -> dict:
        if obs.get("action_prefix") is None:
            self.calls["plain"] += 1
            return self.policy.infer(obs)
        self.calls["lerobot_rtc"] += 1
        plain = {k: v for k, v in obs.items() if k not in ("action_prefix", "inference_delay", "rtc_method")}
        return {
            "actions": self._sample(
                plain, np.asarray(obs["action_prefix"], np.float32), obs.get("inference_delay")
            )
        }

    def _sample(self, obs: dict, prefix: np.ndarray, delay: int | None) -> np.ndarray:
        from lerobot.policies.common.flow_matching import euler_integrate

        from vlastack.infer.obs import check_obs
        from vlastack.infer.policy import ACTION_KEY
        from vlastack.models.heads.flow.rtc import _detach_cache

        p, c = self.policy, self.policy.cfg
        head, a_env = p.model.head, p.action_dim
        checked = check_obs(obs, p.spec)
        batch = p.model_batch([checked])
        with torch.no_grad():
            cache, positions, mask, state = head.prefill(p.model, batch)
        left = torch.from_numpy(p.normalizer.normalize(ACTION_KEY, prefix)).float()  # [n, A_env], normalized
        noise = torch.randn(1, c.action_horizon, c.action_dim, generator=p._gen) * c.head_options.noise_scale

        def denoise(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            _detach_cache(cache)  # each step writes its suffix k/v: keep no graph across steps
            return head.denoise_step(p.model, cache, state, x_t, t, positions, mask)

        for q in p.model.parameters():
            q.requires_grad_(False)
        out = euler_integrate(
            denoise, noise, c.head_options.num_denoise_steps, rtc_processor=self.rtc, rtc_enabled=True,
            inference_delay=int(delay or 0), prev_chunk_left_over=left[None], execution_horizon=len(left),
        )  # fmt: skip
        actions = out.detach()[0, :, :a_env].numpy()
        return np.ascontiguousarray(p.normalizer.unnormalize(ACTION_KEY, actions), dtype=np.float32)


def known_issues(path: str, rep: str, d: int = 2) -> dict:
    """Reported LeRobot RTC problems, checked on LeRobot's code and on ours with the same policy,
    observation and leftover chunk."""
    from vlastack.sim.env import make_env

    lr = LeRobotRTCPolicy(path, "EXP", 5.0)  # before the renderer: triton's import crashes after it
    env = make_env(ours.DYNAMIC[0], cameras=ours.CAMERAS, seed=1_000_000, action_representation=rep)
    obs, _ = env.reset(seed=1_000_000)
    env.close()
    req = {**obs, "action_prefix": lr.policy.infer(obs)["actions"][d:], "inference_delay": d}

    def under_inference_mode(infer) -> dict:
        try:
            with torch.inference_mode():
                a = infer(req)["actions"]
            return {"ok": True, "finite": bool(np.isfinite(a).all())}
        except RuntimeError as e:
            return {"ok": False, "error": f"RuntimeError: {str(e).splitlines()[0][:200]}"}

    # The guidance term is a vector-Jacobian product through the denoiser; with v computed before x
    # requires a gradient it degenerates to the weighted error itself. Spy on autograd.grad.
    seen: list[float] = []
    real = torch.autograd.grad

    def spy(outputs, inputs, grad_outputs=None, **kw):
        g = real(outputs, inputs, grad_outputs, **kw)
        seen.append(float((g[0] - grad_outputs).abs().max() / grad_outputs.abs().max().clamp_min(1e-12)))
        return g

    torch.autograd.grad = spy
    try:
        lr.infer(req)
        lerobot_vjp, seen[:] = max(seen), []
        lr.policy.infer(req)
        ours_vjp = max(seen)
    finally:
        torch.autograd.grad = real
    n, h, a_env, a_model = (
        len(req["action_prefix"]),
        lr.policy.cfg.action_horizon,
        lr.policy.action_dim,
        lr.policy.cfg.action_dim,
    )
    w = lr.rtc.get_prefix_weights(d, n, h)
    return {
        "delay": d,
        "guidance_under_callers_inference_mode": {
            "lerobot": under_inference_mode(lr.infer), "vlastack": under_inference_mode(lr.policy.infer),
        },
        "vjp_minus_weighted_error_rel": {
            "lerobot": lerobot_vjp, "vlastack": ours_vjp,
            "note": "max over denoising steps of max|VJP - weighted error| / max|weighted error|; 0 = identity Jacobian",
        },
        "padded_action_dims": {
            "model_dims": a_model, "env_dims": a_env,
            "lerobot_weight_on_padded_dims": float(w.max()) if a_model > a_env else 0.0,
            "vlastack_weight_on_padded_dims": 0.0,
            "note": "LeRobot zero-pads the leftover to the model's dims and weights every dim of a step alike, "
                    "so padded dims are pulled toward 0; ours weights them 0 (tests/infer/test_rtc.py)",
        },
    }  # fmt: skip


def make_policy(path: str, schedule: str, max_guidance_weight: float) -> LeRobotRTCPolicy:
    """A picklable factory for the evaluator's worker processes."""
    return LeRobotRTCPolicy(path, schedule, max_guidance_weight)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--representation", choices=["delta", "absolute"], default="absolute")
    ap.add_argument("--protocol", choices=sorted(ours.PROTOCOLS), default="published")
    ap.add_argument("--episodes", type=int, default=ours.EVAL_EPISODES, help="per task, delay and s")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tasks", choices=sorted(ours.TASK_SETS), default="dynamic", help="as bench/rtc.py's")
    ap.add_argument("--goal-s-only", action="store_true", help="evaluate only s = the goal horizon")
    args = ap.parse_args()
    ours.use_task_set(args.tasks)
    from bench.common import RESULTS, write_results
    from vlastack.config import EvalConfig, ExecutionConfig
    from vlastack.sim.evaluate import evaluate

    rep, proto, t0 = args.representation, ours.PROTOCOLS[args.protocol], time.perf_counter()
    path = str(ours.policy_dir(rep, proto, "plain"))
    issues = known_issues(path, rep)
    print(json.dumps(issues, indent=1), flush=True)
    rows = []
    for label, kw in SETTINGS.items():
        factory = functools.partial(make_policy, path, kw["schedule"], kw["max_guidance_weight"])
        for d in proto.delays:
            for s in [proto.goal_s] if args.goal_s_only else proto.horizons(d):
                ex = ExecutionConfig(method="rtc_inference", delay=d)
                cfg = EvalConfig(suite="builtin", tasks=ours.TASKS, episodes=args.episodes * len(ours.TASKS),
                                 num_workers=args.workers, steps_per_chunk=s, videos=0, execution=ex,
                                 action_representation=rep)  # fmt: skip
                res = evaluate(factory, cfg, cameras=ours.CAMERAS)
                rows.append(ours.result_row(
                    res, cfg, label=label, policy="plain", method="lerobot_rtc", delay=d, s=s,
                    horizon=proto.horizon, representation=rep, execution=kw,
                ))  # fmt: skip
                r = rows[-1]
                print(f"[{time.perf_counter() - t0:7.1f}s] {label} d={d} s={s}: dynamic "
                      f"{r['dynamic_success']:.0%}, mean jump {r['dynamic_mean_jump']:.3f}", flush=True)  # fmt: skip
    res_path = RESULTS / "rtc.json"
    old = json.loads(res_path.read_text()) if res_path.exists() else {}
    old.pop("environment", None)
    block = (
        old.setdefault("representations", {}).setdefault(rep, {}).setdefault(ours.block_key(proto.name), {})
    )
    # The naive rows of our own run of the same protocol give the jump baseline.
    naive = [r for r in block.get("rows", []) if r["label"] == "naive_async"]
    goals = ours.goals([*rows, *naive], proto, labels=tuple(SETTINGS))
    block["lerobot_rtc"] = {
        "lerobot": importlib.metadata.version("lerobot"), "settings": SETTINGS, "rows": rows, "goals": goals,
        "known_issues": issues,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu_flags": ours.cpu_flags(),
        "torch": torch.__version__,
    }  # fmt: skip
    old.setdefault(f"goals_by_representation{ours._suffix()}", {}).setdefault(rep, {}).update(goals)
    write_results("rtc", old)
    print(json.dumps(goals, indent=1))


if __name__ == "__main__":
    main()
