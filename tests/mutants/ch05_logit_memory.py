"""Wrong answers for chapter 5 (the memory of the logits)."""

from tests.mutants import mutate

CHAPTER = "05_logit_memory"

_CHECKPOINTED = """
from torch.utils.checkpoint import checkpoint


def checkpointed_log_probs(hidden, weight, ids, chunk_size=1024):
    chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)

    def chunk_log_probs(hidden_chunk, weight, ids_chunk):
        return LOG_PROBS

    pieces = [PIECE for start in STARTS]
    return torch.cat(pieces, dim=1) if pieces else hidden.new_zeros(hidden.shape[:2], dtype=EMPTY_DTYPE)
"""

_RECOMPUTED = (
    "checkpoint(chunk_log_probs, hidden[:, start:start + chunk_size], weight, ids[:, start:start + chunk_size], "
    "use_reentrant=False)"
)
_ALL_STARTS = "range(0, hidden.shape[1], chunk_size)"


def _checkpointed(
    log_probs="selected_log_probs(hidden_chunk @ weight.T, ids_chunk)", piece=_RECOMPUTED, starts=_ALL_STARTS
):
    return (
        _CHECKPOINTED.replace("EMPTY_DTYPE", "torch.promote_types(hidden.dtype, torch.float32)")
        .replace("LOG_PROBS", log_probs)
        .replace("PIECE", piece)
        .replace("STARTS", starts)
    )


MUTANTS = {
    "checkpointed_log_probs": {
        # Chunking without recompute: right values and gradients, but autograd keeps every chunk's log-softmax.
        "chunked_without_recompute": _checkpointed(
            piece="chunk_log_probs(hidden[:, start:start + chunk_size], weight, ids[:, start:start + chunk_size])"
        ),
        # Recomputed, but over the whole sequence at once: the forward still builds the full [B, T, V] logits.
        "recompute_without_chunking": _checkpointed(
            piece="checkpoint(chunk_log_probs, hidden, weight, ids, use_reentrant=False)", starts="range(0, 1)"
        ),
        # Log-softmax in the logits' own dtype: bf16 log-probs lose about two decimal digits.
        "log_softmax_without_fp32_upcast": _checkpointed(
            log_probs="(hidden_chunk @ weight.T).log_softmax(-1).gather(-1, ids_chunk.unsqueeze(-1)).squeeze(-1)"
        ),
        # Only whole chunks: the tail of T % chunk_size tokens is dropped.
        "drops_the_tail_chunk": _checkpointed(
            starts="range(0, hidden.shape[1] // chunk_size * chunk_size, chunk_size)"
        ),
        # The weight is detached "to save memory": no gradient ever reaches the output layer.
        "weight_detached": _checkpointed(log_probs="selected_log_probs(hidden_chunk @ weight.detach().T, ids_chunk)"),
    },
    "largest_chunk_for_1gb": {
        # bf16 logits: 2 bytes per logit, while the table (and the log-softmax) is fp32.
        "bf16_bytes": "largest_chunk_for_1gb = 10**9 // (2 * QWEN3_VOCAB_SIZE)\n",
        # 1 GiB (2**30) where the question says 1 GB (10**9 bytes).
        "gibibyte": "largest_chunk_for_1gb = 2**30 // (4 * QWEN3_VOCAB_SIZE)\n",
        # Rounded up: the chunk one token longer is already over 1 GB.
        "rounded_up": "largest_chunk_for_1gb = -(-(10**9) // (4 * QWEN3_VOCAB_SIZE))\n",
        # The logits and their log-softmax counted as one tensor of 8 bytes per logit.
        "two_tensors_as_one": "largest_chunk_for_1gb = 10**9 // (8 * QWEN3_VOCAB_SIZE)\n",
        # The width D (1,024 for Qwen3-0.6B) in place of the vocabulary.
        "hidden_width_for_vocab": "largest_chunk_for_1gb = 10**9 // (4 * 1024)\n",
        # A float from true division: 1645.6 is no chunk size.
        "float_answer": "largest_chunk_for_1gb = 10**9 / (4 * QWEN3_VOCAB_SIZE)\n",
    },
}

# Wrong answers a review of the grading found keeping full points (before the memory probe saw the backward pass
# and small chunks, and the grader checked that arguments are left unchanged).

_TARGET = "course_lib.logprobs.checkpointed_log_probs"
MUTANTS["checkpointed_log_probs"].update(
    {
        # torch.chunk takes the NUMBER of chunks: with chunk_size=16 over 2048 tokens, each piece holds 128 tokens.
        "chunk_count_for_chunk_size": """
from torch.utils.checkpoint import checkpoint


def checkpointed_log_probs(hidden, weight, ids, chunk_size=1024):
    chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)

    def chunk_log_probs(hidden_chunk, weight, ids_chunk):
        return selected_log_probs(hidden_chunk @ weight.T, ids_chunk)

    if hidden.shape[1] == 0:
        return hidden.new_zeros(hidden.shape[:2], dtype=torch.float32)
    pieces = [checkpoint(chunk_log_probs, hidden_chunk, weight, ids_chunk, use_reentrant=False)
              for hidden_chunk, ids_chunk in zip(hidden.chunk(chunk_size, dim=1), ids.chunk(chunk_size, dim=1))]
    return torch.cat(pieces, dim=1)
""",
        # Chunked in forward, but backward rebuilds the whole [B, T, V] logits at once.
        "full_logits_in_backward": """
class _OutputLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, ids, chunk_size):
        ctx.save_for_backward(hidden, weight, ids)
        pieces = [selected_log_probs(hidden[:, s:s + chunk_size] @ weight.T, ids[:, s:s + chunk_size])
                  for s in range(0, hidden.shape[1], chunk_size)]
        return torch.cat(pieces, dim=1) if pieces else hidden.new_zeros(hidden.shape[:2], dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, ids = ctx.saved_tensors
        logits = hidden @ weight.T                                                # [B, T, V] all at once
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
        d_logits = -wide.softmax(-1)
        d_logits.scatter_add_(-1, ids.unsqueeze(-1), torch.ones_like(d_logits[..., :1]))
        d_logits = (d_logits * grad.unsqueeze(-1)).to(logits.dtype)
        return d_logits @ weight, torch.einsum("btv,btd->vd", d_logits, hidden), None, None


def checkpointed_log_probs(hidden, weight, ids, chunk_size=1024):
    chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)
    return _OutputLayer.apply(hidden, weight, ids, chunk_size)
""",
        # A default of 4096 tokens per chunk: four times the logits the signature promises.
        "default_chunk_4096": mutate(_TARGET, ("chunk_size: int = 1024", "chunk_size: int = 4096")),
        # Silences checkpoint's warning by switching on the caller's requires_grad.
        "switches_on_requires_grad": mutate(
            _TARGET,
            (
                "chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)",
                "chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)\n"
                "    if not hidden.requires_grad:\n"
                "        hidden.requires_grad_()",
            ),
        ),
        # The reentrant checkpoint: .backward() works, torch.autograd.grad of (hidden, weight) raises.
        "reentrant_checkpoint": mutate(_TARGET, ("use_reentrant=False", "use_reentrant=True")),
    }
)

# Correct answers that differ from the library's code: each must keep every point.
ALTERNATIVES = {
    "checkpointed_log_probs": {
        "torch_split": _checkpointed(
            piece="checkpoint(chunk_log_probs, hidden_chunk, weight, ids_chunk, use_reentrant=False)",
            starts="zip(hidden.split(chunk_size, dim=1), ids.split(chunk_size, dim=1))",
        )
        .replace("for start in zip(", "for hidden_chunk, ids_chunk in zip(")
        .replace(
            "hidden.new_zeros(hidden.shape[:2], dtype=torch.float32)",
            "hidden.new_zeros(hidden.shape[:2], dtype=torch.promote_types(hidden.dtype, torch.float32))",
        ),
    },
}

# A second review's wrong answers (some caught already, kept as different mistakes; the rest caught since).
_WIDE = "torch.promote_types({0}.dtype, torch.float32)"
MUTANTS["checkpointed_log_probs"].update(
    {
        # A lambda over the loop variable: checkpoint's replay in backward sees the LAST chunk's ids for every chunk,
        # so the values are right and the gradients are not.
        "late_binding_lambda": """
from torch.utils.checkpoint import checkpoint


def checkpointed_log_probs(hidden, weight, ids, chunk_size=1024):
    chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)
    pieces = []
    for start in range(0, hidden.shape[1], chunk_size):
        pieces.append(checkpoint(lambda h, w: selected_log_probs(h @ w.T, ids[:, start:start + chunk_size]),
                                 hidden[:, start:start + chunk_size], weight, use_reentrant=False))
    if not pieces:
        return hidden.new_zeros(hidden.shape[:2], dtype=torch.promote_types(hidden.dtype, torch.float32))
    return torch.cat(pieces, dim=1)
""",
        # Upcast before the matmul: bf16 logits no longer match the model's lm_head (which multiplies in bf16).
        "matmul_in_fp32": mutate(
            _TARGET,
            (
                "selected_log_probs(hidden_chunk @ weight.T, ids_chunk)",
                f"selected_log_probs(hidden_chunk.to({_WIDE.format('hidden_chunk')}) @ "
                f"weight.to({_WIDE.format('weight')}).T, ids_chunk)",
            ),
        ),
        # hidden detached inside the chunk: the output layer trains, nothing flows back into the model.
        "hidden_detached": mutate(
            _TARGET,
            (
                "selected_log_probs(hidden_chunk @ weight.T, ids_chunk)",
                "selected_log_probs(hidden_chunk.detach() @ weight.T, ids_chunk)",
            ),
        ),
        # The log-probs cast back to the inputs' dtype: bf16 log-probs, the fp32 log-softmax thrown away.
        "output_in_input_dtype": mutate(
            _TARGET, ("return torch.cat(pieces, dim=1)  ", "return torch.cat(pieces, dim=1).to(hidden.dtype)  ")
        ),
    }
)
MUTANTS["checkpointed_log_probs"].update(
    {
        # The matmul outside the checkpoint: each chunk's [B, C, V] logits are checkpoint's input,
        # so autograd keeps them.
        "checkpoint_after_matmul": _checkpointed(
            log_probs="selected_log_probs(hidden_chunk, ids_chunk)",
            piece="checkpoint(chunk_log_probs, hidden[:, start:start + chunk_size] @ weight.T, weight, "
            "ids[:, start:start + chunk_size], use_reentrant=False)",
        ),
    }
)
ALTERNATIVES["checkpointed_log_probs"].update(
    {
        # F.linear instead of `@ weight.T`, and the chunk's ids gathered by index: the same bf16 matmul and values.
        "linear_and_index_ranges": mutate(
            _TARGET,
            (
                "selected_log_probs(hidden_chunk @ weight.T, ids_chunk)",
                "selected_log_probs(torch.nn.functional.linear(hidden_chunk, weight), ids_chunk)",
            ),
        ),
    }
)

# A third review's correct answers, in other styles students use.
ALTERNATIVES["checkpointed_log_probs"].update(
    {
        # A module-level chunk function, an explicit loop with min() for the end, T = 0 handled first with torch.empty.
        "explicit_loop_module_level_fn": """
import torch
from torch.utils.checkpoint import checkpoint


def _chunk_log_probs(hidden_chunk, weight, ids_chunk):
    return selected_log_probs(hidden_chunk @ weight.T, ids_chunk)


def checkpointed_log_probs(hidden, weight, ids, chunk_size=1024):
    chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)
    batch, tokens = hidden.shape[0], hidden.shape[1]
    if tokens == 0:
        return torch.empty(batch, 0, dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)
    pieces = []
    start = 0
    while start < tokens:
        end = min(start + chunk_size, tokens)
        pieces.append(checkpoint(_chunk_log_probs, hidden[:, start:end], weight, ids[:, start:end],
                                 use_reentrant=False, preserve_rng_state=False))
        start = end
    return torch.cat(pieces, dim=1)
""",
        # functools.partial binds each chunk's ids (no late binding), torch.narrow for the chunk, torch.cat on a tuple.
        "partial_and_narrow": """
import functools

import torch
from torch.utils.checkpoint import checkpoint


def checkpointed_log_probs(hidden, weight, ids, chunk_size=1024):
    chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)

    def head(hidden_chunk, weight, ids_chunk):
        return selected_log_probs(hidden_chunk @ weight.T, ids_chunk)

    tokens = hidden.size(1)
    pieces = tuple(
        checkpoint(functools.partial(head, ids_chunk=ids.narrow(1, start, min(chunk_size, tokens - start))),
                   hidden.narrow(1, start, min(chunk_size, tokens - start)), weight, use_reentrant=False)
        for start in range(0, tokens, chunk_size))
    if len(pieces) == 0:
        return hidden.new_zeros((hidden.size(0), 0), dtype=torch.promote_types(hidden.dtype, torch.float32))
    return torch.cat(pieces, dim=1)
""",
        # torch.utils.checkpoint reached through the module, and torch.matmul with weight.t().
        "module_checkpoint_and_matmul": """
import torch
import torch.utils.checkpoint


def checkpointed_log_probs(hidden, weight, ids, chunk_size=1024):
    chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)
    out_dtype = torch.promote_types(hidden.dtype, torch.float32)
    results = []
    for hidden_chunk, ids_chunk in zip(torch.split(hidden, chunk_size, dim=1), torch.split(ids, chunk_size, dim=1)):
        results.append(torch.utils.checkpoint.checkpoint(
            lambda h, w, i: selected_log_probs(torch.matmul(h, w.t()), i), hidden_chunk, weight, ids_chunk,
            use_reentrant=False))
    return torch.cat(results, dim=1) if results else torch.zeros(hidden.shape[0], 0, dtype=out_dtype)
""",
    }
)
ALTERNATIVES["checkpointed_log_probs"].update(
    {
        # The weight reached by closure instead of passed to checkpoint: the non-reentrant checkpoint still replays it.
        "weight_by_closure": """
import torch
from torch.utils.checkpoint import checkpoint


def checkpointed_log_probs(hidden, weight, ids, chunk_size=1024):
    chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)

    def one_chunk(hidden_chunk, ids_chunk):
        return selected_log_probs(hidden_chunk @ weight.T, ids_chunk)

    pieces = [checkpoint(one_chunk, hidden[:, s:s + chunk_size], ids[:, s:s + chunk_size], use_reentrant=False)
              for s in range(0, hidden.shape[1], chunk_size)]
    if not pieces:
        return hidden.new_empty((hidden.shape[0], 0), dtype=torch.promote_types(hidden.dtype, torch.float32))
    return torch.cat(pieces, dim=1)
""",
    }
)
# torch.einsum for the chunk's logits: the same bf16 matmul (one rounding of an fp32 accumulation).
ALTERNATIVES["checkpointed_log_probs"]["einsum_logits"] = mutate(
    _TARGET,
    (
        "selected_log_probs(hidden_chunk @ weight.T, ids_chunk)",
        'selected_log_probs(torch.einsum("btd,vd->btv", hidden_chunk, weight), ids_chunk)',
    ),
)

# A degenerate input costs only its own small cell, never the mechanism's points (issue 31): the library's code
# without its T = 0 branch (torch.cat of no chunks raises) is right in values, gradients and memory.
MUTANTS["checkpointed_log_probs"]["no_empty_sequence_branch"] = mutate(
    _TARGET,
    (
        "    if not pieces:  # T = 0: an empty [B, 0], in the dtype selected_log_probs gives for T > 0\n"
        "        return hidden.new_zeros(hidden.shape[:2], dtype=torch.promote_types(hidden.dtype, torch.float32))\n",
        "",
    ),
)

# Wrong answers whose loss is bounded: todo -> {mutant: the only graded cells it may lose}. Each loses exactly
# these cells, and keeps the rest of its TODO's points (tests/test_mutants.py).
LOSES_ONLY = {
    "checkpointed_log_probs": {"no_empty_sequence_branch": ["test_checkpointed_log_probs__edge_cases"]},
}

ALTERNATIVES["largest_chunk_for_1gb"] = {
    # the number itself, worked out by hand: 10**9 / (4 * 151,936) = 1645.4
    "literal": "largest_chunk_for_1gb = 1645\n",
    # rounded down from a float
    "floor_of_a_float": "import math\n\nlargest_chunk_for_1gb = math.floor(1e9 / (4 * QWEN3_VOCAB_SIZE))\n",
}
