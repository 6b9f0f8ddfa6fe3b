import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from servers import LimitedServer, ScriptedServer  # noqa: E402


@pytest.fixture
def limited():
    servers = []

    def start(**kwargs):
        s = LimitedServer(**kwargs)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


@pytest.fixture
def scripted():
    servers = []

    def start(answers):
        s = ScriptedServer(answers)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()
