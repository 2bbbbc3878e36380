"""Replay the study with its derived profile and compare with its published tables.

    python -m sim.study_replay --out reports/study_replay.md

Which published numbers were inputs to the profile (so agree by construction) is said per row.
"""

from __future__ import annotations

from pathlib import Path

from contracts.cli import OneLineParser, run_command
from contracts.files import check_output_file, write_atomic

from .acceptance import EmpiricalLengths, Generation, IIDAcceptance
from .profile import load_profile
from .scenario import Scenario, resolve
from .schedules import Config
from .simulate import simulate


def per_token_rate(acceptance: float, K: int) -> float:
    """The i.i.d. per-token match rate a whose accepted/proposed, (a + ... + a^K) / K, is `acceptance`."""
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if sum(mid**j for j in range(1, K + 1)) / K < acceptance:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _err(sim: float, pub: float) -> str:
    return f"{100 * (sim - pub) / pub:+.1f}%"


def _row(name, pub, sim, fmt="{:.3f}", note=""):
    return f"| {name} | {fmt.format(pub)} | {fmt.format(sim)} | {_err(sim, pub)} | {note} |"


HEADER = "| figure | published | simulated | error | note |\n|---|---|---|---|---|"


def _propose_share(r):
    s = r["phase_share"]
    return s["draft_body"] + s["draft_head"] + s["sync"]


def table_4_7(profile, costs):
    r = resolve(Scenario(profile="study", schedules=("ordinary",)))
    out = [
        "## Table 4.7: phase profile, ordinary schedule (K = 6, 64 tokens, 2 prompts)",
        "Acceptance: the shipped trace (its counts are Table 4.7's: 43 rounds, 86/258 accepted, "
        "126 decode tokens). Propose share = draft body + head + host syncs (the study's proposal "
        "phase includes scalar materialization and sync).",
        "",
    ]
    published = {"dense": (7.587, 16606.9, 0.189, 0.327, 0.454), "flashhead": (7.776, 16203.3, 0.178, 0.335, 0.464)}
    for head, (tok_s, total, propose, verify, finalize) in published.items():
        res = simulate(
            costs, Config("ordinary", head, 6, profile.default_probes, "two-gpu"), r.sources[head], r.generations
        )
        inp = "input: this time sets T_p(6)" if head == "dense" else ""
        out += [
            f"**{head} draft**",
            "",
            HEADER,
            _row("decode tok/s", tok_s, res["decode_tok_s"]),
            _row("decode total ms", total, res["decode_ms"], "{:.1f}"),
            _row("verify total ms", verify * total, res["phase_ms"]["verify"], "{:.1f}", inp),
            _row("propose share", propose, _propose_share(res)),
            _row("verify share", verify, res["phase_share"]["verify"]),
            _row("finalize share", finalize, res["phase_share"]["finalize"]),
            _row("acceptance", 0.333, res["acceptance"], note="input (trace)"),
            _row("mean emitted", 2.930, res["mean_emitted"], note="input (trace)"),
        ]
        if head == "flashhead":
            proposal = res["phase_ms"]["draft_body"] + res["phase_ms"]["draft_head"] + res["phase_ms"]["sync"]
            out += [
                _row("head share of decode wall time", 0.005, res["phase_share"]["draft_head"], "{:.4f}"),
                _row("body share of proposal time", 0.960, res["phase_ms"]["draft_body"] / proposal),
                _row("head share of proposal time", 0.027, res["phase_ms"]["draft_head"] / proposal),
            ]
        out.append("")
    return out


def _iid_run(costs, profile, schedule, head, K, acceptance, prompts, source=None):
    a = per_token_rate(acceptance, K)
    gens = [Generation(f"g{i}", 128, 63) for i in range(prompts)]
    return a, simulate(
        costs, Config(schedule, head, K, profile.default_probes, "two-gpu"), source or IIDAcceptance(a), gens
    )


def table_4_5(profile, costs):
    base = simulate(
        costs,
        Config("baseline", "dense", 6, 1, "two-gpu"),
        IIDAcceptance(0.5),
        [Generation(f"g{i}", 128, 63) for i in range(4)],
    )
    out = [
        "## Table 4.5: end to end, ordinary schedule",
        "K = 6 assumed (the study's diagnostic K); acceptance as i.i.d. per-token matches at the rate "
        "that gives the published accepted/proposed; 4 generations of 64 tokens (not published).",
        "",
        HEADER,
        _row("baseline tok/s", 5.715, base["decode_tok_s"], note="input (sets T_p(1))"),
    ]
    published = {
        "dense": (0.437, 9.769, 1.709, 6001.3, 8783.6, 12352.8, 27301.5),
        "flashhead": (0.430, 9.823, 1.719, 5657.4, 8823.7, 12502.0, 27148.5),
    }
    for head, (acc, tok_s, speedup, propose, verify, finalize, total) in published.items():
        a, res = _iid_run(costs, profile, "ordinary", head, 6, acc, 4)
        out += [
            _row(f"{head}: decode tok/s (a = {a:.3f})", tok_s, res["decode_tok_s"]),
            _row(f"{head}: speedup over baseline", speedup, res["decode_tok_s"] / base["decode_tok_s"]),
            _row(f"{head}: propose share", propose / total, _propose_share(res)),
            _row(f"{head}: verify share", verify / total, res["phase_share"]["verify"]),
            _row(f"{head}: finalize share", finalize / total, res["phase_share"]["finalize"]),
            _row(f"{head}: acceptance", acc, res["acceptance"], note="input"),
        ]
    return out + [""]


def table_4_9(profile, costs):
    gens = [Generation(f"g{i}", 128, 63) for i in range(560)]
    base = simulate(costs, Config("baseline", "dense", 11, 1, "two-gpu"), IIDAcceptance(0.5), gens)
    out = [
        "## Table 4.9 / 4.11: deferred schedule, 560 generations of 64 tokens",
        "The study does not state K. Its own counts imply it: 35,280 decode tokens over 9,407 verify "
        "calls is 3.75 tokens per round, i.e. 2.75 accepted, and at acceptance 0.239 that is 11.5 "
        "proposed per round, so K = 11 is used here (an inference, not a published figure). This run "
        "used longer Spec-Bench prompts than Table 4.5 (its baseline is 5.326 tok/s, not 5.715), which "
        "the profile, fitted to Table 4.5, does not know: compare speedups first. Two acceptance "
        "models: i.i.d. per-token matches at the published accepted/proposed, and all-or-nothing rounds "
        "(accept all 11 or none) in the proportion that gives the published mean emitted; the second "
        "then also lands on the published acceptance, the first does not reach the published mean "
        "emitted: the study's acceptance is bursty, not i.i.d.",
        "",
        HEADER,
        _row("base only tok/s", 5.326, base["decode_tok_s"], note="profile's T_p(1) is from Table 4.5"),
    ]
    published = {
        "dense": (0.239, 3.666, 10.731, 2.015, 9407, 0.438),
        "flashhead": (0.237, 3.642, 11.374, 2.136, 9467, 0.416),
    }
    for head, (acc, emitted, tok_s, speedup, verify_calls, draft_share) in published.items():
        for label, source in (("i.i.d.", None), ("all-or-nothing", _all_or_nothing(emitted, 11))):
            out += _deferred_rows(
                costs, profile, head, label, source, base, acc, emitted, tok_s, speedup, verify_calls, draft_share
            )
    return out + [""]


def _all_or_nothing(mean_emitted: float, K: int) -> EmpiricalLengths:
    """Rounds accept all K or nothing, in the proportion that gives the published mean emitted."""
    full = (mean_emitted - 1) / K
    return EmpiricalLengths({0: 1 - full, K: full})


def _deferred_rows(costs, profile, head, label, source, base, acc, emitted, tok_s, speedup, verify_calls, draft_share):
    a, res = _iid_run(costs, profile, "deferred", head, 11, acc, 560, source)
    name = f"{head} deferred, {label}" + (f" a = {a:.3f}" if source is None else "")
    return [
        _row(f"{name}: decode tok/s", tok_s, res["decode_tok_s"]),
        _row(f"{name}: speedup over base", speedup, res["decode_tok_s"] / base["decode_tok_s"]),
        _row(f"{name}: verify calls", verify_calls, res["verify_calls"], "{:.0f}"),
        _row(f"{name}: append calls", 560, res["append_calls"], "{:.0f}"),
        _row(f"{name}: draft-path share (Table 4.11)", draft_share, res["draft_path_share"]),
        _row(f"{name}: mean emitted", emitted, res["mean_emitted"], note="input" if source else ""),
        _row(f"{name}: acceptance", acc, res["acceptance"], note="input" if source is None else ""),
    ]


def diagnosis(profile):
    """Where the error sits: the draft step the study paid inside its loop, against Table 4.3's."""
    step = 18.330
    in_loop_47 = 0.189 * 16606.9 / (43 * 6)
    in_loop_411 = 1438945.2 / (9407 * 11)
    scale = in_loop_411 / step
    r = resolve(
        Scenario(
            profile="study",
            schedules=("ordinary",),
            edits=(("draft.body_ms", "*=", scale), ("draft.head_dense_ms", "*=", scale)),
        )
    )
    costs = r.profile.costs[r.regime]
    res = simulate(
        costs, Config("ordinary", "dense", 6, profile.default_probes, "two-gpu"), r.sources["dense"], r.generations
    )
    gens = [Generation(f"g{i}", 128, 63) for i in range(560)]
    base = simulate(costs, Config("baseline", "dense", 11, 1, "two-gpu"), IIDAcceptance(0.5), gens)
    deferred = simulate(costs, Config("deferred", "dense", 11, 1, "two-gpu"), _all_or_nothing(3.666, 11), gens)
    return [
        "## Where the error sits",
        "",
        f"The largest gap is the draft proposal. Table 4.3 times a dense draft step at {step} ms, but the "
        f"study's loop paid less per step: Table 4.7's proposal time over its 43 x 6 steps is "
        f"{in_loop_47:.1f} ms, and Table 4.11's dense draft path over 9,407 rounds x 11 steps is "
        f"{in_loop_411:.1f} ms. The profile keeps the microbenchmark (an input), so the simulator "
        "over-charges the proposal, most under deferred (K = 11) where drafting is 44% of the time.",
        "",
        f"As a check (a what-if, not the shipped profile): `--what-if draft.body_ms*={scale:.3f} "
        f"--what-if draft.head_dense_ms*={scale:.3f}` (a {in_loop_411:.1f} ms step) gives:",
        "",
        HEADER,
        _row("Table 4.7 dense ordinary tok/s", 7.587, res["decode_tok_s"], note="what-if"),
        _row(
            "Table 4.9 dense deferred speedup (all-or-nothing)",
            2.015,
            deferred["decode_tok_s"] / base["decode_tok_s"],
            note="what-if",
        ),
        "",
        "The remaining deferred gap is the baseline's T_p(1) (5.326 vs 5.715 tok/s: longer prompts) "
        "and acceptance detail the aggregates do not pin down.",
        "",
    ]


def main(argv=None) -> int:
    return run_command(lambda: _replay(argv))


def _replay(argv) -> int:
    parser = OneLineParser(prog="python -m sim.study_replay", description=__doc__)
    parser.add_argument("--out", default=None, help="write the Markdown report here")
    args = parser.parse_args(argv)
    if args.out:
        check_output_file(Path(args.out), "--out", "Markdown file")
    profile = load_profile("study")
    costs = profile.costs[profile.default_regime]
    text = "\n".join(
        [
            "# The study replayed by the simulator",
            "",
            "Command: `python -m sim.study_replay --out reports/study_replay.md` (CPU, no GPU needed).",
            "Profile: `sim/data/study_profile.json`, STUDY-DERIVED (its notes list every input and assumption).",
            "Error = (simulated - published) / published. Rows marked input agree by construction.",
            "",
            *table_4_7(profile, costs),
            *table_4_5(profile, costs),
            *table_4_9(profile, costs),
            *diagnosis(profile),
        ]
    )
    print(text)
    if args.out:
        write_atomic(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
