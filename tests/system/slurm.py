"""A single-node SLURM for the tests: munged, slurmctld and slurmd of this machine, in a folder.

Debian's ``slurm-wlm`` and ``munge`` (``apt-get install slurm-wlm munge``), configured for a
test machine: no cgroups (``proctrack/linuxproc``, ``task/none``), no accounting, one node
(this machine, at 127.0.0.1) that offers 8 CPUs whatever it has (``config_overrides``), so that
a job of several tasks runs on a 2-core machine; the daemons run as root on free ports, with
every file under one folder. Clients find it through ``SLURM_CONF`` (:attr:`Slurm.env`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

#: The programs a single-node SLURM needs.
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")

NODE = "dkmeansnode"
CPUS = 8


def unavailable() -> str | None:
    """Why no SLURM can be started here (None: it can)."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if missing:
        return (
            f"SLURM is not installed (missing {', '.join(missing)}): apt-get install slurm-wlm munge "
            "to run the SLURM tests"
        )
    if os.geteuid() != 0:
        return "the single-node SLURM of the tests runs its daemons as root, and this is not root"
    return None


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _memory_mib() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024 * 9 // 10
    return 4096


class Slurm:
    """A running single-node SLURM (see the module); :meth:`stop` ends it."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.conf = self.folder / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.processes: list[subprocess.Popen] = []

    # -- starting --------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> Slurm:
        for sub in ("state", "spool", "munge"):
            (self.folder / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        self._start_munge()
        self._write_conf()
        self.processes.append(
            self._daemon([_program("slurmctld"), "-D", "-c", "-f", str(self.conf)], "slurmctld")
        )
        self.processes.append(
            self._daemon([_program("slurmd"), "-D", "-N", NODE, "-f", str(self.conf)], "slurmd")
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-n", NODE, "-o", "%T", check=False).stdout.strip()
            if state.startswith("idle"):
                return self
            for p in self.processes:
                if p.poll() is not None:
                    raise RuntimeError(
                        f"a SLURM daemon exited ({p.args[0]}: {p.returncode}):\n{self.logs()}"
                    )
            time.sleep(0.5)
        raise RuntimeError(
            f"SLURM's node is not idle after {timeout:.0f} s (state {state!r}):\n{self.logs()}"
        )

    def _start_munge(self) -> None:
        key = self.folder / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        self.munge_socket = self.folder / "munge" / "munge.socket"
        self.processes.append(
            self._daemon(
                [
                    _program("munged"),
                    "--foreground",
                    "--force",
                    f"--key-file={key}",
                    f"--socket={self.munge_socket}",
                    f"--pid-file={self.folder / 'munge' / 'munged.pid'}",
                    f"--log-file={self.folder / 'munge.log'}",
                    f"--seed-file={self.folder / 'munge' / 'munged.seed'}",
                ],
                "munged",
            )
        )
        deadline = time.monotonic() + 20
        while not self.munge_socket.exists():
            if time.monotonic() > deadline or self.processes[-1].poll() is not None:
                raise RuntimeError(f"munged did not start:\n{self.logs()}")
            time.sleep(0.1)

    def _write_conf(self) -> None:
        ctld_port, slurmd_port = _free_ports(2)
        host = socket.gethostname()
        f = self.folder
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=dkmeanstest",
                    f"SlurmctldHost={host}(127.0.0.1)",
                    f"SlurmctldPort={ctld_port}",
                    f"SlurmdPort={slurmd_port}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={f / 'state'}",
                    f"SlurmdSpoolDir={f / 'spool'}",
                    f"SlurmctldPidFile={f / 'slurmctld.pid'}",
                    f"SlurmdPidFile={f / 'slurmd.pid'}",
                    f"SlurmctldLogFile={f / 'slurmctld.log'}",
                    f"SlurmdLogFile={f / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "SchedulerType=sched/backfill",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SlurmdParameters=config_overrides",
                    "KillWait=30",
                    "MinJobAge=600",
                    f"PlugStackConfig={f / 'plugstack.conf'}",
                    f"NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory={_memory_mib()} "
                    "State=UNKNOWN",
                    "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
                    "",
                ]
            )
        )
        (f / "plugstack.conf").write_text("")

    def _daemon(self, cmd: list, name: str) -> subprocess.Popen:
        out = open(self.folder / f"{name}.out", "w")
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    # -- using -----------------------------------------------------------------------
    def run(
        self, *cmd, check: bool = True, timeout: float = 60.0, **kwargs
    ) -> subprocess.CompletedProcess:
        """A SLURM client command (sbatch, squeue, ...) against this SLURM."""
        res = subprocess.run(
            list(cmd),
            capture_output=True,
            text=True,
            env=kwargs.pop("env", self.env),
            timeout=timeout,
            **kwargs,
        )
        if check and res.returncode != 0:
            raise RuntimeError(
                f"{' '.join(map(str, cmd))} failed ({res.returncode}): {res.stderr.strip()}"
            )
        return res

    def sbatch(self, *args, cwd=None, env=None) -> str:
        """Submit a job; its id."""
        out = self.run(
            "sbatch", "--parsable", *map(str, args), cwd=cwd, env=env or self.env
        ).stdout.strip()
        return out.split(";")[0]

    def job_state(self, job_id: str) -> str:
        """PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, ... ("" once forgotten)."""
        return self.run(
            "squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", check=False
        ).stdout.strip()

    def wait(self, job_id: str, timeout: float = 300.0, poll: float = 0.5) -> str:
        """Wait until the job has ended; its final state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state and state not in (
                "PENDING",
                "CONFIGURING",
                "RUNNING",
                "COMPLETING",
                "SUSPENDED",
            ):
                return state
            time.sleep(poll)
        raise TimeoutError(f"job {job_id} still {state} after {timeout:.0f} s")

    def logs(self) -> str:
        parts = []
        for name in (
            "slurmctld.log",
            "slurmd.log",
            "munge.log",
            "slurmctld.out",
            "slurmd.out",
            "munged.out",
        ):
            path = self.folder / name
            if path.exists():
                parts.append(
                    f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-20:])
                )
        return "\n".join(parts)

    # -- stopping --------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel every job and stop the daemons (slurmd, slurmctld, munged)."""
        try:
            self.run("scancel", "--full", "-u", "root", check=False, timeout=20)
        except (OSError, subprocess.SubprocessError):
            pass
        for p in reversed(self.processes):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.processes):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
