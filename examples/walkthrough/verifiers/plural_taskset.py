"""The user's own verifiers (v1) taskset: give the plural of a noun, scored by its own @reward.

Not Ludic code: what a user brings. ``[env] kwargs.taskset = "plural_taskset"`` in run.toml finds it next to
the config (verifiers imports a taskset by its id as a module; ``ludic train`` puts the config's folder on
the import path).
"""

import verifiers.v1 as vf

NOUNS = {
    "cat": "cats", "box": "boxes", "city": "cities", "leaf": "leaves", "child": "children", "mouse": "mice",
    "tooth": "teeth", "bus": "buses", "baby": "babies", "knife": "knives", "man": "men", "dish": "dishes",
    "story": "stories", "wolf": "wolves", "foot": "feet", "glass": "glasses", "party": "parties",
    "goose": "geese", "toy": "toys", "hero": "heroes", "day": "days", "wife": "wives", "fox": "foxes",
    "lady": "ladies", "church": "churches", "book": "books", "woman": "women", "potato": "potatoes",
    "shelf": "shelves", "key": "keys", "watch": "watches", "person": "people",
}


class PluralData(vf.TaskData):
    answer: str = ""


class PluralTask(vf.Task[PluralData, vf.State]):
    @vf.reward
    async def exact(self, task: PluralData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip().strip(".").lower() == task.answer)


class PluralTaskset(vf.Taskset[PluralTask]):
    def load(self):
        for noun, plural in NOUNS.items():
            data = PluralData(prompt=f"What is the plural of '{noun}'?", answer=plural,
                              system_prompt="Reply with the plural only, one word.")
            yield PluralTask(data, self.config.task)


__all__ = ["PluralTaskset"]
