"""Greedy speculation under a grammar, on the host: which drafts a step proposes, and each verified row's choice.

Why on the host: the grammar's matcher (llguidance) runs there and must see every token. A row's masked argmax
is its plain argmax wherever the row's mask allows that token, so most rows need no mask at all: a row whose
token the grammar forces takes it whatever the logits; a row where the grammar forces no byte takes the
target's argmax if the matcher takes it (the mask is then exactly the tokens the matcher takes); only the
others compute their mask. The drafts are proposals (the verification holds the reply to the grammar), so
each row drafts the likeliest of a few candidates the matcher takes, and the walk stops where the drafter has
lost the grammar's path. speculative.Decoder launches the step and verifies it with these.
"""

from __future__ import annotations

import torch

from flashdesk.engine.decode.grammar import GrammarError, GrammarState, Walk

# a draft row's likeliest tokens, tried against the matcher (a microsecond each) before its mask is computed
# (tens of microseconds): as many drafts accepted as with the masked argmax, on the bench's JSON
DRAFT_CANDIDATES = 4
# rows of one draft that get a mask because the matcher takes none of their candidates; past them the drafter
# has lost the grammar's path, and the walk stops (on the bench's JSON, as many drafts accepted)
LOST_ROWS = 2

NO_CHOICE = "the reply could not be held to its grammar: no token it allows could be chosen"


def choose(state: GrammarState, bitmask: torch.Tensor, token: int, row: torch.Tensor, draft: bool = False) -> int:
    """A greedy choice under a row's bitmask [W]: the row's argmax `token` where the mask allows
    it, which is then the masked argmax too; else the masked row's argmax (on a GPU, masked there
    and read). A target's row whose every allowed token scores -inf (the sampling suppresses them)
    has no choice: GrammarError; a draft row's choice is only a proposal."""
    if state.allows(bitmask, token):
        return token
    choice, finite = state.masked_argmax(row, bitmask)
    if not finite and not draft:
        raise GrammarError(NO_CHOICE)
    return choice


def draft_tokens(candidates: list[list[int]], draft_logits: torch.Tensor, walk: Walk) -> list[int]:
    """The drafts of a step, from each row's candidates (its likeliest tokens, read from the
    device at once), walked through the matcher: a forced row takes its token; else the row's
    likeliest candidate the matcher takes, its mask left for the verification to compute if it gets
    there; where the matcher takes none of them, the row's masked argmax (masked and read again).
    Past a draft the matcher cannot take (the end of a finished grammar), or past LOST_ROWS rows
    that needed a mask, the rows are left as proposed: none can be accepted."""
    tokens = [row[0] for row in candidates]
    state, lost = walk.state, 0
    for i, row in enumerate(candidates):
        if walk.refused:
            break
        forced = state.forced()
        walk.forced.append(forced is not None)
        walk.free.append(state.free())
        if forced is not None:
            tokens[i] = forced
        else:
            taken = next((token for token in row if state.valid(token)), None)
            if taken is None:
                lost += 1
                if lost > LOST_ROWS:  # the rest stay as proposed, unwalked: none will be accepted
                    break
                # still the argmax where it is an end token the mask allows (a finished grammar)
                taken = choose(state, state.bitmask(), row[0], draft_logits[i : i + 1], draft=True)
            tokens[i] = taken
        walk.take(tokens[i])
    return tokens


def row_choice(
    walk: Walk,
    i: int,
    draft_ids: list[int],
    best: int,
    row: torch.Tensor,
    suppress: tuple[int, ...],
    emitted: bool = True,
) -> int:
    """Row i's masked argmax, the matcher at the row's state, as cheaply as the state allows: a
    token the grammar forced there (the walk's draft) is the choice, whatever the logits; where
    it forced no byte, the target's plain argmax `best` is the choice if the matcher takes it
    (its mask is then the tokens the matcher takes); else the row's mask decides (`choose`). A
    row none of whose allowed tokens can be chosen (`suppress` holds them) ends the reply with a
    GrammarError, as a plain step does, unless it is not `emitted` (past the reply's last token)."""
    state = walk.state
    if i < len(walk.forced):  # a row the walk reached: what the grammar forces there is known
        forced, free = (draft_ids[i] if walk.forced[i] else None), walk.free[i]
    else:
        forced = state.forced()
        free = state.free()
    if forced is not None:
        if forced in suppress and emitted:
            raise GrammarError(NO_CHOICE)
        return forced
    if free and best not in state.end_ids and state.valid(best):
        return best
    return choose(state, state.bitmask(), best, row, draft=not emitted)
