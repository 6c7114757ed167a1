"""The port_* feature of the agent: TCP connections inside the sandbox, tunnelled to the host."""

__all__: list[str] = []
