"""The run setting: one frozen value, one validator, the same refusal line from every way in."""
import argparse

import pytest

from pop_analysis.commands._common import add_skip_args, setting_from_args
from pop_analysis.engine.skipset import parse_layers, resolve
from pop_analysis.errors import InputError
from pop_vllm.run_setting import RunSetting, SettingError, check_served
from pop_vllm.settings import engine_setting


def test_a_setting_is_normalised_and_hashable():
    s = RunSetting([29, 20, 20.0], "pop_no_boundary")
    assert s.skip == (20, 29) and s.variant == "pop_no_boundary" and s.active
    assert s == RunSetting((20, 29), "pop_no_boundary") and len({s, RunSetting((29, 20), s.variant)}) == 1
    assert RunSetting.full() == RunSetting((), "full") and not RunSetting.full().active
    assert not RunSetting((3,), "full").active and not RunSetting(()).active


def test_derived_facts_of_each_variant():
    assert RunSetting((4, 5), "static").decode_drop == (4, 5)
    assert RunSetting((4, 5)).decode_drop == ()
    assert RunSetting((4, 5)).boundary and not RunSetting((4, 5), "pop_no_boundary").boundary
    assert RunSetting((4, 5)).skip_mode == "kv" and RunSetting((4, 5), "pop_no_kv").skip_mode == "drop"
    assert RunSetting.full().skip_mode is None
    assert RunSetting((7, 3)).first_skipped(10) == 3 and RunSetting.full().first_skipped(10) == 10


@pytest.mark.parametrize("skip, variant, words", [
    ("20", "pop", "list of layer indices"),
    ([2.5], "pop", "integer layer indices"),
    ([True], "pop", "integer layer indices"),
    (["3"], "pop", "integer layer indices"),
    ([-1], "pop", "numbered from 0"),
    ([3], "half", "unknown variant 'half'"),
    ((), "pop_repair", "needs a non-empty skip set"),
])
def test_a_setting_that_can_never_run_is_refused_where_it_is_built(skip, variant, words):
    with pytest.raises(SettingError, match=words) as e:
        RunSetting(skip, variant)
    assert "\n" not in str(e.value) and isinstance(e.value, InputError)


def test_the_one_validator_against_a_model():
    assert RunSetting((28, 29)).check(30) == RunSetting((28, 29))
    for skip, words in (((30,), r"layer\(s\) 30 out of range: the model has layers 0\.\.29"),
                        (range(30), "cannot skip all 30 layers"),
                        ((40, 41, 42), r"layer\(s\) 40-42 out of range")):
        with pytest.raises(SettingError, match=words):
            RunSetting(skip).check(30)
    with pytest.raises(SettingError, match="no layers"):
        RunSetting(()).check(0)


def test_every_way_in_refuses_with_the_same_line():
    """Layers beyond the model, typed on the CLI, in a link's text, sent to an engine or built in
    code: one message."""
    p = argparse.ArgumentParser()
    add_skip_args(p)
    lines = set()
    for refuse in (lambda: setting_from_args(p.parse_args(["--skip", "28-31"]), 30),
                   lambda: parse_layers("28-31", 30),
                   lambda: resolve(30, layers="28-31"),
                   lambda: engine_setting({"skip": [28, 29, 30, 31]}, 30),
                   lambda: RunSetting(range(28, 32)).check(30)):
        with pytest.raises(SettingError) as e:
            refuse()
        lines.add(str(e.value))
    assert lines == {"layer(s) 30-31 out of range: the model has layers 0..29"}, lines
    for refuse in (lambda: resolve(6, layers="0-5"), lambda: engine_setting({"skip": range(6)}, 6)):
        with pytest.raises(SettingError, match="cannot skip all 6 layers"):
            refuse()


def test_what_an_engine_serves():
    assert check_served(RunSetting((3,))) == RunSetting((3,))
    for setting, words in ((RunSetting((3,), "pop_no_kv"), "per-layer sequence lengths"),
                           (RunSetting((3,), "static"), "removes layers in decode too"),
                           (RunSetting((3,), "pop_repair"), "needs a repair maps file")):
        with pytest.raises(SettingError, match=words):
            check_served(setting)


def test_config_round_trip_and_replace(tmp_path):
    maps = tmp_path / "m.safetensors"
    maps.write_bytes(b"")
    s = RunSetting((4, 3), "pop_repair", str(maps))
    assert RunSetting.from_config(s.as_config(), 30) == s
    assert s.as_config() == {"skip": [3, 4], "variant": "pop_repair", "repair": str(maps)}
    assert RunSetting((3,)).replace(variant="full") == RunSetting((3,), "full")
    with pytest.raises(SettingError, match="pop_repair only"):
        s.replace(variant="pop")  # a replaced copy passes the same checks as a new one
    with pytest.raises(SettingError, match="does not exist"):
        RunSetting((3,), "pop_repair", str(tmp_path / "gone")).check(30)
