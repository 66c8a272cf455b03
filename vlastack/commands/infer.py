"""Subcommands of this layer (see vlastack/cli.py): ``vla serve`` and ``vla export``."""

from __future__ import annotations

import argparse
import logging


def _policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy", required=True, help="policy folder (model.safetensors, config.json, norm_stats.json)"
    )
    p.add_argument("--ema", action="store_true", help="use the ema/ weights")


def _serve(args: argparse.Namespace) -> int:
    from vlastack.infer.policy import Policy
    from vlastack.infer.server import PolicyServer, run
    from vlastack.models.heads.serving import parse_decoding

    if args.max_batch < 1 or args.max_message_mb <= 0:
        raise ValueError("--max-batch must be >= 1 and --max-message-mb > 0")
    if not args.max_wait_ms >= 0:
        raise ValueError(f"--max-wait-ms must be >= 0, got {args.max_wait_ms}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    log = logging.getLogger("vlastack.serve")
    if args.device == "cpu":
        import torch

        from vlastack.infer.threads import pick_threads

        threads, why = pick_threads(args.threads)
        torch.set_num_threads(threads)
        log.info("torch threads: %s", why)
    decoding = parse_decoding(args.decode)
    policy = Policy.from_pretrained(
        args.policy,
        device=args.device,
        compile=args.compile,
        compile_mode=args.compile_mode,
        compile_scope=args.compile_scope,
        dtype=args.dtype,
        fast=args.fast,
        ema=args.ema,
        decoding=decoding or None,  # a flow head takes no decoding options
        guidance=args.guidance,
        guidance_max=args.guidance_max,
    )
    if args.warmup:  # before listening: the first client gets a warm policy
        log.info("warming up (compile and capture each sampler once)...")
        log.info("warm-up seconds per sampling method: %s", policy.warmup("all"))
    server = PolicyServer(
        policy,
        host=args.host,
        port=args.port,
        http_port=args.http_port,
        token=args.token,
        max_batch=args.max_batch,
        max_message_bytes=int(args.max_message_mb * 2**20),
        drain_timeout_s=args.drain_timeout,
        max_wait_ms=args.max_wait_ms,
    )
    run(server)
    return 0


def _export(args: argparse.Namespace) -> int:
    from vlastack.infer.export import export_policy
    from vlastack.infer.policy import Policy

    policy = Policy.from_pretrained(args.policy, device="cpu", ema=args.ema)
    export_policy(policy, args.format, args.out, batch_size=args.batch_size, tol=args.tol)
    return 0


def register(sub, groups) -> None:
    from vlastack.commands.common import float_at_least
    from vlastack.config import GUIDANCE_MODES

    p = sub.add_parser("serve", help="serve a policy (openpi websocket protocol + HTTP /act, /metrics)")
    _policy_args(p)
    p.add_argument("--device", default="cpu")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument(
        "--port", type=int, default=8000, help="websocket port (also answers GET /healthz, /metrics)"
    )
    p.add_argument(
        "--http-port", type=int, default=None, help="HTTP port for POST /act (default: port+1; -1 = off)"
    )
    p.add_argument("--token", default=None, help="require 'Authorization: Bearer|Api-Key TOKEN'")
    p.add_argument("--max-batch", type=int, default=8, help="observations per forward pass")
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=0.0,
        help="latency cap of dynamic batching: wait up to this long after the oldest queued observation "
        "for more to join its forward pass (default 0: batch what queued during the last pass)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads on the CPU (default: the CPUs idle at start, at least 1; logged)",
    )
    p.add_argument("--max-message-mb", type=float, default=16.0, help="largest accepted message")
    p.add_argument(
        "--drain-timeout",
        type=float_at_least(0.0),
        default=10.0,
        help="seconds a SIGTERM waits for in-flight requests before closing (default 10)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the sampler")
    p.add_argument(
        "--compile-mode",
        default=None,
        help="with --fast --compile: the torch.compile mode, default | max-autotune-no-cudagraphs "
        "(benchmarks GEMM configs: a longer warm-up)",
    )
    p.add_argument(
        "--compile-scope",
        default="whole",
        choices=["whole", "layers"],
        help="with --fast --compile: compile the prefix pass and step whole (default), or one layer of "
        "each kind shared by all layers (a shorter warm-up, no fusion across layers)",
    )
    p.add_argument(
        "--dtype", default=None, choices=["fp32", "bf16"], help="bf16 = autocast (with --fast: bf16 weights)"
    )
    p.add_argument(
        "--fast",
        action="store_true",
        help="flow heads: the inference fast path (fused projections, folded norms, time tables; on "
        "CUDA the whole sampler in one CUDA graph, captured on the first request of each batch size; "
        "with --compile compiled before the capture). docs/gpu.md",
    )
    p.add_argument(
        "--warmup",
        action="store_true",
        help="answer a made-up observation with every sampling method (plain, the RTC ones) before "
        "listening, so no client waits for a compile or a graph capture (with --fast --compile on a "
        "GPU: about a minute each)",
    )
    p.add_argument(
        "--decode",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="token heads: temperature, top_p, max_decode_steps, invalid_decode (zero|repeat_last), "
        "constrained, exact_length; flow heads: step_noise, noise_scale, num_denoise_steps "
        "(repeatable; see docs/model.md)",
    )
    p.add_argument(
        "--guidance",
        default="vjp",
        choices=list(GUIDANCE_MODES),
        help="inference-time RTC requests (rtc_method=rtc_inference): vjp, through the denoiser's "
        "vector-Jacobian product (the paper's), or identity, the weighted error itself as LeRobot "
        "does (no backward pass; docs/rtc.md)",
    )
    p.add_argument(
        "--guidance-max", type=float_at_least(1e-6), default=5.0, help="inference-time RTC's clip beta"
    )
    p.set_defaults(func=_serve)

    p = sub.add_parser("export", help="export the sampler: pt2 (AOTInductor) | onnx | torchscript")
    _policy_args(p)
    p.add_argument("--format", required=True, choices=["pt2", "onnx", "torchscript"])
    p.add_argument("--out", required=True, help="output folder (artifact + policy.json sidecar)")
    p.add_argument("--batch-size", type=int, default=1, help="static batch size of the artifact")
    p.add_argument("--tol", type=float, default=1e-4, help="max abs difference from eager allowed")
    p.set_defaults(func=_export)
