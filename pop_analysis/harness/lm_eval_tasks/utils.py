"""Documents of POP Lab's local multiple-choice tasks over GSM8K (lm-eval imports this file from
the rendered task folder). Distractors come from neighbouring problems, so every choice is real
text; the gold position rotates with the document index. Deterministic: no randomness."""


def final_number(answer: str) -> str:
    return answer.split("####")[-1].strip().replace(",", "")


def _with_gold(others: list, gold, i: int) -> tuple[list, int]:
    label = i % (len(others) + 1)
    return others[:label] + [gold] + others[label:], label


def _distinct(values: list, i: int, k: int = 3) -> list:
    """Up to k values from the documents after i (wrapping) that differ from values[i] and each other."""
    out, n = [], len(values)
    for j in range(1, n):
        v = values[(i + j) % n]
        if v != values[i] and v not in out:
            out.append(v)
        if len(out) == k:
            break
    return out


def solution_docs(dataset):
    """Which worked solution answers this question? (the gold one and three others)."""
    answers = list(dataset["answer"])

    def add(doc, i):
        choices, label = _with_gold(_distinct(answers, i), doc["answer"], i)
        return {"choices": choices, "label": label}

    return dataset.map(add, with_indices=True)


def final_number_docs(dataset):
    """After the worked solution, which number follows '####'? (gold and three other finals)."""
    finals = [final_number(a) for a in dataset["answer"]]

    def add(doc, i):
        choices, label = _with_gold(_distinct(finals, i), finals[i], i)
        return {"reasoning": doc["answer"].split("####")[0].rstrip(), "choices": choices,
                "label": label}

    return dataset.map(add, with_indices=True)
