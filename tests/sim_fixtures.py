"""A small hand-checkable profile and trace for the simulator tests."""

import json


def timing(ms):
    return {"median_ms": ms, "p10_ms": ms, "p90_ms": ms, "n": 1}


def tiny_profile(placement="one-gpu", **host):
    """Target forward 10 + n ms, draft body 2 ms, dense head 1 ms, FlashHead 0.25 + p/100 ms."""
    host_costs = {"item_ms": 0.1, "copy_token_ms": 0.2, "event_sync_ms": 0.05, "round_bookkeeping_ms": 0.0}
    host_costs.update(host)
    return {
        "schema": "specloop.profile/1",
        "created": "test",
        "env": {},
        "setup": {
            "target": {"name": "t", "weights": "synthetic"},
            "draft": {"name": "d", "weights": "synthetic"},
            "placement": placement,
            "prompt_lengths": [8],
            "default_regime": "eager",
        },
        "flashhead": {"clusters": 64, "cluster_size": 16, "default_probes": 4},
        "regimes": {
            "eager": {
                "target": {
                    "forward_ms": {"points": [dict(timing(10.0 + n), n_tokens=n, context=8) for n in (1, 2, 3)]},
                    "prefill_ms": timing(50.0),
                },
                "draft": {
                    "body_ms": timing(2.0),
                    "head_dense_ms": timing(1.0),
                    "head_flashhead_ms": {"points": [dict(timing(0.25 + p / 100), probes=p) for p in (1, 4, 64)]},
                    "append_ms": timing(2.0),
                    "prefill_ms": timing(5.0),
                    "kv_crop_ms": timing(0.0),
                },
                "host": {k: timing(v) for k, v in host_costs.items()},
            }
        },
        "notes": ["test profile"],
    }


def tensor_parallel_section(fixed_width=None):
    """tp2 over 2 layers, rows of 8 bytes: compute 4 + n ms, prefill 20 ms, an all-reduce 0.5 ms at 8 bytes
    rising to 1.0 ms at 64; measured with its all-reduces exactly compute + 4 all-reduces."""

    def all_reduce(nbytes):
        return 0.5 + 0.5 * (nbytes - 8) / 56

    rows = [(n, max(n, fixed_width or 0)) for n in (1, 2, 3)]
    return {
        "ranks": 2,
        "target": {"name": "t-bf16", "weights": "synthetic", "dtype": "bfloat16"},
        "layers": 2,
        "hidden_size": 4,
        "dtype_bytes": 2,
        "fixed_width": fixed_width,
        "regime": "eager",
        "all_reduce_ms": {"points": [dict(timing(all_reduce(b)), bytes=b) for b in (8, 64)]},
        "forward_ms": {"points": [dict(timing(4.0 + n), n_tokens=n, context=8) for n, _ in rows]},
        "prefill_ms": {"points": [dict(timing(20.0), prompt_len=8)]},
        "measured_forward_ms": {
            "points": [dict(timing(4.0 + n + 4 * all_reduce(8 * r)), n_tokens=n, context=8) for n, r in rows]
        },
    }


def trace_lines(accepted, K=2, decode=None, lookahead=None, prompt_id="p0", prompt_len=8):
    lines, context = [], prompt_len + 1
    remaining = decode if decode is not None else sum(a + 1 for a in accepted)
    for i, a in enumerate(accepted):
        emitted = min(a + 1, remaining)
        lines.append(
            {
                "schema": "specloop.trace/1",
                "prompt_id": prompt_id,
                "round": i,
                "schedule": "ordinary",
                "head": "dense",
                "probes": None,
                "K": K,
                "proposed": K,
                "accepted": a,
                "emitted": emitted,
                "verify_skipped": a == 0,
                "context": context,
                "lookahead_used": None if lookahead is None else lookahead[i],
            }
        )
        remaining -= emitted
        context += a + 1
    return lines


def write(tmp_path, profile=None, lines=None):
    paths = []
    if profile is not None:
        p = tmp_path / "profile.json"
        p.write_text(json.dumps(profile))
        paths.append(p)
    if lines is not None:
        t = tmp_path / "trace.jsonl"
        t.write_text("".join(json.dumps(x) + "\n" for x in lines))
        paths.append(t)
    return paths


def tiny_heads_profile(**agreement):
    """tiny_profile with a heads section: dense 1 ms; shortlist 0.1 ms at 100 tokens to 0.5 ms at 1,000
    (linear between); router 2 ms at 8 clusters, 3 ms at 32. Pooled agreement shortlist 0.5 / 0.9,
    router 0.6 / 0.95, FlashHead 0.3 / 0.9 at 1 / 64 probes (override with keyword `pooled`); one
    per-position curve (shortlist:1000,100: prefix 0.8, 0.2)."""
    profile = tiny_profile()
    kinds = {
        "dense": [dict(timing(1.0), budget=None)],
        "shortlist": [dict(timing(0.1), budget=100), dict(timing(0.5), budget=1000)],
        "router": [dict(timing(2.0), budget=8), dict(timing(3.0), budget=32)],
    }
    pooled = {
        "shortlist": [{"budget": 100, "n": 50, "agree": 0.5}, {"budget": 1000, "n": 50, "agree": 0.9}],
        "router": [{"budget": 8, "n": 50, "agree": 0.6}, {"budget": 32, "n": 50, "agree": 0.95}],
        "flashhead": [{"budget": 1, "n": 50, "agree": 0.3}, {"budget": 64, "n": 50, "agree": 0.9}],
    }
    curve = [{"position": i + 1, "n": 20, "agree": a, "prefix": p} for i, (a, p) in enumerate([(0.8, 0.8), (0.3, 0.2)])]
    profile["heads"] = {
        "cost": {"weights": "synthetic", "source": "test", "kinds": kinds},
        "agreement": {
            "weights": "synthetic",
            "source": "test",
            "curves": {"shortlist:1000,100": curve},
            "pooled": agreement.get("pooled", pooled),
        },
    }
    return profile


VERIFY_EXTRA_MS = 3.0  # what sampling adds to every target forward's decision in sampled_costs_profile
SAMPLED_DENSE_HEAD_MS = 4.0  # the greedy dense head costs 1 ms in tiny_profile


def sampled_costs_profile(placement="one-gpu", profile: dict | None = None) -> dict:
    """tiny_profile (or `profile`) with sampling costs: the sampled verify 3 ms over the greedy one at every
    n_tokens, the dense head 4 ms and FlashHead 2 ms under sampling; no beta curves."""
    profile = tiny_profile(placement) if profile is None else profile
    profile["sampling"] = {
        "costs": {
            "temperature": 0.7,
            "top_k": 0,
            "top_p": 1.0,
            "regimes": {
                "eager": {
                    "verify_greedy_ms": {"points": [dict(timing(0.5), n_tokens=n) for n in (1, 2, 3)]},
                    "verify_sampled_ms": {
                        "points": [dict(timing(0.5 + VERIFY_EXTRA_MS), n_tokens=n) for n in (1, 2, 3)]
                    },
                    "head_dense_ms": timing(SAMPLED_DENSE_HEAD_MS),
                    "head_flashhead_ms": {"points": [dict(timing(2.0), probes=p) for p in (1, 4, 64)]},
                }
            },
        }
    }
    return profile
