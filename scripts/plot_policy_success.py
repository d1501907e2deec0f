"""Success rate per task against a number, from the success tables `serve.py policy` writes:

    python scripts/plot_policy_success.py --table docs/policy/success_cnn_cpu.json \
        --rows cnn_cpu_20demos=20 cnn_cpu=60 cnn_cpu_120demos=120 --xlabel "demonstrations per task" \
        --reference scripted --out docs/policy/cnn_cpu_data_size.png

One line per task; error bars are the binomial standard error sqrt(p(1 − p)/n) of each cell's n trials;
`--reference ROW` draws that row's rates (e.g. the scripted operator) as dotted levels.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", required=True, help="success.json of serve.py policy")
    p.add_argument("--rows", nargs="+", required=True, metavar="ROW=X", help="table rows and their x values")
    p.add_argument("--xlabel", default="")
    p.add_argument("--reference", default="", help="a row drawn as dotted levels")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    with open(a.table) as f:
        table = json.load(f)
    rows = []
    for spec in a.rows:
        name, _, x = spec.partition("=")
        if name not in table or not x:
            p.error(f"--rows {spec!r}: want ROW=X with ROW one of {sorted(table)}")
        rows.append((name, float(x)))
    if a.reference and a.reference not in table:
        p.error(f"--reference {a.reference!r}: not a row of {a.table}")
    tasks = list(table[rows[0][0]])

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 3.8), dpi=110)
    for i, task in enumerate(tasks):
        colour = f"C{i}"
        xs = [x for _, x in rows]
        cells = [table[name][task] for name, _ in rows]
        rate = np.array([c["successes"] / c["trials"] for c in cells])
        se = np.sqrt(rate * (1 - rate) / np.array([c["trials"] for c in cells]))
        ax.errorbar(xs, 100 * rate, yerr=100 * se, marker="o", capsize=3, color=colour, label=task)
        if a.reference:
            ax.axhline(100 * table[a.reference][task]["rate"], color=colour, linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks([x for _, x in rows], [f"{x:g}" for _, x in rows])
    ax.set_ylim(-5, 105)
    ax.set_ylabel("success rate (%)")
    ax.set_xlabel(a.xlabel)
    title = f"{a.table.rsplit('/', 1)[-1]}" + (f"; dotted: {a.reference}" if a.reference else "")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
