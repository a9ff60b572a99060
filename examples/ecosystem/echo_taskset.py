"""A tiny verifiers (v1) taskset for examples/ecosystem/verifiers_echo.toml: repeat a word.

verifiers imports a taskset by its id as a module; run from this folder's parent with
PYTHONPATH=examples/ecosystem so ``taskset = "echo_taskset"`` imports this file.
"""

import verifiers.v1 as vf

WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "piano", "lemon"]


class EchoData(vf.TaskData):
    answer: str = ""


class EchoTask(vf.Task[EchoData, vf.State]):
    @vf.reward
    async def exact(self, task: EchoData, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)


class EchoTaskset(vf.Taskset[EchoTask]):
    def load(self):
        for word in WORDS * 4:
            data = EchoData(prompt=f"Repeat: {word}", answer=word, system_prompt="Reply with the word only.")
            yield EchoTask(data, self.config.task)


__all__ = ["EchoTaskset"]
