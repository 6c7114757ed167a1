"""``exec_remote_follow``: a job's output pushed on the caller's connection as it arrives.

The protocol is in :mod:`remote_exec.protocol.follow`; the reading, the waiting and the sharing
of one read between followers are the job's (:meth:`JobOutput.follow`). Here: the call's
connection and id, and the head each push starts with.
"""

from __future__ import annotations

import json

from ...errors import InvalidParamsError, InvalidRequestError
from ...protocol import PUSH, FollowParams, FollowResult
from ..rpc import CURRENT_REQUEST_ID, Handler
from ..stream import CURRENT_SEND
from .controller import JobController

__all__ = ["follow_method"]


def follow_method(ctl: JobController) -> Handler:
    """The ``exec_remote_follow`` handler for the jobs of ``ctl``."""

    async def follow(p: FollowParams) -> FollowResult:
        send, call = CURRENT_SEND.get(), CURRENT_REQUEST_ID.get()
        if send is None or type(call) is not int or call < 0:
            raise InvalidRequestError(
                "exec_remote_follow pushes on the frame stream (a stdio channel or the stream socket), "
                "as a request with a non-negative integer id and not in a batch; elsewhere, poll"
            )
        job = await ctl.held(p.job_id)
        head = b'{"jsonrpc":"2.0","method":"%s","params":{"call":%d,"job_id":%s,' % (
            PUSH.encode(),
            call,
            json.dumps(p.job_id).encode(),
        )
        try:
            return await job.follow(p, send, head)
        except ValueError as exc:  # a cursor past the end of a stream
            raise InvalidParamsError(str(exc), data={"job_id": p.job_id}) from None
        except ConnectionError:
            return FollowResult(pushes=0, ended=False)  # the caller is gone: nobody reads this answer

    return follow
