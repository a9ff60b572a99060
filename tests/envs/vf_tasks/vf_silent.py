"""A verifiers taskset whose stop hook ends every run before its first model call."""

import verifiers.v1 as vf


class SilentTask(vf.Task[vf.TaskData, vf.State]):
    @vf.stop
    async def at_once(self, request: vf.Request) -> bool:
        return True

    @vf.reward
    async def anything(self, task: vf.TaskData, trace: vf.Trace) -> float:
        return 1.0


class SilentTaskset(vf.Taskset[SilentTask]):
    def load(self):
        yield SilentTask(vf.TaskData(prompt="repeat ab"), self.config.task)


__all__ = ["SilentTaskset"]
