"""On-policy RL fine-tuning of trained policies in simulation (``vla rl``; docs/rl.md).

``grpo.py``: log-probabilities of sampled action tokens, group-relative advantages, the clipped
loss; ``rollout.py``: episodes side by side with the policy sampling; ``runner.py``: the loop,
checkpoints and exact resume.
"""
