"""Who a process belongs to, from procfs: its cgroup (pod, container, Slurm job) and a few
``SLURM_JOB_*`` variables of its environment.

Every reader takes ``root`` (the host's ``/``; tests pass a checked-in tree). The cgroup file is
world-readable; ``environ`` is readable only by the process's owner (or root), so a permission
error there is expected for an unprivileged agent: it is logged once and the environment is
then simply not used.

Recognized ``/proc/<pid>/cgroup`` paths (cgroup v1 lines ``N:controllers:/path``, v2 ``0::/path``;
a path relative to a cgroup namespace, ``/../..``, works too):

- Kubernetes, cgroupfs driver: ``/kubepods/burstable/pod<uid>/<container id>``;
- Kubernetes, systemd driver: ``/kubepods.slice/kubepods-burstable.slice/``
  ``kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`` (also ``crio-``,
  ``docker-``);
- Slurm, cgroup v1: ``/slurm/uid_<uid>/job_<id>/step_<step>/task_<n>`` (``slurm_<node>`` with
  several slurmd);
- Slurm, cgroup v2: ``/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

__all__ = [
    "ENVIRON_KEYS",
    "CgroupInfo",
    "ProcReader",
    "ProcessCache",
    "ProcessInfo",
    "cgroup_version",
    "parse_cgroup",
]

_log = logging.getLogger(__name__)

#: The only environment variables read from other processes.
ENVIRON_KEYS = (
    "SLURM_JOB_ID",
    "SLURM_JOB_USER",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_NAME",
    "SLURM_JOB_UID",
)
_ENVIRON_LIMIT = 1 << 20

_POD = re.compile(
    r"pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
    r"(?:\.slice)?(?:/|$)"
)
_CONTAINER = re.compile(r"(?:^|[/-])(?P<id>[0-9a-f]{64})(?:\.scope)?$")
_SLURM = re.compile(
    r"(?:^|/)(?:slurm[^/]*|[^/]*slurmstepd\.scope)/(?:uid_(?P<uid>\d+)/)?job_(?P<job>\d+)"
    r"(?:/step_(?P<step>[^/]+))?"
)


@dataclass(frozen=True, slots=True)
class CgroupInfo:
    """What a process's cgroup path says about it (``None``: not known).

    ``pod_uid`` is the Kubernetes pod UID with dashes, ``container_id`` the 64-hex runtime id;
    ``slurm_job_id``, ``slurm_step`` and ``slurm_uid`` come from a Slurm job cgroup.
    ``version`` is 1 when the file has cgroup v1 lines (hybrid included), 2 when it has only
    the unified ``0::`` line, 0 when it is empty.
    """

    pod_uid: str | None = None
    container_id: str | None = None
    slurm_job_id: str | None = None
    slurm_step: str | None = None
    slurm_uid: int | None = None
    version: int = 0


def parse_cgroup(text: str) -> CgroupInfo:
    """Parse the content of ``/proc/<pid>/cgroup`` (v1, v2 or hybrid)."""
    pod = container = job = step = None
    uid: int | None = None
    v1 = v2 = False
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = True
        else:
            v1 = True
        if pod is None:
            m = _POD.search(path)
            if m:
                pod = m.group("uid").replace("_", "-")
                c = _CONTAINER.search(path)
                container = c.group("id") if c else None
        if job is None:
            s = _SLURM.search(path)
            if s:
                job, step = s.group("job"), s.group("step")
                uid = int(s.group("uid")) if s.group("uid") else None
    return CgroupInfo(pod, container, job, step, uid, 1 if v1 else 2 if v2 else 0)


def cgroup_version(root: Path = Path("/")) -> int | None:
    """2 for a unified (v2) cgroup tree at ``<root>/sys/fs/cgroup``, 1 for v1, else ``None``."""
    base = root / "sys" / "fs" / "cgroup"
    if (base / "cgroup.controllers").is_file():
        return 2
    try:
        return 1 if any(p.is_dir() for p in base.iterdir()) else None
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One process, as procfs describes it: its cgroup, real uid and ``SLURM_JOB_*`` variables."""

    pid: int
    cgroup: CgroupInfo = CgroupInfo()
    uid: int | None = None
    environ: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "environ", MappingProxyType(dict(self.environ)))


class ProcReader:
    """Reads ``<root>/proc/<pid>/{cgroup,status,environ}``.

    ``read_environ=False`` never opens ``environ``. Permission errors are logged once per
    file kind (at WARNING for ``cgroup``, which should always be readable, at INFO for
    ``environ``, which is private to the process's owner).
    """

    def __init__(self, root: Path = Path("/"), *, read_environ: bool = True) -> None:
        self.root = root
        self.read_environ = read_environ
        self._denied: set[str] = set()

    def process(self, pid: int) -> ProcessInfo | None:
        """The process ``pid``; ``None`` when it does not exist (or no longer does)."""
        base = self.root / "proc" / str(pid)
        cgroup_text = self._read(base / "cgroup", "cgroup")
        if cgroup_text is None:
            return None if not base.exists() else ProcessInfo(pid)
        uid = None
        status = self._read(base / "status", "status")
        for line in (status or "").splitlines():
            if line.startswith("Uid:"):
                fields = line.split()
                if len(fields) > 1 and fields[1].isdecimal():
                    uid = int(fields[1])
                break
        environ: dict[str, str] = {}
        if self.read_environ:
            environ = self._environ(base / "environ")
        return ProcessInfo(pid, parse_cgroup(cgroup_text), uid, environ)

    def _environ(self, path: Path) -> dict[str, str]:
        try:
            with path.open("rb") as f:
                data = f.read(_ENVIRON_LIMIT)
        except PermissionError:
            self._once("environ", logging.INFO)
            return {}
        except OSError:
            return {}
        out: dict[str, str] = {}
        for item in data.split(b"\0"):
            key, sep, value = item.partition(b"=")
            name = key.decode("ascii", "replace")
            if sep and name in ENVIRON_KEYS:
                out[name] = value.decode("utf-8", "replace")
        return out

    def _read(self, path: Path, kind: str) -> str | None:
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except PermissionError:
            self._once(kind, logging.WARNING)
            return None
        except OSError:
            return None

    def _once(self, kind: str, level: int) -> None:
        if kind not in self._denied:
            self._denied.add(kind)
            _log.log(
                level,
                "attribution: no permission to read /proc/<pid>/%s under %s; processes are "
                "attributed without it",
                kind,
                self.root,
            )


class ProcessCache:
    """Caches :class:`ProcessInfo` by pid for the processes still on a device.

    A pid's cgroup and job do not change while it lives; :meth:`prune` forgets the pids that
    left the devices, so a reused pid is read again.
    """

    def __init__(self, reader: ProcReader) -> None:
        self.reader = reader
        self._cache: dict[int, ProcessInfo | None] = {}

    def get(self, pid: int) -> ProcessInfo | None:
        """The process ``pid`` (read on first use)."""
        if pid not in self._cache:
            self._cache[pid] = self.reader.process(pid)
        return self._cache[pid]

    def prune(self, live: Iterable[int]) -> None:
        """Forget every pid not in ``live``."""
        keep = set(live)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]
