"""A small, randomly initialised LeRobot ACT policy folder for Meta-World's features (one camera,
4-D state and action), made and saved by LeRobot's own classes with its pre/post-processors: what
`lerobot-train` writes, at a size a test can load in seconds. Runs in LeRobot's venv:

    /work/lrvenv/bin/python scripts/make_lerobot_act_policy.py OUT [IMAGE_SIZE]
"""

import sys
from pathlib import Path

import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies import make_pre_post_processors
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy

out = Path(sys.argv[1])
size = int(sys.argv[2]) if len(sys.argv) > 2 else 64
torch.manual_seed(0)
cfg = ACTConfig(
    input_features={
        "observation.image": PolicyFeature(FeatureType.VISUAL, (3, size, size)),
        "observation.state": PolicyFeature(FeatureType.STATE, (4,)),
    },
    output_features={"action": PolicyFeature(FeatureType.ACTION, (4,))},
    chunk_size=10,
    n_action_steps=5,
    dim_model=32,
    n_heads=2,
    dim_feedforward=64,
    n_encoder_layers=1,
    n_decoder_layers=1,
    use_vae=False,
    pretrained_backbone_weights=None,
    device="cpu",
)
policy = ACTPolicy(cfg)
stats = {
    "observation.image": {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25)},
    "observation.state": {"mean": torch.zeros(4), "std": torch.ones(4)},
    "action": {"mean": torch.zeros(4), "std": torch.ones(4)},
}
pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
policy.save_pretrained(out)
pre.save_pretrained(out)
post.save_pretrained(out)
print("saved", sorted(p.name for p in out.iterdir()))
