"""Bad input gets one clear message; nothing crashes with a traceback-only error."""

import pytest
import torch

from pop_analysis.engine.adapter import DecoderAdapter, UnsupportedArchitecture
from pop_analysis.engine.generate import SamplingConfig, encode, run
from pop_analysis.engine.models import ModelLoadError, load_model
from pop_analysis.engine.pop import PromptError, run_prompt
from pop_analysis.engine.skipset import SkipSetError, describe, parse_layers, preset, resolve
from tiny import tiny_model


def test_unknown_model_names_the_choices():
    with pytest.raises(ModelLoadError, match="unknown model 'no-such-model'.*smollm2-135m"):
        load_model("no-such-model")


def test_local_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="cannot read the config"):
        load_model(str(tmp_path))


def test_unsupported_architecture_lists_supported(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=32, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="unsupported architecture.*supported: .*llama"):
        load_model(str(tmp_path))


def test_adapter_refuses_unsupported_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(UnsupportedArchitecture, match="gpt2"):
        DecoderAdapter(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2)))


def test_local_directory_model_without_tokenizer(tmp_path):
    lm = tiny_model("llama")
    lm.model.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu")
    assert loaded.tokenizer is None and loaded.adapter.n_layers == 6
    out = run(loaded, [1, 2, 3], "pop", (4, 5), SamplingConfig(max_new_tokens=3, stop_at_eos=False))
    assert len(out.token_ids) == 3 and out.text is None
    with pytest.raises(ValueError, match="no tokenizer"):
        encode(loaded, "hello")


@pytest.mark.parametrize("layers, message", [
    ((30,), r"out of range: the model has layers 0..29"),
    ((-1,), r"out of range"),
    (tuple(range(30)), "cannot skip all 30 layers"),
])
def test_impossible_skip_sets(layers, message):
    with pytest.raises(SkipSetError, match=message):
        resolve(30, layers=layers)


def test_skip_set_parsing_and_ratio():
    assert parse_layers("20-22, 5") == (5, 20, 21, 22)
    assert resolve(30, ratio=0.33) == tuple(range(20, 30))
    assert resolve(30, ratio=0.0) == ()
    assert preset("shallow", 30) == tuple(range(10))
    assert preset("interleaved", 30) == tuple(range(2, 30, 3))
    assert describe((3, 20, 21, 22)) == "3, 20-22"
    for bad in ("a-b", "5-3", "x"):
        with pytest.raises(SkipSetError):
            parse_layers(bad)
    with pytest.raises(SkipSetError, match=r"\[0, 1\)"):
        resolve(30, ratio=1.0)
    with pytest.raises(SkipSetError, match="not several"):
        resolve(30, layers="1", ratio=0.2)
    with pytest.raises(SkipSetError, match="unknown preset"):
        preset("deep", 30)


def test_empty_prompt_and_prompt_too_long():
    lm = tiny_model("llama")  # context 256
    with pytest.raises(PromptError, match="empty"):
        run(lm, [], "pop", (5,), SamplingConfig(max_new_tokens=2))
    with pytest.raises(PromptError, match="exceeds the model's context of 256"):
        run(lm, [1] * 250, "pop", (5,), SamplingConfig(max_new_tokens=10))


def test_unknown_variant():
    lm = tiny_model("llama")
    with pytest.raises(ValueError, match="unknown variant 'fast'"):
        run_prompt(lm.adapter, torch.tensor([[1, 2]]), "fast", ())


def test_empty_text_prompt(embedded):
    with pytest.raises(ValueError, match="empty"):
        encode(embedded, "   ")
