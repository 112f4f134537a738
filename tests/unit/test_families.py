"""The shared family runner: every supported architecture passes the same checks on a tiny
random config. Full path equals HF `generate`; POP runs and leaves every layer's cache as the full
model leaves it (sliding windows included); the independent K/V equal the layer's own K/V path.
Prompts are longer than the tiny sliding window (8), so windowed masks and caches are exercised.
"""
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3Config,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    SiglipVisionConfig,
)

from pop_analysis.engine.adapter import DecoderAdapter, UnsupportedArchitecture
from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.models import ModelLoadError, load_model, model_from_hf
from pop_analysis.engine.pop import LayerPlan, decode_step, prefill, run_prompt, teacher_force
from pop_vllm.run_setting import RunSetting

from tiny import FAMILIES, GEMMA, LOCAL_GLOBAL, SLIDING_FAMILIES, WINDOW, tiny_prompt

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              image_size=28, patch_size=14)


def gemma3_image_text():
    text = Gemma3TextConfig(**GEMMA, layer_types=LOCAL_GLOBAL)
    vision = SiglipVisionConfig(**VISION).to_dict()
    return Gemma3Config(text_config=text.to_dict(), vision_config=vision,
                        mm_tokens_per_image=4, image_token_index=255, boi_token_index=254,
                        eoi_token_index=253)


# name -> (config factory, attention implementation)
RUNNER = {name: (make, "sdpa") for name, make in FAMILIES.items()}
RUNNER.update({
    "mistral_sliding": (SLIDING_FAMILIES["mistral_sliding"], "sdpa"),
    # Gemma-2: alternating local/global layers, attention and final logit soft-capping (eager).
    "gemma2": (lambda: Gemma2Config(**GEMMA), "eager"),
    # Gemma-3 text: k_norm/q_norm, separate local and global rotary embeddings.
    "gemma3_text": (SLIDING_FAMILIES["gemma3_text"], "sdpa"),
    "gemma3_text_eager": (lambda: Gemma3TextConfig(**GEMMA, layer_types=LOCAL_GLOBAL), "eager"),
    # Gemma-3 image-text checkpoints (model_type gemma3, as Gemma-3-12B ships): text prompts run
    # through the language model.
    "gemma3_image_text": (gemma3_image_text, "sdpa"),
})
SKIP = (4, 5)  # the last third of 6 layers: one local and one global layer on every Gemma
GREEDY = SamplingConfig(max_new_tokens=10, stop_at_eos=False)


def build(name: str, seed: int = 0):
    torch.manual_seed(seed)
    make, attn = RUNNER[name]
    config = make()
    config._attn_implementation = attn
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # sharpen random logits so greedy picks are not ties
    return model_from_hf(model, name=f"tiny-{name}")


@pytest.fixture(scope="module", params=sorted(RUNNER))
def lm(request):
    return build(request.param)


def hf_greedy(lm, ids, n):
    out = lm.model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_full_path_and_empty_pop_equal_hf_generate(lm):
    ids = tiny_prompt(14)  # longer than the window
    ref = hf_greedy(lm, ids, GREEDY.max_new_tokens)
    for variant in ("full", "pop"):
        ours = run(lm, ids, RunSetting((), variant), GREEDY).token_ids
        assert ours == ref, f"{lm.name} {variant}: {ours} vs HF {ref}"


def test_first_logits_equal_hf_forward(lm):
    """Embedding scale, norms, windows and logit soft-capping all match HF's forward."""
    ids = torch.tensor([tiny_prompt(13)])
    with torch.inference_mode():
        ref = lm.model(input_ids=ids).logits[:, -1].float()  # (1, V)
    for variant in ("full", "pop"):
        ours = run_prompt(lm.adapter, ids, RunSetting((), variant)).logits
        diff = (ours - ref).abs().max().item()
        assert diff < 1e-4, f"{lm.name} {variant}: max_diff {diff}"


def test_pop_runs_and_fills_caches_like_the_full_model(lm):
    a = lm.adapter
    ids = torch.tensor([tiny_prompt(15)])
    pop = run_prompt(a, ids, RunSetting(SKIP))
    assert torch.isfinite(pop.logits).all()
    with torch.inference_mode():
        hf = lm.model(input_ids=ids, use_cache=True).past_key_values
    for i in range(a.n_layers):
        want = (hf.layers[i].keys.shape[-2], hf.layers[i].get_seq_length())
        got = (a.cache_length(pop.cache, i), a.seen_length(pop.cache, i))
        assert got == want, f"{lm.name} layer {i}: (held, seen) {got} vs full model {want}"
    out = run(lm, tiny_prompt(15), RunSetting(SKIP), GREEDY).token_ids
    assert len(out) == GREEDY.max_new_tokens


def test_skipped_layers_hold_projection_of_last_kept_output(lm):
    """After the pruned prefill, a skipped (possibly sliding) layer holds exactly the K/V a full
    layer would have kept: the last min(N-1, W-1) projections of the last kept layer's output."""
    a = lm.adapter
    ids = torch.tensor([tiny_prompt(15)])[:, :-1]  # x_1..x_{N-1}
    cache = a.new_cache()
    prefill(a, ids, cache, LayerPlan(SKIP, "kv"))
    ref_cache = a.new_cache()
    with torch.inference_mode():
        h = a.embed(ids)
        pos = a.positions(0, ids.shape[1])
        rope = a.rotary(h, pos)
        for i in range(min(SKIP)):
            h = a.run_layer(i, h, pos, rope, ref_cache, a.layer_mask(i, ref_cache, ids.shape[1]))
        for i in SKIP:
            k_ref, v_ref = a.project_kv(i, h, rope)
            k, v = a.cached_kv(cache, i)
            held = k.shape[-2]
            assert held == (min(14, WINDOW - 1) if a.windows[i] else 14), (i, held)
            dk = (k - k_ref[:, :, -held:]).abs().max().item()
            dv = (v - v_ref[:, :, -held:]).abs().max().item()
            assert dk < 1e-5 and dv < 1e-5, f"{lm.name} layer {i}: max_diff k {dk} v {dv}"


def test_independent_kv_equals_layers_own_kv_path(lm):
    """project_kv reproduces what each layer's own attention caches for the same input."""
    a = lm.adapter
    ids = torch.tensor([tiny_prompt(12)])
    with torch.inference_mode():
        h = torch.randn(1, 12, a.shape.hidden, generator=torch.Generator().manual_seed(3))
        pos = a.positions(0, 12)
        rope = a.rotary(a.embed(ids), pos)
        for i in range(a.n_layers):
            cache = a.new_cache()
            a.run_layer(i, h, pos, rope, cache, a.layer_mask(i, cache, 12))
            k_ref, v_ref = a.cached_kv(cache, i)
            k, v = a.project_kv(i, h, rope)
            held = k_ref.shape[-2]
            diff = max((k[:, :, -held:] - k_ref).abs().max().item(),
                       (v[:, :, -held:] - v_ref).abs().max().item())
            assert diff < 1e-5, f"{lm.name} layer {i}: max_diff {diff}"


def test_teacher_forced_chunk_equals_step_by_step(lm):
    """A chunk after a POP prompt (masks with a cache, windows crossing the chunk) = one by one."""
    a = lm.adapter
    ids = torch.tensor([tiny_prompt(12)])
    cont = torch.tensor([tiny_prompt(9, seed=9)])
    first = run_prompt(a, ids, RunSetting(SKIP))
    chunk = teacher_force(a, cont, first.cache, first.position)  # (1, 9, V)
    second = run_prompt(a, ids, RunSetting(SKIP))
    steps = [decode_step(a, cont[:, t:t + 1], second.cache, second.position + t) for t in range(9)]
    diff = (chunk[0] - torch.cat(steps)).abs().max().item()
    assert diff < 1e-4, f"{lm.name}: max_diff {diff}"


def test_gemma_specifics():
    """Scaled embeddings, soft-capped logits, and two distinct rotary embeddings on Gemma-3."""
    g2 = build("gemma2").adapter
    ids = torch.tensor([tiny_prompt(6)])
    with torch.inference_mode():
        raw = g2.base.embed_tokens.weight[ids]  # (1, 6, D)
        assert torch.allclose(g2.embed(ids), raw * 64 ** 0.5)
        logits = g2.logits(torch.randn(1, 3, 64) * 100)
    assert logits.abs().max().item() <= 30.0 + 1e-4
    g3 = build("gemma3_text").adapter
    with torch.inference_mode():
        rope = g3.rotary(g3.embed(ids), g3.positions(0, 6))
    local, glob = rope["sliding_attention"][0], rope["full_attention"][0]
    assert (local - glob).abs().max().item() > 1e-2  # a wrong pick would fail the K/V test


def test_unsupported_architecture_has_a_clear_error(tmp_path):
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=64,
                        bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config)
    with pytest.raises(UnsupportedArchitecture, match="unsupported architecture .*'gpt2'"):
        DecoderAdapter(model)
    model.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="unsupported architecture GPT2LMHeadModel") as err:
        load_model(str(tmp_path), device="cpu")
    assert "\n" not in str(err.value) and "gemma3_text" in str(err.value)


def test_unsupported_attention_kernel_has_a_clear_error():
    model = build("llama").model
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(UnsupportedArchitecture, match="attention implementation 'flex_attention'"):
        DecoderAdapter(model)


def test_image_text_gemma3_checkpoint_loads_and_runs_pop(tmp_path):
    """A Gemma-3 image-text checkpoint (how Gemma-3-12B ships) loads by path and runs POP on text."""
    src = build("gemma3_image_text")
    src.model.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), device="cpu", dtype="float32")
    assert lm.card()["model_type"] == "gemma3" and lm.adapter.n_layers == 6
    ids = tiny_prompt(12)
    want = hf_greedy(lm, ids, GREEDY.max_new_tokens)
    assert run(lm, ids, RunSetting.full(), GREEDY).token_ids == want
    assert len(run(lm, ids, RunSetting(SKIP), GREEDY).token_ids) == GREEDY.max_new_tokens
