"""Issue 4's tuner experiments, from the studies a GPU run left in its tuning database.

    # on the GPU node (one call each; see bench/README.md for the exact restrictions):
    jointtune tune --kernel ag_gemm --shape 8192x4096x12288 --trials 64 --db sqlite:///tune.db   # wall time
    jointtune tune --kernel ag_gemm --shape S --strategy exhaustive --restrict ... --db sqlite:///tune.db
    # then anywhere (CPU is enough):
    python bench/tuner/tuner_experiments.py tables tune.db --out bench/results --tag 2xH200_2026-11-22
    python bench/tuner/tuner_experiments.py compare bench/results/ground_truth_*.json \
        --out bench/results/strategies.json
    python bench/tuner/tuner_experiments.py curves bench/results/ground_truth_*.json \
        --out bench/results/tuner_curves.json

`tables` turns every exhaustive study into a replay table (each config's measured p50 in µs, null
for a config that failed): the ground truth. `compare` replays search strategies against those
tables over many seeds (same budget each) and reports how many measured trials each needed to get
within 3% of the exhaustive best, and the gap left after the budget: sample efficiency (experiment
2) and joint vs two-stage tuning (experiment 1) on the same GPU-measured latencies. `curves` (issue 34) replays
the tuner itself (its start, then TPE) for 3 seeds per table and writes best-so-far against trials, one panel per
family and world size: the JSON always, the PNG where matplotlib is installed. `agreement` (issue 34) replays pairs
of fresh tunes with one seed, each under timing noise of its own, with the tuner's final round and without, and
counts the pairs whose picks are more than 2% apart and the picks more than 3% off the table's best.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
import common  # noqa: F401  (first: this checkout's jointtune, for the imports below)

# isort: split

from jointtune.autotune.tuner.handles import study_space
from jointtune.autotune.tuner.replay import STRATEGIES, ReplayTable, compare, format_comparison, replay
from jointtune.autotune.tuner.settings import Job
from jointtune.autotune.tuner.studies import STUDY_JOB, quiet_optuna
from jointtune.kernels import get_family
from jointtune.search_spaces import DeviceLimits


def _tables(paths: list[str]) -> tuple[list[ReplayTable], set[str]]:
    """The tables at `paths`, each file read once, and the devices their latencies were measured on."""
    tables, devices = [], set()
    for path in paths:
        data = json.loads(Path(path).read_text())
        devices.add(data.get("device", "unknown"))
        tables.append(ReplayTable.from_json(data))
    return tables, devices


def _replayed_header(devices: set[str]) -> dict[str, str]:
    """What every report of a replayed experiment starts with: when, on which devices the replayed latencies were
    measured, the exact command."""
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": "replayed on the CPU; latencies measured on " + ", ".join(sorted(devices)),
        "command": " ".join(["python", *sys.argv]),
    }


def _shape_text(table: ReplayTable) -> str:
    space = table.space
    return "x".join(str(table.problem.dim(d)) for d in space.dims)


def tables(args: argparse.Namespace) -> None:
    url = f"sqlite:///{Path(args.db).resolve()}"
    limits = DeviceLimits.nominal_hopper(interpreter=False)  # the H200's own limits (227 KiB, 132 SMs)
    written = 0
    with quiet_optuna():
        summaries = optuna.get_all_study_summaries(url)
    for summary in summaries:
        if not summary.study_name.endswith(":exhaustive"):
            continue
        with quiet_optuna():
            study = optuna.load_study(study_name=summary.study_name, storage=url)
        job = Job.from_json(study.user_attrs[STUDY_JOB])
        space = study_space(get_family(job.kernel), job.settings)
        table = ReplayTable.from_study(study, space, job.problem, limits)
        data = table.to_json()
        data.update(
            study=summary.study_name,
            device=args.device,
            date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            command=args.command,
            measured=sum(v is not None for v in table.latencies.values()),
            failed=sum(v is None for v in table.latencies.values()),
            best_us=table.best_us,
        )
        path = Path(args.out) / f"ground_truth_{job.kernel}_{_shape_text(table)}_{args.tag}.json"
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"{path}: {len(table.latencies)} configs, best {table.best_us:.1f} µs")
        written += 1
    if not written:
        raise SystemExit(f"{args.db}: no exhaustive study found")


def _curves_png(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(results))
    rows = -(-len(results) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(results) :]:
        ax.set_visible(False)
    for ax, (name, entry) in zip(axes.flat, results.items()):
        for strategy, curve in entry["median_gap_curve"].items():
            ax.plot(range(1, len(curve) + 1), [100 * g for g in curve], label=strategy)
        ax.axhline(3, color="grey", linestyle=":", label="3% target")
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("measured trials")
        ax.set_ylabel("median gap to exhaustive best (%)")
        ax.set_title(name)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _gap_curve(table: ReplayTable, strategy: str, trials: int, seeds: int) -> list[float]:
    """Median over seeds of (best so far / exhaustive best - 1) after each measured trial."""
    best = table.best_us
    per_seed = []
    for seed in range(seeds):
        curve, so_far, gaps = replay(table, strategy, trials=trials, seed=seed), float("inf"), []
        for value in curve:
            so_far = min(so_far, value if value is not None else float("inf"))
            gaps.append(so_far / best - 1)
        gaps += [gaps[-1] if gaps else float("inf")] * (trials - len(gaps))
        per_seed.append(gaps)
    return [statistics.median(seed_gaps[i] for seed_gaps in per_seed) for i in range(trials)]


def run_compare(args: argparse.Namespace) -> None:
    results = {}
    tables, devices = _tables(args.tables)
    for path, table in zip(args.tables, tables):
        name = f"{table.space.name} {_shape_text(table)}"
        stats = compare(table, args.strategies, seeds=args.seeds, trials=args.trials, tolerance=args.tolerance)
        print(f"{name}: {len(table.latencies)} configs, best {table.best_us:.1f} µs")
        print(format_comparison(stats))
        results[name] = {
            "table": str(path),
            "configs": len(table.latencies),
            "best_us": table.best_us,
            "strategies": {s: st.to_json() for s, st in stats.items()},
            "median_gap_curve": {s: _gap_curve(table, s, args.trials, args.seeds) for s in args.strategies},
        }
    out = Path(args.out)
    report = {
        **_replayed_header(devices),
        "seeds": args.seeds,
        "trials": args.trials,
        "tolerance": args.tolerance,
        "results": results,
    }
    out.write_text(json.dumps(report, indent=1) + "\n")
    _curves_png(results, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def _best_so_far(curve: list[float | None], trials: int) -> list[float | None]:
    """Best latency after each measured trial (None until one succeeded), held flat past the curve's end."""
    out, best = [], None
    for value in curve:
        if value is not None and (best is None or value < best):
            best = value
        out.append(best)
    return out + [best] * (trials - len(out))


def run_curves(args: argparse.Namespace) -> None:
    """Best-so-far against trials of the tuner's own strategy, `args.seeds` seeds per table, grouped by family and
    world size; trials to within `args.tolerance` of the exhaustive best per seed."""
    panels: dict[str, list[dict]] = {}
    tables, devices = _tables(args.tables)
    for path, table in zip(args.tables, tables):
        best = table.best_us
        target = best * (1 + args.tolerance)
        runs = []
        for seed in range(args.seeds):
            curve = replay(table, args.strategy, trials=args.trials, seed=seed)
            so_far = _best_so_far(curve, args.trials)
            needed = next((i for i, v in enumerate(so_far, 1) if v is not None and v <= target), None)
            runs.append({"seed": seed, "best_so_far_us": so_far, "trials_to_target": needed})
        panel = f"{table.space.name} W={table.problem.world_size}"
        panels.setdefault(panel, []).append(
            {"table": str(path), "shape": _shape_text(table), "configs": len(table.latencies), "best_us": best,
             "runs": runs}
        )  # fmt: skip
        hits = [r["trials_to_target"] for r in runs]
        print(f"{panel} {_shape_text(table)}: best {best:.1f} µs; trials to within {args.tolerance:.0%}: {hits}")
    out = Path(args.out)
    report = {
        **_replayed_header(devices),
        "strategy": args.strategy,
        "seeds": args.seeds,
        "trials": args.trials,
        "tolerance": args.tolerance,
        "panels": panels,
    }
    out.write_text(json.dumps(report, indent=1) + "\n")
    try:
        _curves_by_panel_png(report, out.with_suffix(".png"))
    except ImportError:
        print(f"wrote {out} (matplotlib is not installed: no plot)")
        return
    print(f"wrote {out} and {out.with_suffix('.png')}")


def run_agreement(args: argparse.Namespace) -> None:
    """Pairs of fresh tunes with one seed replayed under timing noise (each tune its own noise), with the final
    round and without: how often the two picks are more than `args.agree` apart, and how often a pick is more than
    `args.tolerance` off the table's best, both in the table's (true) latencies."""
    import random

    from jointtune.autotune.tuner.replay import noisy, replay_pick

    rows = []
    tables, devices = _tables(args.tables)
    for path, table in zip(args.tables, tables):
        best = table.best_us
        for sigma in args.noise:
            for rounds in (0, args.final_rounds):
                arm = f"noise {sigma:.0%}, final round {'off' if rounds == 0 else f'{rounds} rounds'}"
                apart = off = 0
                picks = []
                for pair in range(args.pairs):
                    pair_us = []
                    for run in range(2):
                        rng = random.Random(f"{path}:{sigma}:{pair}:{run}")
                        key = replay_pick(table, trials=args.trials, seed=0, latency=noisy(table, sigma, rng),
                                          final_rounds=rounds)  # fmt: skip
                        us = table.latencies.get(key) if key is not None else None
                        pair_us.append(us if us is not None else float("inf"))
                    picks.append(pair_us)
                    apart += abs(pair_us[0] / pair_us[1] - 1) > args.agree
                    off += sum(us / best - 1 > args.tolerance for us in pair_us)
                rows.append({"table": str(path), "shape": _shape_text(table), "space": table.space.name,
                             "world_size": table.problem.world_size, "arm": arm, "noise": sigma, "final_rounds": rounds,
                             "pairs": args.pairs, "pairs_apart": apart, "picks_off": off, "best_us": best,
                             "picks_us": picks})  # fmt: skip
                print(f"{table.space.name} W={table.problem.world_size} {_shape_text(table)} [{arm}]: "
                      f"{apart}/{args.pairs} pairs > {args.agree:.0%} apart, {off}/{2 * args.pairs} picks > "
                      f"{args.tolerance:.0%} off the best")  # fmt: skip
    totals: dict[str, dict[str, int]] = {}
    for row in rows:
        total = totals.setdefault(row["arm"], {"pairs": 0, "pairs_apart": 0, "picks": 0, "picks_off": 0})
        for name, value in (("pairs", row["pairs"]), ("pairs_apart", row["pairs_apart"]),
                            ("picks", 2 * row["pairs"]), ("picks_off", row["picks_off"])):  # fmt: skip
            total[name] += value
    for arm, t in totals.items():
        print(f"all tables [{arm}]: {t['pairs_apart']}/{t['pairs']} pairs apart, {t['picks_off']}/{t['picks']} off")
    report = {
        **_replayed_header(devices),
        "trials": args.trials,
        "agree": args.agree,
        "tolerance": args.tolerance,
        "totals": totals,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


def _curves_by_panel_png(report: dict, path: Path) -> None:
    """One panel per family and world size: each table's seeds as gap to its exhaustive best (%) per trial."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = report["panels"]
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (name, tables) in zip(axes.flat, panels.items()):
        for i, entry in enumerate(tables):
            for run in entry["runs"]:
                gaps = [None if v is None else 100 * (v / entry["best_us"] - 1) for v in run["best_so_far_us"]]
                label = entry["shape"] if run["seed"] == 0 else None
                ax.plot(range(1, len(gaps) + 1), gaps, color=colors[i % len(colors)], alpha=0.75, label=label)
        ax.axhline(100 * report["tolerance"], color="grey", linestyle=":", label=f"{report['tolerance']:.0%}")
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("measured trials")
        ax.set_ylabel("best so far: gap to exhaustive best (%)")
        ax.set_title(f"{name} ({report['strategy']}, {report['seeds']} seeds each)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tables", help="exhaustive studies of a tuning database -> replay tables (JSON)")
    t.add_argument("db", help="SQLite file the GPU run tuned into")
    t.add_argument("--out", default="bench/results")
    t.add_argument("--tag", required=True, help="file name suffix, e.g. 2xH200_2026-11-22")
    t.add_argument("--device", default="2x NVIDIA H200 (NV18), torch 2.11, Triton 3.6")
    t.add_argument("--command", default="", help="the GPU command that measured the studies")
    c = sub.add_parser("compare", help="replay strategies against ground-truth tables")
    c.add_argument("tables", nargs="+")
    c.add_argument("--out", required=True, help="JSON path; the PNG goes next to it")
    c.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    c.add_argument("--seeds", type=int, default=20)
    c.add_argument("--trials", type=int, default=48)
    c.add_argument("--tolerance", type=float, default=0.03)
    v = sub.add_parser("curves", help="best-so-far against trials of the tuner, per family and world size")
    v.add_argument("tables", nargs="+")
    v.add_argument("--out", required=True, help="JSON path; the PNG goes next to it (with matplotlib)")
    v.add_argument("--strategy", default="tpe-warm", choices=STRATEGIES, help="tpe-warm: the tuner's own")
    v.add_argument("--seeds", type=int, default=3)
    v.add_argument("--trials", type=int, default=24)
    v.add_argument("--tolerance", type=float, default=0.03)
    g = sub.add_parser("agreement", help="pairs of fresh tunes under timing noise, with the final round and without")
    g.add_argument("tables", nargs="+")
    g.add_argument("--out", required=True, help="JSON path")
    g.add_argument("--noise", type=float, nargs="+", default=[0.01, 0.02], help="relative timing noise (sigma)")
    g.add_argument("--pairs", type=int, default=6)
    g.add_argument("--trials", type=int, default=24)
    g.add_argument("--final-rounds", type=int, default=5)
    g.add_argument("--agree", type=float, default=0.02)
    g.add_argument("--tolerance", type=float, default=0.03)
    args = ap.parse_args()
    {"tables": tables, "compare": run_compare, "curves": run_curves, "agreement": run_agreement}[args.what](args)


if __name__ == "__main__":
    main()
