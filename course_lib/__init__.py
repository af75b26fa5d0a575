"""course_lib: the reference library of the long-context training mechanics course.

One module per stop of the data path, in the order a chat sample travels:

    tokenizer   course tokenizer + chat templates (offline), hub loader
    tiny        tiny Qwen2 from a shipped config; configs of the real models
    sources     Alpaca / ShareGPT records -> chat messages; JSON/JSONL/CSV through datasets
    ledger      one rendering -> template / prompt / supervised token counts; P50/P95, overflow
    window      fit | truncate | overflow, and cutting only the supervision tail
    labels      input_ids + labels (-100 outside answers), padding a batch
    packing     bin plans, boundary-isolated rows, block-causal masks, varlen metadata
    packing_split  over-long samples cut into row-sized pieces, each packed like a sample (TRL's bfd_split)
    varlen      attention per packed sample from cu_seqlens / position restarts: no [L, L] mask
    packed_forward  a transformers model on packed rows, checked against each sample alone
    microbatch  token-budget microbatches, balanced data-parallel partitions
    logprobs    selected / chunked / checkpointed log-probs, token entropy, and the memory autograd keeps
    loss        masked normalisation, global token-count loss aggregation, no target across a packed boundary
    accounting  KV bytes, decode roofline, training rate, GPU-hours
    curriculum  length-curriculum gates, pass-rate filters
    longdoc     geometric buckets, sliding windows with single loss ownership
    tiled       exact attention in blocks (online softmax, log-sum-exp backward): no T x T scores
    ring        one sequence over ranks: shard layouts (contiguous, head-tail), ring attention by log-sum-exp merges
    rope        positions past the trained length: RoPE frequencies scaled (linear, NTK, dynamic, YaRN, Llama 3)
    longeval    is the context used: key-value retrieval by length x needle depth, loss by position

Every public name is importable from here: `from course_lib import plan_packing`.
"""

from __future__ import annotations

from pathlib import Path

from ._exports import lazy_exports

__version__ = "0.1.0"

# in the order a chat sample travels; each is imported when one of its names is first read (see _exports)
__getattr__, __dir__ = lazy_exports(
    __name__,
    Path(__file__).parent,
    (
        "tokenizer",
        "tiny",
        "sources",
        "ledger",
        "window",
        "labels",
        "packing",
        "packing_split",
        "varlen",
        "packed_forward",
        "microbatch",
        "logprobs",
        "loss",
        "accounting",
        "curriculum",
        "longdoc",
        "tiled",
        "ring",
        "rope",
        "longeval",
        "lab",
    ),
)
