"""Tiny Hugging Face ``transformers`` models for the zoo (no downloads).

Every model is built from a small config object with random (seeded) weights.
``HF_CASES`` is empty when ``transformers`` is not installed, so importing
this module is always safe.

Export times (transformers 5.23, torch 2.13 CPU, 2 cores, warm process),
roughly: non-strict 0.2-0.7 s, strict 0.7-2.5 s, with ``run_decompositions``
add 0.5-2 s.  T5 (encoder + decoder) is the slowest at ~1 s / ~2 s / +2 s.

Variants torch 2.13 cannot produce and that are therefore not registered:

* ``hf_llama_preserve_layer`` with ``decompose=True`` (same for preserving
  ``model.layers.0.self_attn``): ``run_decompositions`` fails with
  ``SpecViolationError: Input to_4 does not exist in the graph``.
* from torch 2.14 also ``hf_bert_preserve_layer[decomp]`` and
  ``hf_gpt2_preserve_block[decomp]`` (``SpecViolationError: Input dropout does not exist
  in the graph``, raised by ``run_decompositions``; 2.13 exports them; seen on 2.14.1 and 2.15.0):
  see ``TORCH_CANNOT_EXPORT`` and ``lowering.lowering_seam.decompositions_drop_eval_dropout``.

Other combinations are left out only to keep the test-suite fast.

Several registered cases break ``torch.export.unflatten`` (see
``torch_unflatten_notes.md``); that is intended, they are what purefx is for.
"""

from typing import Any

import attrs
import torch
from torch import nn

from lowering.lowering_seam import decompositions_drop_eval_dropout

try:
    from .zoo import Case, randint, seeded, variants
except ImportError:  # tests/ is not a package: imported as a top-level module
    from zoo import Case, randint, seeded, variants

try:
    import transformers
except ImportError:  # pragma: no cover - depends on the environment
    transformers = None

HF_CASES: dict[str, Case] = {}

VOCAB = 64
BASE = (False, False)
DECOMP = (False, True)
STRICT = (True, False)
STRICT_DECOMP = (True, True)


def _ids(batch: int = 2, seq: int = 6, seed: int = 0) -> torch.Tensor:
    return randint(VOCAB, batch, seq, seed=seed)


def _ids_args() -> tuple:
    return (_ids(),)


def _small(**extra: Any) -> dict[str, Any]:
    """Config fields shared by the decoder-style models."""
    return dict(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        attn_implementation="eager",
        **extra,
    )


def _gpt2() -> nn.Module:
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=16,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=1,
        use_cache=False,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(cfg).eval()  # lm_head tied to wte


def _llama() -> nn.Module:
    cfg = transformers.LlamaConfig(**_small(num_key_value_heads=1, use_cache=False))
    return transformers.LlamaForCausalLM(cfg).eval()


def _mixtral() -> nn.Module:
    cfg = transformers.MixtralConfig(
        **_small(
            num_key_value_heads=1,
            num_local_experts=4,
            num_experts_per_tok=2,
            use_cache=False,
        )
    )
    return transformers.MixtralForCausalLM(cfg).eval()


def _bert() -> nn.Module:
    cfg = transformers.BertConfig(**_small())
    return transformers.BertModel(cfg).eval()


def _albert() -> nn.Module:
    # ALBERT shares one layer across depth: the layer is called twice.
    cfg = transformers.AlbertConfig(**_small(embedding_size=8))
    return transformers.AlbertModel(cfg).eval()


def _t5() -> nn.Module:
    cfg = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=2,
        num_heads=2,
        use_cache=False,
        attn_implementation="eager",
    )
    return transformers.T5ForConditionalGeneration(cfg).eval()  # tied embeddings


def _bert_kwargs() -> dict:
    mask = torch.ones(2, 6, dtype=torch.int64)
    mask[1, 4:] = 0  # some padding in the second row
    return {"attention_mask": mask}


def _t5_kwargs() -> dict:
    return {"decoder_input_ids": _ids(seq=4, seed=1)}


TIED = {"tied_weights"}
SHARED = {"shared_module", "repeated_call"}
CHEAP = (BASE, DECOMP, STRICT)
T5 = TIED | {"kwargs"}

# name, factory, (strict, decompose) variants, extra features, preserved fqns, kwargs
SPECS: list[tuple] = [
    ("hf_gpt2", _gpt2, CHEAP, TIED, (), dict),
    ("hf_gpt2_preserve_block", _gpt2, (BASE, DECOMP), TIED, ("transformer.h.0",), dict),
    ("hf_gpt2_preserve_attn", _gpt2, (BASE, STRICT), TIED, ("transformer.h.0.attn",), dict),
    ("hf_llama", _llama, CHEAP, set(), (), dict),
    ("hf_llama_preserve_layer", _llama, (BASE, STRICT), set(), ("model.layers.0",), dict),
    ("hf_llama_preserve_mlp", _llama, (BASE, STRICT_DECOMP), set(), ("model.layers.0.mlp",), dict),
    # transformers 5 names the MoE block ``mlp`` (``block_sparse_moe`` in 4.x).
    ("hf_mixtral", _mixtral, CHEAP, {"moe"}, (), dict),
    ("hf_mixtral_preserve_moe", _mixtral, (BASE, DECOMP), {"moe"}, ("model.layers.0.mlp",), dict),
    ("hf_bert", _bert, CHEAP, {"kwargs"}, (), _bert_kwargs),
    (
        "hf_bert_preserve_layer",
        _bert,
        (BASE, DECOMP),
        {"kwargs"},
        ("encoder.layer.0",),
        _bert_kwargs,
    ),
    (
        "hf_bert_preserve_attention",
        _bert,
        (BASE, STRICT),
        {"kwargs"},
        ("encoder.layer.0.attention",),
        _bert_kwargs,
    ),
    ("hf_albert", _albert, (BASE, DECOMP), SHARED, (), dict),
    (
        "hf_albert_preserve_layer",
        _albert,
        (BASE, STRICT),
        SHARED | {"preserve_repeated"},
        ("encoder.albert_layer_groups.0.albert_layers.0",),
        dict,
    ),
    ("hf_t5", _t5, (BASE, DECOMP), T5, (), _t5_kwargs),
    ("hf_t5_preserve_sublayer", _t5, (BASE,), T5, ("encoder.block.0.layer.0",), _t5_kwargs),
    ("hf_t5_preserve_block", _t5, (BASE,), T5, ("decoder.block.0",), _t5_kwargs),
]


# Variants that torch's ``run_decompositions`` rejects where it decomposes eval-mode dropout to
# nothing (torch 2.14 on: ``lowering.lowering_seam.decompositions_drop_eval_dropout``).
TORCH_CANNOT_EXPORT = frozenset({"hf_bert_preserve_layer[decomp]", "hf_gpt2_preserve_block[decomp]"})


def _register_all() -> None:
    for name, make, combos, extra, preserve, kwargs in SPECS:
        features = {"hf", "big"} | extra | ({"preserve"} if preserve else set())
        base = Case(
            name, seeded(make), _ids_args, kwargs=kwargs, preserve=preserve, features=features
        )
        for case in variants(base, combos):
            if case.strict or case.decompose:  # a few seconds each: tagged "slow"
                case = attrs.evolve(case, features=case.features | {"slow"})
            if case.name in TORCH_CANNOT_EXPORT and decompositions_drop_eval_dropout():
                continue
            if case.name in HF_CASES:
                raise ValueError(f"duplicate zoo case {case.name!r}")
            HF_CASES[case.name] = case


if transformers is not None:
    _register_all()
