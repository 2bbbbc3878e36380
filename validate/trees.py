"""Token trees in a validation (`--trees`): which trees run, what the profile must cost for them, and
the prediction of a tree's acceptance from the acceptance control's rule.

A tree configuration runs the real tree decoder under ordinary or deferred with the dense head (the
simulator charges a tree's head as one step of the chain's dense head) and is predicted twice from
the same profile and calibration:
- like every configuration, replaying its own trace (every round's accepted path length): what is
  left is the cost model's error, held to the validation's error goals;
- from the control's rule alone (`a=A`: at each depth a node's top-k children hold the target's
  token with probability 1 - (1 - a)^k, contracts.acceptance_control), as the simulator predicts a
  tree it never ran: its mean accepted length and tok/s, averaged over CONTROL_SEEDS draws so the
  prediction is the rule's expectation rather than one more sample. A dynamic tree chooses its nodes
  by the synthetic draft's own probabilities, which the rule does not know: the simulator's static
  stand-in for it (sim/trees.py) is an approximation there.
Every decoder of a validation runs at one fixed width, the profile's (the widest tree's node count
+ 1 on a GPU), so that one profile costs chains and trees alike and every decoder's baseline emits
the same tokens.
"""

from __future__ import annotations

from contracts import UsageError
from contracts.names import REGIME_OF_GRAPHS_FLAG
from contracts.trees import parse_trees
from measure.benchmarks import decode_K
from model.decoder import width
from sim.profile import load_profile
from sim.sampled_trees import LOOK_AHEAD
from sim.scenario import resolve
from sim.simulate import simulate
from sim.trees import TREE_SCHEDULES, control_source

from .plan import TREE_HEADS, Config
from .predict import scenario_for

CONTROL_SEEDS = 16


def validated_trees(text: str, schedules: tuple, heads: tuple, sampled: bool = False) -> tuple[str, ...]:
    """--trees as labels, `chain` for the chains of --K; a tree needs a schedule and a head it runs with.
    Under sampling a tree's pipelined-deferred is refused: the simulator cannot predict it under
    acceptance control (sim/sampled_trees.py, sampled_schedules)."""
    labels = tuple(tree.label for tree in parse_trees(text, "--trees"))
    if any(label != "chain" for label in labels):
        if sampled and LOOK_AHEAD in schedules:
            raise UsageError(
                f"--trees under sampling: {LOOK_AHEAD} is not validated (its look-ahead is used when the sampled "
                "bonus equals the draft's guess, which acceptance control does not set); drop it from --schedules"
            )
        if not set(schedules) & set(TREE_SCHEDULES):
            raise UsageError(f"--trees: trees run with --schedules {' or '.join(TREE_SCHEDULES)}; asked: {schedules}")
        if not set(heads) & set(TREE_HEADS):
            raise UsageError(f"--trees: trees are validated with the {' or '.join(TREE_HEADS)} head; --heads lacks it")
    return labels


def tree_widths(labels) -> tuple[int, ...]:
    """Token counts the profile must cost for these trees: each verify (ordinary: the nodes; deferred:
    one more) and each draft forward's frontier."""
    widths = set()
    for tree in parse_trees("+".join(labels)):
        if tree.kind != "chain":
            widths |= {tree.node_count, tree.node_count + 1, *tree.frontier_widths()}
    return tuple(sorted(widths))


def decoder_rows(K_max: int, labels) -> int:
    """The fixed width every decoder of the validation runs at: the width python -m measure times the
    target at for the same K_max and tree widths."""
    return width(decode_K(K_max, tree_widths(labels)))


def check_profile_trees(profile_path: str, labels, graphs: bool, rows: int | None) -> None:
    """UsageError unless the profile costs every tree's verify, at the decoders' fixed width (`rows`,
    None on the CPU)."""
    trees = [tree for tree in parse_trees("+".join(labels)) if tree.kind != "chain"]
    if not trees:
        return
    profile = load_profile(profile_path)
    verify = profile.costs[REGIME_OF_GRAPHS_FLAG["on" if graphs else "off"]].verify
    measured = verify.values[verify.axes.index("n_tokens")][-1] if "n_tokens" in verify.axes else 1
    widest = max(trees, key=lambda tree: tree.node_count)
    hint = f"python -m measure --tree-widths {','.join(map(str, tree_widths(labels)))}, or pass --measure"
    if measured < widest.node_count + 1:
        raise UsageError(
            f"profile {profile_path}: its target forward is measured up to {measured:g} tokens, tree "
            f"{widest.label} verifies {widest.node_count + 1}; {hint}"
        )
    fixed = profile.raw["setup"].get("fixed_width")
    if rows is not None and fixed != rows:
        raise UsageError(
            f"profile {profile_path}: measured at fixed width {fixed}, this validation's decoders run at {rows} "
            f"rows; {hint}"
        )


def control_rate(summary_config: dict) -> float | None:
    """The i.i.d. rate of the acceptance control a run was recorded under (None: no control, or a pattern)."""
    control = summary_config.get("acceptance_control") or {}
    return control.get("a") if control.get("kind") == "iid" else None


def predict_by_control(
    profile_path, trace_path, config: Config, probes, placement: str, graphs: bool, edits: tuple, a: float
) -> dict:
    """The simulator's tok/s and mean accepted length for a tree configuration whose acceptance comes
    from the control's rule a=A (not from its trace), on the run's own generations (prompt lengths and
    tokens), averaged over CONTROL_SEEDS seeds of the simulator's draws."""
    resolved = resolve(scenario_for(profile_path, trace_path, config, probes, placement, graphs, edits))
    sim_config = resolved.configs[-1]
    source = control_source(sim_config.tree, a)
    costs = resolved.profile.costs[resolved.regime]
    rows = [
        simulate(costs, sim_config, source, resolved.generations, seed, ceiling=False) for seed in range(CONTROL_SEEDS)
    ]
    return {
        "a": a,
        "seeds": CONTROL_SEEDS,
        "decode_tok_s": sum(row["decode_tok_s"] for row in rows) / len(rows),
        "mean_accepted": sum(row["mean_accepted"] for row in rows) / len(rows),
        "acceptance": source.describe(),
    }
