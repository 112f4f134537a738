"""The POP engine on the embedded SmolLM2-135M model (real weights, real data)."""
import json

import torch

from pop_analysis.engine.generate import SamplingConfig, encode, run
from pop_analysis.engine.pop import run_prompt, teacher_force
from pop_analysis.engine.skipset import resolve
from pop_vllm.run_setting import RunSetting


def test_model_card(embedded):
    card = embedded.card()
    assert (card["layers"], card["heads"], card["kv_heads"]) == (30, 9, 3)
    assert card["architecture"] == "LlamaForCausalLM" and card["tokenizer"]


def test_full_path_equals_hf_generate(embedded):
    ids = encode(embedded, "Name three primary colours.")
    ours = run(embedded, ids, RunSetting(resolve(30, ratio=0.33), "full"),
               SamplingConfig(max_new_tokens=20, stop_at_eos=False)).token_ids
    # An explicit mask: HF otherwise masks every token equal to pad_token_id (here <|im_end|>).
    prompt = torch.tensor([ids])
    hf = embedded.model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                 max_new_tokens=20, do_sample=False,
                                 eos_token_id=None, pad_token_id=embedded.tokenizer.eos_token_id)
    assert ours == hf[0, len(ids):].tolist()


def continuation_nll(lm, prompt_ids, cont_ids, setting: RunSetting) -> float:
    """Mean NLL of cont_ids after prompt_ids: prompt via the setting, continuation full."""
    first = run_prompt(lm.adapter, torch.tensor([prompt_ids]), setting)
    rest = teacher_force(lm.adapter, torch.tensor([cont_ids[:-1]]), first.cache, first.position,
                         setting.decode_drop)  # (1, C-1, V)
    logits = torch.cat([first.logits[:, None], rest], dim=1)[0]  # (C, V)
    return torch.nn.functional.cross_entropy(logits, torch.tensor(cont_ids)).item()


def test_pop_hurts_continuation_far_less_than_static(embedded, shared_data):
    rows = [json.loads(line) for line in open(shared_data / "gsm8k_test.jsonl")][:4]
    skip = resolve(30, ratio=0.33)
    tok = embedded.tokenizer
    nll = {"full": [], "pop": [], "static": []}
    for row in rows:
        p = tok(f"Question: {row['question']}\nAnswer:")["input_ids"]
        c = tok(" " + row["answer"])["input_ids"][:48]
        for v in nll:
            nll[v].append(continuation_nll(embedded, p, c, RunSetting(skip, v)))
    mean = {v: sum(x) / len(x) for v, x in nll.items()}
    pop_cost, static_cost = mean["pop"] - mean["full"], mean["static"] - mean["full"]
    assert static_cost > 1.0, mean
    assert pop_cost < 0.25 * static_cost, mean


def test_pop_generation_differs_but_stays_fluent(embedded):
    ids = encode(embedded, "Write one sentence about the ocean.")
    cfg = SamplingConfig(max_new_tokens=16, stop_at_eos=False)
    pop = run(embedded, ids, RunSetting(resolve(30, ratio=0.33)), cfg)
    static = run(embedded, ids, RunSetting(resolve(30, ratio=0.33), "static"), cfg)
    full = run(embedded, ids, RunSetting.full(), cfg)
    # POP keeps the full model's first token far more often than static removal does.
    assert pop.token_ids[0] == full.token_ids[0]
    assert len(set(pop.token_ids)) > 4, pop.text
    assert static.token_ids != full.token_ids
