"""The Serve page's disaggregated topology through AppTest: started with progress (a POP prefill
instance on the model's int8 copy, a POP decode instance in fp32, the proxy), its pools and exact
commands shown, one generation through the proxy, and Stop leaving no process. (The fp32 pool
runs through the CLI in test_disagg.py.)"""
import pytest

from pop_analysis.serving import venv
from pop_analysis.serving.server import group_members
from pop_analysis.serving.venv import ServingError

from apptest_util import app, goto, notes, temp_store, texts, wait_jobs  # noqa: F401


def test_topology_start_generate_stop():
    try:
        venv.python()
    except ServingError as e:
        pytest.fail(f"{e} (the Serve page test needs it: bash {venv.INSTALL_SCRIPT})")
    at = goto(app(), "serve")
    assert "Start the engines" in texts(at.info)  # the single engines are not needed for it
    at.toggle(key="serve.prefill_int8").set_value(True).run()
    next(b for b in at.button if b.key == "serve.topo_start").click().run()
    wait_jobs(at, timeout=400)
    assert "Prefill, decode and proxy ready" in notes(at), notes(at)
    topo = at.session_state["lab.serve_topology"]
    pgids = [m.proc.pid for m in topo.members().values()]
    assert len(pgids) == 3 and all(group_members(p) for p in pgids)
    shown = texts(at.markdown)
    assert "prefill pool" in shown and "decode pool" in shown and "proxy" in shown
    assert "int8 layers 0-19" in shown
    commands = " ".join(c.value for c in at.code)
    assert "kv_producer" in commands and "kv_consumer" in commands and "vllm_router" in commands
    assert topo.topology.prefill.model_dir != topo.topology.decode.model_dir
    assert "/int8/" in topo.topology.prefill.model_dir

    next(b for b in at.button if b.key == "serve.topo_generate").click().run()
    assert "Answered in" in texts(at.markdown) and at.text[0].value.strip()

    next(b for b in at.button if b.key == "serve.topo_stop").click().run()
    assert "lab.serve_topology" not in at.session_state
    assert not any(group_members(p) for p in pgids)
