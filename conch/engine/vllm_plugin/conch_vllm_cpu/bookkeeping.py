"""Numpy versions of Model Runner V2's per-step bookkeeping Triton kernels (positions, sampled-token
write-back, block tables, slot mappings), for CPU where the tensors are host memory. Each loops over the
requests of a step, as the kernel's program ids do (`vllm/v1/worker/gpu/input_batch.py`, `block_table.py`).
"""

from __future__ import annotations

import numpy as np

_PREFIX = "vllm.v1.worker.gpu.input_batch."


def _np(t):
    return None if t is None else t.numpy()


def prepare_pos_seq_lens_kernel(pos_ptr, seq_lens_ptr, idx_mapping_ptr, query_start_loc_ptr,
                                num_computed_tokens_ptr, max_num_reqs, BLOCK_SIZE, **_launch):
    pos, seq_lens, idx = _np(pos_ptr), _np(seq_lens_ptr), _np(idx_mapping_ptr)
    qsl, computed = _np(query_start_loc_ptr), _np(num_computed_tokens_ptr)
    n = idx.shape[0]
    seq_lens[n:max_num_reqs] = 0  # padding rows
    for b in range(n):
        done, start, end = int(computed[idx[b]]), int(qsl[b]), int(qsl[b + 1])
        seq_lens[b] = done + end - start
        pos[start:end] = np.arange(done, done + end - start, dtype=pos.dtype)


def combine_sampled_and_draft_tokens_kernel(input_ids_ptr, idx_mapping_ptr, last_sampled_tokens_ptr,
                                            query_start_loc_ptr, seq_lens_ptr, prefill_len_ptr, draft_tokens_ptr,
                                            draft_tokens_stride, cu_num_logits_ptr, logits_indices_ptr, BLOCK_SIZE,
                                            NUM_NEW_SAMPLED_TOKENS=1, **_launch):
    ids, idx, last = _np(input_ids_ptr), _np(idx_mapping_ptr), _np(last_sampled_tokens_ptr)
    qsl, seq_lens, prefill = _np(query_start_loc_ptr), _np(seq_lens_ptr), _np(prefill_len_ptr)
    draft, cu, logits_idx = _np(draft_tokens_ptr), _np(cu_num_logits_ptr), _np(logits_indices_ptr)
    for b in range(idx.shape[0]):
        r = int(idx[b])
        c0, c1 = int(cu[b]), int(cu[b + 1])
        n_logits, q_end = c1 - c0, int(qsl[b + 1])
        first = q_end - n_logits
        logits_idx[c0:c1] = np.arange(first, q_end)
        seq_len, plen = int(seq_lens[b]), int(prefill[r])
        if seq_len <= plen:  # still prefilling: no sampled or draft tokens to place
            continue
        if NUM_NEW_SAMPLED_TOKENS > 0 and seq_len - n_logits >= plen:
            ids[first] = last[r]
        n_draft = n_logits - NUM_NEW_SAMPLED_TOKENS
        if n_draft > 0:
            ids[q_end - n_draft:q_end] = draft.reshape(-1)[r * draft_tokens_stride:r * draft_tokens_stride + n_draft]


def get_num_sampled_and_rejected_kernel(num_sampled_ptr, num_rejected_ptr, seq_lens_ptr, cu_num_logits_ptr,
                                        idx_mapping_ptr, prefill_len_ptr, **_launch):
    sampled, rejected, seq_lens = _np(num_sampled_ptr), _np(num_rejected_ptr), _np(seq_lens_ptr)
    cu, idx, prefill = _np(cu_num_logits_ptr), _np(idx_mapping_ptr), _np(prefill_len_ptr)
    n = idx.shape[0]
    chunked = seq_lens[:n] < prefill[idx]
    sampled[:n] = np.where(chunked, 0, sampled[:n])
    rejected[:n] = np.where(chunked, 0, (cu[1:n + 1] - cu[:n]) - sampled[:n])


def post_update_kernel(idx_mapping_ptr, num_computed_tokens_ptr, last_sampled_tokens_ptr, output_bin_counts_ptr,
                       output_bin_counts_stride, sampled_tokens_ptr, sampled_tokens_stride, num_sampled_ptr,
                       num_rejected_ptr, query_start_loc_ptr, all_token_ids_ptr, all_token_ids_stride, total_len_ptr, **_launch):
    idx, computed, last = _np(idx_mapping_ptr), _np(num_computed_tokens_ptr), _np(last_sampled_tokens_ptr)
    bins, sampled_tokens, n_sampled = _np(output_bin_counts_ptr), _np(sampled_tokens_ptr), _np(num_sampled_ptr)
    n_rejected, qsl, all_ids, total = _np(num_rejected_ptr), _np(query_start_loc_ptr), _np(all_token_ids_ptr), \
        _np(total_len_ptr)
    for b in range(idx.shape[0]):
        r = int(idx[b])
        if r < 0:
            continue
        length, k = int(total[r]), int(n_sampled[b])
        if k > 0:
            toks = sampled_tokens[b, :k]
            last[r] = toks[-1]
            total[r] = length + k
            all_ids[r, length:length + k] = toks
            if bins is not None:
                np.add.at(bins[r], toks.astype(np.int64), 1)
        q_len = 0 if qsl is None else int(qsl[b + 1]) - int(qsl[b])
        delta = q_len - int(n_rejected[b])
        if delta:
            computed[r] += delta


OVERRIDES = {
    _PREFIX + "_prepare_pos_seq_lens_kernel": prepare_pos_seq_lens_kernel,
    _PREFIX + "_combine_sampled_and_draft_tokens_kernel": combine_sampled_and_draft_tokens_kernel,
    _PREFIX + "_get_num_sampled_and_rejected_kernel": get_num_sampled_and_rejected_kernel,
    _PREFIX + "_post_update_kernel": post_update_kernel,
}


def _gather_block_tables(self, idx_mapping, num_reqs_padded, out=None, out_ptrs=None):
    if self.num_kv_cache_groups == 0:
        return ()
    out = tuple(self.input_block_tables) if out is None else out
    idx, n = idx_mapping.numpy(), idx_mapping.shape[0]
    n_blocks = self.num_blocks.gpu.numpy()
    for g in range(self.num_kv_cache_groups):
        src, dst = self.block_tables[g].gpu.numpy(), out[g].numpy()
        dst[n:num_reqs_padded] = 0
        for b in range(n):
            k = int(n_blocks[g, idx[b]])
            dst[b, :k] = src[idx[b], :k]
    return tuple(bt[:num_reqs_padded] for bt in out)


def _compute_slot_mappings(self, idx_mapping, query_start_loc, positions, num_tokens_padded, out=None):
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    slots = self.slot_mappings if out is None else out
    if self.num_kv_cache_groups == 0:
        return slots[:, :num_tokens_padded]
    if self.cp_size != 1:
        raise NotImplementedError("conch_vllm_cpu: slot mappings without context parallelism only")
    idx, qsl, pos = idx_mapping.numpy(), query_start_loc.numpy(), positions.numpy()
    n = idx.shape[0]
    for g in range(self.num_kv_cache_groups):
        sm, size, table = slots[g].numpy(), int(self.block_sizes[g]), self.block_tables[g].gpu.numpy()
        sm[int(qsl[n]):] = PAD_SLOT_ID
        for b in range(n):
            s, e, r = int(qsl[b]), int(qsl[b + 1]), int(idx[b])
            if not self._slot_mapping_enabled[g] or r < 0:
                sm[s:e] = PAD_SLOT_ID
                continue
            p = pos[s:e].astype(np.int64)
            sm[s:e] = table[r, p // size].astype(np.int64) * size + p % size
    return slots[:, :num_tokens_padded]


def patch_block_tables() -> None:
    from vllm.v1.worker.gpu import block_table

    block_table.BlockTables.gather_block_tables = _gather_block_tables
    block_table.BlockTables.compute_slot_mappings = _compute_slot_mappings
