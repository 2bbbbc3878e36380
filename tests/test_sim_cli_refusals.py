"""python -m sim refuses bad input in one line naming the option, exit code 2, before any work: nothing on
stdout and no --out folder."""

import pytest

from sim.__main__ import main
from sim.scenario import DEFAULT_TRACE

REFUSED = [
    # FlashHead budgets past the default profile's 9496 clusters, however they are asked
    (["--head", "flashhead:99999999"], "--head: head 'flashhead:99999999': probes 99999999 exceeds the 9496 FlashHead"),
    (["--head", "flashhead:9497"], "--head: head 'flashhead:9497': probes 9497 exceeds the 9496 FlashHead clusters"),
    (["--head", "flashhead:64,99999"], "--head: head 'flashhead:64,99999': probes 99999 exceeds the 9496"),
    (["--what-if", "head=flashhead:100000"], "--what-if head: head 'flashhead:100000': probes 100000 exceeds"),
    (["--sweep", "head=dense+flashhead:100000"], "--sweep head: head 'flashhead:100000': probes 100000 exceeds"),
    (["--probes", "99999"], "--probes: probes 99999 exceeds the 9496 FlashHead clusters (valid: 1..9496)"),
    # two acceptance sources
    (["--trace", str(DEFAULT_TRACE), "--acceptance", "0.5"], "--trace and --acceptance both set the acceptance"),
    # a what-if key twice
    (["--what-if", "K=4", "--what-if", "K=5"], "--what-if: key 'K' given twice (K=4, K=5)"),
    (["--schedule", "fastest"], "valid: baseline, ordinary, pipelined, deferred, pipelined-deferred, or all"),
    # sweep errors name --sweep
    (["--sweep", "K="], "--sweep 'K=': expected key=value"),
    (["--sweep", "K"], "--sweep 'K': expected key=value"),
    (["--sweep", "=1,2"], "--sweep '=1,2': expected key=value"),
    (["--sweep", "tree="], "--sweep 'tree=': expected key=value"),
    (["--sweep", "head="], "--sweep 'head=': expected key=value"),
    # a what-if over the size limit is named as given
    (["--acceptance", "0.5", "--what-if", "prompts=10000"], "--what-if prompts x default max_new_tokens: 630,000"),
    # an unknown key before its value
    (["--what-if", "x==1"], "unknown what-if key 'x'; valid: probes, K, schedule"),
    # empty values
    (["--profile", ""], "--profile: empty value"),
    (["--trace", ""], "--trace: empty value"),
    (["--acceptance", "trace:"], "--acceptance 'trace:': no trace path given"),
    (["--out", ""], "--out: empty value"),
    (["--timeline", ""], "--timeline: empty value"),
    # empty list items
    (["--sweep", "K=1,,2"], "--sweep K: empty item in '1,,2'"),
    (["--schedule", "deferred+"], "--schedule: empty item in 'deferred+'"),
    (["--arms-K", "2++4", "--policy", "ucb1"], "--arms-K: empty item in '2++4'"),
    (["--head", "flashhead:1,,2"], "--head: empty item in 'flashhead:1,,2'; valid: dense, flashhead"),
    (["--head", "dense+"], "--head: empty item in 'dense+'"),
    (["--sweep", "tree=chain+"], "--sweep tree: empty item in 'chain+'; valid: chain"),
    (["--sweep", "tree=chain++2x1"], "--sweep tree: empty item in 'chain++2x1'"),
    # options that change nothing
    (["--arms-K", "2+4"], "--arms-K sets the K values of a policy's arms: it needs --policy"),
    (["--head", "dense", "--probes", "3"], "--probes sets the probes of the flashhead head: it needs --head flashhead"),
]


@pytest.mark.parametrize("argv,message", REFUSED)
def test_refused_in_one_line_before_any_work(tmp_path, capsys, argv, message):
    out_dir = tmp_path / "never"
    given_out = [] if "--out" in argv else ["--out", str(out_dir)]
    assert main([*argv, "--no-ceiling", *given_out]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: "), captured.err
    assert message in captured.err
    assert captured.out == "" and not out_dir.exists()


def test_schedule_all_is_every_schedule(capsys):
    """--help gives `all` as --schedule's default, as python -m model and validate take it."""
    argv = ["--acceptance", "0.5", "--prompts", "1", "--max-new-tokens", "4", "--head", "dense", "--no-ceiling"]
    assert main([*argv, "--schedule", "all"]) == 0
    every = capsys.readouterr().out
    assert main(argv) == 0
    assert every == capsys.readouterr().out
