"""``report.json`` and a self-contained ``report.html`` (inline SVG plots, no external files)."""

from __future__ import annotations

import html
import io
import json
import math
from pathlib import Path

from vlastack.diagnostics.memory import fmt_bytes

PHASE_COLORS = {
    "data": "#d62728", "h2d": "#ff7f0e", "forward": "#1f77b4", "backward": "#2ca02c",
    "optimizer": "#9467bd", "host_syncs": "#8c564b", "other": "#7f7f7f",
    "setup": "#7f7f7f", "after": "#7f7f7f", "inference": "#17becf",
}  # fmt: skip


def _clean(obj):
    """JSON-safe: NaN/inf become null (strict JSON), tuples lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def write_report(report: dict, out: Path) -> None:
    (out / "report.json").write_text(json.dumps(_clean(report), indent=2, default=str))
    (out / "report.html").write_text(render_html(report))


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def plot_breakdown(r: dict) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 1.6))
    left = 0.0
    for k, v in r["breakdown_s"].items():
        ms = v * 1e3
        ax.barh([0], [ms], left=left, color=PHASE_COLORS.get(k, "#333"), label=f"{k} {ms:.1f} ms")
        left += ms
    ax.set_yticks([])
    ax.set_xlabel("ms per step")
    ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.45), frameon=False)
    ax.set_title(f"step time {r['step_time_s'] * 1e3:.1f} ms: {r['bottleneck']}")
    return _svg(fig)


def plot_memory(r: dict) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = r["memory"].get("over_one_step") or []
    fig, ax = plt.subplots(figsize=(8, 3))
    if pts:
        t = [p["t_s"] * 1e3 for p in pts]
        mb = [p["bytes"] / 2**20 for p in pts]
        ax.plot(t, mb, color="#333", lw=1)
        seen = set()
        for i in range(len(pts) - 1):
            ph = pts[i]["phase"]
            ax.axvspan(t[i], t[i + 1], color=PHASE_COLORS.get(ph, "#ccc"), alpha=0.15, lw=0,
                       label=ph if ph not in seen else None)  # fmt: skip
            seen.add(ph)
        ax.legend(fontsize=8, loc="upper left")
    ax.set_xlabel("ms into the step (under the memory tracker)")
    ax.set_ylabel("live tensors, MiB")
    ax.set_title(f"memory over one step (peak {fmt_bytes(r['memory']['peak_bytes'])})")
    return _svg(fig)


def plot_top_ops(r: dict) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = r["profiled"]["top_ops"][:12][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(ops) + 1))
    ax.barh([o["name"][:48] for o in ops], [o["time_ms_per_step"] for o in ops], color="#1f77b4")
    ax.set_xlabel("ms per step (profiled)")
    ax.set_title("top ops by self time")
    ax.tick_params(axis="y", labelsize=8)
    return _svg(fig)


def _table(rows: list[list], head: list[str]) -> str:
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def render_html(r: dict) -> str:
    e = html.escape
    m = r["memory"]
    parts = [
        f"<h1>vla doctor: {e(r['bottleneck'])}</h1>",
        f"<p class=ev>{e('; '.join(r['evidence']))}</p>",
        f"<p>device {e(r['device'])}, torch {e(r['torch'])}, {r['threads']} threads; step "
        f"{r['step_time_s'] * 1e3:.1f} ms, {r['samples_per_s']:.1f} samples/s, data wait "
        f"{_pct(r['data_wait_fraction'])}, {r['kernels_per_step']:.0f} {e(r['kernel_kind'])} per step "
        f"({_pct(r['short_kernel_time_fraction'])} of their time in ones &lt; 10 us), GPU busy "
        f"{'n/a on CPU' if r['gpu_busy_fraction'] is None else _pct(r['gpu_busy_fraction'])}, "
        f"{r['host_syncs_per_step']:.1f} host syncs per step.</p>",
    ]
    if r.get("synthetic_data"):
        parts.append(
            "<p class=warn>No dataset given: synthetic in-memory batches, so data wait is not representative.</p>"
        )
    parts += [
        "<h2>Step time</h2>",
        plot_breakdown(r),
        "<h2>Recommendations</h2>",
        _table([[rec["title"], "yes" if rec["applies"] else "no", rec["why"], rec["expected"], " ".join(rec["overrides"])]
                for rec in r["recommendations"]], ["change", "applies", "measured", "expected effect", "overrides"]),
    ]  # fmt: skip
    if r.get("tried"):
        parts += ["<h2>Tried (--try)</h2>", _table([[t["id"], " ".join(t["overrides"]), t["result"]] for t in r["tried"]],
                                                   ["id", "overrides", "measured change"])]  # fmt: skip
    locs = r["profiled"]["host_syncs"]["locations"]
    parts += [
        "<h2>Host syncs</h2>",
        f"<p>{r['host_syncs_per_step']:.1f} per step, {r['profiled']['host_syncs']['time_s_per_step'] * 1e6:.0f} us "
        "per step spent in them (profiled)</p>",
        _table([[f"{x['count_per_step']:.0f}", x["where"], x["code"], x["via"]] for x in locs],
               ["per step", "where", "code", "innermost frame"]),
        "<h2>Memory at the peak</h2>",
        f"<p>peak {fmt_bytes(m['peak_bytes'])} of live tensors, during {e(m['phase_at_peak'])}; allocator overhead "
        f"(reserved - allocated): {'n/a on CPU' if m.get('allocator_overhead_bytes') is None else fmt_bytes(m['allocator_overhead_bytes'])}</p>",
        _table([[k, fmt_bytes(v)] for k, v in m["categories"].items()], ["category", "bytes"]),
        _table([[k, fmt_bytes(v)] for k, v in m["activations_by_module"].items()], ["module (saved activations)", "bytes"]),
        plot_memory(r),
    ]  # fmt: skip
    pc = r.get("plan_check") or {}
    if "predicted_bytes" in pc:
        parts.append(
            f"<p>vla plan predicted {fmt_bytes(pc['predicted_bytes'])} for this config ({pc['error']:+.1%}).</p>"
        )
    parts += ["<h2>Top ops</h2>", plot_top_ops(r),
              _table([[o["name"], f"{o['calls_per_step']:.0f}", f"{o['time_ms_per_step']:.2f}", f"{o['mean_us']:.1f}",
                       _pct(o["share"])] for o in r["profiled"]["top_ops"]],
                     ["op", "calls/step", "ms/step", "mean us", "share"])]  # fmt: skip
    if "inference" in r:
        i = r["inference"]
        parts.append(f"<h2>Inference</h2><p>{i['latency_s'] * 1e3:.1f} ms per sample_actions call at batch "
                     f"{i['batch_size']}; {i['kernels_per_call']:.0f} ops, {i['host_syncs_per_call']:.0f} host syncs, "
                     f"peak {fmt_bytes(i['peak_bytes'])}</p>")  # fmt: skip
    if "numerics" in r:
        parts.append(_numerics_html(r["numerics"]))
    parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in r.get("notes", [])) + "</ul>")
    parts.append(
        "<p>Open trace.json in <a href='https://ui.perfetto.dev'>Perfetto</a> or chrome://tracing.</p>"
    )
    style = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:.5em 0;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}"
             ".ev{font-size:15px}.warn{color:#a60}")  # fmt: skip
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>vla doctor report</title>"
        f"<style>{style}</style></head><body>" + "\n".join(parts) + "</body></html>\n"
    )


def _numerics_html(n: dict) -> str:
    fn = n.get("first_nonfinite")
    head = (
        f"<p class=warn>First non-finite output: <b>{html.escape(fn['module'])}</b> ({html.escape(fn['type'])}); "
        f"its inputs: {html.escape(json.dumps(_clean(fn['inputs'])))}</p>"
        if fn else "<p>All activations and gradients finite.</p>"
    )  # fmt: skip

    def f(st, k):
        return "" if not st else f"{st[k]:.3g}"

    rows = [[r["module"], f(r["forward"], "mean"), f(r["forward"], "std"), f(r["forward"], "max_abs"),
             f(r["forward"], "nonfinite"), f(r["grad"], "std"), f(r["grad"], "max_abs"), f(r["grad"], "nonfinite")]
            for r in n["modules"] if r["module"].count(".") <= 2]  # fmt: skip
    drift = _table([[d["module"], f"{d['rel_error']:.2e}", f"{d['max_abs_diff']:.3g}"] for d in n.get("drift", [])],
                   ["layer", "bf16 vs fp32 relative error", "max abs diff"])  # fmt: skip
    return (
        "<h2>Numerics</h2>" + head
        + _table(rows, ["module", "act mean", "act std", "act max|x|", "act non-finite", "grad std", "grad max|x|",
                        "grad non-finite"])
        + "<h3>bf16 drift per layer</h3>" + drift
    )  # fmt: skip
