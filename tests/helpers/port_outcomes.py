"""A pytest plugin for ported Lightning tests whose launcher starts rank processes that run the
same pytest command: only the process whose pid is ``PORT_PARENT_PID`` (rank 0, the one the test
started) appends each test's outcome to ``PORT_OUTCOMES`` as a JSON line (nodeid, outcome, the
first line of a failure), so the ranks' interleaved output is not read."""

import json
import os

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if str(os.getpid()) != os.environ.get("PORT_PARENT_PID") or not (report.when == "call" or report.failed):
        return
    message = str(report.longrepr).strip().splitlines()[-1] if report.failed else ""
    with open(os.environ["PORT_OUTCOMES"], "a") as out:
        out.write(json.dumps({"test": item.name, "outcome": report.outcome, "message": message}) + "\n")
