"""The random numbers and the draft's race in a few launches (model/sampling_noise.py) against
model/sampling.py's torch ops: the same uniforms and noise bit for bit, the same drafted token for the
q of every head that samples (dense, FlashHead, shortlist) at T = 0.3, 0.7 and 1.0, with top-k and top-p, and
the same sampled generations through the decoder for every schedule; a changed hash is caught. On a
GPU-less machine the kernels run under triton's interpreter (tests/conftest.py)."""

import pytest
import torch

from contracts import UsageError
from measure import draft_sampling_cost, head_cost
from model import sampling, sampling_noise, triton_support
from model.decoder import Decoder
from model.flashhead import build_clustering
from model.heads import DenseHead, FlashHead, ShortlistHead
from model.sampling import SamplingSettings
from tests.nvidia_ptx import nvidia_compile_output
from tests.sampling_fixtures import tiny_pair

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not triton_support.runs_on(DEVICE), reason="needs triton (on the CPU, its interpreter runs the kernels)"
)
SMALL = {"BLOCK_V": 512}  # several programs: the cross-program race is exercised
TEMPERATURES = (0.3, 0.7, 1.0)
SCHEDULES = ("baseline", "ordinary", "pipelined", "deferred", "pipelined-deferred")


def _seed(sample: int) -> torch.Tensor:
    return torch.tensor([sampling.generation_seed(3, sample)], device=DEVICE)


def _reference_draw(probs, seed, position, purpose=sampling.DRAFT):
    """Today's torch draw (model/sampling.py); `purpose` other than DRAFT is the changed-hash control."""
    tokens = torch.arange(probs.shape[-1], device=probs.device)
    return sampling.race(probs, sampling.exponentials(sampling.keys(seed, position, purpose), tokens))


@pytest.mark.parametrize("purpose", [sampling.DRAFT, sampling.ACCEPT, sampling.RACE])
def test_uniforms_and_noise_equal_the_torch_hash_bit_for_bit(purpose):
    seed = _seed(1)
    positions = torch.tensor([5, 2**31 + 7, 123_456_789_012], device=DEVICE)
    tokens = torch.arange(3001, device=DEVICE)  # not a multiple of the block
    keys = sampling.keys(seed, positions, purpose)
    got = sampling_noise.uniforms(seed, positions, purpose, 3001, launch=SMALL)
    assert torch.equal(got, sampling.uniforms(keys, tokens))
    noise = sampling_noise.exponentials(seed, positions, purpose, 3001)
    assert torch.equal(noise, sampling.exponentials(keys, tokens))
    other = sampling_noise.uniforms(seed, positions + 1, purpose, 3001, launch=SMALL)
    assert not torch.equal(got, other)  # the comparison can fail


def _head_probs(head_kind: str, settings: SamplingSettings, generator, rows: int = 6):
    """q [rows, V] of a random head: dense, FlashHead (zero outside its probed clusters) or a shortlist."""
    weight = torch.randn(2500, 32, generator=generator)
    hidden = torch.randn(rows, 32, generator=generator) * 0.3  # logits of spread about 1.7
    if head_kind == "dense":
        head = DenseHead(weight)
    elif head_kind == "shortlist":
        head = ShortlistHead(weight, torch.randperm(2500, generator=generator)[:300])
    else:
        head = FlashHead(weight, build_clustering(weight, cluster_size=16, iters=2, seed=0), probes=8)
    return sampling.probabilities(head.logits(hidden), settings).to(DEVICE)


@pytest.mark.parametrize("head_kind", ["dense", "flashhead", "shortlist"])
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_draw_equals_todays_race_for_every_head(head_kind, temperature):
    generator = torch.Generator().manual_seed(int(temperature * 10))
    workspace = sampling_noise.new_workspace(DEVICE)
    changed = 0
    for settings in (
        SamplingSettings(temperature=temperature),
        SamplingSettings(temperature=temperature, top_k=40, top_p=0.9),
    ):
        probs = _head_probs(head_kind, settings, generator)
        for row in range(probs.shape[0]):
            q, position, seed = probs[row : row + 1], torch.tensor([7 * row + 1], device=DEVICE), _seed(row)
            got = sampling_noise.draw(q, seed, position, workspace, launch=SMALL)
            assert got.shape == (1,) and got.dtype == torch.int64
            assert got.item() == _reference_draw(q, seed, position).item()
            changed += got.item() != _reference_draw(q, seed, position, purpose=sampling.RACE).item()
    assert not workspace.any()  # left zeroed for the next draw
    assert changed >= 4  # the control: a changed hash draws other tokens


def test_draw_over_scored_tokens_equals_the_draw_over_the_vocabulary():
    """A head's scored slots (token ids out of order, a repeated one at q = 0): the kernels key the noise
    by the token ids, equal to sampling.race_scored and to the draw over the whole vocabulary; keyed by
    slot they draw other tokens (the control)."""
    generator = torch.Generator().manual_seed(5)
    workspace = sampling_noise.new_workspace(DEVICE)
    by_slot = 0
    for row in range(8):
        ids = torch.cat([torch.randperm(2500, generator=generator)[:1200], torch.tensor([17])]).to(DEVICE)
        q = torch.softmax(torch.randn(1, 1201, generator=generator), -1).to(DEVICE)
        q[0, -1] = 0.0
        seed, position = _seed(row), torch.tensor([11 * row + 2], device=DEVICE)
        got = sampling_noise.draw(q, seed, position, workspace, launch=SMALL, tokens=ids.view(1, -1))
        noise = sampling.exponentials(sampling.keys(seed, position, sampling.DRAFT), ids)[0]
        assert got.item() == sampling.race_scored(q[0], noise, ids).item()
        full = torch.zeros(1, 2500, device=DEVICE).index_copy_(1, ids[:-1], q[:, :-1])
        assert got.item() == _reference_draw(full, seed, position).item()
        by_slot += ids[sampling_noise.draw(q, seed, position, workspace, launch=SMALL)].item() != got.item()
    assert not workspace.any()
    assert by_slot >= 6
    uniforms = sampling_noise.uniforms(_seed(1), torch.tensor([3], device=DEVICE), 0, 1201, launch=SMALL, tokens=ids)
    assert torch.equal(uniforms, sampling.uniforms(sampling.keys(_seed(1), torch.tensor([3], device=DEVICE), 0), ids))


def test_an_all_zero_row_and_a_late_winner():
    """Every quotient 0: torch.argmax's lowest index. A single positive entry in the last program wins."""
    seed, position = _seed(0), torch.tensor([4], device=DEVICE)
    zeros = torch.zeros(1, 3000, device=DEVICE)
    assert sampling_noise.draw(zeros, seed, position, launch=SMALL).item() == 0
    late = zeros.clone()
    late[0, 2999] = 1.0
    assert sampling_noise.draw(late, seed, position, launch=SMALL).item() == 2999


def test_backend_choice_and_bad_inputs():
    with pytest.raises(UsageError, match="backend 'cuda'"):
        sampling_noise.SamplingNoise(DEVICE, 10, backend="cuda")
    with pytest.raises(UsageError, match="one contiguous float32 row"):
        sampling_noise.draw(torch.zeros(2, 10, device=DEVICE), _seed(0), torch.tensor([1], device=DEVICE))
    with pytest.raises(UsageError, match="purpose"):
        sampling_noise.uniforms(_seed(0), torch.tensor([1], device=DEVICE), 7, 10)
    empty = sampling_noise.uniforms(_seed(0), torch.zeros(0, dtype=torch.long, device=DEVICE), sampling.ACCEPT, 1)
    assert empty.shape == (0, 1)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the decoder comparison runs both backends on the CPU")
def test_decoder_generations_equal_the_torch_noise(pair):
    """Every schedule x head: the decoder with the kernels (interpreted) emits the torch path's tokens
    (one temperature here: the draw itself is compared at each above)."""
    target, draft = pair
    weight = draft.head_weight
    heads = {"dense": DenseHead(weight), "flashhead": FlashHead(weight, build_clustering(weight, seed=0), probes=2)}
    settings = SamplingSettings(temperature=0.7, seed=5)
    for name, head in heads.items():
        decoder = Decoder(target, draft, head, K=3, graphs=False, phases=False, sampling=settings)
        want = {schedule: decoder.generate([7, 9], 8, schedule, sample=1).tokens for schedule in SCHEDULES}
        decoder.noise_on_target = sampling_noise.SamplingNoise("cpu", decoder.vocab_size, backend="triton")
        decoder.noise_on_draft = sampling_noise.SamplingNoise("cpu", decoder.vocab_size, backend="triton")
        for schedule in SCHEDULES:
            assert decoder.generate([7, 9], 8, schedule, sample=1).tokens == want[schedule], (name, schedule)


# Compiles the race kernel for an H100/H200 (sm_90) without a GPU and prints its division instructions.
_PTX_DIVISIONS = """
from model import sampling_noise
signature = {"probs_ptr": "*fp32", "log_ptr": "*fp32", "work_ptr": "*i64", "token_ptr": "*i64", "V": "i32"}
signature.update(n_programs="i32", BLOCK_V="constexpr")
source = ASTSource(sampling_noise._race_kernel, signature, constexprs={"BLOCK_V": 2048})
kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print(sorted(set(re.findall(r"\\b(?:div|fma|rcp)\\.[a-z0-9.]+", kernel.asm["ptx"]))))
"""


def test_the_gpu_build_divides_with_ieee_rounding():
    """torch divides float32 with IEEE rounding; Triton's `/` is approximate on NVIDIA GPUs."""
    assert nvidia_compile_output(_PTX_DIVISIONS) == "['div.rn.f32']"


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs need a GPU")
def test_draws_inside_a_cuda_graph_at_the_qwen3_vocabulary():
    generator = torch.Generator().manual_seed(9)
    rows = [torch.softmax(torch.randn(1, 151_936, generator=generator) * 3, -1).to(DEVICE) for _ in range(6)]
    probs, seed, position = rows[0].clone(), _seed(0), torch.tensor([11], device=DEVICE)
    noise = sampling_noise.SamplingNoise(DEVICE, 151_936, backend="triton")
    noise.draw(probs, seed, position)  # compiles outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        token = noise.draw(probs, seed, position)
    for index, row in enumerate(rows):
        probs.copy_(row)
        position.fill_(100 + index)
        graph.replay()
        assert token.item() == _reference_draw(row, seed, position).item()
    assert not noise.workspace.any()


def test_head_cost_refuses_a_bad_temperature_in_one_line(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert head_cost.main(["--out", str(out), "--temperature", "-1"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["error: --temperature must be a finite number >= 0 (0 is greedy), got -1.0"]
    assert captured.out == "" and list(tmp_path.iterdir()) == []


def test_sampled_line_shows_each_draw_and_the_agreement():
    timing = {"median_ms": 0.0125, "p10_ms": 0.012, "p90_ms": 0.013}
    result = {"temperature": 0.7, "timings": {"scored q": timing, "scored q + draw": timing}, "same_tokens": 1.0}
    line = draft_sampling_cost.format_sampled("flashhead:64", result)
    assert line.startswith("flashhead:64") and "T=0.7" in line and "scored q + draw   12.50 us" in line
    assert line.endswith("same tokens 1.000")


@pytest.mark.skipif(DEVICE.type != "cuda", reason="times CUDA graphs")
def test_sampled_rows_agree_on_a_gpu():
    """On the GPU too, q over the scored tokens draws what q over the vocabulary draws, for every head."""
    weight = torch.randn(20_000, 256, device=DEVICE).to(torch.bfloat16)
    states = [(torch.randn(1, 256, device=DEVICE).to(torch.bfloat16),) for _ in range(2)]
    heads = {
        "dense": DenseHead(weight),
        "flashhead": FlashHead(weight, build_clustering(weight, iters=3, seed=0), probes=64),
        "shortlist": ShortlistHead(weight, torch.randperm(20_000, device=DEVICE)[:4096]),
    }
    for name, head in heads.items():
        for settings in (SamplingSettings(temperature=0.7), SamplingSettings(temperature=1.0, top_k=50, top_p=0.9)):
            result = draft_sampling_cost.sampled_rows(head, states, settings, DEVICE, 3)
            assert result["same_tokens"] == 1.0, (name, settings)
            assert set(result["timings"]) == {"vocabulary q + draw", "scored q", "scored q + draw"}
