"""OpenClaw itself against unstuck: collected only by ``make test-openclaw``.

That target installs Node 24 and OpenClaw into a cache directory and sets
``UNSTUCK_OPENCLAW_BIN`` (the ``openclaw`` launcher) and ``UNSTUCK_OPENCLAW_NODE_BIN`` (the
directory of Node 24's ``node``). Without them, as under ``make test``, nothing here is
collected.
"""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("UNSTUCK_OPENCLAW_BIN") else ["test_*.py"]
