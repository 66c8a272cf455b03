"""Count LeRobot's Pi0.5 parameters (meta device, no weights) beside vlastack's ``pi05`` preset.

<lerobot venv>/bin/python scripts/lerobot_pi05_params.py   # a venv with lerobot 0.6.1 (scripts/make_lerobot_fixtures.py says how)
-> bench/results/pi05_params.json (vlastack's count is added by tests/models/test_pi05.py's
   constants; this script only needs lerobot and torch)
"""

from __future__ import annotations

import json
import platform
from datetime import UTC, datetime
from pathlib import Path

import torch


def main() -> None:
    import lerobot
    import transformers
    from lerobot.policies.pi05.configuration_pi05 import PI05Config
    from lerobot.policies.pi05.modeling_pi05 import PI05Pytorch

    with torch.device("meta"):
        m = PI05Pytorch(PI05Config())
    pg = m.paligemma_with_expert
    lm_heads = {n: p.numel() for n, p in m.named_parameters() if n.endswith("lm_head.weight")}
    total = sum(p.numel() for p in m.parameters())
    res = {
        "lerobot_version": lerobot.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "lerobot_PI05Pytorch_params": total,
        "lerobot_lm_heads": lm_heads,
        "lm_head_tied_to_embed_tokens": pg.paligemma.lm_head.weight is pg.paligemma.model.language_model.embed_tokens.weight,
        "lerobot_params_without_lm_heads": total - sum(lm_heads.values()),
        "pi05_specific": {
            n: p.numel() for n, p in m.named_parameters()
            if n.startswith(("time_mlp", "action_in_proj", "action_out_proj")) or (".dense." in n and ".layers.0." in n)
        },
    }  # fmt: skip
    out = Path(__file__).resolve().parents[1] / "bench" / "results" / "pi05_params.json"
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
