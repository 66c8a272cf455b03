"""``report.html``: one self-contained page per run (``vla train``, ``vla eval``, ``vla demo``).

    html_report("runs/x/report.html", "vla train", metrics=read_metrics(...), evals={"trained": res},
                videos=[...], config=cfg, timings={"train_s": 640.0})

No network: the charts are inline SVG (matplotlib, text kept as text so the page stays small),
the rollout videos are base64 ``data:`` URIs of the mp4s the evaluator wrote (at most
``max_videos``, each under ``max_video_bytes``, successes and failures both shown). A small script
sets ``data-videos`` on ``<body>`` to ``"N/M loaded"`` once every video has loaded its metadata, so a
headless browser can check the page really renders (tests/diagnostics/test_run_report.py).
"""

from __future__ import annotations

import base64
import html
import io
import re
from pathlib import Path
from typing import Any

from vlastack.config import Config, to_dict
from vlastack.fileio import read_json, read_yaml

MAX_VIDEOS = 4
MAX_VIDEO_BYTES = 1_500_000

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#f6f7f9;color:#1d232b}
main{max-width:1100px;margin:0 auto;padding:24px}
h1{font-size:1.5em;margin:0 0 4px}h2{font-size:1.15em;margin:28px 0 10px}
.sub{color:#5b6673;margin:0 0 16px}
.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{background:#fff;border-radius:8px;box-shadow:0 1px 3px #0002;padding:12px 16px;min-width:140px}
.card b{display:block;font-size:1.5em}.card span{color:#5b6673;font-size:.85em}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:12px}
.chart{background:#fff;border-radius:8px;box-shadow:0 1px 3px #0002;padding:8px}
.chart svg{width:100%;height:auto}
.videos{display:grid;grid-template-columns:repeat(auto-fill,minmax(240px,1fr));gap:12px}
figure{margin:0;background:#fff;border-radius:8px;box-shadow:0 1px 3px #0002;padding:8px}
video{width:100%;border-radius:4px;background:#000}
figcaption{font-size:.85em;color:#5b6673;margin-top:4px}
.ok{color:#1a7f37}.fail{color:#cf222e}
table{border-collapse:collapse;background:#fff}td,th{padding:4px 12px;border-bottom:1px solid #e3e6ea;text-align:left}
pre{background:#fff;padding:12px;border-radius:8px;overflow:auto;font-size:.8em}
"""

# Sets <body data-videos="N/M loaded"> once every video has its metadata (or "error: ..." on failure).
SCRIPT = """
(function(){var v=document.querySelectorAll('video'),n=0,bad=[];
function done(){document.body.dataset.videos=bad.length?'error: '+bad.join(','):n+'/'+v.length+' loaded';}
if(!v.length){done();return;}
v.forEach(function(e,i){
 if(e.readyState>=1){n++;}
 else{e.addEventListener('loadedmetadata',function(){n++;if(n+bad.length==v.length)done();});
      e.addEventListener('error',function(){bad.push(i);if(n+bad.length==v.length)done();});}
});
if(n==v.length)done();})();
"""


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)  # matplotlib's RDF block
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: inline SVG


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text as <text>, not paths: ~10x smaller
    return plt


def loss_charts(metrics: list[dict]) -> list[str]:
    """SVG charts of the training loss (and its terms) and the learning rate against step."""
    recs = [r for r in metrics if "train/loss" in r]
    if not recs:
        return []
    plt = _pyplot()
    steps = [r["step"] for r in recs]
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.plot(steps, [r["train/loss"] for r in recs], lw=1.6, label="loss")
    for k in sorted({k for r in recs for k in r if k.startswith("train/") and k.endswith("_loss")}):
        ax.plot(steps, [r.get(k, float("nan")) for r in recs], lw=1, alpha=0.8, label=k[6:-5])
    ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="loss", title="training loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    charts = [_svg(fig)]
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.plot(steps, [r["train/lr"] for r in recs], color="C1", lw=1.6)
    ax.set(xlabel="step", ylabel="learning rate", title="learning rate")
    ax.grid(alpha=0.3)
    evals = [r for r in metrics if "eval/success_rate" in r]
    if evals:
        ax2 = ax.twinx()
        ax2.plot([r["step"] for r in evals], [r["eval/success_rate"] for r in evals], "o-", color="C2")
        ax2.set_ylabel("eval success", color="C2")
        ax2.set_ylim(0, 1.05)
    charts.append(_svg(fig))
    return charts


def success_chart(evals: dict[str, dict]) -> str | None:
    """SVG grouped bar chart: success rate per task family, one bar per evaluated policy, with the
    95% Wilson interval of each."""
    if not evals:
        return None
    import numpy as np

    plt = _pyplot()
    tasks = list(next(iter(evals.values()))["tasks"])
    labels = [*tasks, "mean"]
    width = 0.8 / len(evals)
    fig, ax = plt.subplots(figsize=(max(5.5, 1.3 * len(labels) + 1.5), 3.4))
    x = np.arange(len(labels))
    for j, (name, res) in enumerate(evals.items()):
        stats = [res["tasks"][t] for t in tasks]
        rates = [s["success_rate"] for s in stats] + [res["mean_task_success"]]
        lo = [r - s["ci95"][0] for r, s in zip(rates, stats)] + [0.0]
        hi = [s["ci95"][1] - r for r, s in zip(rates, stats)] + [0.0]
        ax.bar(x + (j - (len(evals) - 1) / 2) * width, rates, width, yerr=[lo, hi], capsize=2, label=name)
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 1.05)
    ax.set(ylabel="success rate", title="closed-loop success per task (95% CI)")
    ax.grid(axis="y", alpha=0.3)
    if len(evals) > 1:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside, never over bars
    return _svg(fig)


def pick_videos(
    paths: list[str | Path], count: int = MAX_VIDEOS, max_bytes: int = MAX_VIDEO_BYTES
) -> list[Path]:
    """Up to ``count`` videos under ``max_bytes`` each, successes and failures alternating (by the
    ``_success``/``_failure`` tag in the evaluator's file names)."""
    ok = [Path(p) for p in paths if Path(p).exists() and Path(p).stat().st_size <= max_bytes]
    wins = [p for p in ok if "success" in p.stem]
    fails = [p for p in ok if "success" not in p.stem]
    out = []
    while (wins or fails) and len(out) < count:
        for group in (wins, fails):
            if group and len(out) < count:
                out.append(group.pop(0))
    return out


def _video(path: Path) -> str:
    mime = "video/webm" if path.suffix == ".webm" else "video/mp4"
    data = base64.b64encode(path.read_bytes()).decode()
    tag = "ok" if "success" in path.stem else "fail"
    caption = html.escape(path.stem.replace("_", " "))
    return (
        f'<figure><video controls autoplay muted loop playsinline preload="auto" '
        f'src="data:{mime};base64,{data}"></video><figcaption class="{tag}">{caption}</figcaption></figure>'
    )


def html_report(
    path: str | Path,
    title: str,
    *,
    intro: str = "",
    cards: dict[str, str] | None = None,
    metrics: list[dict] | None = None,
    evals: dict[str, dict] | None = None,
    videos: list[str | Path] = (),
    config: Config | dict | None = None,
    timings: dict[str, float] | None = None,
    max_videos: int = MAX_VIDEOS,
    charts: list[str] = (),
) -> Path:
    """Write one self-contained HTML page; returns its path. Every section is optional.

    ``cards``: headline figures (label -> value); ``metrics``: metrics.jsonl records; ``evals``:
    policy name -> ``evaluate()`` result; ``timings``: name -> seconds; ``charts``: more SVGs."""
    esc = html.escape
    parts = [f"<h1>{esc(title)}</h1>"]
    if intro:
        parts.append(f'<p class="sub">{esc(intro)}</p>')
    if cards:
        parts.append(
            '<div class="cards">'
            + "".join(f"<div class=card><b>{esc(v)}</b><span>{esc(k)}</span></div>" for k, v in cards.items())
            + "</div>"
        )
    charts = [*charts, *loss_charts(metrics or [])]
    bars = success_chart(evals or {})
    if bars:
        charts.append(bars)
    if charts:
        parts.append("<h2>Curves and success</h2><div class=charts>")
        parts += [f'<div class="chart">{c}</div>' for c in charts]
        parts.append("</div>")
    chosen = pick_videos(list(videos), max_videos)
    if chosen:
        parts.append(f"<h2>Rollouts ({len(chosen)} of {len(list(videos))})</h2><div class=videos>")
        parts += [_video(p) for p in chosen]
        parts.append("</div>")
    if timings:
        rows = "".join(
            f"<tr><td>{esc(k.removesuffix('_s'))}</td><td>{v:,.1f} s</td></tr>" for k, v in timings.items()
        )
        parts.append(f"<h2>Timings</h2><table>{rows}</table>")
    if config is not None:
        import yaml

        data = to_dict(config) if isinstance(config, Config) else config
        text = yaml.safe_dump(data, sort_keys=False)
        parts.append(
            f"<h2>Resolved config</h2><details><summary>config.yaml</summary><pre>{esc(text)}</pre></details>"
        )
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width,initial-scale=1"><title>{esc(title)}</title>'
        f"<style>{CSS}</style></head><body><main>{''.join(parts)}</main><script>{SCRIPT}</script></body></html>"
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path


def eval_report(out_dir: str | Path, res: dict[str, Any], config: Config | dict | None = None) -> Path:
    """``report.html`` beside ``eval.json`` of one ``vla eval`` run."""
    out_dir = Path(out_dir)
    o = res["overall"]
    cards = {
        "mean task success": f"{res['mean_task_success']:.0%}",
        "episodes": str(o["n"]),
        "success (all episodes)": f"{o['success_rate']:.0%}",
    }
    intro = f"policy {res['policy']} on the {res['suite']} suite"
    return html_report(
        out_dir / "report.html", "vla eval", intro=intro, cards=cards, evals={res["policy"]: res},
        videos=res.get("videos", []), config=config, timings={"eval_s": res["wall_s"]},
    )  # fmt: skip


def run_report(run_dir: str | Path) -> Path:
    """``report.html`` of a ``vla train`` run folder: metrics.jsonl, train_summary.json, config.yaml
    and the latest ``eval/step_*/eval.json`` (with its videos) when ``train.eval_every`` was set."""
    from vlastack.train.logs import read_metrics  # torn last line tolerated, bad lines named

    run_dir = Path(run_dir)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    summary_path = run_dir / "train_summary.json"
    summary = read_json(summary_path) if summary_path.exists() else {}
    cfg_path = run_dir / "config.yaml"
    config = read_yaml(cfg_path) if cfg_path.exists() else None
    evals, videos = {}, []
    latest = sorted((run_dir / "eval").glob("*/eval.json"))
    if latest:
        res = read_json(latest[-1])
        evals[f"{res['policy']} ({latest[-1].parent.name})"] = res
        videos = res.get("videos", [])
    last = next((r for r in reversed(metrics) if "train/loss" in r), {})
    cards = {"steps": str(summary.get("steps", last.get("step", "?")))}
    if "train/loss" in last:
        cards["final loss"] = f"{last['train/loss']:.4f}"
    if "train/samples_per_s" in last:
        cards["samples/s"] = f"{last['train/samples_per_s']:.0f}"
    if evals:
        cards["eval success"] = f"{next(iter(evals.values()))['mean_task_success']:.0%}"
    timings = {"train_s": summary["train_s"]} if "train_s" in summary else None
    return html_report(
        run_dir / "report.html", "vla train", intro=str(run_dir), cards=cards, metrics=metrics,
        evals=evals, videos=videos, config=config, timings=timings,
    )  # fmt: skip


def rl_curve(rows: list[dict], start: dict | None = None) -> str:
    """SVG: the rollouts' success per iteration (sampled, per task thin) and the greedy policy's
    on the validation seeds where it was scored, from ``start`` (the starting policy's, at 0)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    its = [r["iteration"] + 1 for r in rows]
    ax.plot(its, [r["success"] for r in rows], lw=1.6, label="rollouts (sampled)")
    for t in sorted({t for r in rows for t in r.get("success_by_task", {})}):
        pts = [
            (r["iteration"] + 1, r["success_by_task"][t]) for r in rows if t in r.get("success_by_task", {})
        ]
        ax.plot(*zip(*pts, strict=True), lw=0.8, alpha=0.5, label=t)
    val = [(r["iteration"] + 1, r["val_success"]) for r in rows if "val_success" in r]
    if start is not None:
        val.insert(0, (0, start["val_success"]))
    if val:
        ax.plot(*zip(*val, strict=True), "o-", color="k", lw=1.6, label="validation (greedy)")
    ax.set(xlabel="iteration", ylabel="success", title="RL: success per iteration", ylim=(0, 1.05))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _svg(fig)


def rl_report(run_dir: str | Path) -> Path:
    """``report.html`` of a ``vla rl`` run folder (metrics.jsonl, config.yaml)."""
    from vlastack.train.logs import read_metrics

    run_dir = Path(run_dir)
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "iteration" in r]
    cfg_path = run_dir / "config.yaml"
    config = read_yaml(cfg_path) if cfg_path.exists() else None
    cards = {"iterations": str(len(rows))}
    if rows:
        cards["CPU-hours"] = f"{rows[-1]['cpu_s'] / 3600:.2f}"
        cards["rollouts"] = str(sum(r["episodes"] for r in rows))
        cards["last rollout success"] = f"{rows[-1]['success']:.0%}"
    start_path = run_dir / "validation_start.json"  # rl/runner.py's START_VALIDATION
    start = read_json(start_path) if start_path.exists() else None
    if start is not None:
        cards["start's validation success"] = f"{start['val_success']:.0%}"
    val = [r for r in rows if "val_success" in r]
    if val:
        cards["last validation success"] = f"{val[-1]['val_success']:.0%}"
    return html_report(
        run_dir / "report.html", "vla rl", intro=str(run_dir), cards=cards, config=config,
        charts=[rl_curve(rows, start)] if rows else [],
    )  # fmt: skip
