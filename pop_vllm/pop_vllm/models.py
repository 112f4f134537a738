"""Pop* variants of vLLM's Llama-family and Gemma-3 causal LMs (registered by `plugin.register`).

A step with no pruned token (decode-only steps, variant full, an empty skip set, warm-up runs)
calls the stock forward unchanged, compiled or not. A step with pruned tokens runs either the split
of `split.py` (the engine's own skip set when it is one contiguous block: compiled pieces in
compiled mode) or the layer loop here, eagerly: kept layers are the stock layers on every token,
skipped layers `pruned_layer`.

Pipeline parallel: each stage runs its own layers (start_layer..end_layer) of the same plan (every
stage's model runner sees the same scheduled requests), taking the previous stage's (hidden,
residual) and handing its own on; pruned tokens travel as (0, x) like between layers. The split
is built for one-stage engines only: a POP step of a pipeline runs the layer loop.
"""
from __future__ import annotations

import time

import numpy as np
import torch
from vllm.distributed import get_pp_group
from vllm.forward_context import get_forward_context
from vllm.logger import init_logger
from vllm.model_executor.models.gemma3 import Gemma3ForCausalLM
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.sequence import IntermediateTensors

from . import repair as pop_repair
from . import settings as pop_settings
from . import step
from .layer import TokenSplit, copy_kv_weights, pruned_layer
from .settings import PopSettingsError, untested_backends_allowed
from .split import Split, contiguous_block
from .stats import count, new_stats

logger = init_logger("vllm.pop")


class PopMixin:
    """POP on top of a stock *ForCausalLM whose `.model` has embed_input_ids, layers, norm."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        hf = vllm_config.model_config.hf_config
        self.pop_n_layers = hf.num_hidden_layers
        self.pop_hf = hf
        self.pop_dtype = vllm_config.model_config.dtype
        self.pop_maps = {}  # layer -> KVProjection of pop_repair's fitted maps
        self._use_settings(pop_settings.engine_setting(getattr(hf, "pop", None), self.pop_n_layers))
        self.pop_stats = new_stats()
        self.pop_forward_s = 0.0  # model forward seconds in this worker, all steps
        self._check_layers()
        one_stage = get_pp_group().world_size == 1
        block = contiguous_block(self.pop.skip) if self.pop.active and one_stage else None
        # Off the module tree (the pieces hold no weights of their own).
        object.__setattr__(self, "pop_split", None if block is None else
                           Split(vllm_config, self.model, block))
        logger.info("POP: skip %s, variant %s", list(self.pop.skip), self.pop.variant)

    def _check_layers(self) -> None:
        m = self.model
        for i in range(m.start_layer, m.end_layer):
            a = m.layers[i].self_attn
            backend = a.attn.attn_backend.get_name()
            if backend not in pop_settings.TESTED_BACKENDS and not untested_backends_allowed():
                raise PopSettingsError(f"attention backend {backend} is not tested with the POP plugin "
                                       f"(tested: {', '.join(pop_settings.TESTED_BACKENDS)}); set "
                                       "POP_VLLM_UNTESTED_BACKENDS=1 to try it")
            if getattr(a, "do_llama_4_scaling", False):
                raise PopSettingsError("Llama-4 attention scaling is not supported by the POP plugin")

    def set_pop(self, config: dict) -> None:
        """Switch to the setting of `config` (RunSetting.as_config's fields)."""
        self._use_settings(pop_settings.engine_setting(config, self.pop_n_layers))

    def _use_settings(self, pop) -> None:
        """Take new settings, loading pop_repair's maps first (bad maps leave the old ones)."""
        maps = {}
        if pop.variant == "pop_repair":
            pop_repair.check_settings(pop, self.pop_hf)
            device = next(self.parameters()).device  # a later stage has no embedding
            maps = pop_repair.load_projections(pop, self.pop_dtype, device, self.pop_hf)
        self.pop, self.pop_maps = pop, maps

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        m = self.model
        for i in range(m.start_layer, m.end_layer):
            copy_kv_weights(m.layers[i])
        return loaded

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kw):
        t0 = time.perf_counter()
        try:
            return self._forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kw)
        finally:  # CPU ops are synchronous: this is the step's model time (benchmarks read it)
            self.pop_forward_s += time.perf_counter() - t0

    def _forward(self, input_ids, positions, intermediate_tensors, inputs_embeds, **kw):
        facts = step.current()
        if facts is None and self.pop_split is not None and not self.pop_split.lower.do_not_compile:
            self.pop_split.warm_up(self.model, input_ids, positions)  # vLLM's dummy run
        if facts is not None and self.pop.active:
            n = positions.shape[-1]
            p = step.plan(facts, self.pop.variant, n)
            count(self.pop_stats, facts, p)
            if p.needs_pop:
                return self._pop_forward(facts, p, input_ids, positions, inputs_embeds,
                                         intermediate_tensors)
        return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kw)

    def _pop_forward(self, facts, p, input_ids, positions, inputs_embeds, intermediate_tensors):
        m = self.model
        dev = positions.device
        full_idx = torch.from_numpy(p.full_index).to(dev)  # (F,)
        rest = np.setdiff1d(np.arange(p.n_tokens), p.full_index)  # pruned + padding
        pruned_idx = torch.from_numpy(rest).to(dev)  # (T-F,)
        ctx = get_forward_context()
        sub = {}
        split = self.pop_split
        use_split = split is not None and split.skip == self.pop.skip and inputs_embeds is None

        def full_metadata():  # built once per step, by the backend's own builder
            if not sub:
                sub.update(ctx.attn_metadata)
                sub.update(step.full_token_metadata(facts, p, dev))
            return sub

        tokens = TokenSplit(full_idx, pruned_idx, ctx, full_metadata)
        if use_split:
            self.pop_stats["split_steps"] += 1
            return split.forward(m, input_ids, positions, tokens, self.pop_maps)
        if intermediate_tensors is not None:  # a later pipeline stage: the previous one's pair
            hidden, residual = intermediate_tensors["hidden_states"], intermediate_tensors["residual"]
        else:
            hidden = inputs_embeds if inputs_embeds is not None else m.embed_input_ids(input_ids)
            residual = None
        skip = set(self.pop.skip)
        for i in range(m.start_layer, m.end_layer):
            layer = m.layers[i]
            if i not in skip:
                hidden, residual = layer(positions, hidden, residual)
                continue
            hidden, residual = pruned_layer(layer, positions, hidden, residual, tokens,
                                            self.pop_maps.get(i))
        if not get_pp_group().is_last_rank:
            return IntermediateTensors({"hidden_states": hidden, "residual": residual})
        hidden, _ = m.norm(hidden, residual)
        return hidden


class PopLlamaForCausalLM(PopMixin, LlamaForCausalLM):
    pass


class PopMistralForCausalLM(PopMixin, MistralForCausalLM):
    pass


class PopQwen2ForCausalLM(PopMixin, Qwen2ForCausalLM):
    pass


class PopQwen3ForCausalLM(PopMixin, Qwen3ForCausalLM):
    pass


class PopGemma3ForCausalLM(PopMixin, Gemma3ForCausalLM):
    pass
