"""Models split over devices (accelerate's device_map): the POP loop moves hidden states, rotary
embeddings and masks to each layer's device. CPU-only machines have one real device, so one test
puts the deep layers on the `meta` device: any tensor left behind on the CPU makes torch raise,
so a clean run proves every hand-over happened; a second loads through accelerate with a
multi-part map and must give the single-device tokens (with a single real device transformers
attaches no hooks, so that test covers the loading path, the meta test the hand-overs)."""
import pytest
import torch
from test_families import build

from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.models import load_model
from pop_analysis.engine.pop import decode_step, greedy_batch, run_prompt
from pop_vllm.run_setting import RunSetting

from tiny import tiny_prompt


def split_to_meta(name: str, first_meta: int):
    """A tiny model whose layers first_meta.., final norm and lm_head live on `meta`."""
    lm = build(name)
    for layer in lm.model.model.layers[first_meta:]:
        layer.to("meta")
    lm.model.model.norm.to("meta")
    lm.model.lm_head.to("meta")
    return lm


@pytest.mark.parametrize("name", ["llama", "gemma3_text"])
@pytest.mark.parametrize("variant", ["full", "pop"])
def test_hidden_states_cross_devices_in_prefill_boundary_and_decode(name, variant):
    lm = split_to_meta(name, first_meta=2)
    a = lm.adapter
    assert a.device.type == "cpu" and a.layer_device(2).type == "meta"
    ids = torch.tensor([tiny_prompt(12)])  # longer than Gemma's tiny window: masks move too
    first = run_prompt(a, ids, RunSetting((4, 5), variant))  # layers 4, 5 project K/V on meta
    assert first.logits.device.type == "meta" and first.logits.shape == (1, a.shape.vocab)
    kinds = [a.cached_kv(first.cache, i)[0].device.type for i in range(a.n_layers)]
    assert kinds == ["cpu"] * 2 + ["meta"] * 4, kinds
    assert [a.cache_length(first.cache, i) for i in (0, 4)] == [a.cache_length(first.cache, 0)] * 2
    logits = decode_step(a, torch.tensor([[5]]), first.cache, first.position)
    assert logits.shape == (1, a.shape.vocab)


def test_padded_batch_crosses_devices():
    lm = split_to_meta("gemma2", first_meta=3)
    from pop_analysis.engine.pop import left_pad

    ids, mask = left_pad([tiny_prompt(12), tiny_prompt(5, seed=4)])
    first = run_prompt(lm.adapter, ids, RunSetting((4, 5)), attention_mask=mask)
    assert first.logits.device.type == "meta" and first.logits.shape[0] == 2


def test_load_model_with_multi_part_device_map_matches_single_device(tmp_path):
    lm = build("gemma3_text")
    lm.model.save_pretrained(tmp_path)
    n = lm.adapter.n_layers
    parts = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu",
             "lm_head": "cpu"}
    parts.update({f"model.layers.{i}": "cpu" for i in range(n)})
    split = load_model(str(tmp_path), device="cpu", dtype="float32", device_map=parts)
    plain = load_model(str(tmp_path), device="cpu", dtype="float32")
    cfg = SamplingConfig(max_new_tokens=6, stop_at_eos=False)
    ids = tiny_prompt(12)
    for variant in ("full", "pop"):
        assert run(split, ids, RunSetting((4, 5), variant), cfg).token_ids == \
            run(plain, ids, RunSetting((4, 5), variant), cfg).token_ids
    assert greedy_batch(split.adapter, [ids, ids[:5]], RunSetting((4, 5)), 4) == \
        greedy_batch(plain.adapter, [ids, ids[:5]], RunSetting((4, 5)), 4)
    auto = load_model(str(tmp_path), device="cpu", dtype="float32", device_map="auto")
    want = run(plain, ids, RunSetting((4, 5)), cfg).token_ids
    assert run(auto, ids, RunSetting((4, 5)), cfg).token_ids == want
