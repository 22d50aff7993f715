"""The ``disaggregated`` mode: a router in the API process (``router.py``), prefill and decode
worker processes (``worker.py``) and the messages between them (``messages.py``)."""
