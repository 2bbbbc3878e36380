"""The real decoder: our own Qwen3 and Gemma3 with static KV caches, CUDA graphs, Triton kernels, AWQ
int4 weights, dense and FlashHead draft heads, and the five schedules (`python -m model`).

API (needs torch; imported on first use, so `import model` alone stays light):
    pair = model.load_pair("tiny-qwen3", "tiny-qwen3-draft", placement="cpu")
    pair.size_caches(prompt_lengths, new_tokens, K)
    generation = pair.decoder(pair.head("flashhead"), K=4).generate(prompt_ids, 32, "deferred")
It writes the trace and run summary of `contracts.trace` (see `model.trace`).
"""

from contracts.cli import api_attribute

_API = {
    "load_pair": "model.pair",
    "resolve_placement": "model.pair",
    "Pair": "model.pair",
    "Decoder": "model.decoder",
    "select_prompts": "model.prompts",
    "load_model": "model.loading",
}


def __getattr__(name):
    return api_attribute(_API, __name__, name)
