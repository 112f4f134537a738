"""Weights that are not the model's are refused with one line naming the tensor: missing, unexpected, reshaped; a complete checkpoint loads its own weights."""
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pop_analysis.engine.models import ModelLoadError, load_model

from tiny import saved


def refusal(folder: Path) -> str:
    with pytest.raises(ModelLoadError) as e:
        load_model(str(folder), device="cpu")
    text = str(e.value)
    assert "\n" not in text, text
    return text


def test_a_complete_checkpoint_loads_with_its_own_weights(tmp_path):
    folder = saved(tmp_path)
    want = load_file(folder / "model.safetensors")
    lm = load_model(str(folder), device="cpu")
    got = lm.model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in want.items())


def test_missing_tensors_are_named(tmp_path):
    def drop_layer_1(t):
        for k in [k for k in t if ".layers.1." in k]:
            del t[k]
    text = refusal(saved(tmp_path, drop_layer_1))
    assert "not this model's" in text and "9 missing" in text, text
    assert "model.layers.1.input_layernorm.weight" in text, text
    assert "model.layers.1.self_attn.v_proj.weight" not in text, "only the first few are named"


def test_a_safetensors_file_without_the_models_tensors_is_refused(tmp_path):
    def replace_all(t):
        t.clear()
        t["something.else"] = torch.zeros(4)
    text = refusal(saved(tmp_path, replace_all))
    assert "missing" in text and "1 unexpected (something.else)" in text, text


def test_unexpected_tensors_are_named(tmp_path):
    text = refusal(saved(tmp_path, lambda t: t.update({"model.extra.weight": torch.zeros(3)})))
    assert "1 unexpected (model.extra.weight)" in text and "missing" not in text, text


def test_wrong_shapes_name_both_shapes(tmp_path):
    text = refusal(saved(tmp_path, lambda t: t.update({"model.norm.weight": torch.ones(7)})))
    assert "model.norm.weight" in text and "(7,)" in text and "(64,)" in text, text


def test_tied_embeddings_omitted_from_the_checkpoint_load(tmp_path):
    folder = saved(tmp_path, tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(folder / "model.safetensors")
    lm = load_model(str(folder), device="cpu")
    assert lm.model.lm_head.weight.data_ptr() == lm.model.model.embed_tokens.weight.data_ptr()
