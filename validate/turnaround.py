"""A round's turnaround in a timeline (contracts.timeline): how long after a verify ends the next device
work of the loop starts.

Why: in the deferred schedules a verify's end is followed by the settle, the host's read and the host's
bookkeeping before the next draft step (or, after a used look-ahead, the next verify) can start, and
that gap is on every round's critical path; the phase totals do not show it, the timeline does. Each
verify on the target's stream but the last is followed either by a draft step (`draft_body`, on the
draft's stream, or the target's where one device runs both) or by a verify, whichever starts first
after its end.
"""

from __future__ import annotations

from statistics import median

NEXT_WORK = ("draft step", "verify")  # what follows a verify, in the report's rows


def turnarounds(intervals) -> dict[str, list[float]]:
    """Per NEXT_WORK, the ms from each verify's end to that next work's start (timeline intervals)."""
    device = [i for i in intervals if i[0] != "host"]
    verifies = sorted((i for i in device if i[0] == "target-device" and i[1] == "verify"), key=lambda i: i[2])
    steps = sorted(i[2] for i in device if i[1] == "draft_body")
    gaps = {kind: [] for kind in NEXT_WORK}
    for verify, following in zip(verifies, verifies[1:]):
        end = verify[3]
        step = next((start for start in steps if start >= end), None)
        if step is not None and step < following[2]:
            gaps["draft step"].append(step - end)
        else:
            gaps["verify"].append(following[2] - end)
    return gaps


def turnaround_rows(measured, predicted) -> list[dict]:
    """One row per NEXT_WORK seen in either timeline: the median gap (ms) and the count in each."""
    sides = {"measured": turnarounds(measured), "predicted": turnarounds(predicted)}
    rows = []
    for kind in NEXT_WORK:
        if not any(sides[side][kind] for side in sides):
            continue
        row = {"next": kind}
        for side, gaps in sides.items():
            row[f"{side}_ms"] = median(gaps[kind]) if gaps[kind] else None
            row[f"{side}_count"] = len(gaps[kind])
        rows.append(row)
    return rows
