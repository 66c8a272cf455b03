"""The commands layer: every ``vla`` subcommand, one module per area (``register(sub, groups)``),
wired together by ``vlastack/cli.py``. It sits above every other package, so nothing below it ever
imports a command-line module (tests/test_layout.py checks the layers)."""
