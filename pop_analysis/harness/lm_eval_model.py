"""POP inside lm-evaluation-harness: the model "pop-hf" (alias "pop").

    python -m pop_analysis lm_eval run --model pop-hf \\
        --model_args pretrained=smollm2-135m,skip_ratio=0.33 --tasks hellaswag

`variant=pop_repair,repair=KEY|auto` evaluates the K/V repair (repair.py): a stored repair's key,
or auto (the newest stored for the model and skip set, else one fitted on the builtin prompts).

Semantics: log-likelihood requests run the context through the variant's pruned prefill (boundary
token in full) and teacher-force the continuation through the full model; generate_until is POP
generation (pruned prefill, full decode). Rolling log-likelihood scores each window the same way
(its first window has a one-token context, so nothing is pruned there).

lm-eval 0.4.13 has no plugin discovery (models are registered by importing their module), so this
module registers itself on import: use the wrapper command above, or import it before calling
`lm_eval.simple_evaluate(model="pop-hf", ...)`.
"""
from __future__ import annotations

import os
from collections import defaultdict

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from pop_analysis.engine.generate import SamplingConfig, generate
from pop_analysis.engine.models import DEFAULT_MODEL, LoadedModel, load_model
from pop_analysis.engine.skipset import resolve
from pop_analysis.errors import shown
from pop_analysis.quality.metrics import score_continuations
from pop_vllm.run_setting import RunSetting

DEFAULT_MAX_LENGTH = 2048  # when the config states no context length


class PopLMError(ValueError):
    """Bad model_args for pop-hf."""


def parse_skip(n_layers: int, skip=None, skip_ratio=None, preset=None) -> tuple[int, ...]:
    """The skip set from model_args; layers use '-' ranges and ';' between parts
    (model_args itself is comma-separated). Nothing given = the paper's last third."""
    if skip is None and skip_ratio is None and preset is None:
        preset = "paper"
    if skip is not None:
        skip = str(skip).replace(";", ",").replace(" ", ",")
    return resolve(n_layers, layers=skip, ratio=None if skip_ratio is None else float(skip_ratio),
                   preset_name=preset)


def _int_arg(name: str, value, minimum: int, maximum: int | None = None) -> int | None:
    """A model_args integer (lm-eval passes them as text); None stays None."""
    if value is None or value == "":
        return None
    text = str(value).strip()
    top = f"..{maximum}" if maximum else " or more"
    if not (text.isascii() and text.lstrip("-").isdigit()) or len(text) > 12 or not (
            minimum <= int(text) <= (maximum or int(text))):
        raise PopLMError(f"model_args {name} must be an integer {minimum}{top}, got {shown(value)}")
    return int(text)


@register_model("pop-hf", "pop")
class PopLM(TemplateLM):
    """A POP Lab model for lm-eval; `lm=` takes an already loaded LoadedModel (tests, notebooks)."""

    def __init__(self, pretrained: str = DEFAULT_MODEL, skip_ratio=None, skip=None, preset=None,
                 variant: str = "pop", device=None, dtype=None, batch_size=1, max_batch_size=None,
                 max_length=None, max_gen_toks: int = 256, trust_remote_code: bool = False,
                 threads=None, add_bos_token: bool = False, lm: LoadedModel | None = None,
                 repair=None, **unused):
        super().__init__()
        if unused:
            raise PopLMError(f"pop-hf does not know model_args {sorted(unused)}")
        threads = _int_arg("threads", threads, 1, os.cpu_count() or 1)
        max_length = _int_arg("max_length", max_length, 2)
        max_gen_toks = _int_arg("max_gen_toks", max_gen_toks, 1)
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.lm = lm or load_model(str(pretrained), device=device, dtype=dtype,
                                   trust_remote_code=bool(trust_remote_code))
        if self.lm.tokenizer is None:
            raise PopLMError(f"model {self.lm.name} has no tokenizer; lm-eval feeds text")
        self.tokenizer = self.lm.tokenizer
        n_layers = self.lm.adapter.n_layers
        self.setting = RunSetting(parse_skip(n_layers, skip, skip_ratio, preset), variant).check(
            n_layers)  # model_args are this way in's flags: one setting built from them
        self.repair = self._attach_repair(repair)
        self.add_bos_token = bool(add_bos_token)
        self._max_length = int(max_length) if max_length else (
            self.lm.adapter.shape.max_positions or DEFAULT_MAX_LENGTH)
        self.max_gen_toks = int(max_gen_toks)
        self._device = self.lm.device

    def _attach_repair(self, spec):
        """The repair pop_repair needs (model_args repair=KEY|auto), attached for the skip set."""
        if self.setting.variant != "pop_repair":
            if spec:
                raise PopLMError("repair= applies to variant=pop_repair only")
            return None
        if not spec:
            raise PopLMError("variant=pop_repair needs repair=KEY or repair=auto")
        from pop_analysis.repair.store import ensure

        return ensure(self.lm, self.setting.skip, str(spec))

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        """model_args win over the harness's own --device / --batch_size (no duplicate keys)."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(**{**extra, **arg_dict})

    # ------------------------------------------------------------ harness plumbing

    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise PopLMError(f"model {self.lm.name}'s tokenizer has no EOS token")
        return eos

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return self.lm.name.replace("/", "__")

    def chat_template(self, chat_template=False) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) if chat_template else None

    def apply_chat_template(self, chat_history, add_generation_prompt=True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        special = self.add_bos_token if add_special_tokens is None else bool(add_special_tokens)
        return self.tokenizer(string, add_special_tokens=special)["input_ids"]

    # ------------------------------------------------------------ requests

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        """((ctx, cont), ctx_ids, cont_ids) -> (sum log p(cont), is_greedy); contexts shared."""
        groups = defaultdict(list)  # context ids -> [(request index, continuation ids)]
        for i, (_, ctx, cont) in enumerate(requests):
            ctx, cont = self._fit(list(ctx), list(cont))
            groups[tuple(ctx)].append((i, cont))
        out: list = [None] * len(requests)
        for ctx, members in groups.items():
            scores = score_continuations(self.lm, ctx, [c for _, c in members], self.setting)
            for (i, _), s in zip(members, scores):
                out[i] = (s.total_logprob, s.is_greedy)
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], out[i])
        return out

    def _fit(self, ctx: list[int], cont: list[int]) -> tuple[list[int], list[int]]:
        """Left-truncate the context so context + continuation fit the model."""
        if len(cont) >= self.max_length:
            cont = cont[-(self.max_length - 1):]
        keep = self.max_length - len(cont)
        return (ctx[-keep:] if ctx else [self.prefix_token_id]), cont

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for req in requests:
            (text,) = req.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                self.tok_encode(text), self.prefix_token_id, self.max_length, 1)]
            total = sum(score_continuations(self.lm, ctx, [pred], self.setting)[0]
                        .total_logprob for ctx, pred in windows)
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            text = self._generate(context, dict(gen_kwargs or {}))
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out

    def _generate(self, context: str, kw: dict) -> str:
        until = kw.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = int(kw.pop("max_gen_toks", self.max_gen_toks))
        sample = bool(kw.pop("do_sample", False))
        temperature = float(kw.pop("temperature", 0.0) or 0.0) if sample else 0.0
        cfg = SamplingConfig(max_new_tokens=max_new, temperature=temperature,
                             top_p=float(kw.pop("top_p", 1.0) or 1.0), seed=int(kw.pop("seed", 0)))
        if max_new >= self.max_length:
            raise PopLMError(f"max_gen_toks {max_new} leaves no room for a prompt in a context of "
                             f"{self.max_length} tokens")
        ids = self.tok_encode(context)[-(self.max_length - max_new):] or [self.prefix_token_id]
        tokens: list[int] = []
        text = ""
        for tok in generate(self.lm, ids, self.setting, cfg):
            tokens.append(tok.token_id)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            if any(u in text for u in until):
                break
        for u in until:  # cut at the earliest stop sequence, as lm-eval's own models do
            text = text.split(u)[0]
        return text
