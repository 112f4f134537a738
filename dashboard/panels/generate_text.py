"""Generated tokens as the Generate page shows them: readable text, HTML with the first divergent
token marked, the repetition loops a drifted cache can fall into, and what healing did."""
from __future__ import annotations


def heal_line(rep: dict | None) -> str | None:
    """What healing did, in one sentence for the page (None when the run did not heal)."""
    if not rep:
        return None
    budget = (f", at most {rep['budget_positions']} positions" if rep["budget_positions"] else
              f", about {rep['budget_ms']:g} ms" if rep["budget_ms"] else "")
    how = f"Healing {rep['policy']}{budget} per decode step, chunks of {rep['chunk']} positions"
    if rep["finished"]:
        return (f"{how}: the cache was the full model's after token {rep['horizon_tokens']} "
                f"(horizon h = {rep['horizon_tokens']}; {rep['chunks']} chunks, "
                f"{sum(rep['heal_ms_per_step']):.0f} ms of healing in all).")
    return (f"{how}: the answer ended first, {rep['healed_positions']} of {rep['positions']} "
            "positions healed (a healed prefix is exact; the rest is still POP's).")


def repeats(ids: list[int], longest: int = 6, times: int = 3) -> bool:
    """Whether some run of 1..`longest` tokens repeats `times` times back to back (at least four
    tokens in all): the loop a drifted cache can fall into ("Goldsboro Goldsboro ...")."""
    for n in range(1, longest + 1):
        k = max(times, -(-4 // n))  # a single token must come four times
        for i in range(len(ids) - n * k + 1):
            if all(ids[i + j * n:i + (j + 1) * n] == ids[i:i + n] for j in range(1, k)):
                return True
    return False


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each token's text on its own (for highlighting), or its id without a tokenizer."""
    if tokenizer is None:
        return [f"[{i}]" for i in ids]
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def readable_pieces(tokenizer, ids: list[int], max_newlines: int = 2) -> list[tuple[str, bool]]:
    """Each token's text for display as (text, is_special): special tokens such as <|im_end|>
    are flagged (the page shows a small marker, not the raw tag) and runs of blank lines are cut
    to one blank line across token boundaries (spaces between the newlines count as blank)."""
    special = set(getattr(tokenizer, "all_special_tokens", None) or ())
    out, run = [], 0  # run: newlines in a row so far, blank-only text between them
    for piece in token_pieces(tokenizer, ids):
        if piece in special:
            out.append((piece, True))
            continue
        kept = []
        for ch in piece:
            if ch == "\n":
                run += 1
                if run > max_newlines:
                    continue
            elif not ch.isspace():
                run = 0
            elif run > max_newlines - 1:
                continue  # indentation of a line that is dropped anyway
            kept.append(ch)
        out.append(("".join(kept), False))
    return out


def readable_text(tokenizer, ids: list[int]) -> str:
    """The output as plain text: special tokens left out, blank-line runs cut to one."""
    return "".join(t for t, special in readable_pieces(tokenizer, ids) if not special)


def output_html(tokenizer, ids: list[int], first: int | None) -> str:
    """An output for the page: the first divergent token marked, what follows it greyed,
    special tokens as a small marker, blank-line runs cut."""
    import html

    parts = []
    for i, (piece, special) in enumerate(readable_pieces(tokenizer, ids)):
        text = (f'<span class="pop-special" title="special token {html.escape(piece)}" '
                f'style="font-size:.75em;color:#999;border:1px solid #ccc;border-radius:3px;'
                f'padding:0 2px">end</span>' if special
                else html.escape(piece).replace("\n", "<br>"))
        if first is not None and i == first:
            text = f'<mark title="first divergent token (#{i})" style="background:#ffd54f">{text}</mark>'
        elif first is not None and i > first:
            text = f'<span style="color:#888">{text}</span>'
        parts.append(text)
    return "<div class='pop-output'>" + "".join(parts) + "</div>"
