"""The vLLM plugin's pure parts, in the main venv (no vLLM, no engine): the per-step token plan
(which tokens of a flattened batch take POP's pruned path) and the settings parser.

Hypothesis draws batches of requests with random prompt lengths, progress, chunk sizes and decode
mixes; examples are derandomised so the module gives the same verdict every run.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pop_vllm.engine_env import engine_env  # noqa: E402
from pop_vllm.plan import first_full_position, plan_step  # noqa: E402
from pop_vllm.repair import check_maps  # noqa: E402
from pop_vllm.run_setting import RunSetting, SettingError  # noqa: E402
from pop_vllm.settings import PopSettingsError, overrides  # noqa: E402
from pop_vllm.settings import engine_setting as parse
from pop_vllm.step import StepFacts  # noqa: E402
from pop_vllm.variants import SERVED as VARIANTS  # noqa: E402

settings.register_profile("plan", max_examples=150, deadline=None, derandomize=True, database=None)
settings.load_profile("plan")


@st.composite
def requests(draw):
    """One request in a step: (prompt_len, computed, scheduled); prefill chunks or a decode."""
    prompt = draw(st.integers(1, 64))
    if draw(st.booleans()):  # still in its prompt: a chunk of the rest of it
        computed = draw(st.integers(0, prompt - 1))
        scheduled = draw(st.integers(1, prompt - computed))
    else:  # decoding (or recomputing generated tokens after preemption)
        computed = draw(st.integers(prompt, prompt + 40))
        scheduled = draw(st.integers(1, 2))
    return prompt, computed, scheduled


batches = st.lists(requests(), min_size=1, max_size=8)


def _arrays(batch):
    return tuple(np.array(col, dtype=np.int64) for col in zip(*batch))


@given(batches, st.sampled_from(VARIANTS), st.integers(0, 5))
def test_plan_partitions_the_step(batch, variant, padding):
    prompt, computed, scheduled = _arrays(batch)
    total = int(scheduled.sum())
    p = plan_step(prompt, computed, scheduled, variant, total + padding)
    assert p.n_full + p.n_pruned + p.n_padding == p.n_tokens == total + padding
    both = np.concatenate([p.full_index, p.pruned_index])
    assert sorted(both.tolist()) == list(range(total))  # every real token once, padding never
    assert int(p.full_counts.sum()) == p.n_full


@given(batches, st.sampled_from(VARIANTS))
def test_full_tokens_are_a_suffix_and_follow_the_boundary(batch, variant):
    prompt, computed, scheduled = _arrays(batch)
    p = plan_step(prompt, computed, scheduled, variant)
    full = set(p.full_index.tolist())
    first = first_full_position(prompt, variant)
    start = 0
    for r, (n_prompt, done, n) in enumerate(batch):
        flags = [start + t in full for t in range(n)]
        assert flags == sorted(flags)  # pruned* full*: the full tokens form a suffix
        assert sum(flags) == p.full_counts[r]
        for t in range(n):
            pos = done + t
            assert flags[t] == (pos >= first[r])
            if pos >= n_prompt:  # generated tokens are always full
                assert flags[t]
        start += n


@given(batches)
def test_decode_only_steps_never_prune(batch):
    decode = [(n, max(c, n), s) for n, c, s in batch]  # every request past its prompt
    prompt, computed, scheduled = _arrays(decode)
    for variant in VARIANTS:
        assert not plan_step(prompt, computed, scheduled, variant).needs_pop


@given(st.integers(1, 300), st.lists(st.integers(1, 64), min_size=1, max_size=40),
       st.sampled_from(VARIANTS))
def test_chunked_prompt_prunes_exactly_the_prefix(n_prompt, chunks, variant):
    """A prompt fed in chunks of any sizes (then decode steps) prunes the same tokens as in one
    step: positions 0..N-2 under pop (x_N full), 0..N-1 under pop_no_boundary, none under full."""
    done, pruned, full_at = 0, 0, []
    sizes = iter(chunks)
    while done < n_prompt + 3:
        n = min(next(sizes, 16), n_prompt - done) if done < n_prompt else 1
        p = plan_step([n_prompt], [done], [n], variant)
        pruned += p.n_pruned
        full_at += [done + int(i) for i in p.full_index]
        done += n
    want = {"full": 0, "pop": n_prompt - 1, "pop_repair": n_prompt - 1,
            "pop_no_boundary": n_prompt}[variant]
    assert pruned == want
    assert full_at == list(range(want, n_prompt + 3))


@given(batches, st.sampled_from(VARIANTS), st.data())
def test_prompt_logprob_requests_run_every_token_full(batch, variant, data):
    """A request asking for prompt log-probs prunes nothing (its prompt positions' logits must be
    the model's); the others are planned as without it; n_forced counts what it kept full."""
    prompt, computed, scheduled = _arrays(batch)
    full_path = np.array(data.draw(st.lists(st.booleans(), min_size=len(batch), max_size=len(batch))))
    plain = plan_step(prompt, computed, scheduled, variant)
    p = plan_step(prompt, computed, scheduled, variant, full_path=full_path)
    pruned_plain = scheduled - plain.full_counts  # (R,)
    assert (p.full_counts == np.where(full_path, scheduled, plain.full_counts)).all()
    assert p.n_forced == int(pruned_plain[full_path].sum())
    assert p.n_pruned == plain.n_pruned - p.n_forced
    if full_path.all():
        assert not p.needs_pop


def test_plan_rejects_inconsistent_counts():
    with pytest.raises(ValueError, match="one entry per request"):
        plan_step([3, 4], [0], [3])
    with pytest.raises(ValueError, match="scheduled"):
        plan_step([3], [0], [3], n_tokens=2)
    with pytest.raises(ValueError, match="unknown POP variant"):
        plan_step([3], [0], [3], variant="static")
    with pytest.raises(ValueError, match="full_path needs one entry"):
        plan_step([3, 4], [0, 0], [3, 4], full_path=[True])


@pytest.mark.parametrize("raw, message", [
    ({"skip": [30]}, r"out of range: the model has layers 0\.\.29"),
    ({"skip": [-1]}, "out of range"),
    ({"skip": "20"}, "list of layer indices"),
    ({"skip": [2.5]}, "integer layer indices"),
    ({"skip": [True]}, "integer layer indices"),
    ({"skip": list(range(30))}, "cannot skip all 30 layers"),
    ({"skip": [3], "variant": "static"}, "removes layers in decode too"),
    ({"skip": [3], "variant": "half"}, "unknown variant 'half'"),
    ({"skip": [3], "ratio": 0.3}, "unknown pop setting"),
    ([3], "must be a dict"),
])
def test_bad_settings_give_one_line(raw, message):
    with pytest.raises(SettingError, match=message) as info:
        parse(raw, 30)
    assert "\n" not in str(info.value)


def test_settings_and_overrides():
    assert parse(None, 30).active is False
    s = parse({"skip": [29, 20, 20], "variant": "pop_no_boundary"}, 30)
    assert s.skip == (20, 29) and s.variant == "pop_no_boundary" and s.active
    assert not RunSetting(()).active and not RunSetting([3], "full").active
    o = overrides("LlamaForCausalLM", RunSetting([22, 21]))
    assert o == {"architectures": ["PopLlamaForCausalLM"],
                 "pop": {"skip": [21, 22], "variant": "pop", "repair": None}}
    assert parse(o["pop"], 30) == RunSetting((21, 22))  # the engine reads back what was sent
    with pytest.raises(PopSettingsError, match="not supported by the POP plugin"):
        overrides("GPT2LMHeadModel", RunSetting([1]))


def test_pop_repair_settings(tmp_path):
    maps = tmp_path / "r.safetensors"
    maps.write_bytes(b"")
    s = parse({"skip": [3, 4], "variant": "pop_repair", "repair": str(maps)}, 30)
    assert s.repair == str(maps) and s.active
    assert overrides("LlamaForCausalLM", RunSetting([4, 3], "pop_repair", str(maps)))["pop"] == {
        "skip": [3, 4], "variant": "pop_repair", "repair": str(maps)}
    for raw, message in (({"skip": [3], "variant": "pop_repair"}, "needs a repair maps file"),
                         ({"skip": [3], "variant": "pop_repair", "repair": "r.safetensors"},
                          "must be an absolute path"),
                         ({"skip": [3], "variant": "pop_repair", "repair": str(tmp_path / "no")},
                          "does not exist"),
                         ({"skip": [3], "variant": "pop", "repair": str(maps)},
                          "used by variant pop_repair only"),
                         ({"skip": [3], "variant": "pop_no_kv"}, "per-layer sequence lengths")):
        with pytest.raises(SettingError, match=message) as info:
            parse(raw, 30)
        assert "\n" not in str(info.value)


def test_repair_maps_must_cover_the_skip_set_with_the_model_shapes(tmp_path):
    import torch
    from safetensors.torch import save_file

    good = {f"{i}.{n}.{p}": torch.zeros((8, 16) if p == "weight" else (8,))
            for i in (3, 4) for n in "kv" for p in ("weight", "bias")}
    path = str(tmp_path / "m.safetensors")
    save_file(good, path)
    check_maps(path, (3, 4), hidden=16, kv_dim=8)
    for args, message in ((((3,), 16, 8), r"layers \[3, 4\].*not exactly skip set \[3\]"),
                          (((3, 4, 5), 16, 8), "not exactly skip set"),
                          (((3, 4), 32, 8), r"does not fit this model.*\[8, 16\] \(want \[8, 32\]\)")):
        with pytest.raises(PopSettingsError, match=message):
            check_maps(path, *args)
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(PopSettingsError, match="unreadable"):
        check_maps(str(tmp_path / "bad.safetensors"), (3, 4), 16, 8)


def test_repair_maps_stored_as_integers_are_refused_from_the_header(tmp_path):
    import torch
    from safetensors.torch import save_file

    maps = {f"{i}.{n}.{p}": torch.zeros((8, 16) if p == "weight" else (8,))
            for i in (3, 4) for n in "kv" for p in ("weight", "bias")}
    path = str(tmp_path / "m.safetensors")
    save_file({**maps, "4.v.weight": maps["4.v.weight"].to(torch.int8)}, path)
    with pytest.raises(PopSettingsError, match=r"map 4\.v\.weight is stored as I8, not a float"):
        check_maps(path, (3, 4), hidden=16, kv_dim=8)
    save_file({k: v.to(torch.float16) for k, v in maps.items()}, path)
    check_maps(path, (3, 4), hidden=16, kv_dim=8)  # half precision: upcast by the engine


def test_recomputed_counts_only_generated_tokens_scheduled_again():
    def facts(prompt, computed, scheduled, known):
        return StepFacts(np.array(prompt), np.array(computed), np.array(scheduled), [],
                         np.array(known))
    # prefill chunks and a decode step (the newest token only): nothing recomputed
    assert facts([10, 5], [0, 7], [6, 1], [10, 8]).recomputed() == 0
    assert facts([10], [6], [4], [10]).recomputed() == 0
    # a preempted request with 5 generated tokens resumes: positions 10..13 again, in 2 chunks
    assert facts([10], [0], [12], [15]).recomputed() == 2
    assert facts([10], [12], [3], [15]).recomputed() == 2


def test_engine_env_stays_local(tmp_path):
    env = engine_env(tmp_path, kv_cache_gib=2)
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path))
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path))
    with pytest.raises(ValueError, match="whole number of GiB"):
        engine_env(tmp_path, kv_cache_gib=0.5)


def test_the_drivers_one_line_is_the_refusal_not_what_it_replaced():
    """A refusal raised `from None` inside an except block is the line a job reports (the
    Enum's "'popx' is not a valid Variant" it replaced used to come back instead)."""
    from pop_vllm.driver import one_line
    from pop_vllm.run_setting import RunSetting

    with pytest.raises(Exception) as e:
        RunSetting((3,), "popx")
    assert one_line(e.value).startswith("SettingError: unknown variant 'popx'")
    try:
        try:
            raise KeyError("root")
        except KeyError as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError as outer:
        assert one_line(outer) == "KeyError: 'root'"
