"""What a tool demands of the ACL (spec transport-and-config §4.4), as its declaration states it.

A tool's :class:`~cpersona.mcp.registry.ToolSpec` holds an :class:`Access`, or
none, in which case :func:`access_for` derives it from the annotations. The
functions that turn arguments into demands live in :mod:`cpersona.mcp.acl`
and are named here by reference: the ACL code loads only when a policy is
(a stdio start without an ACL file never imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpersona.mcp.registry import Ref


def _acl(name: str) -> Ref:
    return Ref("cpersona.mcp.acl", name)


@dataclass(frozen=True)
class Access:
    """A tool's ACL demand.

    ``demands``: ``fn(arguments, settings) -> list[Demand]``. ``reads_files``:
    the demands depend on a file's contents, so they are worked out off the
    event loop. ``fills_agent``: an omitted ``agent_id`` becomes the one agent
    the client may write to (ACL-17/18). ``says_rejected``: a denial also says
    the write was not made (``result: "rejected"``, and ``locked: false`` when
    a lock was asked for; ACL-15).
    """

    demands: Ref
    reads_files: bool = False
    fills_agent: bool = False
    says_rejected: bool = False


ANY_PRINCIPAL = Access(_acl("any_principal"))
READ_AGENT = Access(_acl("read_agent"))
WRITE_AGENT = Access(_acl("write_agent"))
PAUSE_BUCKET = Access(_acl("pause_bucket"))
RESUME_BUCKET = Access(_acl("resume_bucket"))
FINDINGS = Access(_acl("findings_demands"))
UPDATE_CHECK = Access(_acl("update_check_demands"))
HEALTH = Access(_acl("health_demands"))
DEEP_CHECK = Access(_acl("deep_check_demands"))
MERGE = Access(_acl("merge_demands"))
EXPORT = Access(_acl("export_demands"), reads_files=True)
IMPORT = Access(_acl("import_demands"), reads_files=True)


def access_for(spec: Any) -> Access:
    """The tool's declared demand, else the one its annotations imply.

    A read-only tool reads the agent it names; any other tool writes it. An
    argument that does not name one agent demands every agent (ACL-13), so a
    tool that declares nothing is never let through more widely than it writes.
    """
    if spec.access is not None:
        return spec.access
    return READ_AGENT if spec.annotations.read_only is True else WRITE_AGENT
