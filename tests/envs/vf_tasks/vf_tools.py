"""A verifiers taskset whose task offers a tool (an MCP toolset served by verifiers in a subprocess).

``python -m vf_tools`` is how verifiers starts the tool server, hence the ``__main__`` block.
"""

import verifiers.v1 as vf


class AddTools(vf.Toolset[vf.ToolsetConfig]):
    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class SumData(vf.TaskData):
    answer: str = ""


class SumTask(vf.Task[SumData, vf.State]):
    @classmethod
    def toolsets(cls, config):
        return [AddTools(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        return float(task.answer in (trace.last_reply or ""))


class SumTaskset(vf.Taskset[SumTask]):
    def load(self):
        yield SumTask(SumData(prompt="What is 2+3? Use the add tool.", answer="5"), self.config.task)


__all__ = ["SumTaskset"]

if __name__ == "__main__":
    AddTools.run()
