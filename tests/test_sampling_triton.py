"""The fused sampling verify (model/sampling_triton.py) against its torch reference (model/sampling.py):
bit-identical (accepted, final) from the same random numbers, on random rounds and on every edge
(shortlist q with zeros, a = 0, a = K, p = q, exact ties across programs, underflowing quotients),
with controls showing the comparison can fail. On a GPU-less machine the kernel runs under triton's
interpreter (tests/conftest.py), where every program is simulated in Python: few, small programs."""

import pytest
import torch

from contracts import UsageError
from model import sampling_triton, triton_support
from model.sampling import verify_block_reference
from tests.nvidia_ptx import nvidia_compile_output

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not triton_support.runs_on(DEVICE), reason="needs triton (on the CPU, its interpreter runs the kernels)"
)
SMALL = {"BLOCK_V": 64}  # several programs on small vocabularies: the cross-program reduction is exercised


def _distribution(generator, rows, vocab, zero_share):
    """Random probability rows with about `zero_share` of entries exactly zero (never a whole row)."""
    logits = torch.randn(rows, vocab, generator=generator) * 3
    zero = torch.rand(rows, vocab, generator=generator) < zero_share
    zero[:, 0] &= ~zero.all(dim=1)
    return torch.softmax(logits.masked_fill(zero, float("-inf")), dim=-1)


def _round(generator, K, V, kind):
    """One round's inputs. kind: "shortlist" (q zero outside a random shortlist, drafts drawn from q),
    "close" (q near p: long accepted runs), "equal" (q = p: accepted until a draft
    that neither gives mass, then a zero residual),
    "any" (drafts anywhere, q(d) or p(d) may be 0), "tied" (coarse values, unit noise: exact ties)."""
    target = _distribution(generator, K + 1, V, zero_share=0.3)
    if kind == "close":
        draft = torch.softmax(target[:K].clamp(min=1e-30).log() + 0.05 * torch.randn(K, V, generator=generator), -1)
    elif kind == "equal":
        draft = target[:K].clone()
    elif kind == "tied":
        target = torch.randint(0, 3, (K + 1, V), generator=generator).float() / 8
        target[:, 0] += 1 / 8  # no all-zero row
        draft = torch.randint(0, 3, (K, V), generator=generator).float() / 8
    else:
        draft = _distribution(generator, K, V, zero_share=0.7)
    if kind in ("any", "tied"):
        tokens = torch.randint(0, V, (K,), generator=generator)
    else:
        tokens = torch.multinomial(draft, 1, generator=generator).view(K)
    if kind == "equal":  # u q(d) < p(d) = q(d) whenever q(d) > 0 (u < 1): the first zero-mass draft rejects
        rejected = int(torch.randint(0, K, (1,), generator=generator))
        target[rejected, 0], draft[rejected, 0], tokens[rejected] = 0.0, 0.0, 0
    uniforms = torch.rand(K, generator=generator)
    noise = torch.ones(V) if kind == "tied" else torch.empty(V).exponential_(generator=generator)
    return tuple(t.to(DEVICE) for t in (target, draft, tokens, uniforms, noise))


def _raced(target, draft, accepted):
    """The row the reference races (for the coverage counts): residual, its fallback p, or the bonus p."""
    K = draft.shape[0]
    if accepted == K:
        return target[K], "bonus"
    residual = (target[accepted] - draft[accepted]).clamp(min=0)
    return (residual, "residual") if residual.sum() > 0 else (target[accepted], "fallback")


def _same(inputs, launch=SMALL, workspace=None):
    want = verify_block_reference(*inputs)
    got = sampling_triton.verify_block(*inputs, workspace=workspace, launch=launch)
    assert got[0].shape == (1,) and got[1].shape == (1,) and got[0].dtype == got[1].dtype == torch.int64
    assert (got[0].item(), got[1].item()) == (want[0].item(), want[1].item()), inputs
    return want[0].item(), want[1].item()


def test_random_rounds_match_the_reference_bit_for_bit():
    generator = torch.Generator().manual_seed(0)
    workspace = sampling_triton.new_workspace(DEVICE)
    seen = {"a=0": 0, "0<a<K": 0, "a=K": 0, "residual": 0, "fallback": 0, "bonus": 0, "tie": 0, "q(d)=0": 0}
    kinds = ("shortlist", "close", "equal", "any", "tied")
    for case in range(100):
        K = int(torch.randint(1, 9, (1,), generator=generator))
        V = int(torch.randint(1, 170, (1,), generator=generator))
        inputs = _round(generator, K, V, kinds[case % len(kinds)])
        accepted, _ = _same(inputs, workspace=workspace)
        target, draft, tokens, _, noise = inputs
        seen["a=0" if accepted == 0 else "a=K" if accepted == K else "0<a<K"] += 1
        raced, source = _raced(target, draft, accepted)
        seen[source] += 1
        quotient = raced / noise
        seen["tie"] += int((quotient == quotient.max()).sum() > 1)
        seen["q(d)=0"] += int((draft[torch.arange(K, device=DEVICE), tokens] == 0).any())
    assert not workspace.any()  # every call left it zeroed
    assert min(seen.values()) >= 3, seen  # every path was taken, several times


def test_a_full_block_races_the_bonus_row():
    generator = torch.Generator().manual_seed(1)
    target, draft, tokens, _, noise = _round(generator, 4, 150, "shortlist")
    uniforms = torch.zeros(4, device=DEVICE)  # 0 < p(d) wherever q(d) > 0: every position accepts
    accepted, final = _same((target, draft, tokens, uniforms, noise))
    assert accepted == 4 and final == int((target[4] / noise).argmax())


def test_p_equal_q_rejected_falls_back_to_p():
    generator = torch.Generator().manual_seed(2)
    target, draft, tokens, uniforms, noise = _round(generator, 3, 150, "equal")
    accepted, final = _same((target, draft, tokens, uniforms, noise))
    assert accepted < 3 and final == int((target[accepted] / noise).argmax())  # the residual is all zero


def test_exact_ties_across_programs_pick_the_lowest_index():
    target = torch.zeros(3, 200)
    target[:, [190, 70, 130]] = 1 / 3  # three equal maxima in three different programs of 64
    draft = torch.zeros(2, 200)
    draft[:, 5] = 1.0
    tokens = torch.tensor([5, 5])
    inputs = [t.to(DEVICE) for t in (target, draft, tokens, torch.zeros(2), torch.ones(200))]
    assert _same(inputs) == (0, 70)  # p(5) = 0 rejects; the residual is p; 70 < 130 < 190
    inputs[4] = inputs[4].clone()
    inputs[4][70] = 1.5  # 70's quotient drops below the others': 130 wins
    assert _same(inputs) == (0, 130)


def test_a_positive_residual_whose_quotients_underflow_is_still_the_residual():
    # r > 0 only at token 3, by 1e-38, which noise 1e10 divides to 0: every residual quotient is 0, so
    # the lowest index, 0, wins; its fallback p (raced where r is all zero) would pick token 7.
    target = torch.full((2, 100), 0.01)
    target[0, 5] = 0.0  # the draft token: p(d) = q(d) = 0 rejects
    draft = target[:1].clone()
    target[0, 3], draft[0, 3] = 2e-38, 1e-38
    noise = torch.full((100,), 1e10)
    noise[7] = 1e9
    inputs = [t.to(DEVICE) for t in (target, draft, torch.tensor([5]), torch.rand(1), noise)]
    residual = (inputs[0][0] - inputs[1][0]).clamp(min=0)
    assert residual.sum() > 0 and not (residual / inputs[4]).any()
    assert _same(inputs) == (0, 0)
    inputs[1] = inputs[1].clone()
    inputs[1][0, 3] = 2e-38  # now r is all zero: p is raced
    assert _same(inputs) == (0, 7)


def test_perturbed_inputs_change_the_result():
    """The comparison can fail: moving one random number moves the outcome, in both implementations."""
    generator = torch.Generator().manual_seed(3)
    inputs = list(_round(generator, 4, 150, "close"))
    inputs[3] = torch.zeros(4, device=DEVICE)
    accepted, final = _same(inputs)
    assert accepted == 4
    inputs[0] = inputs[0].clone()
    inputs[0][2, inputs[2][2]] = 0.0  # p(d_3) = 0: position 3 rejects
    assert _same(inputs)[0] == 2
    noise = inputs[4].clone()
    winner = _same(inputs)[1]
    noise[winner] *= 1e6  # the winner's quotient collapses: another token wins
    inputs[4] = noise
    assert _same(inputs)[1] != winner


def test_a_wrong_rule_is_caught_by_the_comparison():
    """The negative control: drawing the correction from p instead of the residual (the classic bug)
    disagrees with the kernel on random rounds, so agreement with the reference is evidence."""
    generator = torch.Generator().manual_seed(4)
    differ = 0
    for _ in range(12):
        target = _distribution(generator, 3, 120, zero_share=0.0).to(DEVICE)
        draft = torch.softmax(3 * target[:2].log(), dim=-1)  # sharper than p: no residual on p's top tokens
        tokens = torch.multinomial(draft.cpu(), 1, generator=generator).view(2).to(DEVICE)
        uniforms = torch.rand(2, generator=generator).to(DEVICE)
        noise = torch.empty(120).exponential_(generator=generator).to(DEVICE)
        accepted, final = sampling_triton.verify_block(target, draft, tokens, uniforms, noise, launch=SMALL)
        wrong = int((target[int(accepted)] / noise).argmax())
        differ += int(final) != wrong
    assert differ >= 3


def test_a_realistic_vocabulary_matches_the_reference():
    generator = torch.Generator().manual_seed(5)
    inputs = _round(generator, 5, 151_936, "shortlist")  # Qwen3's vocabulary, default launch shape
    _same(inputs, launch=None)


def test_backend_choice_and_bad_inputs():
    on_cuda = DEVICE.type == "cuda"
    assert sampling_triton.BlockVerifier(DEVICE).backend == ("triton" if on_cuda else "torch")
    verifier = sampling_triton.BlockVerifier(DEVICE, backend="triton")
    inputs = _round(torch.Generator().manual_seed(6), 3, 100, "shortlist")
    assert [v.item() for v in verifier(*inputs)] == [v.item() for v in verify_block_reference(*inputs)]
    assert not verifier.workspace.any()
    with pytest.raises(UsageError, match="choose from"):
        sampling_triton.BlockVerifier(DEVICE, backend="cuda")
    target, draft, tokens, uniforms, noise = inputs
    for bad in (
        (target[:3], draft, tokens, uniforms, noise),
        (target, draft, tokens[:2], uniforms, noise),
        (target, draft, tokens, uniforms, noise[:99]),
        (target.double(), draft, tokens, uniforms, noise),
    ):
        with pytest.raises(UsageError):
            sampling_triton.verify_block(*bad)


def test_bandwidth_floor_counts_the_raced_rows_and_the_gathers():
    assert sampling_triton.verify_bytes(4, 1000) == 4 * 20 + 3 * 4000  # p, q and noise rows
    assert sampling_triton.verify_bytes(4, 1000, bonus=True) == 4 * 20 + 2 * 4000  # no q row after a full block
    assert sampling_triton.verify_bytes(8, 262_144) == 160 + 12 * 262_144


# Compiles the kernel for an H100/H200 (sm_90) without a GPU and prints the PTX division instructions.
_PTX_DIVISIONS = """
from model import sampling_triton
signature = {name: "*fp32" for name in ("p_ptr", "q_ptr", "uniform_ptr", "noise_ptr")}
signature.update({name: "*i64" for name in ("token_ptr", "work_ptr", "accepted_ptr", "final_ptr")})
signature.update({name: "i32" for name in ("p_stride", "q_stride", "K", "V", "n_programs")})
signature.update(BLOCK_K="constexpr", BLOCK_V="constexpr")
source = ASTSource(sampling_triton._verify_kernel, signature, constexprs={"BLOCK_K": 8, "BLOCK_V": 2048})
kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print(sorted(set(re.findall(r"\\b(?:div|fma|rcp)\\.[a-z0-9.]+", kernel.asm["ptx"]))))
"""


def test_the_gpu_build_divides_with_ieee_rounding():
    """torch divides float32 with IEEE rounding; Triton's `/` compiles to an approximate division on
    NVIDIA GPUs, which would break bit-identity on a GPU where the interpreter (numpy) cannot see it."""
    assert nvidia_compile_output(_PTX_DIVISIONS) == "['div.rn.f32']"


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs need a GPU")
def test_runs_inside_a_cuda_graph():
    generator = torch.Generator().manual_seed(7)
    rounds = [_round(generator, 4, 151_936, kind) for kind in ("shortlist", "close", "equal", "tied")]
    static = [t.clone() for t in rounds[0]]
    workspace = sampling_triton.new_workspace(DEVICE)
    sampling_triton.verify_block(*static, workspace=workspace)  # compiles outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        accepted, final = sampling_triton.verify_block(*static, workspace=workspace)
    for inputs in rounds:
        for buffer, value in zip(static, inputs):
            buffer.copy_(value)
        graph.replay()
        want = verify_block_reference(*inputs)
        assert (accepted.item(), final.item()) == (want[0].item(), want[1].item())
    assert not workspace.any()
