"""The local SageMaker process: moto (control plane, S3, ECR, IAM, STS, ...), a real OCI registry
behind the local ECR, and the runtime, on loopback.

Run by ``lmforge local up`` as ``python -m lmforge.local.server --state-dir DIR``; it writes
``DIR/state.json`` (pid, URLs, how instances run) once every server accepts connections, and on
SIGTERM/SIGINT stops every endpoint's container, the registry, then itself.

``--mode`` says how endpoint instances run (:mod:`lmforge.local.runners`): ``image`` (the Model's
image, with podman or docker), ``process`` (lmforge's server as a host process), or ``auto``
(``image`` when an engine answers, else ``process``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmforge.local import ACCOUNT_ID, autoscaling_ext, iam_ext, moto_ext
from lmforge.local.autoscaler import DEFAULT_PERIOD_S, ENV_PERIOD, Autoscaler, period_from_env
from lmforge.local.provisioner import Provisioner
from lmforge.local.registry.process import port_problem
from lmforge.local.runners import MODES, InstanceRunner
from lmforge.local.runtime import RuntimeServer

log = logging.getLogger("lmforge.local")

STATE_FILE = "state.json"


@dataclass
class LocalSageMaker:
    """Both servers in this process. ``start()`` returns once they accept connections."""

    state_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    runtime_port: int = 0
    invocation_timeout_s: float = 60.0
    stream_timeout_s: float = 600.0
    mode: str = "auto"
    engine: str | None = None
    metrics_period_s: float = DEFAULT_PERIOD_S
    """How often the runtime's metrics are published and scaling policies evaluated (seconds)."""

    def start(self) -> None:
        from moto.moto_server.threaded_moto_server import ThreadedMotoServer

        from lmforge.container.engine import available, detect
        from lmforge.local import ecr
        from lmforge.local.registry import LocalRegistry, RegistryError

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.registry: LocalRegistry | None = LocalRegistry(self.state_dir, self.host)
        problem = None
        try:
            self.registry.start()
        except RegistryError as exc:
            log.warning("the local ECR has no registry (pushes and image pulls will fail): %s", exc)
            self.registry, problem = None, str(exc)
        ecr.install(self.registry, unavailable_reason=problem)
        self._moto = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self._moto.start()
        if self.registry is not None and (restored := ecr.restore_repositories(self.registry)):
            log.info("local ECR: %d repositories of an earlier run restored", restored)
        host, port = self._moto.get_host_and_port()
        self.control_url = f"http://{host}:{port}"
        iam_ext.install()  # SimulatePrincipalPolicy, which the SageMaker SDK v3 validates roles with
        self.role_arn = iam_ext.ensure_execution_role(ACCOUNT_ID)
        engine = available(self.engine)
        if engine is None and self.mode == "image":
            detect(self.engine)  # raises with what is missing
        self.runner = InstanceRunner(
            self.mode, engine, state_dir=self.state_dir, account=ACCOUNT_ID, registry=self.registry
        )
        log.info("endpoint instances run in %s mode: %s", self.runner.mode, self.runner.describe())
        self.provisioner = Provisioner(self.state_dir, self.control_url, runner=self.runner)
        self.provisioner.start()
        moto_ext.install(self.provisioner)
        autoscaling_ext.install()  # sagemaker:inference-component:DesiredCopyCount, DescribeScalingActivities
        self.autoscaler = Autoscaler(self.provisioner, self.control_url, self.metrics_period_s)
        self.autoscaler.start()
        self._runtime = RuntimeServer(
            (self.host, self.runtime_port),
            self.provisioner,
            invocation_timeout_s=self.invocation_timeout_s,
            stream_timeout_s=self.stream_timeout_s,
        )
        self._runtime.start()
        self.runtime_url = self._runtime.url

    def stop(self) -> None:
        """Stop what :meth:`start` started (all of it, or the part it got to before failing)."""
        if (autoscaler := getattr(self, "autoscaler", None)) is not None:
            autoscaler.stop()
        if (provisioner := getattr(self, "provisioner", None)) is not None:
            provisioner.shutdown()
        if (runtime := getattr(self, "_runtime", None)) is not None:
            runtime.shutdown()
            runtime.server_close()
        if (moto := getattr(self, "_moto", None)) is not None:
            moto.stop()
        if (registry := getattr(self, "registry", None)) is not None:
            registry.stop()

    def state(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "control_url": self.control_url,
            "runtime_url": self.runtime_url,
            "account_id": ACCOUNT_ID,
            "role_arn": self.role_arn,
            "state_dir": str(self.state_dir),
            "started_at": time.time(),
            "mode": self.runner.mode,
            "engine": self.runner.engine.kind if self.runner.engine is not None else None,
            "registry_url": self.registry.url if self.registry is not None else None,
            "metrics_period_s": self.metrics_period_s,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmforge.local.server")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="control plane and S3 (moto)")
    parser.add_argument("--runtime-port", type=int, default=0, help="sagemaker-runtime")
    parser.add_argument("--invocation-timeout", type=float, default=60.0)
    parser.add_argument("--stream-timeout", type=float, default=600.0)
    parser.add_argument("--mode", choices=MODES, default="auto", help="how endpoint instances run")
    parser.add_argument("--engine", choices=("auto", "podman", "docker"), default=None)
    parser.add_argument(
        "--metrics-period",
        type=float,
        default=None,
        help=f"seconds between metric publications and scaling evaluations (default: ${ENV_PERIOD}, else "
        f"{DEFAULT_PERIOD_S:g})",
    )
    args = parser.parse_args(argv)
    try:
        period = args.metrics_period if args.metrics_period is not None else period_from_env()
        if not period > 0:
            raise ValueError(f"--metrics-period {period} is not a number of seconds above 0")
    except ValueError as exc:
        logging.basicConfig(level=logging.INFO)
        log.error("the local SageMaker could not start: %s", exc)
        return 3
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for flag, port in (("--port", args.port), ("--runtime-port", args.runtime_port)):
        problem = port_problem(args.host, port)  # moto's server would hang on a busy port
        if problem:
            logging.getLogger("lmforge.local").error(
                "cannot listen on %s:%s (%s): %s", args.host, port, flag, problem
            )
            return 3

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    local = LocalSageMaker(
        args.state_dir.resolve(),
        args.host,
        args.port,
        args.runtime_port,
        args.invocation_timeout,
        args.stream_timeout,
        args.mode,
        args.engine,
        period,
    )
    try:
        local.start()
    except Exception as exc:  # e.g. --mode image without an engine: say so in the log `up` reads
        log.error("the local SageMaker could not start: %s", exc)
        local.stop()
        return 3
    state_path = local.state_dir / STATE_FILE
    tmp = state_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(local.state(), indent=2) + "\n")
    tmp.replace(state_path)
    logging.getLogger("lmforge.local").info(
        "local SageMaker up: control plane %s, runtime %s", local.control_url, local.runtime_url
    )
    try:
        stop.wait()
    finally:
        logging.getLogger("lmforge.local").info("stopping the local SageMaker")
        local.stop()
        state_path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    from lmforge.process import run_main

    run_main(main)
