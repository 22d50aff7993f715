"""Open-loop load (a rate, a trace) over Locust's master and workers: loadlab's runner sends.

    locust -f examples/locust_openloop.py --master --headless --expect-workers 2 -u 2 \\
        --loadlab-run "--endpoint http://10.0.0.5:8000 --rate 100 --requests 6000 --seed 7" \\
        --loadlab-out run.json
    locust -f examples/locust_openloop.py --worker --master-host MASTER    # on each machine

See docs/distributed.md.
"""

from loadlab.locust import OpenLoopUser

__all__ = ["OpenLoopUser"]
