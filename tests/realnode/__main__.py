"""``python -m tests.realnode prepare|up [legacy]``: build the artifacts, or start a cluster
and keep it until Ctrl-C (for looking around with the kubectl command it prints).
``legacy``: the node runs the 1.34 kubelet with containerd 1.6."""

from __future__ import annotations

import signal
import sys
import time

from . import cluster, layouts


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _interrupt)  # `kill PID` tears the cluster down too
    reason = cluster.unavailable()
    if reason:
        print(f"real node unavailable: {reason}")
        return 2
    legacy = argv[1:2] == ["legacy"]
    if argv[:1] == ["prepare"]:
        arts = cluster.prepare(print, legacy)
        print(f"ready: {arts}")
        return 0
    if argv[:1] == ["up"]:
        with cluster.running_cluster(layouts.mixed(), legacy=legacy) as running:
            seconds = time.monotonic() - running.started_at
            print(f"cluster up in {seconds:.0f} s; state {running.state}")
            print(
                f"kubectl: nsenter -t {running.node.init_pid} -n -- {cluster.KUBECTL} "
                f"--kubeconfig {running.pki.kubeconfig} get nodes"
            )
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
