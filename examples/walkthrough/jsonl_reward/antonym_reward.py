"""The user's own reward for examples/walkthrough/jsonl_reward/run.toml (and jsonl_lora): the only Python the
JSONL scenarios need. ``[env] reward = "antonym_reward:score"`` names it; ``ludic train`` finds it next to the
config and calls it for every training and held-out episode."""


def score(reply: str, target: str | None, row: dict) -> float:
    """1 for a reply whose first word is any accepted answer of the row (its own ``answers`` field, which
    exact match against ``answer`` cannot use), 0.5 when an accepted answer appears later, else 0."""
    words = [w.strip(".,!?'\"").lower() for w in reply.split()]
    accepted = {a.lower() for a in row.get("answers") or [target or ""]}
    if words and words[0] in accepted:
        return 1.0
    return 0.5 if accepted & set(words) else 0.0
