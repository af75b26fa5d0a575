"""Wrong answers for chapter 5 (the memory of the logits)."""

CHAPTER = "05_logit_memory"

_CHECKPOINTED = '''
def checkpointed_log_probs(hidden, weight, ids, chunk_size=1024):
    chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)

    def chunk_log_probs(hidden_chunk, weight, ids_chunk):
        return LOG_PROBS

    pieces = [PIECE for start in STARTS]
    return torch.cat(pieces, dim=1) if pieces else hidden.new_zeros(hidden.shape[:2], dtype=torch.float32)
'''

_RECOMPUTED = ("checkpoint(chunk_log_probs, hidden[:, start:start + chunk_size], weight, ids[:, start:start + chunk_size], "
               "use_reentrant=False)")
_ALL_STARTS = "range(0, hidden.shape[1], chunk_size)"


def _checkpointed(log_probs="selected_log_probs(hidden_chunk @ weight.T, ids_chunk)", piece=_RECOMPUTED,
                  starts=_ALL_STARTS):
    return _CHECKPOINTED.replace("LOG_PROBS", log_probs).replace("PIECE", piece).replace("STARTS", starts)


MUTANTS = {
    "checkpointed_log_probs": {
        # Chunking without recompute: right values and gradients, but autograd keeps every chunk's log-softmax.
        "chunked_without_recompute": _checkpointed(
            piece="chunk_log_probs(hidden[:, start:start + chunk_size], weight, ids[:, start:start + chunk_size])"),
        # Recomputed, but over the whole sequence at once: the forward still builds the full [B, T, V] logits.
        "recompute_without_chunking": _checkpointed(
            piece="checkpoint(chunk_log_probs, hidden, weight, ids, use_reentrant=False)", starts="range(0, 1)"),
        # Log-softmax in the logits' own dtype: bf16 log-probs lose about two decimal digits.
        "log_softmax_without_fp32_upcast": _checkpointed(
            log_probs="(hidden_chunk @ weight.T).log_softmax(-1).gather(-1, ids_chunk.unsqueeze(-1)).squeeze(-1)"),
        # Only whole chunks: the tail of T % chunk_size tokens is dropped.
        "drops_the_tail_chunk": _checkpointed(starts="range(0, hidden.shape[1] // chunk_size * chunk_size, chunk_size)"),
        # The weight is detached "to save memory": no gradient ever reaches the output layer.
        "weight_detached": _checkpointed(log_probs="selected_log_probs(hidden_chunk @ weight.detach().T, ids_chunk)"),
    },
}
