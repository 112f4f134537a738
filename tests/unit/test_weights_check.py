"""Weights that are not the model's are refused with one line naming the tensor: missing, unexpected, reshaped, integer types where the model has floats, values that are not finite; a complete checkpoint loads its own weights, half precision upcast."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

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


# ---- values: float types and finite numbers (issue 30) -------------------------------------

UP = "model.layers.2.mlp.up_proj.weight"


def set_value(name: str, value: float, at=(0, 0)):
    def edit(t):
        t[name][at] = value
    return edit


def test_a_nan_weight_is_refused_naming_the_tensor(tmp_path):
    text = refusal(saved(tmp_path, set_value(UP, float("nan"))))
    assert "not numbers the model can use" in text and UP in text, text
    assert "1 value that is not finite" in text, text


def test_an_infinite_weight_is_refused_naming_the_tensor(tmp_path):
    def two_infinities(t):
        t["model.norm.weight"][3] = float("inf")
        t["model.norm.weight"][5] = -float("inf")
    text = refusal(saved(tmp_path, two_infinities))
    assert "model.norm.weight holds 2 values that are not finite" in text, text


def test_float_tensors_saved_as_int8_are_refused_before_loading(tmp_path, monkeypatch):
    import transformers

    def to_int8(t):
        t[UP] = (t[UP] * 100).to(torch.int8)
    folder = saved(tmp_path, to_int8)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the weights were read"))
    text = refusal(folder)
    assert f"tensor {UP} is stored as int8, an integer type" in text, text


def test_an_integer_tensor_in_the_second_shard_is_named(tmp_path):
    from safetensors.torch import save_file as save

    folder = saved(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    names = sorted(tensors)
    half = {"a.safetensors": names[:len(names) // 2], "b.safetensors": names[len(names) // 2:]}
    tensors[names[-1]] = tensors[names[-1]].to(torch.int32)
    for shard, keys in half.items():
        save({k: tensors[k] for k in keys}, folder / shard, metadata={"format": "pt"})
    (folder / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {k: s for s, keys in half.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert f"tensor {names[-1]} is stored as int32" in refusal(folder)


def test_a_pickled_checkpoint_with_an_integer_tensor_is_refused(tmp_path):
    folder = saved(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors[UP] = tensors[UP].to(torch.int16)
    torch.save(tensors, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    assert f"tensor {UP} is stored as int16" in refusal(folder)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_checkpoints_load_upcast(tmp_path, dtype):
    def to_half(t):
        for k in t:
            t[k] = t[k].to(dtype)
    folder = saved(tmp_path, to_half)
    want = load_file(folder / "model.safetensors")
    lm = load_model(str(folder), device="cpu")
    assert lm.dtype == torch.float32
    got = lm.model.state_dict()
    assert all(torch.equal(got[k], v.float()) for k, v in want.items())


def test_weights_that_overflow_half_precision_are_refused_when_loaded_in_it(tmp_path):
    folder = saved(tmp_path, set_value(UP, 1e6))  # finite in float32, inf in float16
    load_model(str(folder), device="cpu")  # float32: loads
    with pytest.raises(ModelLoadError, match=f"{UP} holds 1 value that is not finite .* in "
                                             "float16"):
        load_model(str(folder), device="cpu", dtype="float16")


def test_the_finite_check_is_exact_where_a_sum_overflows():
    from pop_analysis.engine.weight_values import finite, nonfinite_tensor

    big = torch.full((4,), 3e38)  # every value finite, their sum is not
    assert torch.isinf(big.sum()) and finite(big)
    assert finite(torch.tensor([1e4] * 100, dtype=torch.float16))  # sum beyond float16's range
    assert not finite(torch.tensor([1.0, float("nan")]))
    assert nonfinite_tensor([("a", big), ("b", torch.tensor([-float("inf")]))]).startswith(
        "tensor b holds 1 value")


def test_a_quantized_checkpoint_keeps_its_integer_tensors(tmp_path):
    from pop_analysis.engine.weight_values import integer_tensor, quantized

    folder = saved(tmp_path, lambda t: t.update({UP: t[UP].to(torch.int8)}))
    assert integer_tensor([folder / "model.safetensors"]) is not None
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 8}
    (folder / "config.json").write_text(json.dumps(config))
    assert quantized(folder)
    assert integer_tensor([folder / "model.safetensors"], quantized(folder)) is None


@pytest.mark.parametrize("edit, why", [
    (set_value(UP, float("nan")), f"tensor {UP} holds 1 value that is not finite"),
    (lambda t: t.update({UP: t[UP].to(torch.uint8)}), f"tensor {UP} is stored as uint8"),
])
def test_the_serving_engine_never_starts_on_such_a_folder(tmp_path, monkeypatch, edit, why):
    import subprocess

    from pop_analysis.serving.server import Engine, EngineSpec
    from pop_analysis.serving.venv import ServingError

    folder = saved(tmp_path, edit)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("an engine started"))
    with pytest.raises(ServingError) as e:
        Engine(EngineSpec(model_dir=str(folder), name="bad")).start()
    assert why in str(e.value) and "the engine was not started" in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_the_serving_check_reads_a_folder_again_only_when_its_files_change(tmp_path, monkeypatch):
    import os

    from pop_analysis.engine import weight_values
    from pop_analysis.engine.weight_values import folder_problem

    folder = saved(tmp_path)
    assert folder_problem(folder) is None
    reads = []
    real = weight_values._file_tensors
    monkeypatch.setattr(weight_values, "_file_tensors", lambda p: reads.append(p) or real(p))
    assert folder_problem(folder) is None and reads == []  # remembered: not read again
    tensors = load_file(folder / "model.safetensors")
    tensors[UP][1, 1] = float("nan")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    os.utime(folder / "model.safetensors", ns=(1, 1))  # a new version, whatever the clock says
    assert UP in folder_problem(folder)


def damage(folder: Path, how: str) -> None:
    weights = folder / "model.safetensors"
    if how == "truncated":
        weights.write_bytes(weights.read_bytes()[:200])
    elif how == "header":
        weights.write_bytes(b"\xff" * 64)
    elif how == "no weights":
        weights.unlink()
    elif how == "bad index":
        weights.rename(folder / "shard-1.safetensors")
        (folder / "model.safetensors.index.json").write_text("{not json")
    elif how == "missing shard":
        weights.rename(folder / "shard-1.safetensors")
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"a": "shard-1.safetensors", "b": "shard-2.safetensors"}}))


@pytest.mark.parametrize("how, why", [
    ("truncated", "its weights cannot be read ("), ("header", "its weights cannot be read ("),
    ("no weights", "it holds no weight file"), ("bad index", "shard index"),
    ("missing shard", "its weights cannot be read ("),
])
def test_the_serving_check_fails_closed(tmp_path, monkeypatch, how, why):
    """A folder whose weights cannot be read is refused and says why (it used to pass: any
    exception meant "no problem", and the cache kept that answer)."""
    import subprocess

    from pop_analysis.engine.weight_values import folder_problem
    from pop_analysis.serving.server import Engine, EngineSpec
    from pop_analysis.serving.venv import ServingError

    folder = saved(tmp_path)
    assert folder_problem(folder) is None
    damage(folder, how)
    assert why in (folder_problem(folder) or ""), folder_problem(folder)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("an engine started"))
    with pytest.raises(ServingError) as e:
        Engine(EngineSpec(model_dir=str(folder), name="bad")).start()
    assert why in str(e.value) and "the engine was not started" in str(e.value)
    assert "\n" not in str(e.value), str(e.value)


def test_a_failed_read_is_not_remembered(tmp_path, monkeypatch):
    from pop_analysis.engine import weight_values

    folder = saved(tmp_path)
    real = weight_values._file_tensors

    def unreadable(path):
        raise OSError(5, "Input/output error")
        yield  # a generator, as the real reader

    monkeypatch.setattr(weight_values, "_file_tensors", unreadable)
    assert "cannot be read (OSError" in weight_values.folder_problem(folder)
    monkeypatch.setattr(weight_values, "_file_tensors", real)  # the disk is back: read again
    assert weight_values.folder_problem(folder) is None
