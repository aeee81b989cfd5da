"""Slurm: which job holds a device, and who runs it.

Three sources, merged per job id:

- the processes on a device: their cgroup names the job (``.../job_<id>/step_<step>/...``,
  see :mod:`otel_gpu.attribution.procfs`), their environment (where readable) adds
  ``SLURM_JOB_USER``, ``SLURM_JOB_PARTITION`` and ``SLURM_JOB_NAME``;
- a prolog-written mapping directory in dcgm-exporter's ``--hpc-job-mapping-dir`` layout:
  one file per GPU named by its index (``0``, ``1``...; we also accept a GPU or MIG UUID as
  the name, as Princeton's jobstats does), each line holding a job id (optionally followed by
  the user's uid, jobstats' ``<jobid> <uid>``);
- the Slurm cgroup tree under ``<root>/sys/fs/cgroup`` (v1 ``<controller>/slurm*/uid_<uid>/
  job_<id>``, v2 ``system.slice/slurmstepd.scope/job_<id>``): the jobs alive on the node and,
  on v1, their uid. When that tree exists, a mapping file that names a job no longer alive
  (an epilog that did not run) is ignored.
"""

from __future__ import annotations

import logging
import pwd
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from otel_gpu.attribution.devices import DeviceMatcher
from otel_gpu.attribution.procfs import ProcessInfo

__all__ = [
    "JobInfo",
    "JobMap",
    "job_of_process",
    "live_jobs",
    "merge_jobs",
    "read_job_map",
    "user_name",
]

_log = logging.getLogger(__name__)
_JOB_ID = re.compile(r"^\d+(?:_\d+)?$")
_MAX_MAP_FILES = 4096
_MAX_MAP_LINES = 64


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A Slurm job; every field but ``id`` may be unknown (``None``)."""

    id: str
    user: str | None = None
    partition: str | None = None
    name: str | None = None
    uid: int | None = None

    def merged(self, other: JobInfo) -> JobInfo:
        """This job, with the fields it lacks taken from ``other``."""
        return replace(
            self,
            user=self.user or other.user,
            partition=self.partition or other.partition,
            name=self.name or other.name,
            uid=self.uid if self.uid is not None else other.uid,
        )

    def attributes(self) -> dict[str, str]:
        """``slurm.job.id`` and whichever of ``slurm.job.user``/``.partition``/``.name`` is known."""
        attrs = {"slurm.job.id": self.id}
        if self.user:
            attrs["slurm.job.user"] = self.user
        if self.partition:
            attrs["slurm.job.partition"] = self.partition
        if self.name:
            attrs["slurm.job.name"] = self.name
        return attrs


def user_name(uid: int) -> str | None:
    """The login name of ``uid`` (NSS: local files, LDAP, SSSD...), else ``None``."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def job_of_process(
    info: ProcessInfo, users: Callable[[int], str | None] = user_name
) -> JobInfo | None:
    """The job of a process: its cgroup first, its environment as the fallback and the source
    of the user, partition and name."""
    env = info.environ
    job_id = info.cgroup.slurm_job_id or env.get("SLURM_JOB_ID")
    if not job_id or not _JOB_ID.match(job_id):
        return None
    uid = info.cgroup.slurm_uid
    if uid is None and env.get("SLURM_JOB_UID", "").isdecimal():
        uid = int(env["SLURM_JOB_UID"])
    if uid is None and info.cgroup.slurm_job_id:  # a job step runs as the job's user
        uid = info.uid
    user = env.get("SLURM_JOB_USER") or (users(uid) if uid is not None else None)
    return JobInfo(
        job_id,
        user=user,
        partition=env.get("SLURM_JOB_PARTITION") or None,
        name=env.get("SLURM_JOB_NAME") or None,
        uid=uid,
    )


def read_job_map(directory: Path) -> dict[str, tuple[JobInfo, ...]]:
    """Read a mapping directory: ``{file name: jobs}`` (file name = GPU index or UUID).

    Raises ``OSError`` when the directory cannot be listed; unreadable files are skipped.
    """
    out: dict[str, tuple[JobInfo, ...]] = {}
    for count, entry in enumerate(sorted(directory.iterdir())):
        if count >= _MAX_MAP_FILES:
            break
        name = entry.name
        if not (name.isdecimal() or name.startswith(("GPU-", "MIG-"))):
            continue
        try:
            if not entry.is_file():
                continue
            lines = entry.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        jobs: list[JobInfo] = []
        for line in lines[:_MAX_MAP_LINES]:
            fields = line.split()
            if not fields or not _JOB_ID.match(fields[0]):
                continue
            uid = int(fields[1]) if len(fields) > 1 and fields[1].isdecimal() else None
            jobs.append(JobInfo(fields[0], uid=uid))
        if jobs:
            out[name] = tuple(jobs)
    return out


def live_jobs(root: Path = Path("/")) -> dict[str, int | None] | None:
    """The Slurm jobs with a cgroup under ``<root>/sys/fs/cgroup``: ``{job id: uid or None}``.

    ``None`` when there is no Slurm cgroup tree (not a Slurm node, or not visible from here).
    """
    base = root / "sys" / "fs" / "cgroup"
    found: dict[str, int | None] = {}
    seen_tree = False
    try:
        v2 = base / "system.slice" / "slurmstepd.scope"
        if v2.is_dir():
            seen_tree = True
            for job in v2.glob("job_*"):
                found.setdefault(job.name[4:], None)
        for slurm in base.glob("*/slurm*"):
            if not slurm.is_dir():
                continue
            seen_tree = True
            for job in slurm.glob("uid_*/job_*"):
                uid = job.parent.name[4:]
                found[job.name[4:]] = int(uid) if uid.isdecimal() else None
    except OSError:
        return None
    return found if seen_tree else None


class JobMap:
    """The mapping directory and the cgroup tree, read by :meth:`refresh` (off the hot path),
    as ``{device id: jobs}``.

    A missing directory is logged once at WARNING (the prolog may not have run yet: it is
    read again on every refresh).
    """

    def __init__(
        self,
        directory: Path | None,
        root: Path = Path("/"),
        users: Callable[[int], str | None] = user_name,
    ) -> None:
        self.directory = directory
        self.root = root
        self._users = users
        self._files: dict[str, tuple[JobInfo, ...]] = {}
        self._warned = False

    def refresh(self) -> None:
        """Read the mapping directory and the Slurm cgroup tree again."""
        live = live_jobs(self.root)
        if self.directory is None:
            self._files = {}
            return
        try:
            files = read_job_map(self.directory)
        except OSError as err:
            if not self._warned:
                self._warned = True
                _log.warning(
                    "attribution: cannot read the Slurm job mapping directory %s (%s); "
                    "jobs are found from their processes only",
                    self.directory,
                    err.strerror or err,
                )
            self._files = {}
            return
        if self._warned:
            _log.info("attribution: Slurm job mapping directory %s is readable", self.directory)
            self._warned = False
        resolved: dict[str, tuple[JobInfo, ...]] = {}
        for name, jobs in files.items():
            kept = tuple(self._with_user(j, live) for j in jobs if live is None or j.id in live)
            if kept:
                resolved[name] = kept
        self._files = resolved

    def jobs(self, matcher: DeviceMatcher) -> dict[str, tuple[JobInfo, ...]]:
        """``{device id: jobs}`` as of the last refresh (jobs no longer alive left out)."""
        out: dict[str, tuple[JobInfo, ...]] = {}
        for name, jobs in self._files.items():
            if name.isdecimal():
                device = matcher.physical(int(name))
            else:
                device = next(iter(matcher.match(name)), None)
            if device is not None:
                out[device] = out.get(device, ()) + jobs
        return out

    def _with_user(self, job: JobInfo, live: Mapping[str, int | None] | None) -> JobInfo:
        uid = job.uid
        if uid is None and live is not None:
            uid = live.get(job.id)
        if uid is None:
            return job
        return replace(job, uid=uid, user=job.user or self._users(uid))


def merge_jobs(jobs: Iterable[JobInfo]) -> dict[str, JobInfo]:
    """Jobs by id, the fields each source knows merged."""
    out: dict[str, JobInfo] = {}
    for job in jobs:
        out[job.id] = out[job.id].merged(job) if job.id in out else job
    return out
