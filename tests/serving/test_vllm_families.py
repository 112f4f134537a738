"""The vLLM plugin on the other registered families: tiny random Qwen3 (q_norm/k_norm) and Qwen2
(qkv bias) models saved here, served by vLLM with the POP plugin and compared token for token with
POP Lab's own generation on the same weights (greedy, chunked prefill with a 16-token budget)."""
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.models import model_from_hf

from vllm_driver import ROOT, Driver, check_venv, ok

SHAPE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32,  # vLLM's CPU attention: >= 32
             max_position_embeddings=512, tie_word_embeddings=False, use_sliding_window=False,
             bos_token_id=None, eos_token_id=None, pad_token_id=None, torch_dtype="float32")
FAMILIES = {"Qwen3ForCausalLM": Qwen3Config, "Qwen2ForCausalLM": Qwen2Config}
SKIP = [3, 4, 5]
N_NEW = 6


def _model(arch: str, seed: int):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(FAMILIES[arch](**SHAPE)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # random init is near-uniform: no greedy ties
        for layer in model.model.layers:  # Qwen2's qkv bias, random so the bias path matters
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                if proj.bias is not None:
                    proj.bias.normal_(0, 0.05)
    folder = ROOT / "cache" / "vllm_test" / f"tiny-{arch}"
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def families():
    check_venv()
    prompts = [torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (23, 41, 9)]
    models, jobs = {}, []
    for seed, arch in enumerate(FAMILIES):
        models[arch], folder = _model(arch, seed)
        jobs.append({"model": str(folder), "architecture": arch, "pop": {"skip": SKIP},
                     "engine": {"dtype": "float32", "enforce_eager": True, "max_model_len": 256,
                                "enable_prefix_caching": False, "skip_tokenizer_init": True,
                                "max_num_batched_tokens": 16, "max_num_seqs": 4, "seed": 0},
                     "runs": [{"prompts": prompts, "max_tokens": N_NEW},
                              {"set": {"skip": [], "variant": "pop"}, "prompts": prompts,
                               "max_tokens": N_NEW}]})
    driver = Driver("families", jobs)
    try:
        cfg = SamplingConfig(max_new_tokens=N_NEW, stop_at_eos=False)
        ref = {}
        for arch, model in models.items():
            lm = model_from_hf(model, name=arch)
            ref[arch] = {v: [run(lm, p, v, tuple(SKIP) if v == "pop" else (), cfg).token_ids
                             for p in prompts] for v in ("pop", "full")}
    finally:
        results = driver.results()
    return prompts, dict(zip(FAMILIES, results)), ref


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_family_pop_and_full_equal_pop_lab(families, arch):
    prompts, results, ref = families
    runs = ok(results[arch])["runs"]
    assert ref[arch]["pop"] != ref[arch]["full"]  # POP changes these tokens: the test can fail
    assert runs[0]["tokens"] == ref[arch]["pop"]
    assert runs[0]["stats"]["pruned_tokens"] == sum(len(p) - 1 for p in prompts)
    assert runs[1]["tokens"] == ref[arch]["full"]
