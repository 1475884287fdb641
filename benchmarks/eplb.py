"""EPLB policies vs vLLM's own EPLB policy: next-window imbalance on held-out traces of several load shapes.

Every policy (ours and vLLM 0.32's ``DefaultEplbPolicy``, in the same process) rebalances once per window of
``STEPS`` forward steps, starting from the default placement and then from its own previous placement. The plan
fitted on window t is scored on window t+1: ``next`` = max/mean rank load (a rank's load is the sum over its slots of
the expert's load / replica count), averaged over layers. The first rebalance (from the default placement) is left
out of ``next`` (steady state).

Traces (``vllm_ascend.eplb.traces``): per-step token→expert counts, top-``TOP_K`` multinomial draws over a per-layer
popularity: ``zipf<a>`` (stationary skew), ``drift<a>-<s>`` (log-popularity random walk), ``rotate<a>-<k>`` (hot
experts trade places abruptly), ``burst<a>-<q>-<b>x<m>`` (bursty layers: one-window spikes of a few experts).

Two trace sets with disjoint seeds, shapes and configs ``(experts, ranks, redundant, tokens/step)``: ``dev`` (what
policy choices were made on) and ``heldout`` (reported; never tuned on). ``--upstream SEEDS`` runs upstream
vllm-ascend's policy-test shape instead (58 layers, 32 ranks × 9 slots, 256 experts, ``[T=100, L, R, S]`` per-slot
loads ``U(0,1)^10``; each policy once on the whole history, judged on it).

Inputs: vLLM gets the window's logical loads; ``default`` and ``swift`` the same as per-slot workloads; ``flashlb``
the window's per-step samples. ``default/window`` is the default policy with ``forecast`` off (it plans on the
latest window alone, as vLLM's policy does): the forecast's share of the difference. Policies that keep state between calls (``default``'s load history, ``flashlb``'s
sample window) keep it across the windows of one trace, as the EPLB worker keeps one policy object.
Solve = process CPU time per rebalance (single-threaded numpy/torch), median.
Run: ``uv run --no-sync python benchmarks/eplb.py [--set dev|heldout] [--families ...] [--upstream SEEDS]``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import numpy as np  # noqa: E402

from vllm_ascend.eplb import PolicyFactory, generate_global_placement  # noqa: E402
from vllm_ascend.eplb.policy.packing import logical_load, rank_loads, slot_weights  # noqa: E402
from vllm_ascend.eplb.traces import load_trace, shape_of  # noqa: E402

TOP_K, STEPS, WINDOWS = 8, 16, 7
OURS = ["default", "default/window", "swift", "flashlb", "random"]
#: Benchmark names of policies run with options: ``default/window`` plans on the latest window alone.
VARIANTS = {"default/window": ("default", {"forecast": False}), "random": ("random", {"seed": 0})}
UPSTREAM_SHAPE = (100, 58, 32, 9)  # steps, layers, ranks, slots; 256 experts


@dataclass(frozen=True)
class TraceSet:
    families: tuple[str, ...]
    configs: tuple[tuple[int, int, int, int], ...]  # (experts, ranks, redundant, tokens per step)
    seeds: tuple[int, ...]


SETS = {
    "dev": TraceSet(
        families=(
            "zipf0.8",
            "zipf1.2",
            "zipf1.6",
            "drift1.0-0.2",
            "drift1.4-0.35",
            "rotate1.0-4",
            "burst1.0-0.3-2x6",
        ),
        configs=(
            (128, 16, 16, 1024),
            (96, 32, 32, 1024),
            (256, 32, 32, 2048),
            (192, 24, 24, 2048),
            (256, 64, 0, 1024),
        ),
        seeds=(101,),
    ),
    "heldout": TraceSet(
        families=(
            "zipf0.6",
            "zipf1.0",
            "zipf1.4",
            "drift0.8-0.15",
            "drift1.2-0.3",
            "rotate1.2-8",
            "burst0.8-0.25-4x4",
            "burst1.2-0.4-1x10",
        ),
        configs=(
            (64, 8, 8, 512),
            (160, 32, 32, 4096),
            (256, 64, 64, 1024),
            (256, 32, 0, 4096),
            (384, 48, 48, 2048),
        ),
        seeds=(7, 8),
    ),
}


def ratio(table: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Per layer: max/mean rank load."""
    r = rank_loads(table, load)
    return r.max(axis=1) / r.mean(axis=1)


def vllm_solver(
    experts: int, ranks: int, redundant: int
) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    import torch
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

    def solve(table: np.ndarray, window: np.ndarray, _steps: np.ndarray) -> np.ndarray:
        phy2log = DefaultEplbPolicy.rebalance_experts(
            torch.from_numpy(window),
            experts + redundant,
            1,
            1,
            ranks,
            torch.from_numpy(table.reshape(len(table), -1)),
        )
        return phy2log.numpy().reshape(table.shape)

    return solve


def ours_solver(name: str) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    policy = PolicyFactory.generate_policy(*VARIANTS.get(name, (name, {})))

    def solve(table: np.ndarray, window: np.ndarray, steps: np.ndarray) -> np.ndarray:
        if name == "flashlb":  # the window's per-step samples, as per-slot loads under the placement
            work = np.stack([slot_weights(table, s) for s in steps])
        else:
            work = slot_weights(table, window)
        changed, _, new = policy.rebalance_experts(table, work)
        return new if changed else table

    return solve


@dataclass
class Result:
    nxt: list[np.ndarray] = field(default_factory=list)  # per steady rebalance: per-layer next-window ratio
    solve: list[float] = field(default_factory=list)  # ms per rebalance
    moved: list[float] = field(default_factory=list)  # fraction of slots changed per steady rebalance


def run_trace(
    family: str, config: tuple[int, int, int, int], seed: int, names: list[str], layers: int
) -> dict[str, Result]:
    experts, ranks, redundant, tokens = config
    trace = load_trace(family, experts, layers, WINDOWS, STEPS, tokens, seed, TOP_K)
    windows = trace.sum(axis=1)  # [WINDOWS, layers, experts]
    start = generate_global_placement(experts, ranks, redundant, layers)
    out = {}
    for name in names:
        solve = vllm_solver(experts, ranks, redundant) if name == "vllm" else ours_solver(name)
        res, table = Result(), start
        for w in range(WINDOWS - 1):
            t0 = time.process_time()
            new = solve(table, windows[w], trace[w])
            res.solve.append((time.process_time() - t0) * 1e3)
            if w:
                res.nxt.append(ratio(new, windows[w + 1]))
                res.moved.append(float((new != table).mean()))
            table = new
        out[name] = res
    return out


def run_set(args: argparse.Namespace, names: list[str]) -> None:
    ts = SETS[args.set]
    families = args.families or ts.families
    print(
        f"Set `{args.set}`: {args.layers} layers, top-{TOP_K}, {STEPS} steps/window, {WINDOWS - 1} rebalances per trace "
        f"(next-window scores of rebalances 2–{WINDOWS - 1}), seeds {list(ts.seeds)}.\n"
    )
    print(
        "| family | experts | ranks | R | tokens | "
        + " | ".join(f"{n} next" for n in names)
        + " | default − vLLM (±2se) |"
    )
    print("|---|---|---|---|---|" + "---|" * len(names) + "---|")
    per_shape: dict[str, dict[str, list[np.ndarray]]] = {}
    solve: dict[str, list[float]] = {n: [] for n in names}
    moved: dict[str, list[float]] = {n: [] for n in names}
    for family in families:
        for config in ts.configs:
            res: dict[str, Result] = {}
            for seed in ts.seeds:
                seed_of = zlib.crc32(f"{args.set}/{family}/{config}/{seed}".encode())
                got = run_trace(family, config, seed_of, names, args.layers)
                for n, r in got.items():
                    acc = res.setdefault(n, Result())
                    acc.nxt += r.nxt
                    acc.solve += r.solve
                    acc.moved += r.moved
            shape = per_shape.setdefault(shape_of(family), {n: [] for n in names})
            cells = []
            for n in names:
                layers = np.concatenate(res[n].nxt)
                shape[n].append(layers)
                solve[n].append(float(np.median(res[n].solve)))
                moved[n].append(float(np.mean(res[n].moved)))
                cells.append(f"{layers.mean():.4f}")
            delta = "–"
            if "vllm" in res and "default" in res:
                d = np.concatenate(res["default"].nxt) - np.concatenate(res["vllm"].nxt)
                delta = f"{d.mean():+.4f} ± {2 * d.std(ddof=1) / np.sqrt(d.size):.4f}"
            print(
                f"| {family} | " + " | ".join(map(str, config)) + " | " + " | ".join(cells) + f" | {delta} |"
            )
    print(
        "\nPer shape family, over its cases (family × config, seeds pooled): mean next-window max/mean; in brackets"
        " the mean and the worst case of the case's next / vLLM's next.\n"
    )
    print("| shape | cases | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for shape, by_name in per_shape.items():
        cells = []
        for n, cases in by_name.items():
            cell = f"{np.mean([c.mean() for c in cases]):.4f}"
            if "vllm" in by_name and n != "vllm":
                rel = np.array([c.mean() / v.mean() for c, v in zip(cases, by_name["vllm"], strict=True)])
                cell += f" ({rel.mean():.4f}, worst {rel.max():.4f})"
            cells.append(cell)
        print(f"| {shape} | {len(by_name[names[0]])} | " + " | ".join(cells) + " |")
    print(
        "\n| policy | solve ms (median over cases) | worst case ms | moved per rebalance (mean, worst case) |"
    )
    print("|---|---|---|---|")
    for n in names:
        print(
            f"| {n} | {np.median(solve[n]):.1f} | {max(solve[n]):.1f} | "
            f"{np.mean(moved[n]) * 100:.1f}%, {max(moved[n]) * 100:.1f}% |"
        )


def upstream_case(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Upstream's policy-test shape: a shuffled valid table ``[58, 32, 9]`` (256 experts + 32 replicas)
    and per-slot loads ``U(0,1)^10`` for 100 steps."""
    _, layers, ranks, slots = UPSTREAM_SHAPE
    rng = np.random.default_rng(seed)
    table = generate_global_placement(256, ranks, ranks * slots - 256, layers)
    for layer in table:
        while True:
            shuffled = rng.permutation(layer.ravel()).reshape(ranks, slots)
            if all(len(set(r.tolist())) == slots for r in shuffled):
                layer[:] = shuffled
                break
    return table, rng.random(UPSTREAM_SHAPE) ** 10


def judge(table: np.ndarray, steps: np.ndarray) -> tuple[float, float]:
    """(max/mean of the summed load, mean over steps of the per-step max/mean), averaged over layers."""
    return float(ratio(table, steps.sum(axis=0)).mean()), float(
        np.mean([ratio(table, s).mean() for s in steps])
    )


def run_upstream(names: list[str], seeds: int) -> None:
    """Each policy once on the whole history of upstream's shape; judged on that history: max/mean of the summed
    load, and the mean over steps of the per-step max/mean."""
    _, layers, ranks, slots = UPSTREAM_SHAPE
    print(
        f"Upstream policy-test shape: {layers} layers, {ranks} ranks × {slots} slots, 256 experts, "
        f"T={UPSTREAM_SHAPE[0]} steps of U(0,1)^10 per-slot loads; means over {seeds} seeds (worst in brackets).\n"
    )
    print("| policy | history max/mean | mean per-step max/mean | changed | layers kept | moved | solve s |")
    print("|---|---|---|---|---|---|---|")
    rows: dict[str, list[tuple[float, ...]]] = {n: [] for n in ["input", *names]}
    for seed in range(seeds):
        table, work = upstream_case(seed)
        steps = np.stack([logical_load(table, s, 256) for s in work])
        rows["input"].append((*judge(table, steps), 0.0, float(layers), 0.0, 0.0))
        for name in names:
            t0 = time.perf_counter()
            if name == "vllm":
                new, changed = (
                    vllm_solver(256, ranks, ranks * slots - 256)(table, steps.sum(axis=0), steps),
                    True,
                )
            else:
                policy = PolicyFactory.generate_policy(*VARIANTS.get(name, (name, {})))
                changed, _, new = policy.rebalance_experts(
                    table, work if policy.accepts_history else work.sum(0)
                )
            dt = time.perf_counter() - t0
            kept = float((new == table).all(axis=(1, 2)).sum())
            rows[name].append((*judge(new, steps), float(changed), kept, float((new != table).mean()), dt))
    for name, vals in rows.items():
        v = np.array(vals)
        print(
            f"| {name} | {v[:, 0].mean():.4f} [{v[:, 0].max():.4f}] | {v[:, 1].mean():.4f} [{v[:, 1].max():.4f}] | "
            f"{int(v[:, 2].sum())}/{seeds} | {v[:, 3].mean():.1f} | {v[:, 4].mean() * 100:.1f}% | "
            f"{v[:, 5].mean():.2f} [{v[:, 5].max():.2f}] |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", choices=sorted(SETS), default="heldout", help="trace set (default: heldout)")
    parser.add_argument("--families", nargs="+", help="only these families of the set")
    parser.add_argument("--policies", nargs="+", choices=["vllm", *OURS], help="only these policies")
    parser.add_argument("--layers", type=int, default=16, help="MoE layers per trace (default 16)")
    parser.add_argument(
        "--upstream", type=int, metavar="SEEDS", help="upstream's test shape over SEEDS seeds"
    )
    args = parser.parse_args()
    if args.families and set(args.families) - set(SETS[args.set].families):
        parser.error(f"--families: allowed for set {args.set!r}: {', '.join(SETS[args.set].families)}")
    import torch

    torch.set_num_threads(1)
    names = args.policies or ["vllm", *OURS]
    if "vllm" in names:
        vllm_solver(8, 1, 0)  # imports vLLM before anything is timed
    if args.upstream:
        run_upstream(names, args.upstream)
    else:
        run_set(args, names)


if __name__ == "__main__":
    main()
