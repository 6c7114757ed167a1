"""The exec_remote_* feature of the agent: jobs, their controller and methods."""

__all__: list[str] = []
