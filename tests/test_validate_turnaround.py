"""A verify's turnaround in a timeline (validate/turnaround.py): which work follows each verify and how
long after its end, on two devices and on one, and the report's section of it."""

from validate.report import turnaround_section
from validate.turnaround import turnaround_rows, turnarounds


def _two_devices():
    """Three verifies: the first followed by a redraft 0.2 ms after its end (the look-ahead's steps ran
    during it), the second by a verify 0.3 ms after (a used look-ahead); the last is followed by nothing."""
    return [
        ("target-device", "verify", 0.0, 7.0, {}),
        ("draft-device", "draft_body", 0.1, 0.8, {}),  # look-ahead steps during the verify: not after it
        ("draft-device", "draft_body", 6.0, 7.5, {}),  # one that outlasts the verify but started in it
        ("host", "sync", 7.05, 7.1, {}),
        ("draft-device", "draft_body", 7.2, 7.9, {}),
        ("target-device", "verify", 12.0, 19.0, {}),
        ("draft-device", "draft_body", 12.1, 12.8, {}),
        ("target-device", "verify", 19.3, 26.3, {}),
    ]


def test_each_verify_is_followed_by_the_first_draft_step_or_verify_after_its_end():
    gaps = turnarounds(_two_devices())
    assert [round(g, 6) for g in gaps["draft step"]] == [0.2]
    assert [round(g, 6) for g in gaps["verify"]] == [0.3]


def test_one_device_runs_the_draft_steps_on_the_target_stream():
    one = [
        ("target-device", "verify", 0.0, 5.0, {}),
        ("target-device", "draft_body", 5.4, 6.0, {}),
        ("target-device", "verify", 9.0, 14.0, {}),
    ]
    gaps = turnarounds(one)
    assert [round(g, 6) for g in gaps["draft step"]] == [0.4] and gaps["verify"] == []


def test_rows_compare_both_timelines_and_the_section_renders_them():
    predicted = [(s, n, a + 0.1 * (n == "draft_body"), b, x) for s, n, a, b, x in _two_devices()]
    rows = turnaround_rows(_two_devices(), predicted)
    assert [r["next"] for r in rows] == ["draft step", "verify"]
    assert round(rows[0]["measured_ms"], 6) == 0.2 and round(rows[0]["predicted_ms"], 6) == 0.3
    assert rows[1]["measured_count"] == rows[1]["predicted_count"] == 1
    text = "\n".join(turnaround_section({"configuration": "pd", "turnaround": rows}))
    assert "## A verify's turnaround (pd, its timelines)" in text
    assert "| draft step | 0.200 (1) | 0.300 (1) |" in text
    assert turnaround_section({"configuration": "pd", "turnaround": []}) == []
