"""The shell_* feature of the agent: stateful shell sessions whose runs are polled like jobs."""

__all__: list[str] = []
