"""The KV cache: keep every layer's keys and values so each new token costs one row, not the whole sequence."""


class ModelCache:
    """Per layer, the keys and values of every position consumed so far ([n_head, length, head_dim] each)."""

    def __init__(self, n_layer):
        raise NotImplementedError("ModelCache")

    def __len__(self):
        """How many positions the cache holds."""
        raise NotImplementedError("ModelCache.__len__")


def prefill(params, ids, n_head):
    """Run the prompt once, filling a fresh cache -> (logits [n, n_vocab], cache).

    After prefill the cache holds len(ids) rows in every layer.
    """
    raise NotImplementedError("prefill")


def decode_step(params, cache, token_id, pos, n_head):
    """Consume one token at position pos (== len(cache)), append its keys and values -> logits [n_vocab]."""
    raise NotImplementedError("decode_step")


def single_step_attention(params, ids, n_head):
    """Layer 0's attention sublayer x + attn(ln_1(x)) at the last position only -> [n_embd].

    Fill a cache with the keys and values of positions 0 .. n-2, then compute the last
    position's query, append its own key and value, and attend over the whole cache.
    """
    raise NotImplementedError("single_step_attention")


def layer_attn_incremental(params, ids, n_head):
    """Layer 0's attention sublayer, x + attn(ln_1(x)), one position at a time from one fresh cache -> [n, n_embd]."""
    raise NotImplementedError("layer_attn_incremental")


def generate_cached(params, ids, n_new, n_head):
    """Greedy decoding with the cache: one prefill, then one decode step per token -> n_new token ids."""
    raise NotImplementedError("generate_cached")
