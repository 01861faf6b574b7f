"""Solutions to notebook 11's exercises."""


def my_locate(positions, page_table_row, page_size):
    """Each position's physical page (through the row's page table) and its offset in that page."""
    import numpy as np

    positions, table = np.asarray(positions), np.asarray(page_table_row)
    return table[positions // page_size], positions % page_size


def my_reusable_pages(cached, prompt, page_size):
    """Leading full pages equal in both, never the page of the prompt's last token."""
    limit = min(len(cached) // page_size, (len(prompt) - 1) // page_size)
    n = 0
    while n < limit and cached[n * page_size : (n + 1) * page_size] == prompt[n * page_size : (n + 1) * page_size]:
        n += 1
    return n


def my_chunks(budget, n_decode, chunk, prompt_left):
    """Whole chunks that fit in what the decode tokens leave, and no more than the prompt needs."""
    return min(max(budget - n_decode, 0) // chunk, -(-prompt_left // chunk))


def my_allocate(free_pages, tokens, page_size):
    """One page per page_size positions, from the front of the free list; None when too few are free."""
    need = -(-tokens // page_size)
    return list(free_pages[:need]) if need <= len(free_pages) else None


def my_admit(waiting, free_slots, free_pages, page_size, budget, n_decode):
    """First come, first served: each admitted request takes a free slot and the pages of its prompt and new tokens;
    stop at the first request that does not fit (no overtaking)."""
    plan, left, free = [], budget - n_decode, list(free_pages)
    for (prompt, new), slot in zip(waiting, free_slots):
        pages = my_allocate(free, prompt + new, page_size) if prompt <= left else None
        if pages is None:
            break
        plan.append((slot, pages))
        free, left = free[len(pages) :], left - prompt
    return plan
