"""The names of the JSON-RPC methods the agent serves, and the protocol's version.

Standard library only (no wire models): the agent's command line checks a running server's
version with these before it relays a channel, and must stay light (see ``protocol/__init__``).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["PROTOCOL_VERSION", "Method"]

PROTOCOL_VERSION = 10
"""Bumped on any incompatible change; the host refuses an agent with another version.

3: ``exec_remote_list`` and ``file_list`` answer in pages (``after`` / ``next``).
4: jobs outlive the agent: job ids stay valid across agents, ``JobInfo.leftovers``,
``StartParams.output_cap``, ``ServerInfo.keeper_pid``, ``server_handover``, ``exec_remote_read``
(a log at any offset, or its tail), ``exec_remote_forget``, ``exec_remote_prune``.
5: PTY jobs: ``StartParams.tty``/``tty_size``, ``JobInfo.tty``/``tty_size``, ``exec_remote_resize``
(a v4 agent refuses a start that names ``tty`` at all).
6: ``PollParams.hits``: a poll answers as soon as the job has more watch-rule hits than the
caller has seen (a v5 agent refuses a poll that names it).
7: ``JobInfo.last_output_at`` (a v6 host refuses a listing that carries it, so it is a version).
8: ``StartParams.job_id`` (the client chooses the id), ``PollResult.stdout_truncated`` /
``stderr_truncated`` (bytes lost to a job truncating its own log); every job id on the wire is
of the safe form of ``protocol/names.py``.
9: ``WriteStdinParams.writer`` (a terminal's typists, each with a cursor of its own bytes).
10: ``exec_remote_follow`` and its ``exec_remote_push`` notifications (pushed streams); the job
state ``lost`` (an end whose exit status nothing could record)."""


class Method(StrEnum):
    """Names of the JSON-RPC methods the agent serves."""

    EXEC_REMOTE_START = "exec_remote_start"
    EXEC_REMOTE_POLL = "exec_remote_poll"
    EXEC_REMOTE_FOLLOW = "exec_remote_follow"
    EXEC_REMOTE_WRITE_STDIN = "exec_remote_write_stdin"
    EXEC_REMOTE_SIGNAL = "exec_remote_signal"
    EXEC_REMOTE_KILL = "exec_remote_kill"
    EXEC_REMOTE_LIST = "exec_remote_list"
    EXEC_REMOTE_RELEASE = "exec_remote_release"
    EXEC_REMOTE_READ = "exec_remote_read"
    EXEC_REMOTE_FORGET = "exec_remote_forget"
    EXEC_REMOTE_PRUNE = "exec_remote_prune"
    EXEC_REMOTE_RESIZE = "exec_remote_resize"
    SERVER_INFO = "server_info"
    SERVER_HANDOVER = "server_handover"
    SHELL_OPEN = "shell_open"
    SHELL_RUN = "shell_run"
    SHELL_LIST = "shell_list"
    SHELL_CLOSE = "shell_close"
    SHELL_INTERRUPT = "shell_interrupt"
    FILE_STAT = "file_stat"
    FILE_READ = "file_read"
    FILE_LIST = "file_list"
    FILE_REMOVE = "file_remove"
    FILE_MKDIR = "file_mkdir"
    FILE_WRITE = "file_write"
    FILE_WRITE_OPEN = "file_write_open"
    FILE_WRITE_CHUNK = "file_write_chunk"
    FILE_WRITE_COMMIT = "file_write_commit"
    FILE_WRITE_ABORT = "file_write_abort"
    FILE_HASH = "file_hash"
    PORT_CONNECT = "port_connect"
    PORT_SEND = "port_send"
    PORT_RECV = "port_recv"
    PORT_CLOSE = "port_close"
    PORT_LIST = "port_list"
    PING = "ping"
    JOB_STATS = "job_stats"
    SANDBOX_STATS = "sandbox_stats"
    JOB_STATS_MANY = "job_stats_many"
