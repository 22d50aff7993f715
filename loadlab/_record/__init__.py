"""``loadlab record``: a reverse proxy that captures the shape of production traffic without its
text (``proxy``), what it reads of requests (``shape``) and answers (``stream``), and the trace
file it writes (``tracefile``). The replay is the trace workload (``loadlab.workloads``)."""
