"""The timeline (`schema: "specloop.timeline/1"` in `otherData`): what each stream did during one
generation, in the Chrome trace event format that chrome://tracing and https://ui.perfetto.dev open.

The simulator (`python -m sim --timeline`) and the decoder (`python -m model --timeline`) write the
same format with the same names, so a measured and a predicted generation can be laid side by side
(`python -m validate` draws both). An interval is `(stream, name, start_ms, end_ms, args)`:
- stream: `target-device`, `draft-device` (empty where both models share one device) or `host`;
- name: a phase or event of the loop (`TIMELINE_NAMES`). On a device stream it is the device's work;
  on the host `sync` is a read, `host_gap` the host's time from a read to its next launch, and any
  other name the host's time issuing a launch of that work (category `issue`);
- times in ms from the decode start of the generation (its first token on the host); the prefills
  run before it, so they have negative times.
In the file, times are µs (`ts`, `dur`), one complete event (`ph: "X"`) per interval, one thread
(`tid`) per stream, named by metadata events (`ph: "M"`, `thread_name`). `otherData` says what the
timeline shows: its source (`simulator` or `decoder`), configuration, generation and weights.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from contracts.cli import UsageError
from contracts.files import read_text, write_atomic

TIMELINE_SCHEMA = "specloop.timeline/1"
TIMELINE_STREAMS = ("target-device", "draft-device", "host")
# Device work by phase (`prefill` the target's, `initial` the draft's), the token copies between two
# devices, host reads (`sync`) and the host's gap after a read.
TIMELINE_NAMES = (
    "prefill",
    "initial",
    "draft_body",
    "draft_head",
    "verify",
    "finalize",
    "sync",
    "copy_tokens",
    "host_gap",
)
TIMELINE_SOURCES = ("simulator", "decoder")
PID = 1


def category(stream: str, name: str) -> str:
    """`device` (a device's work), or on the host `read` (sync), `gap` (host_gap) or `issue`."""
    if stream != "host":
        return "device"
    return {"sync": "read", "host_gap": "gap"}.get(name, "issue")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_interval(interval, where: str = "timeline") -> None:
    """Raise UsageError unless `interval` is (stream, name, start_ms, end_ms, args) as the format has it."""
    if not isinstance(interval, (tuple, list)) or len(interval) != 5:
        raise UsageError(f"{where}: an interval is (stream, name, start_ms, end_ms, args), got {interval!r}")
    stream, name, start, end, args = interval
    if stream not in TIMELINE_STREAMS:
        raise UsageError(f"{where}: unknown stream {stream!r}; valid: {', '.join(TIMELINE_STREAMS)}")
    if name not in TIMELINE_NAMES:
        raise UsageError(f"{where}: unknown event name {name!r}; valid: {', '.join(TIMELINE_NAMES)}")
    if not (_number(start) and _number(end)) or end < start:
        raise UsageError(f"{where}: {name} needs finite times with start <= end, got {start!r}, {end!r}")
    if not isinstance(args, dict):
        raise UsageError(f"{where}: args must be an object, got {args!r}")


def check_timeline(obj, where: str = "timeline") -> None:
    """Raise UsageError unless `obj` is a timeline as written by `write_timeline`."""
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise UsageError(f"{where}: expected a JSON object with a traceEvents list (Chrome trace format)")
    if obj.get("displayTimeUnit") != "ms":
        raise UsageError(f'{where}: displayTimeUnit must be "ms", got {obj.get("displayTimeUnit")!r}')
    other = obj.get("otherData")
    if not isinstance(other, dict) or other.get("schema") != TIMELINE_SCHEMA:
        schema = other.get("schema") if isinstance(other, dict) else None
        raise UsageError(f"{where}: unknown timeline schema {schema!r} in otherData (expected {TIMELINE_SCHEMA!r})")
    if other.get("source") not in TIMELINE_SOURCES:
        raise UsageError(
            f"{where}: otherData.source must be one of {', '.join(TIMELINE_SOURCES)}, got {other.get('source')!r}"
        )
    if not isinstance(other.get("weights"), str):
        raise UsageError(f"{where}: otherData.weights must say which weights (synthetic, real, ...)")
    threads = {}
    for number, event in enumerate(obj["traceEvents"]):
        at = f"{where}: traceEvents[{number}]"
        if not isinstance(event, dict):
            raise UsageError(f"{at}: expected an object")
        if event.get("ph") == "M":
            if event.get("name") == "thread_name":
                name = (event.get("args") or {}).get("name") if isinstance(event.get("args"), dict) else None
                if name not in TIMELINE_STREAMS or not isinstance(event.get("tid"), int):
                    raise UsageError(
                        f"{at}: thread_name must name a stream ({', '.join(TIMELINE_STREAMS)}) "
                        f"with an integer tid, got {name!r}"
                    )
                threads[event["tid"]] = name
        elif event.get("ph") != "X":
            raise UsageError(f'{at}: ph must be "X" (complete event) or "M" (metadata), got {event.get("ph")!r}')
    if sorted(threads.values()) != sorted(TIMELINE_STREAMS) or len(threads) != len(TIMELINE_STREAMS):
        raise UsageError(f"{where}: thread_name metadata must name the streams {', '.join(TIMELINE_STREAMS)} once each")
    for number, event in enumerate(obj["traceEvents"]):
        if event["ph"] != "X":
            continue
        at = f"{where}: traceEvents[{number}]"
        for key in ("name", "cat", "ts", "dur", "pid", "tid", "args"):
            if key not in event:
                raise UsageError(f"{at}: a complete event needs {key!r}")
        if event["tid"] not in threads:
            raise UsageError(f"{at}: tid {event['tid']!r} is not a named stream")
        if not (_number(event["dur"]) and event["dur"] >= 0 and _number(event["ts"])):
            raise UsageError(f"{at}: ts and dur must be finite numbers of µs, dur >= 0")
        check_interval(
            (threads[event["tid"]], event["name"], event["ts"], event["ts"] + event["dur"], event["args"]), at
        )
        if event["cat"] != category(threads[event["tid"]], event["name"]):
            raise UsageError(
                f"{at}: cat must be {category(threads[event['tid']], event['name'])!r} for "
                f"{event['name']} on {threads[event['tid']]}, got {event['cat']!r}"
            )


def timeline_object(intervals, meta: dict) -> dict:
    """The Chrome trace object of `intervals` (times in ms) with `meta` as its otherData."""
    events = [{"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": "specloop"}}]
    for tid, stream in enumerate(TIMELINE_STREAMS, 1):
        events.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": stream}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid, "args": {"sort_index": tid}})
    for number, interval in enumerate(intervals):
        check_interval(interval, f"interval {number}")
    for stream, name, start, end, args in sorted(intervals, key=lambda x: (x[2], TIMELINE_STREAMS.index(x[0]))):
        events.append(
            {
                "name": name,
                "cat": category(stream, name),
                "ph": "X",
                "ts": start * 1e3,
                "dur": (end - start) * 1e3,
                "pid": PID,
                "tid": TIMELINE_STREAMS.index(stream) + 1,
                "args": dict(args),
            }
        )
    other = {"schema": TIMELINE_SCHEMA, **meta}
    if other.get("weights") == "synthetic":
        other.setdefault("label", "SYNTHETIC weights: real architectures, seeded random values (timings are real)")
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_timeline(path: str | Path, intervals, meta: dict) -> None:
    """Write `intervals` ((stream, name, start_ms, end_ms, args), ms from the decode start) as a Chrome
    trace. `meta` becomes otherData: it needs `source` (simulator or decoder) and `weights`."""
    obj = timeline_object(intervals, meta)
    check_timeline(obj, str(path))
    write_atomic(path, json.dumps(obj, indent=1) + "\n")


def read_timeline(path: str | Path) -> tuple[list[tuple], dict]:
    """A timeline file, checked: (its intervals, times in ms, ordered by start; its otherData)."""
    path = Path(path)
    try:
        obj = json.loads(read_text(path, "timeline"))
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not valid JSON ({e.msg})") from None
    check_timeline(obj, str(path))
    threads = {
        e["tid"]: e["args"]["name"] for e in obj["traceEvents"] if e["ph"] == "M" and e.get("name") == "thread_name"
    }
    intervals = [
        (threads[e["tid"]], e["name"], e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3, e["args"])
        for e in obj["traceEvents"]
        if e["ph"] == "X"
    ]
    return sorted(intervals, key=lambda x: x[2]), obj["otherData"]
