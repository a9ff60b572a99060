"""A verifiers taskset whose reward raises (the episode must fail, named, and never train)."""

import verifiers.v1 as vf


class BrokenTask(vf.Task[vf.TaskData, vf.State]):
    @vf.reward
    async def broken(self, task: vf.TaskData, trace: vf.Trace) -> float:
        raise ZeroDivisionError("boom")


class BrokenTaskset(vf.Taskset[BrokenTask]):
    def load(self):
        yield BrokenTask(vf.TaskData(prompt="repeat ab"), self.config.task)


__all__ = ["BrokenTaskset"]
