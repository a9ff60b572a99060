"""A verifiers taskset for tests/interaction/test_verifiers_episode.py: repeat a word (importable by id ``vf_echo``)."""

import verifiers.v1 as vf

WORDS = ["ab", "cd", "ef", "gh"]


class EchoData(vf.TaskData):
    answer: str = ""


class EchoTask(vf.Task[EchoData, vf.State]):
    @vf.reward(weight=0.5)
    async def contains(self, task: EchoData, trace: vf.Trace) -> float:
        return float(task.answer in (trace.last_reply or ""))

    @vf.reward
    async def replied(self, task: EchoData, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


class EchoTaskset(vf.Taskset[EchoTask]):
    def load(self):
        for w in WORDS:
            yield EchoTask(
                EchoData(prompt=f"repeat {w}", answer=w, system_prompt="Be brief."), self.config.task
            )


__all__ = ["EchoTaskset"]
