"""What a disaggregated topology and POP's cached K/V are keyed by, without an engine: the block
path of prefix caching, the settings key and storage folder, the prefill/decode/proxy commands
(pinning, roles, the connector's config), and bad input in one line."""
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from pop_analysis.serving import disagg
from pop_analysis.serving.proxy import Proxy
from pop_analysis.serving.server import EngineSpec, command, engine_env
from pop_analysis.serving.venv import ServingError
from pop_vllm import kv_keys
from pop_vllm.run_setting import RunSetting


@pytest.fixture
def base(tmp_path, monkeypatch) -> EngineSpec:
    """A POP engine spec on a model directory holding only its config (nothing loads it)."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    monkeypatch.setattr("pop_analysis.serving.venv.has_plugin", lambda: True)
    return EngineSpec(model_dir=str(tmp_path / "m"), name="m", setting=RunSetting((20, 21, 22)))


def test_block_path_marks_every_block_that_holds_a_full_path_position():
    # prompt of 70 tokens, blocks of 32: x_N is position 69 (pop), 70 (pop_no_boundary)
    assert kv_keys.block_path(0, 32, 70, "pop") is None
    assert kv_keys.block_path(32, 64, 70, "pop") is None
    assert kv_keys.block_path(64, 96, 70, "pop") == ("boundary", 5)
    assert kv_keys.block_path(96, 128, 70, "pop") == "full"
    assert kv_keys.block_path(64, 96, 70, "pop_no_boundary") == ("boundary", 6)
    # x_N as the last position of a block: that block holds the full path, the one before not
    assert kv_keys.block_path(32, 64, 64, "pop") == ("boundary", 31)
    assert kv_keys.block_path(0, 32, 64, "pop") is None
    assert kv_keys.block_path(0, 32, 70, "full") == ("boundary", 0)


def test_settings_key_tells_settings_apart(tmp_path):
    a = kv_keys.settings_key(RunSetting((20, 21), "pop"))
    assert a == kv_keys.settings_key(RunSetting((20, 21), "pop")) and len(a) == 16
    assert a != kv_keys.settings_key(RunSetting((20, 22), "pop"))
    assert a != kv_keys.settings_key(RunSetting((20, 21), "pop_no_boundary"))
    assert kv_keys.settings_key(RunSetting((20, 21), "full")) is None
    assert kv_keys.settings_key(RunSetting((), "pop")) is None
    maps = tmp_path / "maps.safetensors"
    maps.write_bytes(b"one")
    first = kv_keys.settings_key(RunSetting((20, 21), "pop_repair", str(maps)))
    maps.write_bytes(b"two")  # refitted in place: another key
    assert first != kv_keys.settings_key(RunSetting((20, 21), "pop_repair", str(maps)))


def test_storage_folder_is_per_model_and_setting(tmp_path):
    pop = kv_keys.storage_dir(tmp_path, "smollm2/135m", RunSetting((20,), "pop"))
    assert pop.parent == tmp_path and pop.name.startswith("smollm2-135m-")
    assert kv_keys.storage_dir(tmp_path, "m", RunSetting.full()).name == "m-full"
    with pytest.raises(ValueError, match="engine id"):
        kv_keys.transfer_config("kv_producer", tmp_path, "../x")
    with pytest.raises(ValueError, match="unknown KV role"):
        kv_keys.transfer_config("producer", tmp_path, "p")


def test_plan_pins_each_instance_and_joins_them_through_the_connector(base, tmp_path):
    topo = disagg.plan(base, "pop", (0,), (1,), 32, tmp_path)
    p, d = topo.prefill, topo.decode
    assert p.cpus == (0,) and d.cpus == (1,) and p.threads == d.threads == 1
    assert p.setting == d.setting == RunSetting((20, 21, 22))
    for spec, role, eid in ((p, "kv_producer", "prefill-0"), (d, "kv_consumer", "decode-0")):
        cmd = command(spec, "python", 8000)
        cfg = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
        assert cfg["kv_role"] == role and cfg["engine_id"] == eid
        assert cfg["kv_connector_module_path"] == "pop_vllm.connector"
        assert cfg["kv_connector_extra_config"]["pop_kv_dir"] == topo.folder
        # both know what the prefill instance computes its K/V under (the decode side's keys)
        assert kv_keys.producer_key(cfg["kv_connector_extra_config"]) == (
            kv_keys.settings_key(RunSetting((20, 21, 22), "pop")), "pop")
        assert cmd[cmd.index("--block-size") + 1] == "32"
        assert engine_env(spec)["VLLM_CPU_OMP_THREADS_BIND"] == str(spec.cpus[0])
    assert topo.folder.startswith(str(tmp_path.resolve()))
    stock = disagg.plan(base, "full", (0,), (1,), 32, tmp_path).decode
    assert stock.setting == RunSetting.full() and not stock.pop
    cmd = command(stock, "python", 8000)
    extra = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
    assert kv_keys.producer_key(extra)[1] == "pop"  # a stock decode side loads POP's K/V
    assert "prefill pool" in topo.describe()[0] and "20-22" in topo.describe()[0]


def test_plan_bad_input_one_line(base, tmp_path):
    for args, words in ((("pop", (0,), (0,)), "overlap"), (("stock", (0,), (1,)), "decode side"),
                        (("pop", (0,), (1,), 48), "multiple of 32"),
                        (("pop", (0,), (4096,)), "not available")):
        with pytest.raises(ServingError, match=words) as e:
            disagg.plan(base, *args, kv_root=tmp_path)
        assert "\n" not in str(e.value)


def test_proxy_command_is_vllm_router_in_pd_mode(base, monkeypatch):
    monkeypatch.setattr("pop_analysis.serving.proxy.has_router", lambda: True)
    proxy = Proxy(replace(base, setting=RunSetting.full()), ["http://127.0.0.1:1"],
                  ["http://127.0.0.1:2"])
    cmd = proxy._command("python", 8100)
    assert cmd[:4] == ["python", "-m", "vllm_router.launch_router", "--vllm-pd-disaggregation"]
    assert cmd[cmd.index("--prefill") + 1] == "http://127.0.0.1:1"
    assert cmd[cmd.index("--decode") + 1] == "http://127.0.0.1:2"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--disable-retries" in cmd
    monkeypatch.setattr("pop_analysis.serving.proxy.has_router", lambda: False)
    with pytest.raises(ServingError, match="install_vllm"):
        proxy._command("python", 8100)


def test_prefix_caching_flag(base):
    assert "--no-enable-prefix-caching" in command(base, "python", 1)
    on = command(replace(base, prefix_caching=True), "python", 1)
    assert "--enable-prefix-caching" in on and "--no-enable-prefix-caching" not in on


def _request(params=None, n: int = 70, **kw):
    return SimpleNamespace(kv_transfer_params=params, num_prompt_tokens=n, **kw)


def _engine(consumer: dict | None = None, arch: str = "PopLlamaForCausalLM"):
    """What pop_vllm.prefix reads of an engine's config: its model, its KV role."""
    hf = SimpleNamespace(num_hidden_layers=30, pop={"skip": [20, 21], "variant": "pop"})
    transfer = None if consumer is None else SimpleNamespace(
        kv_connector="PopKVConnector", is_kv_consumer=True, kv_connector_extra_config=consumer)
    return SimpleNamespace(model_config=SimpleNamespace(architectures=[arch], hf_config=hf),
                           kv_transfer_config=transfer)


HANDED = {"do_remote_prefill": True, "pop_kv_file": "prefill-0/" + "0" * 40, "pop_kv_tokens": 69,
          "pop_kv_settings": None, "pop_kv_variant": "full"}  # a client's claim: stock K/V


def test_request_keys_come_from_the_engines_own_settings_at_arrival():
    """pop_vllm.prefix's per-request key (its vLLM hooks are installed only in engines): pinned
    at a request's arrival from the engine's settings then; a run-time switch changes the key
    of requests arriving after it only."""
    from pop_vllm import prefix

    prefix.configure(_engine())
    pop = _request()
    key = kv_keys.settings_key(RunSetting((20, 21), "pop"))
    prefix.pin(pop)
    assert prefix.extra_key(pop, 0, 32) == ("pop", key)
    assert prefix.extra_key(pop, 64, 96) == ("pop", key, ("boundary", 5))
    prefix.use(RunSetting((20, 21), "full"))  # a run-time switch to full
    assert prefix.extra_key(pop, 32, 64) == ("pop", key)  # the request keeps its arrival key
    assert prefix.extra_key(_request(), 0, 32) is None  # a new one is stock
    prefix.use(RunSetting((20, 21), "pop"))
    logprobs = _request(sampling_params=SimpleNamespace(prompt_logprobs=1),
                        skip_reading_prefix_cache=False)  # the caller allows cached K/V
    prefix.pin(logprobs)
    assert prefix.extra_key(logprobs, 0, 32) is None and prefix.full_path(logprobs)
    assert logprobs.skip_reading_prefix_cache  # a POP engine recomputes its prompt: complete
    assert prefix.extra_key(pop, 0, 32) == ("pop", key) and not prefix.full_path(pop)


def test_transfer_params_count_only_on_a_kv_consumer():
    """A client's kv_transfer_params on an engine that is no KV consumer change nothing (they
    used to make POP K/V hash as stock); on a consumer they say the K/V come from the producer,
    hashed under the consumer's configured producer settings, never the request's claim."""
    from pop_vllm import prefix

    prefix.configure(_engine())  # a POP engine, no connector
    key = kv_keys.settings_key(RunSetting((20, 21), "pop"))
    forged = _request(dict(HANDED))
    prefix.pin(forged)
    assert prefix.extra_key(forged, 0, 32) == ("pop", key) and not prefix.loads_transfer(forged)
    producer = kv_keys.producer_config(RunSetting((25, 26), "pop"))
    prefix.configure(_engine(producer, arch="LlamaForCausalLM"))  # a stock decode instance
    handed = _request(dict(HANDED))  # claims stock K/V; the consumer knows better
    prefix.pin(handed)
    assert prefix.loads_transfer(handed)
    assert prefix.extra_key(handed, 0, 32) == ("pop", producer["pop_kv_settings"])
    for params in ({**HANDED, "pop_kv_tokens": 10}, {**HANDED, "do_remote_prefill": False},
                   {**HANDED, "pop_kv_tokens": "69"}, None):
        own = _request(params)  # not a hand-off of its N-1 positions: its own K/V, stock here
        prefix.pin(own)
        assert not prefix.loads_transfer(own) and prefix.extra_key(own, 0, 32) is None
    skipping = _request(dict(HANDED), skip_reading_prefix_cache=True)  # loads nothing
    prefix.pin(skipping)
    assert not prefix.loads_transfer(skipping) and prefix.extra_key(skipping, 0, 32) is None
    with pytest.raises(ValueError, match="needs kv_connector_extra_config"):
        prefix.configure(_engine({"pop_kv_dir": "/x"}))  # a consumer that was not told
    prefix.configure(_engine())
    prefix.use(RunSetting.full())


def test_a_pin_after_a_switch_redoes_hashes_taken_before_it():
    """vLLM hashes a request where it builds it (the input thread); the engine core pins it in
    order with switches: a hash taken under the old settings is redone under the new."""
    from pop_vllm import prefix

    prefix.configure(_engine())
    hashed = []
    r = _request(block_hashes=[], update_block_hashes=lambda: r.block_hashes.extend(
        [prefix.extra_key(r, 0, 32)]))
    r.update_block_hashes()  # built (and hashed) before the switch
    hashed.append(list(r.block_hashes))
    prefix.use(RunSetting((20, 21), "full"))  # the switch was handled first
    prefix.pin(r)
    assert hashed == [[("pop", kv_keys.settings_key(RunSetting((20, 21), "pop")))]]
    assert r.block_hashes == [None]  # rehashed: stock, as the workers will run it
    prefix.use(RunSetting.full())


def test_an_int8_prefill_pool_serves_the_models_int8_copy_under_its_own_key(tmp_path, monkeypatch):
    """--prefill-int8: the prefill instance's model is the int8 copy (written once), the decode
    instance's the fp32 model; both instances key the K/V with the copy's weights tag."""
    from tiny import saved

    monkeypatch.setattr("pop_analysis.serving.venv.has_plugin", lambda: True)
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path / "cache"))
    model = saved(tmp_path)  # 6 layers
    base = EngineSpec(model_dir=str(model), name="m", setting=RunSetting((2, 3)))
    topo = disagg.plan(base, "pop", (0,), (1,), 32, tmp_path, prefill_int8=disagg.KEPT)
    assert topo.prefill_int8 == (0, 1, 4, 5) and topo.decode.model_dir == str(model)
    int8 = topo.prefill.model_dir
    assert int8 != str(model) and kv_keys.weights_tag(int8) is not None
    again = disagg.plan(base, "pop", (0,), (1,), 32, tmp_path, prefill_int8=(5, 4, 1, 0))
    assert again.prefill.model_dir == int8, "written once, found again"
    plain = disagg.plan(base, "pop", (0,), (1,), 32, tmp_path)
    assert plain.folder != topo.folder
    for spec in (topo.prefill, topo.decode):
        cmd = command(spec, "python", 8000)
        extra = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
        assert kv_keys.producer_key(extra) == (
            kv_keys.settings_key(RunSetting((2, 3)), kv_keys.weights_tag(int8)), "pop")
    assert "int8 layers 0-1, 4-5" in topo.describe()[0]
    for layers, words in (((2,), "int8"), ((9,), "out of range")):
        with pytest.raises(ServingError, match=words) as e:
            disagg.plan(base, "pop", (0,), (1,), 32, tmp_path, prefill_int8=layers)
        assert "\n" not in str(e.value)
