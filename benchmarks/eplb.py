"""EPLB policies vs vLLM's own EPLB policy, side by side on the same synthetic traces.

Traces: per-step token→expert counts for 58 MoE layers × 256 experts (top-8 routing, multinomial
over a per-layer Zipf(α) popularity with a random expert order), grouped into windows of
``--steps`` steps. Families: stationary Zipf α ∈ {0, 0.6, 1.0, 1.2} and a drifting hot set (α=1.0,
every expert's log-popularity takes a N(0, 0.15²) random-walk step per window).

Each policy starts from the default placement and rebalances once per window, from its own
previous placement: the plan fitted on window t is scored on window t (fit) and on window t+1
(next). Rank load = sum over its slots of expert load / replica count (replicas split evenly).
Each forward step waits for its busiest rank, so "next step-peak" is max/mean per step of the next
window, averaged over steps and layers.

Columns: fit and next = max/mean rank load averaged over layers; gap = fitted max over the lower
bound max(mean, least achievable per-replica peak) − 1; solve = ms per rebalance for all layers on
one core; moved = fraction of slots whose expert changed per rebalance (mean, and worst).
Run: ``uv run --all-packages python benchmarks/eplb.py [--quick]``.
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
from vllm_ascend.eplb.policy.packing import rank_loads, replica_counts, slot_weights  # noqa: E402

LAYERS, EXPERTS, TOP_K = 58, 256, 8
DRIFT_SIGMA = 0.15
CONFIGS = [(16, 0), (16, 32), (16, 64), (32, 0), (32, 32), (32, 64), (64, 0), (64, 64), (128, 0)]
QUICK_CONFIGS = [(32, 32), (64, 0)]
FAMILIES = ["zipf0.0", "zipf0.6", "zipf1.0", "zipf1.2", "drift"]
OURS = ["default", "swift", "flashlb", "random"]


def make_trace(family: str, windows: int, steps: int, tokens: int, seed: int) -> np.ndarray:
    """Counts ``[windows, steps, layers, experts]``."""
    rng = np.random.default_rng(seed)
    alpha = 1.0 if family == "drift" else float(family[4:])
    base = 1.0 / np.arange(1, EXPERTS + 1) ** alpha
    logp = np.log(np.stack([rng.permutation(base) for _ in range(LAYERS)]))
    out = np.empty((windows, steps, LAYERS, EXPERTS))
    for w in range(windows):
        if family == "drift" and w:  # popularity takes a log-normal random-walk step every window
            logp += DRIFT_SIGMA * rng.standard_normal(logp.shape)
        p = np.exp(logp - logp.max(axis=1, keepdims=True))
        out[w] = rng.multinomial(tokens * TOP_K, p / p.sum(axis=1, keepdims=True), size=(steps, LAYERS))
    return out


def ratio(table: np.ndarray, load: np.ndarray) -> np.ndarray:
    r = rank_loads(table, load)
    return r.max(axis=1) / r.mean(axis=1)


def lower_bound(load: np.ndarray, ranks: int, slots: int) -> np.ndarray:
    counts = replica_counts(load, ranks * slots, ranks)
    return np.maximum(1.0, (load / counts).max(axis=1) / (load.sum(axis=1) / ranks))


@dataclass
class Stats:
    fit: list[float] = field(default_factory=list)
    nxt: list[float] = field(default_factory=list)
    nxt_layers: list[np.ndarray] = field(default_factory=list)
    step: list[float] = field(default_factory=list)
    gap: list[float] = field(default_factory=list)
    solve: list[float] = field(default_factory=list)
    moved: list[float] = field(default_factory=list)


def vllm_solver(ranks: int, redundant: int) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    import torch
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

    def solve(table: np.ndarray, window: np.ndarray, _steps: np.ndarray) -> np.ndarray:
        phy2log = DefaultEplbPolicy.rebalance_experts(
            torch.from_numpy(window),
            EXPERTS + redundant,
            1,
            1,
            ranks,
            torch.from_numpy(table.reshape(LAYERS, -1)),
        )
        return phy2log.numpy().reshape(table.shape)

    return solve


def ours_solver(name: str) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    policy = PolicyFactory.generate_policy(name, {"seed": 0} if name == "random" else {})

    def solve(table: np.ndarray, window: np.ndarray, steps: np.ndarray) -> np.ndarray:
        if name == "flashlb":  # the window's per-step samples, as per-slot loads under the placement
            work = np.stack([slot_weights(table, s) for s in steps])
        else:
            work = slot_weights(table, window)
        changed, _, new = policy.rebalance_experts(table, work)
        return new if changed else table

    return solve


def run(
    family: str, ranks: int, redundant: int, args: argparse.Namespace, names: list[str]
) -> dict[str, Stats]:
    trace = make_trace(
        family,
        args.windows + 1,
        args.steps,
        args.tokens,
        seed=zlib.crc32(f"{family}/{ranks}/{redundant}".encode()),
    )
    windows = trace.sum(axis=1)  # [windows, layers, experts]
    slots = (EXPERTS + redundant) // ranks
    start = generate_global_placement(EXPERTS, ranks, redundant, LAYERS)
    results = {}
    for name in names:
        solve = vllm_solver(ranks, redundant) if name == "vllm" else ours_solver(name)
        stats, table = Stats(), start
        for w in range(args.windows):
            t0 = time.process_time()
            new = solve(table, windows[w], trace[w])
            stats.solve.append((time.process_time() - t0) * 1e3)
            stats.moved.append(float((new != table).mean()))
            fit = ratio(new, windows[w])
            stats.fit.append(float(fit.mean()))
            nxt = ratio(new, windows[w + 1])
            stats.nxt.append(float(nxt.mean()))
            stats.nxt_layers.append(nxt)
            stats.step.append(float(np.mean([ratio(new, s).mean() for s in trace[w + 1]])))
            stats.gap.append(float((fit / lower_bound(windows[w], ranks, slots) - 1).mean()))
            table = new
        results[name] = stats
    return results


def steady(values: list, first: bool = False):
    """The first rebalance starts from the default placement; the rest is the steady state."""
    return values[0] if first else values[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two configs, two families, three rebalances")
    parser.add_argument("--windows", type=int, default=5, help="rebalances per trace")
    parser.add_argument("--steps", type=int, default=16, help="forward steps per window")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per step")
    parser.add_argument("--families", nargs="+", choices=FAMILIES, help="only these trace families")
    parser.add_argument(
        "--configs", nargs="+", metavar="RANKSxR", help="only these (ranks, redundant) configs, e.g. 64x64"
    )
    args = parser.parse_args()
    try:
        import torch

        torch.set_num_threads(1)
        vllm_solver(16, 0)
        names = ["vllm", *OURS]
    except ImportError as exc:
        print(f"vLLM not importable ({exc}); reporting our policies only")
        names = list(OURS)
    configs, families = (QUICK_CONFIGS, ["zipf1.0", "drift"]) if args.quick else (CONFIGS, FAMILIES)
    if args.quick:
        args.windows = min(args.windows, 3)
    families = args.families or families
    if args.configs:
        wanted = [tuple(int(v) for v in c.split("x")) for c in args.configs]
        unknown = [c for c in wanted if c not in CONFIGS]
        if unknown:
            parser.error(f"--configs: {unknown} not among {[f'{r}x{x}' for r, x in CONFIGS]}")
        configs = wanted

    print(
        f"{LAYERS} layers × {EXPERTS} experts, top-{TOP_K}, {args.tokens} tokens/step, {args.steps} steps/window, "
        f"{args.windows} rebalances per trace (the first from the default placement, the rest steady state); "
        f"(ranks, R) pairs with (256 + R) % ranks != 0 are infeasible and skipped.\n"
    )
    print(
        "| family | ranks | R | policy | fit | next | Δnext vs vLLM (±2se) | next step-peak | gap to LB "
        "| solve ms | moved | first: next | first: moved |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    summary: dict[str, dict[str, list]] = {n: {"beats": [], "moved": [], "solve": []} for n in names}
    for family in families:
        for ranks, redundant in configs:
            res = run(family, ranks, redundant, args, names)
            for name, st in res.items():
                delta = "–"
                if "vllm" in res and name != "vllm":
                    d = np.concatenate(steady(st.nxt_layers)) - np.concatenate(steady(res["vllm"].nxt_layers))
                    delta = f"{d.mean():+.4f} ± {2 * d.std(ddof=1) / np.sqrt(d.size):.4f}"
                    summary[name]["beats"].append(d.mean() <= 0)
                    summary[name]["solve"].append(np.median(st.solve) / np.median(res["vllm"].solve))
                summary[name]["moved"].append(np.mean(steady(st.moved)))
                print(
                    f"| {family} | {ranks} | {redundant} | {name} | {np.mean(steady(st.fit)):.4f} | "
                    f"{np.mean(steady(st.nxt)):.4f} | {delta} | {np.mean(steady(st.step)):.4f} | "
                    f"{np.mean(steady(st.gap)) * 100:.2f}% | "
                    f"{np.median(st.solve):.1f} | {np.mean(steady(st.moved)) * 100:.1f}% | "
                    f"{steady(st.nxt, first=True):.4f} | {steady(st.moved, first=True) * 100:.1f}% |"
                )
    if "vllm" in names:
        print(
            "\n| policy | steady next ≤ vLLM (cases) | solve time / vLLM: median, worst | steady moved: worst case |"
        )
        print("|---|---|---|---|")
        for name in names[1:]:
            sm = summary[name]
            print(
                f"| {name} | {sum(sm['beats'])}/{len(sm['beats'])} | {np.median(sm['solve']):.2f}, "
                f"{max(sm['solve']):.2f} | {max(sm['moved']) * 100:.1f}% |"
            )


if __name__ == "__main__":
    main()
