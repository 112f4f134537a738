"""The int8 serving checkpoint (serving/int8_checkpoint.py): the chosen layers' Linears hold
exactly POP Lab's int8 prompt weights and scales, everything else is the model's own fp32, the
config declares Int8Linear's scheme and names the fp32 layers; bad input refused in one line."""
import json

import pytest
import torch
from safetensors.torch import load_file

from pop_analysis.engine.int8 import Int8Linear
from pop_analysis.errors import InputError
from pop_analysis.serving.int8_checkpoint import write
from tiny import saved


def test_chosen_layers_hold_pop_labs_int8_weights_and_the_rest_is_untouched(tmp_path):
    src = saved(tmp_path)
    original = load_file(str(src / "model.safetensors"))
    n = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    dst = write(src, tmp_path / "w8a8", layers=[0, 2])
    got = load_file(str(dst / "model.safetensors"))
    q = got["model.layers.0.self_attn.q_proj.weight"]
    lin = torch.nn.Linear(1, 1, bias=False)
    lin.weight = torch.nn.Parameter(original["model.layers.0.self_attn.q_proj.weight"])
    ref = Int8Linear(lin)
    assert q.dtype == torch.int8 and torch.equal(q, ref.weight_t.t())
    assert torch.equal(got["model.layers.0.self_attn.q_proj.weight_scale"][:, 0], ref.scale)
    int8 = {k for k, v in got.items() if v.dtype == torch.int8}
    assert {k.split(".")[2] for k in int8} == {"0", "2"}
    assert len(int8) == 2 * 7, "q, k, v, o, gate, up and down of each chosen layer"
    for name, tensor in original.items():  # every other tensor as it was
        if name not in int8:
            assert torch.equal(got[name], tensor), name
    quant = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors"
    group = quant["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "channel" and group["input_activations"]["dynamic"]
    assert group["input_activations"]["strategy"] == "token"
    fp32 = {i for i in range(n) if i not in (0, 2)}
    assert {int(x.split(".")[2]) for x in quant["ignore"] if x != "lm_head"} == fp32
    assert "lm_head" in quant["ignore"]


def test_bad_input_is_refused_in_one_line(tmp_path):
    src = saved(tmp_path)
    with pytest.raises(InputError, match=r"int8 layer\(s\) 9 out of range: the model has layers 0"):
        write(src, tmp_path / "w8a8", layers=[9])
    with pytest.raises(InputError, match="at least one int8 layer"):
        write(src, tmp_path / "w8a8", layers=[])
    with pytest.raises(InputError, match="holds no converted model"):
        write(tmp_path / "nowhere", tmp_path / "w8a8")
    with pytest.raises(InputError, match="another folder"):
        write(src, src)
    assert not (tmp_path / "w8a8").exists(), "nothing written before the checks pass"


def test_the_int8_copys_kv_gets_a_key_of_its_own(tmp_path):
    """An int8 prefill instance's K/V are not an fp32 one's: the copy's quantization config
    enters the settings key (and the connector's folder); the fp32 model's keys are as before."""
    from pop_vllm import kv_keys
    from pop_vllm.run_setting import RunSetting

    src = saved(tmp_path)
    a, b = write(src, tmp_path / "a", layers=[0, 1]), write(src, tmp_path / "b", layers=[0])
    tags = [kv_keys.weights_tag(x) for x in (a, b, src, tmp_path / "nowhere", None)]
    assert tags[0] != tags[1] and len(tags[0]) == 16 and tags[2:] == [None, None, None]
    pop, full = RunSetting((2, 3), "pop"), RunSetting.full()
    assert kv_keys.settings_key(full) is None and kv_keys.settings_key(full, tags[0]) is not None
    assert kv_keys.settings_key(pop, tags[0]) not in (kv_keys.settings_key(pop),
                                                     kv_keys.settings_key(pop, tags[1]))
    assert kv_keys.settings_key(pop, None) == kv_keys.settings_key(pop)
    assert kv_keys.storage_dir(tmp_path, "m", pop, tags[0]) != kv_keys.storage_dir(tmp_path, "m", pop)
    extra = kv_keys.transfer_config("kv_consumer", tmp_path, "d-0", pop, tags[0])
    assert kv_keys.producer_key(extra["kv_connector_extra_config"]) == \
        (kv_keys.settings_key(pop, tags[0]), "pop")
