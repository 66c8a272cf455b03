"""Simulation and closed-loop evaluation: the built-in MuJoCo suite (``env``, ``scene``, ``tasks``),
scripted-expert demos (``generate``), the evaluator (``evaluate``, ``policies``) and the optional
Meta-World adapter (``metaworld``). Kept import-free so ``vla --help`` does not load MuJoCo."""
