"""The file_* feature of the agent: files and directories, confined to an optional workspace root."""

__all__: list[str] = []
