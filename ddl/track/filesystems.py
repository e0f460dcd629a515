"""Which filesystem holds DDL_HOME, and the warning a SLURM sweep gets when its SQLite store is on a network one.

SQLite's locking is not to be trusted on NFS, Lustre, GPFS or CIFS when the cluster's jobs write at once
(MLflow's documentation, too, wants a database server for many writers): there, a lab runs one tracking
server (PostgreSQL, `mlflow server --serve-artifacts`; `scripts/mlflow-team` tries it on one machine) and
every home sets MLFLOW_TRACKING_URI. The type is the kernel's, from /proc/self/mountinfo (proc(5)): that of
the deepest mount containing the path.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import NamedTuple

from .. import paths

MOUNTINFO = Path("/proc/self/mountinfo")
# Network and cluster filesystems, as mountinfo names them (NFS 3 and 4, SMB under both names, FUSE's GlusterFS).
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph",
                                 "glusterfs", "fuse.glusterfs"})
OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")       # mountinfo writes a space in a path as \040, a backslash as \134


class Mount(NamedTuple):
    point: str       # where it is mounted
    fstype: str      # the filesystem's type: ext4, nfs4, lustre, ...


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts a mountinfo text lists, in its order: the mount point is the fifth field, the type the first
    one after the optional fields' ` - ` separator."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 10 or "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        point = OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
        mounts.append(Mount(point, fields[separator + 1]))
    return mounts


def filesystem_type(path: Path, mountinfo: str) -> str | None:
    """The type of the deepest mount containing `path` (symbolic links resolved; of mounts stacked on one
    point, the last, which hides the others); None when no mount contains it."""
    target = os.path.realpath(path)
    found = None
    for mount in parse_mountinfo(mountinfo):
        prefix = mount.point.rstrip("/") + "/"
        if (target == mount.point or target.startswith(prefix)) and (found is None or
                                                                      len(mount.point) >= len(found.point)):
            found = mount
    return found.fstype if found else None


def sqlite_on_network_warning(launcher: str, mountinfo: str) -> str | None:
    """One line for a SLURM sweep whose store is the project's SQLite file on a network filesystem, else None."""
    if launcher != "slurm" or paths.tracking_uri() != paths.project_store_uri():
        return None
    fstype = filesystem_type(paths.home(), mountinfo)
    if fstype not in NETWORK_FILESYSTEMS:
        return None
    return (f"ddl-run: warning: DDL_HOME={paths.home()} is on {fstype}, where SQLite's locking fails under many "
            f"writers; for SLURM jobs, run a tracking server (PostgreSQL + mlflow server --serve-artifacts; "
            f"scripts/mlflow-team to try one) and set MLFLOW_TRACKING_URI in every home")


def warn_if_sqlite_on_network(launcher: str) -> None:
    """Print sqlite_on_network_warning's line, for this machine's mounts, to stderr."""
    try:
        mountinfo = MOUNTINFO.read_text()
    except OSError:              # no /proc (not Linux): nothing to tell
        return
    warning = sqlite_on_network_warning(launcher, mountinfo)
    if warning:
        print(warning, file=sys.stderr, flush=True)
