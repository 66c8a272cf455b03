"""A small, randomly initialised LeRobot ACT policy folder for Meta-World's features (one camera,
4-D state and action) or, with ``--libero``, LIBERO's (cameras ``image`` and ``image2``, 8-D state,
7-D action), made and saved by LeRobot's own classes with its pre/post-processors: what
`lerobot-train` writes, at a size a test can load in seconds. ``--env-state=N`` adds an N-d
``observation.environment_state`` input (a `vla data task-onehot` policy's). Runs in LeRobot's venv:

    /work/lrvenv/bin/python scripts/make_lerobot_act_policy.py OUT [IMAGE_SIZE] [--libero] [--env-state=N]
"""

import sys
from pathlib import Path

import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies import make_pre_post_processors
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy

args = [a for a in sys.argv[1:] if not a.startswith("--")]
libero = "--libero" in sys.argv
env_dim = next((int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--env-state=")), 0)
out = Path(args[0])
size = int(args[1]) if len(args) > 1 else 64
cams = ["observation.images.image", "observation.images.image2"] if libero else ["observation.image"]
state_dim, action_dim = (8, 7) if libero else (4, 4)
torch.manual_seed(0)
cfg = ACTConfig(
    input_features={
        **{c: PolicyFeature(FeatureType.VISUAL, (3, size, size)) for c in cams},
        "observation.state": PolicyFeature(FeatureType.STATE, (state_dim,)),
        **({"observation.environment_state": PolicyFeature(FeatureType.ENV, (env_dim,))} if env_dim else {}),
    },
    output_features={"action": PolicyFeature(FeatureType.ACTION, (action_dim,))},
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
    **{c: {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25)} for c in cams},
    "observation.state": {"mean": torch.zeros(state_dim), "std": torch.ones(state_dim)},
    "action": {"mean": torch.zeros(action_dim), "std": torch.ones(action_dim)},
    **(
        {"observation.environment_state": {"mean": torch.zeros(env_dim), "std": torch.ones(env_dim)}}
        if env_dim
        else {}
    ),
}
pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
policy.save_pretrained(out)
pre.save_pretrained(out)
post.save_pretrained(out)
print("saved", sorted(p.name for p in out.iterdir()))
