"""EPLB policies vs vLLM's own EPLB policy, side by side on the same synthetic traces.

Traces: per-step token→expert counts for 58 MoE layers × 256 experts (top-8 routing, multinomial
over a per-layer Zipf(α) popularity with a random expert order), grouped into windows of
``--steps`` steps. Families: stationary Zipf α ∈ {0, 0.6, 1.0, 1.2} and a drifting hot set (α=1.0,
every expert's log-popularity takes a N(0, 0.15²) random-walk step per window). ``--heldout`` runs
the held-out set instead: skewed drifting traces (``drift-a1.2-s0.3``: α=1.2, σ=0.3; ``drift-a1.5-s0.3``)
at 512 tokens per step on configs with few slots per rank (2–5).

``--upstream`` runs upstream vllm-ascend's policy-test shape instead: 58 layers, 32 ranks × 9 slots,
256 experts, a ``[T=100, layers, ranks, slots]`` history of per-slot loads ``U(0,1)^10`` (fixed
seeds); each policy gets the whole history once (vLLM and the single-window policies its sum) and
is judged on it: max/mean of the summed load (history-averaged) and the mean over steps of the
per-step max/mean, against the unchanged input.

Each policy starts from the default placement and rebalances once per window, from its own
previous placement: the plan fitted on window t is scored on window t (fit) and on window t+1
(next). Rank load = sum over its slots of expert load / replica count (replicas split evenly).
Each forward step waits for its busiest rank, so "next step-peak" is max/mean per step of the next
window, averaged over steps and layers.

Columns: fit and next = max/mean rank load averaged over layers; gap = fitted max over the lower
bound max(mean, least achievable per-replica peak) − 1; solve = ms per rebalance for all layers on
one core; moved = fraction of slots whose expert changed per rebalance (mean, and worst).
Run: ``uv run --all-packages python benchmarks/eplb.py [--quick | --heldout | --upstream SEEDS]``.
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
from vllm_ascend.eplb.policy.packing import (  # noqa: E402
    logical_load,
    rank_loads,
    replica_counts,
    slot_weights,
)

LAYERS, EXPERTS, TOP_K = 58, 256, 8
DRIFT_SIGMA = 0.15
CONFIGS = [(16, 0), (16, 32), (16, 64), (32, 0), (32, 32), (32, 64), (64, 0), (64, 64), (128, 0)]
QUICK_CONFIGS = [(32, 32), (64, 0)]
FAMILIES = ["zipf0.0", "zipf0.6", "zipf1.0", "zipf1.2", "drift"]
HELDOUT_CONFIGS = [(64, 64), (96, 32), (128, 128), (144, 32), (128, 0)]
HELDOUT_FAMILIES = ["drift-a1.2-s0.3", "drift-a1.5-s0.3"]
HELDOUT_TOKENS = 512
UPSTREAM_SHAPE = (100, 58, 32, 9)  # steps, layers, ranks, slots; 256 experts
OURS = ["default", "swift", "flashlb", "random"]


def make_trace(family: str, windows: int, steps: int, tokens: int, seed: int) -> np.ndarray:
    """Counts ``[windows, steps, layers, experts]``."""
    rng = np.random.default_rng(seed)
    alpha, sigma = family_params(family)
    base = 1.0 / np.arange(1, EXPERTS + 1) ** alpha
    logp = np.log(np.stack([rng.permutation(base) for _ in range(LAYERS)]))
    out = np.empty((windows, steps, LAYERS, EXPERTS))
    for w in range(windows):
        if sigma and w:  # popularity takes a log-normal random-walk step every window
            logp += sigma * rng.standard_normal(logp.shape)
        p = np.exp(logp - logp.max(axis=1, keepdims=True))
        out[w] = rng.multinomial(tokens * TOP_K, p / p.sum(axis=1, keepdims=True), size=(steps, LAYERS))
    return out


def family_params(family: str) -> tuple[float, float]:
    """(Zipf α, drift σ per window) of a family name: ``zipf<α>``, ``drift``, ``drift-a<α>-s<σ>``."""
    if family == "drift":
        return 1.0, DRIFT_SIGMA
    if family.startswith("drift-"):
        _, a, s = family.split("-")
        return float(a[1:]), float(s[1:])
    return float(family[4:]), 0.0


def upstream_case(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Upstream's policy-test shape: a shuffled valid table ``[58, 32, 9]`` (256 experts + 32 replicas)
    and per-slot loads ``U(0,1)^10`` for 100 steps."""
    _, layers, ranks, slots = UPSTREAM_SHAPE
    rng = np.random.default_rng(seed)
    table = generate_global_placement(EXPERTS, ranks, ranks * slots - EXPERTS, layers)
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
    """Each policy once on the whole history of upstream's shape; judged on that history."""
    print(
        f"Upstream policy-test shape: {UPSTREAM_SHAPE[1]} layers, {UPSTREAM_SHAPE[2]} ranks × "
        f"{UPSTREAM_SHAPE[3]} slots, {EXPERTS} experts, T={UPSTREAM_SHAPE[0]} steps of U(0,1)^10 per-slot "
        f"loads; means over {seeds} seeds (max over seeds in brackets).\n"
    )
    print("| policy | history max/mean | mean per-step max/mean | changed | layers kept | moved | solve s |")
    print("|---|---|---|---|---|---|---|")
    rows: dict[str, list[tuple[float, ...]]] = {n: [] for n in ["input", *names]}
    for seed in range(seeds):
        table, work = upstream_case(seed)
        steps = np.stack([logical_load(table, s, EXPERTS) for s in work])
        total = steps.sum(axis=0)

        rows["input"].append((*judge(table, steps), 0.0, 58.0, 0.0, 0.0))
        for name in names:
            t0 = time.perf_counter()
            if name == "vllm":
                new, changed = vllm_solver(UPSTREAM_SHAPE[2], 32)(table, total, steps), True
            else:
                policy = PolicyFactory.generate_policy(name, {"seed": 0} if name == "random" else {})
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
    parser.add_argument(
        "--upstream", type=int, metavar="SEEDS", help="upstream's test shape over SEEDS seeds"
    )
    parser.add_argument("--heldout", action="store_true", help="the skewed drifting few-slot held-out set")
    parser.add_argument("--windows", type=int, default=5, help="rebalances per trace")
    parser.add_argument("--steps", type=int, default=16, help="forward steps per window")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per step")
    parser.add_argument(
        "--families", nargs="+", choices=FAMILIES + HELDOUT_FAMILIES, help="only these trace families"
    )
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
    if args.upstream:
        run_upstream(names, args.upstream)
        return
    configs, families = (QUICK_CONFIGS, ["zipf1.0", "drift"]) if args.quick else (CONFIGS, FAMILIES)
    if args.heldout:
        configs, families, args.tokens = HELDOUT_CONFIGS, HELDOUT_FAMILIES, HELDOUT_TOKENS
    if args.quick:
        args.windows = min(args.windows, 3)
    families = args.families or families
    if args.configs:
        wanted = [tuple(int(v) for v in c.split("x")) for c in args.configs]
        unknown = [c for c in wanted if c not in CONFIGS + HELDOUT_CONFIGS]
        if unknown:
            parser.error(
                f"--configs: {unknown} not among {[f'{r}x{x}' for r, x in CONFIGS + HELDOUT_CONFIGS]}"
            )
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
