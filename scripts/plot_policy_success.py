"""Success rate per task against a number (or per method, `--bars`), from the tables `serve.py policy` writes:

    python scripts/plot_policy_success.py --table docs/policy/success_cnn_cpu.json \
        --rows cnn_cpu_20demos=20 cnn_cpu=60 cnn_cpu_120demos=120 --xlabel "demonstrations per task" \
        --reference scripted --out docs/policy/cnn_cpu_data_size.png
    python scripts/plot_policy_success.py --bars --table docs/policy/success_world4d_synthetic.json \
        docs/policy/success_scripted.json --rows world4d_synthetic_world4d="(a) 4D" ... --reference scripted --out x.png

One line per task (`--bars`: one group of bars per task, one bar per row, ROW=LABEL); error bars are
the binomial standard error sqrt(p(1 − p)/n) of each cell's n trials; `--reference ROW` draws that
row's rates (e.g. the scripted operator) as dotted levels. Several `--table` files are merged (row
names must not repeat).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", nargs="+", required=True, help="success.json files of serve.py policy (merged)")
    p.add_argument("--rows", nargs="+", required=True, metavar="ROW=X",
                   help="table rows and their x values (with --bars: their labels)")
    p.add_argument("--bars", action="store_true", help="grouped bars per task instead of lines against x")
    p.add_argument("--xlabel", default="")
    p.add_argument("--reference", default="", help="a row drawn as dotted levels")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    table: dict = {}
    for path in a.table:
        with open(path) as f:
            part = json.load(f)
        if repeated := sorted(set(part) & set(table)):
            p.error(f"--table {path}: rows {repeated} already read from an earlier table")
        table.update(part)
    rows = []
    for spec in a.rows:
        name, _, x = spec.partition("=")
        if name not in table or not x:
            p.error(f"--rows {spec!r}: want ROW=X with ROW one of {sorted(table)}")
        if not a.bars:
            try:
                x = float(x)
            except ValueError:
                p.error(f"--rows {spec!r}: X must be a number (labels need --bars)")
        rows.append((name, x))
    if a.reference and a.reference not in table:
        p.error(f"--reference {a.reference!r}: not a row of {' '.join(a.table)}")
    tasks = list(table[rows[0][0]])
    if missing := [(name, t) for name, _ in rows for t in tasks if t not in table[name]]:
        p.error(f"rows lack tasks: {missing[:4]}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def rate_se(cells: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        rate = np.array([c["successes"] / c["trials"] for c in cells])
        return rate, np.sqrt(rate * (1 - rate) / np.array([c["trials"] for c in cells]))

    reference = rate_se([table[a.reference][t] for t in tasks])[0] if a.reference else None
    fig, ax = plt.subplots(figsize=(7.2, 3.8), dpi=110)
    if a.bars:
        width = 0.8 / len(rows)
        for j, (name, label) in enumerate(rows):
            rate, se = rate_se([table[name][t] for t in tasks])
            xs = np.arange(len(tasks)) - 0.4 + width * (j + 0.5)
            ax.bar(xs, 100 * rate, width, yerr=100 * se, capsize=2, color=f"C{j}", label=label)
        if reference is not None:
            ax.hlines(100 * reference, np.arange(len(tasks)) - 0.45, np.arange(len(tasks)) + 0.45, colors="k",
                      linestyles=":", linewidth=1)
        ax.set_xticks(np.arange(len(tasks)), tasks)
        ax.set_ylim(0, 105)
    else:
        for i, task in enumerate(tasks):
            rate, se = rate_se([table[name][task] for name, _ in rows])
            ax.errorbar([x for _, x in rows], 100 * rate, yerr=100 * se, marker="o", capsize=3, color=f"C{i}",
                        label=task)
            if reference is not None:
                ax.axhline(100 * reference[i], color=f"C{i}", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks([x for _, x in rows], [f"{x:g}" for _, x in rows])
        ax.set_ylim(-5, 105)
        ax.set_xlabel(a.xlabel)
    ax.set_ylabel("success rate (%)")
    ax.set_title(" + ".join(path.rsplit("/", 1)[-1] for path in a.table)
                 + (f"; dotted: {a.reference}" if a.reference else ""), fontsize=9)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.grid(alpha=0.3, axis="y" if a.bars else "both")
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
