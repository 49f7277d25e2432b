"""Kill the trainer mid-publish while a client runs throughout: no request
fails, the server never sees the half-written version, and the next run's
version is picked up live (issue 8, "Load and faults")."""

from __future__ import annotations

import signal
import time

from ordrec.service.storage.registry import Registry
from ordrec.tools.process import ServerProcess, wait_for
from ordrec.trainer.job import EXIT_PUBLISHED, run_job
from tests.test_faults import LoadLoop
from tests.test_job_faults import assert_intact, setup, start_paused_child  # noqa: F401 - fixture


def test_sigkill_mid_publish_under_load_fails_no_request(setup):  # noqa: F811 - the fixture
    job, registry = setup
    (live,) = Registry(registry).versions("dcr")
    with ServerProcess(registry, "--poll-interval", "0.1") as proc:
        with LoadLoop(proc.target) as load:
            child = start_paused_child(job)
            assert list((registry / "dcr").glob(".tmp-*"))
            time.sleep(0.5)  # several registry polls while the version is half written
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            time.sleep(0.5)  # and several after the kill
            served_meanwhile = set(load.versions)
            assert run_job(job) == EXIT_PUBLISHED
            new = Registry(registry).versions("dcr")[-1]
            wait_for(lambda: new in load.versions, 30, what="the next run's version to be served")
        assert load.failures == [], load.failures[:5]
        assert served_meanwhile == {live}
        assert load.ok > 50
        assert proc.terminate() == 0
    assert assert_intact(registry)[-1] == new
